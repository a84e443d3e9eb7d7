// Streaming (issue 10): SendStreamingMessage / message/stream and
// SubscribeToTask / tasks/resubscribe over SSE, on JSON-RPC (v0.3 and v1.0)
// and HTTP+JSON; event order and content byte by byte; Last-Event-ID
// reconnects; keep-alives; the stream cap; slow and vanished clients; a
// subscriber on one server of a Task running on another (sqlite: store).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include "server_test_support.hpp"

#include <atomic>
#include <fstream>
#include <memory>

using namespace tnxtest;

namespace {

const std::string kV1 = "A2A-Version: 1.0\r\n";

std::string v03_message(const std::string &text, const std::string &extra = {}) {
  return R"({"role":"user","messageId":"m-)" + std::to_string(std::rand()) + R"(","parts":[{"kind":"text","text":)" +
         q(text) + "}]" + (extra.empty() ? "" : "," + extra) + "}";
}

std::string v1_message(const std::string &text, const std::string &extra = {}) {
  return R"({"role":"ROLE_USER","messageId":"m-)" + std::to_string(std::rand()) + R"(","parts":[{"text":)" + q(text) +
         "}]" + (extra.empty() ? "" : "," + extra) + "}";
}

toolnexus::ServerHandle serve_with(const std::string &agent, int echo_delay_ms = 0,
                                   const std::function<void(toolnexus::ServerOptions &)> &more = {}) {
  auto o = test_options();
  o.agent = agent;
  o.echo_chunk_delay_ms = echo_delay_ms;
  if (more) more(o);
  return toolnexus::serve(o);
}

// Frame ids must be the Task's consecutive event numbers.
void check_ids_increase(const std::vector<SseEvent> &events) {
  for (std::size_t i = 1; i < events.size(); ++i)
    CHECK(std::stoull(events[i].id) > std::stoull(events[i - 1].id));
}

// A v0.3 result's kind / a v1.0 StreamResponse's member.
std::string what(const rapidjson::Value &r) {
  if (r.HasMember("kind")) return r["kind"].GetString();
  for (const char *k : {"task", "statusUpdate", "artifactUpdate", "message"})
    if (r.HasMember(k)) return k;
  return "?";
}

}  // namespace

TEST_CASE("v0.3 message/stream: the Task, working, the reply in chunks, completed (final), then the end") {
  auto server = serve_with("echo");
  Connection conn(port_of(server.url()));
  SseReader sse(conn, rpc_request("message/stream", R"({"message":)" + v03_message("one two three four five") + "}",
                                  "42"));
  REQUIRE(sse.status() == 200);
  CHECK(sse.header("content-type") == "text/event-stream");
  auto events = sse.rest();
  CHECK(sse.ended());
  REQUIRE(events.size() == 6);
  check_ids_increase(events);
  std::vector<std::string> kinds;
  std::string text;
  for (const auto &e : events) {
    auto d = parse(e.data);
    CHECK(std::string(d["jsonrpc"].GetString()) == "2.0");
    CHECK(d["id"].GetInt() == 42);
    const auto &r = d["result"];
    kinds.push_back(what(r));
    if (what(r) == "artifact-update") text += r["artifact"]["parts"][0]["text"].GetString();
  }
  CHECK(kinds == std::vector<std::string>{"task", "status-update", "artifact-update", "artifact-update",
                                          "artifact-update", "status-update"});
  auto first = parse(events[0].data);
  CHECK(std::string(first["result"]["status"]["state"].GetString()) == "submitted");
  CHECK(events[0].id == "1");
  auto working = parse(events[1].data);
  CHECK(std::string(working["result"]["status"]["state"].GetString()) == "working");
  CHECK(working["result"]["final"].GetBool() == false);
  auto a1 = parse(events[2].data), a3 = parse(events[4].data);
  CHECK(a1["result"]["append"].GetBool() == false);
  CHECK(a1["result"]["lastChunk"].GetBool() == false);
  CHECK(a3["result"]["append"].GetBool() == true);
  CHECK(a3["result"]["lastChunk"].GetBool() == true);
  CHECK(std::string(a1["result"]["artifact"]["artifactId"].GetString()) ==
        a3["result"]["artifact"]["artifactId"].GetString());
  CHECK(text == "one two three four five");
  auto done = parse(events[5].data);
  CHECK(std::string(done["result"]["status"]["state"].GetString()) == "completed");
  CHECK(done["result"]["final"].GetBool() == true);
  CHECK(std::string(done["result"]["taskId"].GetString()) == first["result"]["id"].GetString());
  // Private metadata (lease, timeline) never reaches a client.
  for (const auto &e : events) CHECK(e.data.find("toolnexus/") == std::string::npos);
  // The connection serves the next request (the stream ended with the last chunk).
  CHECK(conn.post(R"({"jsonrpc":"2.0","id":1,"method":"ListTasks"})").status == 200);
}

TEST_CASE("v1.0 SendStreamingMessage: StreamResponse members, TASK_STATE_*, no kind, no final") {
  auto server = serve_with("echo");
  Connection conn(port_of(server.url()));
  SseReader sse(conn, rpc_request("SendStreamingMessage", R"({"message":)" + v1_message("hello world") + "}",
                                  "\"s-1\"", kV1));
  auto events = sse.rest();
  REQUIRE(events.size() == 5);
  std::vector<std::string> kinds;
  for (const auto &e : events) {
    auto d = parse(e.data);
    CHECK(std::string(d["id"].GetString()) == "s-1");
    kinds.push_back(what(d["result"]));
    CHECK(e.data.find("\"kind\"") == std::string::npos);
    CHECK(e.data.find("\"final\"") == std::string::npos);
  }
  CHECK(kinds == std::vector<std::string>{"task", "statusUpdate", "artifactUpdate", "artifactUpdate", "statusUpdate"});
  auto first = parse(events[0].data);
  CHECK(std::string(first["result"]["task"]["status"]["state"].GetString()) == "TASK_STATE_SUBMITTED");
  auto art = parse(events[2].data);
  CHECK(to_json(art["result"]["artifactUpdate"]["artifact"]["parts"]) == R"([{"text":"hello "}])");
  auto last = parse(events[4].data);
  const auto &st = last["result"]["statusUpdate"]["status"];
  CHECK(std::string(st["state"].GetString()) == "TASK_STATE_COMPLETED");
  // Millisecond UTC timestamps in v1.0.
  CHECK(std::string(st["timestamp"].GetString()).size() == 24);
}

TEST_CASE("HTTP+JSON POST /message:stream: bare StreamResponse frames") {
  auto server = serve_with("echo");
  Connection conn(port_of(server.url()));
  const std::string body = R"({"message":)" + v1_message("rest stream") + "}";
  SseReader sse(conn, "POST /message:stream HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                      "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body);
  REQUIRE(sse.status() == 200);
  auto events = sse.rest();
  REQUIRE(events.size() == 5);
  auto first = parse(events[0].data);
  CHECK(!first.HasMember("jsonrpc"));
  CHECK(first.HasMember("task"));
  CHECK(parse(events[4].data).HasMember("statusUpdate"));
}

TEST_CASE("SubscribeToTask on an input-required Task: the snapshot, then the resumed run until it settles") {
  auto server = serve_with("approval");
  Client c(server.url());
  const std::string id = task_id(c.send("deploy 1.4"));
  c.wait_settled(id);
  for (const std::string verb : {"GET", "POST"}) {
    CAPTURE(verb);
    const std::string other = task_id(c.send("deploy " + verb));
    c.wait_settled(other);
    Connection conn(port_of(server.url()));
    // HTTP+JSON subscribe, both verbs (the spec says POST, the proto GET).
    SseReader sse(conn, verb + " /tasks/" + other + ":subscribe HTTP/1.1\r\nHost: localhost\r\n\r\n");
    REQUIRE(sse.status() == 200);
    auto snap = sse.next();
    REQUIRE(snap);
    auto t = parse(snap->data);
    CHECK(std::string(t["task"]["status"]["state"].GetString()) == "TASK_STATE_INPUT_REQUIRED");
    // It stays open while the Task waits.
    CHECK(!sse.next(300ms));
    CHECK(sse.timed_out());
    // Another connection approves: working, the artifact, completed; then the end.
    auto done = c.send("approve", R"("taskId":)" + q(other));
    auto rest = sse.rest();
    CHECK(sse.ended());
    REQUIRE(rest.size() == 3);
    CHECK(what(parse(rest[0].data)) == "statusUpdate");
    CHECK(what(parse(rest[1].data)) == "artifactUpdate");
    CHECK(std::string(parse(rest[2].data)["statusUpdate"]["status"]["state"].GetString()) == "TASK_STATE_COMPLETED");
    CHECK(std::stoull(rest[0].id) == std::stoull(snap->id) + 1);
  }
  // v0.3 tasks/resubscribe of a terminal Task: -32004 as an SSE error event
  // (what the v0.3 client reads); v1.0: plain JSON.
  c.call("CancelTask", R"({"id":)" + q(id) + "}");
  Connection conn(port_of(server.url()));
  SseReader err(conn, rpc_request("tasks/resubscribe", R"({"id":)" + q(id) + "}", "9"));
  auto e = err.next();
  REQUIRE(e);
  CHECK(e->event == "error");
  auto d = parse(e->data);
  CHECK(d["id"].GetInt() == 9);
  CHECK(d["error"]["code"].GetInt() == -32004);
  CHECK(!err.next());
}

TEST_CASE("Last-Event-ID: a reconnecting subscriber gets exactly the events after it, or the snapshot") {
  auto server = serve_with("approval");
  Client c(server.url());
  const std::string id = task_id(c.send("resume me"));
  c.wait_settled(id);
  c.send("approve", R"("taskId":)" + q(id));
  c.wait_settled(id);
  // Timeline: 1 submitted, 2 working, 3 input-required, 4 working,
  // 5 artifact, 6 completed.
  Connection conn(port_of(server.url()));
  SseReader sse(conn, rpc_request("SubscribeToTask", R"({"id":)" + q(id) + "}", "3", kV1 + "Last-Event-ID: 3\r\n"));
  auto events = sse.rest();
  REQUIRE(events.size() == 3);
  CHECK(events[0].id == "4");
  CHECK(events[1].id == "5");
  CHECK(events[2].id == "6");
  CHECK(what(parse(events[1].data)["result"]) == "artifactUpdate");
  CHECK(sse.ended());
  // Caught up already: an empty stream that ends at once.
  Connection conn2(port_of(server.url()));
  SseReader none(conn2, rpc_request("SubscribeToTask", R"({"id":)" + q(id) + "}", "4", kV1 + "Last-Event-ID: 6\r\n"));
  CHECK(none.rest(2000ms).empty());
  CHECK(none.ended());
}

TEST_CASE("Last-Event-ID older than the timeline: the snapshot instead of the lost events") {
  // An executor that reports 100 status messages, each saved (the timeline
  // keeps 64 events).
  struct Chatty final : toolnexus::AgentExecutor {
    std::string name() const override { return "chatty"; }
    std::vector<toolnexus::AgentSkill> skills() const override { return {}; }
    toolnexus::ExecutionResult execute(const toolnexus::ExecutionContext &ctx) override {
      for (int i = 0; i < 100; ++i) {
        ctx.progress.status("step " + std::to_string(i));
        std::this_thread::sleep_for(2ms);
      }
      return toolnexus::ExecutionResult::completed("done");
    }
  };
  auto o = test_options();
  o.executor = std::make_shared<Chatty>();
  o.progress_interval_ms = 1;
  auto server = toolnexus::serve(o);
  Client c(server.url());
  const std::string id = task_id(c.send("talk"));
  c.wait_settled(id);
  Connection conn(port_of(server.url()));
  SseReader sse(conn, rpc_request("SubscribeToTask", R"({"id":)" + q(id) + "}", "1", kV1 + "Last-Event-ID: 2\r\n"));
  auto events = sse.rest();
  REQUIRE(events.size() == 1);
  auto d = parse(events[0].data);
  CHECK(std::string(d["result"]["task"]["status"]["state"].GetString()) == "TASK_STATE_COMPLETED");
  CHECK(std::stoull(events[0].id) > 100);  // the newest event number
}

TEST_CASE("keep-alive comments on an idle stream; the cap on streams; a vanished client frees its stream") {
  auto server = serve_with("approval", 0, [](toolnexus::ServerOptions &o) {
    o.streams.keepalive_ms = 100;
    o.streams.max_streams = 2;
  });
  Client c(server.url());
  const std::string id = task_id(c.send("wait"));
  c.wait_settled(id);
  const std::string sub = rpc_request("SubscribeToTask", R"({"id":)" + q(id) + "}", "1", kV1);
  auto one = std::make_unique<Connection>(port_of(server.url()));
  SseReader s1(*one, sub);
  REQUIRE(s1.next());  // the snapshot
  CHECK(!s1.next(350ms));
  CHECK(s1.comments().size() >= 2);
  CHECK(s1.comments()[0] == "keep-alive");
  Connection two(port_of(server.url()));
  SseReader s2(two, sub);
  REQUIRE(s2.next());
  CHECK(eventually([&] { return server.stats().open_streams == 2; }));
  // A third: refused with a clear error (v1.0 JSON-RPC: plain JSON).
  Connection three(port_of(server.url()));
  auto r = three.post(R"({"jsonrpc":"2.0","id":5,"method":"SubscribeToTask","params":{"id":)" + q(id) + "}}", kV1);
  CHECK(error_code(parse(r.body)) == -32603);
  CHECK(error_message(parse(r.body)).find("too many open streams (2") != std::string::npos);
  // HTTP+JSON: 503, and the body says UNAVAILABLE with the same code.
  HttpResponse busy = three.get("/tasks/" + id + ":subscribe");
  CHECK(busy.status == 503);
  CHECK(busy.header("retry-after") == "1");
  auto busy_body = parse(busy.body);
  CHECK(busy_body["error"]["code"].GetInt() == 503);
  CHECK(std::string(busy_body["error"]["status"].GetString()) == "UNAVAILABLE");
  // The first client disconnects: its stream is freed, a new one is accepted.
  one.reset();
  CHECK(eventually([&] { return server.stats().open_streams == 1; }, 3000ms));
  // Its place under the cap was given back before the stream was counted
  // closed: a new stream is accepted at once.
  Connection four(port_of(server.url()));
  SseReader s4(four, sub);
  CHECK(s4.next().has_value());
}

TEST_CASE("a stream that ended frees its place under the cap before the client reads the end") {
  // streams.max_streams = 1 and one client streaming one message after
  // another on one connection: each next stream is accepted. The place was
  // given back on the delivery thread just after the end was written, so a
  // quick client was sometimes refused ("too many open streams (1").
  auto server = serve_with("echo", 0, [](toolnexus::ServerOptions &o) { o.streams.max_streams = 1; });
  // Busy threads, as on a loaded CI machine, so that the delivery thread is
  // often preempted between writing the end and dropping the stream.
  std::atomic<bool> busy{true};
  std::vector<std::thread> hogs;
  for (int i = 0; i < 4; ++i)
    hogs.emplace_back([&] {
      while (busy.load(std::memory_order_relaxed)) {
      }
    });
  Connection conn(port_of(server.url()));
  int refused = 0, complete = 0;
  for (int i = 0; i < 200; ++i) {
    SseReader sse(conn, rpc_request("SendStreamingMessage", R"({"message":)" + v1_message("go") + "}",
                                    std::to_string(i), kV1));
    if (sse.header("content-type").find("text/event-stream") != 0) {
      ++refused;
      continue;
    }
    auto events = sse.rest();
    if (!events.empty() && parse(events.back().data)["result"].HasMember("statusUpdate")) ++complete;
  }
  busy = false;
  for (auto &t : hogs) t.join();
  CHECK(refused == 0);
  CHECK(complete == 200);
}

TEST_CASE("a client that reads nothing neither blocks the workers nor other streams, and is dropped") {
  auto server = serve_with("echo", 0, [](toolnexus::ServerOptions &o) {
    o.limits.stream_stall_ms = 7000;
    o.limits.max_body_bytes = 2 << 20;
  });
  Client c(server.url());
  // A Task with a 600 KiB artifact (one word: one chunk), more than a
  // socket's buffers hold.
  const std::string id = task_id(c.send(std::string(600 << 10, 'z')));
  c.wait_settled(id);
  // Five stuck clients replay its whole timeline (Last-Event-ID: 0) and
  // never read; their receive buffers are tiny.
  std::vector<std::unique_ptr<Connection>> stuck;
  for (int i = 0; i < 5; ++i) {
    stuck.push_back(std::make_unique<Connection>(port_of(server.url()), 4096));
    stuck.back()->send_raw(
        rpc_request("SubscribeToTask", R"({"id":)" + q(id) + "}", "1", kV1 + "Last-Event-ID: 0\r\n"));
  }
  REQUIRE(eventually([&] { return server.stats().open_streams == 5; }, 15000ms));
  // Meanwhile others are served at once (well before the stuck ones are
  // dropped), streams included.
  const auto t0 = Clock::now();
  Connection live(port_of(server.url()));
  SseReader s(live, rpc_request("message/stream", R"({"message":)" + v03_message("still flowing") + "}", "2"));
  CHECK(s.rest().size() == 5);
  CHECK(state_of(c.send("and blocking", {}, "")) == "completed");
  // Well before the stuck ones are dropped (7 s), however loaded the machine.
  CHECK(Clock::now() - t0 < 5000ms);
  // The stuck ones are dropped once they have read nothing for 7 s.
  CHECK(server.stats().open_streams == 5);
  CHECK(eventually([&] { return server.stats().open_streams == 0; }, 30000ms));
}

TEST_CASE("a subscriber on server B sees every event of a Task running on server A (sqlite: store)") {
  TempDir dir;
  const std::string sel = "sqlite:" + dir.str() + "/tasks.db";
  auto oa = test_options();
  oa.store = sel;
  oa.echo_chunk_delay_ms = 150;
  auto a = toolnexus::serve(oa);
  auto ob = test_options();
  ob.store = sel;
  ob.streams.poll_ms = 50;
  auto b = toolnexus::serve(ob);
  Client ca(a.url());
  const std::string id = task_id(ca.send("across two servers now"));
  Connection conn(port_of(b.url()));
  SseReader sse(conn, rpc_request("SubscribeToTask", R"({"id":)" + q(id) + "}", "1", kV1));
  std::vector<SseEvent> events = sse.rest(5000ms);
  CHECK(sse.ended());
  REQUIRE(events.size() >= 2);
  check_ids_increase(events);
  // From the snapshot on, every event number is there exactly once.
  for (std::size_t i = 1; i < events.size(); ++i)
    CHECK(std::stoull(events[i].id) == std::stoull(events[i - 1].id) + 1);
  auto last = parse(events.back().data);
  CHECK(std::string(last["result"]["statusUpdate"]["status"]["state"].GetString()) == "TASK_STATE_COMPLETED");
  std::string text;
  for (const auto &e : events) {
    auto d = parse(e.data);
    if (d["result"].HasMember("artifactUpdate"))
      for (const auto &p : d["result"]["artifactUpdate"]["artifact"]["parts"].GetArray()) text += p["text"].GetString();
    if (d["result"].HasMember("task") && d["result"]["task"].HasMember("artifacts"))
      for (const auto &p : d["result"]["task"]["artifacts"][0]["parts"].GetArray()) text += p["text"].GetString();
  }
  CHECK(text == "across two servers now");
}

TEST_CASE("a stream ends right after its final event while its client is still reading a large frame") {
  // Issue 19 item 1: frames queued while the connection was still writing an
  // earlier, large one (the socket full) were left in the stream's queue once
  // that write finished: the final event and the end never came.
  auto server = serve_with("approval", 0, [](toolnexus::ServerOptions &o) { o.limits.max_body_bytes = 4 << 20; });
  Client c(server.url());
  for (const std::string answer : {"deny", "approve"}) {
    CAPTURE(answer);
    // A parked Task whose snapshot (~1.5 MB of history) outgrows every socket buffer.
    const std::string id = task_id(c.send("deploy " + std::string(1500000, 'x')));
    c.wait_settled(id);
    Connection conn(port_of(server.url()));
    SseReader sse(conn, "GET /tasks/" + id + ":subscribe HTTP/1.1\r\nHost: localhost\r\n\r\n");
    REQUIRE(sse.status() == 200);
    // The client reads nothing while the snapshot is being written and the
    // Task runs to its end (its events queue behind the snapshot).
    std::this_thread::sleep_for(300ms);
    c.send(answer, R"("taskId":)" + q(id));
    std::this_thread::sleep_for(300ms);
    auto events = sse.rest(10000ms);
    CHECK_MESSAGE(sse.ended(), "the stream did not end; events read: " << events.size());
    REQUIRE(events.size() >= 2);
    const auto last = parse(events.back().data);
    const std::string want = answer == "deny" ? "TASK_STATE_REJECTED" : "TASK_STATE_COMPLETED";
    REQUIRE(last.HasMember("statusUpdate"));
    CHECK(std::string(last["statusUpdate"]["status"]["state"].GetString()) == want);
  }
}

TEST_CASE("Last-Event-ID above the Task's newest event: the snapshot, then the live events of a parked Task") {
  // Issue 19 item 2: an id from another Task (or a store restored from a
  // backup) gave the snapshot and ended the stream at once, although the
  // parked Task's later events were still to come.
  auto server = serve_with("approval");
  Client c(server.url());
  const std::string id = task_id(c.send("deploy 2.0"));
  c.wait_settled(id);  // timeline: 1 submitted, 2 working, 3 input-required
  Connection conn(port_of(server.url()));
  SseReader sse(conn, rpc_request("SubscribeToTask", R"({"id":)" + q(id) + "}", "5", kV1 + "Last-Event-ID: 999\r\n"));
  auto snap = sse.next();
  REQUIRE(snap);
  CHECK(snap->id == "3");
  CHECK(std::string(parse(snap->data)["result"]["task"]["status"]["state"].GetString()) == "TASK_STATE_INPUT_REQUIRED");
  // Still open while the Task waits.
  CHECK(!sse.next(300ms));
  CHECK(sse.timed_out());
  c.send("approve", R"("taskId":)" + q(id));
  auto rest = sse.rest();
  CHECK(sse.ended());
  REQUIRE(rest.size() == 3);
  CHECK(rest[0].id == "4");
  CHECK(std::string(parse(rest[2].data)["result"]["statusUpdate"]["status"]["state"].GetString()) ==
        "TASK_STATE_COMPLETED");
}

namespace {

// This process's resident set size in KiB (/proc/self/statm).
long rss_kib() {
  std::ifstream statm("/proc/self/statm");
  long size = 0, resident = 0;
  statm >> size >> resident;
  return resident * (::sysconf(_SC_PAGESIZE) / 1024);
}

}  // namespace

TEST_CASE("the memory slow streams held is given back once they are dropped") {
  // Issue 19 item 8: after 200 slow streams of a large Task were dropped,
  // the server's resident memory stayed at its peak.
  auto server = serve_with("approval", 0, [](toolnexus::ServerOptions &o) { o.limits.max_body_bytes = 4 << 20; });
  Client c(server.url());
  const std::string id = task_id(c.send("deploy " + std::string(1 << 20, 'x')));
  c.wait_settled(id);
  const long before = rss_kib();
  long peak = before;
  {
    std::vector<std::unique_ptr<Connection>> conns;
    std::vector<std::unique_ptr<SseReader>> readers;
    for (int i = 0; i < 200; ++i) {
      conns.push_back(std::make_unique<Connection>(port_of(server.url())));
      readers.push_back(
          std::make_unique<SseReader>(*conns.back(), "GET /tasks/" + id + ":subscribe HTTP/1.1\r\nHost: localhost\r\n\r\n"));
    }
    // Each stream holds the part of its ~1 MiB snapshot its client has not read.
    std::this_thread::sleep_for(500ms);
    peak = rss_kib();
  }  // the clients go away without reading
  REQUIRE(eventually([&] { return server.stats().open_streams == 0; }, 10000ms));
  std::this_thread::sleep_for(200ms);
  const long after = rss_kib();
  MESSAGE("RSS before " << before << " KiB, peak " << peak << " KiB, after " << after << " KiB");
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  // The sanitizer's allocator keeps freed memory in quarantine: nothing to measure.
  MESSAGE("memory is not measured under a sanitizer");
#else
  REQUIRE(peak - before > 50 * 1024);  // the streams did hold memory
  CHECK(after - before < (peak - before) / 4);
#endif
}

TEST_CASE("the first streamed chunk reaches the stream before the second is made (a held report is flushed)") {
  // The echo agent makes its first chunk at once and its second 5 s later.
  // Its first report comes within progress_interval_ms of the run's start,
  // so it is held; it must be saved (and streamed) when that interval has
  // passed, not only when the next report (5 s on) or the outcome comes.
  for (const std::string store : {"memory", "file"}) {
    CAPTURE(store);
    TempDir dir;
    auto server = serve_with("echo", 5000, [&](toolnexus::ServerOptions &o) {
      if (store == "file") o.store = "file:" + dir.str();
    });
    Connection conn(port_of(server.url()));
    SseReader sse(conn, rpc_request("message/stream", R"({"message":)" + v03_message("one two three four") + "}"));
    REQUIRE(sse.status() == 200);
    std::string task;
    std::optional<SseEvent> chunk;
    for (;;) {
      // Well under the 5 s the second chunk waits for.
      auto e = sse.next(4000ms);
      REQUIRE_MESSAGE(e.has_value(), "no first chunk within 4 s; got: " << sse.unparsed());
      auto d = parse(e->data);
      if (what(d["result"]) == "task") task = d["result"]["id"].GetString();
      if (what(d["result"]) == "artifact-update") {
        chunk = e;
        break;
      }
    }
    CHECK(std::string(parse(chunk->data)["result"]["artifact"]["parts"][0]["text"].GetString()) == "one ");
    // The second chunk has not been made yet: the Task holds the first alone.
    Client c(server.url());
    auto got = c.get_task(task);
    CHECK(artifact_text(got["result"]) == "one ");
    c.call("tasks/cancel", R"({"id":)" + q(task) + "}");
    auto rest = sse.rest();
    REQUIRE(!rest.empty());
    CHECK(std::string(parse(rest.back().data)["result"]["status"]["state"].GetString()) == "canceled");
  }
}

TEST_CASE("with the store's change feed (ABI 1.4), a change made by another server reaches a stream without polling") {
  // Two servers on one memory store object, polling every ten minutes: only
  // the feed can bring B's change to A's stream in time.
  auto store = toolnexus::resolve_store("memory");
  REQUIRE((store->info().capabilities & TNX_CAP_CHANGE_FEED) != 0);
  auto shared = [&](toolnexus::ServerOptions &o) {
    o.store = store;
    o.streams.poll_ms = 600000;
  };
  auto a = serve_with("approval", 0, shared);
  auto b = serve_with("approval", 0, shared);
  Client ca(a.url()), cb(b.url());
  const std::string id = task_id(ca.send("deploy 2.0"));
  REQUIRE(state_of(ca.wait_settled(id)) == "input-required");
  Connection conn(port_of(a.url()));
  SseReader sse(conn, "GET /tasks/" + id + ":subscribe HTTP/1.1\r\nHost: localhost\r\n\r\n");
  REQUIRE(sse.status() == 200);
  auto snap = sse.next();
  REQUIRE(snap);
  const auto t0 = std::chrono::steady_clock::now();
  CHECK(state_of(cb.call("CancelTask", R"({"id":)" + q(id) + "}")) == "canceled");
  // A's stream gets the canceled status and ends (a margin of 10 s, against
  // the 600 s a poll would take).
  auto rest = sse.rest(10000ms);
  MESSAGE("B's cancel reached A's stream after "
          << std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() << " ms");
  CHECK(sse.ended());
  REQUIRE(!rest.empty());
  CHECK(std::string(parse(rest.back().data)["statusUpdate"]["status"]["state"].GetString()) == "TASK_STATE_CANCELED");
}

TEST_CASE("a Task finished by hand (store put) ends its open stream with the Task as it is, not silently") {
  // `toolnexus store put --expect-version` (docs/operations.md, "Writing
  // Tasks by hand") writes no event: the stream must still say the state it
  // ends on (a fresh-user pass saw it end after the snapshot, and a resume
  // from its last id then returned nothing).
  auto server = serve_with("approval");
  Client c(server.url());
  const std::string id = task_id(c.send("finish me by hand"));
  c.wait_settled(id);
  Connection conn(port_of(server.url()));
  SseReader sse(conn, rpc_request("SubscribeToTask", R"({"id":)" + q(id) + "}", "1", "A2A-Version: 1.0\r\n"));
  REQUIRE(sse.status() == 200);
  auto snap = sse.next();
  REQUIRE(snap);
  CHECK(std::string(parse(snap->data)["result"]["task"]["status"]["state"].GetString()) == "TASK_STATE_INPUT_REQUIRED");

  auto rec = server.store()->get(id);
  REQUIRE(rec);
  std::string json = rec->json;
  const std::string from = R"("status":{"state":"input-required")", to = R"("status":{"state":"completed")";
  const auto at = json.find(from);
  REQUIRE(at != std::string::npos);
  json.replace(at, from.size(), to);
  toolnexus::SaveOptions o;
  o.expected_version = rec->version;
  o.owner = rec->owner;
  o.tenant = rec->tenant;
  server.store()->save(toolnexus::Task::parse(json), o);

  auto rest = sse.rest();
  CHECK(sse.ended());
  REQUIRE(rest.size() == 1);
  CHECK(std::string(parse(rest[0].data)["result"]["task"]["status"]["state"].GetString()) == "TASK_STATE_COMPLETED");
}

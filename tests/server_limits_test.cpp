// Limits: a 2 MiB body gets 413 without being read (Content-Length and
// chunked), 10,000 nested arrays are refused without recursion and the
// server stays up, invalid UTF-8 is refused, slow clients are timed out;
// the size of a Task (parts per message, history per Task, bytes per stored
// Task) is bounded, for what clients send and what agents produce.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include "server_test_support.hpp"

#include <atomic>
#include <regex>

using namespace tnxtest;

namespace {

toolnexus::ServerHandle start(int read_timeout_ms = 10000, int body_deadline_ms = 30000) {
  auto o = test_options();
  o.limits.read_timeout_ms = read_timeout_ms;
  o.limits.body_deadline_ms = body_deadline_ms;
  return toolnexus::serve(o);
}

void still_up(const std::string &url) {
  Client c(url);
  const std::string id = task_id(c.send("still here"));
  CHECK(state_of(c.wait_settled(id)) == "completed");
}

}  // namespace

TEST_CASE("a 2 MiB body gets 413 and is not read") {
  auto server = start();
  const int port = port_of(server.url());

  SUBCASE("announced by Content-Length: answered before a byte of the body is sent") {
    Connection conn(port);
    REQUIRE(conn.send_raw("POST / HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                          "Content-Length: 2097152\r\n\r\n"));
    auto r = conn.read_response(3000ms);
    CHECK(r.status == 413);
    CHECK(r.body.find("1048576") != std::string::npos);
    CHECK(conn.closed_within(2000ms));
  }
  SUBCASE("a real 2 MiB body") {
    Connection conn(port);
    const std::string body(2 * 1024 * 1024, ' ');
    conn.send_raw("POST / HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n");
    conn.send_raw(body);  // may fail part-way: the server stops listening
    auto r = conn.read_response(3000ms);
    CHECK(r.status == 413);
  }
  SUBCASE("chunked: capped while reading") {
    Connection conn(port);
    REQUIRE(conn.send_raw("POST / HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"));
    const std::string chunk(64 * 1024, 'a');
    char size_line[32];
    std::snprintf(size_line, sizeof size_line, "%zx\r\n", chunk.size());
    bool ok = true;
    for (int i = 0; i < 32 && ok; ++i) ok = conn.send_raw(std::string(size_line) + chunk + "\r\n");
    if (ok) conn.send_raw("0\r\n\r\n");
    auto r = conn.read_response(3000ms);
    CHECK(r.status == 413);
  }
  SUBCASE("exactly at the limit is read (and is just not JSON-RPC)") {
    Connection conn(port);
    std::string body = R"({"jsonrpc":"2.0","id":9,"method":"ListTasks","params":{},"pad":")";
    body += std::string(1048576 - body.size() - 2, 'x') + "\"}";
    REQUIRE(body.size() == 1048576);
    auto r = conn.post(body);
    CHECK(r.status == 200);
    CHECK(parse(r.body).HasMember("result"));
  }
  still_up(server.url());
}

TEST_CASE("10,000 nested arrays are refused without recursion; the server stays up") {
  auto server = start();
  Client c(server.url());
  const std::string deep = std::string(10000, '[') + std::string(10000, ']');
  auto r = c.post(R"({"jsonrpc":"2.0","id":"deep","method":"SendMessage","params":{"message":{"role":"user",)"
                  R"("messageId":"m","parts":[{"kind":"data","data":{"x":)" + deep + "}}]}}}");
  REQUIRE(r.status == 200);
  auto d = parse(r.body);
  CHECK(error_code(d) == -32600);
  CHECK(error_message(d).find("nested deeper than 64") != std::string::npos);
  // Unbalanced too: the scan stops at level 65.
  r = c.post(std::string(100000, '['));
  CHECK(error_code(parse(r.body)) == -32600);
  // Nesting within the limit is fine and is stored.
  std::string ok_data = std::string(50, '[') + "1" + std::string(50, ']');
  auto fine = c.call("SendMessage", R"({"message":{"role":"user","messageId":"m","parts":[{"kind":"data","data":{"x":)" +
                                        ok_data + "}}]}}");
  CHECK(state_of(fine) == "completed");  // blocking by default: answered when done
  still_up(server.url());
}

TEST_CASE("invalid UTF-8 is refused") {
  auto server = start();
  Client c(server.url());
  auto r = c.post("{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"SendMessage\",\"params\":{\"message\":{\"role\":\"user\","
                  "\"messageId\":\"m\",\"parts\":[{\"kind\":\"text\",\"text\":\"bad \xff\xfe bytes\"}]}}}");
  REQUIRE(r.status == 200);
  auto d = parse(r.body);
  CHECK(error_code(d) == -32700);
  CHECK(error_message(d).find("invalid UTF-8") != std::string::npos);
  // Overlong encoding and a lone surrogate (CESU) are refused too.
  r = c.post("{\"jsonrpc\":\"2.0\",\"id\":4,\"method\":\"GetTask\",\"params\":{\"id\":\"\xc0\xaf\"}}");
  CHECK(error_code(parse(r.body)) == -32700);
  r = c.post("{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"GetTask\",\"params\":{\"id\":\"\xed\xa0\x80\"}}");
  CHECK(error_code(parse(r.body)) == -32700);
  // Nothing was stored.
  auto list = c.call("ListTasks", "{}");
  CHECK(list["result"]["totalSize"].GetUint64() == 0);
  still_up(server.url());
}

TEST_CASE("a \\u escape of a lone surrogate is refused like invalid UTF-8 (found by fuzz/task_parse_fuzz)") {
  // RapidJSON decodes "\udc00" alone into bytes that are not UTF-8: the
  // request was taken, its Task could not be saved, and the client got
  // -32603 internal error (HTTP+JSON: 500) with three errors in the log.
  auto server = start();
  const int port = port_of(server.url());
  Client c(server.url());
  const std::string message =
      R"({"role":"user","messageId":"m","parts":[{"kind":"text","text":"a\udc00b"}]})";
  auto r = c.post(R"({"jsonrpc":"2.0","id":3,"method":"message/send","params":{"message":)" + message + "}}");
  REQUIRE(r.status == 200);
  auto d = parse(r.body);
  CHECK(error_code(d) == -32700);
  CHECK(error_message(d) == "parse error: a \\u escape of a lone surrogate (U+D800..U+DFFF), which is no "
                            "character, at byte 132");
  Connection rest(port);
  auto h = rest.post(R"({"message":{"role":"ROLE_USER","messageId":"m2","parts":[{"text":"a\udc00b"}]}})",
                     "A2A-Version: 1.0\r\n", "/message:send");
  CHECK(h.status == 400);
  CHECK(h.body.find("lone surrogate") != std::string::npos);
  // A surrogate pair is one character, and is stored.
  r = c.post(R"({"jsonrpc":"2.0","id":4,"method":"message/send","params":{"message":)"
             R"({"role":"user","messageId":"m3","parts":[{"kind":"text","text":"\ud83d\ude00"}]}}})");
  CHECK(parse(r.body).HasMember("result"));
  auto list = c.call("ListTasks", "{}");
  CHECK(list["result"]["totalSize"].GetUint64() == 1);
}

TEST_CASE("slow or stuck clients are timed out") {
  auto server = start(/*read_timeout_ms=*/300, /*body_deadline_ms=*/800);
  const int port = port_of(server.url());
  const auto t0 = Clock::now();

  SUBCASE("connects and sends nothing") {
    Connection conn(port);
    CHECK(conn.closed_within(3000ms));
    CHECK(Clock::now() - t0 < 2000ms);
  }
  SUBCASE("sends half the headers and stops") {
    Connection conn(port);
    conn.send_raw("POST / HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Le");
    CHECK(conn.closed_within(3000ms));
    CHECK(Clock::now() - t0 < 2000ms);
  }
  SUBCASE("promises a body and stops sending") {
    Connection conn(port);
    conn.send_raw("POST / HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"jsonrpc\"");
    CHECK(conn.closed_within(3000ms));
    CHECK(Clock::now() - t0 < 2000ms);
  }
  SUBCASE("dribbles a body slower than the whole-body deadline") {
    Connection conn(port);
    const std::string body = R"({"jsonrpc":"2.0","id":1,"method":"ListTasks","params":{}})";
    conn.send_raw("POST / HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n" + body);
    // 1 KiB every 100 ms keeps each read under the 300 ms socket timeout.
    bool answered = false;
    for (int i = 0; i < 40 && !answered; ++i) {
      std::this_thread::sleep_for(100ms);
      if (!conn.send_raw(std::string(1024, ' '))) answered = true;
      pollfd p{conn.fd(), POLLIN, 0};
      if (::poll(&p, 1, 0) > 0) answered = true;
    }
    REQUIRE(answered);
    auto r = conn.read_response(2000ms);
    CHECK((r.status == 408 || r.closed));
    CHECK(Clock::now() - t0 < 3000ms);
  }
  SUBCASE("an idle keep-alive connection is closed") {
    auto o = test_options();
    o.limits.keep_alive_timeout_ms = 200;
    auto s2 = toolnexus::serve(o);
    Connection conn(port_of(s2.url()));
    CHECK(conn.post(R"({"jsonrpc":"2.0","id":1,"method":"ListTasks"})").status == 200);
    const auto t1 = Clock::now();
    CHECK(conn.closed_within(3000ms));
    CHECK(Clock::now() - t1 < 1500ms);
  }
  still_up(server.url());
}

// ---------------------------------------------------------------------------
// The size of a Task (issue 11): parts per message, history per Task, bytes
// per stored Task.
// ---------------------------------------------------------------------------

namespace {

const std::string kV1 = "A2A-Version: 1.0\r\n";

std::string text_parts(std::size_t n, bool v1) {
  std::string out = "[";
  for (std::size_t i = 0; i < n; ++i) {
    if (i != 0) out += ",";
    out += v1 ? R"({"text":"p"})" : R"({"kind":"text","text":"p"})";
  }
  return out + "]";
}

std::string v03_message_with(const std::string &parts, const std::string &extra = {}) {
  static int n = 0;
  return R"({"role":"user","messageId":"lim-)" + std::to_string(++n) + R"(","parts":)" + parts +
         (extra.empty() ? "" : "," + extra) + "}";
}

std::string v1_message_with(const std::string &parts, const std::string &extra = {}) {
  static int n = 0;
  return R"({"role":"ROLE_USER","messageId":"lim1-)" + std::to_string(++n) + R"(","parts":)" + parts +
         (extra.empty() ? "" : "," + extra) + "}";
}

std::string text_part(const std::string &text) { return R"([{"kind":"text","text":)" + q(text) + "}]"; }

// The stored record of a Task: bytes and version, to compare before/after.
std::pair<std::string, uint64_t> record_of(const toolnexus::ServerHandle &server, const std::string &id) {
  auto rec = server.store()->get(id);
  REQUIRE(rec.has_value());
  return {rec->json, rec->version};
}

uint64_t total_tasks(Client &c) { return c.call("ListTasks", "{}")["result"]["totalSize"].GetUint64(); }

// An HTTP+JSON POST /message:send.
HttpResponse rest_send(Connection &conn, const std::string &message_json) {
  const std::string body = R"({"message":)" + message_json + "}";
  REQUIRE(conn.send_raw("POST /message:send HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                        "Content-Length: " +
                        std::to_string(body.size()) + "\r\n\r\n" + body));
  return conn.read_response();
}

// An agent that streams `chunk` bytes of text per progress report until it
// is asked to stop (or `max_chunks`), pausing `pause` between reports.
class Flood final : public toolnexus::AgentExecutor {
 public:
  Flood(std::size_t chunk, std::chrono::milliseconds pause) : chunk_(chunk), pause_(pause) {}
  std::string name() const override { return "flood"; }
  std::vector<toolnexus::AgentSkill> skills() const override {
    return {toolnexus::AgentSkill{"flood", "Flood", "Writes until stopped.", {"test"}, {}}};
  }
  toolnexus::ExecutionResult execute(const toolnexus::ExecutionContext &ctx) override {
    const std::string text(chunk_, 'x');
    for (int i = 0; i < kMaxChunks && !ctx.cancel_requested; ++i) {
      ctx.progress.text_chunk("out", "output", text, false);
      chunks.fetch_add(1);
      if (pause_.count() > 0) std::this_thread::sleep_for(pause_);
    }
    stopped = ctx.cancel_requested.load();
    return toolnexus::ExecutionResult::completed("done");
  }
  static constexpr int kMaxChunks = 5000;
  std::atomic<int> chunks{0};
  std::atomic<bool> stopped{false};

 private:
  std::size_t chunk_;
  std::chrono::milliseconds pause_;
};

// An agent whose result holds one text artifact of `size` bytes.
class BigResult final : public toolnexus::AgentExecutor {
 public:
  explicit BigResult(std::size_t size) : size_(size) {}
  std::string name() const override { return "big"; }
  std::vector<toolnexus::AgentSkill> skills() const override {
    return {toolnexus::AgentSkill{"big", "Big", "Answers at length.", {"test"}, {}}};
  }
  toolnexus::ExecutionResult execute(const toolnexus::ExecutionContext &) override {
    auto r = toolnexus::ExecutionResult::completed("done");
    r.add_text_artifact(std::string(size_, 'y'), "answer");
    return r;
  }

 private:
  std::size_t size_;
};

const std::regex kAgentTooLarge(
    R"(^The server could not complete this Task: the agent's output (would make it|not yet saved is already) )"
    R"((\d+) bytes, past the limit of 65536 bytes per stored Task \(limits\.max_task_bytes\); that output was )"
    R"(dropped$)");

}  // namespace

TEST_CASE("a message with more parts than limits.max_message_parts (default 100) is refused, in every binding") {
  auto o = test_options();
  o.agent = "approval";
  auto server = toolnexus::serve(o);
  Client c(server.url());
  const std::string why =
      "params.message.parts has 101 parts, past the limit of 100 parts per message (limits.max_message_parts); "
      "nothing was changed";

  auto d = c.call("SendMessage", R"({"message":)" + v03_message_with(text_parts(101, false)) + "}");
  CHECK(error_code(d) == -32602);
  CHECK(error_message(d) == "invalid params: " + why);
  CHECK(to_json(d["error"]["data"]) ==
        R"({"field":"params.message.parts","limit":"limits.max_message_parts","max":"100","size":"101"})");
  auto v1 = c.call("SendMessage", R"({"message":)" + v1_message_with(text_parts(101, true)) + "}", "2", kV1);
  CHECK(error_code(v1) == -32602);
  CHECK(error_message(v1) == "invalid params: " + why);
  CHECK(to_json(v1["error"]["data"]) ==
        R"([{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"INVALID_PARAMS",)"
        R"("domain":"a2a-protocol.org","metadata":{"field":"params.message.parts",)"
        R"("limit":"limits.max_message_parts","max":"100","size":"101"}}])");
  Connection conn(port_of(server.url()));
  auto r = rest_send(conn, v1_message_with(text_parts(101, true)));
  CHECK(r.status == 400);
  CHECK(r.body == R"({"error":{"code":400,"status":"INVALID_ARGUMENT","message":"invalid request: )" +
                      why.substr(7) +
                      R"(","details":[{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"INVALID_PARAMS",)"
                      R"("domain":"a2a-protocol.org","metadata":{"field":"message.parts",)"
                      R"("limit":"limits.max_message_parts","max":"100","size":"101"}}]}})");
  CHECK(total_tasks(c) == 0);

  // 100 parts are fine; a continuation with 101 leaves the Task as it was.
  auto ok = c.call("SendMessage", R"({"message":)" + v03_message_with(text_parts(100, false)) + "}");
  const std::string id = task_id(ok);
  CHECK(state_of(ok) == "input-required");
  const auto before = record_of(server, id);
  auto more = c.call("SendMessage",
                     R"({"message":)" + v03_message_with(text_parts(101, false), R"("taskId":)" + q(id)) + "}");
  CHECK(error_code(more) == -32602);
  CHECK(record_of(server, id) == before);
  CHECK(total_tasks(c) == 1);
}

TEST_CASE("a continuation past limits.max_task_history is refused and the Task is left exactly as it was") {
  auto o = test_options();
  o.agent = "approval";
  o.limits.max_task_history = 6;
  auto server = toolnexus::serve(o);
  Client c(server.url());
  // Each turn: the client's message and the agent's prompt.
  const std::string id = task_id(c.call("SendMessage", R"({"message":)" + v03_message_with(text_part("one")) + "}"));
  for (const char *text : {"two", "three"}) {
    auto d = c.call("SendMessage",
                    R"({"message":)" + v03_message_with(text_part(text), R"("taskId":)" + q(id)) + "}");
    REQUIRE(state_of(d) == "input-required");
  }
  REQUIRE(c.get_task(id)["result"]["history"].Size() == 6);
  const auto before = record_of(server, id);
  const std::string why = "params.message would be message 7 in the history of Task '" + id +
                          "', past the limit of 6 messages per Task (limits.max_task_history); the Task is unchanged";

  auto d = c.call("SendMessage", R"({"message":)" + v03_message_with(text_part("approve"), R"("taskId":)" + q(id)) + "}");
  CHECK(error_code(d) == -32602);
  CHECK(error_message(d) == "invalid params: " + why);
  CHECK(to_json(d["error"]["data"]) ==
        R"({"field":"params.message","limit":"limits.max_task_history","max":"6","size":"7"})");
  auto v1 = c.call("SendMessage", R"({"message":)" + v1_message_with(R"([{"text":"approve"}])", R"("taskId":)" + q(id)) + "}",
                   "2", kV1);
  CHECK(error_code(v1) == -32602);
  CHECK(to_json(v1["error"]["data"]) ==
        R"([{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"INVALID_PARAMS",)"
        R"("domain":"a2a-protocol.org","metadata":{"field":"params.message",)"
        R"("limit":"limits.max_task_history","max":"6","size":"7"}}])");
  Connection conn(port_of(server.url()));
  auto r = rest_send(conn, v1_message_with(R"([{"text":"approve"}])", R"("taskId":)" + q(id)));
  CHECK(r.status == 400);
  CHECK(parse(r.body)["error"]["details"][0]["metadata"]["limit"] == "limits.max_task_history");
  // A stream asking the same: the error as the stream's only event.
  SseReader sse(conn, rpc_request("message/stream",
                                  R"({"message":)" + v03_message_with(text_part("approve"), R"("taskId":)" + q(id)) + "}"));
  auto e = sse.next();
  REQUIRE(e);
  CHECK(e->event == "error");
  CHECK(error_code(parse(e->data)) == -32602);
  // Nothing was lost or added, and the Task can still be canceled.
  CHECK(record_of(server, id) == before);
  CHECK(state_of(c.call("CancelTask", R"({"id":)" + q(id) + "}")) == "canceled");
}

TEST_CASE("a message that would make a Task larger than limits.max_task_bytes is refused, and nothing is saved") {
  auto o = test_options();
  o.agent = "approval";
  o.limits.max_task_bytes = 65536;
  auto server = toolnexus::serve(o);
  Client c(server.url());
  const std::regex refused(
      R"(^invalid params: params\.message would make (the new Task|Task '[-0-9a-f]+') (\d+) bytes, past the limit )"
      R"(of 65536 bytes per stored Task \(limits\.max_task_bytes\); (no Task was created|the Task is unchanged)$)");

  SUBCASE("a new Task") {
    auto d = c.call("SendMessage", R"({"message":)" + v03_message_with(text_part(std::string(70000, 'a'))) + "}");
    CHECK(error_code(d) == -32602);
    std::smatch m;
    const std::string msg = error_message(d);
    REQUIRE_MESSAGE(std::regex_match(msg, m, refused), msg);
    CHECK(m[1] == "the new Task");
    CHECK(m[3] == "no Task was created");
    CHECK(std::stoull(m[2]) > 70000);
    CHECK(std::string(d["error"]["data"]["size"].GetString()) == m[2]);
    CHECK(std::string(d["error"]["data"]["max"].GetString()) == "65536");
    CHECK(std::string(d["error"]["data"]["limit"].GetString()) == "limits.max_task_bytes");
    CHECK(total_tasks(c) == 0);
  }
  SUBCASE("continuations (the break-it pass grew one Task to 53 MiB this way)") {
    // The approval agent quotes the first message in every prompt: that one
    // is short, the continuations are long.
    const std::string chunk(16000, 'b');
    const std::string id =
        task_id(c.call("SendMessage", R"({"message":)" + v03_message_with(text_part("deploy")) + "}"));
    bool was_refused = false;
    for (int turn = 0; turn < 10 && !was_refused; ++turn) {
      const auto before = record_of(server, id);
      CHECK(before.first.size() <= 65536);
      auto d = c.call("SendMessage",
                      R"({"message":)" + v03_message_with(text_part(chunk), R"("taskId":)" + q(id)) + "}");
      if (error_code(d) == 0) {
        REQUIRE(state_of(d) == "input-required");
        continue;
      }
      was_refused = true;
      CHECK(turn == 3);  // three of these fit, with their prompts
      CHECK(error_code(d) == -32602);
      std::smatch m;
      const std::string msg = error_message(d);
      REQUIRE_MESSAGE(std::regex_match(msg, m, refused), msg);
      CHECK(m[1] == "Task '" + id + "'");
      CHECK(m[3] == "the Task is unchanged");
      CHECK(std::stoull(m[2]) > 65536);
      // The message's text, less the prompt the new status no longer holds.
      CHECK(std::stoull(m[2]) > before.first.size() + chunk.size() - 1000);
      CHECK(to_json(d["error"]["data"]) == R"({"field":"params.message","limit":"limits.max_task_bytes","max":"65536",)"
                                           R"("size":")" + std::string(m[2]) + R"("})");
      CHECK(record_of(server, id) == before);  // not a byte changed
      // v1.0 and HTTP+JSON are refused alike.
      auto v1 = c.call("SendMessage",
                       R"({"message":)" + v1_message_with(R"([{"text":)" + q(chunk) + "}]", R"("taskId":)" + q(id)) + "}",
                       "2", kV1);
      CHECK(std::string(v1["error"]["data"][0]["metadata"]["limit"].GetString()) == "limits.max_task_bytes");
      Connection conn(port_of(server.url()));
      auto r = rest_send(conn, v1_message_with(R"([{"text":)" + q(chunk) + "}]", R"("taskId":)" + q(id)));
      CHECK(r.status == 400);
      CHECK(record_of(server, id) == before);
    }
    CHECK(was_refused);
    // A small message still fits: the limit refuses growth, not the Task.
    auto small = c.call("SendMessage",
                        R"({"message":)" + v03_message_with(text_part("approve"), R"("taskId":)" + q(id)) + "}");
    CHECK(state_of(small) == "completed");
  }
}

TEST_CASE("an agent's output past limits.max_task_bytes fails the Task with the sizes, and stops the run") {
  auto o = test_options();
  o.limits.max_task_bytes = 65536;

  SUBCASE("progress saved as it comes: the save that would pass the limit is not made") {
    auto flood = std::make_shared<Flood>(8192, 3ms);
    o.executor = flood;
    o.progress_interval_ms = 1;
    auto server = toolnexus::serve(o);
    Client c(server.url());
    auto d = c.send("go", "", R"({"blocking":true})");
    REQUIRE(state_of(d) == "failed");
    std::smatch m;
    const std::string why = status_text(d["result"]);
    REQUIRE_MESSAGE(std::regex_match(why, m, kAgentTooLarge), why);
    CHECK(m[1] == "would make it");
    CHECK(std::stoull(m[2]) > 65536);
    CHECK(eventually([&] { return flood->stopped.load(); }));
    CHECK(flood->chunks.load() < 20);
    const auto rec = record_of(server, task_id(d));
    CHECK(rec.first.size() <= 65536 + 1024);  // the failure record may pass it by its status message
    // What was saved before is kept: some chunks, none of the dropped ones.
    auto stored = parse(rec.first);
    REQUIRE(stored.HasMember("artifacts"));
    CHECK(stored["artifacts"][0]["parts"].Size() >= 1);
    CHECK(stored["artifacts"][0]["parts"].Size() < static_cast<rapidjson::SizeType>(flood->chunks.load()));
  }
  SUBCASE("output piling up between saves: dropped as soon as it alone passes the limit") {
    auto flood = std::make_shared<Flood>(8192, 0ms);
    o.executor = flood;
    o.progress_interval_ms = 60000;
    auto server = toolnexus::serve(o);
    Client c(server.url());
    auto d = c.send("go", "", R"({"blocking":true})");
    REQUIRE(state_of(d) == "failed");
    std::smatch m;
    const std::string why = status_text(d["result"]);
    REQUIRE_MESSAGE(std::regex_match(why, m, kAgentTooLarge), why);
    CHECK(m[1] == "not yet saved is already");
    CHECK(flood->stopped.load());
    // 8 x (8 KiB of text + its part's JSON) is the first total past 64 KiB.
    CHECK(flood->chunks.load() == 8);
    CHECK(!parse(record_of(server, task_id(d)).first).HasMember("artifacts"));
  }
  SUBCASE("a result too large: the Task fails instead of being saved with it (blocking, and not)") {
    o.executor = std::make_shared<BigResult>(100000);
    auto server = toolnexus::serve(o);
    Client c(server.url());
    for (const char *configuration : {R"({"blocking":true})", R"({"blocking":false})"}) {
      CAPTURE(configuration);
      auto d = c.send("go", "", configuration);
      const std::string id = task_id(d);
      auto settled = c.wait_settled(id);
      REQUIRE(state_of(settled) == "failed");
      std::smatch m;
      const std::string why = status_text(settled["result"]);
      REQUIRE_MESSAGE(std::regex_match(why, m, kAgentTooLarge), why);
      CHECK(m[1] == "would make it");
      CHECK(std::stoull(m[2]) > 100000);
      const auto rec = record_of(server, id);
      CHECK(rec.first.size() < 4096);
      CHECK(!parse(rec.first).HasMember("artifacts"));
    }
  }
}

TEST_CASE("serve() refuses Task limits that cannot work") {
  auto o = test_options();
  o.limits.max_task_bytes = 4095;
  CHECK_THROWS_WITH_AS(toolnexus::serve(o), doctest::Contains("limits.max_task_bytes must be at least 4096"),
                       std::invalid_argument);
  o = test_options();
  o.limits.max_task_history = 0;
  CHECK_THROWS_AS(toolnexus::serve(o), std::invalid_argument);
  o = test_options();
  o.limits.max_message_parts = 0;
  CHECK_THROWS_AS(toolnexus::serve(o), std::invalid_argument);
}

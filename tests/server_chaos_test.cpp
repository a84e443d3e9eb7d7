// The Task lifecycle over a faulty store (issue 23.3): the server runs on
// `faults:...;sqlite:FILE`, which fails, delays, conflicts and loses writes
// deterministically from a seed, while clients create Tasks (blocking and
// streaming sends), approve, deny and cancel them, retrying what failed
// with the same messageId as a careful client does. Afterwards, reading the
// sqlite file directly (no faults):
//   - every Task a client was told about is stored, in the state it was
//     told, or in the state of a later request whose answer was lost (an
//     error after every retry);
//   - a Task told terminal stays as told: a later message is refused
//     (-32004) and changes nothing, no second turn ran (one artifact);
//   - every error a client got is the documented one: -32603 "internal
//     error: the task store failed (<TNX status>)", or a state error
//     (-32004/-32002) when a lost answer's request had in fact been done.
// Half the Tasks are created with a push config (a webhook in the test):
// each of them that is stored in a terminal state had that state pushed
// (at least once), and no push announced a terminal state that the store
// does not hold.
// And a crash (abort) of `toolnexus serve` at a chosen store operation:
// the server restarted on the same file has every Task as told, and settles
// what the crash left running.
// The seed, Task count and fault rates come from the environment
// (TNX_CHAOS_SEED, TNX_CHAOS_TASKS) so that bench/chaos_run.sh runs many
// seeds; CTest runs one fixed seed.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include "push_receiver.hpp"
#include "serve_process.hpp"
#include "server_test_support.hpp"

#include <cstdlib>
#include <map>
#include <mutex>
#include <set>
#include <thread>

using namespace tnxtest;

namespace {

uint64_t env_u64(const char *name, uint64_t fallback) {
  const char *v = std::getenv(name);
  return v == nullptr || *v == '\0' ? fallback : std::strtoull(v, nullptr, 10);
}

const std::set<std::string> kTerminal = {"completed", "canceled", "failed", "rejected"};

/// What the clients were told, and which errors they got.
struct Ledger {
  std::mutex mu;
  std::map<std::string, std::string> told;               // Task id -> last state answered
  std::map<std::string, std::set<std::string>> pending;  // Task id -> states of requests whose answer was lost
  std::map<std::string, int> errors;                     // "code message-prefix" -> count
  std::set<std::string> with_push;                       // Tasks told about that were created with a push config
  std::vector<std::string> undocumented;                 // errors that are not the documented ones
  int requests = 0, retries = 0;

  void tell(const std::string &id, const std::string &state) {
    std::lock_guard<std::mutex> l(mu);
    told[id] = state;
    pending[id].clear();
  }
  void lost(const std::string &id, const std::string &state) {
    std::lock_guard<std::mutex> l(mu);
    pending[id].insert(state);
  }
  // Records an error answer; true when it is one a client may retry (the
  // store failed).
  bool error(const rapidjson::Document &d, bool state_error_ok) {
    std::lock_guard<std::mutex> l(mu);
    const int code = error_code(d);
    const std::string msg = error_message(d);
    const std::string store_failed = "internal error: the task store failed (";
    if (code == -32603 && msg.rfind(store_failed, 0) == 0) {
      ++errors[std::to_string(code) + " " + msg.substr(0, msg.find(')') + 1)];
      return true;
    }
    if (state_error_ok && (code == -32004 || code == -32002)) {
      ++errors[std::to_string(code) + " (a message to a terminal Task, or a retry of a request that was done)"];
      return false;
    }
    undocumented.push_back(to_json(d));
    return false;
  }
};

/// A v0.3 user message (blocking unless `blocking` is false), with a push
/// config to `push_url` when it is not empty.
std::string send_params(const std::string &text, const std::string &message_id, const std::string &task_id,
                        bool blocking = true, const std::string &push_url = {}) {
  std::string m = R"({"role":"user","messageId":)" + q(message_id) + R"(,"parts":[{"kind":"text","text":)" +
                  q(text) + "}]" + (task_id.empty() ? "" : R"(,"taskId":)" + q(task_id)) + "}";
  const std::string push =
      push_url.empty() ? "" : R"(,"pushNotificationConfig":{"url":)" + q(push_url) + R"(,"token":"chaos"})";
  return R"({"message":)" + m + R"(,"configuration":{"blocking":)" + (blocking ? "true" : "false") + push + "}}";
}

/// Task id -> the states its push notifications announced (v0.3: the Task,
/// or a status-update event).
std::map<std::string, std::set<std::string>> pushed_states(Receiver &hook) {
  std::map<std::string, std::set<std::string>> out;
  for (const auto &r : hook.got()) {
    auto d = parse(r.body);
    if (!d.IsObject() || !d.HasMember("status")) continue;  // an artifact-update event
    const char *id = d.HasMember("taskId") ? d["taskId"].GetString() : d["id"].GetString();
    out[id].insert(d["status"]["state"].GetString());
  }
  return out;
}

/// One client's life of Task `i`: create it (retrying the same message),
/// then approve, deny or cancel it, then try to change it once it is
/// terminal.
void client_life(const std::string &url, int i, Ledger &ledger, const std::string &push_url) {
  Client c(url);  // a fresh connection per Task: a request that got no answer leaves its connection unusable
  auto call = [&](const std::string &method, const std::string &params, bool state_error_ok,
                  rapidjson::Document &out) {
    for (int attempt = 0; attempt < 6; ++attempt) {
      {
        std::lock_guard<std::mutex> l(ledger.mu);
        ++ledger.requests;
        if (attempt > 0) ++ledger.retries;
      }
      try {
        out = c.call(method, params);
      } catch (const std::exception &e) {  // no answer in time: a hang is a bug, not a fault
        std::lock_guard<std::mutex> l(ledger.mu);
        ledger.undocumented.push_back(method + " " + params + ": " + e.what());
        return false;
      }
      if (!out.HasMember("error")) return true;
      if (!ledger.error(out, state_error_ok)) return false;
    }
    return false;
  };
  // A streaming send (message/stream): what the client is told is the
  // stream's last event; a stream cut by a store failure ends with the
  // documented error event, and the client sends again.
  auto stream = [&](const std::string &params, std::string &id, std::string &state) {
    for (int attempt = 0; attempt < 6; ++attempt) {
      {
        std::lock_guard<std::mutex> l(ledger.mu);
        ++ledger.requests;
        if (attempt > 0) ++ledger.retries;
      }
      Connection conn(port_of(url));
      SseReader sse(conn, rpc_request("message/stream", params, "1"));
      std::vector<SseEvent> events;
      if (sse.status() == 200) events = sse.rest(30000ms);
      if (sse.status() != 200 || !sse.ended() || events.empty()) {
        std::lock_guard<std::mutex> l(ledger.mu);
        ledger.undocumented.push_back("message/stream " + params + ": HTTP " + std::to_string(sse.status()) +
                                      (sse.ended() ? "" : ", did not end") + ", " + std::to_string(events.size()) +
                                      " events");
        return false;
      }
      auto last = parse(events.back().data);
      if (last.HasMember("error")) {
        if (!ledger.error(last, false)) return false;
        continue;
      }
      const auto &r = last["result"];
      id = r.HasMember("taskId") ? r["taskId"].GetString() : r["id"].GetString();
      state = r["status"]["state"].GetString();
      return true;
    }
    return false;
  };
  rapidjson::Document d;
  const std::string tag = "t" + std::to_string(i);
  std::string id, state;
  const std::string create = send_params("deploy " + tag, tag + "-create", "", true, i % 2 == 0 ? push_url : "");
  if (i % 4 == 3) {
    if (!stream(create, id, state)) return;  // never told
  } else {
    if (!call("SendMessage", create, false, d)) return;  // never told
    id = d["result"]["id"].GetString();
    state = d["result"]["status"]["state"].GetString();
  }
  ledger.tell(id, state);
  if (i % 2 == 0) {
    std::lock_guard<std::mutex> l(ledger.mu);
    ledger.with_push.insert(id);
  }
  if (state != "input-required") return;

  const int what = i % 3;
  if (what == 2) {
    if (call("CancelTask", R"({"id":)" + q(id) + "}", true, d) && d.HasMember("result"))
      ledger.tell(id, d["result"]["status"]["state"].GetString());
    else
      ledger.lost(id, "canceled");
  } else {
    const std::string reply = what == 0 ? "approve" : "deny";
    if (call("SendMessage", send_params(reply, tag + "-" + reply, id), true, d) && d.HasMember("result"))
      ledger.tell(id, d["result"]["status"]["state"].GetString());
    else
      ledger.lost(id, what == 0 ? "completed" : "rejected");
  }
  // Terminal now (as told, or as a lost request made it): a new message is
  // refused and changes nothing.
  if (call("SendMessage", send_params("approve", tag + "-late", id), true, d) && !d.HasMember("error")) {
    std::lock_guard<std::mutex> l(ledger.mu);
    ledger.undocumented.push_back("a message to terminal Task " + id + " was accepted: " + to_json(d));
  }
}

/// The Tasks created with a push config that are stored in a terminal state
/// that was not pushed (yet), as "id: state".
std::vector<std::string> unpushed(Ledger &ledger, toolnexus::TaskStore &store,
                                  const std::map<std::string, std::set<std::string>> &pushed) {
  std::vector<std::string> out;
  for (const auto &id : ledger.with_push) {
    auto rec = store.get(id);
    if (!rec || kTerminal.count(rec->state) == 0) continue;
    auto it = pushed.find(id);
    if (it == pushed.end() || it->second.count(rec->state) == 0) out.push_back(id + ": " + rec->state);
  }
  return out;
}

}  // namespace

TEST_CASE("the Task lifecycle over a faulty store: what clients were told is what is stored") {
  const uint64_t seed = env_u64("TNX_CHAOS_SEED", 7);
  const int tasks = static_cast<int>(env_u64("TNX_CHAOS_TASKS", 60));
  CAPTURE(seed);
  TempDir dir;
  const std::string inner = "sqlite:" + (dir.path / "tasks.db").string();
  const std::string faults = "faults:seed=" + std::to_string(seed) +
                             ",error_rate=0.04,conflict_rate=0.05,lost_rate=0.03,latency_ms=0-1;" + inner;
  Ledger ledger;
  Receiver hook;
  std::map<std::string, std::set<std::string>> pushed;
  {
    auto o = test_options();
    o.store = faults;
    o.agent = "approval";
    o.push.allow_targets = {"127.0.0.0/8"};
    o.push.backoff_initial_ms = 50;
    o.push.backoff_max_ms = 400;
    // The sweep (which would find any delivery left behind) comes after the
    // test: every push below is the server's own delivery, retried when the
    // store failed under it.
    o.push.sweep_interval_ms = 60000;
    // Injected failures are logged; TNX_CHAOS_LOG=1 shows them.
    if (std::getenv("TNX_CHAOS_LOG") != nullptr) o.log_level = toolnexus::LogLevel::info;
    else o.log_sink = [](toolnexus::LogLevel, std::string_view) {};
    auto server = toolnexus::serve(o);
    std::vector<std::thread> clients;
    constexpr int kClients = 6;
    for (int k = 0; k < kClients; ++k)
      clients.emplace_back([&, k] {
        for (int i = k; i < tasks; i += kClients) client_life(server.url(), i, ledger, hook.url());
      });
    for (auto &t : clients) t.join();
    // Pushes are delivered after the answers: wait (bounded) until every
    // Task with a push config that is stored terminal had that state pushed.
    auto plain = toolnexus::resolve_store(inner);
    const auto until = std::chrono::steady_clock::now() + 30s;
    while (!unpushed(ledger, *plain, pushed = pushed_states(hook)).empty() && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(50ms);
  }  // the server drains and stops

  MESSAGE("seed " << seed << ": " << ledger.requests << " requests, " << ledger.retries << " retries, "
                  << ledger.told.size() << " Tasks told");
  for (const auto &[what, n] : ledger.errors) MESSAGE("  " << n << " x " << what);
  for (const auto &u : ledger.undocumented) FAIL_CHECK("an undocumented answer: " << u);
  CHECK(ledger.told.size() >= static_cast<size_t>(tasks / 2));  // the faults leave most Tasks made

  auto plain = toolnexus::resolve_store(inner);
  for (const auto &[id, state] : ledger.told) {
    CAPTURE(id);
    CAPTURE(state);
    auto rec = plain->get(id);
    REQUIRE_MESSAGE(rec.has_value(), "a Task a client was told about is not in the store");
    const auto &lost = ledger.pending[id];
    // Told a state a Task moves on from by itself (submitted, working: a
    // run that the store failed ends failed, by its lease if need be), or
    // a settled one, which only a client's request changes.
    const bool moving = state == "submitted" || state == "working";
    CHECK_MESSAGE((rec->state == state || lost.count(rec->state) != 0 || moving),
                  "stored " << rec->state << ", told " << state);
    if (rec->state == "completed") {
      // One approval turn: one artifact, however often it was retried.
      auto task = parse(rec->json);
      CHECK(task["artifacts"].Size() == 1);
    }
  }
  // Push: every stored terminal state of a Task with a config was pushed;
  // no push announced a terminal state the store does not hold.
  for (const auto &u : unpushed(ledger, *plain, pushed)) FAIL_CHECK("not pushed: " << u);
  std::size_t terminal_pushes = 0;
  for (const auto &[id, states] : pushed) {
    auto rec = plain->get(id);
    for (const auto &st : states) {
      if (kTerminal.count(st) == 0) continue;
      ++terminal_pushes;
      CHECK_MESSAGE((rec && rec->state == st), "pushed " << id << " " << st << ", stored "
                                                        << (rec ? rec->state : std::string("nothing")));
    }
  }
  MESSAGE(ledger.with_push.size() << " Tasks with a push config, " << terminal_pushes << " terminal states pushed");
  CHECK(terminal_pushes > 0);

  // No Task outside the told ones is left half-done: each stored Task is in a
  // state a client's request could have left it in.
  toolnexus::ListQuery all;
  std::string cursor;
  do {
    all.cursor = cursor;
    auto page = plain->list(all);
    for (const auto &r : page.records) {
      CAPTURE(r.id);
      CHECK_MESSAGE((r.state == "input-required" || kTerminal.count(r.state) != 0),
                    "left in " << r.state);
    }
    cursor = page.next_cursor;
  } while (!cursor.empty());
}

TEST_CASE("a crash at a chosen store operation: the restarted server has every Task as told and settles the rest") {
  TempDir dir;
  const std::string inner = "sqlite:" + (dir.path / "tasks.db").string();
  const std::vector<std::string> flags = {"--agent", "approval", "--lease-ms", "600", "--lease-renew-ms", "100",
                                          "--settle-interval-ms", "100"};
  std::map<std::string, std::string> told;
  std::string in_flight;  // a Task whose approval the crash cut off
  int sent = 0;
  {
    ServeProcess crashing("faults:crash_at=" + std::to_string(env_u64("TNX_CHAOS_CRASH_AT", 90)) + ";" + inner, flags);
    Client c(crashing.url());
    for (; sent < 1000; ++sent) {
      const std::string tag = "c" + std::to_string(sent);
      HttpResponse r = c.post(R"({"jsonrpc":"2.0","id":"1","method":"SendMessage","params":)" +
                              send_params("deploy " + tag, tag, "", sent % 2 == 0) + "}");
      if (r.status != 200) break;  // it crashed
      auto d = parse(r.body);
      if (d.HasMember("error")) continue;
      const std::string id = d["result"]["id"].GetString();
      told[id] = d["result"]["status"]["state"].GetString();
      if (sent % 3 != 0 || told[id] != "input-required") continue;
      r = c.post(R"({"jsonrpc":"2.0","id":"2","method":"SendMessage","params":)" +
                 send_params("approve", tag + "-ok", id) + "}");
      if (r.status != 200) {  // it crashed during the approval: done or not, nobody was told
        in_flight = id;
        break;
      }
      d = parse(r.body);
      if (!d.HasMember("error")) told[id] = d["result"]["status"]["state"].GetString();
    }
    const int st = crashing.wait();
    REQUIRE_MESSAGE(WIFSIGNALED(st), "the server did not crash at the chosen operation");
    CHECK(WTERMSIG(st) == SIGABRT);
  }
  MESSAGE(sent << " sends before the crash, " << told.size() << " Tasks told");
  REQUIRE(!told.empty());
  ServeProcess restarted(inner, flags);
  Client c(restarted.url());
  for (const auto &[id, state] : told) {
    CAPTURE(id);
    auto got = c.get_task(id);
    REQUIRE_MESSAGE(got.HasMember("result"), to_json(got));
    const std::string now = got["result"]["status"]["state"].GetString();
    // Told "submitted" or "working" (a non-blocking send): the crash may
    // have stopped its run; the restarted server settles it (failed) or it
    // went on to park. Anything told settled stays as told.
    if (id == in_flight)
      CHECK((now == state || now == "working" || now == "completed" || now == "failed"));
    else if (state == "submitted" || state == "working")
      CHECK((now == state || now == "input-required" || now == "failed"));
    else
      CHECK(now == state);
  }
  // Nothing is left running: what the crash interrupted is settled once its
  // lease expires (no server holds it).
  auto plain = toolnexus::resolve_store(inner);
  CHECK(eventually([&] {
    for (const char *running : {"submitted", "working"}) {
      toolnexus::ListQuery q;
      q.state = running;
      if (plain->count(q) != 0) return false;
    }
    return true;
  }, 20000ms));
  const int st = restarted.stop();
  CHECK((WIFEXITED(st) && WEXITSTATUS(st) == 0));
}

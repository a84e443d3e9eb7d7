// Idempotent SendMessage retries (issue 22 item 2), over real HTTP: a send
// retried with the same messageId (same principal; same Task, or for a new
// Task the same contextId or none) gets the first send's Task, with no
// second Task and no second turn: blocking, non-blocking and streaming, on
// JSON-RPC and HTTP+JSON, after a restart (sqlite), and through two server
// processes on one sqlite store under 1,000 concurrent retries. The same
// messageId with another body is refused (-32602 / 400, naming
// params.message.messageId); another principal's messageId is theirs.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include "toolnexus/retention.hpp"
#include "serve_process.hpp"
#include "server_test_support.hpp"

#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <set>

using namespace tnxtest;

namespace {

/// Counts runs (turns) per Task; each completes with the user's text as an
/// artifact, after `released` (so a retry can arrive while the first runs).
class Counting final : public toolnexus::AgentExecutor {
 public:
  std::string name() const override { return "counting"; }
  std::vector<toolnexus::AgentSkill> skills() const override { return {}; }
  toolnexus::ExecutionResult execute(const toolnexus::ExecutionContext &ctx) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++turns_[std::string(ctx.task.id())];
    }
    while (!released && !ctx.cancel_requested) std::this_thread::sleep_for(1ms);
    auto r = toolnexus::ExecutionResult::completed();
    r.add_text_artifact(ctx.latest_text);
    return r;
  }
  int turns(const std::string &id) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = turns_.find(id);
    return it == turns_.end() ? 0 : it->second;
  }
  std::size_t tasks() {
    std::lock_guard<std::mutex> lock(mu_);
    return turns_.size();
  }
  std::atomic<bool> released{true};

 private:
  std::mutex mu_;
  std::map<std::string, int> turns_;
};

std::string message(const std::string &text, const std::string &message_id, const std::string &extra = {}) {
  return R"({"role":"user","messageId":)" + q(message_id) + R"(,"parts":[{"kind":"text","text":)" + q(text) + "}]" +
         (extra.empty() ? "" : "," + extra) + "}";
}

rapidjson::Document send(Client &c, const std::string &msg, const std::string &configuration = {}) {
  return c.call("SendMessage",
                R"({"message":)" + msg + (configuration.empty() ? "" : R"(,"configuration":)" + configuration) + "}");
}

std::size_t stored_tasks(const toolnexus::ServerHandle &server) {
  toolnexus::ListQuery q;
  q.page_size = 1000;
  return server.store()->list(q).records.size();
}

/// User messages in a Task's history with this messageId.
int user_messages(const rapidjson::Value &task, const std::string &message_id) {
  int n = 0;
  if (!task.HasMember("history")) return 0;
  for (const auto &m : task["history"].GetArray())
    if (std::string(m["role"].GetString()) == "user" && m["messageId"].GetString() == message_id) ++n;
  return n;
}

toolnexus::ServerOptions with_agent(toolnexus::ServerOptions o, std::shared_ptr<Counting> agent) {
  o.executor = std::move(agent);
  return o;
}

struct Served {
  std::shared_ptr<Counting> agent;
  toolnexus::ServerHandle server;
  explicit Served(toolnexus::ServerOptions o = test_options())
      : agent(std::make_shared<Counting>()), server(toolnexus::serve(with_agent(std::move(o), agent))) {}
};

}  // namespace

TEST_CASE("a blocking SendMessage retried with the same messageId gets the same Task, one turn") {
  Served s;
  Client c(s.server.url());
  const std::string msg = message("hello", "m1");
  auto first = send(c, msg);
  REQUIRE(state_of(first) == "completed");
  auto again = send(c, msg);
  CHECK(task_id(again) == task_id(first));
  CHECK(state_of(again) == "completed");
  CHECK(artifact_text(again["result"]) == "hello");
  CHECK(s.agent->turns(task_id(first)) == 1);
  CHECK(stored_tasks(s.server) == 1);
  // The same text under another messageId is another send.
  auto other = send(c, message("hello", "m2"));
  CHECK(task_id(other) != task_id(first));
  CHECK(stored_tasks(s.server) == 2);
  // The id is a name-based (version 5) UUID.
  CHECK(task_id(first)[14] == '5');
}

TEST_CASE("a retry while the first send still runs waits for the same outcome") {
  Served s;
  s.agent->released = false;
  const std::string msg = message("slow", "m-slow");
  auto first = std::async(std::launch::async, [&] {
    Client c(s.server.url());
    return send(c, msg);
  });
  REQUIRE(eventually([&] { return s.agent->tasks() == 1; }));
  auto second = std::async(std::launch::async, [&] {
    Client c(s.server.url());
    return send(c, msg);
  });
  // A non-blocking retry answers at once with the Task as it is.
  Client c(s.server.url());
  auto now = send(c, msg, R"({"blocking":false})");
  CHECK((state_of(now) == "submitted" || state_of(now) == "working"));
  s.agent->released = true;
  auto a = first.get(), b = second.get();
  CHECK(task_id(a) == task_id(b));
  CHECK(task_id(now) == task_id(a));
  CHECK(state_of(b) == "completed");
  CHECK(artifact_text(b["result"]) == "slow");
  CHECK(s.agent->turns(task_id(a)) == 1);
  CHECK(stored_tasks(s.server) == 1);
}

TEST_CASE("a non-blocking send retried gets the same Task") {
  Served s;
  Client c(s.server.url());
  const std::string msg = message("later", "m-nb");
  auto first = send(c, msg, R"({"blocking":false})");
  auto again = send(c, msg, R"({"blocking":false})");
  CHECK(task_id(again) == task_id(first));
  auto done = c.wait_settled(task_id(first));
  CHECK(state_of(done) == "completed");
  CHECK(s.agent->turns(task_id(first)) == 1);
  CHECK(stored_tasks(s.server) == 1);
}

TEST_CASE("a streaming send retried streams the same Task, with no second turn") {
  Served s;
  const std::string body = rpc_request("message/stream", R"({"message":)" + message("streamed", "m-st") + "}", "3");
  std::string first_id;
  {
    Connection conn(port_of(s.server.url()));
    SseReader sse(conn, body);
    REQUIRE(sse.status() == 200);
    auto events = sse.rest();
    REQUIRE(!events.empty());
    first_id = parse(events[0].data)["result"]["id"].GetString();
  }
  Connection conn(port_of(s.server.url()));
  SseReader sse(conn, body);
  REQUIRE(sse.status() == 200);
  auto events = sse.rest();
  CHECK(sse.ended());
  // The Task is complete: one frame, the Task as it is.
  REQUIRE(events.size() == 1);
  auto d = parse(events[0].data);
  CHECK(std::string(d["result"]["id"].GetString()) == first_id);
  CHECK(std::string(d["result"]["status"]["state"].GetString()) == "completed");
  CHECK(s.agent->turns(first_id) == 1);
  CHECK(stored_tasks(s.server) == 1);
}

TEST_CASE("the same messageId with a different body is refused, JSON-RPC and REST, and nothing changes") {
  auto o = test_options();
  o.agent = "approval";
  auto server = toolnexus::serve(o);
  Client c(server.url());
  auto first = send(c, message("deploy", "m1"));
  REQUIRE(state_of(first) == "input-required");
  const std::string id = task_id(first);
  auto differs = send(c, message("deploy now", "m1"));
  CHECK(error_code(differs) == -32602);
  CHECK(error_message(differs).find("messageId 'm1' was already used with a different message") != std::string::npos);
  CHECK(to_json(differs["error"]).find("params.message.messageId") != std::string::npos);
  // REST: 400 INVALID_ARGUMENT.
  const std::string rest_body = R"({"message":{"role":"ROLE_USER","messageId":"m1","parts":[{"text":"other"}]}})";
  Connection conn(port_of(server.url()));
  REQUIRE(conn.send_raw("POST /message:send HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                        "Content-Length: " + std::to_string(rest_body.size()) + "\r\n\r\n" + rest_body));
  auto r = conn.read_response();
  CHECK(r.status == 400);
  CHECK(r.body.find("already used with a different message") != std::string::npos);
  // On the existing Task: approve once, retry the approval (same Task, no
  // second turn), then reuse its messageId for another text.
  const std::string approve = message("approve", "m2", R"("taskId":)" + q(id));
  auto approved = send(c, approve);
  REQUIRE(state_of(approved) == "completed");
  auto retried = send(c, approve);
  CHECK(state_of(retried) == "completed");
  CHECK(user_messages(retried["result"], "m2") == 1);
  auto reused = send(c, message("reject", "m2", R"("taskId":)" + q(id)));
  CHECK(error_code(reused) == -32602);
  auto stored = stored_task(server, id);
  CHECK(user_messages(stored, "m2") == 1);
  CHECK(user_messages(stored, "m1") == 1);
  CHECK(stored["metadata"]["toolnexus/recentMessages"].Size() == 2);
  CHECK(stored_tasks(server) == 1);
}

TEST_CASE("another principal's same messageId is another Task; the same principal's is the same") {
  TempDir dir;
  {
    std::ofstream f(dir.path / "tokens.json");
    f << R"({"tok-alice": "alice", "tok-bob": "bob"})";
  }
  auto o = test_options();
  o.auth_tokens = toolnexus::load_auth_tokens(dir.path / "tokens.json");
  Served s(o);
  Client alice(s.server.url(), "tok-alice"), bob(s.server.url(), "tok-bob");
  const std::string msg = message("same", "m1");
  auto a = send(alice, msg), b = send(bob, msg);
  CHECK(task_id(a) != task_id(b));
  CHECK(task_id(send(alice, msg)) == task_id(a));
  CHECK(task_id(send(bob, msg)) == task_id(b));
  // Another contextId is another conversation: another Task.
  auto ctx = send(alice, message("same", "m1", R"("contextId":"c-2")"));
  CHECK(task_id(ctx) != task_id(a));
  CHECK(stored_tasks(s.server) == 3);
}

TEST_CASE("with idempotency off, a retry makes a second Task") {
  auto o = test_options();
  o.idempotency.enabled = false;
  Served s(o);
  Client c(s.server.url());
  const std::string msg = message("twice", "m1");
  CHECK(task_id(send(c, msg)) != task_id(send(c, msg)));
  CHECK(stored_tasks(s.server) == 2);
}

TEST_CASE("a retry after a restart (sqlite) gets the Task the first send made") {
  TempDir dir;
  auto o = test_options();
  o.store = "sqlite:" + (dir.path / "tasks.db").string();
  const std::string msg = message("kept", "m-restart");
  std::string id;
  {
    Served s(o);
    Client c(s.server.url());
    id = task_id(send(c, msg));
  }
  Served s(o);
  Client c(s.server.url());
  auto again = send(c, msg);
  CHECK(task_id(again) == id);
  CHECK(state_of(again) == "completed");
  CHECK(s.agent->tasks() == 0);  // no turn in the second server
  auto differs = send(c, message("changed", "m-restart"));
  CHECK(error_code(differs) == -32602);
}

TEST_CASE("1,000 concurrent retries of 100 messageIds through two server processes on one sqlite store") {
  TempDir dir;
  const std::string sel = "sqlite:" + (dir.path / "tasks.db").string();
  ServeProcess pa(sel), pb(sel);
  const std::string urls[2] = {pa.url(), pb.url()};
  constexpr int kMessages = 100, kRetries = 10, kThreads = 8;
  std::atomic<int> next{0}, failures{0};
  std::mutex mu;
  std::map<int, std::set<std::string>> ids;  // message -> Task ids answered
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      Client clients[2] = {Client(urls[0]), Client(urls[1])};
      for (int k; (k = next++) < kMessages * kRetries;) {
        const int m = k % kMessages;  // each message sent 10 times, spread over time and servers
        auto d = send(clients[(k + t) % 2], message("text " + std::to_string(m), "mc-" + std::to_string(m)),
                      k % 3 == 0 ? R"({"blocking":false})" : "");
        if (!d.HasMember("result")) {
          ++failures;
          continue;
        }
        std::lock_guard<std::mutex> lock(mu);
        ids[m].insert(d["result"]["id"].GetString());
      }
    });
  }
  for (auto &th : threads) th.join();
  CHECK(failures == 0);
  REQUIRE(ids.size() == static_cast<std::size_t>(kMessages));
  for (const auto &[m, set] : ids) CHECK_MESSAGE(set.size() == 1, "message " << m << " got " << set.size() << " Tasks");
  // The store: exactly 100 Tasks, each with one user turn and one reply.
  auto store = toolnexus::resolve_store(sel);
  toolnexus::ListQuery q;
  q.page_size = 1000;
  std::size_t n = 0;
  Client c(urls[0]);
  for (const auto &[m, set] : ids) {
    auto done = c.wait_settled(*set.begin(), 20000ms);
    CHECK(state_of(done) == "completed");
    CHECK(user_messages(done["result"], "mc-" + std::to_string(m)) == 1);
    CHECK(done["result"]["artifacts"].Size() == 1);
  }
  n = store->list(q).records.size();
  CHECK(n == static_cast<std::size_t>(kMessages));
}

TEST_CASE("retention keeps a terminal Task as long as the idempotency window: a retry past its keep time is not run again") {
  // Found by a fresh-user pass: with completed=3s a retry 5 s later created
  // the same Task id again and ran its turn a second time (a second payment).
  auto o = test_options();
  o.lease.settle_interval_ms = 20;  // the sweep that applies retention
  o.idempotency.window_ms = 5000;
  toolnexus::add_retention_rule(o.retention, "completed", "200ms", {}, "test");
  Served s(o);
  Client c(s.server.url());
  const std::string msg = message("pay", "pay-1");
  auto first = send(c, msg);
  REQUIRE(state_of(first) == "completed");
  const std::string id = task_id(first);
  auto rec = s.server.store()->get(id);
  REQUIRE(rec);
  CHECK(rec->due_us == rec->status_time_us + 5'000'000);  // the window, not 200 ms
  std::this_thread::sleep_for(800ms);                    // past the rule, dozens of sweeps
  auto again = send(c, msg);
  CHECK(task_id(again) == id);
  CHECK(state_of(again) == "completed");
  CHECK(s.agent->turns(id) == 1);
  // Past the window it goes, as the policy says.
  CHECK(eventually([&] { return !s.server.store()->get(id).has_value(); }, 30000ms));
}

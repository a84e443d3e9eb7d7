// Retention (issue 22.3) over real HTTP: a terminal Task past its keep time
// leaves the store (GetTask answers TaskNotFound, a waiter on it too); a
// Task waiting in input-required past its wait ends canceled, or failed when
// so configured, with a status message saying it waited too long, and its
// SSE subscriber gets that final event and the end of the stream; states
// without a rule are kept. Durations are short (ms) and every wait polls
// with a generous bound: nothing asserts how long anything took.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include "server_test_support.hpp"

#include "toolnexus/retention.hpp"

#include <map>

using namespace tnxtest;

namespace {

const std::string kV1 = "A2A-Version: 1.0\r\n";
const std::string kV11 = "A2A-Version: 1.1\r\n";
constexpr auto kBound = 30000ms;

toolnexus::ServerOptions retention_options(const std::string &agent) {
  auto o = test_options();
  o.agent = agent;
  o.lease.settle_interval_ms = 20;  // the sweep that also applies retention
  o.streams.poll_ms = 60000;        // a deleted Task's waiters hear it from the sweep, not a poll
  o.idempotency.window_ms = 100;    // else no terminal Task goes sooner than the window (a day)
  return o;
}

bool not_found(Client &c, const std::string &id) { return error_code(c.get_task(id)) == -32001; }

}  // namespace

TEST_CASE("a completed Task past its retention leaves the store; a long-poll on it answers at once; failed is kept") {
  auto o = retention_options("echo");
  toolnexus::add_retention_rule(o.retention, "completed", "1500ms", {}, "test");
  auto server = toolnexus::serve(o);
  Client c(server.url());
  // Kept: failed has no rule. A Task failed by hand, as the store holds it.
  server.store()->save(toolnexus::Task::parse(
      R"({"id":"kept-failed","contextId":"c","status":{"state":"failed","timestamp":"2020-01-01T00:00:00Z"},"kind":"task"})"));
  const std::string id = task_id(c.send("hello", {}, R"({"blocking":true})"));
  auto done = c.get_task(id);
  REQUIRE(state_of(done) == "completed");
  // Its due time is its retention deadline: the sweep reads it when due.
  auto rec = server.store()->get(id);
  REQUIRE(rec);
  CHECK(rec->due_us == rec->status_time_us + 1'500'000);
  // A GetTask long-poll on it is answered at once: a terminal Task's
  // generation never moves again (nothing to wait for but its deletion).
  auto current = c.call("GetTask", R"({"id":)" + q(id) + "}", "1", kV11);
  REQUIRE(current["result"].HasMember("generation"));
  const uint64_t generation = current["result"]["generation"].GetUint64();
  Client waiter(server.url());
  const auto asked = std::chrono::steady_clock::now();
  auto waited = waiter.call("GetTask", R"({"id":)" + q(id) + R"(,"currentGeneration":)" + std::to_string(generation) +
                                           "}",
                            "1", kV11);
  CHECK(std::chrono::steady_clock::now() - asked < 10000ms);  // the bound is a minute
  CHECK_MESSAGE(std::string(waited["result"]["status"]["state"].GetString()) == "TASK_STATE_COMPLETED", to_json(waited));
  CHECK(waited["result"]["generation"].GetUint64() == generation);
  CHECK(eventually([&] { return not_found(c, id); }, kBound));
  CHECK_FALSE(server.store()->get(id).has_value());
  CHECK(server.store()->get("kept-failed").has_value());
}

TEST_CASE("an input-required Task past its wait ends canceled with a message; its subscriber sees it and the stream ends") {
  auto o = retention_options("approval");
  toolnexus::add_retention_rule(o.retention, "input-required", "3s", {}, "test");
  auto server = toolnexus::serve(o);
  Client c(server.url());
  const std::string id = task_id(c.send("deploy 1.4", {}, R"({"blocking":true})"));
  REQUIRE(state_of(c.get_task(id)) == "input-required");
  Connection conn(port_of(server.url()));
  SseReader sse(conn, rpc_request("SubscribeToTask", R"({"id":)" + q(id) + "}", "5", kV1));
  REQUIRE(sse.status() == 200);
  auto first = sse.next(kBound);
  REQUIRE(first);
  // The snapshot (still waiting), then the expiry as the final status event.
  REQUIRE_MESSAGE(std::string(parse(first->data)["result"]["task"]["status"]["state"].GetString()) ==
                      "TASK_STATE_INPUT_REQUIRED",
                  first->data);
  auto rest = sse.rest(kBound);
  CHECK(sse.ended());
  REQUIRE(!rest.empty());
  auto last = parse(rest.back().data);
  REQUIRE_MESSAGE(last["result"].HasMember("statusUpdate"), rest.back().data);
  const auto &status = last["result"]["statusUpdate"]["status"];
  CHECK(std::string(status["state"].GetString()) == "TASK_STATE_CANCELED");
  CHECK(std::string(status["message"]["parts"][0]["text"].GetString()) ==
        "expired: waited longer than 3s in input-required");
  // GetTask says the same; a message to it is refused as to any terminal Task.
  auto got = c.get_task(id);
  CHECK(state_of(got) == "canceled");
  CHECK(status_text(got["result"]) == "expired: waited longer than 3s in input-required");
  CHECK(error_code(c.send("approve", R"("taskId":)" + q(id))) == -32004);
  // Server-private metadata is gone with the wait.
  auto stored = stored_task(server, id);
  CHECK_FALSE(stored["metadata"].HasMember("toolnexus/pending"));
}

TEST_CASE("a waiting Task expires to failed when configured; a resumed one does not expire") {
  auto o = retention_options("approval");
  toolnexus::add_retention_flag(o.retention, "input-required=300ms:failed", "test");
  auto server = toolnexus::serve(o);
  Client c(server.url());
  const std::string id = task_id(c.send("deploy 2.0", {}, R"({"blocking":true})"));
  CHECK(eventually([&] { return state_of(c.get_task(id)) == "failed"; }, kBound));
  auto got = c.get_task(id);
  CHECK(status_text(got["result"]) == "expired: waited longer than 300ms in input-required");
}

TEST_CASE("a Task stored before the policy was set (no due time) is deleted by the first sweep") {
  auto memory = toolnexus::resolve_store("memory");
  memory->save(toolnexus::Task::parse(
      R"({"id":"old","contextId":"c","status":{"state":"completed","timestamp":"2020-01-01T00:00:00Z"},"kind":"task"})"));
  memory->save(toolnexus::Task::parse(
      R"({"id":"old-working","contextId":"c","status":{"state":"rejected","timestamp":"2020-01-01T00:00:00Z"},"kind":"task"})"));
  REQUIRE(memory->get("old")->due_us == toolnexus::kNoTime);
  auto o = retention_options("echo");
  o.store.store = memory;
  toolnexus::add_retention_rule(o.retention, "completed", "30d", {}, "test");
  auto server = toolnexus::serve(o);
  CHECK(eventually([&] { return !memory->get("old").has_value(); }, kBound));
  CHECK(memory->get("old-working").has_value());  // rejected: no rule
}

TEST_CASE("retention rules: durations with units; errors name the key and the value") {
  CHECK(toolnexus::parse_duration_ms("250ms", "k") == 250);
  CHECK(toolnexus::parse_duration_ms("30d", "k") == 30LL * 24 * 3600 * 1000);
  CHECK(toolnexus::format_duration(7200000) == "2h");
  CHECK(toolnexus::format_duration(1500) == "1500ms");
  toolnexus::RetentionOptions r;
  CHECK_THROWS_WITH_AS(toolnexus::add_retention_flag(r, "completed=5x", "--retention"),
                       doctest::Contains("--retention completed: '5x' has an unknown unit"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(toolnexus::add_retention_flag(r, "working=1h", "--retention"),
                       doctest::Contains("unknown state 'working'"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(toolnexus::add_retention_flag(r, "input-required=1h:completed", "--retention"),
                       doctest::Contains("canceled or failed, not 'completed'"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(toolnexus::add_retention_flag(r, "completed=0s", "--retention"),
                       doctest::Contains("'0s' is not positive"), std::invalid_argument);
  CHECK(r.empty());  // nothing half-added
  // A policy built in code is checked by serve().
  auto o = test_options();
  o.retention.wait["input-required"] = toolnexus::WaitExpiry{1000, "deleted"};
  CHECK_THROWS_WITH_AS(toolnexus::serve(o), doctest::Contains("retention.input-required.to: 'deleted'"),
                       std::invalid_argument);
  o = test_options();
  o.retention.keep_ms["working"] = 1000;
  CHECK_THROWS_WITH_AS(toolnexus::serve(o), doctest::Contains("retention.working: not a terminal state"),
                       std::invalid_argument);
  o = test_options();
  o.retention.keep_ms["completed"] = 0;
  CHECK_THROWS_WITH_AS(toolnexus::serve(o), doctest::Contains("retention.completed: 0 ms"), std::invalid_argument);
}

TEST_CASE("a Task listed as due but kept under the current policy gets its due time recorded again, and stays") {
  // Its due time was recorded under a shorter policy (here: an hour ago);
  // the policy now keeps completed Tasks for a day. Without the refresh,
  // every due sweep would read it again until its new deadline.
  auto memory = toolnexus::resolve_store("memory");
  const int64_t now = toolnexus::now_us();
  toolnexus::SaveOptions so;
  so.due_us = now - 3'600'000'000LL;
  memory->save(toolnexus::Task::parse(R"({"id":"recent","contextId":"c","status":{"state":"completed","timestamp":)" +
                                      q(toolnexus::format_timestamp(now - 7'200'000'000LL)) + R"(},"kind":"task"})"),
               so);
  auto o = retention_options("echo");
  o.store.store = memory;
  o.lease.full_settle_interval_ms = 0;  // the first sweep is full; then only due sweeps
  toolnexus::add_retention_rule(o.retention, "completed", "1d", {}, "test");
  auto server = toolnexus::serve(o);
  const int64_t want = memory->get("recent")->status_time_us + 24LL * 3600 * 1'000'000;
  CHECK(eventually([&] { return memory->get("recent")->due_us == want; }, kBound));
  CHECK(memory->get("recent").has_value());
}

TEST_CASE("two replicas on one sqlite file, both sweeping: each waiting Task is expired exactly once") {
  TempDir dir;
  const std::string sel = "sqlite:" + (dir.path / "tasks.db").string();
  auto direct = toolnexus::resolve_store(sel);
  auto oa = retention_options("approval"), ob = retention_options("approval");
  oa.store = sel;
  ob.store = sel;
  toolnexus::add_retention_flag(oa.retention, "input-required=1500ms:canceled", "test");
  toolnexus::add_retention_flag(ob.retention, "input-required=1500ms:canceled", "test");
  auto a = toolnexus::serve(oa);
  auto b = toolnexus::serve(ob);
  Client ca(a.url()), cb(b.url());
  constexpr int kTasks = 24;
  std::map<std::string, uint64_t> parked;  // id -> the version it was parked at
  for (int i = 0; i < kTasks; ++i) {
    Client &c = i % 2 == 0 ? ca : cb;
    const std::string id = task_id(c.send("job " + std::to_string(i), {}, R"({"blocking":true})"));
    auto rec = direct->get(id);
    REQUIRE(rec);
    REQUIRE(rec->state == "input-required");
    parked[id] = rec->version;
  }
  for (const auto &[id, version] : parked) {
    CAPTURE(id);
    REQUIRE(eventually([&] { return state_of(ca.get_task(id)) == "canceled"; }, kBound));
    auto rec = direct->get(id);
    REQUIRE(rec);
    // One save after the parked one: the replica that came second lost the
    // compare-and-set and left the Task alone (a second expiry would be
    // version + 2, with the first one's status overwritten).
    CHECK(rec->version == version + 1);
    CHECK(status_text(cb.get_task(id)["result"]) == "expired: waited longer than 1500ms in input-required");
  }
}

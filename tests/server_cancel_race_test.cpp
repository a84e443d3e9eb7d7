// Cancel racing completion, 200 times: a terminal state is never
// overwritten. Whatever CancelTask answered is what the store keeps.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include "server_test_support.hpp"

#include <atomic>

using namespace tnxtest;

namespace {

// Echo, after a pause of 0..400 µs (so cancels land before, during and
// after the run).
class JitteryEcho final : public toolnexus::AgentExecutor {
 public:
  std::string name() const override { return "jittery-echo"; }
  std::vector<toolnexus::AgentSkill> skills() const override { return {}; }
  toolnexus::ExecutionResult execute(const toolnexus::ExecutionContext &ctx) override {
    const auto n = counter_.fetch_add(1);
    std::this_thread::sleep_for(std::chrono::microseconds((n * 37) % 400));
    auto r = toolnexus::ExecutionResult::completed();
    r.add_text_artifact(ctx.latest_text);
    return r;
  }

 private:
  std::atomic<unsigned> counter_{0};
};

// Blocks in execute() until released, then completes; records whether it
// saw the cancel.
class Gate final : public toolnexus::AgentExecutor {
 public:
  std::string name() const override { return "gate"; }
  std::vector<toolnexus::AgentSkill> skills() const override { return {}; }
  toolnexus::ExecutionResult execute(const toolnexus::ExecutionContext &ctx) override {
    entered = true;
    while (!released) std::this_thread::sleep_for(1ms);
    saw_cancel = ctx.cancel_requested.load();
    auto r = toolnexus::ExecutionResult::completed();
    r.add_text_artifact("too late");
    return r;
  }
  std::atomic<bool> entered{false}, released{false}, saw_cancel{false};
};

}  // namespace

TEST_CASE("a worker finishing after a cancel does not overwrite canceled") {
  auto gate = std::make_shared<Gate>();
  auto o = test_options();
  o.executor = gate;
  toolnexus::ServerHandle server = toolnexus::serve(o);
  Client c(server.url());
  const std::string id = task_id(c.send("slow"));
  REQUIRE(eventually([&] { return gate->entered.load(); }));
  // "working" is saved once the run has lasted progress_interval_ms.
  CHECK(eventually([&] { return state_of(c.get_task(id)) == "working"; }, 2000ms));
  auto cancel = c.call("CancelTask", R"({"id":)" + q(id) + "}");
  REQUIRE(state_of(cancel) == "canceled");
  const uint64_t version_after_cancel = server.store()->get(id)->version;
  gate->released = true;
  std::this_thread::sleep_for(100ms);
  CHECK(gate->saw_cancel.load());  // fulfilment was told to stop
  auto final = c.get_task(id);
  CHECK(state_of(final) == "canceled");
  CHECK(!final["result"].HasMember("artifacts"));
  CHECK(server.store()->get(id)->version == version_after_cancel);  // nothing saved after the cancel
}

TEST_CASE("cancel racing completion 200 times never overwrites a terminal state") {
  auto o = test_options();
  o.executor = std::make_shared<JitteryEcho>();
  o.workers = 4;
  toolnexus::ServerHandle server = toolnexus::serve(o);
  Client sender(server.url());
  Client canceller(server.url());
  int canceled = 0, completed_first = 0;
  for (int i = 0; i < 200; ++i) {
    CAPTURE(i);
    const std::string id = task_id(sender.send("race " + std::to_string(i)));
    if (i % 3 == 1) std::this_thread::sleep_for(std::chrono::microseconds(100 + 7 * i));
    auto cancel = canceller.call("CancelTask", R"({"id":)" + q(id) + "}");
    auto final = sender.wait_settled(id);
    const std::string final_state = state_of(final);
    if (cancel.HasMember("result")) {
      // The cancel won: canceled it stays, and the worker's result was dropped.
      CHECK(state_of(cancel) == "canceled");
      CHECK(final_state == "canceled");
      CHECK(!final["result"].HasMember("artifacts"));
      ++canceled;
    } else {
      // The Task finished first: TaskNotCancelable, completed it stays.
      CHECK(error_code(cancel) == -32002);
      CHECK(final_state == "completed");
      CHECK(artifact_text(final["result"]) == "race " + std::to_string(i));
      ++completed_first;
    }
    CHECK(!final["result"].HasMember("metadata"));  // no lease left behind
  }
  // A moment later nothing has changed either (no late worker save).
  std::this_thread::sleep_for(50ms);
  auto list = sender.call("ListTasks", R"({"status":"canceled","pageSize":100})");
  CHECK(list["result"]["totalSize"].GetUint64() == static_cast<uint64_t>(canceled));
  list = sender.call("ListTasks", R"({"status":"completed","pageSize":100})");
  CHECK(list["result"]["totalSize"].GetUint64() == static_cast<uint64_t>(completed_first));
  MESSAGE("canceled first: " << canceled << ", completed first: " << completed_first);
  CHECK(canceled > 0);
  CHECK(canceled + completed_first == 200);
}

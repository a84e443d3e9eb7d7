// How many durable writes a SendMessage costs, and that none is skipped
// where a client was told something (issue 11): a blocking SendMessage that
// creates a Task saves it once, with its outcome; a long run is saved while
// it runs; a store that fails is answered promptly; a non-blocking one saves
// before it answers.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include "server_test_support.hpp"

#include <pthread.h>

#include <atomic>
#include <mutex>
#include <set>

using namespace tnxtest;

namespace {

// A memory store that counts saves and can be told to fail them.
class CountingStore final : public toolnexus::TaskStore {
 public:
  std::optional<toolnexus::TaskRecord> get(std::string_view id) override { return inner_->get(id); }
  void remove(std::string_view id, uint64_t v) override { inner_->remove(id, v); }
  toolnexus::ListPage list(const toolnexus::ListQuery &q) override { return inner_->list(q); }
  toolnexus::StoreInfo info() const override {
    toolnexus::StoreInfo i = inner_->info();
    i.scheme = "counting";
    if (durable) i.capabilities |= TNX_CAP_DURABLE | TNX_CAP_PERSISTENT;
    if (!cas) i.capabilities &= ~uint64_t{TNX_CAP_COMPARE_AND_SET};
    return i;
  }
  explicit CountingStore(bool durable_ = false) : durable(durable_) {}
  const bool durable;  // says TNX_CAP_DURABLE, as file:, sqlite: and postgres do
  bool cas = true;     // false: says it has no compare-and-set (set before the server starts)
  std::atomic<int> saves{0};
  std::atomic<bool> fail{false};

 protected:
  uint64_t do_save(const toolnexus::TaskRecord &r, uint64_t expected) override {
    if (fail) throw toolnexus::StoreError(toolnexus::Status::io, "counting store: disk on fire");
    ++saves;
    toolnexus::SaveOptions o;
    o.expected_version = expected;
    o.owner = r.owner;
    o.tenant = r.tenant;
    return inner_->save(r.task(), o);
  }

 private:
  std::shared_ptr<toolnexus::TaskStore> inner_ = toolnexus::resolve_store("memory");
};

// Completes at once, or after `gate` opens.
// Records the name of the thread each run is on (the server names its
// threads: tnx-run executor workers, tnx-http request threads) and the most
// runs in progress at once.
struct Gated final : toolnexus::AgentExecutor {
  std::string name() const override { return "gated"; }
  std::vector<toolnexus::AgentSkill> skills() const override { return {}; }
  bool runs_briefly() const override { return brief; }
  toolnexus::ExecutionResult execute(const toolnexus::ExecutionContext &ctx) override {
    char thread[16] = {};
    pthread_getname_np(pthread_self(), thread, sizeof thread);
    {
      std::lock_guard<std::mutex> lock(mu);
      last_id = std::string(ctx.task.id());
      threads.insert(thread);
    }
    ++entered;
    const int now = ++in_progress;
    for (int seen = most; now > seen && !most.compare_exchange_weak(seen, now);) {
    }
    while (hold && !ctx.cancel_requested) std::this_thread::sleep_for(1ms);
    --in_progress;
    auto r = toolnexus::ExecutionResult::completed();
    r.add_text_artifact("done");
    return r;
  }
  std::string id() {
    std::lock_guard<std::mutex> lock(mu);
    return last_id;
  }
  std::set<std::string> thread_names() {
    std::lock_guard<std::mutex> lock(mu);
    return threads;
  }
  bool brief = false;  // set before the server starts
  std::atomic<bool> hold{false};
  std::atomic<int> entered{0}, in_progress{0}, most{0};
  std::mutex mu;
  std::string last_id;
  std::set<std::string> threads;
};

struct Fixture {
  std::shared_ptr<CountingStore> store;
  std::shared_ptr<Gated> agent = std::make_shared<Gated>();
  toolnexus::ServerHandle server;
  explicit Fixture(int blocking_timeout_ms = 60000, bool durable = false, bool brief = false,
                   bool idempotency = true)
      : store(std::make_shared<CountingStore>(durable)), server([&] {
          agent->brief = brief;
          auto o = test_options();
          o.idempotency.enabled = idempotency;
          o.store = store;
          o.executor = agent;
          o.limits.blocking_timeout_ms = blocking_timeout_ms;
          return toolnexus::serve(o);
        }()) {}
};

}  // namespace

TEST_CASE("with idempotency on, a blocking SendMessage saves its new Task before the run and with the outcome") {
  // Saved create-only first, so a retry of the send finds it (docs/a2a.md,
  // "Idempotent retries").
  Fixture f;
  Client c(f.server.url());
  const int before = f.store->saves;
  auto d = c.send("quick", {}, "");
  REQUIRE(state_of(d) == "completed");
  CHECK(f.store->saves - before == 2);
}

TEST_CASE("with idempotency off, a blocking SendMessage saves its new Task once, with the outcome") {
  Fixture f(60000, false, false, false);
  Client c(f.server.url());
  for (int i = 0; i < 20; ++i) {
    const int before = f.store->saves;
    auto d = c.send("quick", {}, "");  // no configuration: blocking
    REQUIRE(state_of(d) == "completed");
    CHECK(f.store->saves - before == 1);
    // What the client was told is what is stored.
    CHECK(to_json(stored_task(f.server, task_id(d))["status"]) == to_json(d["result"]["status"]));
  }
  // The stored timeline still has every event, submitted first.
  auto d = c.send("events", {}, "");
  auto t = stored_task(f.server, task_id(d));
  const auto &log = t["metadata"]["toolnexus/events"]["log"];
  REQUIRE(log.Size() == 4);
  CHECK(std::string(log[0]["status"]["state"].GetString()) == "submitted");
  CHECK(std::string(log[1]["status"]["state"].GetString()) == "working");
  CHECK(log[2].HasMember("artifact"));
  CHECK(std::string(log[3]["status"]["state"].GetString()) == "completed");
}

TEST_CASE("a non-blocking SendMessage is saved before it is answered") {
  Fixture f;
  Client c(f.server.url());
  f.agent->hold = true;
  const int before = f.store->saves;
  auto d = c.send("later");  // {"blocking": false}
  CHECK(state_of(d) == "submitted");
  CHECK(f.store->saves - before >= 1);
  CHECK(stored_task(f.server, task_id(d))["status"]["state"] == "submitted");
  f.agent->hold = false;
  CHECK(state_of(c.wait_settled(task_id(d))) == "completed");
}

TEST_CASE("a blocking SendMessage whose run lasts is in the store, working, while it runs") {
  Fixture f;
  f.agent->hold = true;
  std::thread client([&] {
    Client c(f.server.url());
    CHECK(state_of(c.send("long", {}, "")) == "completed");
  });
  REQUIRE(eventually([&] { return f.agent->entered.load() == 1; }));
  const std::string id = f.agent->id();
  // Saved once the run has lasted progress_interval_ms (100 ms).
  CHECK(eventually([&] {
    auto rec = f.store->get(id);
    return rec && rec->state == "working";
  }, 2000ms));
  Client other(f.server.url());
  CHECK(state_of(other.get_task(id)) == "working");
  f.agent->hold = false;
  client.join();
  CHECK(f.store->get(id)->state == "completed");
}

TEST_CASE("a blocking SendMessage whose store fails is answered -32603 at once, and nothing is left") {
  Fixture f;
  Client c(f.server.url());
  f.store->fail = true;
  const auto t0 = Clock::now();
  auto d = c.call("SendMessage", R"({"message":{"role":"user","messageId":"m","parts":[{"kind":"text","text":"x"}]}})");
  CHECK(error_code(d) == -32603);
  CHECK(error_message(d).find("task store failed (io)") != std::string::npos);
  CHECK(Clock::now() - t0 < 2000ms);
  f.store->fail = false;
  CHECK(c.call("ListTasks", "{}")["result"]["totalSize"].GetInt() == 0);
}

TEST_CASE("a blocking SendMessage that stops waiting before its Task settles saves it before answering") {
  Fixture f(/*blocking_timeout_ms=*/0);
  f.agent->hold = true;
  Client c(f.server.url());
  auto d = c.send("no wait", {}, "");
  const std::string id = task_id(d);
  // Answered with a Task that is in the store.
  auto rec = f.store->get(id);
  REQUIRE(rec.has_value());
  CHECK(rec->state == std::string(d["result"]["status"]["state"].GetString()));
  f.agent->hold = false;
  CHECK(state_of(c.wait_settled(id)) == "completed");
}

TEST_CASE("by default a durable store gets 64 executor threads (saves in flight share fsyncs), memory 4") {
  // Runs that wait (here on a gate, on a durable store on the disk) hold a
  // worker each: how many run at once is how many workers there are.
  for (const bool durable : {false, true}) {
    CAPTURE(durable);
    Fixture f(60000, durable);
    f.agent->hold = true;
    Client c(f.server.url());
    std::vector<std::string> ids;
    for (int i = 0; i < 40; ++i) ids.push_back(task_id(c.send("wait " + std::to_string(i))));  // non-blocking
    const int want = durable ? 40 : 4;
    CHECK(eventually([&] { return f.agent->entered.load() == want; }, 5000ms));
    std::this_thread::sleep_for(200ms);
    CHECK(f.agent->entered.load() == want);  // and no more
    f.agent->hold = false;
    for (const auto &id : ids) CHECK(state_of(c.wait_settled(id)) == "completed");
  }
}

TEST_CASE("a blocking SendMessage to an executor that runs briefly runs on the request's thread, within the workers") {
  SUBCASE("brief executor: blocking runs on the request thread, non-blocking on a worker") {
    Fixture f(60000, false, /*brief=*/true);
    Client c(f.server.url());
    for (int i = 0; i < 5; ++i) CHECK(state_of(c.send("inline", {}, "")) == "completed");
    CHECK(f.agent->thread_names() == std::set<std::string>{"tnx-http"});
    CHECK(state_of(c.wait_settled(task_id(c.send("queued")))) == "completed");
    CHECK(f.agent->thread_names() == std::set<std::string>{"tnx-http", "tnx-run"});
    // Resuming (a blocking follow-up) is no different: the same rule. The
    // gated agent completes at once, so only a new Task is checked here.
  }
  SUBCASE("also on a store without compare-and-set (whose new Tasks are saved before they run)") {
    auto store = std::make_shared<CountingStore>();
    store->cas = false;
    auto agent = std::make_shared<Gated>();
    agent->brief = true;
    auto o = test_options();
    o.store = store;
    o.executor = agent;
    auto server = toolnexus::serve(o);
    Client c(server.url());
    for (int i = 0; i < 3; ++i) CHECK(state_of(c.send("inline", {}, "")) == "completed");
    CHECK(agent->thread_names() == std::set<std::string>{"tnx-http"});
  }
  SUBCASE("an executor that may wait always runs on a worker") {
    Fixture f;
    Client c(f.server.url());
    for (int i = 0; i < 5; ++i) CHECK(state_of(c.send("worker", {}, "")) == "completed");
    CHECK(f.agent->thread_names() == std::set<std::string>{"tnx-run"});
  }
  SUBCASE("inline runs count against the workers: at most 4 (memory's default) at once") {
    Fixture f(60000, false, /*brief=*/true);
    f.agent->hold = true;
    std::vector<std::thread> clients;
    std::atomic<int> completed{0};
    for (int i = 0; i < 10; ++i)
      clients.emplace_back([&, i] {
        Client c(f.server.url());
        if (state_of(c.send("gated " + std::to_string(i), {}, "")) == "completed") ++completed;
      });
    CHECK(eventually([&] { return f.agent->entered.load() == 4; }, 5000ms));
    std::this_thread::sleep_for(200ms);
    CHECK(f.agent->entered.load() == 4);  // 6 wait for a slot, on the queue
    CHECK(f.agent->most.load() == 4);
    f.agent->hold = false;
    for (auto &t : clients) t.join();
    CHECK(completed.load() == 10);
    CHECK(f.agent->most.load() <= 4);
    // The 6 that found no free slot were queued and run by the workers.
    CHECK(f.agent->thread_names().count("tnx-run") == 1);
  }
}

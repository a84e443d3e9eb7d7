// The due index (ABI 1.5) as the server uses it: every save records when
// the Task is next due (a running Task's lease expiry), the lease and push
// sweeps after the first read only what is due, and the first (full) sweep
// still finds Tasks saved without a due time. What is counted is records
// read, not time: an idle server with thousands of Tasks reads none.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include "server_test_support.hpp"

#include <atomic>
#include <cstdlib>
#include <fstream>

using namespace tnxtest;
using toolnexus::Task;

namespace {

// Forwards to a store and counts the records its lists deliver, and the
// lists that asked for what is due.
// The wrapped store's protected do_save, through a class derived from
// TaskStore (as the server's MeteredStore reaches it).
struct Forward : toolnexus::TaskStore {
  static uint64_t save(toolnexus::TaskStore &s, const toolnexus::TaskRecord &r, uint64_t expected) {
    return (s.*(&Forward::do_save))(r, expected);
  }
};

// Forwards to a store and counts the records its lists deliver, and the
// lists that asked for what is due.
class CountingStore final : public toolnexus::TaskStore {
 public:
  explicit CountingStore(std::shared_ptr<toolnexus::TaskStore> inner) : inner_(std::move(inner)) {}
  std::optional<toolnexus::TaskRecord> get(std::string_view id) override { return inner_->get(id); }
  void remove(std::string_view id, uint64_t expected) override { inner_->remove(id, expected); }
  toolnexus::ListPage list(const toolnexus::ListQuery &q) override {
    toolnexus::ListPage p = inner_->list(q);
    listed += p.records.size();
    if (q.due_before_us) ++due_lists;
    return p;
  }
  toolnexus::StoreInfo info() const override { return inner_->info(); }
  std::unique_ptr<toolnexus::ChangeSubscription> watch_changes(toolnexus::ChangeListener l) override {
    return inner_->watch_changes(std::move(l));
  }
  std::atomic<uint64_t> listed{0};
  std::atomic<uint64_t> due_lists{0};

 protected:
  uint64_t do_save(const toolnexus::TaskRecord &r, uint64_t expected) override {
    return Forward::save(*inner_, r, expected);
  }

 private:
  std::shared_ptr<toolnexus::TaskStore> inner_;
};

// A Task as another server would have left it: working, leased by
// `instance` until `expires_us`.
Task leased(const std::string &id, const std::string &instance, int64_t expires_us) {
  const int64_t now = toolnexus::now_us();
  return Task::parse(R"({"id":)" + q(id) + R"(,"contextId":"c","status":{"state":"working","timestamp":)" +
                     q(toolnexus::format_timestamp(now - 1'000'000)) +
                     R"(},"kind":"task","metadata":{"toolnexus/lease":{"instance":)" + q(instance) +
                     R"(,"expiresAt":)" + q(toolnexus::format_timestamp(expires_us)) + "}}}");
}

std::string state_of(toolnexus::TaskStore &s, const std::string &id) {
  auto r = s.get(id);
  return r ? r->state : "<missing>";
}

}  // namespace

TEST_CASE("an idle server's sweeps read only what is due; the first sweep finds what has no due time") {
  auto memory = toolnexus::resolve_store("memory");
  REQUIRE((memory->info().capabilities & TNX_CAP_DUE_INDEX) != 0);
  constexpr int kStored = 3000;
  for (int i = 0; i < kStored; ++i)
    memory->save(Task::parse(R"({"id":"done-)" + std::to_string(i) +
                             R"(","contextId":"c","status":{"state":"completed"},"kind":"task"})"));
  // Saved without a due time (by hand, or an older server), its lease long
  // expired: only a full sweep can find it.
  memory->save(leased("undated", "gone-1", toolnexus::now_us() - 5'000'000));

  auto counting = std::make_shared<CountingStore>(memory);
  auto o = test_options();
  o.store = counting;
  o.lease.lease_ms = 400;
  o.lease.renew_interval_ms = 80;
  o.lease.settle_interval_ms = 20;
  o.push.sweep_interval_ms = 20;
  auto server = toolnexus::serve(o);

  REQUIRE(eventually([&] { return state_of(*memory, "undated") == "failed"; }, 5000ms));
  // Once the first sweeps are over, a sweep every 20 ms (lease and push)
  // reads nothing: wait for a quiet stretch of 300 ms (15 sweeps of each),
  // then count over another one.
  REQUIRE(eventually(
      [&] {
        const uint64_t before = counting->listed.load();
        std::this_thread::sleep_for(300ms);
        return counting->listed.load() == before;
      },
      10000ms));
  const uint64_t listed_before = counting->listed.load(), due_before = counting->due_lists.load();
  std::this_thread::sleep_for(300ms);
  CHECK(counting->due_lists.load() - due_before >= 4);  // the sweeps ran, and asked for what is due
  CHECK(counting->listed.load() == listed_before);       // and read no record: none was due

  // A Task another server leased (saved as a server saves: with its lease's
  // expiry as the due time) is settled once that passes, by a due sweep.
  toolnexus::SaveOptions so;
  const int64_t expiry = toolnexus::now_us() + 200'000;
  so.due_us = expiry;
  memory->save(leased("dated", "gone-2", expiry), so);
  REQUIRE(eventually([&] { return state_of(*memory, "dated") == "failed"; }, 5000ms));
  CHECK(memory->get("dated")->due_us == toolnexus::kNoTime);  // settled: nothing due any more
  // What the due sweeps read: the one Task (possibly on both sweeps, and
  // again while its settling save raced them), never the 3,000 others.
  CHECK(counting->listed.load() - listed_before <= 6);
}

TEST_CASE("a running Task's saves record its lease expiry as its due time; a finished Task has none") {
  auto memory = toolnexus::resolve_store("memory");
  auto gate = std::make_shared<HoldGate>();
  auto o = test_options();
  o.store = memory;
  o.executor = gate;
  o.lease.lease_ms = 30000;
  o.lease.renew_interval_ms = 10000;
  auto server = toolnexus::serve(o);
  Client c(server.url());
  auto r = c.send("hold");
  const std::string id = r["result"]["id"].GetString();
  REQUIRE(eventually([&] { return gate->entered.load() == 1; }));
  REQUIRE(eventually([&] { return state_of(*memory, id) == "working"; }));
  auto rec = memory->get(id);
  Task t = rec->task();
  const auto lease = t.json()["metadata"].FindMember("toolnexus/lease");
  REQUIRE(lease != t.json()["metadata"].MemberEnd());
  int64_t expires = 0;
  REQUIRE(toolnexus::parse_timestamp(lease->value["expiresAt"].GetString(), expires));
  CHECK(rec->due_us == expires);
  toolnexus::ListQuery due;
  due.due_before_us = expires + 1;
  auto page = memory->list(due);
  REQUIRE(page.records.size() == 1);
  CHECK(page.records[0].id == id);

  gate->released = true;
  REQUIRE(eventually([&] { return state_of(*memory, id) == "completed"; }));
  CHECK(memory->get(id)->due_us == toolnexus::kNoTime);
  due.due_before_us = INT64_MAX;
  CHECK(memory->list(due).records.empty());
}

TEST_CASE("`store put` and `store copy` record the due time a server would: a held Task put by hand is settled when its lease expires") {
  TempDir dir;
  const std::string exe = std::string(TOOLNEXUS_BIN_DIR) + "/toolnexus";
  const std::string db = "sqlite:" + dir.str() + "/t.db", copy = "sqlite:" + dir.str() + "/c.db";
  auto store = toolnexus::resolve_store(db);
  auto o = test_options();
  o.store = store;
  o.lease.lease_ms = 400;
  o.lease.renew_interval_ms = 80;
  o.lease.settle_interval_ms = 20;
  o.lease.full_settle_interval_ms = 0;  // only at start: what follows must be found by its due time
  auto server = toolnexus::serve(o);

  // A Task held by a server that died; its lease expires in 3 s (long
  // enough for the CLI runs below on a slow sanitizer build: the server must
  // not have settled it before they are checked).
  const int64_t expiry = toolnexus::now_us() + 3'000'000;
  const std::string file = dir.str() + "/held.json";
  {
    std::ofstream f(file);
    f << leased("held", "dead-instance", expiry).to_json();
  }
  // Put in a store no server watches, then copied elsewhere: each keeps the
  // due time (computed from the Task).
  const std::string side = "sqlite:" + dir.str() + "/side.db";
  REQUIRE(std::system((exe + " store put " + side + " " + file + " > /dev/null").c_str()) == 0);
  CHECK(toolnexus::resolve_store(side)->get("held")->due_us == expiry);
  REQUIRE(std::system((exe + " store copy " + side + " " + copy + " > /dev/null").c_str()) == 0);
  CHECK(toolnexus::resolve_store(copy)->get("held")->due_us == expiry);
  // Put while this server runs: found by its due time and settled.
  REQUIRE(std::system((exe + " store put " + db + " " + file + " > /dev/null").c_str()) == 0);
  CHECK(store->get("held")->due_us == expiry);
  REQUIRE(eventually([&] { return state_of(*store, "held") == "failed"; }, 10000ms));
  CHECK(store->get("held")->due_us == toolnexus::kNoTime);
}

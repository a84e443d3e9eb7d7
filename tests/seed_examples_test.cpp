// The three examples of the seed document (shared/reference/seed-task-store.md)
// turned into tests: the selector table, a suspended Task surviving its store
// being closed and reopened, and a custom store passed through as-is.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "test_util.hpp"
#include "toolnexus/registry.hpp"

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

namespace fs = std::filesystem;
using namespace toolnexus;

namespace {
fs::path temp_dir() { return tnx_test::temp_dir("tnx-seed"); }
using tnx_test::slurp;

// Seed example 3's DocsCountingTaskStore, in C++.
class CountingTaskStore final : public TaskStore {
 public:
  std::optional<TaskRecord> get(std::string_view id) override {
    std::lock_guard l(mu_);
    auto it = tasks_.find(std::string(id));
    if (it == tasks_.end()) return std::nullopt;
    return it->second;
  }
  void remove(std::string_view id, uint64_t) override {
    std::lock_guard l(mu_);
    if (tasks_.erase(std::string(id)) == 0) throw StoreError(Status::not_found, "no task");
  }
  ListPage list(const ListQuery &) override { return {}; }
  StoreInfo info() const override {
    StoreInfo i;
    i.scheme = "custom";
    return i;
  }
  int save_count() const { return saves_; }

 protected:
  uint64_t do_save(const TaskRecord &r, uint64_t) override {
    std::lock_guard l(mu_);
    TaskRecord &slot = tasks_[r.id];
    uint64_t v = slot.version + 1;
    slot = r;
    slot.version = v;
    ++saves_;
    return v;
  }

 private:
  std::mutex mu_;
  std::map<std::string, TaskRecord> tasks_;
  std::atomic<int> saves_{0};
};
}  // namespace

TEST_CASE("example 1: resolving each selector") {
  CHECK(resolve_store(std::shared_ptr<TaskStore>())->info().scheme == "memory");  // nil
  CHECK(resolve_store("memory")->info().scheme == "memory");
  fs::path dir = temp_dir() / "tasks";  // does not exist yet: created
  auto fstore = resolve_store("file:" + dir.string());
  CHECK(fstore->info().scheme == "file");
  CHECK(fs::is_directory(dir));
  auto custom = resolve_store();
  CHECK(resolve_store(custom) == custom);
  CHECK_THROWS_AS(resolve_store("redis:somewhere"), std::invalid_argument);
  CHECK_THROWS_AS(resolve_store("file:"), std::invalid_argument);
  fs::remove_all(dir.parent_path());
}

TEST_CASE("example 2: a suspended Task is still on disk, input-required, after the store closes") {
  fs::path dir = temp_dir();
  const std::string id = "9f0c6a0e-7d4e-4b8e-9d55-2f1d3c4b5a69";
  {
    auto store = resolve_store("file:" + dir.string());
    Task t = Task::parse(R"({"id":")" + id + R"(","contextId":"ctx-1","kind":"task",)"
                         R"("history":[{"role":"user","messageId":"m1","parts":[{"kind":"text","text":"go"}]}]})");
    t.set_status(task_state::kSubmitted);
    store->save(t);
    t.set_status(task_state::kWorking);
    store->save(t);
    rapidjson::Document msg;
    msg.Parse(R"({"role":"agent","messageId":"a1","parts":[{"kind":"text","text":"Authorize me"}]})");
    t.set_status(task_state::kInputRequired, rapidjson::Value(msg, t.allocator()));
    store->save(t);
    store->close();
  }
  // "restart": read the persisted file directly, with no store at all.
  fs::path file = dir / (id + ".json");
  REQUIRE(fs::exists(file));
  Task reloaded = Task::parse(slurp(file));
  CHECK(reloaded.state() == "input-required");
  CHECK(reloaded.id() == id);
  // and through a fresh store on the same directory.
  auto again = resolve_store("file:" + dir.string());
  auto rec = again->get(id);
  REQUIRE(rec.has_value());
  CHECK(rec->state == "input-required");
  CHECK(rec->context_id == "ctx-1");
  CHECK(std::string(rec->task().json()["status"]["message"]["parts"][0]["text"].GetString()) == "Authorize me");
  fs::remove_all(dir);
}

TEST_CASE("example 3: a custom TaskStore is passed through as-is") {
  auto store = std::make_shared<CountingTaskStore>();
  std::shared_ptr<TaskStore> base = store;
  CHECK(resolve_store(base) == base);
  store->save(Task::parse(R"({"id":"t1","status":{"state":"submitted"}})"));
  store->save(Task::parse(R"({"id":"t1","status":{"state":"completed"}})"));
  CHECK(store->get("t1")->state == "completed");
  CHECK(store->get("t1")->task().state() == "completed");
  CHECK(store->save_count() == 2);
  CHECK_FALSE(store->get("missing").has_value());
}

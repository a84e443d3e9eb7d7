// retention_bench: what the server's retention sweep costs on a big store
// with little due (issue 22.3's proof: O(due) records read, not O(store)).
//
//   retention_bench [--tasks N] [--due M] [--full] SELECTOR...
//
// Fills each store (fresh: memory, file:DIR, sqlite:PATH,
// postgres://... pointing at an empty database) with N completed Tasks
// (default 1,000,000), M of them (default 1,000) older than the 30-day
// retention, each saved with the due time a server with that policy
// records; then runs one due sweep (the server's step between full sweeps:
// it deletes the M) and prints its time, the records the sweep read (its own
// count) and the records the store delivered to it (counted by a wrapper:
// lists and gets), which must both be M. --full also times a full pass by
// status time (`store gc`; what the server does at start and hourly) over
// a refill of the M. Numbers are printed, never asserted.
#include "domain/task_retention.hpp"
#include "toolnexus/registry.hpp"
#include "toolnexus/retention.hpp"
#include "toolnexus/server.hpp"
#include "toolnexus/task_store.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

using namespace toolnexus;
using Clock = std::chrono::steady_clock;

namespace {

// The wrapped store's protected do_save, through a class derived from
// TaskStore.
struct Forward : TaskStore {
  static uint64_t save(TaskStore &s, const TaskRecord &r, uint64_t expected) {
    return (s.*(&Forward::do_save))(r, expected);
  }
};

// Forwards to a store and counts the records it hands out.
class CountingStore final : public TaskStore {
 public:
  explicit CountingStore(std::shared_ptr<TaskStore> inner) : inner_(std::move(inner)) {}
  std::optional<TaskRecord> get(std::string_view id) override {
    auto r = inner_->get(id);
    if (r) ++delivered;
    return r;
  }
  void remove(std::string_view id, uint64_t expected) override { inner_->remove(id, expected); }
  ListPage list(const ListQuery &q) override {
    ListPage p = inner_->list(q);
    delivered += p.records.size();
    return p;
  }
  StoreInfo info() const override { return inner_->info(); }
  std::atomic<uint64_t> delivered{0};

 protected:
  uint64_t do_save(const TaskRecord &r, uint64_t expected) override { return Forward::save(*inner_, r, expected); }

 private:
  std::shared_ptr<TaskStore> inner_;
};

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Saves Tasks first..last-1; the first `due` of them are 31 days old.
void fill(TaskStore &store, uint64_t first, uint64_t last, uint64_t due, const RetentionOptions &policy) {
  const int64_t now = now_us();
  uint64_t i = first;
  Task task;
  BatchItem item;
  const BatchSource source = [&]() -> const BatchItem * {
    if (i >= last) return nullptr;
    const int64_t age_s = i - first < due ? 31LL * 24 * 3600 : 3600 + static_cast<int64_t>(i % 86400);
    char id[32];
    std::snprintf(id, sizeof id, "t-%09llu", static_cast<unsigned long long>(i));
    task = Task::parse(std::string(R"({"id":")") + id + R"(","contextId":"c)" + std::to_string(i % 1000) +
                       R"(","status":{"state":"completed","timestamp":")" +
                       format_timestamp(now - age_s * 1'000'000) + R"("},"kind":"task"})");
    item.task = &task;
    item.options = SaveOptions{};
    item.options.expected_version = kNoVersion;
    item.options.due_us = task_due_us(task, policy);
    ++i;
    return &item;
  };
  store.save_stream(source, false);
}

}  // namespace

int main(int argc, char **argv) {
  uint64_t tasks = 1'000'000, due = 1'000;
  bool full = false;
  std::vector<std::string> selectors;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--tasks" && i + 1 < argc) tasks = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--due" && i + 1 < argc) due = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--full") full = true;
    else if (!a.empty() && a[0] != '-') selectors.push_back(a);
    else {
      std::fprintf(stderr, "usage: retention_bench [--tasks N] [--due M] [--full] SELECTOR...\n");
      return 2;
    }
  }
  if (selectors.empty() || due > tasks) {
    std::fprintf(stderr, "usage: retention_bench [--tasks N] [--due M] [--full] SELECTOR...\n");
    return 2;
  }
  RetentionOptions policy;
  add_retention_rule(policy, "completed", "30d", {}, "bench");
  for (const std::string &sel : selectors) {
    auto inner = resolve_store(sel);
    if ((inner->info().capabilities & TNX_CAP_DUE_INDEX) == 0) {
      std::printf("%s: no due index; skipped\n", sel.c_str());
      continue;
    }
    auto t0 = Clock::now();
    fill(*inner, 0, tasks, due, policy);
    std::printf("%s: filled %llu Tasks (%llu due) in %.1f s\n", sel.c_str(), static_cast<unsigned long long>(tasks),
                static_cast<unsigned long long>(due), seconds_since(t0));
    std::fflush(stdout);
    CountingStore store(inner);
    t0 = Clock::now();
    const GcCounts c = server_detail::sweep_retention(store, policy, /*due_only=*/true, now_us(), {});
    const double s = seconds_since(t0);
    std::printf("%s: due sweep %.4f s, read %llu records (store delivered %llu), deleted %llu, of %llu Tasks\n",
                sel.c_str(), s, static_cast<unsigned long long>(c.read),
                static_cast<unsigned long long>(store.delivered.load()), static_cast<unsigned long long>(c.deleted),
                static_cast<unsigned long long>(tasks));
    std::fflush(stdout);
    if (full) {
      fill(*inner, tasks, tasks + due, due, policy);
      store.delivered = 0;
      t0 = Clock::now();
      const GcCounts f = collect_expired(store, policy, false, {});
      std::printf("%s: full pass by status time %.4f s, read %llu records (store delivered %llu), deleted %llu\n",
                  sel.c_str(), seconds_since(t0), static_cast<unsigned long long>(f.read),
                  static_cast<unsigned long long>(store.delivered.load()), static_cast<unsigned long long>(f.deleted));
    }
    inner->close();
  }
  return 0;
}

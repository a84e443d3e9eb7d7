// conformance/change_feed_rule.cpp: the rule for the change feed (ABI 1.4,
// tnx_store_vtable.watch; TaskStore::watch_changes), held by every store
// that offers one.
#include "conformance.hpp"

#include "toolnexus/task_store.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace toolnexus::conformance {

namespace {

#define FEED_EXPECT(cond, what)                                               \
  do {                                                                        \
    if (!(cond)) throw Failure(std::string("expected " #cond ": ") + (what)); \
  } while (0)

Task feed_task(const std::string &id, const std::string &state) {
  return Task::parse("{\"id\":\"" + id + "\",\"contextId\":\"cf\",\"status\":{\"state\":\"" + state +
                     "\"},\"kind\":\"task\"}");
}

/// What one listener heard, for the test thread to wait on.
class Heard {
 public:
  ChangeListener listener() {
    return [this](const StoreChange &c) {
      std::lock_guard<std::mutex> lock(mu_);
      changes_.push_back(c);
      cv_.notify_all();
    };
  }
  /// Waits (a liveness bound of `limit`, not a speed goal) until `pred`
  /// holds for what was heard; returns whether it did.
  template <class Pred>
  bool wait_for(Pred pred, std::chrono::milliseconds limit = std::chrono::milliseconds(10000)) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, limit, [&] { return pred(changes_); });
  }
  std::vector<StoreChange> all() {
    std::lock_guard<std::mutex> lock(mu_);
    return changes_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<StoreChange> changes_;
};

bool has(const std::vector<StoreChange> &v, StoreChange::Kind kind, const std::string &id, uint64_t version) {
  return std::any_of(v.begin(), v.end(), [&](const StoreChange &c) {
    return c.kind == kind && c.id == id && (version == 0 || c.version == version);
  });
}

std::string describe(const std::vector<StoreChange> &v) {
  std::string out;
  for (const auto &c : v) {
    out += out.empty() ? "" : ", ";
    out += (c.kind == StoreChange::Kind::saved ? "saved " : c.kind == StoreChange::Kind::deleted ? "deleted " : "gap ") +
           c.id + "@" + std::to_string(c.version);
  }
  return out.empty() ? "nothing" : out;
}

}  // namespace

void change_feed_rule(const StoreFactory &fresh) {
  auto s = fresh();
  Heard heard;
  auto sub = s->watch_changes(heard.listener());
  const bool claims = (s->info().capabilities & TNX_CAP_CHANGE_FEED) != 0;
  if (!sub) {
    FEED_EXPECT(!claims, "the store claims TNX_CAP_CHANGE_FEED but watch_changes gave no feed");
    throw Skipped("the store has no change feed (TNX_CAP_CHANGE_FEED): the host polls");
  }
  FEED_EXPECT(claims, "watch_changes gave a feed although the store lacks TNX_CAP_CHANGE_FEED");

  // A save, a second save, a delete: each heard with its id and version,
  // and never before a get returns it.
  const uint64_t v1 = s->save(feed_task("cf-1", "working"));
  FEED_EXPECT(heard.wait_for([&](auto &v) { return has(v, StoreChange::Kind::saved, "cf-1", v1); }),
              "no 'saved cf-1@" + std::to_string(v1) + "' within 10 s; heard: " + describe(heard.all()));
  const uint64_t v2 = s->save(feed_task("cf-1", "completed"));
  FEED_EXPECT(heard.wait_for([&](auto &v) { return has(v, StoreChange::Kind::saved, "cf-1", v2); }),
              "no 'saved cf-1@" + std::to_string(v2) + "'; heard: " + describe(heard.all()));
  s->remove("cf-1");
  FEED_EXPECT(heard.wait_for([&](auto &v) { return has(v, StoreChange::Kind::deleted, "cf-1", 0); }),
              "no 'deleted cf-1'; heard: " + describe(heard.all()));
  for (const auto &c : heard.all())
    if (c.kind == StoreChange::Kind::deleted && c.id == "cf-1")
      FEED_EXPECT(c.version == 0 || c.version == v2,
                  "a delete reports the version the Task had (" + std::to_string(v2) + ") or 0, not " +
                      std::to_string(c.version));

  // Per id, versions never go back, whatever the interleaving; the last one
  // heard is the one stored.
  {
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
      threads.emplace_back([&, t] {
        for (int i = 0; i < 25; ++i) s->save(feed_task("cf-burst-" + std::to_string(t % 2), "working"));
      });
    for (auto &th : threads) th.join();
    for (int t = 0; t < 2; ++t) {
      const std::string id = "cf-burst-" + std::to_string(t);
      const uint64_t last = s->get(id)->version;
      FEED_EXPECT(heard.wait_for([&](auto &v) { return has(v, StoreChange::Kind::saved, id, last); }),
                  "the last save of " + id + " (version " + std::to_string(last) + ") was not heard");
      uint64_t seen = 0;
      for (const auto &c : heard.all()) {
        if (c.id != id || c.kind != StoreChange::Kind::saved) continue;
        FEED_EXPECT(c.version >= seen, id + ": version " + std::to_string(c.version) + " heard after " +
                                           std::to_string(seen) + " (versions of an id must not go back)");
        seen = c.version;
      }
    }
  }

  // Any number of listeners; one that leaves hears nothing more.
  {
    Heard second;
    auto sub2 = s->watch_changes(second.listener());
    FEED_EXPECT(sub2 != nullptr, "a second listener got no feed");
    const uint64_t v = s->save(feed_task("cf-2", "working"));
    FEED_EXPECT(second.wait_for([&](auto &x) { return has(x, StoreChange::Kind::saved, "cf-2", v); }),
                "the second listener did not hear 'saved cf-2'");
    FEED_EXPECT(heard.wait_for([&](auto &x) { return has(x, StoreChange::Kind::saved, "cf-2", v); }),
                "the first listener did not hear 'saved cf-2'");
    sub2.reset();
    const std::size_t before = second.all().size();
    const uint64_t w = s->save(feed_task("cf-3", "working"));
    FEED_EXPECT(heard.wait_for([&](auto &x) { return has(x, StoreChange::Kind::saved, "cf-3", w); }),
                "the first listener did not hear 'saved cf-3'");
    FEED_EXPECT(second.all().size() == before, "a listener whose subscription was destroyed was still called");
  }

  // A store of another process (here: another open of the same location)
  // is heard too, for a store that is shared between processes.
  if (fresh.can_reopen() && (s->info().capabilities & TNX_CAP_MULTI_PROCESS) != 0) {
    OpenOptions o;
    auto other = fresh.reopen(o);
    const uint64_t v = other->save(feed_task("cf-other", "working"));
    FEED_EXPECT(heard.wait_for([&](auto &x) {
                  return has(x, StoreChange::Kind::saved, "cf-other", v) ||
                         std::any_of(x.begin(), x.end(),
                                     [](const StoreChange &c) { return c.kind == StoreChange::Kind::gap; });
                }),
                "a save through another open of the location was not heard (nor a gap); heard: " +
                    describe(heard.all()));
    other->close();
  }
  sub.reset();
}

}  // namespace toolnexus::conformance

// tests/sqlite_feed_test.cpp: the sqlite store's change feed (ABI 1.4;
// plugins/sqlite/change_log.hpp) through the C ABI: this process's saves,
// another process's, hand-written SQL's; gaps when the log was pruned past
// the watcher or emptied; unwatch stops the calls. (The conformance kit's
// change-feed rule covers the common contract; this is what is sqlite's own.)
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "sqlite_harness.hpp"

#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

/// One change as heard, with when.
struct Heard {
  uint32_t kind;
  std::string id;
  uint64_t version;
  Clock::time_point at;
};

/// A sink context: what the feed reported, for the test thread to wait on.
class Ear {
 public:
  static void sink(void *ctx, const tnx_change *c) {
    auto *self = static_cast<Ear *>(ctx);
    std::lock_guard<std::mutex> lk(self->mu_);
    self->heard_.push_back({c->kind, std::string(c->id.data != nullptr ? c->id.data : "", c->id.len), c->version,
                            Clock::now()});
    ++self->calls_;
    self->cv_.notify_all();
  }
  /// Waits (liveness bound 10 s, not a speed goal) for a change matching.
  bool wait(uint32_t kind, const std::string &id, uint64_t version = 0) {
    std::unique_lock<std::mutex> lk(mu_);
    return cv_.wait_for(lk, std::chrono::seconds(10), [&] { return find(kind, id, version) != nullptr; });
  }
  const Heard *find(uint32_t kind, const std::string &id, uint64_t version) const {
    for (const Heard &h : heard_)
      if (h.kind == kind && (kind == TNX_CHANGE_GAP || h.id == id) && (version == 0 || h.version == version))
        return &h;
    return nullptr;
  }
  Clock::time_point when(uint32_t kind, const std::string &id, uint64_t version) {
    std::lock_guard<std::mutex> lk(mu_);
    const Heard *h = find(kind, id, version);
    REQUIRE(h != nullptr);
    return h->at;
  }
  size_t calls() {
    std::lock_guard<std::mutex> lk(mu_);
    return calls_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Heard> heard_;
  size_t calls_ = 0;
};

double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

}  // namespace

TEST_CASE("this process's saves and deletes are heard with their versions; unwatch stops the calls") {
  TempDir dir;
  Store s;
  must_open(s, dir / "f.db");
  Ear ear;
  REQUIRE(s.watch(&Ear::sink, &ear).st == TNX_OK);
  Res again = s.watch(&Ear::sink, &ear);
  CHECK(again.st == TNX_EINVAL);
  CHECK_MESSAGE(contains(again.err, "runs already"), again.err);

  const uint64_t v1 = must_save(s, task("a"));
  const uint64_t v2 = must_save(s, task("a", 2000, "ctx", "completed"));
  REQUIRE(s.del("a").st == TNX_OK);
  CHECK(ear.wait(TNX_CHANGE_SAVED, "a", v1));
  CHECK(ear.wait(TNX_CHANGE_SAVED, "a", v2));
  CHECK(ear.wait(TNX_CHANGE_DELETED, "a", v2));

  REQUIRE(s.unwatch().st == TNX_OK);
  const size_t before = ear.calls();
  must_save(s, task("b"));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  CHECK(ear.calls() == before);
  CHECK(s.unwatch().st == TNX_EINVAL);
  // And again: a feed can be started after one stopped.
  Ear second;
  REQUIRE(s.watch(&Ear::sink, &second).st == TNX_OK);
  const uint64_t vc = must_save(s, task("c"));
  CHECK(second.wait(TNX_CHANGE_SAVED, "c", vc));
  CHECK(s.close().st == TNX_OK);  // close stops a running feed
}

TEST_CASE("another process's saves are heard within the poll interval (p50/p99 printed)") {
  TempDir dir;
  const std::string db = dir / "two.db";
  constexpr int kSaves = 200;
  int to_child[2], from_child[2];
  REQUIRE(::pipe(to_child) == 0);
  REQUIRE(::pipe(from_child) == 0);
  // Forked before this process opens a store (and starts its threads): a
  // child forked from a process with threads may find a lock (malloc's,
  // a sanitizer's) held forever, and hung under ASan.
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    // The other process: once the parent says go, saves one Task each time
    // the parent asks, and answers with the version (the parent timestamps
    // the ask).
    ::close(to_child[1]);
    ::close(from_child[0]);
    char go;
    if (::read(to_child[0], &go, 1) != 1) ::_exit(7);
    Store other;
    if (other.open(db).st != TNX_OK) ::_exit(2);
    for (int i = 0; i < kSaves; ++i) {
      char c;
      if (::read(to_child[0], &c, 1) != 1) ::_exit(3);
      Res r = other.save(task("x" + std::to_string(i)));
      if (r.st != TNX_OK) ::_exit(4);
      if (::write(from_child[1], &r.version, sizeof r.version) != sizeof r.version) ::_exit(5);
    }
    ::_exit(other.close().st == TNX_OK ? 0 : 6);
  }
  ::close(to_child[0]);
  ::close(from_child[1]);
  Store s;
  must_open(s, db);
  Ear ear;
  REQUIRE(s.watch(&Ear::sink, &ear).st == TNX_OK);
  REQUIRE(::write(to_child[1], "g", 1) == 1);
  std::vector<double> ms;
  for (int i = 0; i < kSaves; ++i) {
    const auto asked = Clock::now();
    REQUIRE(::write(to_child[1], "s", 1) == 1);
    uint64_t v = 0;
    REQUIRE(::read(from_child[0], &v, sizeof v) == sizeof v);
    const std::string id = "x" + std::to_string(i);
    REQUIRE(ear.wait(TNX_CHANGE_SAVED, id, v));
    // From the ask: includes the other process's commit (an fsync).
    ms.push_back(std::chrono::duration<double, std::milli>(ear.when(TNX_CHANGE_SAVED, id, v) - asked).count());
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  MESSAGE("another process's save heard after (ask to sink, feed_poll_ms=20): p50 " << percentile(ms, 0.5)
                                                                                      << " ms, p99 "
                                                                                      << percentile(ms, 0.99) << " ms");
}

TEST_CASE("saves by hand-written SQL (an older plugin, a script) are heard too: the triggers log them") {
  TempDir dir;
  const std::string db = dir / "raw.db";
  Store s;
  must_open(s, db);
  Ear ear;
  REQUIRE(s.watch(&Ear::sink, &ear).st == TNX_OK);
  {
    RawDb raw(db);
    raw.exec(
        "INSERT INTO tnx_tasks (id, context_id, state, status_time_us, owner, tenant, version, task_json)"
        " VALUES ('by-hand', 'c', 'working', 1, '', '', 1, '{\"id\":\"by-hand\"}')");
    raw.exec("UPDATE tnx_tasks SET version = 2 WHERE id = 'by-hand'");
  }
  CHECK(ear.wait(TNX_CHANGE_SAVED, "by-hand", 1));
  CHECK(ear.wait(TNX_CHANGE_SAVED, "by-hand", 2));
}

TEST_CASE("a watcher that fell behind the pruned log reports a gap; a log emptied by hand loses nothing") {
  TempDir dir;
  const std::string db = dir / "gap.db";
  Store watched;
  // A long interval: only this store's own saves wake its watcher.
  must_open(watched, db + "?feed_poll_ms=60000");
  Ear ear;
  REQUIRE(watched.watch(&Ear::sink, &ear).st == TNX_OK);
  {
    // Another store (no poke to the watcher) writes more than the log keeps
    // and prunes it (every 1,000 commits, down to 10,000 rows).
    Store busy;
    must_open(busy, db + "?synchronous=off");
    for (int i = 0; i < 12500; ++i) must_save(busy, task("bulk" + std::to_string(i)));
    CHECK(busy.close().st == TNX_OK);
  }
  const uint64_t v = must_save(watched, task("wake"));
  CHECK(ear.wait(TNX_CHANGE_GAP, ""));
  CHECK(ear.wait(TNX_CHANGE_SAVED, "wake", v));  // and it goes on

  // Emptied by hand under a running watcher: seq is never reused, so the
  // next save is heard as usual (no gap, nothing missed).
  {
    RawDb raw(db);
    raw.exec("DELETE FROM tnx_changes");
  }
  const uint64_t v2 = must_save(watched, task("after-emptied"));
  CHECK(ear.wait(TNX_CHANGE_SAVED, "after-emptied", v2));
}

TEST_CASE("a read-only store offers no feed: the capability is cleared and watch is refused") {
  TempDir dir;
  const std::string db = dir / "ro.db";
  {
    Store s;
    must_open(s, db);
    must_save(s, task("t"));
  }
  Store ro;
  uint64_t caps = Plugin::get().d->capabilities;
  REQUIRE(ro.open(db, TNX_OPEN_READ_ONLY, &caps).st == TNX_OK);
  CHECK((caps & TNX_CAP_CHANGE_FEED) == 0);
  Ear ear;
  CHECK(ro.watch(&Ear::sink, &ear).st == TNX_EUNSUPPORTED);
  Store mode_ro;
  caps = Plugin::get().d->capabilities;
  REQUIRE(mode_ro.open(db + "?mode=ro", 0, &caps).st == TNX_OK);
  CHECK((caps & TNX_CAP_CHANGE_FEED) == 0);
}

TEST_CASE("feed_poll_ms is checked") {
  TempDir dir;
  Store s;
  Res r = s.open(dir / "p.db?feed_poll_ms=0");
  CHECK(r.st == TNX_EINVAL);
  CHECK_MESSAGE(contains(r.err, "feed_poll_ms"), r.err);
  CHECK(s.open(dir / "p.db?feed_poll_ms=60000").st == TNX_OK);
}

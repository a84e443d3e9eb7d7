// tests/postgres/postgres_feed_test.cpp: the postgres plugin's change feed
// (ABI 1.4, LISTEN/NOTIFY; issue 20 item 1), part of the postgres_plugin_test
// program (same cluster, same fixture). Two stores on one table stand for
// two replicas: what one writes, the other's feed must hear.
#include <doctest/doctest.h>

#include "pg_test_util.hpp"

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

using namespace toolnexus;
using pgtest::Admin;
using pgtest::make_task;
using pgtest::open_store;
using pgtest::unique;

namespace {

using Kind = StoreChange::Kind;
using clock_type = std::chrono::steady_clock;

/// Everything one listener heard, each with when it arrived, for the test
/// thread to wait on.
class Heard {
 public:
  /// A listener that records into this object.
  ChangeListener listener() {
    return [this](const StoreChange &c) {
      std::lock_guard<std::mutex> lock(mu_);
      changes_.push_back(c);
      times_.push_back(clock_type::now());
      cv_.notify_all();
    };
  }

  /// Waits (a liveness bound, not a speed goal) until `kind` `id`@`version`
  /// (version 0: any) was heard; returns when it arrived, or nullopt.
  std::optional<clock_type::time_point> wait_for(Kind kind, const std::string &id, uint64_t version,
                                                 std::chrono::milliseconds limit = std::chrono::milliseconds(10000)) {
    std::unique_lock<std::mutex> lock(mu_);
    size_t at = 0;
    auto found = [&] {
      for (; at < changes_.size(); ++at) {
        const StoreChange &c = changes_[at];
        if (c.kind == kind && c.id == id && (version == 0 || c.version == version)) return true;
      }
      return false;
    };
    if (!cv_.wait_for(lock, limit, found)) return std::nullopt;
    return times_[at];
  }

  /// A copy of what was heard so far.
  std::vector<StoreChange> all() {
    std::lock_guard<std::mutex> lock(mu_);
    return changes_;
  }

  /// How many gaps were heard so far.
  size_t gaps() {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<size_t>(
        std::count_if(changes_.begin(), changes_.end(), [](const StoreChange &c) { return c.kind == Kind::gap; }));
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<StoreChange> changes_;
  std::vector<clock_type::time_point> times_;
};

/// "saved a@1, deleted b@2, gap" (ids cut at 40 bytes).
std::string describe(const std::vector<StoreChange> &v) {
  std::string out;
  for (const auto &c : v) {
    out += out.empty() ? "" : ", ";
    out += c.kind == Kind::saved ? "saved " : c.kind == Kind::deleted ? "deleted " : "gap";
    if (c.kind != Kind::gap) out += c.id.substr(0, 40) + "@" + std::to_string(c.version);
  }
  return out.empty() ? "nothing" : out;
}

/// The backend pids of the listening connections of `table`'s channel.
std::vector<std::string> listener_pids(Admin &admin, const std::string &table) {
  std::vector<std::string> pids;
  for (const auto &row : admin.query("SELECT pid FROM pg_stat_activity WHERE strpos(query, $1) > 0"
                                     " AND pid <> pg_backend_pid() ORDER BY pid",
                                     {"LISTEN \"tnx:" + table + ":"}))
    pids.push_back(row[0]);
  return pids;
}

}  // namespace

TEST_CASE("change feed: a replica's saves and deletes are heard with id, version and kind; another table's are not") {
  const std::string t = unique("feed"), other = unique("feed_other");
  auto a = open_store(t), b = open_store(t), c = open_store(other);
  REQUIRE((a->info().capabilities & TNX_CAP_CHANGE_FEED) != 0);
  Heard heard_a, heard_c;
  auto sub_a = a->watch_changes(heard_a.listener());
  auto sub_c = c->watch_changes(heard_c.listener());
  REQUIRE(sub_a != nullptr);
  REQUIRE(sub_c != nullptr);
  Admin admin;
  CHECK(listener_pids(admin, t).size() == 1);  // one listening connection for the store

  const uint64_t v1 = b->save(make_task("f1", "ctx", "working", 1));
  REQUIRE_MESSAGE(heard_a.wait_for(Kind::saved, "f1", v1), describe(heard_a.all()));
  CHECK(a->get("f1")->version >= v1);  // never early
  const uint64_t v2 = b->save(make_task("f1", "ctx", "completed", 2), SaveOptions{v1, "", ""});
  REQUIRE_MESSAGE(heard_a.wait_for(Kind::saved, "f1", v2), describe(heard_a.all()));
  CHECK(v2 == v1 + 1);
  b->remove("f1");
  REQUIRE_MESSAGE(heard_a.wait_for(Kind::deleted, "f1", v2), describe(heard_a.all()));  // the version it had
  CHECK_FALSE(a->get("f1").has_value());

  // Create-only, compare-and-set delete and a batch: every writing path.
  const uint64_t n1 = b->save(make_task("f2", "ctx", "submitted", 3), SaveOptions{kNoVersion, "", ""});
  REQUIRE_MESSAGE(heard_a.wait_for(Kind::saved, "f2", n1), describe(heard_a.all()));
  b->remove("f2", n1);
  REQUIRE_MESSAGE(heard_a.wait_for(Kind::deleted, "f2", n1), describe(heard_a.all()));
  const uint64_t n2 = b->save(make_task("f2", "ctx", "submitted", 4), SaveOptions{kNoVersion, "", ""});  // revived: numbering goes on
  REQUIRE_MESSAGE(heard_a.wait_for(Kind::saved, "f2", n2), describe(heard_a.all()));
  CHECK(n2 == n1 + 1);
  const Task f3 = make_task("f3", "ctx", "working", 5), f4 = make_task("f4", "ctx", "working", 6);
  const std::vector<uint64_t> batch = b->save_batch({BatchItem{&f3, {}}, BatchItem{&f4, {}}});
  REQUIRE(batch.size() == 2);
  REQUIRE_MESSAGE(heard_a.wait_for(Kind::saved, "f3", batch[0]), describe(heard_a.all()));
  REQUIRE_MESSAGE(heard_a.wait_for(Kind::saved, "f4", batch[1]), describe(heard_a.all()));

  // A write by hand (or by any other client of the table) is heard too:
  // the trigger sends the notice, not the plugin.
  admin.exec("DELETE FROM " + t + " WHERE id = 'f4'");
  REQUIRE_MESSAGE(heard_a.wait_for(Kind::deleted, "f4", batch[1]), describe(heard_a.all()));

  // The other table's store hears its own save and nothing of t's:
  // notifications reach a listener in commit order, so once its own save
  // is heard, anything of t would have come before it.
  const uint64_t w = c->save(make_task("g1", "ctx", "working", 7));
  REQUIRE_MESSAGE(heard_c.wait_for(Kind::saved, "g1", w), describe(heard_c.all()));
  const auto on_c = heard_c.all();
  CHECK_MESSAGE(on_c.size() == 1, describe(on_c));
  CHECK(heard_c.gaps() == 0);
  CHECK(heard_a.gaps() == 0);

  // A read-only open has no feed (the SDK refuses watch; the host polls).
  OpenOptions ro;
  ro.read_only = true;
  auto r = open_store(t, "", ro);
  CHECK(r->watch_changes([](const StoreChange &) {}) == nullptr);

  // The last listener leaving stops nothing (the host keeps the feed until
  // close); close ends the listening connection.
  sub_a.reset();
  a->close();
  for (int i = 0; i < 100 && !listener_pids(admin, t).empty(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  CHECK(listener_pids(admin, t).empty());
}

TEST_CASE("change feed: an id too long for a NOTIFY payload is saved and reported as a gap") {
  const std::string t = unique("feed_long");
  auto a = open_store(t), b = open_store(t);
  Heard heard;
  auto sub = a->watch_changes(heard.listener());
  REQUIRE(sub != nullptr);
  // 9000 bytes: beyond NOTIFY's 8000-byte payload, within what the table's
  // indexes take (PostgreSQL compresses such a key).
  const std::string id = "long-" + std::string(9000, 'x');
  const uint64_t v = b->save(make_task(id, "ctx", "working", 1));
  CHECK(v == 1);
  CHECK(a->get(id)->version == v);
  REQUIRE_MESSAGE(heard.wait_for(Kind::gap, "", 0), describe(heard.all()));
  // The feed goes on: a short id after it is heard as usual.
  const uint64_t s = b->save(make_task("short", "ctx", "working", 2));
  REQUIRE_MESSAGE(heard.wait_for(Kind::saved, "short", s), describe(heard.all()));
  b->remove(id);
  CHECK(heard.wait_for(Kind::gap, "", 0));
  CHECK_FALSE(a->get(id).has_value());
}

TEST_CASE("change feed: the listening connection terminated: the feed reconnects, reports a gap, nothing is lost") {
  const std::string t = unique("feed_drop");
  auto a = open_store(t), b = open_store(t);
  Heard heard;
  auto sub = a->watch_changes(heard.listener());
  REQUIRE(sub != nullptr);
  const uint64_t v0 = b->save(make_task("d0", "ctx", "working", 1));
  REQUIRE_MESSAGE(heard.wait_for(Kind::saved, "d0", v0), describe(heard.all()));

  Admin admin;
  const auto before = listener_pids(admin, t);
  REQUIRE(before.size() == 1);
  CHECK(admin.scalar("SELECT pg_terminate_backend(" + before[0] + ")") == "t");
  // Saved while the listener is down or reconnecting: its notice may be
  // lost with the connection, so the feed owes a gap.
  const uint64_t v1 = b->save(make_task("d1", "ctx", "working", 2));
  REQUIRE_MESSAGE(heard.wait_for(Kind::gap, "", 0), describe(heard.all()));
  // The subscriber re-reads on the gap and finds what it may have missed.
  REQUIRE(a->get("d1").has_value());
  CHECK(a->get("d1")->version == v1);

  // Listening again on a new connection: later saves are heard.
  const uint64_t v2 = b->save(make_task("d2", "ctx", "working", 3));
  REQUIRE_MESSAGE(heard.wait_for(Kind::saved, "d2", v2), describe(heard.all()));
  const auto after = listener_pids(admin, t);
  REQUIRE(after.size() == 1);
  CHECK(after[0] != before[0]);
}

TEST_CASE("change feed: a listening connection that stops answering (its backend stopped) is replaced: gap, nothing lost") {
  // TCP keepalives never fire while the peer's kernel answers for a backend
  // (or a proxy) that stopped delivering; the listener's ping must find it.
  const std::string t = unique("feed_stall");
  auto a = open_store(t), b = open_store(t);
  Heard heard;
  auto sub = a->watch_changes(heard.listener());
  REQUIRE(sub != nullptr);
  const uint64_t v0 = b->save(make_task("s0", "ctx", "working", 1));
  REQUIRE_MESSAGE(heard.wait_for(Kind::saved, "s0", v0), describe(heard.all()));
  Admin admin;
  const auto before = listener_pids(admin, t);
  REQUIRE(before.size() == 1);
  const pid_t backend = static_cast<pid_t>(std::stol(before[0]));
  REQUIRE(::kill(backend, SIGSTOP) == 0);
  const uint64_t v1 = b->save(make_task("s1", "ctx", "working", 2));
  // A ping every 5 s, answered within 5 s: a liveness bound, not a goal.
  const bool gap = heard.wait_for(Kind::gap, "", 0, std::chrono::milliseconds(30000)).has_value();
  ::kill(backend, SIGCONT);
  REQUIRE_MESSAGE(gap, describe(heard.all()));
  CHECK(a->get("s1")->version == v1);  // what the host re-reads on the gap
  const uint64_t v2 = b->save(make_task("s2", "ctx", "working", 3));
  REQUIRE_MESSAGE(heard.wait_for(Kind::saved, "s2", v2), describe(heard.all()));
}

TEST_CASE("change feed: latency from a save on one replica to the other's feed (reported, not asserted)") {
  const std::string t = unique("feed_lat");
  auto a = open_store(t), b = open_store(t);
  Heard heard;
  auto sub = a->watch_changes(heard.listener());
  REQUIRE(sub != nullptr);
  constexpr int kSaves = 1000;
  std::vector<double> to_sink_ms, save_ms;
  for (int i = 0; i < kSaves; ++i) {
    const auto t0 = clock_type::now();
    const uint64_t v = b->save(make_task("lat", "ctx", "working", 1 + i));
    const auto t1 = clock_type::now();
    const auto heard_at = heard.wait_for(Kind::saved, "lat", v);
    REQUIRE_MESSAGE(heard_at, "save " << i << " (version " << v << ") not heard within 10 s");
    to_sink_ms.push_back(std::chrono::duration<double, std::milli>(*heard_at - t0).count());
    save_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  auto pct = [](std::vector<double> v, double p) {
    std::sort(v.begin(), v.end());
    return v[static_cast<size_t>(p * static_cast<double>(v.size() - 1))];
  };
  MESSAGE("change feed latency over " << kSaves << " saves on B heard by A (ms, from the start of the save):"
                                      << " p50 " << pct(to_sink_ms, 0.5) << ", p99 " << pct(to_sink_ms, 0.99)
                                      << ", max " << pct(to_sink_ms, 1.0) << "; the save itself p50 "
                                      << pct(save_ms, 0.5) << ", p99 " << pct(save_ms, 0.99));
  CHECK(pct(to_sink_ms, 1.0) < 2000.0);  // a generous liveness bound, not a speed goal
}

TEST_CASE("change feed: a server's idle_session_timeout does not end the listening session") {
  Admin admin;
  if (std::stoi(admin.scalar("SHOW server_version_num")) < 140000) return;  // no such setting before 14
  const std::string t = unique("feed_idle");
  // Every session of A, its pool's and its listener's, asks for a 100 ms
  // idle timeout (as a server or role setting would impose it).
  auto a = open_store(t, "options=-cidle_session_timeout%3D100"), b = open_store(t);
  Heard heard;
  auto sub = a->watch_changes(heard.listener());
  REQUIRE(sub != nullptr);
  const auto pids = listener_pids(admin, t);
  REQUIRE(pids.size() == 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(600));  // six timeouts' worth of idling
  const uint64_t v = b->save(make_task("i1", "ctx", "working", 1));
  REQUIRE_MESSAGE(heard.wait_for(Kind::saved, "i1", v), describe(heard.all()));
  CHECK_MESSAGE(heard.gaps() == 0, describe(heard.all()));
  CHECK(listener_pids(admin, t) == pids);
}

TEST_CASE("change feed: a role that may write the table but not add its trigger opens it without a feed") {
  Admin admin;
  const std::string t = unique("feed_role"), role = unique("tnx_feed_role");
  open_store(t)->close();  // created by its owner, with the trigger
  // As a table of an older plugin: no trigger.
  admin.exec("DROP TRIGGER \"" + t + "$notify\" ON " + t + "; DROP FUNCTION \"" + t + "$notify\"()");
  admin.exec("CREATE ROLE " + role + " LOGIN");
  admin.exec("GRANT SELECT, INSERT, UPDATE, DELETE ON " + t + ", \"" + t + "$counts\", toolnexus_schema TO " + role);
  admin.exec("GRANT CREATE ON SCHEMA public TO " + role);  // it may create the function, not the trigger
  const std::string uri = "postgresql://" + role + "@" + pgtest::host_port(pgtest::base_uri()) +
                          "/postgres?sslmode=disable&tnx_table=" + t;
  const std::string has_trigger = "SELECT count(*) FROM pg_trigger WHERE tgname = $1";
  {
    auto s = resolve_store(uri);
    CHECK((s->info().capabilities & TNX_CAP_CHANGE_FEED) == 0);
    CHECK(s->watch_changes([](const StoreChange &) {}) == nullptr);  // the host polls
    CHECK(s->save(make_task("p1", "ctx", "working", 1)) == 1);
    CHECK(admin.scalar(has_trigger, {t + "$notify"}) == "0");
    CHECK(admin.scalar("SELECT count(*) FROM pg_proc WHERE proname = $1", {t + "$notify"}) == "0");
  }
  // The owner's next open adds the trigger; the role's stores have a feed.
  auto owner = open_store(t);
  CHECK(admin.scalar(has_trigger, {t + "$notify"}) == "1");
  {
    auto s = resolve_store(uri);
    CHECK((s->info().capabilities & TNX_CAP_CHANGE_FEED) != 0);
    Heard heard;
    auto sub = s->watch_changes(heard.listener());
    REQUIRE(sub != nullptr);
    const uint64_t v = owner->save(make_task("p1", "ctx", "completed", 2));
    CHECK(v == 2);
    CHECK_MESSAGE(heard.wait_for(Kind::saved, "p1", v), describe(heard.all()));
  }
  owner->close();
  admin.exec("DROP TABLE " + t + ", \"" + t + "$counts\"; DELETE FROM toolnexus_schema WHERE table_name = '" + t + "'");
  admin.exec("DROP OWNED BY " + role + "; DROP ROLE " + role);
}

// tests/postgres/postgres_plugin_test.cpp: the postgres plugin through
// toolnexus::resolve_store, against the throwaway cluster of
// tests/postgres/pg_cluster.sh (CTest fixture "postgres"; the URI file is
// named by $TNX_PG_URI_FILE). The scene (old schemas, row locks, bulk data) is
// set with a plain libpq connection.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "pg_test_util.hpp"

#include "../../plugins/postgres/pg_sql.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

using namespace toolnexus;
using pgtest::Admin;
using pgtest::expect_invalid;
using pgtest::expect_status;
using pgtest::make_task;
using pgtest::open_store;
using pgtest::unique;
using pgtest::with;

namespace {

constexpr const char *kSecret = "Wr0ng-Secret-Pw";

std::vector<std::string> ids_of(const std::vector<TaskRecord> &v) {
  std::vector<std::string> out;
  for (const auto &r : v) out.push_back(r.id);
  return out;
}

/// Every record of `q`, page by page; checks each page's size and counts pages.
std::vector<TaskRecord> list_all(TaskStore &s, ListQuery q, int &pages) {
  std::vector<TaskRecord> out;
  pages = 0;
  for (;;) {
    ListPage p = s.list(q);
    REQUIRE(p.records.size() <= q.page_size);
    ++pages;
    for (auto &r : p.records) out.push_back(std::move(r));
    if (p.next_cursor.empty()) break;
    REQUIRE(p.records.size() == q.page_size);  // a cursor only after a full page
    REQUIRE(pages < 10000);
    q.cursor = p.next_cursor;
  }
  return out;
}

/// Waits until all `n` threads arrived, then lets them go at once.
class Barrier {
 public:
  explicit Barrier(int n) : left_(n) {}
  void arrive_and_wait() {
    std::unique_lock<std::mutex> l(mu_);
    if (--left_ == 0) {
      cv_.notify_all();
    } else {
      cv_.wait(l, [&] { return left_ == 0; });
    }
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int left_;
};

}  // namespace

TEST_CASE("options: tnx_ parameters are the plugin's, the rest goes to libpq") {
  const std::string t = unique("opt");
  // tnx_ options anywhere in the query, one percent-encoded; libpq's own
  // parameters pass through (libpq would refuse a tnx_ one).
  auto s = resolve_store(with(pgtest::base_uri(),
                              "tnx_pool=%32&application_name=tnx_opt_probe&tnx_statement_timeout_ms=1500&tnx_table=" + t));
  CHECK(s->info().scheme == "postgresql");
  CHECK(s->info().capabilities == (TNX_CAP_THREAD_SAFE | TNX_CAP_PAGINATED_LIST | TNX_CAP_COMPARE_AND_SET |
                                   TNX_CAP_DURABLE | TNX_CAP_MULTI_PROCESS | TNX_CAP_PERSISTENT |
                                   TNX_CAP_CHANGE_FEED | TNX_CAP_DUE_INDEX));
  CHECK(s->save(make_task("o1", "c", "working", 1)) == 1);
  Admin admin;
  CHECK(admin.scalar("SELECT version FROM toolnexus_schema WHERE table_name = $1", {t}) == "3");
  CHECK(admin.scalar("SELECT task_json FROM " + t + " WHERE id = 'o1'") == make_task("o1", "c", "working", 1).to_json());
  CHECK(std::stoi(admin.scalar("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'tnx_opt_probe'")) >= 1);

  // tnx_statement_timeout_ms is the server's statement_timeout: a save
  // waiting for a row lock held elsewhere is cancelled after 1.5 s.
  admin.exec("BEGIN");
  admin.exec("SELECT 1 FROM " + t + " WHERE id = 'o1' FOR UPDATE");
  auto t0 = std::chrono::steady_clock::now();
  std::string msg = expect_status(Status::io, [&] { s->save(make_task("o1", "c", "completed", 2)); });
  double took = pgtest::since(t0);
  CHECK(took >= 1.3);
  CHECK(took < 4.0);
  CHECK(msg.find("statement timeout of 1500 ms") != std::string::npos);
  admin.exec("ROLLBACK");
  CHECK(s->get("o1")->state == "working");  // the cancelled save changed nothing
  CHECK(s->save(make_task("o1", "c", "completed", 2)) == 2);

  // Bad plugin options: TNX_EINVAL (std::invalid_argument from
  // resolve_store) naming the option, before any connection is made.
  const std::string base = pgtest::base_uri();
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"tnx_bogus=1", "tnx_bogus"},
      {"tnx_pool=0", "tnx_pool"},
      {"tnx_pool=65", "tnx_pool"},
      {"tnx_pool=abc", "tnx_pool"},
      {"tnx_pool=", "tnx_pool"},
      {"tnx_pool=-1", "tnx_pool"},
      {"tnx_pool", "tnx_pool"},
      {"tnx_pool=1&tnx_pool=2", "given twice"},
      {"tnx_statement_timeout_ms=-5", "tnx_statement_timeout_ms"},
      {"tnx_statement_timeout_ms=3600001", "tnx_statement_timeout_ms"},
      {"tnx_statement_timeout_ms=99999999999", "tnx_statement_timeout_ms"},
      {"tnx_table=Tasks", "tnx_table"},
      {"tnx_table=1tasks", "tnx_table"},
      {"tnx_table=a-b", "tnx_table"},
      {"tnx_table=a%22b", "tnx_table"},
      {"tnx_table=" + std::string(49, 'a'), "tnx_table"},
      {"tnx_table=", "tnx_table"},
      {"tnx_pool=%4", "percent"},
      {"no_such_libpq_param=1", "invalid URI query parameter"},
  };
  for (const auto &[params, needle] : bad) {
    INFO("params: " << params);
    auto t1 = std::chrono::steady_clock::now();
    std::string m = expect_invalid([&] { resolve_store(with(base, params)); });
    INFO("message: " << m);
    CHECK(m.find(needle) != std::string::npos);
    CHECK(pgtest::since(t1) < 1.0);
  }
  // Not a URI at all.
  CHECK(expect_invalid([] { resolve_store("postgres:dbname=x"); }).find("postgresql://") != std::string::npos);
  CHECK(expect_invalid([] { resolve_store("postgresql:"); }).find("postgresql://") != std::string::npos);
  // The longest table name accepted works.
  const std::string longest = "l" + std::to_string(::getpid()) + std::string(48, 'x');
  CHECK_NOTHROW(open_store(longest.substr(0, 48)));
}

TEST_CASE("passwords never appear in error messages") {
  const std::string hp = pgtest::host_port(pgtest::base_uri());
  auto no_secret = [](const std::string &msg, const std::vector<std::string> &secrets) {
    INFO("message: " << msg);
    for (const auto &s : secrets) CHECK(msg.find(s) == std::string::npos);
  };

  // A closed port: libpq's "connection refused" names host and port only.
  auto t0 = std::chrono::steady_clock::now();
  std::string m = expect_status(Status::io, [&] {
    resolve_store(std::string("postgresql://tnx_pw_user:") + kSecret + "@127.0.0.1:1/postgres?sslmode=disable");
  });
  CHECK(pgtest::since(t0) < 3.0);
  CHECK(m.find("127.0.0.1") != std::string::npos);
  CHECK(m.find("tnx_pw_user") != std::string::npos);
  no_secret(m, {kSecret, "Wr0ng"});

  // The server refuses the password (scram-sha-256 for tnx_pw_user).
  m = expect_status(Status::io, [&] {
    resolve_store(std::string("postgresql://tnx_pw_user:") + kSecret + "@" + hp + "/postgres?sslmode=disable");
  });
  CHECK(m.find("password authentication failed") != std::string::npos);
  no_secret(m, {kSecret});

  // Percent-encoded password: neither the raw nor the decoded text shows.
  m = expect_status(Status::io, [&] {
    resolve_store("postgresql://tnx_pw_user:Wr0ng%2DSecret%40Pw@" + hp + "/postgres?sslmode=disable");
  });
  no_secret(m, {"Wr0ng%2DSecret%40Pw", "Wr0ng-Secret@Pw", "Secret"});

  // The password as a query parameter.
  m = expect_status(Status::io, [&] {
    resolve_store("postgresql://" + hp + "/postgres?sslmode=disable&user=tnx_pw_user&password=" + kSecret);
  });
  no_secret(m, {kSecret});

  // A malformed password: libpq quotes the bad token in its message; the
  // plugin scrubs it.
  m = expect_invalid([&] { resolve_store("postgresql://tnx_pw_user:Se%ZZcret-Pw@" + hp + "/postgres"); });
  no_secret(m, {"Se%ZZcret-Pw", "ZZcret"});
  m = expect_invalid([&] { resolve_store("postgresql://" + hp + "/postgres?password=Se%ZZcret-Pw&user=x"); });
  no_secret(m, {"Se%ZZcret-Pw", "ZZcret"});

  // A bad plugin option next to a password.
  m = expect_invalid([&] {
    resolve_store(std::string("postgresql://tnx_pw_user:") + kSecret + "@" + hp + "/postgres?tnx_pool=zero");
  });
  CHECK(m.find("tnx_pool") != std::string::npos);
  no_secret(m, {kSecret});

  // PGPASSWORD, wrong then right; the right one in the URI too.
  const std::string t = unique("pw");
  ::setenv("PGPASSWORD", "Wr0ng-Env-Secret", 1);
  m = expect_status(Status::io, [&] {
    resolve_store("postgresql://tnx_pw_user@" + hp + "/postgres?sslmode=disable&tnx_table=" + t);
  });
  no_secret(m, {"Wr0ng-Env-Secret"});
  ::setenv("PGPASSWORD", "tnx-Secret-pw-4711", 1);
  {
    auto s = resolve_store("postgresql://tnx_pw_user@" + hp + "/postgres?sslmode=disable&tnx_table=" + t);
    CHECK(s->save(make_task("pw1", "c", "working", 1)) == 1);
  }
  ::unsetenv("PGPASSWORD");
  auto s = resolve_store("postgresql://tnx_pw_user:tnx-Secret-pw-4711@" + hp + "/postgres?sslmode=disable&tnx_table=" + t);
  CHECK(s->get("pw1")->version == 1);
  // Its table went to the role's own schema (first in search_path).
  Admin admin;
  CHECK(admin.scalar("SELECT count(*) FROM pg_tables WHERE schemaname = 'tnx_pw_user' AND tablename = $1", {t}) == "1");
}

TEST_CASE("schema version 1 is migrated to 2 in place") {
  const std::string t = unique("mig");
  const pg::Sql sql(t);
  Admin admin;
  admin.exec(pg::Sql::create_meta());
  for (const auto &s : sql.create_v1()) admin.exec(s);
  admin.query("INSERT INTO toolnexus_schema (table_name, version) VALUES ($1, 1)", {t});
  // Rows as version 1 stored them: NULL for "no timestamp".
  const std::string ins = "INSERT INTO " + t +
                          " (id, context_id, state, status_time_us, owner, tenant, task_json, version)"
                          " VALUES ($1, $2, $3, $4, $5, $6, $7, $8)";
  auto add = [&](const std::string &id, const std::string &ctx, const std::string &state, int64_t sec,
                 const std::string &owner, const std::string &tenant, const std::string &version) {
    std::vector<std::string> p = {id, ctx, state, std::to_string(pgtest::time_of(sec)), owner, tenant,
                                  make_task(id, ctx, state, sec).to_json(), version};
    if (sec == 0)
      admin.query("INSERT INTO " + t +
                      " (id, context_id, state, status_time_us, owner, tenant, task_json, version)"
                      " VALUES ($1, $2, $3, NULL, $4, $5, $6, $7)",
                  {id, ctx, state, owner, tenant, p[6], version});
    else
      admin.query(ins, p);
  };
  add("a", "c1", "working", 1000, "alice", "t1", "3");
  add("b", "c1", "completed", 0, "", "", "1");
  add("c", "c2", "working", 2000, "bob", "t2", "7");
  add("d", "c1", "working", 1000, "bob", "t1", "1");

  auto s = open_store(t);
  CHECK(admin.scalar("SELECT version FROM toolnexus_schema WHERE table_name = $1", {t}) == "3");
  CHECK(admin.scalar("SELECT is_nullable FROM information_schema.columns WHERE table_name = $1 AND column_name = "
                     "'status_time_us'",
                     {t}) == "NO");
  CHECK(admin.scalar("SELECT collation_name FROM information_schema.columns WHERE table_name = $1 AND column_name = "
                     "'context_id'",
                     {t}) == "C");
  CHECK(admin.scalar("SELECT count(*) FROM pg_indexes WHERE tablename = $1 AND indexname = $2", {t, t + "_time"}) == "0");
  // The five list indexes and the due index (ABI 1.5).
  CHECK(admin.scalar("SELECT count(*) FROM pg_indexes WHERE tablename = $1 AND indexname LIKE $2", {t, t + "_by_%"}) == "6");

  auto b = s->get("b");
  REQUIRE(b.has_value());
  CHECK(b->status_time_us == kNoTime);
  CHECK(b->version == 1);
  CHECK(b->json == make_task("b", "c1", "completed", 0).to_json());
  auto a = s->get("a");
  REQUIRE(a.has_value());
  CHECK(a->version == 3);
  CHECK(a->owner == "alice");
  CHECK(a->tenant == "t1");
  CHECK(a->status_time_us == pgtest::time_of(1000));
  int pages = 0;
  CHECK(ids_of(list_all(*s, ListQuery{}, pages)) == std::vector<std::string>{"c", "a", "d", "b"});
  ListQuery q;
  q.context_id = "c1";
  q.page_size = 1;
  CHECK(ids_of(list_all(*s, q, pages)) == std::vector<std::string>{"a", "d", "b"});
  CHECK(pages == 3);

  // Versions continue from the migrated rows, also across delete/re-create.
  SaveOptions cas;
  cas.expected_version = 3;
  CHECK(s->save(make_task("a", "c1", "completed", 3000), cas) == 4);
  s->remove("b");
  SaveOptions create;
  create.expected_version = kNoVersion;
  CHECK(s->save(make_task("b", "c1", "submitted", 5), create) == 2);

  // Opening again finds version 2: nothing to do.
  auto s2 = open_store(t);
  CHECK(s2->get("a")->version == 4);
}

TEST_CASE("schema 3: counters follow saves, deletes and writes by hand; a version 2 table is migrated") {
  Admin admin;
  const std::string t = unique("counts");
  auto s = open_store(t);
  for (int i = 0; i < 24; ++i) {
    SaveOptions o;
    o.owner = i % 3 ? "alice" : "bob";
    o.tenant = i % 4 ? "" : "acme";
    s->save(make_task("k" + std::to_string(i), "c" + std::to_string(i % 2), i % 2 ? "working" : "completed", 10 + i), o);
  }
  s->save(make_task("k0", "c5", "failed", 99));  // moves between counter rows
  s->remove("k1");
  s->remove("k2");
  s->save(make_task("k2", "c1", "submitted", 7));  // a deleted row revived
  auto check_counts = [&](TaskStore &st) {
    std::vector<ListQuery> qs(6);
    qs[1].owner = "alice";
    qs[1].tenant = "";
    qs[2].state = "working";
    qs[3].owner = "bob";
    qs[3].tenant = "acme";
    qs[3].state = "completed";
    qs[4].context_id = "c1";
    qs[5].after_us = pgtest::time_of(20);
    qs[5].owner = "alice";
    for (const auto &q : qs) {
      int pages = 0;
      CHECK(st.count(q) == list_all(st, q, pages).size());
    }
  };
  check_counts(*s);
  admin.exec("UPDATE " + t + " SET state = 'canceled' WHERE id = 'k4'");
  check_counts(*s);
  CHECK(admin.scalar("SELECT sum(n) FROM \"" + t + "$counts\"") == "23");
  // Back to version 2 (no counters): read-only it is read as it is, and a
  // read-write open migrates it, filling the counters from the live rows.
  admin.exec("DROP TRIGGER \"" + t + "$count\" ON " + t);
  admin.exec("DROP FUNCTION \"" + t + "$count\"()");
  admin.exec("DROP TABLE \"" + t + "$counts\"");
  admin.query("UPDATE toolnexus_schema SET version = 2 WHERE table_name = $1", {t});
  OpenOptions ro;
  ro.read_only = true;
  auto r = open_store(t, "", ro);
  check_counts(*r);
  CHECK(admin.scalar("SELECT version FROM toolnexus_schema WHERE table_name = $1", {t}) == "2");
  auto w = open_store(t);
  check_counts(*w);
  CHECK(admin.scalar("SELECT version FROM toolnexus_schema WHERE table_name = $1", {t}) == "3");
  CHECK(admin.scalar("SELECT sum(n) FROM \"" + t + "$counts\"") == "23");
}

TEST_CASE("due index (ABI 1.5): a version 3 table without it gains it at a read-write open, read-only it is refused") {
  Admin admin;
  const std::string t = unique("due");
  open_store(t)->save(make_task("old", "c", "working", 1));
  // As a table of a plugin before 1.5: no due column, no due index; a row
  // saved by it.
  admin.exec("DROP INDEX \"" + t + "_by_due_id\"");
  admin.exec("ALTER TABLE " + t + " DROP COLUMN due_us");
  const std::string has_column =
      "SELECT count(*) FROM information_schema.columns WHERE table_name = $1 AND column_name = 'due_us'";
  ListQuery due;
  due.due_before_us = pgtest::time_of(1000);
  {
    OpenOptions ro;
    ro.read_only = true;
    auto r = open_store(t, "", ro);
    CHECK((r->info().capabilities & TNX_CAP_DUE_INDEX) == 0);
    REQUIRE(r->get("old").has_value());
    CHECK(r->get("old")->due_us == kNoTime);
    CHECK(r->list(ListQuery{}).records.size() == 1);
    expect_status(Status::unsupported, [&] { r->list(due); });
    expect_status(Status::unsupported, [&] { r->count(due); });
    CHECK(admin.scalar(has_column, {t}) == "0");  // nothing added read-only
  }
  auto w = open_store(t);
  CHECK((w->info().capabilities & TNX_CAP_DUE_INDEX) != 0);
  CHECK(admin.scalar(has_column, {t}) == "1");
  CHECK(admin.scalar("SELECT count(*) FROM pg_class WHERE relname = $1", {t + "_by_due_id"}) == "1");
  CHECK(w->get("old")->due_us == kNoTime);
  for (int i = 0; i < 4; ++i) {
    SaveOptions o;
    o.due_us = pgtest::time_of(103 - i);
    w->save(make_task("d" + std::to_string(i), "c", "working", 10 - i), o);
  }
  CHECK(w->get("d2")->due_us == pgtest::time_of(101));
  due.due_before_us = pgtest::time_of(103);
  std::vector<std::string> ids;
  for (const auto &rec : w->list(due).records) ids.push_back(rec.id);
  CHECK(ids == std::vector<std::string>{"d3", "d2", "d1"});  // earliest due first (not newest status)
  due.page_size = 1;
  ids.clear();
  for (;;) {
    ListPage p = w->list(due);
    for (const auto &rec : p.records) ids.push_back(rec.id);
    if (p.next_cursor.empty()) break;
    due.cursor = p.next_cursor;
  }
  CHECK(ids == std::vector<std::string>{"d3", "d2", "d1"});  // the same, a page at a time
  due = ListQuery{};
  due.due_before_us = pgtest::time_of(103);
  CHECK(w->count(due) == 3);
  // A delete takes it out of the index (the emptied row has no due time).
  w->remove("d1");
  CHECK(admin.scalar("SELECT due_us IS NULL FROM " + t + " WHERE id = 'd1'") == "t");
  CHECK(w->count(due) == 2);
  // A re-save without a due time clears it.
  w->save(make_task("d2", "c", "completed", 11));
  CHECK(w->get("d2")->due_us == kNoTime);
  CHECK(w->count(due) == 1);

  // The (due_us) index of earlier 1.5 builds is replaced by the (due_us, id)
  // one at a read-write open.
  admin.exec("DROP INDEX \"" + t + "_by_due_id\"");
  admin.exec("CREATE INDEX \"" + t + "_by_due\" ON " + t + " (due_us) WHERE due_us IS NOT NULL");
  w->close();
  w = open_store(t);
  CHECK((w->info().capabilities & TNX_CAP_DUE_INDEX) != 0);
  CHECK(admin.scalar("SELECT count(*) FROM pg_class WHERE relname = $1", {t + "_by_due"}) == "0");
  CHECK(admin.scalar("SELECT count(*) FROM pg_class WHERE relname = $1", {t + "_by_due_id"}) == "1");
  CHECK(w->count(due) == 1);

  // A role that may write the table but not alter it opens a table without
  // the due index as it is, without the capability.
  admin.exec("DROP INDEX \"" + t + "_by_due_id\"");
  admin.exec("ALTER TABLE " + t + " DROP COLUMN due_us");
  const std::string role = unique("tnx_due_role");
  admin.exec("CREATE ROLE " + role + " LOGIN");
  admin.exec("GRANT SELECT, INSERT, UPDATE, DELETE ON " + t + ", \"" + t + "$counts\", toolnexus_schema TO " + role);
  admin.exec("GRANT CREATE ON SCHEMA public TO " + role);  // not the table's owner: it may not alter it
  auto r = resolve_store("postgresql://" + role + "@" + pgtest::host_port(pgtest::base_uri()) +
                         "/postgres?sslmode=disable&tnx_table=" + t);
  CHECK((r->info().capabilities & TNX_CAP_DUE_INDEX) == 0);
  CHECK(r->save(make_task("r1", "c", "working", 20)) == 1);
  expect_status(Status::unsupported, [&] { r->list(due); });
  CHECK(admin.scalar(has_column, {t}) == "0");

  // A transaction reading the table holds the owner's ALTER TABLE off: the
  // open waits at most tnx_statement_timeout_ms for it (not forever, while
  // every other statement on the table would queue behind it), then opens
  // without the due index; the next open adds it.
  Admin reader;
  reader.exec("BEGIN; LOCK TABLE " + t + " IN ACCESS SHARE MODE");
  auto waited = open_store(t, "tnx_statement_timeout_ms=300");
  CHECK((waited->info().capabilities & TNX_CAP_DUE_INDEX) == 0);
  CHECK(waited->get("r1").has_value());
  reader.exec("COMMIT");
  CHECK((open_store(t)->info().capabilities & TNX_CAP_DUE_INDEX) != 0);
  CHECK(admin.scalar(has_column, {t}) == "1");
}

TEST_CASE("a newer schema is refused; a table that is not ours is refused") {
  Admin admin;
  admin.exec(pg::Sql::create_meta());
  const std::string newer = unique("newer");
  for (const auto &s : pg::Sql(newer).create_v2()) admin.exec(s);
  admin.query("INSERT INTO toolnexus_schema (table_name, version) VALUES ($1, 4)", {newer});
  std::string m = expect_status(Status::unsupported, [&] { open_store(newer); });
  CHECK(m.find("schema version 4") != std::string::npos);
  CHECK(m.find(newer) != std::string::npos);
  CHECK(m.find("upgrade") != std::string::npos);
  CHECK(admin.scalar("SELECT version FROM toolnexus_schema WHERE table_name = $1", {newer}) == "4");  // untouched

  const std::string foreign = unique("foreign");
  admin.exec("CREATE TABLE " + foreign + " (x integer)");
  m = expect_status(Status::corrupt, [&] { open_store(foreign); });
  CHECK(m.find("not a toolnexus task table") != std::string::npos);
  CHECK(admin.scalar("SELECT count(*) FROM information_schema.columns WHERE table_name = $1", {foreign}) == "1");

  const std::string missing = unique("missing");
  admin.query("INSERT INTO toolnexus_schema (table_name, version) VALUES ($1, 2)", {missing});
  m = expect_status(Status::corrupt, [&] { open_store(missing); });
  CHECK(m.find("does not exist") != std::string::npos);
}

TEST_CASE("read-only open (TNX_OPEN_READ_ONLY) creates no table and refuses writes") {
  Admin admin;
  const std::string table = unique("ro");
  const std::string uri = with(pgtest::base_uri(), "tnx_table=" + table);
  OpenOptions ro;
  ro.read_only = true;
  std::string m = expect_status(Status::not_found, [&] { resolve_store(uri, ro); });
  CHECK_MESSAGE(m.find(table) != std::string::npos, m);
  CHECK_MESSAGE(m.find("not created") != std::string::npos, m);
  CHECK(admin.scalar("SELECT count(*) FROM pg_catalog.pg_class WHERE relname = $1", {table}) == "0");

  open_store(table)->save(make_task("t1", "c1", "working", 5));
  auto s = resolve_store(uri, ro);
  CHECK(s->info().read_only);
  REQUIRE(s->get("t1").has_value());
  CHECK(s->get("t1")->context_id == "c1");
  CHECK(s->list(ListQuery{}).records.size() == 1);
  expect_status(Status::unsupported, [&] { s->save(make_task("t2", "c1", "working", 6)); });
  expect_status(Status::unsupported, [&] { s->remove("t1"); });
  CHECK(admin.scalar("SELECT count(*) FROM " + table) == "1");

  // A table at an older schema is not migrated by a read-only open.
  const std::string old = unique("ro_old");
  admin.exec(pg::Sql::create_meta());
  for (const auto &q : pg::Sql(old).create_v2()) admin.exec(q);
  admin.query("INSERT INTO toolnexus_schema (table_name, version) VALUES ($1, 1)", {old});
  m = expect_status(Status::unsupported, [&] { resolve_store(with(pgtest::base_uri(), "tnx_table=" + old), ro); });
  CHECK_MESSAGE(m.find("schema version 1") != std::string::npos, m);
  CHECK(admin.scalar("SELECT version FROM toolnexus_schema WHERE table_name = $1", {old}) == "1");
}

TEST_CASE("replicas: 8 threads open stores on one fresh table at the same moment") {
  Admin admin;
  for (int round = 0; round < 3; ++round) {
    // A fresh schema each round, so that the version table is created
    // concurrently too (options=-csearch_path=... goes through to libpq).
    const std::string schema = unique("rs");
    admin.exec("CREATE SCHEMA " + schema);
    const std::string t = "tasks";
    const std::string uri = with(pgtest::base_uri(), "options=-csearch_path%3D" + schema + "&tnx_table=" + t);
    const int n = 8;
    Barrier go(n);
    std::vector<std::shared_ptr<TaskStore>> stores(n);
    std::vector<std::string> errors(n);
    std::vector<std::thread> threads;
    for (int i = 0; i < n; ++i)
      threads.emplace_back([&, i] {
        go.arrive_and_wait();
        try {
          stores[i] = resolve_store(uri);
        } catch (const std::exception &e) {
          errors[i] = e.what();
        }
      });
    for (auto &th : threads) th.join();
    for (int i = 0; i < n; ++i) {
      INFO("round " << round << " store " << i << ": " << errors[i]);
      CHECK(errors[i].empty());
      REQUIRE(stores[i] != nullptr);
    }
    CHECK(admin.scalar("SELECT version FROM " + schema + ".toolnexus_schema WHERE table_name = 'tasks'") == "3");
    // The primary key, five list indexes, the due index.
    CHECK(admin.scalar("SELECT count(*) FROM pg_indexes WHERE schemaname = $1 AND tablename = 'tasks'", {schema}) == "7");
    // They are one store: a save through one is seen through all.
    CHECK(stores[0]->save(make_task("r", "c", "working", 1)) == 1);
    for (int i = 1; i < n; ++i) CHECK(stores[i]->get("r")->version == 1);
    CHECK(stores[n - 1]->save(make_task("r", "c", "completed", 2)) == 2);
    CHECK(stores[0]->get("r")->state == "completed");
  }
}

TEST_CASE("compare-and-set across two stores loses no update; versions persist") {
  const std::string t = unique("cas");
  auto a = open_store(t, "tnx_pool=3");
  auto b = open_store(t, "tnx_pool=3");
  REQUIRE(a->save(make_task("counter", "c", "working", 1, ",\"metadata\":{\"n\":0}")) == 1);
  const int threads = 8, increments = 25;
  std::atomic<int> conflicts{0};
  std::mutex err_mu;
  std::vector<std::string> errors;
  std::vector<std::thread> ts;
  for (int i = 0; i < threads; ++i)
    ts.emplace_back([&, i] {
      TaskStore &s = i % 2 == 0 ? *a : *b;
      try {
        for (int k = 0; k < increments; ++k) {
          for (int attempt = 0;; ++attempt) {
            auto r = s.get("counter");
            Task task = r->task();
            task.json()["metadata"]["n"].SetInt(task.json()["metadata"]["n"].GetInt() + 1);
            SaveOptions o;
            o.expected_version = r->version;
            try {
              uint64_t v = s.save(task, o);
              if (v != r->version + 1) throw std::runtime_error("CAS save gave version " + std::to_string(v));
              break;
            } catch (const StoreError &e) {
              if (e.code() != Status::conflict || attempt > 10000) throw;
              ++conflicts;
            }
          }
        }
      } catch (const std::exception &e) {
        std::lock_guard<std::mutex> l(err_mu);
        errors.push_back(e.what());
      }
    });
  for (auto &th : ts) th.join();
  CHECK(errors.empty());
  for (const auto &e : errors) INFO(e);
  auto r = a->get("counter");
  CHECK(r->task().json()["metadata"]["n"].GetInt() == threads * increments);
  CHECK(r->version == static_cast<uint64_t>(threads * increments + 1));
  MESSAGE("CAS conflicts retried: " << conflicts.load());

  // Versions are stored: a new store (a restarted process) continues them.
  a->close();
  b->close();
  auto c = open_store(t);
  CHECK(c->get("counter")->version == 201);
  SaveOptions stale;
  stale.expected_version = 200;
  expect_status(Status::conflict, [&] { c->save(make_task("counter", "c", "failed", 9), stale); });
  CHECK(c->save(make_task("counter", "c", "completed", 2)) == 202);
  // Delete and re-create: the id's numbering goes on (no ABA).
  expect_status(Status::conflict, [&] { c->remove("counter", 201); });
  c->remove("counter", 202);
  CHECK_FALSE(c->get("counter").has_value());
  expect_status(Status::not_found, [&] { c->remove("counter"); });
  SaveOptions old;
  old.expected_version = 202;
  expect_status(Status::conflict, [&] { c->save(make_task("counter", "c", "working", 3), old); });
  CHECK_FALSE(c->get("counter").has_value());
  CHECK(c->save(make_task("counter", "c", "working", 3)) == 203);
}

TEST_CASE("keyset paging over many pages, with filters, across changes") {
  const std::string t = unique("page");
  auto s = open_store(t);
  struct Row {
    std::string id, ctx, state, owner, tenant;
    int64_t time;
  };
  std::vector<Row> rows;
  for (int i = 0; i < 150; ++i) {
    char id[8];
    std::snprintf(id, sizeof id, "k%03d", (i * 73) % 150);  // not in insertion order
    Row r{id, std::string(1, "ABC"[i % 3]), i % 2 ? "working" : "completed", i % 4 == 0 ? "alice" : "bob",
          i % 5 == 0 ? "t1" : "t2", i % 10 == 0 ? 0 : 1000 + (i % 37)};  // many ties, some without time
    SaveOptions o;
    o.owner = r.owner;
    o.tenant = r.tenant;
    s->save(make_task(r.id, r.ctx, r.state, r.time), o);
    r.time = pgtest::time_of(r.time);
    rows.push_back(r);
  }
  // Bytewise id order among equal times: 'B' < 'a' < "Ä" (C3 84) < "é" (C3 A9).
  for (const char *id : {"\xc3\xa9", "a", "\xc3\x84", "B"}) {
    SaveOptions o;
    o.owner = "bob";
    o.tenant = "t2";
    s->save(make_task(id, "Z", "working", 5000), o);
    rows.push_back(Row{id, "Z", "working", "bob", "t2", pgtest::time_of(5000)});
  }
  auto expected = [&](const ListQuery &q) {
    std::vector<Row> m;
    for (const auto &r : rows) {
      if (q.context_id && r.ctx != *q.context_id) continue;
      if (q.state && r.state != *q.state) continue;
      if (q.owner && r.owner != *q.owner) continue;
      if (q.tenant && r.tenant != *q.tenant) continue;
      if (q.after_us && !(r.time > *q.after_us)) continue;
      if (q.before_us && !(r.time < *q.before_us)) continue;
      m.push_back(r);
    }
    std::sort(m.begin(), m.end(), [](const Row &x, const Row &y) {
      return x.time != y.time ? x.time > y.time : x.id < y.id;
    });
    std::vector<std::string> ids;
    for (const auto &r : m) ids.push_back(r.id);
    return ids;
  };
  std::vector<ListQuery> queries(7);
  queries[1].context_id = "A";
  queries[2].state = "working";
  queries[2].owner = "bob";
  queries[3].tenant = "t1";
  queries[3].after_us = pgtest::time_of(1010);
  queries[4].context_id = "B";
  queries[4].before_us = pgtest::time_of(1020);
  queries[5].context_id = "A";
  queries[5].state = "working";
  queries[5].owner = "bob";
  queries[5].tenant = "t2";
  queries[5].after_us = pgtest::time_of(1000);
  queries[5].before_us = pgtest::time_of(1036);
  queries[6].context_id = "Z";
  for (size_t qi = 0; qi < queries.size(); ++qi) {
    for (uint32_t size : {1u, 7u, 50u, 1000u}) {
      ListQuery q = queries[qi];
      q.page_size = size;
      const auto want = expected(q);
      INFO("query " << qi << " page size " << size << " want " << want.size());
      int pages = 0;
      const auto got = list_all(*s, q, pages);
      CHECK(ids_of(got) == want);
      CHECK(pages == std::max<int>(1, static_cast<int>((want.size() + size - 1) / size)));
    }
  }
  CHECK(expected(queries[6]) == std::vector<std::string>{"B", "a", "\xc3\x84", "\xc3\xa9"});
  CHECK(ids_of(s->list(queries[6]).records) == std::vector<std::string>{"B", "a", "\xc3\x84", "\xc3\xa9"});

  // A cursor is a keyset: deleting records already seen and adding one that
  // sorts before the cursor shifts nothing; one added after it is seen.
  ListQuery q;
  q.context_id = "A";
  q.page_size = 10;
  ListPage first = s->list(q);
  REQUIRE(first.records.size() == 10);
  REQUIRE_FALSE(first.next_cursor.empty());
  const TaskRecord &last = first.records.back();
  for (int i = 0; i < 3; ++i) {
    s->remove(first.records[static_cast<size_t>(i)].id);
    rows.erase(std::find_if(rows.begin(), rows.end(), [&](const Row &r) { return r.id == first.records[static_cast<size_t>(i)].id; }));
  }
  SaveOptions o;
  o.owner = "bob";
  o.tenant = "t2";
  s->save(make_task("new-first", "A", "working", 9000), o);
  rows.push_back(Row{"new-first", "A", "working", "bob", "t2", pgtest::time_of(9000)});
  s->save(make_task("new-last", "A", "working", 0), o);
  rows.push_back(Row{"new-last", "A", "working", "bob", "t2", kNoTime});
  auto all = expected(q);
  auto pos = std::find(all.begin(), all.end(), last.id);
  REQUIRE(pos != all.end());
  std::vector<std::string> rest_want(pos + 1, all.end());
  CHECK(rest_want.back() == "new-last");
  q.cursor = first.next_cursor;
  int pages = 0;
  CHECK(ids_of(list_all(*s, q, pages)) == rest_want);

  // omit_json: index fields only; the JSON otherwise.
  ListQuery oq;
  oq.context_id = "Z";
  oq.omit_json = true;
  auto page = s->list(oq);
  REQUIRE(page.records.size() == 4);
  CHECK(page.records[0].json.empty());
  CHECK(page.records[0].owner == "bob");
  CHECK(page.records[0].version == 1);
  oq.omit_json = false;
  CHECK(s->list(oq).records[0].json == make_task("B", "Z", "working", 5000).to_json());

  // Malformed cursors.
  for (const char *bad : {"x", "12", "12.zz", "1.abc", ".61"}) {
    ListQuery bq;
    bq.cursor = bad;
    INFO("cursor " << bad);
    expect_status(Status::invalid_argument, [&] { s->list(bq); });
  }
}

TEST_CASE("every list shape is an index scan: no sequential scan, no sort of a large set") {
  const std::string t = unique("plan");
  open_store(t);  // creates the table and its indexes
  Admin admin;
  admin.exec("INSERT INTO " + t +
             " (id, context_id, state, status_time_us, owner, tenant, task_json, version)"
             " SELECT 'id' || g, CASE WHEN g % 4 = 0 THEN 'big' ELSE 'ctx' || (g % 500) END, (ARRAY['submitted','working','completed','failed',"
             "'canceled','rejected','input-required','auth-required','unknown'])[1 + g % 9],"
             " CASE WHEN g % 97 = 0 THEN '-9223372036854775808'::bigint ELSE g::bigint * 1000000 END,"
             " 'owner' || (g % 50), 'tenant' || (g % 10), '{}', 1 FROM generate_series(1, 20000) g");
  admin.exec("UPDATE " + t + " SET deleted = true WHERE id LIKE 'id1%7'");
  admin.exec("ANALYZE " + t);
  const pg::Sql sql(t);
  // Values matching many rows (5000, 2222, 400, 2000): the cases where a
  // sort would cost. The due filter (ABI 1.5) matches none here (no row
  // has a due time): its index holds the rows due only.
  const std::vector<std::string> filter_values = {"big", "working", "owner3", "tenant1", "5000000000",
                                                  "15000000000", "9000000000000000"};
  int shapes = 0;
  for (int generic = 0; generic < 2; ++generic) {
    admin.exec(generic ? "SET plan_cache_mode = force_generic_plan" : "SET plan_cache_mode = auto");
    for (uint32_t filters = 0; filters <= pg::kAllFilters; ++filters) {
      for (int cursor = 0; cursor < 2; ++cursor) {
        std::vector<std::string> params;
        for (uint32_t b = 0; b < 7; ++b)
          if (filters & (1u << b)) params.push_back(filter_values[b]);
        if (cursor) {
          params.push_back("9000000000");
          params.push_back("id9000");
        }
        params.push_back("51");
        REQUIRE(static_cast<int>(params.size()) == pg::Sql::list_param_count(filters, cursor != 0));
        const std::string q = sql.list(filters, cursor != 0, false);
        std::string plan;
        if (!generic) {
          for (const auto &row : admin.query("EXPLAIN " + q, params)) plan += row[0] + "\n";
        } else {
          // What a prepared statement may settle on after 5 runs.
          admin.exec("DEALLOCATE ALL");
          PGresult *r = PQprepare(admin.raw(), "p", q.c_str(), 0, nullptr);
          REQUIRE(PQresultStatus(r) == PGRES_COMMAND_OK);
          PQclear(r);
          std::string args;
          for (const auto &p : params) args += (args.empty() ? "'" : ", '") + p + "'";
          for (const auto &row : admin.query("EXPLAIN EXECUTE p(" + args + ")")) plan += row[0] + "\n";
        }
        const std::string kind = generic ? "generic" : "custom";
        INFO("filters " << filters << " cursor " << cursor << " " << kind << " plan:\n" << plan);
        CHECK(plan.find("Index") != std::string::npos);
        CHECK(plan.find("Seq Scan") == std::string::npos);
        // The index delivers the list order; where the index conditions
        // leave few rows (several filters, or a cursor deep in the list) the
        // planner may prefer a bitmap scan and sort those: only a small set
        // (a sort of all 5000 "big" rows would show here).
        const size_t sort = plan.find("Sort  (");
        if (sort != std::string::npos) {
          const size_t rows_at = plan.find("rows=", sort);
          REQUIRE(rows_at != std::string::npos);
          CHECK(std::strtol(plan.c_str() + rows_at + 5, nullptr, 10) <= 1000);
        }
        ++shapes;
      }
    }
  }
  CHECK(shapes == 512);
}

TEST_CASE("a bulk save_batch leaves fresh planner statistics: ListTasks is an index scan at once") {
  // Without statistics (a table filled by an import, before autovacuum came
  // by) the planner took the tenant index and sorted every row: 27 ms
  // instead of 0.4 ms for a page at 50,000 Tasks.
  const std::string t = unique("bulk");
  auto store = open_store(t);
  Admin admin;
  admin.exec("ALTER TABLE " + t + " SET (autovacuum_enabled = false)");  // only the plugin analyzes here
  const std::string estimate = "SELECT reltuples::bigint FROM pg_class WHERE oid = to_regclass($1)";
  auto save = [&](int from, int n) {
    std::vector<toolnexus::Task> tasks;
    for (int i = from; i < from + n; ++i) tasks.push_back(make_task("b" + std::to_string(i), "ctx" + std::to_string(i % 7), "completed", i + 1));
    std::vector<toolnexus::BatchItem> items;
    for (const auto &task : tasks) items.push_back(toolnexus::BatchItem{&task, {}});
    store->save_batch(items);
  };
  save(0, 999);  // below the threshold: no ANALYZE
  CHECK(admin.scalar(estimate, {t}) == "-1");
  save(1000, 11000);  // a bulk load: analyzed when it commits
  CHECK(admin.scalar(estimate, {t}) == "11999");
  std::string plan;
  for (const auto &row : admin.query("EXPLAIN " + pg::Sql(t).list(pg::kByOwner | pg::kByTenant, false, false),
                                     {"", "", "51"}))
    plan += row[0] + "\n";
  INFO(plan);
  CHECK(plan.find("Index Scan using " + t + "_by_time") != std::string::npos);
  CHECK(plan.find("Sort") == std::string::npos);
  // A batch that is at most a tenth of the table analyzes nothing more
  // (another ANALYZE would make the estimate 12999).
  save(20000, 1000);
  CHECK(admin.scalar(estimate, {t}) == "11999");
  toolnexus::ListQuery q;
  q.page_size = 50;
  CHECK(store->list(q).records.size() == 50);
  CHECK(store->count(q) == 12999);
}

TEST_CASE("save_stream (ABI 1.5): one transaction however long; a conflict or the source's stop saves nothing") {
  const std::string t = unique("stream");
  auto store = open_store(t);
  REQUIRE(store->save(make_task("s3000", "c", "completed", 1)) == 1);
  // A stream of 5,000 whose Task 3000 exists: named by its index, nothing saved.
  auto stream = [](int n, int throw_at) {
    auto task = std::make_shared<toolnexus::Task>();
    auto item = std::make_shared<toolnexus::BatchItem>();
    auto i = std::make_shared<int>(0);
    return [=]() -> const toolnexus::BatchItem * {
      if (*i == n) return nullptr;
      if (*i == throw_at) throw std::runtime_error("the input ended in a bad line");
      *task = make_task("s" + std::to_string(*i), "c", "completed", *i + 1);
      item->task = task.get();
      item->options.expected_version = toolnexus::kNoVersion;
      ++*i;
      return item.get();
    };
  };
  try {
    store->save_stream(stream(5000, -1), true);
    FAIL("a stream with an existing Task was saved");
  } catch (const toolnexus::BatchError &e) {
    CHECK(e.code() == Status::conflict);
    CHECK(e.index() == 3000);
  }
  CHECK(store->count(toolnexus::ListQuery{}) == 1);
  // The source stops it: its exception passes, nothing saved.
  CHECK_THROWS_WITH_AS(store->save_stream(stream(5000, 2500), true), "the input ended in a bad line",
                       std::runtime_error);
  CHECK(store->count(toolnexus::ListQuery{}) == 1);
  store->remove("s3000");
  CHECK(store->save_stream(stream(5000, -1), true) == 5000);
  CHECK(store->count(toolnexus::ListQuery{}) == 5000);
  // Without one transaction the plugin says it does not stream; the host
  // saves one by one, and what came before a failure stays.
  try {
    store->save_stream(stream(5000, -1), false);
    FAIL("a stream of existing Tasks was saved");
  } catch (const toolnexus::BatchError &e) {
    CHECK(e.code() == Status::conflict);
    CHECK(e.index() == 0);
  }
}

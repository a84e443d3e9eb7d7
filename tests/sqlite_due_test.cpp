// tests/sqlite_due_test.cpp: the sqlite plugin's due index (ABI 1.5,
// tnx_task_record.due_us, TNX_FILTER_DUE_BEFORE, TNX_CAP_DUE_INDEX) on
// databases made before it: a read-write open adds the column and its
// index, a read-only open reads the file as it is and refuses due lists.
// The rule itself (order, paging, filters) is the conformance kit's
// due-index rule; this program drives the plugin through its C ABI only
// (sqlite_harness.hpp).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "sqlite_harness.hpp"

#include <string>
#include <vector>

namespace {

constexpr int64_t kBase = 1'900'000'000'000'000;  // µs, 2030-03-17

/// A Task record due at `due` (TNX_TIME_NONE: nothing due).
Rec due_task(const std::string &id, int64_t time, int64_t due) {
  Rec r = task(id, time);
  r.due = due;
  return r;
}

/// A due list (TNX_FILTER_DUE_BEFORE) before `bound`, and `flags` more.
Query due_before(int64_t bound, uint32_t flags = 0) {
  Query q;
  q.flags = TNX_FILTER_DUE_BEFORE | flags;
  q.due_before = bound;
  return q;
}

/// Makes `db` what a plugin before ABI 1.5 left: schema 3 (user_version 3)
/// without the due column and its index, with rows saved by that plugin.
void make_pre_due_database(const std::string &db) {
  {
    Store s;
    must_open(s, db);
    must_save(s, task("old-1", 100));
    must_save(s, task("old-2", 200));
  }
  RawDb raw(db);
  raw.exec("DROP INDEX tnx_tasks_by_due_id; ALTER TABLE tnx_tasks DROP COLUMN due_us");
  REQUIRE(raw.value("PRAGMA user_version") == "3");
  REQUIRE(raw.value("SELECT count(*) FROM pragma_table_info('tnx_tasks') WHERE name = 'due_us'") == "0");
  // What an older plugin's INSERT looks like (explicit columns).
  raw.exec("INSERT INTO tnx_tasks (id, context_id, state, status_time_us, owner, tenant, version, task_json)"
           " VALUES ('old-3', 'ctx', 'working', 300, '', '', 1, '{\"id\":\"old-3\"}')");
}

}  // namespace

TEST_CASE("a schema 3 database without the due column: read-only it is read as it is, due lists refused") {
  TempDir dir;
  const std::string db = dir / "old.db";
  make_pre_due_database(db);
  Store ro;
  uint64_t caps = Plugin::get().d->capabilities;
  REQUIRE((caps & TNX_CAP_DUE_INDEX) != 0);
  Res o = ro.open(db, TNX_OPEN_READ_ONLY, &caps);
  REQUIRE_MESSAGE(o.st == TNX_OK, o.err);
  CHECK((caps & TNX_CAP_DUE_INDEX) == 0);
  CHECK(must_get(ro, "old-1").due == TNX_TIME_NONE);
  CHECK(ids(ro.list_all(Query{})) == std::vector<std::string>{"old-3", "old-2", "old-1"});
  Page p = ro.list(due_before(kBase));
  CHECK(p.res.st == TNX_EUNSUPPORTED);
  CHECK_MESSAGE(contains(p.res.err, "due"), p.res.err);
  CHECK(p.recs.empty());
  CHECK(ro.count(due_before(kBase)).st == TNX_EUNSUPPORTED);
  ro.close();
  // mode=ro alike.
  caps = Plugin::get().d->capabilities;
  REQUIRE(ro.open(db + "?mode=ro", 0, &caps).st == TNX_OK);
  CHECK((caps & TNX_CAP_DUE_INDEX) == 0);
  CHECK(ro.list(due_before(kBase)).res.st == TNX_EUNSUPPORTED);
  ro.close();
  RawDb raw(db);
  CHECK(raw.value("SELECT count(*) FROM pragma_table_info('tnx_tasks') WHERE name = 'due_us'") == "0");
}

TEST_CASE("a schema 3 database without the due column gains it at a read-write open; due lists work") {
  TempDir dir;
  const std::string db = dir / "old.db";
  make_pre_due_database(db);
  Store s;
  uint64_t caps = Plugin::get().d->capabilities;
  Res o = s.open(db, 0, &caps);
  REQUIRE_MESSAGE(o.st == TNX_OK, o.err);
  CHECK((caps & TNX_CAP_DUE_INDEX) != 0);
  {
    RawDb raw(db);
    CHECK(raw.value("PRAGMA user_version") == "3");  // an addition, no version change
    CHECK(raw.value("SELECT type FROM pragma_table_info('tnx_tasks') WHERE name = 'due_us'") == "INTEGER");
    CHECK(raw.value("SELECT sql FROM sqlite_master WHERE name = 'tnx_tasks_by_due_id'") ==
          "CREATE INDEX tnx_tasks_by_due_id ON tnx_tasks (due_us, id) WHERE due_us IS NOT NULL");
    CHECK(raw.value("SELECT count(*) FROM sqlite_master WHERE name = 'tnx_tasks_by_due'") == "0");
    CHECK(raw.value("SELECT count(*) FROM tnx_tasks WHERE due_us IS NULL") == "3");
  }
  // The old rows have nothing due; new saves keep their due times.
  CHECK(must_get(s, "old-3").due == TNX_TIME_NONE);
  must_save(s, due_task("a", 10, kBase + 30));
  must_save(s, due_task("b", 20, kBase + 10));
  must_save(s, due_task("c", 30, TNX_TIME_NONE));
  CHECK(must_get(s, "a").due == kBase + 30);
  CHECK(must_get(s, "c").due == TNX_TIME_NONE);
  // An old row re-saved with a due time joins the list.
  must_save(s, due_task("old-1", 100, kBase + 20));
  // Due order: b +10, old-1 +20, a +30.
  CHECK(ids(s.list_all(due_before(kBase + 31))) == std::vector<std::string>{"b", "old-1", "a"});
  CHECK(s.list_all(due_before(kBase + 31))[2].due == kBase + 30);
  CHECK(ids(s.list_all(due_before(kBase + 30))) == std::vector<std::string>{"b", "old-1"});  // strictly before
  Res n = s.count(due_before(kBase + 31));
  REQUIRE_MESSAGE(n.st == TNX_OK, n.err);
  CHECK(n.version == 3);
  // Paging (one record a page) and another filter.
  Query q = due_before(kBase + 31);
  q.page = 1;
  int pages = 0;
  CHECK(ids(s.list_all(q, &pages)) == std::vector<std::string>{"b", "old-1", "a"});
  CHECK(pages == 3);
  Query by_time = due_before(kBase + 31, TNX_FILTER_AFTER);
  by_time.after = 15;
  CHECK(ids(s.list_all(by_time)) == std::vector<std::string>{"b", "old-1"});
  // save_batch writes due times too; a delete takes the row out.
  std::vector<uint64_t> versions;
  uint64_t failed = 0;
  Res b = s.save_batch({due_task("d", 40, kBase + 5), due_task("a", 10, TNX_TIME_NONE)},
                       {TNX_VERSION_ANY, TNX_VERSION_ANY}, &versions, &failed);
  REQUIRE_MESSAGE(b.st == TNX_OK, b.err);
  REQUIRE(s.del("b").st == TNX_OK);
  CHECK(ids(s.list_all(due_before(kBase + 31))) == std::vector<std::string>{"d", "old-1"});
  s.close();

  // A second read-write open finds everything in place; read-only now
  // offers the due index too.
  Store ro;
  caps = Plugin::get().d->capabilities;
  REQUIRE(ro.open(db, TNX_OPEN_READ_ONLY, &caps).st == TNX_OK);
  CHECK((caps & TNX_CAP_DUE_INDEX) != 0);
  CHECK(ids(ro.list_all(due_before(kBase + 31))) == std::vector<std::string>{"d", "old-1"});
}

TEST_CASE("a due list reads the due index, not the table: the query plan, and deliver_corrupt") {
  TempDir dir;
  const std::string db = dir / "plan.db";
  Store s;
  must_open(s, db);
  for (int i = 0; i < 200; ++i) must_save(s, due_task("t" + std::to_string(i), i, i % 50 ? TNX_TIME_NONE : kBase + i));
  CHECK(ids(s.list_all(due_before(kBase + 1000))) == std::vector<std::string>{"t0", "t50", "t100", "t150"});
  // The statement the plugin prepares for a due list (list_sql in
  // sqlite_plugin.cpp), with a cursor: a search of the partial index
  // (INDEXED BY would fail the prepare if it could not be used) read in
  // its order, (due_us, id): no sort.
  RawDb raw(db);
  const std::vector<std::string> plan = raw.rows(
      "EXPLAIN QUERY PLAN SELECT id, context_id, state, status_time_us, owner, tenant, version, task_json,"
      " rowid, due_us FROM tnx_tasks INDEXED BY tnx_tasks_by_due_id WHERE 1 AND due_us IS NOT NULL"
      " AND due_us < 5 AND typeof(due_us) = 'integer' AND due_us >= 7 AND (due_us > 7 OR id > 'x')"
      " ORDER BY due_us, id LIMIT 51");
  std::string text;
  for (const auto &row : plan) text += row + "\n";
  MESSAGE("EXPLAIN QUERY PLAN of a due list:\n" << text);
  // (SQLite 3.40: "SEARCH tnx_tasks USING INDEX tnx_tasks_by_due_id (due_us>? AND due_us<?)".)
  CHECK_MESSAGE(contains(text, "SEARCH tnx_tasks USING INDEX tnx_tasks_by_due_id ("), text);
  CHECK_MESSAGE(contains(text, "due_us<?)"), text);
  CHECK_MESSAGE(!contains(text, "SCAN tnx_tasks"), text);
  CHECK_MESSAGE(!contains(text, "TEMP B-TREE"), text);

  // deliver_corrupt: an undecodable row is delivered only when it is due.
  raw.exec("UPDATE tnx_tasks SET task_json = X'DEADBEEF' WHERE id IN ('t50', 't51')");
  Query q = due_before(kBase + 1000);
  q.deliver_corrupt = true;
  std::vector<Rec> all = s.list_all(q);
  REQUIRE(ids(all) == std::vector<std::string>{"t0", "t50", "t100", "t150"});
  CHECK(all[1].version == 0);
  CHECK(all[1].due == kBase + 50);
  CHECK(!all[1].problem.empty());
  // Paged one a page past the undecodable row (its cursor holds its place).
  q.page = 1;
  CHECK(ids(s.list_all(q)) == std::vector<std::string>{"t0", "t50", "t100", "t150"});
  // A due time that is not an integer (edited by hand) is no due time: the
  // Task itself stays readable (the host's full sweeps find it).
  raw.exec("UPDATE tnx_tasks SET due_us = 'soon' WHERE id = 't1'");
  Rec got;
  Res g = s.get("t1", &got);
  CHECK(g.st == TNX_OK);
  CHECK(got.due == TNX_TIME_NONE);
}

TEST_CASE("a database with the due index of earlier 1.5 builds (due_us only) gets the (due_us, id) one at a read-write open") {
  TempDir dir;
  const std::string db = dir / "dev15.db";
  {
    Store s;
    must_open(s, db);
    must_save(s, due_task("x", 10, kBase + 7));
    must_save(s, due_task("y", 20, kBase + 3));
  }
  {
    RawDb raw(db);
    raw.exec("DROP INDEX tnx_tasks_by_due_id;"
             " CREATE INDEX tnx_tasks_by_due ON tnx_tasks (due_us) WHERE due_us IS NOT NULL");
  }
  {
    // Read-only it is read as it is: without the (due_us, id) index no due list.
    Store ro;
    uint64_t caps = Plugin::get().d->capabilities;
    REQUIRE(ro.open(db, TNX_OPEN_READ_ONLY, &caps).st == TNX_OK);
    CHECK((caps & TNX_CAP_DUE_INDEX) == 0);
  }
  Store s;
  uint64_t caps = Plugin::get().d->capabilities;
  Res o = s.open(db, 0, &caps);
  REQUIRE_MESSAGE(o.st == TNX_OK, o.err);
  CHECK((caps & TNX_CAP_DUE_INDEX) != 0);
  RawDb raw(db);
  CHECK(raw.value("SELECT count(*) FROM sqlite_master WHERE name = 'tnx_tasks_by_due'") == "0");
  CHECK(raw.value("SELECT count(*) FROM sqlite_master WHERE name = 'tnx_tasks_by_due_id'") == "1");
  CHECK(ids(s.list_all(due_before(kBase + 100))) == std::vector<std::string>{"y", "x"});
}

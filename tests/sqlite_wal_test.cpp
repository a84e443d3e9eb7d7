// tests/sqlite_wal_test.cpp: a sqlite: database whose write-ahead log is
// missing is told from one closed cleanly (issue 19 item 8;
// plugins/sqlite/missing_wal.hpp).
//
// A copy of tasks.db alone, taken while a server runs, lacks every Task saved
// since the last checkpoint (those are in tasks.db-wal). The plugin leaves
// WAL mode when its last connection closes, so a file in WAL mode without a
// -wal is one whose -wal was lost: opening it is TNX_ECORRUPT naming both
// files, changes nothing, and missing_wal=accept opens it as it is.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "sqlite_support.hpp"

namespace {

std::string bytes_of(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

/// Header bytes 18 and 19 (https://sqlite.org/fileformat2.html 1.3): 2 = WAL.
int header_mode(const std::string &path) {
  const std::string b = bytes_of(path);
  REQUIRE(b.size() >= 100);
  CHECK(b[18] == b[19]);
  return b[18];
}

}  // namespace

TEST_CASE("a database copied without its -wal while a writer runs is refused, naming both files") {
  TempDir dir;
  const std::string db = dir / "tasks.db", copy = dir / "copy.db";
  Store s;
  must_open(s, db);
  must_save(s, task("acknowledged", 10));
  // The save is in the -wal only (no checkpoint yet): the copy lacks it.
  REQUIRE(fs::exists(db + "-wal"));
  REQUIRE(header_mode(db) == 2);
  fs::copy_file(db, copy);
  const std::string before = bytes_of(copy);

  for (uint32_t flags : {0u, uint32_t(TNX_OPEN_READ_ONLY)}) {
    CAPTURE(flags);
    Store c;
    Res o = c.open(copy, flags);
    CHECK(o.st == TNX_ECORRUPT);
    CHECK_MESSAGE(contains(o.err, "'" + copy + "' was left in WAL mode"), o.err);
    CHECK_MESSAGE(contains(o.err, "'" + copy + "-wal' is missing"), o.err);
    CHECK_MESSAGE(contains(o.err, "acknowledged Tasks may be missing"), o.err);
    CHECK_MESSAGE(contains(o.err, "missing_wal=accept"), o.err);
    // Refusing changed nothing and left nothing behind.
    CHECK(bytes_of(copy) == before);
    CHECK_FALSE(fs::exists(copy + "-wal"));
    CHECK_FALSE(fs::exists(copy + "-shm"));
  }

  SUBCASE("missing_wal=accept opens it as it is, and its next close makes it whole") {
    Store c;
    must_open(c, copy + "?missing_wal=accept");
    Rec r;
    CHECK(c.get("acknowledged", &r).st == TNX_ENOTFOUND);  // what the copy lost
    must_save(c, task("after", 20));
    CHECK(c.close().st == TNX_OK);
    CHECK(header_mode(copy) == 1);
    Store again;
    must_open(again, copy);
    CHECK(must_get(again, "after").time == 20);
  }
  SUBCASE("missing_wal takes refuse or accept, nothing else") {
    Store c;
    Res o = c.open(copy + "?missing_wal=yes");
    CHECK(o.st == TNX_EINVAL);
    CHECK_MESSAGE(contains(o.err, "refuse or accept"), o.err);
  }
  SUBCASE("putting the -wal back beside it opens every acknowledged Task") {
    fs::copy_file(db + "-wal", copy + "-wal");
    Store c;
    must_open(c, copy);
    CHECK(must_get(c, "acknowledged").time == 10);
  }
  CHECK(s.close().st == TNX_OK);
}

TEST_CASE("a database closed cleanly opens without complaint, copied alone or not") {
  TempDir dir;
  const std::string db = dir / "tasks.db", copy = dir / "copy.db";
  {
    Store s;
    must_open(s, db);
    for (int i = 0; i < 50; ++i) must_save(s, task("t" + std::to_string(i), 10 + i));
    CHECK(s.close().st == TNX_OK);
  }
  // The last close folded the -wal in and left WAL mode.
  CHECK_FALSE(fs::exists(db + "-wal"));
  CHECK(header_mode(db) == 1);
  fs::copy_file(db, copy);
  for (const std::string &path : {db, copy}) {
    for (uint32_t flags : {uint32_t(TNX_OPEN_READ_ONLY), 0u}) {
      CAPTURE(path);
      CAPTURE(flags);
      Store r;
      Res o = r.open(path, flags);
      REQUIRE_MESSAGE(o.st == TNX_OK, o.err);
      CHECK(r.list_all(Query{}).size() == 50);
    }
  }
}

TEST_CASE("whoever closes last, a clean stop never looks like a lost -wal") {
  TempDir dir;
  const std::string db = dir / "tasks.db";
  size_t saved = 0;
  SUBCASE("two stores on one file, the first opened closes first") {
    Store a, b;
    must_open(a, db);
    must_open(b, db);
    must_save(a, task("a", 1));
    must_save(b, task("b", 2));
    Rec r;
    REQUIRE(a.get("b", &r).st == TNX_OK);  // a's reader pool is open too
    CHECK(a.close().st == TNX_OK);
    CHECK(header_mode(db) == 2);  // b still has it open
    CHECK(b.close().st == TNX_OK);
    saved = 2;
  }
  SUBCASE("a read-only inspection that outlives the writer") {
    Store w, ro;
    must_open(w, db);
    must_save(w, task("a", 1));
    Res o = ro.open(db, TNX_OPEN_READ_ONLY);
    REQUIRE_MESSAGE(o.st == TNX_OK, o.err);
    CHECK(ro.list_all(Query{}).size() == 1);
    CHECK(w.close().st == TNX_OK);  // not last: stays in WAL mode with its -wal
    CHECK(ro.list_all(Query{}).size() == 1);
    CHECK(ro.close().st == TNX_OK);  // inspection folds nothing: the -wal stays
    CHECK(fs::exists(db + "-wal"));
    saved = 1;
  }
  SUBCASE("an inspection begun on a closed file, outliving a writer that came and went") {
    {
      Store w;
      must_open(w, db);
      must_save(w, task("a", 1));
    }
    REQUIRE(header_mode(db) == 1);
    Store ro;
    Res o = ro.open(db, TNX_OPEN_READ_ONLY);
    REQUIRE_MESSAGE(o.st == TNX_OK, o.err);
    {
      Store w;
      must_open(w, db);
      must_save(w, task("b", 2));
      CHECK(ro.list_all(Query{}).size() == 2);
    }
    CHECK(ro.close().st == TNX_OK);
    saved = 2;
  }
  // In every case the next open is clean and holds every save.
  Store s;
  must_open(s, db);
  CHECK(s.list_all(Query{}).size() == saved);
  CHECK(s.close().st == TNX_OK);
}

TEST_CASE("a file made before the rule (WAL mode, no -wal, no marker) opens, and gets the marker") {
  TempDir dir;
  const std::string db = dir / "old.db";
  {
    Store s;
    must_open(s, db);
    must_save(s, task("t", 1));
    CHECK(s.close().st == TNX_OK);
  }
  {
    // What an older toolnexus-sqlite left after a clean close.
    RawDb raw(db);
    raw.exec("DROP TABLE tnx_wal_guard");
    CHECK(raw.value("PRAGMA journal_mode = wal") == "wal");
  }
  REQUIRE(header_mode(db) == 2);
  REQUIRE_FALSE(fs::exists(db + "-wal"));
  Store s;
  must_open(s, db);
  CHECK(must_get(s, "t").time == 1);
  CHECK(s.close().st == TNX_OK);
  RawDb raw(db);
  CHECK(raw.value("SELECT count(*) FROM sqlite_master WHERE name = 'tnx_wal_guard'") == "1");
}

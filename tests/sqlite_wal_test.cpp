// tests/sqlite_wal_test.cpp: a sqlite: database whose write-ahead log is
// missing is told from one closed cleanly (issue 19 item 8;
// plugins/sqlite/missing_wal.hpp).
//
// A copy of tasks.db alone, taken while a server runs, lacks every Task saved
// since the last checkpoint (those are in tasks.db-wal). Every writer marks
// the file "open" (tnx_meta clean_close = 0, checkpointed into the file) and
// the last one to close marks it complete, so a file marked open with no -wal
// beside it, opened by nobody else, lost its -wal: opening it is
// TNX_ECORRUPT naming both files, changes nothing, and missing_wal=accept
// opens it as it is.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "sqlite_support.hpp"

namespace {

std::string bytes_of(const std::string &path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

}  // namespace

TEST_CASE("a database copied without its -wal while a writer runs is refused, naming both files") {
  TempDir dir;
  const std::string db = dir / "tasks.db", copy = dir / "copy.db";
  Store s;
  must_open(s, db);
  must_save(s, task("acknowledged", 10));
  // The save is in the -wal only (no checkpoint since): the copy lacks it.
  REQUIRE(fs::exists(db + "-wal"));
  fs::copy_file(db, copy);
  const std::string before = bytes_of(copy);

  for (uint32_t flags : {0u, uint32_t(TNX_OPEN_READ_ONLY)}) {
    CAPTURE(flags);
    Store c;
    Res o = c.open(copy, flags);
    CHECK(o.st == TNX_ECORRUPT);
    CHECK_MESSAGE(contains(o.err, "'" + copy + "' was not closed cleanly by its last writer"), o.err);
    CHECK_MESSAGE(contains(o.err, "'" + copy + "-wal' is missing"), o.err);
    CHECK_MESSAGE(contains(o.err, "acknowledged Tasks may be missing"), o.err);
    CHECK_MESSAGE(contains(o.err, "missing_wal=accept"), o.err);
    // Refusing changed nothing in the database and left no -wal behind.
    CHECK(bytes_of(copy) == before);
    CHECK_FALSE(fs::exists(copy + "-wal"));
  }

  SUBCASE("missing_wal=accept opens it as it is, and its clean close makes it whole") {
    Store c;
    must_open(c, copy + "?missing_wal=accept");
    Rec r;
    CHECK(c.get("acknowledged", &r).st == TNX_ENOTFOUND);  // what the copy lost
    must_save(c, task("after", 20));
    CHECK(c.close().st == TNX_OK);
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
  CHECK_FALSE(fs::exists(db + "-wal"));  // the last close folded it in
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
    CHECK(a.close().st == TNX_OK);
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
    CHECK(w.close().st == TNX_OK);
    CHECK(ro.list_all(Query{}).size() == 1);
    CHECK(ro.close().st == TNX_OK);
    saved = 1;
  }
  SUBCASE("another SQLite program closes it last") {
    Store w;
    must_open(w, db);
    must_save(w, task("a", 1));
    {
      RawDb raw(db);
      CHECK(raw.value("SELECT count(*) FROM tnx_tasks") == "1");
      CHECK(w.close().st == TNX_OK);
    }  // the raw connection closes last: SQLite folds the -wal in and deletes it
    saved = 1;
  }
  // In every case the next open is clean and holds every save (a read-only
  // inspection that closed last leaves the -wal as it found it).
  Store s;
  must_open(s, db);
  CHECK(s.list_all(Query{}).size() == saved);
  CHECK(s.close().st == TNX_OK);
}

TEST_CASE("a file made before the marker opens as before, and a crash keeps its -wal and recovers") {
  TempDir dir;
  SUBCASE("no tnx_meta: not checked") {
    const std::string db = dir / "old.db";
    {
      Store s;
      must_open(s, db);
      must_save(s, task("t", 1));
      CHECK(s.close().st == TNX_OK);
    }
    {
      RawDb raw(db);
      raw.exec("DROP TABLE tnx_meta");
    }
    Store s;
    must_open(s, db);
    CHECK(must_get(s, "t").time == 1);
  }
  SUBCASE("a writer killed with its saves in the -wal") {
    const std::string db = dir / "crashed.db";
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      Store s;
      if (s.open(db).st != TNX_OK) ::_exit(2);
      for (int i = 0; i < 3; ++i)
        if (s.save(task("t" + std::to_string(i), 10 + i)).st != TNX_OK) ::_exit(3);
      ::_exit(0);  // no close
    }
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    REQUIRE((WIFEXITED(status) && WEXITSTATUS(status) == 0));
    REQUIRE(fs::exists(db + "-wal"));
    Store s;
    must_open(s, db);
    CHECK(s.list_all(Query{}).size() == 3);
  }
}

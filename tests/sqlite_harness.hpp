// tests/sqlite_harness.hpp: drives the sqlite plugin through its C ABI only,
// for the sqlite test programs (one per feature).
//
// Loads $TOOLNEXUS_TEST_PLUGIN_DIR/libtnx_sqlite.so with dlopen, calls
// toolnexus_plugin_entry and drives the vtable directly: no dependency on
// core. Where a test must prepare a database by hand (an older schema, a
// corrupt row, a lock held by someone else) it uses libsqlite3's C API,
// loaded at run time with dlopen (SqliteApi, RawDb) so that a test program
// links nothing beyond what toolnexus_add_test gives every test.
//
// Include once per test program (its functions are not inline).
#pragma once

#include <doctest/doctest.h>

#include "toolnexus/task_store.h"

#include <sqlite3.h>  // types and constants; the functions come from dlopen

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace fs = std::filesystem;

// A named namespace: functions a program does not use draw no warning.
namespace sqlite_harness {

// ---------------------------------------------------------------------------
// The plugin
// ---------------------------------------------------------------------------

/// The loaded plugin (loaded once, never unloaded).
struct Plugin {
  tnx_plugin_entry_fn entry = nullptr;
  const tnx_plugin_descriptor *d = nullptr;
  const tnx_store_vtable *vt = nullptr;

  static const Plugin &get() {
    static const Plugin p;
    return p;
  }

 private:
  Plugin() {
    const char *dir = std::getenv("TOOLNEXUS_TEST_PLUGIN_DIR");
#ifdef TOOLNEXUS_TEST_PLUGIN_DIR
    if (dir == nullptr || *dir == '\0') dir = TOOLNEXUS_TEST_PLUGIN_DIR;
#endif
    if (dir == nullptr || *dir == '\0')
      throw std::runtime_error("TOOLNEXUS_TEST_PLUGIN_DIR is not set");
    const std::string path = std::string(dir) + "/libtnx_sqlite.so";
    void *h = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) throw std::runtime_error("dlopen " + path + ": " + ::dlerror());
    entry = reinterpret_cast<tnx_plugin_entry_fn>(::dlsym(h, TNX_PLUGIN_ENTRY_NAME));
    if (entry == nullptr) throw std::runtime_error(path + " has no " TNX_PLUGIN_ENTRY_NAME);
    tnx_host_info host{};
    host.header = tnx_header(sizeof host);
    host.host_name = "sqlite_store_test";
    host.host_version = "0";
    d = entry(&host);
    if (d == nullptr) throw std::runtime_error("entry returned NULL");
    vt = d->vtable;
  }
};

tnx_str S(const std::string &s) { return tnx_str{s.data(), s.size()}; }
std::string V(tnx_str s) { return s.len == 0 ? std::string() : std::string(s.data, s.len); }

/// An owned copy of a tnx_task_record.
struct Rec {
  std::string id, context_id, state, owner, tenant, json;
  int64_t time = TNX_TIME_NONE;
  uint64_t version = 0;
  std::string problem;  // ABI 1.2, deliver_corrupt only
  int64_t due = TNX_TIME_NONE;  // ABI 1.5

  bool operator==(const Rec &o) const {
    return std::tie(id, context_id, state, owner, tenant, json, time, version, problem, due) ==
           std::tie(o.id, o.context_id, o.state, o.owner, o.tenant, o.json, o.time, o.version, o.problem, o.due);
  }
};

doctest::String toString(const Rec &r) {
  std::string s = "{id=" + r.id + " ctx=" + r.context_id + " state=" + r.state +
                  " owner=" + r.owner + " tenant=" + r.tenant + " t=" + std::to_string(r.time) +
                  " due=" + std::to_string(r.due) + " v=" + std::to_string(r.version) +
                  " json=" + r.json.substr(0, 60) + "}";
  return doctest::String(s.c_str());
}

Rec from_abi(const tnx_task_record &r) {
  Rec x;
  x.id = V(r.id);
  x.context_id = V(r.context_id);
  x.state = V(r.state);
  x.owner = V(r.owner);
  x.tenant = V(r.tenant);
  x.json = V(r.task_json);
  x.time = r.status_time_us;
  x.version = r.version;
  if (TNX_HAS_FIELD(&r, tnx_task_record, problem)) x.problem = V(r.problem);
  if (TNX_HAS_FIELD(&r, tnx_task_record, due_us)) x.due = r.due_us;
  return x;
}

/// A Task record with a JSON body naming its id (and an optional payload).
Rec task(const std::string &id, int64_t time = 1000, const std::string &ctx = "ctx",
         const std::string &state = "working", const std::string &owner = "",
         const std::string &tenant = "", const std::string &extra = "") {
  Rec r;
  r.id = id;
  r.context_id = ctx;
  r.state = state;
  r.owner = owner;
  r.tenant = tenant;
  r.time = time;
  r.json = "{\"id\":\"" + id + "\",\"contextId\":\"" + ctx + "\",\"status\":{\"state\":\"" +
           state + "\"},\"kind\":\"task\"" + extra + "}";
  return r;
}

/// Result of one store call.
struct Res {
  tnx_status st = TNX_OK;
  std::string err;
  uint64_t version = 0;
};

/// A list query in owned form.
struct Query {
  uint32_t flags = 0;
  uint32_t page = 100;
  std::string ctx, state, owner, tenant, cursor;
  int64_t after = 0, before = 0;
  bool omit = false;
  bool deliver_corrupt = false;  // ABI 1.1
  int64_t due_before = 0;        // ABI 1.5, with TNX_FILTER_DUE_BEFORE
};

/// What a list call delivered.
struct Page {
  Res res;
  std::vector<Rec> recs;
  std::string cursor;
  int cursor_calls = 0;
  size_t stop_after = 0;  // 0: never stop
};

/// An open store, driven through the vtable.
class Store {
 public:
  Store() = default;
  Store(const Store &) = delete;
  Store &operator=(const Store &) = delete;
  ~Store() { close(); }

  /// Opens "sqlite:<location>" with TNX_OPEN_* `flags`; `caps` (may be
  /// NULL) is passed as the in/out capabilities; `args_size` below the
  /// current one plays an older host.
  Res open(const std::string &location, uint32_t flags = 0, uint64_t *caps = nullptr,
           uint32_t args_size = sizeof(tnx_open_args)) {
    close();
    const Plugin &p = Plugin::get();
    const std::string scheme = "sqlite", selector = "sqlite:" + location;
    tnx_open_args a{};
    a.header = tnx_header(args_size);
    a.scheme = S(scheme);
    a.location = S(location);
    a.selector = S(selector);
    a.flags = flags;
    a.capabilities = caps;
    char err[1024] = "";
    Res r;
    r.st = p.d->open(&a, &s_, err, sizeof err);
    r.err = err;
    if (r.st != TNX_OK) s_ = nullptr;
    return r;
  }

  bool is_open() const { return s_ != nullptr; }

  Res save(const Rec &rec, uint64_t expected = TNX_VERSION_ANY) {
    tnx_task_record x{};
    x.header = tnx_header(sizeof x);
    x.id = S(rec.id);
    x.context_id = S(rec.context_id);
    x.state = S(rec.state);
    x.status_time_us = rec.time;
    x.owner = S(rec.owner);
    x.tenant = S(rec.tenant);
    x.task_json = S(rec.json);
    x.due_us = rec.due;
    x.version = 12345;  // ignored on input
    char err[1024] = "";
    Res r;
    r.st = vt().save(s_, &x, expected, &r.version, err, sizeof err);
    r.err = err;
    return r;
  }

  Res get(const std::string &id, Rec *out) {
    struct Ctx {
      Rec *out;
      int calls;
    } ctx{out, 0};
    char err[1024] = "";
    Res r;
    r.st = vt().get(
        s_, S(id),
        [](void *c, const tnx_task_record *rec) -> int32_t {
          auto *x = static_cast<Ctx *>(c);
          if (x->out != nullptr) *x->out = from_abi(*rec);
          ++x->calls;
          return 0;
        },
        &ctx, err, sizeof err);
    r.err = err;
    if (r.st == TNX_OK) REQUIRE(ctx.calls == 1);
    else REQUIRE(ctx.calls == 0);
    return r;
  }

  Res del(const std::string &id, uint64_t expected = TNX_VERSION_ANY) {
    char err[1024] = "";
    Res r;
    r.st = vt().del(s_, S(id), expected, err, sizeof err);
    r.err = err;
    return r;
  }

  Page list(const Query &q, size_t stop_after = 0) {
    tnx_list_query x{};
    x.header = tnx_header(sizeof x);
    x.filter_flags = q.flags;
    x.page_size = q.page;
    x.context_id = S(q.ctx);
    x.state = S(q.state);
    x.owner = S(q.owner);
    x.tenant = S(q.tenant);
    x.after_us = q.after;
    x.before_us = q.before;
    x.cursor = S(q.cursor);
    x.omit_json = q.omit ? 1 : 0;
    x.deliver_corrupt = q.deliver_corrupt ? 1 : 0;
    x.due_before_us = q.due_before;
    Page p;
    p.stop_after = stop_after;
    char err[1024] = "";
    p.res.st = vt().list(
        s_, &x,
        [](void *c, const tnx_task_record *rec) -> int32_t {
          auto *pg = static_cast<Page *>(c);
          pg->recs.push_back(from_abi(*rec));
          return pg->stop_after != 0 && pg->recs.size() >= pg->stop_after ? 1 : 0;
        },
        [](void *c, tnx_str cursor) {
          auto *pg = static_cast<Page *>(c);
          pg->cursor = V(cursor);
          ++pg->cursor_calls;
        },
        &p, err, sizeof err);
    p.res.err = err;
    return p;
  }

  /// ABI 1.3 count of `q`'s filters; the count in res.version.
  Res count(const Query &q) {
    tnx_list_query x{};
    x.header = tnx_header(sizeof x);
    x.filter_flags = q.flags;
    x.page_size = q.page;
    x.context_id = S(q.ctx);
    x.state = S(q.state);
    x.owner = S(q.owner);
    x.tenant = S(q.tenant);
    x.after_us = q.after;
    x.before_us = q.before;
    x.due_before_us = q.due_before;
    char err[1024] = "";
    Res r;
    const bool has_count = vt().count != nullptr;
    REQUIRE(has_count);
    r.st = vt().count(s_, &x, &r.version, err, sizeof err);
    r.err = err;
    return r;
  }

  /// ABI 1.3 save_batch; versions out, failed index in `failed`.
  Res save_batch(const std::vector<Rec> &recs, const std::vector<uint64_t> &expected,
                 std::vector<uint64_t> *versions, uint64_t *failed) {
    std::vector<tnx_task_record> xs(recs.size());
    std::vector<const tnx_task_record *> ptrs;
    for (size_t i = 0; i < recs.size(); ++i) {
      tnx_task_record &x = xs[i];
      x.header = tnx_header(sizeof x);
      x.id = S(recs[i].id);
      x.context_id = S(recs[i].context_id);
      x.state = S(recs[i].state);
      x.status_time_us = recs[i].time;
      x.owner = S(recs[i].owner);
      x.tenant = S(recs[i].tenant);
      x.task_json = S(recs[i].json);
      x.due_us = recs[i].due;
      ptrs.push_back(&x);
    }
    versions->assign(recs.size(), 0);
    char err[1024] = "";
    Res r;
    const bool has_batch = vt().save_batch != nullptr;
    REQUIRE(has_batch);
    r.st = vt().save_batch(s_, ptrs.data(), expected.data(), recs.size(), versions->data(), failed, err,
                           sizeof err);
    r.err = err;
    return r;
  }

  /// Every page of `q` (q.page records each), concatenated.
  std::vector<Rec> list_all(Query q, int *pages = nullptr) {
    std::vector<Rec> all;
    int n = 0;
    for (;;) {
      Page p = list(q);
      REQUIRE_MESSAGE(p.res.st == TNX_OK, p.res.err);
      REQUIRE(p.cursor_calls <= 1);
      REQUIRE(p.recs.size() <= q.page);
      ++n;
      all.insert(all.end(), p.recs.begin(), p.recs.end());
      if (p.cursor_calls == 0) break;
      CHECK(p.recs.size() == q.page);  // a cursor only after a full page
      REQUIRE(p.cursor.size() <= 1024);
      q.cursor = p.cursor;
      REQUIRE(n < 10000);
    }
    if (pages != nullptr) *pages = n;
    return all;
  }

  /// ABI 1.4 watch: `sink` receives every change until unwatch/close.
  Res watch(tnx_change_sink sink, void *ctx) {
    char err[1024] = "";
    Res r;
    const bool has_watch = vt().watch != nullptr;
    REQUIRE(has_watch);
    r.st = vt().watch(s_, sink, ctx, err, sizeof err);
    r.err = err;
    return r;
  }
  Res unwatch() {
    char err[1024] = "";
    Res r;
    r.st = vt().unwatch(s_, err, sizeof err);
    r.err = err;
    return r;
  }

  Res close() {
    Res r;
    if (s_ == nullptr) return r;
    char err[1024] = "";
    r.st = vt().close(s_, err, sizeof err);
    r.err = err;
    s_ = nullptr;
    return r;
  }

  tnx_store *raw() const { return s_; }

 private:
  static const tnx_store_vtable &vt() { return *Plugin::get().vt; }
  tnx_store *s_ = nullptr;
};

/// Opens `location` or fails the test with the plugin's message.
void must_open(Store &s, const std::string &location) {
  Res r = s.open(location);
  REQUIRE_MESSAGE(r.st == TNX_OK, r.err);
}

/// Saves or fails the test; returns the new version.
uint64_t must_save(Store &s, const Rec &rec, uint64_t expected = TNX_VERSION_ANY) {
  Res r = s.save(rec, expected);
  REQUIRE_MESSAGE(r.st == TNX_OK, rec.id << ": " << r.err);
  return r.version;
}

Rec must_get(Store &s, const std::string &id) {
  Rec out;
  Res r = s.get(id, &out);
  REQUIRE_MESSAGE(r.st == TNX_OK, id << ": " << r.err);
  return out;
}

bool contains(const std::string &hay, const std::string &needle) {
  return hay.find(needle) != std::string::npos;
}

// ---------------------------------------------------------------------------
// Files and raw SQLite
// ---------------------------------------------------------------------------

/// A fresh temporary directory, removed with everything in it.
class TempDir {
 public:
  TempDir() {
    const char *base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base != nullptr && *base ? base : "/tmp") +
                       "/tnx-sqlite-test-XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (::mkdtemp(buf.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = buf.data();
  }
  ~TempDir() {
    std::error_code ec;
    fs::permissions(path_, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(path_, ec);
  }
  std::string operator/(const std::string &name) const { return path_ + "/" + name; }
  const std::string &path() const { return path_; }

 private:
  std::string path_;
};

/// The few libsqlite3 functions the tests use, loaded at run time.
struct SqliteApi {
  decltype(&sqlite3_open_v2) open_v2 = nullptr;
  decltype(&sqlite3_exec) exec = nullptr;
  decltype(&sqlite3_close) close = nullptr;
  decltype(&sqlite3_errmsg) errmsg = nullptr;
  decltype(&sqlite3_busy_timeout) busy_timeout = nullptr;
  decltype(&sqlite3_backup_init) backup_init = nullptr;
  decltype(&sqlite3_backup_step) backup_step = nullptr;
  decltype(&sqlite3_backup_finish) backup_finish = nullptr;

  static const SqliteApi &get() {
    static const SqliteApi api;
    return api;
  }

 private:
  SqliteApi() {
    void *h = ::dlopen("libsqlite3.so.0", RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) throw std::runtime_error(std::string("dlopen libsqlite3: ") + ::dlerror());
    load(h, open_v2, "sqlite3_open_v2");
    load(h, exec, "sqlite3_exec");
    load(h, close, "sqlite3_close");
    load(h, errmsg, "sqlite3_errmsg");
    load(h, busy_timeout, "sqlite3_busy_timeout");
    load(h, backup_init, "sqlite3_backup_init");
    load(h, backup_step, "sqlite3_backup_step");
    load(h, backup_finish, "sqlite3_backup_finish");
  }
  template <class F>
  static void load(void *h, F &f, const char *name) {
    f = reinterpret_cast<F>(::dlsym(h, name));
    if (f == nullptr) throw std::runtime_error(std::string("libsqlite3 lacks ") + name);
  }
};

/// A plain SQLite connection for preparing and inspecting databases.
class RawDb {
 public:
  explicit RawDb(const std::string &path) {
    const SqliteApi &api = SqliteApi::get();
    const int rc = api.open_v2(path.c_str(), &db_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE,
                               nullptr);
    REQUIRE_MESSAGE(rc == SQLITE_OK, "open " << path);
    api.busy_timeout(db_, 5000);
  }
  RawDb(const RawDb &) = delete;
  RawDb &operator=(const RawDb &) = delete;
  ~RawDb() { SqliteApi::get().close(db_); }

  /// Runs SQL; returns the SQLite result code (0 = OK).
  int try_exec(const std::string &sql) {
    return SqliteApi::get().exec(db_, sql.c_str(), nullptr, nullptr, nullptr);
  }
  void exec(const std::string &sql) {
    const int rc = try_exec(sql);
    REQUIRE_MESSAGE(rc == SQLITE_OK, sql << ": " << SqliteApi::get().errmsg(db_));
  }
  /// Rows of a query, each column as text ("NULL" for NULL), joined by '|'.
  std::vector<std::string> rows(const std::string &sql) {
    std::vector<std::string> out;
    const int rc = SqliteApi::get().exec(
        db_, sql.c_str(),
        [](void *ctx, int n, char **vals, char **) -> int {
          std::string row;
          for (int i = 0; i < n; ++i) {
            if (i) row += "|";
            row += vals[i] != nullptr ? vals[i] : "NULL";
          }
          static_cast<std::vector<std::string> *>(ctx)->push_back(row);
          return 0;
        },
        &out, nullptr);
    REQUIRE_MESSAGE(rc == SQLITE_OK, sql << ": " << SqliteApi::get().errmsg(db_));
    return out;
  }
  std::string value(const std::string &sql) {
    auto r = rows(sql);
    REQUIRE(r.size() == 1);
    return r.front();
  }
  /// Copies this database to a new file `to` with SQLite's online backup
  /// API (what sqlite3's .backup does), in one step.
  void backup_to(const std::string &to) {
    const SqliteApi &api = SqliteApi::get();
    RawDb dest(to);
    sqlite3_backup *b = api.backup_init(dest.db_, "main", db_, "main");
    REQUIRE_MESSAGE(b != nullptr, "backup_init: " << api.errmsg(dest.db_));
    const int rc = api.backup_step(b, -1);
    CHECK(rc == SQLITE_DONE);
    REQUIRE(api.backup_finish(b) == SQLITE_OK);
  }

 private:
  sqlite3 *db_ = nullptr;
};

/// The "n" counter inside a counter Task's JSON.
long counter_of(const std::string &json) {
  const size_t at = json.find("\"n\":");
  REQUIRE(at != std::string::npos);
  return std::strtol(json.c_str() + at + 4, nullptr, 10);
}

Rec counter_task(const std::string &id, long n) {
  return task(id, 5000, "counters", "working", "", "", ",\"n\":" + std::to_string(n));
}

/// get -> +1 -> save(expected version) until it sticks. Returns the number of
/// conflicts seen, or -1 on any other error (message in *err).
int increment(Store &s, const std::string &id, std::string *err) {
  int conflicts = 0;
  for (;;) {
    Rec cur;
    Res g = s.get(id, &cur);
    if (g.st != TNX_OK) {
      *err = "get: " + g.err;
      return -1;
    }
    Res r = s.save(counter_task(id, counter_of(cur.json) + 1), cur.version);
    if (r.st == TNX_OK) {
      if (r.version != cur.version + 1) {
        *err = "version jumped from " + std::to_string(cur.version) + " to " +
               std::to_string(r.version);
        return -1;
      }
      return conflicts;
    }
    if (r.st != TNX_ECONFLICT) {
      *err = "save: " + r.err;
      return -1;
    }
    ++conflicts;
  }
}

/// The list order of task_store.h: newest status time first, ties by id.
bool list_before(const Rec &a, const Rec &b) {
  if (a.time != b.time) return a.time > b.time;
  return a.id < b.id;
}

std::vector<std::string> ids(const std::vector<Rec> &v) {
  std::vector<std::string> out;
  for (const Rec &r : v) out.push_back(r.id);
  return out;
}

/// Schema 1, the first layout (no tenant, no version): what an old
/// toolnexus-sqlite wrote. Kept here verbatim so the migration is tested
/// against a file made independently of the plugin.
const char *kSchema1 =
    "CREATE TABLE tnx_tasks (\n"
    "  id TEXT PRIMARY KEY NOT NULL,\n"
    "  context_id TEXT NOT NULL DEFAULT '',\n"
    "  state TEXT NOT NULL DEFAULT '',\n"
    "  status_time_us INTEGER NOT NULL,\n"
    "  owner TEXT NOT NULL DEFAULT '',\n"
    "  task_json TEXT NOT NULL);\n"
    "CREATE INDEX tnx_tasks_by_time ON tnx_tasks (status_time_us DESC, id);\n"
    "PRAGMA application_id = 1414420563;\n"  // 0x544E5853 "TNXS"
    "PRAGMA user_version = 1;\n";

}  // namespace sqlite_harness

using namespace sqlite_harness;  // NOLINT: the test programs' vocabulary

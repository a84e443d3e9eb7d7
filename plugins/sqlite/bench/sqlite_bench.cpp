// tnx_sqlite_bench: saves per second of the sqlite plugin (through its C ABI)
// against raw sqlite3 doing the same write, both in WAL with
// synchronous=FULL (every save fsync'ed).
//
//   tnx_sqlite_bench [dir] [saves-per-thread] [json-bytes] [rounds]
//
// Rows:
//   raw upsert          one prepared INSERT ... ON CONFLICT DO UPDATE per row,
//                       autocommit, on a table with the plugin's exact schema
//   plugin 1 thread     vtable->save(ANY), distinct ids
//   plugin N threads    N threads saving distinct ids at once (group commit)
//   plugin N, batch=1   the same with group commit off (max_batch=1)
//   ... and the same for updates of an existing row (raw UPDATE vs CAS save).
#include "toolnexus/task_store.h"

#include <sqlite3.h>

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

namespace {

#ifndef TNX_SQLITE_PLUGIN
#define TNX_SQLITE_PLUGIN "libtnx_sqlite.so"
#endif

const tnx_plugin_descriptor *g_plugin = nullptr;

void die(const std::string &m) {
  std::fprintf(stderr, "tnx_sqlite_bench: %s\n", m.c_str());
  std::exit(1);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

tnx_str S(const std::string &s) { return tnx_str{s.data(), s.size()}; }

std::string json_for(const std::string &id, size_t bytes) {
  std::string j = "{\"id\":\"" + id + "\",\"contextId\":\"ctx\",\"status\":{\"state\":\"working\"}," +
                  "\"kind\":\"task\",\"pad\":\"";
  if (j.size() + 2 < bytes) j.append(bytes - j.size() - 2, 'p');
  return j + "\"}";
}

/// The plugin's schema 2 (kept in step with sqlite_plugin.cpp by hand).
const char *kSchema =
    "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;"
    "CREATE TABLE tnx_tasks (id TEXT PRIMARY KEY NOT NULL, context_id TEXT NOT NULL DEFAULT '',"
    " state TEXT NOT NULL DEFAULT '', status_time_us INTEGER NOT NULL,"
    " owner TEXT NOT NULL DEFAULT '', tenant TEXT NOT NULL DEFAULT '',"
    " version INTEGER NOT NULL CHECK (version >= 1), task_json TEXT NOT NULL);"
    "CREATE INDEX tnx_tasks_by_time ON tnx_tasks (status_time_us DESC, id);"
    "CREATE INDEX tnx_tasks_by_context ON tnx_tasks (context_id, status_time_us DESC, id);"
    "CREATE INDEX tnx_tasks_by_state ON tnx_tasks (state, status_time_us DESC, id);"
    "CREATE INDEX tnx_tasks_by_owner ON tnx_tasks (owner, status_time_us DESC, id);"
    "CREATE INDEX tnx_tasks_by_tenant ON tnx_tasks (tenant, status_time_us DESC, id);";

/// Raw sqlite3: n upserts (distinct ids, or n updates of one id).
double raw_bench(const std::string &path, int n, size_t bytes, bool same_row) {
  std::filesystem::remove(path);
  sqlite3 *db = nullptr;
  if (sqlite3_open(path.c_str(), &db) != SQLITE_OK) die("open " + path);
  if (sqlite3_exec(db, kSchema, nullptr, nullptr, nullptr) != SQLITE_OK) die(sqlite3_errmsg(db));
  sqlite3_stmt *st = nullptr;
  const char *sql =
      "INSERT INTO tnx_tasks (id, context_id, state, status_time_us, owner, tenant, version,"
      " task_json) VALUES (?1, 'ctx', 'working', ?2, 'owner', 'tenant', 1, ?3)"
      " ON CONFLICT (id) DO UPDATE SET status_time_us = excluded.status_time_us,"
      " version = version + 1, task_json = excluded.task_json";
  if (sqlite3_prepare_v2(db, sql, -1, &st, nullptr) != SQLITE_OK) die(sqlite3_errmsg(db));
  const std::string body = json_for("raw", bytes);
  auto one = [&](int i) {
    const std::string id = same_row ? "row" : "raw-" + std::to_string(i);
    sqlite3_bind_text(st, 1, id.c_str(), static_cast<int>(id.size()), SQLITE_TRANSIENT);
    sqlite3_bind_int64(st, 2, 1700000000000000 + i);
    sqlite3_bind_text(st, 3, body.c_str(), static_cast<int>(body.size()), SQLITE_STATIC);
    if (sqlite3_step(st) != SQLITE_DONE) die(sqlite3_errmsg(db));
    sqlite3_reset(st);
  };
  if (same_row) one(-1);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) one(i);
  const double s = seconds_since(t0);
  sqlite3_finalize(st);
  sqlite3_close(db);
  return n / s;
}

tnx_store *open_store(const std::string &location) {
  const std::string scheme = "sqlite", selector = "sqlite:" + location;
  tnx_open_args a{};
  a.header = tnx_header(sizeof a);
  a.scheme = S(scheme);
  a.location = S(location);
  a.selector = S(selector);
  tnx_store *s = nullptr;
  char err[512];
  if (g_plugin->open(&a, &s, err, sizeof err) != TNX_OK) die(err);
  return s;
}

/// The plugin: `threads` threads each saving n records (distinct ids, or
/// CAS updates of one id per thread).
double plugin_bench(const std::string &path, const std::string &opts, int threads, int n,
                    size_t bytes, bool same_row) {
  std::filesystem::remove(path);
  std::filesystem::remove(path + "-wal");
  std::filesystem::remove(path + "-shm");
  tnx_store *s = open_store(path + opts);
  const tnx_store_vtable *vt = g_plugin->vtable;
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  auto work = [&](int t) {
    const std::string body = json_for("t" + std::to_string(t), bytes);
    const std::string own = "row-" + std::to_string(t);
    tnx_task_record r{};
    r.header = tnx_header(sizeof r);
    const std::string ctx = "ctx", state = "working", owner = "owner", tenant = "tenant";
    r.context_id = S(ctx);
    r.state = S(state);
    r.owner = S(owner);
    r.tenant = S(tenant);
    r.task_json = S(body);
    uint64_t version = 0;
    char err[512];
    auto save = [&](const std::string &id, uint64_t expected, int i) {
      r.id = S(id);
      r.status_time_us = 1700000000000000 + i;
      if (vt->save(s, &r, expected, &version, err, sizeof err) != TNX_OK) die(err);
    };
    if (same_row) save(own, TNX_VERSION_NONE, -1);
    ++ready;
    while (!go.load()) std::this_thread::yield();
    for (int i = 0; i < n; ++i) {
      if (same_row) save(own, version, i);
      else save("t" + std::to_string(t) + "-" + std::to_string(i), TNX_VERSION_ANY, i);
    }
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) pool.emplace_back(work, t);
  while (ready.load() < threads) std::this_thread::yield();
  const auto t0 = std::chrono::steady_clock::now();
  go = true;
  for (auto &th : pool) th.join();
  const double sec = seconds_since(t0);
  char err[512];
  if (vt->close(s, err, sizeof err) != TNX_OK) die(err);
  return threads * n / sec;
}


/// CPU time of the whole process so far, in seconds.
double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char **argv) {
  const std::string dir = argc > 1 ? argv[1] : "/tmp";
  const int n = argc > 2 ? std::atoi(argv[2]) : 500;
  const size_t bytes = argc > 3 ? static_cast<size_t>(std::atol(argv[3])) : 1024;
  const int rounds = argc > 4 ? std::atoi(argv[4]) : 5;
  const char *so = std::getenv("TNX_SQLITE_PLUGIN_SO");
  void *h = ::dlopen(so != nullptr ? so : TNX_SQLITE_PLUGIN, RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) die(::dlerror());
  auto entry = reinterpret_cast<tnx_plugin_entry_fn>(::dlsym(h, TNX_PLUGIN_ENTRY_NAME));
  if (entry == nullptr) die("no entry");
  tnx_host_info host{};
  host.header = tnx_header(sizeof host);
  host.host_name = "tnx_sqlite_bench";
  host.host_version = "0";
  g_plugin = entry(&host);
  if (g_plugin == nullptr) die("entry refused");

  const std::string db = dir + "/tnx_sqlite_bench.db";
  std::printf("%d saves per thread and run, %zu-byte Task JSON, WAL + synchronous=FULL, in %s;\n"
              "median of %d interleaved rounds (saves/s; CPU us per save for 1 thread)\n",
              n, bytes, dir.c_str(), rounds);
  struct Row {
    const char *name;
    std::vector<double> rate, cpu;
  };
  for (bool same : {false, true}) {
    std::printf("-- %s\n", same ? "updates of an existing row (plugin: CAS on the version)"
                                : "new rows (distinct ids)");
    Row raw{"raw sqlite3 upsert, 1 thread", {}, {}}, one{"plugin, 1 thread", {}, {}},
        two{"plugin, 2 threads", {}, {}}, four{"plugin, 4 threads", {}, {}},
        eight{"plugin, 8 threads", {}, {}}, nob{"plugin, 4 threads, max_batch=1", {}, {}};
    for (int r = 0; r < rounds; ++r) {
      double c0 = cpu_seconds();
      raw.rate.push_back(raw_bench(db, n, bytes, same));
      raw.cpu.push_back((cpu_seconds() - c0) / n * 1e6);
      c0 = cpu_seconds();
      one.rate.push_back(plugin_bench(db, "", 1, n, bytes, same));
      one.cpu.push_back((cpu_seconds() - c0) / n * 1e6);
      two.rate.push_back(plugin_bench(db, "", 2, n, bytes, same));
      four.rate.push_back(plugin_bench(db, "", 4, n, bytes, same));
      eight.rate.push_back(plugin_bench(db, "", 8, n, bytes, same));
      nob.rate.push_back(plugin_bench(db, "?max_batch=1", 4, n, bytes, same));
    }
    const double base = median(one.rate);
    std::printf("  %-32s %8.0f saves/s  %6.1f us CPU/save\n", raw.name, median(raw.rate),
                median(raw.cpu));
    std::printf("  %-32s %8.0f saves/s  %6.1f us CPU/save  raw/plugin %.2f\n", one.name, base,
                median(one.cpu), median(raw.rate) / base);
    for (const Row *row : {&two, &four, &eight, &nob})
      std::printf("  %-32s %8.0f saves/s  %.2fx 1 thread\n", row->name, median(row->rate),
                  median(row->rate) / base);
  }
  std::filesystem::remove(db);
  std::filesystem::remove(db + "-wal");
  std::filesystem::remove(db + "-shm");
  return 0;
}

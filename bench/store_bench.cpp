// store_bench: save, get and list throughput and p50/p99 latency of Task
// stores, for a Task of about 2 KiB, single-threaded and with 4 threads, plus
// the baselines each store is measured against:
//   baseline:hashmap     the same save/get on a plain mutex-guarded hash map
//                        of id -> Task JSON (what the memory store competes with)
//   baseline:raw-file    write + fsync + rename + fsync(dir) of the same bytes
//                        (what the file store competes with)
//   baseline:raw-sqlite  INSERT OR REPLACE of the same row, WAL,
//                        synchronous=FULL (what the sqlite store competes with)
//   baseline:raw-sqlite+idx  the same into a table with the five list
//                        indexes the sqlite store keeps (time, contextId,
//                        state, owner, tenant): separates what the schema
//                        costs from what the plugin's own code costs
//   baseline:raw-libpq   a prepared INSERT ... ON CONFLICT DO UPDATE of the
//                        same row, one connection per thread (what the
//                        postgres store competes with)
//
//   store_bench [--ops N] [--durable-ops N] [--threads 1,4] [SELECTOR...]
//   store_bench --list-bench N[,N...] [--long-ids] [SELECTOR...]
//   store_bench --gen-tasks N [--long-ids] [--into DIR]
//   store_bench --page-bench [--fill N] SELECTOR
//   store_bench --group-commit N SELECTOR...
//   store_bench --due-bench N [SELECTOR...]
//
// --due-bench: time per page of 1000 of a due list (TNX_FILTER_DUE_BEFORE)
// with N Tasks stored, N/2 due; see bench/due_bench.cpp.
//
// --gen-tasks: prints N small Tasks as JSON lines (the input of `toolnexus
// store put`, e.g. for bench/million.py): 90% completed, 5% input-required,
// 5% failed, 1000 contexts, status timestamps spread over the last 20 hours
// (newest last), so that every one of them is inside the push sweep's 24 h.
// --into DIR writes them as DIR/<id>.json instead, the seed layout a file:
// store indexes when it is first opened (faster than `store put` line by
// line when only the stored Tasks matter, not how they got there).
//
// --page-bench: opens an existing store (or fills a fresh one with --fill N
// small Tasks, e.g. memory) and times what a ListTasks page of 50 asks of the
// store: list 50 + count, first page, no filter but owner "" and tenant "".
// Prints "page-bench p50_ms=X" last (what bench/million.py reads).
//
// --group-commit: the raw baselines of blocking durable SendMessage, N rows
// each, on the store's own disk: for sqlite:PATH, a plain INSERT into the
// plugin's own tnx_tasks table (created by opening the store once: same
// schema, indexes and triggers), 64 rows per COMMIT, WAL, synchronous=FULL,
// one thread; for file:DIR, write + fdatasync + rename + fsync(dir) of one
// file per row from 64 threads. Prints "group-commit STORE rows_per_s=X".
//
// --list-bench: for each size N (e.g. 50000, or 50000,1000000: the 1M size
// takes minutes to populate, so it is never the default) fills a fresh store
// with N small Tasks (one owner, 90% completed, 5% working, 5%
// input-required, 1000 contexts) through save_batch in chunks of 5000 where
// the store has batches, else with 16 threads of plain saves (file: writes
// the seed's <id>.json files directly and lets the store build its index at
// open, which is timed too), then times what the A2A server's ListTasks
// asks for: one page of 50 for the caller (owner and tenant filters) and
// its totalSize (count), first page and deep in, with a state filter (the
// lease sweep's query) and a contextId filter; and at N <= 50000 the old
// totalSize by paging through every match (TaskStore's list fallback).
// On file: and sqlite: it then times `toolnexus store list` of every Task
// in a new process (the binary beside store_bench), 20 runs after one that
// warms the page cache. --long-ids gives the Tasks 36-character UUID-shaped
// ids and contextIds, as the server makes them, instead of "t-N"/"ctx-N".
//
// SELECTOR may contain {tmp} (a fresh temporary directory). Default selectors:
// memory file:{tmp} sqlite:{tmp}/tasks.db. Numbers go to stdout, one row per
// (store, threads, operation).
#include "toolnexus/registry.hpp"

#include <fcntl.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <libpq-fe.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace fs = std::filesystem;
using namespace toolnexus;
using Clock = std::chrono::steady_clock;

namespace {

std::vector<fs::path> g_tmp;

fs::path make_tmp() {
  std::string pattern = (fs::temp_directory_path() / "tnx-bench-XXXXXX").string();
  if (::mkdtemp(pattern.data()) == nullptr) {
    std::perror("mkdtemp");
    std::exit(2);
  }
  g_tmp.emplace_back(pattern);
  return pattern;
}

std::string expand(std::string sel) {
  size_t p;
  if (sel.find("{tmp}") == std::string::npos) return sel;
  std::string dir = make_tmp().string();
  while ((p = sel.find("{tmp}")) != std::string::npos) sel.replace(p, 5, dir);
  return sel;
}

// A realistic ~2 KiB Task: history of a few messages, an artifact, metadata.
Task make_task(const std::string &id, int i) {
  std::string text(300, 'a' + static_cast<char>(i % 26));
  std::string json = R"({"id":")" + id + R"(","contextId":"ctx-)" + std::to_string(i % 16) +
                     R"(","kind":"task","status":{"state":"working","timestamp":")" +
                     format_timestamp(1767225600000000LL + i * 1000LL) +
                     R"("},"history":[)";
  for (int m = 0; m < 3; ++m) {
    if (m) json += ",";
    json += R"({"role":")" + std::string(m % 2 ? "agent" : "user") + R"(","messageId":"m)" + std::to_string(m) +
            R"(","kind":"message","parts":[{"kind":"text","text":")" + text + R"("}]})";
  }
  json += R"(],"artifacts":[{"artifactId":"a1","parts":[{"kind":"text","text":")" + text +
          R"("}]}],"metadata":{"source":"store_bench","n":)" + std::to_string(i) + "}}";
  return Task::parse(json);
}

struct Row {
  std::string store;
  int threads;
  std::string op;
  double ops_per_s;
  double p50_us, p99_us;
  size_t n;
};

std::vector<Row> g_rows;

// Runs `op(i)` for i in [0, n) split over `threads` threads; records latency.
void measure(const std::string &store, int threads, const std::string &op_name, size_t n,
             const std::function<void(size_t)> &op) {
  std::vector<std::vector<double>> lat(static_cast<size_t>(threads));
  std::atomic<size_t> next{0};
  auto t0 = Clock::now();
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      auto &l = lat[static_cast<size_t>(t)];
      l.reserve(n / static_cast<size_t>(threads) + 1);
      for (;;) {
        size_t i = next.fetch_add(1);
        if (i >= n) break;
        auto a = Clock::now();
        op(i);
        l.push_back(std::chrono::duration<double, std::micro>(Clock::now() - a).count());
      }
    });
  }
  for (auto &t : ts) t.join();
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  std::vector<double> all;
  for (auto &l : lat) all.insert(all.end(), l.begin(), l.end());
  std::sort(all.begin(), all.end());
  auto pct = [&](double p) { return all.empty() ? 0.0 : all[std::min(all.size() - 1, static_cast<size_t>(p * static_cast<double>(all.size())))]; };
  Row r{store, threads, op_name, static_cast<double>(n) / secs, pct(0.50), pct(0.99), n};
  std::printf("%-22s %2d  %-5s %12.0f ops/s  p50 %9.1f us  p99 %9.1f us  (n=%zu)\n", r.store.c_str(), r.threads,
              r.op.c_str(), r.ops_per_s, r.p50_us, r.p99_us, r.n);
  std::fflush(stdout);
  g_rows.push_back(r);
}

void bench_store(const std::string &selector, int threads, size_t n, const std::vector<Task> &tasks) {
  auto store = resolve_store(expand(selector));
  std::string name = selector.substr(0, selector.find(':'));
  std::vector<std::string> ids(n);
  for (size_t i = 0; i < n; ++i) ids[i] = "task-" + std::to_string(i);
  measure(name, threads, "save", n, [&](size_t i) {
    Task t = tasks[i % tasks.size()];
    t.json()["id"].SetString(ids[i].c_str(), static_cast<rapidjson::SizeType>(ids[i].size()), t.allocator());
    store->save(t);
  });
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), std::mt19937(42));
  measure(name, threads, "get", n, [&](size_t i) {
    auto r = store->get(ids[order[i]]);
    if (!r) std::abort();
  });
  size_t lists = std::max<size_t>(50, n / 100);
  measure(name, threads, "list", lists, [&](size_t i) {
    ListQuery q;
    q.context_id = "ctx-" + std::to_string(i % 16);
    q.page_size = 50;
    auto p = store->list(q);
    if (p.records.empty()) std::abort();
  });
  store->close();
}

void bench_hashmap(int threads, size_t n, const std::vector<Task> &tasks) {
  std::mutex mu;
  std::unordered_map<std::string, std::string> map;
  std::vector<std::string> ids(n);
  for (size_t i = 0; i < n; ++i) ids[i] = "task-" + std::to_string(i);
  measure("baseline:hashmap", threads, "save", n, [&](size_t i) {
    Task t = tasks[i % tasks.size()];
    t.json()["id"].SetString(ids[i].c_str(), static_cast<rapidjson::SizeType>(ids[i].size()), t.allocator());
    std::string json = t.to_json();
    std::lock_guard l(mu);
    map[ids[i]] = std::move(json);
  });
  measure("baseline:hashmap", threads, "get", n, [&](size_t i) {
    std::string out;
    {
      std::lock_guard l(mu);
      out = map.at(ids[(i * 7919) % n]);
    }
    if (out.empty()) std::abort();
  });
}

void write_all(int fd, const std::string &s) {
  size_t off = 0;
  while (off < s.size()) {
    ssize_t w = ::write(fd, s.data() + off, s.size() - off);
    if (w < 0) {
      std::perror("write");
      std::exit(2);
    }
    off += static_cast<size_t>(w);
  }
}

void bench_raw_file(int threads, size_t n, const std::vector<Task> &tasks) {
  fs::path dir = make_tmp();
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  std::vector<std::string> json(tasks.size());
  for (size_t i = 0; i < tasks.size(); ++i) json[i] = tasks[i].to_json();
  measure("baseline:raw-file", threads, "save", n, [&](size_t i) {
    std::string name = "task-" + std::to_string(i);
    std::string tmp = (dir / ("." + name + ".tmp")).string();
    std::string final_path = (dir / (name + ".json")).string();
    int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    write_all(fd, json[i % json.size()]);
    ::fsync(fd);
    ::close(fd);
    ::rename(tmp.c_str(), final_path.c_str());
    ::fsync(dfd);
  });
  ::close(dfd);
}

void bench_raw_sqlite(int threads, size_t n, const std::vector<Task> &tasks, bool indexed) {
  fs::path db = make_tmp() / "raw.db";
  std::vector<std::string> json(tasks.size());
  for (size_t i = 0; i < tasks.size(); ++i) json[i] = tasks[i].to_json();
  auto open_conn = [&] {
    sqlite3 *c = nullptr;
    sqlite3_open(db.c_str(), &c);
    sqlite3_busy_timeout(c, 10000);
    sqlite3_exec(c, "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;", nullptr, nullptr, nullptr);
    return c;
  };
  sqlite3 *setup = open_conn();
  sqlite3_exec(setup,
               "CREATE TABLE IF NOT EXISTS tasks(id TEXT PRIMARY KEY, context_id TEXT, state TEXT, "
               "status_time_us INTEGER, owner TEXT, tenant TEXT, version INTEGER, json TEXT)",
               nullptr, nullptr, nullptr);
  if (indexed)
    sqlite3_exec(setup,
                 "CREATE INDEX by_time ON tasks (status_time_us DESC, id);"
                 "CREATE INDEX by_context ON tasks (context_id, status_time_us DESC, id);"
                 "CREATE INDEX by_state ON tasks (state, status_time_us DESC, id);"
                 "CREATE INDEX by_owner ON tasks (owner, status_time_us DESC, id);"
                 "CREATE INDEX by_tenant ON tasks (tenant, status_time_us DESC, id);",
                 nullptr, nullptr, nullptr);
  sqlite3_close(setup);
  std::mutex mu;
  std::vector<sqlite3 *> conns;
  thread_local sqlite3 *conn = nullptr;
  thread_local sqlite3_stmt *st = nullptr;
  conn = nullptr;
  measure(indexed ? "baseline:raw-sqlite+idx" : "baseline:raw-sqlite", threads, "save", n, [&](size_t i) {
    if (conn == nullptr) {
      conn = open_conn();
      sqlite3_prepare_v2(conn,
                         "INSERT OR REPLACE INTO tasks(id,context_id,state,status_time_us,owner,tenant,version,json) "
                         "VALUES(?,?,?,?,?,?,?,?)",
                         -1, &st, nullptr);
      std::lock_guard l(mu);
      conns.push_back(conn);
    }
    std::string id = "task-" + std::to_string(i);
    const std::string &j = json[i % json.size()];
    sqlite3_bind_text(st, 1, id.c_str(), static_cast<int>(id.size()), SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 2, "ctx", 3, SQLITE_STATIC);
    sqlite3_bind_text(st, 3, "working", 7, SQLITE_STATIC);
    sqlite3_bind_int64(st, 4, static_cast<sqlite3_int64>(i));
    sqlite3_bind_text(st, 5, "", 0, SQLITE_STATIC);
    sqlite3_bind_text(st, 6, "", 0, SQLITE_STATIC);
    sqlite3_bind_int64(st, 7, 1);
    sqlite3_bind_text(st, 8, j.c_str(), static_cast<int>(j.size()), SQLITE_STATIC);
    int rc;
    while ((rc = sqlite3_step(st)) == SQLITE_BUSY) {
    }
    if (rc != SQLITE_DONE) {
      std::fprintf(stderr, "raw sqlite: %s\n", sqlite3_errmsg(conn));
      std::exit(2);
    }
    sqlite3_reset(st);
  });
  // Statements and connections of worker threads are closed here.
  for (auto *c : conns) {
    sqlite3_stmt *s = nullptr;
    while ((s = sqlite3_next_stmt(c, nullptr)) != nullptr) sqlite3_finalize(s);
    sqlite3_close(c);
  }
}

// The libpq URI of a postgres selector, without the plugin's tnx_ options.
std::string libpq_uri(const std::string &selector) {
  size_t q = selector.find('?');
  if (q == std::string::npos) return selector;
  std::string base = selector.substr(0, q), kept;
  size_t p = q + 1;
  while (p <= selector.size()) {
    size_t e = selector.find('&', p);
    if (e == std::string::npos) e = selector.size();
    std::string kv = selector.substr(p, e - p);
    if (!kv.empty() && kv.rfind("tnx_", 0) != 0) kept += (kept.empty() ? "" : "&") + kv;
    p = e + 1;
  }
  return kept.empty() ? base : base + "?" + kept;
}

void bench_raw_libpq(const std::string &selector, int threads, size_t n, const std::vector<Task> &tasks) {
  const std::string uri = libpq_uri(selector);
  auto connect = [&] {
    PGconn *c = PQconnectdb(uri.c_str());
    if (PQstatus(c) != CONNECTION_OK) {
      std::fprintf(stderr, "raw libpq: cannot connect\n");
      std::exit(2);
    }
    return c;
  };
  PGconn *setup = connect();
  PQclear(PQexec(setup, "DROP TABLE IF EXISTS raw_tasks"));
  PQclear(PQexec(setup,
                 "CREATE TABLE raw_tasks (id text COLLATE \"C\" PRIMARY KEY, context_id text, state text, "
                 "status_time_us bigint, owner text, tenant text, task_json text, version bigint)"));
  PQfinish(setup);
  std::vector<std::string> json(tasks.size());
  for (size_t i = 0; i < tasks.size(); ++i) json[i] = tasks[i].to_json();
  std::mutex mu;
  std::vector<PGconn *> conns;
  thread_local PGconn *conn = nullptr;
  measure("baseline:raw-libpq", threads, "save", n, [&](size_t i) {
    if (conn == nullptr) {
      conn = connect();
      PQclear(PQprepare(conn, "up",
                        "INSERT INTO raw_tasks VALUES ($1,$2,$3,$4,$5,$6,$7,1) ON CONFLICT (id) DO UPDATE SET "
                        "context_id=EXCLUDED.context_id, state=EXCLUDED.state, status_time_us=EXCLUDED.status_time_us, "
                        "owner=EXCLUDED.owner, tenant=EXCLUDED.tenant, task_json=EXCLUDED.task_json, "
                        "version=raw_tasks.version+1 RETURNING version",
                        7, nullptr));
      std::lock_guard l(mu);
      conns.push_back(conn);
    }
    std::string id = "task-" + std::to_string(i), t = std::to_string(i);
    const char *params[7] = {id.c_str(), "ctx", "working", t.c_str(), "", "", json[i % json.size()].c_str()};
    PGresult *r = PQexecPrepared(conn, "up", 7, params, nullptr, nullptr, 0);
    if (PQresultStatus(r) != PGRES_TUPLES_OK) {
      std::fprintf(stderr, "raw libpq: %s\n", PQresultErrorMessage(r));
      std::exit(2);
    }
    PQclear(r);
  });
  for (auto *c : conns) PQfinish(c);
}

// ---------------------------------------------------------------------------
// --list-bench
// ---------------------------------------------------------------------------

// --long-ids: ids and contextIds shaped like the server's (36-character
// UUIDs), which do not fit std::string's inline buffer; the default "t-N"
// and "ctx-N" do.
bool g_long_ids = false;

std::string uuid_like(uint64_t tag, size_t i) {
  char b[48];
  std::snprintf(b, sizeof b, "%08llx-%04x-4%03x-8%03x-%012zx", static_cast<unsigned long long>(tag & 0xffffffffu),
                static_cast<unsigned>((i * 2654435761u) & 0xffff), static_cast<unsigned>(i & 0xfff),
                static_cast<unsigned>((i >> 12) & 0xfff), i);
  return b;
}
std::string bench_id(size_t i) { return g_long_ids ? uuid_like(0x7a5c, i) : "t-" + std::to_string(i); }
std::string bench_context(size_t i) {
  return g_long_ids ? uuid_like(0xc0, i % 1000) : "ctx-" + std::to_string(i % 1000);
}

std::string small_task_json(size_t i) {
  const char *state = i % 20 == 0 ? "working" : i % 20 == 1 ? "input-required" : "completed";
  return R"({"id":")" + bench_id(i) + R"(","contextId":")" + bench_context(i) +
         R"(","kind":"task","status":{"state":")" + state + R"(","timestamp":")" +
         format_timestamp(1767225600000000LL + static_cast<int64_t>(i) * 1000LL) +
         R"("},"history":[{"role":"user","messageId":"m)" + std::to_string(i) +
         R"(","kind":"message","parts":[{"kind":"text","text":"hello"}]}]})";
}

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// Times `f` `reps` times; prints p50 and max in ms.
void timed(const std::string &what, int reps, const std::function<void()> &f) {
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    auto t0 = Clock::now();
    f();
    t.push_back(ms_since(t0));
  }
  std::sort(t.begin(), t.end());
  std::printf("  %-52s p50 %9.3f ms  max %9.3f ms  (%d runs)\n", what.c_str(), t[t.size() / 2], t.back(), reps);
  std::fflush(stdout);
}

// `toolnexus store list SELECTOR` (every Task, one line each, to
// /dev/null) as a user runs it: a new process that loads the plugins, opens
// the store read-only and prints. Wall time and the process's CPU time,
// beside the same command on an empty memory store (what starting the
// process and loading the plugins costs on this machine).
void cli_list_run(const fs::path &exe, const std::string &sel, const std::string &what, size_t lines) {
  std::vector<double> wall, cpu;
  for (int r = 0; r < 21; ++r) {
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    std::string a0 = exe.string(), a1 = "store", a2 = "list", a3 = sel;
    char *argv[] = {a0.data(), a1.data(), a2.data(), a3.data(), nullptr};
    pid_t pid = 0;
    const auto t0 = Clock::now();
    if (posix_spawn(&pid, a0.c_str(), &fa, nullptr, argv, environ) != 0) {
      std::perror("posix_spawn");
      std::exit(2);
    }
    posix_spawn_file_actions_destroy(&fa);
    int status = 0;
    struct rusage ru {};
    if (::wait4(pid, &status, 0, &ru) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::fprintf(stderr, "store_bench: toolnexus store list %s failed\n", sel.c_str());
      std::exit(2);
    }
    if (r == 0) continue;  // warms the page cache
    wall.push_back(ms_since(t0));
    const long long cpu_us = static_cast<long long>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000000LL +
                             static_cast<long long>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
    cpu.push_back(static_cast<double>(cpu_us) / 1e3);
  }
  std::sort(wall.begin(), wall.end());
  std::sort(cpu.begin(), cpu.end());
  std::printf("  %-52s p50 %9.3f ms  min %9.3f ms  cpu p50 %.3f ms  (%zu runs, %zu lines)\n", what.c_str(),
              wall[wall.size() / 2], wall.front(), cpu[cpu.size() / 2], wall.size(), lines);
  std::fflush(stdout);
}

void cli_list_bench(const std::string &sel, size_t n) {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec).parent_path() / "toolnexus";
  if (ec || !fs::exists(exe)) {
    std::printf("  toolnexus store list: skipped (no %s)\n", exe.c_str());
    return;
  }
  cli_list_run(exe, "memory", "toolnexus store list memory (empty: process start)", 0);
  cli_list_run(exe, sel, "toolnexus store list (new process, every Task)", n);
}

void list_bench(const std::string &selector, size_t n) {
  const std::string sel = expand(selector);
  std::string name = selector.substr(0, selector.find(':'));
  std::printf("%s, %zu Tasks:\n", name.c_str(), n);
  auto t0 = Clock::now();
  std::shared_ptr<TaskStore> store;
  if (sel.rfind("file:", 0) == 0) {
    // The seed's layout written directly; the store indexes it at open.
    const std::string dir = sel.substr(5);
    fs::create_directories(dir);
    for (size_t i = 0; i < n; ++i) {
      const std::string path = dir + "/" + bench_id(i) + ".json";
      int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      write_all(fd, small_task_json(i));
      ::close(fd);
    }
    std::printf("  populated (files written directly) in %.1f s\n", ms_since(t0) / 1000);
    auto t1 = Clock::now();
    store = resolve_store(sel);
    std::printf("  first open (builds the index) %.1f ms\n", ms_since(t1));
    store->close();
    t1 = Clock::now();
    store = resolve_store(sel);
    std::printf("  second open (index trusted) %.1f ms\n", ms_since(t1));
  } else {
    store = resolve_store(sel);
    const size_t chunk = 5000;
    bool batches = true;
    for (size_t base = 0; base < n && batches; base += chunk) {
      std::vector<Task> tasks;
      std::vector<BatchItem> items;
      for (size_t i = base; i < std::min(n, base + chunk); ++i) tasks.push_back(Task::parse(small_task_json(i)));
      for (const Task &t : tasks) {
        BatchItem b;
        b.task = &t;
        items.push_back(b);
      }
      try {
        store->save_batch(items);
      } catch (const StoreError &e) {
        if (e.code() != Status::unsupported || base != 0) throw;
        batches = false;
      }
    }
    if (!batches) {
      std::atomic<size_t> next{0};
      std::vector<std::thread> ts;
      for (int t = 0; t < 16; ++t)
        ts.emplace_back([&] {
          for (size_t i; (i = next.fetch_add(1)) < n;) store->save(Task::parse(small_task_json(i)));
        });
      for (auto &t : ts) t.join();
    }
    std::printf("  populated (%s) in %.1f s\n", batches ? "save_batch of 5000" : "16 threads of saves",
                ms_since(t0) / 1000);
  }
  ListQuery caller;
  caller.owner = "";
  caller.tenant = "";
  caller.page_size = 50;
  const int reps = n > 100000 ? 50 : 100;
  timed("ListTasks page 1 (list 50 + count)", reps, [&] {
    auto p = store->list(caller);
    if (p.records.size() != 50 || store->count(caller) != n) std::abort();
  });
  std::string deep;
  {
    ListQuery q = caller;
    q.page_size = 1000;
    q.omit_json = true;
    for (int i = 0; i < 10 && (i == 0 || !q.cursor.empty()); ++i) q.cursor = store->list(q).next_cursor;
    deep = q.cursor;
  }
  timed("ListTasks deep page (after 10000; list 50 + count)", reps, [&] {
    ListQuery q = caller;
    q.cursor = deep;
    auto p = store->list(q);
    if (p.records.size() != 50 || store->count(caller) != n) std::abort();
  });
  timed("count only (owner, tenant)", reps, [&] { (void)store->count(caller); });
  ListQuery working = caller;
  working.state = "working";
  timed("ListTasks state=working (list 50 + count)", reps, [&] {
    auto p = store->list(working);
    if (p.records.empty() || store->count(working) != (n + 19) / 20) std::abort();
  });
  ListQuery sweep;
  sweep.state = "working";
  sweep.page_size = 200;
  timed("lease sweep page (state=working, 200, no owner)", reps, [&] { (void)store->list(sweep); });
  ListQuery ctx = caller;
  ctx.context_id = bench_context(7);
  timed("ListTasks contextId (list 50 + count)", reps, [&] {
    auto p = store->list(ctx);
    if (p.records.empty()) std::abort();
    (void)store->count(ctx);
  });
  if (n <= 50000) {
    timed("old totalSize: paging through every match", 3, [&] {
      ListQuery q = caller;
      q.omit_json = true;
      q.deliver_corrupt = true;
      q.page_size = 1000;
      uint64_t total = 0;
      for (;;) {
        ListPage p = store->list(q);
        total += p.records.size();
        if (p.next_cursor.empty()) break;
        q.cursor = p.next_cursor;
      }
      if (total != n) std::abort();
    });
  }
  store->close();
  if (sel.rfind("file:", 0) == 0 || sel.rfind("sqlite:", 0) == 0) cli_list_bench(sel, n);
}

// ---------------------------------------------------------------------------
// --gen-tasks, --page-bench, --group-commit (bench/million.py's parts)
// ---------------------------------------------------------------------------

// Task i of n for --gen-tasks: only states `store put` takes without a lease;
// status time now - 20 h * (n - i) / n.
std::string gen_task_json(size_t i, size_t n, int64_t now_us) {
  const char *state = i % 20 == 0 ? "input-required" : i % 20 == 1 ? "failed" : "completed";
  const int64_t span_us = 20LL * 3600 * 1000000;
  const int64_t t = now_us - static_cast<int64_t>(static_cast<double>(span_us) * static_cast<double>(n - i) /
                                                  static_cast<double>(n));
  return R"({"id":")" + bench_id(i) + R"(","contextId":")" + bench_context(i) +
         R"(","kind":"task","status":{"state":")" + state + R"(","timestamp":")" + format_timestamp(t) +
         R"("},"history":[{"role":"user","messageId":"m)" + std::to_string(i) +
         R"(","kind":"message","parts":[{"kind":"text","text":"hello from the million Tasks bench"}]}],)" +
         R"("artifacts":[{"artifactId":"a)" + std::to_string(i) +
         R"(","parts":[{"kind":"text","text":"hello from the million Tasks bench"}]}]})";
}

// --gen-tasks: N Tasks as JSON lines on stdout, or as DIR/<id>.json files.
void gen_tasks(size_t n, const std::string &into) {
  const int64_t now_us = std::chrono::duration_cast<std::chrono::microseconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();
  if (!into.empty()) {
    fs::create_directories(into);
    for (size_t i = 0; i < n; ++i) {
      const std::string path = into + "/" + bench_id(i) + ".json";
      const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fd < 0) {
        std::perror(("store_bench --gen-tasks: " + path).c_str());
        std::exit(2);
      }
      write_all(fd, gen_task_json(i, n, now_us));
      ::close(fd);
    }
    return;
  }
  std::string buf;
  for (size_t i = 0; i < n; ++i) {
    buf += gen_task_json(i, n, now_us);
    buf += '\n';
    if (buf.size() > (1 << 20) || i + 1 == n) {
      if (std::fwrite(buf.data(), 1, buf.size(), stdout) != buf.size()) {
        std::perror("store_bench --gen-tasks: write");
        std::exit(2);
      }
      buf.clear();
    }
  }
  std::fflush(stdout);
}

// --page-bench: p50 of list 50 + count (the caller's first ListTasks page)
// over 180 runs after 20 that warm the caches.
void page_bench(const std::string &selector, size_t fill) {
  auto store = resolve_store(expand(selector));
  if (fill != 0) {
    const int64_t now_us = std::chrono::duration_cast<std::chrono::microseconds>(
                               std::chrono::system_clock::now().time_since_epoch())
                               .count();
    for (size_t base = 0; base < fill; base += 5000) {
      std::vector<Task> tasks;
      for (size_t i = base; i < std::min(fill, base + 5000); ++i) tasks.push_back(Task::parse(gen_task_json(i, fill, now_us)));
      std::vector<BatchItem> items(tasks.size());
      for (size_t k = 0; k < tasks.size(); ++k) items[k].task = &tasks[k];
      store->save_batch(items);
    }
  }
  ListQuery caller;
  caller.owner = "";
  caller.tenant = "";
  caller.page_size = 50;
  std::vector<double> t;
  for (int r = 0; r < 200; ++r) {
    auto t0 = Clock::now();
    auto p = store->list(caller);
    (void)store->count(caller);
    if (p.records.empty()) {
      std::fprintf(stderr, "store_bench --page-bench: %s lists no Task\n", selector.c_str());
      std::exit(2);
    }
    if (r >= 20) t.push_back(ms_since(t0));  // the first 20 warm the caches
  }
  std::sort(t.begin(), t.end());
  store->close();
  std::printf("page-bench p50_ms=%.4f min_ms=%.4f\n", t[t.size() / 2], t.front());
}

// The row an echo SendMessage leaves, about: a user message and its echo.
std::string group_row_json(size_t i) {
  return R"({"id":")" + uuid_like(0x6c, i) + R"(","contextId":")" + uuid_like(0xc1, i) +
         R"(","kind":"task","status":{"state":"completed","timestamp":"2026-12-01T00:00:00.000000Z"},)"
         R"("history":[{"role":"user","messageId":"m-)" + std::to_string(i) +
         R"(","kind":"message","parts":[{"kind":"text","text":"hello from the load program"}]}],)"
         R"("artifacts":[{"artifactId":"a","parts":[{"kind":"text","text":"hello from the load program"}]}]})";
}

// --group-commit on sqlite:PATH: N rows, 64 per COMMIT, into the plugin's table.
void group_commit_sqlite(const std::string &sel, size_t n) {
  const std::string path = sel.substr(7, sel.find('?') == std::string::npos ? std::string::npos : sel.find('?') - 7);
  resolve_store(sel)->close();  // the plugin's own schema
  sqlite3 *c = nullptr;
  if (sqlite3_open(path.c_str(), &c) != SQLITE_OK) {
    std::fprintf(stderr, "store_bench --group-commit: cannot open %s\n", path.c_str());
    std::exit(2);
  }
  sqlite3_exec(c, "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;", nullptr, nullptr, nullptr);
  sqlite3_stmt *st = nullptr;
  sqlite3_prepare_v2(c,
                     "INSERT INTO tnx_tasks(id,context_id,state,status_time_us,owner,tenant,version,task_json) "
                     "VALUES(?,?,?,?,'','',1,?)",
                     -1, &st, nullptr);
  const size_t batch = 64;
  auto t0 = Clock::now();
  for (size_t base = 0; base < n; base += batch) {
    sqlite3_exec(c, "BEGIN", nullptr, nullptr, nullptr);
    for (size_t i = base; i < std::min(n, base + batch); ++i) {
      const std::string id = uuid_like(0x6c, i), ctx = uuid_like(0xc1, i), json = group_row_json(i);
      sqlite3_bind_text(st, 1, id.c_str(), static_cast<int>(id.size()), SQLITE_TRANSIENT);
      sqlite3_bind_text(st, 2, ctx.c_str(), static_cast<int>(ctx.size()), SQLITE_TRANSIENT);
      sqlite3_bind_text(st, 3, "completed", 9, SQLITE_STATIC);
      sqlite3_bind_int64(st, 4, static_cast<sqlite3_int64>(1796083200000000LL + static_cast<int64_t>(i)));
      sqlite3_bind_text(st, 5, json.c_str(), static_cast<int>(json.size()), SQLITE_TRANSIENT);
      if (sqlite3_step(st) != SQLITE_DONE) {
        std::fprintf(stderr, "store_bench --group-commit: %s\n", sqlite3_errmsg(c));
        std::exit(2);
      }
      sqlite3_reset(st);
    }
    if (sqlite3_exec(c, "COMMIT", nullptr, nullptr, nullptr) != SQLITE_OK) {
      std::fprintf(stderr, "store_bench --group-commit: COMMIT: %s\n", sqlite3_errmsg(c));
      std::exit(2);
    }
  }
  const double s = ms_since(t0) / 1000;
  sqlite3_finalize(st);
  sqlite3_close(c);
  std::printf("group-commit sqlite rows_per_s=%.1f (%zu rows, %zu per COMMIT, one thread)\n",
              static_cast<double>(n) / s, n, batch);
}

// --group-commit on file:DIR: N durable file writes from 64 threads.
void group_commit_file(const std::string &sel, size_t n) {
  const fs::path dir = sel.substr(5);
  fs::create_directories(dir);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  std::atomic<size_t> next{0};
  auto t0 = Clock::now();
  std::vector<std::thread> ts;
  for (int t = 0; t < 64; ++t)
    ts.emplace_back([&] {
      for (size_t i; (i = next.fetch_add(1)) < n;) {
        const std::string name = uuid_like(0x6c, i);
        const std::string tmp = (dir / ("." + name + ".tmp")).string(), final_path = (dir / (name + ".json")).string();
        const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0) {
          std::perror("store_bench --group-commit: open");
          std::exit(2);
        }
        write_all(fd, group_row_json(i));
        ::fdatasync(fd);
        ::close(fd);
        ::rename(tmp.c_str(), final_path.c_str());
        ::fsync(dfd);
      }
    });
  for (auto &t : ts) t.join();
  const double s = ms_since(t0) / 1000;
  ::close(dfd);
  std::printf("group-commit file rows_per_s=%.1f (%zu files, write+fdatasync+rename+fsync(dir), 64 threads)\n",
              static_cast<double>(n) / s, n);
}

}  // namespace

// bench/due_bench.cpp: --due-bench N.
int due_bench_main(size_t n, std::vector<std::string> selectors);

int main(int argc, char **argv) {
  size_t ops = 20000, durable_ops = 2000;
  std::vector<int> thread_counts = {1, 4};
  std::vector<std::string> selectors;
  std::vector<size_t> list_sizes;
  size_t gen = 0, fill = 0, group = 0, due = 0;
  std::string into;
  bool page = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--long-ids") g_long_ids = true;
    else if (a == "--gen-tasks" && i + 1 < argc) gen = std::stoul(argv[++i]);
    else if (a == "--into" && i + 1 < argc) into = argv[++i];
    else if (a == "--page-bench") page = true;
    else if (a == "--fill" && i + 1 < argc) fill = std::stoul(argv[++i]);
    else if (a == "--group-commit" && i + 1 < argc) group = std::stoul(argv[++i]);
    else if (a == "--due-bench" && i + 1 < argc) due = std::stoul(argv[++i]);
    else if (a == "--list-bench" && i + 1 < argc) {
      std::string v = argv[++i];
      for (size_t p = 0; p < v.size();) {
        size_t c = v.find(',', p);
        list_sizes.push_back(std::stoul(v.substr(p, c - p)));
        p = c == std::string::npos ? v.size() : c + 1;
      }
    } else if (a == "--ops" && i + 1 < argc) ops = std::stoul(argv[++i]);
    else if (a == "--durable-ops" && i + 1 < argc) durable_ops = std::stoul(argv[++i]);
    else if (a == "--threads" && i + 1 < argc) {
      thread_counts.clear();
      std::string v = argv[++i];
      size_t p = 0;
      while (p < v.size()) {
        size_t c = v.find(',', p);
        thread_counts.push_back(std::stoi(v.substr(p, c - p)));
        p = c == std::string::npos ? v.size() : c + 1;
      }
    } else if (a == "--help" || a == "-h") {
      std::printf("usage: store_bench [--ops N] [--durable-ops N] [--threads 1,4] [SELECTOR...]\n"
                  "       store_bench --list-bench N[,N...] [--long-ids] [SELECTOR...]\n"
                  "       store_bench --gen-tasks N [--long-ids] [--into DIR]\n"
                  "       store_bench --page-bench [--fill N] SELECTOR\n"
                  "       store_bench --group-commit N SELECTOR...\n"
                  "       store_bench --due-bench N [SELECTOR...]\n");
      return 0;
    } else selectors.push_back(a);
  }
  if (gen != 0) {
    gen_tasks(gen, into);
    return 0;
  }
  if (due != 0) return due_bench_main(due, selectors);
  if (page || group != 0) {
    int rc = 0;
    try {
      for (const auto &sel : selectors) {
        if (page) page_bench(sel, fill);
        else if (sel.rfind("sqlite:", 0) == 0) group_commit_sqlite(expand(sel), group);
        else if (sel.rfind("file:", 0) == 0) group_commit_file(expand(sel), group);
        else throw std::invalid_argument("--group-commit takes sqlite:PATH or file:DIR, not " + sel);
      }
    } catch (const std::exception &e) {
      std::fprintf(stderr, "store_bench: %s\n", e.what());
      rc = 2;
    }
    for (const auto &d : g_tmp) {
      std::error_code ec;
      fs::remove_all(d, ec);
    }
    return rc;
  }
  if (selectors.empty()) selectors = {"memory", "file:{tmp}", "sqlite:{tmp}/tasks.db"};
  if (!list_sizes.empty()) {
    for (size_t n : list_sizes)
      for (const auto &sel : selectors) {
        try {
          list_bench(sel, n);
        } catch (const std::exception &e) {
          std::fprintf(stderr, "store_bench: %s: %s\n", sel.c_str(), e.what());
          return 2;
        }
      }
    for (const auto &d : g_tmp) {
      std::error_code ec;
      fs::remove_all(d, ec);
    }
    return 0;
  }
  std::vector<Task> tasks;
  for (int i = 0; i < 64; ++i) tasks.push_back(make_task("t", i));
  std::printf("task size: %zu bytes of JSON; ops: %zu in memory, %zu on durable stores\n",
              tasks[0].to_json().size(), ops, durable_ops);
  for (const auto &sel : selectors) {
    bool durable = sel.rfind("memory", 0) != 0;
    size_t n = durable ? durable_ops : ops;
    for (int t : thread_counts) {
      try {
        bench_store(sel, t, n, tasks);
      } catch (const std::exception &e) {
        std::fprintf(stderr, "store_bench: %s: %s\n", sel.c_str(), e.what());
        return 2;
      }
      if (sel == "memory") bench_hashmap(t, n, tasks);
      if (sel.rfind("file:", 0) == 0) bench_raw_file(t, n, tasks);
      if (sel.rfind("sqlite:", 0) == 0) {
        bench_raw_sqlite(t, n, tasks, false);
        bench_raw_sqlite(t, n, tasks, true);
      }
      if (sel.rfind("postgres", 0) == 0) bench_raw_libpq(sel, t, n, tasks);
    }
  }
  // Ratios the issues name as goals.
  auto find = [](const std::string &s, int t, const std::string &op) -> const Row * {
    for (const auto &r : g_rows)
      if (r.store == s && r.threads == t && r.op == op) return &r;
    return nullptr;
  };
  std::printf("\nratios:\n");
  for (int t : thread_counts) {
    for (const char *op : {"save", "get"}) {
      const Row *m = find("memory", t, op), *h = find("baseline:hashmap", t, op);
      if (m && h)
        std::printf("  memory %s, %d thread(s): %.2f of the hash map's throughput (goal >= 0.50)\n", op, t,
                    m->ops_per_s / h->ops_per_s);
    }
    const Row *f = find("file", t, "save"), *rf = find("baseline:raw-file", t, "save");
    if (f && rf)
      std::printf("  file save, %d thread(s): %.2fx the raw sequence's time per save (goal <= 1.25)\n", t,
                  rf->ops_per_s / f->ops_per_s);
    const Row *s = find("sqlite", t, "save"), *rs = find("baseline:raw-sqlite", t, "save");
    if (s && rs)
      std::printf("  sqlite save, %d thread(s): %.2fx the raw insert's time per save (goal <= 1.2 at 1 thread)\n",
                  t, rs->ops_per_s / s->ops_per_s);
    const Row *ri = find("baseline:raw-sqlite+idx", t, "save");
    if (s && ri)
      std::printf("  sqlite save, %d thread(s): %.2fx the raw insert's time into the same indexed table\n", t,
                  ri->ops_per_s / s->ops_per_s);
  }
  for (int t : thread_counts) {
    std::string pgname;
    for (const auto &r : g_rows)
      if (r.store.rfind("postgres", 0) == 0) pgname = r.store;
    const Row *p = find(pgname, t, "save"), *rp = find("baseline:raw-libpq", t, "save");
    if (p && rp)
      std::printf("  postgres save, %d thread(s): %.2fx the raw libpq upsert's time per save\n", t,
                  rp->ops_per_s / p->ops_per_s);
  }
  const Row *s1 = find("sqlite", 1, "save"), *s4 = find("sqlite", 4, "save");
  if (s1 && s4)
    std::printf("  sqlite save, 4 threads vs 1: %.2fx the saves/s (goal > 1)\n", s4->ops_per_s / s1->ops_per_s);
  for (const auto &d : g_tmp) {
    std::error_code ec;
    fs::remove_all(d, ec);
  }
  return 0;
}

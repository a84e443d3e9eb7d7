// bench/due_bench.cpp: store_bench --due-bench N (issue 21, "idle cost
// proportional to what is due"): what a sweep of a due list costs a store.
//
// For each store: N small Tasks saved through save_stream (one transaction
// where the store has one, else each Task atomically with the fsyncs
// grouped), every other one with a due time (so N/2 are due), the due times
// a shuffle of the Tasks' order (unrelated to their status times, as lease
// expiries and push retries are). Then, with TNX_FILTER_DUE_BEFORE after
// every due time, pages of 1000 as the server's push sweep reads them:
//   first page         p50 over 20 runs of the first page
//   deep page          p50 over 20 runs of the page after 50,000 records
//                      (or the middle of the list when fewer are due)
//   sweep              every page until the cursor ends, 3 runs: time per
//                      page (p50 of the runs) and that every due Task came
//                      exactly once (else the bench aborts)
// Prints one line per measurement, "due-bench STORE what ms_per_page=X".
// Selectors as store_bench's ({tmp}: a fresh temporary directory); by
// default memory, file:{tmp} and sqlite:{tmp}/tasks.db, and the postgres
// store named by the URI in the file $TNX_PG_URI_FILE when it is set (as
// the postgres tests find their cluster; tests/postgres/pg_cluster.sh
// start DIR writes DIR/uri), in a fresh table of its own
// (tnx_table=due_bench_PID), which is left in that throwaway cluster.
#include "toolnexus/registry.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <unordered_set>
#include <vector>

namespace fs = std::filesystem;
using namespace toolnexus;

namespace {

using Clock = std::chrono::steady_clock;

constexpr int64_t kTimeBase = 1767225600000000LL;  // 2026-01-01, µs
constexpr int64_t kDueBase = 1900000000000000LL;   // 2030-03-17, µs
constexpr uint32_t kPage = 1000;

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

std::string task_json(size_t i) {
  const char *state = i % 4 == 0 ? "working" : i % 4 == 1 ? "submitted" : "completed";
  return R"({"id":"t-)" + std::to_string(i) + R"(","contextId":"ctx-)" + std::to_string(i % 1000) +
         R"(","kind":"task","status":{"state":")" + state + R"(","timestamp":")" +
         format_timestamp(kTimeBase + static_cast<int64_t>(i) * 1000LL) +
         R"("},"history":[{"role":"user","messageId":"m)" + std::to_string(i) +
         R"(","kind":"message","parts":[{"kind":"text","text":"hello"}]}]})";
}

double p50(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void fill(TaskStore &store, size_t n) {
  // Due times: a shuffle of 0..n/2-1, one per odd i.
  std::vector<int64_t> dues(n / 2);
  for (size_t k = 0; k < dues.size(); ++k) dues[k] = kDueBase + static_cast<int64_t>(k) * 1000;
  std::mt19937_64 rng(21);
  std::shuffle(dues.begin(), dues.end(), rng);
  auto run = [&](bool one_transaction) {
    size_t i = 0;
    Task task;
    BatchItem item;
    return store.save_stream(
        [&]() -> const BatchItem * {
          if (i == n) return nullptr;
          task = Task::parse(task_json(i));
          item = BatchItem{};
          item.task = &task;
          if (i % 2 == 1) item.options.due_us = dues[i / 2];
          ++i;
          return &item;
        },
        one_transaction);
  };
  try {
    run(true);
  } catch (const StoreError &e) {
    if (e.code() != Status::unsupported) throw;
    run(false);  // file: each Task atomically, the fsyncs grouped
  }
}

void due_bench(const std::string &name, const std::string &sel, size_t n) {
  std::printf("%s, %zu Tasks, %zu due:\n", name.c_str(), n, n / 2);
  std::fflush(stdout);
  auto t0 = Clock::now();
  std::shared_ptr<TaskStore> store = resolve_store(sel);
  if ((store->info().capabilities & TNX_CAP_DUE_INDEX) == 0) {
    std::printf("  skipped: the store keeps no due times\n");
    return;
  }
  fill(*store, n);
  std::printf("  populated (save_stream) in %.1f s\n", ms_since(t0) / 1000);
  ListQuery q;
  q.due_before_us = INT64_MAX;
  q.page_size = kPage;
  std::vector<double> first;
  for (int r = 0; r < 20; ++r) {
    auto t = Clock::now();
    ListPage p = store->list(q);
    first.push_back(ms_since(t));
    if (p.records.size() != std::min<size_t>(kPage, n / 2)) std::abort();
  }
  std::printf("due-bench %s first_page ms_per_page=%.3f\n", name.c_str(), p50(first));
  // The cursor deep in: after 50 pages, or half of what is due.
  const size_t skip = std::min<size_t>(50, (n / 2) / kPage / 2);
  ListQuery deep = q;
  for (size_t k = 0; k < skip; ++k) deep.cursor = store->list(deep).next_cursor;
  std::vector<double> deep_t;
  for (int r = 0; r < 20; ++r) {
    auto t = Clock::now();
    ListPage p = store->list(deep);
    deep_t.push_back(ms_since(t));
    if (p.records.empty()) std::abort();
  }
  std::printf("due-bench %s deep_page(after %zu) ms_per_page=%.3f\n", name.c_str(), skip * kPage, p50(deep_t));
  std::vector<double> sweep;
  for (int r = 0; r < 3; ++r) {
    std::unordered_set<std::string> seen;
    ListQuery s = q;
    size_t pages = 0;
    auto t = Clock::now();
    for (;;) {
      ListPage p = store->list(s);
      ++pages;
      for (const TaskRecord &rec : p.records)
        if (!seen.insert(rec.id).second) {
          std::fprintf(stderr, "due-bench %s: %s delivered twice\n", name.c_str(), rec.id.c_str());
          std::abort();
        }
      if (p.next_cursor.empty()) break;
      s.cursor = p.next_cursor;
    }
    sweep.push_back(ms_since(t) / static_cast<double>(pages));
    if (seen.size() != n / 2) {
      std::fprintf(stderr, "due-bench %s: the sweep delivered %zu of %zu due\n", name.c_str(), seen.size(), n / 2);
      std::abort();
    }
  }
  std::printf("due-bench %s sweep ms_per_page=%.3f\n", name.c_str(), p50(sweep));
  std::fflush(stdout);
  store->close();
}

}  // namespace

int due_bench_main(size_t n, std::vector<std::string> selectors);

/// store_bench --due-bench N [SELECTOR...]: see the top of this file.
/// Returns the process's exit status.
int due_bench_main(size_t n, std::vector<std::string> selectors) {
  std::vector<fs::path> tmp;
  bool pg_default = false;
  if (selectors.empty()) {
    selectors = {"memory", "file:{tmp}", "sqlite:{tmp}/tasks.db"};
    if (const char *f = std::getenv("TNX_PG_URI_FILE")) {
      std::ifstream in(f);
      std::string uri;
      if (in && std::getline(in, uri) && !uri.empty()) {
        selectors.push_back(uri + (uri.find('?') == std::string::npos ? "?" : "&") + "tnx_table=due_bench_" +
                            std::to_string(::getpid()));
        pg_default = true;
      }
    }
  }
  int rc = 0;
  for (std::string sel : selectors) {
    const std::string name = sel.substr(0, sel.find(':'));
    if (sel.find("{tmp}") != std::string::npos) {
      std::string pattern = (fs::temp_directory_path() / "tnx-due-bench-XXXXXX").string();
      if (::mkdtemp(pattern.data()) == nullptr) {
        std::perror("mkdtemp");
        return 2;
      }
      tmp.emplace_back(pattern);
      for (size_t p; (p = sel.find("{tmp}")) != std::string::npos;) sel.replace(p, 5, pattern);
    }
    try {
      due_bench(name, sel, n);
    } catch (const std::exception &e) {
      std::fprintf(stderr, "store_bench --due-bench: %s: %s\n", name.c_str(), e.what());
      rc = 2;
    }
  }
  if (pg_default) std::printf("(postgres: table due_bench_%d left in the test cluster)\n", static_cast<int>(::getpid()));
  for (const fs::path &d : tmp) {
    std::error_code ec;
    fs::remove_all(d, ec);
  }
  return rc;
}

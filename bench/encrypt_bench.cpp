// encrypt_bench: what the encrypt decorator (issue 23.2) costs, in one run:
// save (new Tasks, compare-and-set), get and list rates of memory, file: and
// sqlite: plain beside the same store under encrypt:, and `toolnexus store
// rekey` of many Tasks (time and rate), run as the real command.
//
//   encrypt_bench [TASKS (2000)] [REKEY_TASKS (100000, 0: none)] [DIR ("": a new temp dir)] [ONLY (memory|file|sqlite)]
//
// Tasks are about 1 KiB of JSON (a user message and an agent reply). The
// rekey store is filled unsealed in one transaction (store put's stream),
// then sealed by `store rekey` through encrypt:...,plaintext=accept (the
// migration of an existing store), then rekeyed again to a second key.
// Prints numbers only; never run by CTest.
#include "toolnexus/registry.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

namespace fs = std::filesystem;
using namespace toolnexus;
using Clock = std::chrono::steady_clock;

namespace {

const char *kKey1 = "k1:000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
const char *kKey2 = "k2:2222222222222222222222222222222222222222222222222222222222222222";

std::string task_json(int i) {
  std::string text(400, 'x');
  return R"({"id":"task-)" + std::to_string(i) + R"(","contextId":"ctx-)" + std::to_string(i % 50) +
         R"(","status":{"state":"working","timestamp":")" + format_timestamp((1767225600LL + i) * 1000000LL) +
         R"("},"kind":"task","history":[{"role":"user","kind":"message","messageId":"u)" + std::to_string(i) +
         R"(","parts":[{"kind":"text","text":")" + text + R"("}]},{"role":"agent","kind":"message","messageId":"a)" +
         std::to_string(i) + R"(","parts":[{"kind":"text","text":")" + text + R"("}]}]})";
}

double secs(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct Rates {
  double save = 0, get = 0, list = 0;
};

Rates measure(const std::string &sel, const std::vector<Task> &tasks) {
  Rates r;
  auto s = resolve_store(sel);
  const int n = static_cast<int>(tasks.size());
  auto t0 = Clock::now();
  for (const Task &t : tasks) {
    SaveOptions o;
    o.expected_version = kNoVersion;
    s->save(t, o);
  }
  r.save = n / secs(t0);
  t0 = Clock::now();
  for (int i = 0; i < n; ++i)
    if (!s->get("task-" + std::to_string(i))) std::abort();
  r.get = n / secs(t0);
  t0 = Clock::now();
  size_t seen = 0;
  ListQuery q;
  q.page_size = 100;
  do {
    ListPage p = s->list(q);
    seen += p.records.size();
    q.cursor = p.next_cursor;
  } while (!q.cursor.empty());
  if (seen != tasks.size()) std::abort();
  r.list = n / secs(t0);
  s->close();
  return r;
}

int run(const std::string &cmd) {
  const int st = std::system(cmd.c_str());
  return st;
}

}  // namespace

// A count argument: digits only (atoi read "--help" as 0 Tasks).
int count_arg(const char *text, const char *what) {
  char *end = nullptr;
  const long v = std::strtol(text, &end, 10);
  if (*text == '\0' || *end != '\0' || v < 0 || v > 100000000) {
    std::fprintf(stderr,
                 "encrypt_bench: %s must be a count (got '%s')\n"
                 "usage: encrypt_bench [TASKS (2000)] [REKEY_TASKS (100000, 0: none)] [DIR (\"\": a new temp dir)] "
                 "[ONLY (memory|file|sqlite)]\n",
                 what, text);
    std::exit(2);
  }
  return static_cast<int>(v);
}

int main(int argc, char **argv) {
  const int n = argc > 1 ? count_arg(argv[1], "TASKS") : 2000;
  const int rekey_n = argc > 2 ? count_arg(argv[2], "REKEY_TASKS") : 100000;
  fs::path dir = argc > 3 && *argv[3] != '\0'
                     ? fs::path(argv[3])
                     : fs::temp_directory_path() / ("tnx-encrypt-bench-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  setenv("TNX_BENCH_KEY", kKey1, 1);
  std::vector<Task> tasks;
  for (int i = 0; i < n; ++i) tasks.push_back(Task::parse(task_json(i)));

  std::printf("encrypt_bench: %d Tasks of %zu bytes each; rates in Tasks/s (plain | encrypt: | overhead)\n", n,
              task_json(0).size());
  struct Backend {
    const char *name;
    std::string sel;
  };
  const std::vector<Backend> backends = {
      {"memory", "memory:"},
      {"file", "file:" + (dir / "f-plain").string()},
      {"sqlite", "sqlite:" + (dir / "plain.db").string()},
  };
  const std::string only = argc > 4 ? argv[4] : "";
  if (!only.empty() && only != "memory" && only != "file" && only != "sqlite") {
    std::fprintf(stderr, "encrypt_bench: ONLY must be memory, file or sqlite (got '%s')\n", only.c_str());
    return 2;
  }
  for (const Backend &b : backends) {
    if (!only.empty() && only != b.name) continue;
    std::string enc_inner = b.sel;
    if (enc_inner.rfind("file:", 0) == 0) enc_inner = "file:" + (dir / "f-enc").string();
    if (enc_inner.rfind("sqlite:", 0) == 0) enc_inner = "sqlite:" + (dir / "enc.db").string();
    const Rates p = measure(b.sel, tasks);
    const Rates e = measure("encrypt:env=TNX_BENCH_KEY;" + enc_inner, tasks);
    auto row = [&](const char *op, double plain, double enc) {
      std::printf("  %-7s %-5s %10.0f | %10.0f | %+6.1f%%\n", b.name, op, plain, enc, (plain / enc - 1.0) * 100.0);
    };
    row("save", p.save, e.save);
    row("get", p.get, e.get);
    row("list", p.list, e.list);
  }

  if (rekey_n > 0) {
    const std::string db = (dir / "rekey.db").string();
    const fs::path lines = dir / "rekey.jsonl";
    {
      FILE *f = std::fopen(lines.c_str(), "w");
      for (int i = 0; i < rekey_n; ++i) std::fprintf(f, "%s\n", task_json(i).c_str());
      std::fclose(f);
    }
    const std::string bin = TOOLNEXUS_BENCH_BIN;
    auto t0 = Clock::now();
    if (run(bin + " store put --running-as completed sqlite:" + db + " <" + lines.string() + " >/dev/null") != 0) return 1;
    std::printf("rekey: %d Tasks put unsealed into sqlite:%s in %.1f s\n", rekey_n, db.c_str(), secs(t0));
    t0 = Clock::now();
    if (run(bin + " store rekey 'encrypt:env=TNX_BENCH_KEY,plaintext=accept;sqlite:" + db + "' 2>/dev/null") != 0)
      return 1;
    double t = secs(t0);
    std::printf("rekey: unsealed -> k1 (store rekey: pages of 200, one transaction each): %d Tasks in %.1f s (%.0f Tasks/s)\n", rekey_n, t,
                rekey_n / t);
    setenv("TNX_BENCH_KEY", (std::string(kKey1) + "\n" + kKey2).c_str(), 1);
    t0 = Clock::now();
    if (run(bin + " store rekey 'encrypt:env=TNX_BENCH_KEY;sqlite:" + db + "' 2>/dev/null") != 0) return 1;
    t = secs(t0);
    std::printf("rekey: k1 -> k2 (store rekey: pages of 200, one transaction each): %d Tasks in %.1f s (%.0f Tasks/s)\n", rekey_n, t,
                rekey_n / t);
  }
  fs::remove_all(dir);
  return 0;
}

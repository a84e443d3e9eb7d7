// `toolnexus store put` of JSON lines streamed (issue 21), through the real
// executable: a large put is complete; a bad line or an existing Task in
// the middle saves nothing on sqlite (one transaction) and names the line;
// on file: (no transactions) a put stopped by a bad line or killed, then
// run again with --resume, ends with every Task stored exactly once, as
// the input has it; a stream copy of many Tasks is complete.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "cli_run.hpp"
#include "test_util.hpp"
#include "toolnexus/registry.hpp"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

namespace fs = std::filesystem;
using namespace toolnexus;

namespace {
const std::string kBin = std::string(TOOLNEXUS_BIN_DIR) + "/toolnexus";
using tnx_test::Run;
using tnx_test::sh_quote;

// Runs `toolnexus ARGS` with `input` on stdin, from a regular file or, with
// `pipe`, through a pipe (not seekable: checked as it is read). Without leak
// checking (see RunOptions::no_leak_check: seen on a 20,000-line put);
// cli_store_test runs the same put and copy code with it.
Run run(const std::vector<std::string> &args, const std::string &input = "", bool pipe = false) {
  tnx_test::RunOptions o;
  o.input = input;
  o.pipe = pipe;
  o.no_leak_check = true;
  return tnx_test::run_cli(args, o);
}

// Task `i` of an import, as one JSON line (as Task::to_json writes it, so
// the stored bytes equal the line).
std::string task_line(int i, const std::string &state = "completed") {
  return R"({"id":"t)" + std::to_string(i) + R"(","contextId":"c)" + std::to_string(i % 13) +
         R"(","status":{"state":")" + state + R"(","timestamp":")" + format_timestamp((1767225600LL + i) * 1000000LL) +
         R"("},"kind":"task","metadata":{"i":)" + std::to_string(i) + "}}";
}

std::string lines(int from, int to) {
  std::string s;
  for (int i = from; i < to; ++i) s += task_line(i) + "\n";
  return s;
}

// Every Task t<from>..t<to-1> is stored with the bytes of its line, the
// store holds `total` Tasks, and none is due.
void check_all(const std::string &sel, int from, int to, uint64_t total) {
  auto s = resolve_store(sel);
  CHECK(s->count(ListQuery{}) == total);
  int wrong = 0;
  for (int i = from; i < to; ++i) {
    const auto r = s->get("t" + std::to_string(i));
    if (!r || r->json != task_line(i)) ++wrong;
  }
  CHECK(wrong == 0);
  // Nothing imported is due (ABI 1.5): a streamed save carries the records'
  // due times (none here) like a save.
  if ((s->info().capabilities & TNX_CAP_DUE_INDEX) != 0) {
    ListQuery due;
    due.due_before_us = INT64_MAX;
    CHECK(s->count(due) == 0);
  }
  s->close();
}
}  // namespace

TEST_CASE("store put of 5,000 JSON lines streams into file: and sqlite:, every Task there") {
  const fs::path dir = tnx_test::temp_dir("tnx-put");
  const int n = 5000;  // ten of the CLI's 500-record pages
  const std::string input = lines(0, n);
  for (const std::string &sel : {"file:" + (dir / "f").string(), "sqlite:" + (dir / "t.db").string()}) {
    CAPTURE(sel);
    for (bool pipe : {false, true}) {
      const std::string where = sel + (pipe ? "-pipe" : "");
      Run r = run({"store", "put", where}, input, pipe);
      REQUIRE_MESSAGE(r.code == 0, r.err);
      CHECK(r.out.find("saved 5000 Task(s)") == 0);
      check_all(where, 0, n, n);
    }
  }
  fs::remove_all(dir);
}

TEST_CASE("sqlite: a bad line or an existing Task in the middle of a streamed put saves nothing and names the line") {
  const fs::path dir = tnx_test::temp_dir("tnx-put");
  const std::string sel = "sqlite:" + (dir / "t.db").string();
  for (bool pipe : {false, true}) {
    CAPTURE(pipe);
    // Line 2,501 is not JSON, line 3,752 not a Task: both named, nothing saved.
    Run r = run({"store", "put", sel}, lines(0, 2500) + "{\"id\": oops\n" + lines(2500, 3750) + "[1]\n" +
                                           lines(3750, 5000), pipe);
    CHECK(r.code == 2);
    CHECK_MESSAGE(r.err.find("line 2501: not a valid Task") != std::string::npos, r.err);
    CHECK_MESSAGE(r.err.find("line 3752: not a valid Task") != std::string::npos, r.err);
    CHECK_MESSAGE(r.err.find("2 bad line(s); nothing was saved") != std::string::npos, r.err);
    auto s = resolve_store(sel);
    CHECK(s->count(ListQuery{}) == 0);
    s->close();
  }
  REQUIRE(run({"store", "put", sel}, task_line(3345) + "\n" + task_line(3346) + "\n").code == 0);
  // Line 3,346 holds a Task that exists: named, and the 3,345 before it are not saved either.
  Run r = run({"store", "put", sel}, lines(0, 5000), true);
  CHECK(r.code == 1);
  CHECK_MESSAGE(r.err.find("line 3346 (Task 't3345'): a Task with this id exists") != std::string::npos, r.err);
  CHECK_MESSAGE(r.err.find("nothing was saved (one transaction)") != std::string::npos, r.err);
  auto s = resolve_store(sel);
  CHECK(s->count(ListQuery{}) == 2);
  s->close();
  // --resume skips the two stored as the input has them: all there once.
  r = run({"store", "put", sel, "--resume"}, lines(0, 5000), true);
  CHECK_MESSAGE(r.code == 0, r.err);
  CHECK(r.out == "saved 4998 Task(s) in one transaction, 2 already stored (skipped)\n");
  check_all(sel, 0, 5000, 5000);
  fs::remove_all(dir);
}

TEST_CASE("file: a put stopped by a bad line says how far it got; run again with --resume, every Task once") {
  const fs::path dir = tnx_test::temp_dir("tnx-put");
  const std::string sel = "file:" + (dir / "f").string();
  // From a regular file every line is checked first: nothing saved.
  Run r = run({"store", "put", sel}, lines(0, 1500) + "not json\n" + lines(1500, 3000));
  CHECK(r.code == 2);
  CHECK_MESSAGE(r.err.find("line 1501: not a valid Task") != std::string::npos, r.err);
  CHECK_MESSAGE(r.err.find("nothing was saved") != std::string::npos, r.err);
  check_all(sel, 0, 0, 0);
  // Through a pipe, checked as read: the lines before the bad one are saved,
  // and the message says so.
  r = run({"store", "put", sel}, lines(0, 1500) + "not json\n" + lines(1500, 3000), true);
  CHECK(r.code == 2);
  CHECK_MESSAGE(r.err.find("line 1501: not a valid Task") != std::string::npos, r.err);
  CHECK_MESSAGE(r.err.find("1500 Task(s) saved, every line before line 1501") != std::string::npos, r.err);
  CHECK_MESSAGE(r.err.find("--resume") != std::string::npos, r.err);
  check_all(sel, 0, 1500, 1500);
  // Without --resume the re-run stops at the first stored Task...
  r = run({"store", "put", sel}, lines(0, 3000), true);
  CHECK(r.code == 1);
  CHECK_MESSAGE(r.err.find("line 1 (Task 't0'): a Task with this id exists") != std::string::npos, r.err);
  // ...with it, the put finishes.
  r = run({"store", "put", sel, "--resume"}, lines(0, 3000), true);
  CHECK_MESSAGE(r.code == 0, r.err);
  CHECK(r.out == "saved 1500 Task(s) Task by Task (the store has no transactions), 1500 already stored (skipped)\n");
  check_all(sel, 0, 3000, 3000);
  // A stored Task that differs from its line is not skipped: named.
  r = run({"store", "put", sel, "--resume"}, task_line(3, "failed") + "\n" + task_line(3000) + "\n");
  CHECK(r.code == 1);
  CHECK_MESSAGE(r.err.find("line 1 (Task 't3'): a Task with this id exists") != std::string::npos, r.err);
  CHECK(run({"store", "check", sel}).out == "3000 sound, 0 bad\n");
  fs::remove_all(dir);
}

TEST_CASE("file: a put killed mid-way, run again with --resume, ends with every Task once and sound") {
  const fs::path dir = tnx_test::temp_dir("tnx-put");
  const std::string sel = "file:" + (dir / "f").string();
  const int n = 8000;
  const fs::path input = dir / "in.jsonl";
  tnx_test::spit(input, lines(0, n));
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    const int fd = ::open(input.c_str(), O_RDONLY);
    ::dup2(fd, 0);
    const int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, 1);
    ::execl(kBin.c_str(), kBin.c_str(), "store", "put", sel.c_str(), static_cast<char *>(nullptr));
    ::_exit(127);
  }
  // Killed once some Task files are in place (or after it ended by itself:
  // then the re-run has nothing left to do, which the checks accept too).
  for (int i = 0; i < 2000; ++i) {
    size_t tasks = 0;
    std::error_code ec;
    for (auto it = fs::directory_iterator(dir / "f", ec); !ec && it != fs::directory_iterator(); it.increment(ec))
      if (it->path().extension() == ".json") ++tasks;
    if (tasks >= 1500) break;
    int st = 0;
    if (::waitpid(pid, &st, WNOHANG) == pid) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  const Run r = run({"store", "put", sel, "--resume", input.string()}, "");
  CHECK_MESSAGE(r.code == 0, r.err);
  MESSAGE("after the kill: " << r.out);
  CHECK(r.out.find("already stored (skipped)") != std::string::npos);
  check_all(sel, 0, n, n);
  CHECK(run({"store", "check", sel}, "").out == std::to_string(n) + " sound, 0 bad\n");
  fs::remove_all(dir);
}

TEST_CASE("--running-as imports are known on a re-run: --resume skips them") {
  const fs::path dir = tnx_test::temp_dir("tnx-put");
  for (const std::string &sel : {"file:" + (dir / "f").string(), "sqlite:" + (dir / "t.db").string()}) {
    CAPTURE(sel);
    const std::string input = task_line(1, "working") + "\n" + task_line(2) + "\n";
    REQUIRE(run({"store", "put", sel, "--running-as", "failed"}, input).code == 0);
    const Run r = run({"store", "put", sel, "--running-as", "failed", "--resume"}, input + task_line(3) + "\n");
    CHECK_MESSAGE(r.code == 0, r.err);
    CHECK_MESSAGE(r.out.find("saved 1 Task(s)") == 0, r.out);
    CHECK(r.out.find("2 already stored (skipped)") != std::string::npos);
    auto s = resolve_store(sel);
    CHECK(s->get("t1")->state == "failed");
    CHECK(s->count(ListQuery{}) == 3);
    s->close();
  }
  fs::remove_all(dir);
}

TEST_CASE("store copy streams 5,000 Tasks page by page: sqlite to file and back, complete") {
  const fs::path dir = tnx_test::temp_dir("tnx-put");
  const std::string a = "sqlite:" + (dir / "a.db").string(), f = "file:" + (dir / "f").string(),
                    b = "sqlite:" + (dir / "b.db").string();
  REQUIRE(run({"store", "put", a}, lines(0, 5000)).code == 0);
  Run r = run({"store", "copy", a, f}, "");
  CHECK_MESSAGE(r.code == 0, r.err);
  CHECK(r.out == "copied 5000 Task(s), 0 unreadable\n");
  r = run({"store", "copy", f, b}, "");
  CHECK_MESSAGE(r.code == 0, r.err);
  CHECK(r.out == "copied 5000 Task(s), 0 unreadable\n");
  check_all(f, 0, 5000, 5000);
  check_all(b, 0, 5000, 5000);
  fs::remove_all(dir);
}

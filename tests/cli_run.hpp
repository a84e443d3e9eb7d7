// tests/cli_run.hpp: runs the real `toolnexus` executable from a doctest
// program and captures what it did (the CLI tests share it). Header-only;
// include after <doctest/doctest.h>.
#ifndef TOOLNEXUS_TESTS_CLI_RUN_HPP
#define TOOLNEXUS_TESTS_CLI_RUN_HPP

#include "test_util.hpp"

#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

namespace tnx_test {

/// What a run of `toolnexus` did: its exit code (128 + the signal when a
/// signal ended it), stdout and stderr.
struct Run {
  int code = -1;
  std::string out, err;
};

/// `s` quoted for sh: one word, whatever it holds.
inline std::string sh_quote(const std::string &s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') out += "'\\''";
    else out += c;
  }
  return out + "'";
}

/// How run_cli() feeds and watches the child.
struct RunOptions {
  /// Bytes on its stdin (through a regular file, or with `pipe` through a
  /// pipe, which is not seekable).
  std::string input;
  bool pipe = false;
  /// Under ASan, LeakSanitizer's stop-the-world tracer now and then crashes
  /// at the exit of a `toolnexus` that has done its work (google/sanitizers
  /// #1353), and the exit code is then LeakSanitizer's: true runs the child
  /// without leak checking (for tests whose point is the exit code of long
  /// runs; other tests run the same code with it).
  bool no_leak_check = false;
};

/// Runs `<TOOLNEXUS_BIN_DIR>/toolnexus ARGS` through sh and waits for it.
/// Its files (stdin, stdout, stderr) live in one temp dir per test program:
/// not thread-safe, one run at a time.
inline Run run_cli(const std::vector<std::string> &args, const RunOptions &o = {}) {
  static const std::filesystem::path dir = temp_dir("tnx-cli");
  const std::filesystem::path in = dir / "stdin", out = dir / "stdout", err = dir / "stderr";
  spit(in, o.input);
  std::string cmd = sh_quote(std::string(TOOLNEXUS_BIN_DIR) + "/toolnexus");
  if (o.no_leak_check) cmd = "ASAN_OPTIONS=\"${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0\" " + cmd;
  if (o.pipe) cmd = "cat " + sh_quote(in.string()) + " 2>/dev/null | " + cmd;
  for (const auto &a : args) cmd += " " + sh_quote(a);
  cmd += (o.pipe ? std::string() : " <" + sh_quote(in.string())) + " >" + sh_quote(out.string()) + " 2>" +
         sh_quote(err.string());
  const int st = std::system(cmd.c_str());
  Run r;
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

}  // namespace tnx_test

#endif

// tests/serve_process.hpp: a real `toolnexus serve` child process for tests
// that need a second process (replicas on one store, a restart): started on
// a free loopback port, its URL read from its first line ("listening on
// http://127.0.0.1:PORT/"), killed when the object goes.
#ifndef TOOLNEXUS_TESTS_SERVE_PROCESS_HPP
#define TOOLNEXUS_TESTS_SERVE_PROCESS_HPP

#include <doctest/doctest.h>

#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <regex>
#include <string>
#include <vector>

extern char **environ;

namespace tnxtest {

/// `TOOLNEXUS_BIN_DIR/toolnexus serve --listen 127.0.0.1:0 --store <store>
/// --log-level error <more...>` as a child process, its stdout piped here.
/// Not thread-safe; one owner.
class ServeProcess {
 public:
  ServeProcess(const std::string &store, std::vector<std::string> more = {}) {
    const std::string program = std::string(TOOLNEXUS_BIN_DIR) + "/toolnexus";
    int o[2];
    REQUIRE(::pipe(o) == 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, o[1], 1);
    posix_spawn_file_actions_addclose(&fa, o[0]);
    std::vector<std::string> args{program, "serve", "--listen", "127.0.0.1:0", "--store", store, "--log-level", "error"};
    args.insert(args.end(), more.begin(), more.end());
    std::vector<char *> argv;
    for (auto &s : args) argv.push_back(s.data());
    argv.push_back(nullptr);
    const int rc = posix_spawn(&pid_, program.c_str(), &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    ::close(o[1]);
    out_ = o[0];
    REQUIRE_MESSAGE(rc == 0, "cannot run " << program);
  }
  ~ServeProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    ::close(out_);
  }
  ServeProcess(const ServeProcess &) = delete;
  ServeProcess &operator=(const ServeProcess &) = delete;

  /// The URL it listens on (waits up to 10 s for its first line).
  std::string url() {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (buf_.find('\n') == std::string::npos && std::chrono::steady_clock::now() < deadline) {
      pollfd p{out_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      char b[512];
      const ssize_t n = ::read(out_, b, sizeof b);
      if (n <= 0) break;
      buf_.append(b, static_cast<size_t>(n));
    }
    static const std::regex re(R"(^listening on (http://127\.0\.0\.1:[0-9]+/)\n)");
    std::smatch m;
    REQUIRE_MESSAGE(std::regex_search(buf_, m, re), "first line: '" << buf_ << "'");
    return m[1];
  }

  /// Waits for it to exit by itself (e.g. a crash); returns the wait status.
  int wait() {
    int st = 0;
    ::waitpid(pid_, &st, 0);
    pid_ = -1;
    return st;
  }

  /// SIGTERM, then waits; returns the wait status.
  int stop() {
    ::kill(pid_, SIGTERM);
    int st = 0;
    ::waitpid(pid_, &st, 0);
    pid_ = -1;
    return st;
  }

 private:
  pid_t pid_ = -1;
  int out_ = -1;
  std::string buf_;
};

}  // namespace tnxtest

#endif  // TOOLNEXUS_TESTS_SERVE_PROCESS_HPP

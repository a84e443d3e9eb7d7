// The server's log (server/src/common/log.hpp): one line per call whatever
// the text holds. A client's header or token can reach a message (a refused
// JWT's alg or kid at debug, a principal): control bytes must not forge a
// line of their own or drive the operator's terminal.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "common/log.hpp"
#include "test_util.hpp"

#include <cstdio>
#include <string>

#include <fcntl.h>
#include <unistd.h>

namespace {

// What `body` writes to stderr.
template <typename F>
std::string stderr_of(F body) {
  const auto path = tnx_test::temp_dir("tnx-log") / "stderr";
  std::fflush(stderr);
  const int saved = ::dup(2);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  REQUIRE(fd >= 0);
  ::dup2(fd, 2);
  ::close(fd);
  body();
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  return tnx_test::slurp(path);
}

}  // namespace

TEST_CASE("control bytes in a message are written as \\xHH: one line per call") {
  toolnexus::server_detail::Logger log(toolnexus::LogLevel::debug, nullptr);
  const std::string forged = std::string("bearer JWT refused: alg x\n2026-12-05T00:00:00Z toolnexus[info] FAKE") +
                             "\r\x1b[2J" + std::string(1, '\0') + "\x7f end";
  const std::string out = stderr_of([&] { log.debug(forged); });
  CHECK(out.find('\n') == out.size() - 1);  // the line's own end only
  CHECK(out.find("toolnexus[debug] bearer JWT refused: alg x\\x0a2026-12-05T00:00:00Z toolnexus[info] FAKE"
                 "\\x0d\\x1b[2J\\x00\\x7f end\n") != std::string::npos);
  // Text without control bytes is written as it is (UTF-8 included).
  const std::string plain = stderr_of([&] { log.info("Task 'ü-1' completed"); });
  CHECK(plain.find("toolnexus[info] Task 'ü-1' completed\n") != std::string::npos);
}

TEST_CASE("a sink gets the text as it is") {
  std::string got;
  toolnexus::server_detail::Logger log(toolnexus::LogLevel::info,
                                       [&](toolnexus::LogLevel, std::string_view t) { got = std::string(t); });
  log.info("a\nb");
  CHECK(got == "a\nb");
}

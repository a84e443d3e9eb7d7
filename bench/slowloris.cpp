// bench/slowloris.cpp: how fast a normal client is answered while many slow
// clients trickle their request headers (slowloris).
//
// Starts a server in-process (echo agent, memory store) with few request
// threads (--request-threads, limits.max_connections) and a header timeout
// (--header-timeout-ms, limits.header_timeout_ms), opens --slow connections
// that each send one header byte every 100 ms, and meanwhile sends ListTasks
// on one keep-alive connection, one request every 20 ms, for --seconds.
// Prints how many requests were answered and their latency p50/p99/max in
// ms. tests/server_http_test checks that these answers come while the slow
// clients are held (not starved); this program says how fast: a server whose
// slow clients cost it nothing answers in about a millisecond, one starved
// by them only after --header-timeout-ms.
//
//   slowloris [--slow 200] [--request-threads 8] [--header-timeout-ms 1500]
//             [--seconds 2.5]
#include "toolnexus/server.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

int connect_to(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0)
    throw std::runtime_error(std::string("connect: ") + std::strerror(errno));
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

void send_all(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n <= 0) throw std::runtime_error("send failed: the server closed the connection");
    bytes.remove_prefix(static_cast<std::size_t>(n));
  }
}

// One request/response on a keep-alive connection (Content-Length bodies).
void round_trip(int fd, const std::string &request) {
  send_all(fd, request);
  std::string in;
  char buf[16384];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) throw std::runtime_error("the server closed the normal client's connection");
    in.append(buf, static_cast<std::size_t>(n));
    const auto end = in.find("\r\n\r\n");
    if (end == std::string::npos) continue;
    if (in.compare(0, 12, "HTTP/1.1 200") != 0) throw std::runtime_error("answer: " + in.substr(0, end));
    const auto cl = in.find("Content-Length: ");
    if (cl == std::string::npos || cl > end) throw std::runtime_error("answer without Content-Length");
    if (in.size() >= end + 4 + std::strtoul(in.c_str() + cl + 16, nullptr, 10)) return;
  }
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(p * static_cast<double>(v.size())))];
}

}  // namespace

int main(int argc, char **argv) {
  int slow_clients = 200, request_threads = 8, header_timeout_ms = 1500;
  double seconds = 2.5;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 < argc && a == "--slow") slow_clients = std::atoi(argv[++i]);
    else if (i + 1 < argc && a == "--request-threads") request_threads = std::atoi(argv[++i]);
    else if (i + 1 < argc && a == "--header-timeout-ms") header_timeout_ms = std::atoi(argv[++i]);
    else if (i + 1 < argc && a == "--seconds") seconds = std::atof(argv[++i]);
    else {
      std::fprintf(stderr, "usage: slowloris [--slow 200] [--request-threads 8] [--header-timeout-ms 1500] "
                           "[--seconds 2.5]\n");
      return a == "--help" ? 0 : 2;
    }
  }
  if (slow_clients < 0 || request_threads < 1 || header_timeout_ms < 1 || seconds <= 0) {
    std::fprintf(stderr, "slowloris: --slow >= 0, --request-threads >= 1, --header-timeout-ms >= 1, --seconds > 0\n");
    return 2;
  }
  try {
    toolnexus::ServerOptions o;
    o.listen = "127.0.0.1:0";
    o.log_level = toolnexus::LogLevel::error;
    o.limits.max_connections = static_cast<unsigned>(request_threads);
    o.limits.header_timeout_ms = header_timeout_ms;
    auto server = toolnexus::serve(o);
    const int port = server.port();

    std::vector<int> slow;
    for (int i = 0; i < slow_clients; ++i) slow.push_back(connect_to(port));
    const std::string header = "POST / HTTP/1.1\r\nHost: x\r\nX-Pad: " + std::string(200, 'a');
    std::atomic<bool> done{false};
    std::thread trickle([&] {
      for (std::size_t pos = 0; pos < header.size() && !done; ++pos) {
        for (int fd : slow) (void)::send(fd, header.data() + pos, 1, MSG_NOSIGNAL);
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    });

    const std::string body = R"({"jsonrpc":"2.0","id":1,"method":"ListTasks","params":{}})";
    const std::string request = "POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
                                std::to_string(body.size()) + "\r\n\r\n" + body;
    const int fd = connect_to(port);
    std::vector<double> ms;
    const auto t0 = Clock::now();
    while (std::chrono::duration<double>(Clock::now() - t0).count() < seconds) {
      const auto s = Clock::now();
      round_trip(fd, request);
      ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - s).count());
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    done = true;
    trickle.join();
    ::close(fd);
    for (int s : slow) ::close(s);
    std::printf("slowloris: %d slow clients, %d request threads, header timeout %d ms\n", slow_clients,
                request_threads, header_timeout_ms);
    const double worst = ms.empty() ? 0 : *std::max_element(ms.begin(), ms.end());
    std::printf("ListTasks beside them: %zu answered in %.1f s; latency ms p50 %.2f p99 %.2f max %.2f\n", ms.size(),
                seconds, percentile(ms, 0.5), percentile(ms, 0.99), worst);
  } catch (const std::exception &e) {
    std::fprintf(stderr, "slowloris: %s\n", e.what());
    return 1;
  }
  return 0;
}

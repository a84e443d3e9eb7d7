// bench/stream_load.cpp: events/s to many concurrent SSE subscribers, and
// what they cost in memory.
//
// Starts a server in-process (memory store unless --store) whose executor
// ("ticker") waits for a start signal, then reports --events status messages
// (each saved: progress_interval_ms = 1), each carrying the time it was
// made, then completes. --tasks Tasks are created; --subscribers SSE
// connections (SubscribeToTask, JSON-RPC v1.0) are spread over them; once all
// are open the process RSS is read, the tickers start, and every frame of
// every stream is read (one epoll loop) until all streams end. Prints frames
// delivered per second over all subscribers, event-to-subscriber latency
// p50/p99/max, and RSS before and with the subscribers (the client's sockets
// and buffers are in the same process: a few KiB each).
//
//   stream_load [--subscribers 1000] [--tasks 10] [--events 200]
//               [--interval-us 1000] [--store SELECTOR]
#include "toolnexus/server.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

long rss_kib() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::atol(line.c_str() + 6);
  return -1;
}

std::atomic<bool> g_go{false};

class Ticker final : public toolnexus::AgentExecutor {
 public:
  Ticker(int events, int interval_us) : events_(events), interval_us_(interval_us) {}
  std::string name() const override { return "ticker"; }
  std::vector<toolnexus::AgentSkill> skills() const override { return {}; }
  toolnexus::ExecutionResult execute(const toolnexus::ExecutionContext &ctx) override {
    while (!g_go.load() && !ctx.cancel_requested) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    for (int i = 0; i < events_ && !ctx.cancel_requested; ++i) {
      ctx.progress.status("t" + std::to_string(now_ns()));
      if (interval_us_ > 0) std::this_thread::sleep_for(std::chrono::microseconds(interval_us_));
    }
    return toolnexus::ExecutionResult::completed("done");
  }

 private:
  int events_;
  int interval_us_;
};

int connect_to(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0)
    throw std::runtime_error(std::string("connect: ") + std::strerror(errno));
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

void send_all(int fd, const std::string &s) {
  std::size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n <= 0) throw std::runtime_error("send failed");
    off += static_cast<std::size_t>(n);
  }
}

// A blocking one-shot JSON-RPC call; returns the body.
std::string call(int port, const std::string &body) {
  const int fd = connect_to(port);
  send_all(fd, "POST / HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nConnection: close\r\nA2A-Version: 1.0\r\nContent-Length: " +
                   std::to_string(body.size()) + "\r\n\r\n" + body);
  std::string in;
  char buf[8192];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    in.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fd);
  const auto p = in.find("\r\n\r\n");
  return p == std::string::npos ? std::string() : in.substr(p + 4);
}

struct Sub {
  int fd = -1;
  std::string buf;
  bool done = false;
  long frames = 0;
};

}  // namespace

int main(int argc, char **argv) {
  int subscribers = 1000, tasks = 10, events = 200, interval_us = 1000;
  std::string store = "memory";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
      return argv[++i];
    };
    if (a == "--subscribers") subscribers = std::atoi(next().c_str());
    else if (a == "--tasks") tasks = std::atoi(next().c_str());
    else if (a == "--events") events = std::atoi(next().c_str());
    else if (a == "--interval-us") interval_us = std::atoi(next().c_str());
    else if (a == "--store") store = next();
    else {
      std::fprintf(stderr, "usage: stream_load [--subscribers N] [--tasks N] [--events N] [--interval-us N] [--store SEL]\n");
      return 2;
    }
  }
  toolnexus::ServerOptions o;
  o.listen = "127.0.0.1:0";
  o.store = store;
  o.executor = std::make_shared<Ticker>(events, interval_us);
  o.workers = static_cast<unsigned>(tasks);
  o.progress_interval_ms = 1;
  o.log_level = toolnexus::LogLevel::error;
  o.streams.max_streams = static_cast<std::size_t>(subscribers) + 16;
  auto server = toolnexus::serve(o);
  const int port = server.port();
  const long rss_idle = rss_kib();

  std::vector<std::string> ids;
  for (int t = 0; t < tasks; ++t) {
    const std::string r =
        call(port, R"({"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"role":"ROLE_USER",)"
                   R"("messageId":"m)" + std::to_string(t) +
                       R"(","parts":[{"text":"tick"}]},"configuration":{"returnImmediately":true}}})");
    const auto p = r.find(R"("id":")", r.find(R"("task")"));
    if (p == std::string::npos) throw std::runtime_error("SendMessage failed: " + r);
    ids.push_back(r.substr(p + 6, 36));
  }
  const int ep = ::epoll_create1(0);
  std::vector<Sub> subs(static_cast<std::size_t>(subscribers));
  for (int i = 0; i < subscribers; ++i) {
    Sub &s = subs[static_cast<std::size_t>(i)];
    s.fd = connect_to(port);
    const std::string body = R"({"jsonrpc":"2.0","id":)" + std::to_string(i) +
                             R"(,"method":"SubscribeToTask","params":{"id":")" + ids[static_cast<std::size_t>(i % tasks)] +
                             R"("}})";
    send_all(s.fd, "POST / HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nA2A-Version: 1.0\r\nContent-Length: " + std::to_string(body.size()) +
                       "\r\n\r\n" + body);
    epoll_event e{};
    e.events = EPOLLIN;
    e.data.u32 = static_cast<uint32_t>(i);
    ::epoll_ctl(ep, EPOLL_CTL_ADD, s.fd, &e);
  }
  for (int w = 0; w < 20000 && server.stats().open_streams < static_cast<std::size_t>(subscribers); ++w)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const std::size_t open = server.stats().open_streams;
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const long rss_subscribed = rss_kib();

  std::vector<double> latency_us;
  latency_us.reserve(static_cast<std::size_t>(subscribers) * static_cast<std::size_t>(events));
  const auto t0 = Clock::now();
  g_go = true;
  int remaining = subscribers;
  long frames = 0;
  long rss_peak = rss_subscribed;
  std::vector<epoll_event> evs(512);
  char buf[65536];
  auto last_rss = Clock::now();
  while (remaining > 0) {
    const int n = ::epoll_wait(ep, evs.data(), static_cast<int>(evs.size()), 10000);
    if (n <= 0) {
      std::fprintf(stderr, "stream_load: no progress for 10 s, %d streams still open\n", remaining);
      break;
    }
    const int64_t arrived = now_ns();
    for (int k = 0; k < n; ++k) {
      Sub &s = subs[evs[static_cast<std::size_t>(k)].data.u32];
      const ssize_t got = ::recv(s.fd, buf, sizeof buf, 0);
      if (got <= 0) {
        if (!s.done) --remaining;
        s.done = true;
        ::epoll_ctl(ep, EPOLL_CTL_DEL, s.fd, nullptr);
        continue;
      }
      s.buf.append(buf, static_cast<std::size_t>(got));
      // Frames end in a blank line; the stream in the last chunk "0\r\n\r\n".
      std::size_t pos;
      while ((pos = s.buf.find("\n\n")) != std::string::npos) {
        const std::string frame = s.buf.substr(0, pos);
        s.buf.erase(0, pos + 2);
        if (frame.find("data:") == std::string::npos) continue;
        ++s.frames;
        ++frames;
        // A ticker status ("t<ns>"); other texts (the client's own message,
        // "done") carry no send time.
        const auto t = frame.find(R"("text":"t)");
        if (t != std::string::npos && t + 9 < frame.size() && std::isdigit(static_cast<unsigned char>(frame[t + 9]))) {
          const int64_t sent = std::atoll(frame.c_str() + t + 9);
          if (sent > 0 && sent <= arrived) latency_us.push_back(static_cast<double>(arrived - sent) / 1000.0);
        }
      }
      if (!s.done && s.buf.find("0\r\n\r\n") != std::string::npos &&
          s.frames >= events + 1) {  // the last chunk of the response
        s.done = true;
        --remaining;
        ::epoll_ctl(ep, EPOLL_CTL_DEL, s.fd, nullptr);
      }
    }
    if (Clock::now() - last_rss > std::chrono::milliseconds(100)) {
      rss_peak = std::max(rss_peak, rss_kib());
      last_rss = Clock::now();
    }
  }
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  std::sort(latency_us.begin(), latency_us.end());
  auto pct = [&](double p) {
    if (latency_us.empty()) return 0.0;
    return latency_us[std::min(latency_us.size() - 1, static_cast<std::size_t>(p * static_cast<double>(latency_us.size())))];
  };
  std::printf("stream_load: %d subscribers (%zu streams open) on %d Tasks, %d status events each, store %s\n",
              subscribers, open, tasks, events, store.c_str());
  std::printf("  frames delivered: %ld in %.2f s = %.0f frames/s to subscribers (%.0f events/s made)\n", frames, secs,
              static_cast<double>(frames) / secs, static_cast<double>(tasks) * events / secs);
  std::printf("  event -> subscriber latency: p50 %.2f ms, p99 %.2f ms, max %.2f ms\n", pct(0.5) / 1000,
              pct(0.99) / 1000, latency_us.empty() ? 0.0 : latency_us.back() / 1000);
  std::printf("  RSS: %ld KiB idle, %ld KiB with the subscribers (%.1f KiB each), %ld KiB peak while streaming\n",
              rss_idle, rss_subscribed, static_cast<double>(rss_subscribed - rss_idle) / subscribers, rss_peak);
  for (Sub &s : subs) ::close(s.fd);
  ::close(ep);
  return 0;
}

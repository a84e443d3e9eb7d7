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
// With --replica (a store shared between processes: sqlite:, postgresql://)
// a second server opens the same store and the subscribers connect to it:
// the latency is then a replica's event as read on another replica (issue
// 20: through the store's change feed, or its poll without one).
// --cancels N then runs N Tasks on the first server that spin until told to
// stop, cancels each through the other replica (the same server without
// --replica) and prints how long the executor took to see it (p50/p99).
// --idle-seconds N first holds every stream open for N seconds on Tasks that
// do not change and prints what that cost: CPU of the process (servers and
// the idle client) and store calls per second, from each server's
// toolnexus_store_operations_total.
//
//   stream_load [--subscribers 1000] [--tasks 10] [--events 200]
//               [--interval-us 1000] [--store SELECTOR] [--replica]
//               [--idle-seconds N] [--cancels N]
#include "toolnexus/server.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
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

// The start signal for every ticker (a condition variable: a ticker that
// waited by polling would itself be the idle cost measured).
std::mutex g_go_mu;
std::condition_variable g_go_cv;
bool g_go = false;

void start_tickers() {
  {
    std::lock_guard<std::mutex> lock(g_go_mu);
    g_go = true;
  }
  g_go_cv.notify_all();
}

class Ticker final : public toolnexus::AgentExecutor {
 public:
  Ticker(int events, int interval_us) : events_(events), interval_us_(interval_us) {}
  std::string name() const override { return "ticker"; }
  /// A "spin" Task runs; when it saw its cancel (now_ns()).
  std::atomic<bool> spinning{false};
  std::atomic<int64_t> cancel_seen_ns{0};
  std::vector<toolnexus::AgentSkill> skills() const override { return {}; }
  toolnexus::ExecutionResult execute(const toolnexus::ExecutionContext &ctx) override {
    if (ctx.latest_text == "spin") {
      spinning = true;
      while (!ctx.cancel_requested) std::this_thread::sleep_for(std::chrono::microseconds(100));
      cancel_seen_ns = now_ns();
      return toolnexus::ExecutionResult::completed("stopped");
    }
    {
      std::unique_lock<std::mutex> lock(g_go_mu);
      while (!g_go && !ctx.cancel_requested) g_go_cv.wait_for(lock, std::chrono::milliseconds(100));
    }
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

/// A non-blocking SendMessage of `text` (message id `message_id`); returns
/// the new Task's id.
std::string start_task(int port, const std::string &text, const std::string &message_id) {
  const std::string r =
      call(port, R"({"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":{"role":"ROLE_USER",)"
                 R"("messageId":")" + message_id + R"(","parts":[{"text":")" + text +
                     R"("}]},"configuration":{"returnImmediately":true}}})");
  const auto p = r.find(R"("id":")", r.find(R"("task")"));
  if (p == std::string::npos) throw std::runtime_error("SendMessage failed: " + r);
  return r.substr(p + 6, 36);
}

/// The sum of every toolnexus_store_operations_total sample in the
/// Prometheus text of the admin listener on `port`.
double store_operations(int port) {
  const int fd = connect_to(port);
  send_all(fd, "GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
  std::string in;
  char buf[8192];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) in.append(buf, static_cast<std::size_t>(n));
  ::close(fd);
  double sum = 0;
  std::size_t at = 0;
  const std::string name = "\ntoolnexus_store_operations_total{";
  while ((at = in.find(name, at)) != std::string::npos) {
    const std::size_t sp = in.find(' ', in.find('}', at));
    sum += std::atof(in.c_str() + sp + 1);
    at = sp;
  }
  return sum;
}

double cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
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
  bool replica = false;
  int idle_seconds = 0;
  int cancels = 0;
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
    else if (a == "--replica") replica = true;
    else if (a == "--idle-seconds") idle_seconds = std::atoi(next().c_str());
    else if (a == "--cancels") cancels = std::atoi(next().c_str());
    else {
      std::fprintf(stderr,
                   "usage: stream_load [--subscribers N] [--tasks N] [--events N] [--interval-us N] [--store SEL] "
                   "[--replica] [--idle-seconds N] [--cancels N]\n");
      return 2;
    }
  }
  toolnexus::ServerOptions o;
  o.listen = "127.0.0.1:0";
  o.store = store;
  auto ticker = std::make_shared<Ticker>(events, interval_us);
  o.executor = ticker;
  o.workers = static_cast<unsigned>(tasks);
  o.progress_interval_ms = 1;
  o.log_level = toolnexus::LogLevel::error;
  o.streams.max_streams = static_cast<std::size_t>(subscribers) + 16;
  o.admin_listen = "127.0.0.1:0";
  auto server = toolnexus::serve(o);
  const int port = server.port();
  // The replica the subscribers read from: another server on the same store.
  std::unique_ptr<toolnexus::ServerHandle> second;
  if (replica) {
    toolnexus::ServerOptions r = o;
    r.executor = nullptr;
    second = std::make_unique<toolnexus::ServerHandle>(toolnexus::serve(r));
  }
  toolnexus::ServerHandle &reader = replica ? *second : server;
  const int sub_port = reader.port();
  const long rss_idle = rss_kib();

  std::vector<std::string> ids;
  for (int t = 0; t < tasks; ++t) {
    ids.push_back(start_task(port, "tick", "m" + std::to_string(t)));
  }
  const int ep = ::epoll_create1(0);
  std::vector<Sub> subs(static_cast<std::size_t>(subscribers));
  for (int i = 0; i < subscribers; ++i) {
    Sub &s = subs[static_cast<std::size_t>(i)];
    s.fd = connect_to(sub_port);
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
  for (int w = 0; w < 20000 && reader.stats().open_streams < static_cast<std::size_t>(subscribers); ++w)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const std::size_t open = reader.stats().open_streams;
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const long rss_subscribed = rss_kib();
  auto admin_port = [](const toolnexus::ServerHandle &h) {
    const std::string &u = h.admin_url();
    return std::atoi(u.c_str() + u.rfind(':') + 1);
  };
  if (idle_seconds > 0) {
    // Nothing changes: the streams wait on Tasks whose tickers wait for go.
    auto ops = [&] { return store_operations(admin_port(server)) + (second ? store_operations(admin_port(*second)) : 0); };
    const double ops0 = ops(), cpu0 = cpu_seconds();
    const auto i0 = Clock::now();
    std::this_thread::sleep_for(std::chrono::seconds(idle_seconds));
    const double secs = std::chrono::duration<double>(Clock::now() - i0).count();
    const double ops1 = ops(), cpu1 = cpu_seconds();
    std::printf("idle: %zu streams open on %d unchanging Tasks for %.1f s (%s): %.1f store calls/s, CPU %.2f%% of a core "
                "(servers and client)\n",
                open, tasks, secs, replica ? "2 replicas" : "1 server", (ops1 - ops0) / secs,
                100.0 * (cpu1 - cpu0) / secs);
  }

  std::vector<double> latency_us;
  latency_us.reserve(static_cast<std::size_t>(subscribers) * static_cast<std::size_t>(events));
  const auto t0 = Clock::now();
  start_tickers();
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
  std::printf("stream_load: %d subscribers (%zu streams open) on %d Tasks, %d status events each, store %s%s\n",
              subscribers, open, tasks, events, store.c_str(),
              replica ? ", events made on one replica and read on another" : "");
  std::printf("  frames delivered: %ld in %.2f s = %.0f frames/s to subscribers (%.0f events/s made)\n", frames, secs,
              static_cast<double>(frames) / secs, static_cast<double>(tasks) * events / secs);
  std::printf("  event -> subscriber latency: p50 %.2f ms, p99 %.2f ms, max %.2f ms\n", pct(0.5) / 1000,
              pct(0.99) / 1000, latency_us.empty() ? 0.0 : latency_us.back() / 1000);
  std::printf("  RSS: %ld KiB idle, %ld KiB with the subscribers (%.1f KiB each), %ld KiB peak while streaming\n",
              rss_idle, rss_subscribed, static_cast<double>(rss_subscribed - rss_idle) / subscribers, rss_peak);
  for (Sub &s : subs) ::close(s.fd);
  ::close(ep);

  std::vector<double> cancel_ms;
  for (int c = 0; c < cancels; ++c) {
    ticker->spinning = false;
    ticker->cancel_seen_ns = 0;
    const std::string id = start_task(port, "spin", "spin" + std::to_string(c));
    while (!ticker->spinning) std::this_thread::sleep_for(std::chrono::microseconds(200));
    // "working" must be stored for the other replica to cancel it as running.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const int64_t asked = now_ns();
    const std::string cr = call(sub_port, R"({"jsonrpc":"2.0","id":2,"method":"CancelTask","params":{"id":")" + id + R"("}})");
    if (cr.find("TASK_STATE_CANCELED") == std::string::npos) throw std::runtime_error("CancelTask failed: " + cr);
    while (ticker->cancel_seen_ns.load() == 0) std::this_thread::sleep_for(std::chrono::microseconds(100));
    cancel_ms.push_back(static_cast<double>(ticker->cancel_seen_ns.load() - asked) / 1e6);
  }
  if (!cancel_ms.empty()) {
    std::sort(cancel_ms.begin(), cancel_ms.end());
    auto at = [&](double q) {
      return cancel_ms[std::min(cancel_ms.size() - 1, static_cast<std::size_t>(q * static_cast<double>(cancel_ms.size())))];
    };
    std::printf("  cancel (CancelTask sent to %s until the executor saw it), %zu runs: p50 %.2f ms, p99 %.2f ms, max "
                "%.2f ms\n",
                replica ? "the other replica" : "the same server", cancel_ms.size(), at(0.5), at(0.99), cancel_ms.back());
  }
  return 0;
}

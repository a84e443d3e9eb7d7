// bench/server_load.cpp: load program for `toolnexus serve`.
//
// Drives GetTask and SendMessage (JSON-RPC over HTTP/1.1 keep-alive) with N
// connections spread over a few client threads (each thread runs its own
// epoll loop over non-blocking sockets, one request in flight per
// connection), then prints requests/s and p50/p99 latency per method.
//
// Without --url it starts a server in-process (echo agent; the memory store,
// or --store SELECTOR, e.g. a fresh sqlite:/mnt/disk/tasks.db to measure
// durable SendMessage against store_bench's durable saves) on a free
// loopback port; with --url it targets a running server. --url may be
// repeated (or given a comma-separated list) to load several replicas sharing
// one store: connection i goes to URL i mod N, the Tasks GetTask reads are
// created round-robin over the URLs (so most reads cross replicas), and the
// pending check after SendMessage asks the first URL.
//
//   server_load [--url http://127.0.0.1:8080/ [--url ...]] [--connections 64]
//               [--threads 2] [--seconds 5] [--warmup 1]
//               [--method all|get|send] [--server-threads N] [--workers N]
//               [--store SELECTOR] [--dialect both|0.3|1.0] [--blocking]
//               [--requests N] [--list-page]
//
// --requests N: the SendMessage phase sends exactly N requests (no warm-up,
// no time limit) and reports their rate: how bench/million.py fills a memory
// store with N Tasks. --list-page: --method get times ListTasks pages of 50
// (newest first, the caller's Tasks; v1.0 with --dialect 1.0) instead of
// GetTask.
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#ifndef BENCH_NO_SERVER
#include "toolnexus/server.hpp"
#endif

namespace {

using Clock = std::chrono::steady_clock;

struct Target {
  std::string host = "127.0.0.1";
  int port = 0;
  std::string host_header;
};

Target parse_url(const std::string &url) {
  Target t;
  std::string rest = url;
  const std::string scheme = "http://";
  if (rest.compare(0, scheme.size(), scheme) != 0) throw std::invalid_argument("--url must start with http://");
  rest = rest.substr(scheme.size());
  const auto slash = rest.find('/');
  std::string hostport = slash == std::string::npos ? rest : rest.substr(0, slash);
  t.host_header = hostport;
  const auto colon = hostport.rfind(':');
  if (colon == std::string::npos) {
    t.host = hostport;
    t.port = 80;
  } else {
    t.host = hostport.substr(0, colon);
    t.port = std::atoi(hostport.c_str() + colon + 1);
  }
  if (!t.host.empty() && t.host.front() == '[') t.host = t.host.substr(1, t.host.size() - 2);
  return t;
}

int connect_to(const Target &t) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo *res = nullptr;
  const std::string port = std::to_string(t.port);
  if (getaddrinfo(t.host.c_str(), port.c_str(), &hints, &res) != 0 || res == nullptr)
    throw std::runtime_error("cannot resolve " + t.host);
  const int fd = ::socket(res->ai_family, res->ai_socktype, res->ai_protocol);
  if (fd < 0 || ::connect(fd, res->ai_addr, res->ai_addrlen) != 0) {
    freeaddrinfo(res);
    throw std::runtime_error("cannot connect to " + t.host + ":" + port + ": " + std::strerror(errno));
  }
  freeaddrinfo(res);
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

// The dialect requests speak (--dialect): "0.3" (no A2A-Version header,
// v0.3 shapes) or "1.0" (A2A-Version: 1.0, v1.0 shapes); and whether
// SendMessage blocks until the Task is done (--blocking) or answers at once.
std::string g_dialect = "0.3";
bool g_blocking = false;
bool g_list_page = false;
// --requests: SendMessage requests left to send when g_limited (else the
// phase is timed).
bool g_limited = false;
std::atomic<int64_t> g_budget{0};

std::string http_post(const Target &t, const std::string &body) {
  return "POST / HTTP/1.1\r\nHost: " + t.host_header +
         (g_dialect == "1.0" ? "\r\nA2A-Version: 1.0" : "") +
         "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\n\r\n" + body;
}

// Blocking request on a fresh connection (setup only).
std::string simple_post(const Target &t, const std::string &body) {
  const int fd = connect_to(t);
  const std::string req = http_post(t, body);
  if (::send(fd, req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size())) {
    ::close(fd);
    throw std::runtime_error("send failed");
  }
  std::string in;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    in.append(buf, static_cast<size_t>(n));
    const auto hdr_end = in.find("\r\n\r\n");
    if (hdr_end == std::string::npos) continue;
    const auto cl = in.find("Content-Length: ");
    if (cl == std::string::npos || cl > hdr_end) continue;
    const size_t len = std::strtoul(in.c_str() + cl + 16, nullptr, 10);
    if (in.size() >= hdr_end + 4 + len) {
      ::close(fd);
      return in.substr(hdr_end + 4, len);
    }
  }
  ::close(fd);
  throw std::runtime_error("no response");
}

// Extracts the Task id from a SendMessage answer: "result":{"id":"..."}
// (v0.3) or "result":{"task":{"id":"..."}} (v1.0).
std::string task_id_of(const std::string &body) {
  const auto r = body.find("\"result\"");
  if (r == std::string::npos) throw std::runtime_error("no result in: " + body.substr(0, 300));
  const auto k = body.find("\"id\":\"", r);
  if (k == std::string::npos) throw std::runtime_error("no task id in: " + body.substr(0, 300));
  const auto start = k + 6;
  return body.substr(start, body.find('"', start) - start);
}

std::string send_body(uint64_t n) {
  if (g_dialect == "1.0")
    return R"({"jsonrpc":"2.0","id":)" + std::to_string(n) +
           R"(,"method":"SendMessage","params":{"configuration":{"returnImmediately":)" +
           (g_blocking ? "false" : "true") + R"(},"message":{"role":"ROLE_USER","messageId":"m-)" +
           std::to_string(n) + R"(","parts":[{"text":"hello from the load program"}]}}})";
  return R"({"jsonrpc":"2.0","id":)" + std::to_string(n) +
         R"(,"method":"SendMessage","params":{"configuration":{"blocking":)" + (g_blocking ? "true" : "false") +
         R"(},"message":{"role":"user","messageId":"m-)" + std::to_string(n) +
         R"(","parts":[{"kind":"text","text":"hello from the load program"}]}}})";
}

std::string get_body(uint64_t n, const std::string &id) {
  if (g_list_page)
    return R"({"jsonrpc":"2.0","id":)" + std::to_string(n) + R"(,"method":"ListTasks","params":{"pageSize":50}})";
  return R"({"jsonrpc":"2.0","id":)" + std::to_string(n) + R"(,"method":"GetTask","params":{"id":")" +
         id + R"("}})";
}

struct Conn {
  int fd = -1;
  const Target *target = nullptr;
  std::string out;
  size_t sent = 0;
  std::string in;
  Clock::time_point started;
  uint64_t seq = 0;
  bool idle = false;  // --requests used up: sends nothing more
};

struct ThreadResult {
  std::vector<uint32_t> latencies_us;  // measured phase only
  uint64_t ok = 0;
  uint64_t errors = 0;
  std::string first_error;
};

// One client thread: `conns` connections, one request in flight each, until
// `stop`. Requests completed after `measure` turned true are counted.
void client_thread(const std::vector<Target> &targets, int first_conn, int conns, bool send_message,
                   const std::vector<std::string> *ids, uint64_t seed, std::atomic<bool> &measure,
                   std::atomic<bool> &stop, ThreadResult &res) {
  const int ep = ::epoll_create1(0);
  std::vector<Conn> cs(static_cast<size_t>(conns));
  uint64_t counter = seed;
  int active = conns;
  // False (and the connection idle) when --requests is used up.
  auto next_request = [&](Conn &c) -> bool {
    if (c.idle) return false;
    if (g_limited && g_budget.fetch_sub(1) <= 0) {
      c.out.clear();
      c.sent = 0;
      c.idle = true;
      --active;
      return false;
    }
    ++counter;
    const std::string body =
        send_message ? send_body(counter) : get_body(counter, (*ids)[counter % ids->size()]);
    c.out = http_post(*c.target, body);
    c.sent = 0;
    c.in.clear();
    c.started = Clock::now();
    return true;
  };
  auto flush = [&](Conn &c) -> bool {
    while (c.sent < c.out.size()) {
      const ssize_t n = ::send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
      if (n < 0) return errno == EAGAIN;
      c.sent += static_cast<size_t>(n);
    }
    return true;
  };
  for (size_t i = 0; i < cs.size(); ++i) {
    Conn &c = cs[i];
    c.target = &targets[(static_cast<size_t>(first_conn) + i) % targets.size()];
    c.fd = connect_to(*c.target);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = i;
    ::epoll_ctl(ep, EPOLL_CTL_ADD, c.fd, &ev);
    if (next_request(c)) flush(c);
  }
  res.latencies_us.reserve(1 << 20);
  std::vector<epoll_event> events(static_cast<size_t>(conns));
  char buf[65536];
  while (!stop.load(std::memory_order_relaxed) && active > 0) {
    const int n = ::epoll_wait(ep, events.data(), conns, 100);
    for (int e = 0; e < n; ++e) {
      Conn &c = cs[events[static_cast<size_t>(e)].data.u64];
      const ssize_t r = ::recv(c.fd, buf, sizeof buf, MSG_DONTWAIT);
      if (r <= 0) {
        if (r < 0 && errno == EAGAIN) continue;
        if (c.idle) {
          ::epoll_ctl(ep, EPOLL_CTL_DEL, c.fd, nullptr);
          continue;
        }
        ++res.errors;
        if (res.first_error.empty()) res.first_error = "connection closed by the server";
        ::epoll_ctl(ep, EPOLL_CTL_DEL, c.fd, nullptr);
        ::close(c.fd);
        c.fd = connect_to(*c.target);
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.u64 = static_cast<uint64_t>(&c - cs.data());
        ::epoll_ctl(ep, EPOLL_CTL_ADD, c.fd, &ev);
        if (next_request(c)) flush(c);
        continue;
      }
      c.in.append(buf, static_cast<size_t>(r));
      const auto hdr_end = c.in.find("\r\n\r\n");
      if (hdr_end == std::string::npos) continue;
      const auto cl = c.in.find("Content-Length: ");
      if (cl == std::string::npos || cl > hdr_end) continue;
      const size_t len = std::strtoul(c.in.c_str() + cl + 16, nullptr, 10);
      if (c.in.size() < hdr_end + 4 + len) continue;
      const auto us = std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - c.started).count();
      const bool ok = c.in.compare(0, 12, "HTTP/1.1 200") == 0 &&
                      c.in.find("\"result\"", hdr_end) != std::string::npos;
      if (measure.load(std::memory_order_relaxed)) {
        if (ok) {
          ++res.ok;
          res.latencies_us.push_back(static_cast<uint32_t>(us));
        } else {
          ++res.errors;
          if (res.first_error.empty()) res.first_error = c.in.substr(0, 400);
        }
      }
      if (next_request(c)) flush(c);
    }
  }
  for (Conn &c : cs) ::close(c.fd);
  ::close(ep);
}

struct Report {
  double rps = 0;
  double p50_ms = 0;
  double p99_ms = 0;
  uint64_t ok = 0;
  uint64_t errors = 0;
};

Report run_phase(const std::vector<Target> &t, int connections, int threads, bool send_message,
                 const std::vector<std::string> *ids, double warmup_s, double seconds) {
  std::atomic<bool> measure{false};
  std::atomic<bool> stop{false};
  std::vector<ThreadResult> results(static_cast<size_t>(threads));
  std::vector<std::thread> ts;
  int first_conn = 0;
  for (int i = 0; i < threads; ++i) {
    const int n = connections / threads + (i < connections % threads ? 1 : 0);
    ts.emplace_back(client_thread, std::cref(t), first_conn, n, send_message, ids,
                    static_cast<uint64_t>(i) << 40, std::ref(measure), std::ref(stop),
                    std::ref(results[static_cast<size_t>(i)]));
    first_conn += n;
  }
  double elapsed = 0;
  if (g_limited) {
    // --requests: every answer counts; the threads end when it is used up.
    const auto start = Clock::now();
    measure = true;
    for (auto &th : ts) th.join();
    elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  } else {
    std::this_thread::sleep_for(std::chrono::duration<double>(warmup_s));
    const auto start = Clock::now();
    measure = true;
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    measure = false;
    elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    stop = true;
    for (auto &th : ts) th.join();
  }
  Report rep;
  std::vector<uint32_t> all;
  for (auto &r : results) {
    rep.ok += r.ok;
    rep.errors += r.errors;
    all.insert(all.end(), r.latencies_us.begin(), r.latencies_us.end());
    if (!r.first_error.empty()) std::fprintf(stderr, "first error: %s\n", r.first_error.c_str());
  }
  std::sort(all.begin(), all.end());
  rep.rps = static_cast<double>(rep.ok) / elapsed;
  if (!all.empty()) {
    rep.p50_ms = all[all.size() / 2] / 1000.0;
    rep.p99_ms = all[std::min(all.size() - 1, all.size() * 99 / 100)] / 1000.0;
  }
  return rep;
}

void print(const char *name, const Report &r, int connections) {
  std::printf("%-12s %9.0f req/s   p50 %7.3f ms   p99 %7.3f ms   (%llu ok, %llu errors, %d connections)\n",
              name, r.rps, r.p50_ms, r.p99_ms, static_cast<unsigned long long>(r.ok),
              static_cast<unsigned long long>(r.errors), connections);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char **argv) {
  std::vector<std::string> urls;
  int connections = 64;
  int threads = 2;
  double seconds = 5;
  double warmup = 1;
  std::string method = "all";
  std::string dialects = "both";
  unsigned server_threads = 0;
  unsigned workers = 0;
  std::string store = "memory";
  long long requests = -1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--url") {
      const std::string v = value();
      for (size_t b = 0; b <= v.size();) {
        const size_t e = std::min(v.find(',', b), v.size());
        if (e > b) urls.push_back(v.substr(b, e - b));
        b = e + 1;
      }
    }
    else if (a == "--connections") connections = std::atoi(value().c_str());
    else if (a == "--threads") threads = std::atoi(value().c_str());
    else if (a == "--seconds") seconds = std::atof(value().c_str());
    else if (a == "--warmup") warmup = std::atof(value().c_str());
    else if (a == "--method") method = value();
    else if (a == "--dialect") dialects = value();
    else if (a == "--blocking") g_blocking = true;
    else if (a == "--list-page") g_list_page = true;
    else if (a == "--requests") requests = std::atoll(value().c_str());
    else if (a == "--server-threads") server_threads = static_cast<unsigned>(std::atoi(value().c_str()));
    else if (a == "--workers") workers = static_cast<unsigned>(std::atoi(value().c_str()));
    else if (a == "--store") store = value();
    else {
      std::fprintf(stderr,
                   "usage: server_load [--url http://HOST:PORT/[,...]]... [--connections 64] [--threads 2]\n"
                   "                   [--seconds 5] [--warmup 1] [--method all|get|send]\n"
                   "                   [--dialect both|0.3|1.0] [--blocking]\n"
                   "                   [--server-threads N] [--workers N] [--store SELECTOR]\n"
                   "                   [--requests N] [--list-page]\n");
      return a == "--help" ? 0 : 2;
    }
  }
  if (connections < 1 || threads < 1 || threads > connections) {
    std::fprintf(stderr, "need 1 <= --threads <= --connections\n");
    return 2;
  }
  try {
#ifndef BENCH_NO_SERVER
    std::unique_ptr<toolnexus::ServerHandle> server;
    if (urls.empty()) {
      toolnexus::ServerOptions opts;
      opts.listen = "127.0.0.1:0";
      opts.store = store;
      opts.agent = "echo";
      if (server_threads != 0) opts.limits.max_connections = server_threads;
      if (workers != 0) opts.workers = workers;
      opts.log_level = toolnexus::LogLevel::warn;
      server = std::make_unique<toolnexus::ServerHandle>(toolnexus::serve(std::move(opts)));
      urls.push_back(server->url());
      std::printf("in-process server at %s (store %s, echo agent)\n", urls[0].c_str(), store.c_str());
    }
#else
    (void)server_threads;
    (void)workers;
    (void)store;
    if (urls.empty()) urls.push_back("http://127.0.0.1:18080/");
#endif
    std::vector<Target> targets;
    for (const std::string &u : urls) targets.push_back(parse_url(u));
    const Target &t = targets[0];
    std::printf("%d keep-alive connections over %d client threads, %.1f s per method (+%.1f s warm-up)\n",
                connections, threads, seconds, warmup);
    if (targets.size() > 1) {
      std::printf("%zu servers, connections round-robin:", targets.size());
      for (const std::string &u : urls) std::printf(" %s", u.c_str());
      std::printf("\n");
    }
    std::vector<std::string> dialect_list;
    if (dialects == "both") dialect_list = {"0.3", "1.0"};
    else if (dialects == "0.3" || dialects == "1.0") dialect_list = {dialects};
    else throw std::invalid_argument("--dialect must be both, 0.3 or 1.0");
    std::printf("SendMessage %s\n", g_blocking ? "blocks until each Task is done (--blocking)"
                                               : "answers at once (blocking:false / returnImmediately:true)");
    for (const std::string &dialect : dialect_list) {
    g_dialect = dialect;
    std::printf("-- A2A %s (%s)\n", dialect.c_str(), dialect == "1.0" ? "A2A-Version: 1.0" : "no A2A-Version header");
    if (method == "all" || method == "get") {
      std::vector<std::string> ids;
      for (uint64_t i = 0; i < 256; ++i)
        ids.push_back(task_id_of(simple_post(targets[i % targets.size()], send_body(i))));
      print(g_list_page ? "ListTasks" : "GetTask",
            run_phase(targets, connections, threads, false, &ids, warmup, seconds), connections);
    }
    if (method == "all" || method == "send") {
      if (requests >= 0) {
        g_limited = true;
        g_budget = requests;
      }
      print("SendMessage", run_phase(targets, connections, threads, true, nullptr, warmup, seconds), connections);
      // The worker pool must keep up: time until no Task is submitted/working.
      const auto start = Clock::now();
      auto pending = [&] {
        uint64_t n = 0;
        for (const char *state : {"submitted", "working"}) {
          const std::string body = simple_post(
              t, std::string(R"({"jsonrpc":"2.0","id":0,"method":"ListTasks","params":{"pageSize":1,"status":")") +
                     state + R"("}})");
          const auto k = body.find("\"totalSize\":");
          if (k != std::string::npos) n += std::strtoull(body.c_str() + k + 12, nullptr, 10);
        }
        return n;
      };
      const uint64_t left = pending();
      uint64_t now_left = left;
      while (now_left != 0 && Clock::now() - start < std::chrono::seconds(30)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        now_left = pending();
      }
      if (left == 0)
        std::printf("after SendMessage: every Task already completed (the workers kept up)\n");
      else
        std::printf("after SendMessage: %llu Task(s) queued or working; %s %.0f ms later\n",
                    static_cast<unsigned long long>(left), now_left == 0 ? "all completed" : "STILL PENDING",
                    std::chrono::duration<double, std::milli>(Clock::now() - start).count());
    }
    }
#ifndef BENCH_NO_SERVER
    if (server) server->stop();
#endif
  } catch (const std::exception &e) {
    std::fprintf(stderr, "server_load: %s\n", e.what());
    return 1;
  }
  return 0;
}

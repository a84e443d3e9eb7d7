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
//               [--requests N] [--list-page] [--no-idempotency]
//
// --no-idempotency: the in-process server runs with idempotency.enabled
// false (random Task ids; a blocking send saves its new Task once, with its
// outcome), to compare with the default (saved create-only before the run).
// --requests N: the SendMessage phase sends exactly N requests (no warm-up,
// no time limit) and reports their rate: how bench/million.py fills a memory
// store with N Tasks. --list-page: --method get times ListTasks pages of 50
// (newest first, the caller's Tasks; v1.0 with --dialect 1.0) instead of
// GetTask.
//
//   server_load --method reads [--store SELECTOR] [--tasks N] [--reps N]
//
// --method reads (in-process server only): the A2A layer's cost over the
// store's own. Saves N (default 10,000) echo-shaped Tasks into the store
// (SELECTOR may contain {tmp}, a fresh temporary directory), serves that
// store, then on one keep-alive connection, one request at a time, times
// ListTasks (page of 50, the first page, as a client with no filter asks)
// and GetTask in each dialect beside what the store itself takes for the
// same answer in-process (list 50 + count; get) and the floor (HTTP and
// JSON-RPC: GetTask of a missing Task), and prints the ratios (issue 21: ListTasks v1.0 at
// most 3x the store's list on sqlite: and memory, 4x on file:).
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/resource.h>
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
#include "toolnexus/registry.hpp"
#include "toolnexus/server.hpp"

#include <filesystem>
#include <functional>
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


#ifndef BENCH_NO_SERVER
// ---------------------------------------------------------------------------
// --method reads
// ---------------------------------------------------------------------------

// One keep-alive connection, one request at a time (blocking).
class KeepAlive {
 public:
  explicit KeepAlive(const Target &t) : t_(t), fd_(connect_to(t)) {}
  ~KeepAlive() { ::close(fd_); }
  KeepAlive(const KeepAlive &) = delete;
  KeepAlive &operator=(const KeepAlive &) = delete;

  // Sends `request` (a whole HTTP request) and returns the response body;
  // throws unless the status is 200.
  std::string round_trip(const std::string &request) {
    if (::send(fd_, request.data(), request.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(request.size()))
      throw std::runtime_error("send failed");
    in_.clear();
    char buf[65536];
    for (;;) {
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) throw std::runtime_error("connection closed");
      in_.append(buf, static_cast<size_t>(n));
      const auto hdr_end = in_.find("\r\n\r\n");
      if (hdr_end == std::string::npos) continue;
      const auto cl = in_.find("Content-Length: ");
      if (cl == std::string::npos || cl > hdr_end) continue;
      const size_t len = std::strtoul(in_.c_str() + cl + 16, nullptr, 10);
      if (in_.size() < hdr_end + 4 + len) continue;
      if (in_.compare(0, 12, "HTTP/1.1 200") != 0) throw std::runtime_error("not 200: " + in_.substr(0, 300));
      return in_.substr(hdr_end + 4, len);
    }
  }

 private:
  const Target &t_;
  int fd_;
  std::string in_;
};

// An echo-shaped stored Task (what the echo agent leaves: the user's
// message and the agent's answer in the history, one artifact), ~900 bytes
// with server-shaped 36-character ids.
std::string echo_task_json(size_t i) {
  char id[64], ctx[64];
  std::snprintf(id, sizeof id, "%08zx-7a5c-4%03zx-8%03zx-%012zx", i * 2654435761u % 0xffffffffu, i & 0xfff,
                (i >> 12) & 0xfff, i);
  std::snprintf(ctx, sizeof ctx, "c0c0c0c0-0000-4%03zx-8000-%012zx", (i % 1000) & 0xfff, i % 1000);
  const std::string ts = toolnexus::format_timestamp(1767225600000000LL + static_cast<int64_t>(i) * 1000LL);
  const std::string n = std::to_string(i);
  return std::string(R"({"id":")") + id + R"(","contextId":")" + ctx +
         R"(","kind":"task","status":{"state":"completed","timestamp":")" + ts +
         R"("},"history":[{"role":"user","messageId":"m-)" + n + R"(","kind":"message","taskId":")" + id +
         R"(","contextId":")" + ctx + R"(","parts":[{"kind":"text","text":"hello from the load program"}]},)" +
         R"({"role":"agent","messageId":"r-)" + n + R"(","kind":"message","taskId":")" + id + R"(","contextId":")" +
         ctx + R"(","parts":[{"kind":"text","text":"hello from the load program"}]}],"artifacts":[{"artifactId":"a-)" +
         n + R"(","name":"echo","parts":[{"kind":"text","text":"hello from the load program"}]}]})";
}

// Microseconds of CPU (user + system) this process has used, every thread.
double process_cpu_us() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e6 +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec);
}

// Of `reps` runs of `f` (after reps/10 warm-up runs): p50 and mean wall
// time, and the process's CPU time per run (server and client threads: on a
// busy machine the wall time of one request at a time is mostly waiting to
// be scheduled, the CPU time is what the work costs). Microseconds.
struct Timing {
  double p50_us = 0, mean_us = 0, cpu_us = 0;
};
Timing time_it(int reps, const std::function<void()> &f) {
  for (int i = 0; i < reps / 10; ++i) f();
  std::vector<double> t;
  t.reserve(static_cast<size_t>(reps));
  const double cpu0 = process_cpu_us();
  for (int i = 0; i < reps; ++i) {
    const auto a = Clock::now();
    f();
    t.push_back(std::chrono::duration<double, std::micro>(Clock::now() - a).count());
  }
  Timing r;
  r.cpu_us = (process_cpu_us() - cpu0) / reps;
  std::sort(t.begin(), t.end());
  r.p50_us = t[t.size() / 2];
  for (double x : t) r.mean_us += x;
  r.mean_us /= static_cast<double>(t.size());
  return r;
}

void print_timing(const char *what, const Timing &t) {
  std::printf("  %-50s p50 %8.1f us   mean %8.1f us   cpu %8.1f us\n", what, t.p50_us, t.mean_us, t.cpu_us);
  std::fflush(stdout);
}

std::string expand_tmp(std::string sel, std::vector<std::filesystem::path> &made) {
  if (sel.find("{tmp}") == std::string::npos) return sel;
  std::string dir = (std::filesystem::temp_directory_path() / "tnx-reads-XXXXXX").string();
  if (::mkdtemp(dir.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  made.emplace_back(dir);
  for (size_t p; (p = sel.find("{tmp}")) != std::string::npos;) sel.replace(p, 5, dir);
  return sel;
}

int reads_bench(const std::string &selector, size_t n, int reps) {
  std::vector<std::filesystem::path> made;
  const std::string sel = expand_tmp(selector, made);
  auto store = toolnexus::resolve_store(sel);
  std::vector<std::string> ids;
  {
    const auto t0 = Clock::now();
    bool batches = true;
    for (size_t base = 0; base < n; base += 1000) {
      std::vector<toolnexus::Task> tasks;
      for (size_t i = base; i < std::min(n, base + 1000); ++i) tasks.push_back(toolnexus::Task::parse(echo_task_json(i)));
      if (batches) {
        std::vector<toolnexus::BatchItem> items(tasks.size());
        for (size_t k = 0; k < tasks.size(); ++k) items[k].task = &tasks[k];
        try {
          store->save_batch(items);
        } catch (const toolnexus::StoreError &e) {
          if (e.code() != toolnexus::Status::unsupported) throw;
          batches = false;
        }
      }
      if (!batches) {  // a store without batches (file:): 8 threads of saves
        std::atomic<size_t> next{0};
        std::vector<std::thread> ts;
        for (int t = 0; t < 8; ++t)
          ts.emplace_back([&] {
            for (size_t k; (k = next.fetch_add(1)) < tasks.size();) store->save(tasks[k]);
          });
        for (auto &t : ts) t.join();
      }
      for (const auto &t : tasks) ids.emplace_back(t.id());
    }
    std::printf("store %s: %zu echo-shaped Tasks saved in %.1f s\n", sel.c_str(), n,
                std::chrono::duration<double>(Clock::now() - t0).count());
  }
  toolnexus::ServerOptions opts;
  opts.listen = "127.0.0.1:0";
  opts.store = store;
  opts.agent = "echo";
  opts.log_level = toolnexus::LogLevel::warn;
  auto server = std::make_unique<toolnexus::ServerHandle>(toolnexus::serve(std::move(opts)));
  const Target target = parse_url(server->url());
  KeepAlive conn(target);
  std::printf("one keep-alive connection, one request at a time, %d runs each (+%d warm-up)\n", reps, reps / 10);

  toolnexus::ListQuery q;
  q.page_size = 50;
  q.deliver_corrupt = true;
  const Timing store_list = time_it(reps, [&] {
    const auto page = store->list(q);
    if (page.records.size() != std::min<size_t>(50, n) || store->count(q) != n) throw std::runtime_error("list");
  });
  print_timing("store: list 50 + count (in-process)", store_list);
  size_t k = 0;
  const Timing store_get = time_it(reps, [&] {
    if (!store->get(ids[k++ % ids.size()])) throw std::runtime_error("get");
  });
  print_timing("store: get (in-process)", store_get);
  // The floor: a JSON-RPC request whose method does nothing but one store
  // get that finds nothing (answered -32001 TaskNotFound, HTTP 200).
  const std::string missing =
      http_post(target, R"({"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{"id":"no-such-task"}})");
  const Timing floor = time_it(reps, [&] {
    if (conn.round_trip(missing).find("-32001") == std::string::npos) throw std::runtime_error("floor");
  });
  print_timing("floor: GetTask of a missing Task (HTTP, JSON-RPC)", floor);

  struct Row {
    const char *dialect;
    Timing list, get;
  };
  std::vector<Row> rows;
  for (const char *d : {"1.0", "0.3"}) {
    g_dialect = d;
    const bool v1 = g_dialect == "1.0";
    const std::string list_req = http_post(
        target, std::string(R"({"jsonrpc":"2.0","id":1,"method":")") + (v1 ? "ListTasks" : "tasks/list") +
                    R"(","params":{"pageSize":50}})");
    Row r{d, {}, {}};
    r.list = time_it(reps, [&] {
      const std::string body = conn.round_trip(list_req);
      if (body.rfind("\"totalSize\":" + std::to_string(n)) == std::string::npos)  // at the end
        throw std::runtime_error("ListTasks: " + body.substr(0, 300));
    });
    const std::string list_label =
        "ListTasks, A2A " + std::string(d) + ", 50 (" + std::to_string(conn.round_trip(list_req).size()) + " B)";
    print_timing(list_label.c_str(), r.list);
    std::vector<std::string> gets;
    for (size_t i = 0; i < 256 && i < ids.size(); ++i)
      gets.push_back(http_post(target, std::string(R"({"jsonrpc":"2.0","id":1,"method":")") +
                                           (v1 ? "GetTask" : "tasks/get") + R"(","params":{"id":")" + ids[i] +
                                           R"("}})"));
    k = 0;
    r.get = time_it(reps, [&] {
      const std::string body = conn.round_trip(gets[k++ % gets.size()]);
      if (body.find("\"result\"") == std::string::npos) throw std::runtime_error("GetTask: " + body.substr(0, 300));
    });
    print_timing(("GetTask, A2A " + std::string(d)).c_str(), r.get);
    rows.push_back(r);
  }
  std::printf("ratios (\"less the floor\" takes the floor off the A2A side):\n");
  for (const Row &r : rows) {
    std::printf("  ListTasks A2A %s / store list+count: wall p50 %.2fx, cpu %.2fx; less the floor: wall %.2fx, "
                "cpu %.2fx (goal <= 3 on sqlite: and memory, <= 4 on file:)\n",
                r.dialect, r.list.p50_us / store_list.p50_us, r.list.cpu_us / store_list.cpu_us,
                (r.list.p50_us - floor.p50_us) / store_list.p50_us,
                (r.list.cpu_us - floor.cpu_us) / store_list.cpu_us);
    std::printf("  GetTask A2A %s / store get: wall p50 %.2fx, cpu %.2fx; less the floor: wall %.2fx, cpu %.2fx\n",
                r.dialect, r.get.p50_us / store_get.p50_us, r.get.cpu_us / store_get.cpu_us,
                (r.get.p50_us - floor.p50_us) / store_get.p50_us, (r.get.cpu_us - floor.cpu_us) / store_get.cpu_us);
  }
  server->stop();
  server.reset();
  store->close();
  for (const auto &d : made) {
    std::error_code ec;
    std::filesystem::remove_all(d, ec);
  }
  return 0;
}
#endif

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
  bool idempotency = true;
  size_t read_tasks = 10000;
  int reps = 2000;
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
    else if (a == "--no-idempotency") idempotency = false;
    else if (a == "--tasks") read_tasks = std::strtoul(value().c_str(), nullptr, 10);
    else if (a == "--reps") reps = std::atoi(value().c_str());
    else {
      std::fprintf(stderr,
                   "usage: server_load [--url http://HOST:PORT/[,...]]... [--connections 64] [--threads 2]\n"
                   "                   [--seconds 5] [--warmup 1] [--method all|get|send]\n"
                   "                   [--dialect both|0.3|1.0] [--blocking]\n"
                   "                   [--server-threads N] [--workers N] [--store SELECTOR]\n"
                   "                   [--requests N] [--list-page] [--no-idempotency]\n"
                   "       server_load --method reads [--store SELECTOR] [--tasks N] [--reps N]\n");
      return a == "--help" ? 0 : 2;
    }
  }
  if (connections < 1 || threads < 1 || threads > connections) {
    std::fprintf(stderr, "need 1 <= --threads <= --connections\n");
    return 2;
  }
  try {
#ifndef BENCH_NO_SERVER
    if (method == "reads") {
      if (!urls.empty() || read_tasks == 0 || reps < 10) {
        std::fprintf(stderr, "--method reads needs an in-process server (no --url), --tasks >= 1, --reps >= 10\n");
        return 2;
      }
      return reads_bench(store, read_tasks, reps);
    }
    std::unique_ptr<toolnexus::ServerHandle> server;
    if (urls.empty()) {
      toolnexus::ServerOptions opts;
      opts.listen = "127.0.0.1:0";
      opts.store = store;
      opts.agent = "echo";
      opts.idempotency.enabled = idempotency;
      if (server_threads != 0) opts.limits.max_connections = server_threads;
      if (workers != 0) opts.workers = workers;
      opts.log_level = toolnexus::LogLevel::warn;
      server = std::make_unique<toolnexus::ServerHandle>(toolnexus::serve(std::move(opts)));
      urls.push_back(server->url());
      std::printf("in-process server at %s (store %s, echo agent, idempotency %s)\n", urls[0].c_str(), store.c_str(),
                  idempotency ? "on" : "off");
    }
#else
    (void)idempotency;
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

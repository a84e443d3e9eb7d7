// The HTTP/1.1 connection layer: one epoll loop for every socket, worker
// threads for complete requests (see http_reactor.hpp).
#include "wire/http_reactor.hpp"
#include "common/semaphore.hpp"
#include "common/util.hpp"
#include "wire/chunk_decoder.hpp"
#include "wire/http_head.hpp"


#include <Poco/Exception.h>
#include <Poco/Net/HTTPResponse.h>
#include <Poco/Net/NetException.h>
#include <Poco/Timestamp.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <unordered_map>
#include <unordered_set>

namespace toolnexus::server_detail {

using Clock = std::chrono::steady_clock;

namespace {

constexpr uint64_t kListenerId = 0;
constexpr uint64_t kWakeId = 1;
constexpr int kTickMs = 50;
constexpr auto kLinger = std::chrono::milliseconds(2000);
constexpr std::size_t kReadChunk = 64 * 1024;
// A buffer this large is given back to the system (malloc_trim) once freed.
constexpr std::size_t kLargeBufferBytes = std::size_t{1} << 20;

std::string_view trim(std::string_view s) { return trim_ows(s); }

enum class Phase { reading, handling, writing, streaming, lingering };

}  // namespace

HttpReply http_error_reply(int status, std::string_view message) {
  HttpReply r;
  r.status = status;
  rapidjson::StringBuffer buf;
  rapidjson::Writer<rapidjson::StringBuffer> w(buf);
  w.StartObject();
  w.Key("error");
  const std::string &reason = Poco::Net::HTTPResponse::getReasonForStatus(
      static_cast<Poco::Net::HTTPResponse::HTTPStatus>(status));
  w.String(reason.data(), static_cast<rapidjson::SizeType>(reason.size()));
  w.Key("message");
  const std::string text = valid_utf8_text(message);  // echoed client bytes stay valid JSON
  w.String(text.data(), static_cast<rapidjson::SizeType>(text.size()));
  w.EndObject();
  r.body.assign(buf.GetString(), buf.GetSize());
  return r;
}

// ---------------------------------------------------------------------------
// SseStream
// ---------------------------------------------------------------------------

SseStream::SseStream(std::string label, std::function<void()> wake)
    : wake_(std::move(wake)), label_(std::move(label)) {}
SseStream::~SseStream() = default;

bool SseStream::write(std::string_view frame) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_.load() || end_requested_.load()) return false;
    queued_.append(frame);
  }
  wake_();
  return true;
}

void SseStream::end() {
  if (end_requested_.exchange(true)) return;
  wake_();
}

std::size_t SseStream::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queued_.size();
}

void SseStream::set_on_drain(std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(mu_);
  on_drain_ = std::move(fn);
}

// The reactor's access to a stream.
struct SseStream::Internal {
  static std::string take(SseStream &s) {
    std::lock_guard<std::mutex> lock(s.mu_);
    std::string out;
    out.swap(s.queued_);
    return out;
  }
  static bool end_requested(const SseStream &s) { return s.end_requested_.load(); }
  static bool has_queued(const SseStream &s) {
    std::lock_guard<std::mutex> lock(s.mu_);
    return !s.queued_.empty();
  }
  static void drained(SseStream &s) {
    std::function<void()> fn;
    {
      std::lock_guard<std::mutex> lock(s.mu_);
      fn = s.on_drain_;
    }
    if (fn) fn();
  }
  static void close(SseStream &s) {
    std::function<void()> fn;
    {
      std::lock_guard<std::mutex> lock(s.mu_);
      if (s.closed_.exchange(true)) return;
      std::string().swap(s.queued_);  // its memory too, not only its bytes
      fn = std::move(s.on_drain_);
      s.on_drain_ = nullptr;
    }
    if (fn) fn();
  }
  static void mark_ended(SseStream &s) { s.ended_ = true; }
};

// ---------------------------------------------------------------------------
// The reactor
// ---------------------------------------------------------------------------

namespace {

struct Conn {
  uint64_t id = 0;
  int fd = -1;
  Phase phase = Phase::reading;
  Poco::Net::SocketAddress peer;
  Poco::Net::SocketAddress local;  // this server's side of the connection
  uint32_t events = 0;  // current epoll mask
  // reading
  std::string in;
  std::size_t scanned = 0;  // bytes of `in` already searched for the header end
  bool head_done = false;
  std::unique_ptr<HttpRequest> req;
  enum class Body { none, length, chunked } body_mode = Body::none;
  uint64_t body_left = 0;
  ChunkDecoder chunks;
  Clock::time_point idle_since{};
  Clock::time_point first_byte_at{};
  Clock::time_point last_input{};
  /// No request has been read on this connection yet.
  bool fresh = true;
  Clock::time_point head_done_at{};
  bool keep_alive = true;
  bool http10 = false;
  // writing
  std::string out;
  std::size_t out_off = 0;
  Clock::time_point last_progress{};
  bool close_after = false;
  // streaming
  std::shared_ptr<SseStream> stream;
  bool stream_chunked = true;
  bool stream_end_written = false;
  Clock::time_point linger_until{};
};

struct Job {
  uint64_t conn_id = 0;
  std::unique_ptr<HttpRequest> req;
  bool http10 = false;
};

struct Posted {
  enum class Kind { reply, stream } kind = Kind::reply;
  uint64_t conn_id = 0;
  HttpReply reply;
  std::vector<std::pair<std::string, std::string>> headers;
  std::shared_ptr<SseStream> stream;
};

}  // namespace

struct HttpReactor::Impl : std::enable_shared_from_this<HttpReactor::Impl> {
  Poco::Net::ServerSocket listener;
  int listen_fd = -1;
  ReactorLimits limits;
  HttpHandler handler;
  const Logger &log;
  int ep = -1;
  int wake_fd = -1;

  std::unordered_map<uint64_t, std::unique_ptr<Conn>> conns;  // reactor thread only
  uint64_t next_id = 2;
  std::atomic<std::size_t> n_conns{0};
  std::atomic<std::size_t> n_streams{0};

  // Posted from other threads.
  std::mutex post_mu;
  std::vector<Posted> posted;
  std::unordered_set<uint64_t> dirty_streams;
  std::atomic<bool> wake_pending{false};
  // Set by close_conn when a large buffer was freed; the loop trims once.
  bool trim_wanted = false;

  // Workers.
  std::mutex job_mu;
  Semaphore job_sem;  // one token per queued job, plus one per worker at stop
  std::deque<Job> jobs;
  bool stop_workers = false;
  std::vector<std::thread> workers;
  std::atomic<unsigned> busy_workers{0};

  std::thread loop_thread;
  std::atomic<bool> stopping{false};
  /// Streams still open are ended (stop(), once the grace time is over;
  /// until then whoever writes a stream ends it).
  std::atomic<bool> end_streams{false};
  std::atomic<bool> stop_loop{false};
  Clock::time_point stop_deadline{};
  bool started = false;
  bool stopped = false;

  Impl(Poco::Net::ServerSocket l, ReactorLimits lim, HttpHandler h, const Logger &lg)
      : listener(std::move(l)), limits(std::move(lim)), handler(std::move(h)), log(lg) {}

  ~Impl() {
    if (ep >= 0) ::close(ep);
    if (wake_fd >= 0) ::close(wake_fd);
  }

  void wake() {
    if (wake_pending.exchange(true)) return;
    const uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = ::write(wake_fd, &one, sizeof one);
  }

  void post(Posted p) {
    {
      std::lock_guard<std::mutex> lock(post_mu);
      posted.push_back(std::move(p));
    }
    wake();
  }

  void mark_dirty(uint64_t conn_id) {
    {
      std::lock_guard<std::mutex> lock(post_mu);
      dirty_streams.insert(conn_id);
    }
    wake();
  }

  // --- epoll helpers -------------------------------------------------------

  void set_events(Conn &c, uint32_t ev) {
    if (c.events == ev) return;
    epoll_event e{};
    e.events = ev;
    e.data.u64 = c.id;
    ::epoll_ctl(ep, EPOLL_CTL_MOD, c.fd, &e);
    c.events = ev;
  }

  void close_conn(Conn &c) {
    // A connection dropped with a large answer or stream backlog unsent (a
    // slow client cut off): its memory goes back to the system once this
    // loop pass is over, not one trim per connection.
    if (c.out.capacity() > kLargeBufferBytes || c.in.capacity() > kLargeBufferBytes) trim_wanted = true;
    if (c.stream) {
      SseStream::Internal::close(*c.stream);
      c.stream.reset();
      --n_streams;
    }
    ::epoll_ctl(ep, EPOLL_CTL_DEL, c.fd, nullptr);
    ::close(c.fd);
    c.fd = -1;
    const uint64_t id = c.id;
    conns.erase(id);  // destroys c
    --n_conns;
  }

  // --- accepting -------------------------------------------------------------

  void accept_all() {
    for (;;) {
      sockaddr_storage addr{};
      socklen_t len = sizeof addr;
      const int fd = ::accept4(listen_fd, reinterpret_cast<sockaddr *>(&addr), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != ECONNABORTED)
          log.warn(std::string("accept failed: ") + std::strerror(errno));
        return;
      }
      if (stopping.load() || conns.size() >= limits.max_open_connections) {
        if (!stopping.load())
          log.warn("refusing a connection: " + std::to_string(conns.size()) +
                   " are open (limits.max_open_connections)");
        ::close(fd);
        continue;
      }
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      auto c = std::make_unique<Conn>();
      c->id = next_id++;
      c->fd = fd;
      try {
        c->peer = Poco::Net::SocketAddress(reinterpret_cast<const sockaddr *>(&addr), len);
      } catch (const Poco::Exception &) {
      }
      sockaddr_storage here{};
      socklen_t here_len = sizeof here;
      if (::getsockname(fd, reinterpret_cast<sockaddr *>(&here), &here_len) == 0) {
        try {
          c->local = Poco::Net::SocketAddress(reinterpret_cast<const sockaddr *>(&here), here_len);
        } catch (const Poco::Exception &) {
        }
      }
      c->idle_since = Clock::now();
      epoll_event e{};
      e.events = EPOLLIN | EPOLLRDHUP;
      e.data.u64 = c->id;
      if (::epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e) != 0) {
        ::close(fd);
        continue;
      }
      c->events = e.events;
      ++n_conns;
      conns.emplace(c->id, std::move(c));
    }
  }

  // --- reading and framing ------------------------------------------------------

  // Answers an error detected here and closes the connection after it.
  void fail(Conn &c, int status, const std::string &message) {
    if (log.enabled(LogLevel::debug))
      log.debug("HTTP " + std::to_string(status) + " to " + c.peer.toString() + ": " + message);
    HttpReply r = http_error_reply(status, message);
    r.close = true;
    send_reply(c, std::move(r));
  }

  void on_readable(Conn &c) {
    char buf[kReadChunk];
    for (int rounds = 0; rounds < 4; ++rounds) {
      const ssize_t n = ::recv(c.fd, buf, sizeof buf, MSG_DONTWAIT);
      if (n > 0) {
        if (c.phase == Phase::reading) {
          c.last_input = Clock::now();
          if (c.in.empty() && !c.head_done) c.first_byte_at = c.last_input;
          c.in.append(buf, static_cast<std::size_t>(n));
          if (!parse(c)) return;  // c may be gone
          if (c.phase != Phase::reading) return;
        } else if (c.phase == Phase::streaming && c.keep_alive) {
          // A request pipelined behind the stream (RFC 9112 section 9.3.2)
          // waits here, and is parsed when the stream ends (to_reading). A
          // stream may last for hours, so little is kept: a head and 64 KiB.
          // Beyond that, the connection closes after the stream (a client
          // that pipelines retries what was not answered, section 9.3.2)
          // instead of holding a body per stream.
          const std::size_t room = limits.max_header_bytes + kReadChunk;
          if (c.in.size() + static_cast<std::size_t>(n) <= room) {
            c.in.append(buf, static_cast<std::size_t>(n));
          } else {
            c.keep_alive = false;
            c.in.clear();
          }
        }
        // lingering (and a stream that closes after it): input is dropped.
        if (static_cast<std::size_t>(n) < sizeof buf) return;
        continue;
      }
      if (n == 0) {  // the client closed its side
        close_conn(c);
        return;
      }
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      close_conn(c);
      return;
    }
  }

  // Refuses a head longer than max_header_bytes: 414 when its request line
  // alone is longer than a target may be (RFC 9110 section 15.5.15), else
  // 431.
  void head_too_large(Conn &c) {
    const std::size_t line = std::min(c.in.find("\r\n"), c.in.size());
    if (line > kMaxRequestTarget)
      fail(c, 414, "the request target is longer than " + std::to_string(kMaxRequestTarget) +
                       " bytes, the limit (RFC 9110 section 15.5.15)");
    else
      fail(c, 431, "the request header is larger than " + std::to_string(limits.max_header_bytes) + " bytes");
  }

  // Advances the request parser over c.in. Returns false when `c` was
  // closed.
  bool parse(Conn &c) {
    if (!c.head_done) {
      // RFC 9112 section 2.2: ignore empty lines before the request line.
      std::size_t lead = 0;
      while (lead + 1 < c.in.size() && c.in[lead] == '\r' && c.in[lead + 1] == '\n') lead += 2;
      if (lead != 0) {
        c.in.erase(0, lead);
        c.scanned = 0;
      }
      const std::size_t from = c.scanned > 3 ? c.scanned - 3 : 0;
      const std::size_t end = c.in.find("\r\n\r\n", from);
      if (end == std::string::npos) {
        c.scanned = c.in.size();
        if (c.in.size() > limits.max_header_bytes) head_too_large(c);
        return true;
      }
      if (end + 4 > limits.max_header_bytes) {
        head_too_large(c);
        return true;
      }
      // RFC 9112 first: Poco's reader is lenient where a proxy may not be.
      if (HeadVerdict v = check_request_head(std::string_view(c.in).substr(0, end + 4)); v.status != 0) {
        fail(c, v.status, v.status == 414 ? v.why : "malformed request header: " + v.why);
        return true;
      }
      auto req = std::make_unique<HttpRequest>();
      try {
        std::istringstream head(c.in.substr(0, end + 4));
        req->head.read(head);
      } catch (const Poco::Exception &e) {
        fail(c, 400, "malformed request header: " + e.message());
        return true;
      }
      // The target's form (RFC 9112 section 3.2): absolute-form is served
      // as its path, with its authority as the Host.
      RequestTarget target = read_request_target(req->head.getMethod(), req->head.getURI());
      if (target.status != 0) {
        fail(c, target.status, "malformed request target: " + target.why);
        return true;
      }
      if (!target.authority.empty()) {
        req->head.setURI(target.origin);
        req->head.setHost(target.authority);
      }
      combine_list_field(req->head, "If-None-Match");
      c.in.erase(0, end + 4);
      c.scanned = 0;
      c.head_done = true;
      c.head_done_at = Clock::now();
      c.http10 = req->head.getVersion() == Poco::Net::HTTPMessage::HTTP_1_0;
      c.keep_alive = req->head.getKeepAlive();
      const std::string &uri = req->head.getURI();
      req->path = uri.substr(0, uri.find('?'));
      req->peer = c.peer;
      req->local = c.local;
      // Framing (RFC 9112 section 6).
      std::string why;
      const int bad = framing(*req, c, why);
      c.req = std::move(req);
      if (bad != 0) {
        fail(c, bad, why);
        return true;
      }
      if (c.body_mode != Conn::Body::none) {
        c.req->has_body = c.body_mode == Conn::Body::chunked || c.body_left > 0;
        const std::string &expect = c.req->head.get("Expect", Poco::Net::HTTPMessage::EMPTY);
        if (!expect.empty() && iequals(trim(expect), "100-continue") && !c.http10 && c.in.empty()) {
          c.out.append("HTTP/1.1 100 Continue\r\n\r\n");
          flush_interim(c);
          if (c.fd < 0) return false;
        }
      }
    }
    // The body.
    if (c.body_mode == Conn::Body::length) {
      const std::size_t take = static_cast<std::size_t>(std::min<uint64_t>(c.body_left, c.in.size()));
      c.req->body.append(c.in, 0, take);
      c.in.erase(0, take);
      c.body_left -= take;
      if (c.body_left != 0) return true;
    } else if (c.body_mode == Conn::Body::chunked) {
      std::string why;
      switch (c.chunks.feed(c.in, c.req->body, limits.max_body_bytes, limits.max_header_bytes, why)) {
        case ChunkDecoder::Result::more: return true;
        case ChunkDecoder::Result::done: break;
        case ChunkDecoder::Result::bad:
          fail(c, 400, "malformed chunked request body: " + why);
          return true;
        case ChunkDecoder::Result::too_large:
          fail(c, 413, "request body larger than the limit of " + std::to_string(limits.max_body_bytes) +
                          " bytes (limits.max_body_bytes, --max-body)");
          return true;
      }
    }
    dispatch(c);
    return true;
  }

  // Header fields that take a single value (RFC 9110 section 5.3): given
  // twice, the request is refused (see framing()).
  static constexpr const char *kSingletonFields[] = {"Host", "Content-Type", "Authorization", "A2A-Version",
                                                     "Last-Event-ID", "Origin"};

  // Joins the values of a list-based field given more than once into one,
  // in order, comma-separated (RFC 9110 section 5.3), so that a reader of
  // the field (get(): the first) sees every member.
  static void combine_list_field(Poco::Net::HTTPRequest &h, const std::string &name) {
    std::string all;
    int n = 0;
    for (auto it = h.find(name); it != h.end() && iequals(it->first, name); ++it, ++n)
      all += (n == 0 ? "" : ", ") + it->second;
    if (n < 2) return;
    h.erase(name);
    h.set(name, all);
  }

  // Reads the body framing of `req` into `c`; returns 0 or the status to
  // refuse it with (and `why`).
  int framing(const HttpRequest &req, Conn &c, std::string &why) {
    const Poco::Net::HTTPRequest &h = req.head;
    c.body_mode = Conn::Body::none;
    c.body_left = 0;
    c.chunks = ChunkDecoder();
    // A field that takes one value, given twice, is answered 400: which
    // one counts would depend on the reader (RFC 9110 section 5.3: only a
    // list-based field may be combined). RFC 9112 section 3.2 says so of
    // Host (two hosts let a proxy and this server disagree about the
    // target).
    for (const char *name : kSingletonFields) {
      int n = 0;
      for (auto it = h.find(name); it != h.end() && iequals(it->first, name); ++it) ++n;
      if (n > 1) {
        why = "the request has " + std::to_string(n) + " " + name + " header fields (at most one is allowed: " +
              "RFC 9110 section 5.3)";
        return 400;
      }
    }
    std::vector<std::string> te;
    for (auto it = h.find("Transfer-Encoding"); it != h.end() && iequals(it->first, "Transfer-Encoding"); ++it)
      te.push_back(it->second);
    const bool has_te = !te.empty();
    if (has_te) {
      const TransferCoding coding = parse_transfer_encoding(te.data(), te.size());
      if (coding.status != 0) {
        why = coding.why;
        return coding.status;
      }
      c.body_mode = Conn::Body::chunked;
    }
    bool has_cl = false;
    uint64_t length = 0;
    for (auto it = h.find("Content-Length"); it != h.end() && iequals(it->first, "Content-Length"); ++it) {
      const std::string_view v = trim(it->second);
      if (v.empty() || v.size() > 18 || v.find_first_not_of("0123456789") != std::string_view::npos) {
        why = "Content-Length " + in_quotes(v.substr(0, 40)) + " is not a non-negative decimal number";
        return 400;
      }
      const uint64_t n = std::stoull(std::string(v));
      if (has_cl && n != length) {
        why = "two different Content-Length values";
        return 400;
      }
      has_cl = true;
      length = n;
    }
    if (has_te && has_cl) {
      why = "both Content-Length and Transfer-Encoding are given";
      return 400;
    }
    if (has_te && c.http10) {
      why = "Transfer-Encoding is not allowed in HTTP/1.0";
      return 400;
    }
    if (has_cl) {
      if (length > limits.max_body_bytes) {
        why = "request body larger than the limit of " + std::to_string(limits.max_body_bytes) +
              " bytes (limits.max_body_bytes, --max-body)";
        return 413;
      }
      c.body_mode = Conn::Body::length;
      c.body_left = length;
    }
    return 0;
  }

  void dispatch(Conn &c) {
    c.phase = Phase::handling;
    c.fresh = false;
    set_events(c, 0);
    Job job;
    job.conn_id = c.id;
    job.req = std::move(c.req);
    job.http10 = c.http10;
    c.head_done = false;
    c.body_mode = Conn::Body::none;
    bool full = false;
    {
      std::lock_guard<std::mutex> lock(job_mu);
      if (jobs.size() >= limits.max_queued_requests) full = true;
      else jobs.push_back(std::move(job));
    }
    if (full) {
      fail(c, 503, "server busy: " + std::to_string(limits.max_queued_requests) +
                       " requests are waiting for a worker; retry later");
      return;
    }
    job_sem.release();
  }

  // --- writing ---------------------------------------------------------------

  std::string head_bytes(Poco::Net::HTTPResponse &r) {
    r.setDate(Poco::Timestamp());
    if (!limits.server_name.empty()) r.set("Server", limits.server_name);
    std::ostringstream os;
    r.write(os);
    return os.str();
  }

  void send_reply(Conn &c, HttpReply reply) {
    const bool keep = c.keep_alive && !reply.close && !stopping.load() && c.phase != Phase::streaming;
    Poco::Net::HTTPResponse r(c.http10 ? Poco::Net::HTTPMessage::HTTP_1_0 : Poco::Net::HTTPMessage::HTTP_1_1,
                              static_cast<Poco::Net::HTTPResponse::HTTPStatus>(reply.status));
    r.setStatusAndReason(static_cast<Poco::Net::HTTPResponse::HTTPStatus>(reply.status));
    if (reply.status == 308) r.setReason("Permanent Redirect");  // RFC 9110 15.4.9; Poco 1.12 has no phrase for it
    if (!reply.content_type.empty()) r.setContentType(reply.content_type);
    for (auto &[name, value] : reply.headers) r.set(name, value);
    // 304 and 204 end at their header block (RFC 9110 sections 15.4.5,
    // 15.3.5): no body, and no Content-Length that would claim one.
    const bool bodiless = reply.status == 304 || reply.status == 204;
    if (bodiless) reply.body.clear();
    else r.setContentLength64(static_cast<Poco::Int64>(reply.body.size()));
    r.setKeepAlive(keep);
    // Anything not yet written (an interim 100 Continue) goes first.
    std::string out = c.out_off < c.out.size() ? c.out.substr(c.out_off) : std::string();
    out += head_bytes(r);
    if (!reply.head_only) out += reply.body;
    c.out = std::move(out);
    c.out_off = 0;
    c.close_after = !keep;
    c.phase = Phase::writing;
    c.last_progress = Clock::now();
    flush(c);
  }

  // Writes the 100 Continue queued in c.out (small: a failure to write it
  // all at once just keeps it queued ahead of the answer).
  void flush_interim(Conn &c) {
    while (c.out_off < c.out.size()) {
      const ssize_t n = ::send(c.fd, c.out.data() + c.out_off, c.out.size() - c.out_off, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        c.out_off += static_cast<std::size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      close_conn(c);
      return;
    }
    c.out.clear();
    c.out_off = 0;
  }

  void start_stream(Conn &c, std::vector<std::pair<std::string, std::string>> &headers,
                    std::shared_ptr<SseStream> stream) {
    Poco::Net::HTTPResponse r(c.http10 ? Poco::Net::HTTPMessage::HTTP_1_0 : Poco::Net::HTTPMessage::HTTP_1_1,
                              Poco::Net::HTTPResponse::HTTP_OK);
    r.setContentType("text/event-stream");
    r.set("Cache-Control", "no-cache");
    for (auto &[name, value] : headers) r.set(name, value);
    c.stream_chunked = !c.http10;
    // A stream's bytes should wait in our queue, where a slow client is
    // seen (and, stalled, dropped), not in a kernel buffer autotuned to MiBs.
    int sndbuf = 256 * 1024;
    ::setsockopt(c.fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf);
    if (c.stream_chunked) {
      r.setChunkedTransferEncoding(true);
      r.setKeepAlive(c.keep_alive && !stopping.load());
    } else {
      r.setKeepAlive(false);
      c.keep_alive = false;
    }
    std::string out = c.out_off < c.out.size() ? c.out.substr(c.out_off) : std::string();
    out += head_bytes(r);
    c.out = std::move(out);
    c.out_off = 0;
    c.stream = std::move(stream);
    c.stream_end_written = false;
    c.phase = Phase::streaming;
    c.last_progress = Clock::now();
    ++n_streams;
    pump_stream(c);
  }

  // Moves a stream's queued frames into c.out and writes.
  void pump_stream(Conn &c) {
    if (!c.stream) return;
    std::string data = SseStream::Internal::take(*c.stream);
    if (!data.empty()) {
      if (c.stream_chunked) {
        char size[24];
        std::snprintf(size, sizeof size, "%zx\r\n", data.size());
        c.out += size;
        c.out += data;
        c.out += "\r\n";
      } else {
        c.out += data;
      }
    }
    if (SseStream::Internal::end_requested(*c.stream) && !SseStream::Internal::has_queued(*c.stream) &&
        !c.stream_end_written) {
      if (c.stream_chunked) c.out += "0\r\n\r\n";
      c.stream_end_written = true;
    }
    flush(c);
  }

  void flush(Conn &c) {
    while (c.out_off < c.out.size()) {
      const ssize_t n = ::send(c.fd, c.out.data() + c.out_off, c.out.size() - c.out_off, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        c.out_off += static_cast<std::size_t>(n);
        c.last_progress = Clock::now();
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        set_events(c, (c.phase == Phase::streaming ? EPOLLIN | EPOLLRDHUP : 0u) | EPOLLOUT);
        return;
      }
      close_conn(c);
      return;
    }
    if (c.out.capacity() > kLargeBufferBytes) {
      // A large answer is out: give its memory back to the system now
      // (glibc would keep the freed pages of this thread's arena; see
      // Router::handle in http.cpp for the request threads' share).
      std::string().swap(c.out);
      release_free_memory();
    } else {
      c.out.clear();
    }
    c.out_off = 0;
    written(c);
  }

  // Everything queued was written.
  void written(Conn &c) {
    if (c.phase == Phase::streaming) {
      if (c.stream_end_written) {
        // The stream is over; the connection serves the next request or
        // closes.
        SseStream::Internal::mark_ended(*c.stream);
        auto s = std::move(c.stream);
        --n_streams;
        SseStream::Internal::close(*s);
        if (c.keep_alive && !stopping.load()) {
          to_reading(c);
        } else {
          linger(c);
        }
        return;
      }
      // Frames queued (and an end asked for) while this connection was
      // still writing: their wake-up found c.out busy and left them to us.
      // Without this pump they waited for a next write that, after the
      // Task's final event, never came (issue 19 item 1).
      if (SseStream::Internal::has_queued(*c.stream) || SseStream::Internal::end_requested(*c.stream)) {
        pump_stream(c);
        return;
      }
      set_events(c, EPOLLIN | EPOLLRDHUP);
      auto s = c.stream;  // the callback may write (re-entering via the wake)
      SseStream::Internal::drained(*s);
      return;
    }
    if (c.phase == Phase::writing) {
      if (c.close_after) {
        linger(c);
      } else {
        to_reading(c);
      }
    }
  }

  void to_reading(Conn &c) {
    c.phase = Phase::reading;
    c.idle_since = Clock::now();
    c.head_done = false;
    c.scanned = 0;
    set_events(c, EPOLLIN | EPOLLRDHUP);
    // A pipelined request may already be buffered.
    if (!c.in.empty()) {
      c.first_byte_at = Clock::now();
      parse(c);
    }
  }

  void linger(Conn &c) {
    ::shutdown(c.fd, SHUT_WR);
    c.phase = Phase::lingering;
    c.linger_until = Clock::now() + kLinger;
    c.in.clear();
    set_events(c, EPOLLIN | EPOLLRDHUP);
  }

  // --- cross-thread posts --------------------------------------------------------

  void drain_posts() {
    // Consume the eventfd before clearing wake_pending: cleared first, a
    // poster could set the flag and write after the clear, this read would
    // swallow that write, and the flag would stay set with nobody left to
    // write again (every later post skipped its wake: answers piled up in
    // `posted` and were never sent).
    uint64_t v = 0;
    [[maybe_unused]] const ssize_t n = ::read(wake_fd, &v, sizeof v);
    wake_pending = false;
    std::vector<Posted> items;
    std::unordered_set<uint64_t> dirty;
    {
      std::lock_guard<std::mutex> lock(post_mu);
      items.swap(posted);
      dirty.swap(dirty_streams);
    }
    for (Posted &p : items) {
      auto it = conns.find(p.conn_id);
      if (it == conns.end()) {
        if (p.stream) SseStream::Internal::close(*p.stream);
        continue;  // the client went away meanwhile
      }
      Conn &c = *it->second;
      if (c.phase != Phase::handling) continue;
      if (p.kind == Posted::Kind::reply) {
        send_reply(c, std::move(p.reply));
      } else {
        start_stream(c, p.headers, std::move(p.stream));
      }
    }
    for (uint64_t id : dirty) {
      auto it = conns.find(id);
      if (it == conns.end()) continue;
      Conn &c = *it->second;
      if (c.phase == Phase::streaming && c.out.empty()) pump_stream(c);
    }
  }

  // --- timers ---------------------------------------------------------------------

  void check_deadlines() {
    const auto now = Clock::now();
    std::vector<uint64_t> ids;
    ids.reserve(conns.size());
    for (auto &kv : conns) ids.push_back(kv.first);
    for (uint64_t id : ids) {
      auto it = conns.find(id);
      if (it == conns.end()) continue;
      Conn &c = *it->second;
      switch (c.phase) {
        case Phase::reading: {
          const auto silent = now - c.last_input;
          const auto read_timeout = std::chrono::milliseconds(limits.read_timeout_ms);
          if (!c.head_done && c.in.empty()) {
            // Idle: a new connection has read_timeout_ms for its first
            // byte, a kept-alive one keep_alive_timeout_ms.
            const int idle_ms = c.fresh ? limits.read_timeout_ms : limits.keep_alive_timeout_ms;
            if (stopping.load() || now - c.idle_since > std::chrono::milliseconds(idle_ms)) close_conn(c);
          } else if (!c.head_done) {
            if (now - c.first_byte_at > std::chrono::milliseconds(limits.header_timeout_ms))
              fail(c, 408, "the request header was not complete " + std::to_string(limits.header_timeout_ms) +
                               " ms after its first byte");
            else if (silent > read_timeout)
              fail(c, 408, "no byte of the request header arrived for " + std::to_string(limits.read_timeout_ms) +
                               " ms");
          } else if (now - c.head_done_at > std::chrono::milliseconds(limits.body_deadline_ms)) {
            fail(c, 408, "the request body took longer than " + std::to_string(limits.body_deadline_ms) +
                             " ms to arrive");
          } else if (silent > read_timeout) {
            fail(c, 408, "no part of the request body arrived for " + std::to_string(limits.read_timeout_ms) +
                             " ms");
          }
          break;
        }
        case Phase::writing:
          if (now - c.last_progress > std::chrono::milliseconds(limits.write_timeout_ms)) close_conn(c);
          break;
        case Phase::streaming:
          if (!c.out.empty() && now - c.last_progress > std::chrono::milliseconds(limits.stream_stall_ms)) {
            log.info("dropping the stream " + (c.stream ? c.stream->label() : std::string()) + " to " +
                     c.peer.toString() + ": the client read nothing for " +
                     std::to_string(limits.stream_stall_ms) + " ms");
            close_conn(c);
          } else if (end_streams.load() && c.stream && !SseStream::Internal::end_requested(*c.stream)) {
            c.stream->end();
          }
          break;
        case Phase::lingering:
          if (now > c.linger_until) close_conn(c);
          break;
        case Phase::handling: break;
      }
    }
  }

  // --- the loop -----------------------------------------------------------------------

  void loop() {
    epoll_event events[256];
    auto next_tick = Clock::now();
    while (!stop_loop.load()) {
      const int n = ::epoll_wait(ep, events, 256, kTickMs);
      if (n < 0 && errno != EINTR) {
        log.error(std::string("epoll_wait failed: ") + std::strerror(errno));
        std::this_thread::sleep_for(std::chrono::milliseconds(kTickMs));
      }
      for (int i = 0; i < n; ++i) {
        const uint64_t id = events[i].data.u64;
        const uint32_t ev = events[i].events;
        if (id == kListenerId) {
          accept_all();
          continue;
        }
        if (id == kWakeId) {
          drain_posts();
          continue;
        }
        auto it = conns.find(id);
        if (it == conns.end()) continue;
        Conn &c = *it->second;
        if ((ev & EPOLLOUT) != 0 && !c.out.empty()) {
          flush(c);
          if (conns.find(id) == conns.end()) continue;
        }
        if ((ev & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) != 0) {
          if (c.phase == Phase::handling) {
            // Only HUP/ERR reach here: the client is gone; the answer
            // will be dropped.
            if ((ev & (EPOLLHUP | EPOLLERR)) != 0) close_conn(c);
            continue;
          }
          on_readable(c);
        }
      }
      const auto now = Clock::now();
      if (now >= next_tick) {
        next_tick = now + std::chrono::milliseconds(kTickMs);
        check_deadlines();
      }
      if (trim_wanted) {
        trim_wanted = false;
        release_free_memory();
      }
    }
    // Close whatever is left.
    std::vector<uint64_t> ids;
    for (auto &kv : conns) ids.push_back(kv.first);
    for (uint64_t id : ids) {
      auto it = conns.find(id);
      if (it != conns.end()) close_conn(*it->second);
    }
  }

  // --- workers ------------------------------------------------------------------------

  class WorkerResponder final : public Responder {
   public:
    WorkerResponder(std::shared_ptr<Impl> impl, uint64_t conn_id) : impl_(std::move(impl)), conn_id_(conn_id) {}
    void reply(HttpReply reply) override {
      if (answered_.exchange(true)) return;
      Posted p;
      p.kind = Posted::Kind::reply;
      p.conn_id = conn_id_;
      p.reply = std::move(reply);
      impl_->post(std::move(p));
    }
    std::shared_ptr<SseStream> start_stream(std::vector<std::pair<std::string, std::string>> headers,
                                            std::string label) override {
      if (answered_.exchange(true)) return nullptr;
      std::weak_ptr<Impl> weak = impl_;
      const uint64_t id = conn_id_;
      auto stream = std::make_shared<SseStream>(std::move(label), [weak, id] {
        if (auto impl = weak.lock()) impl->mark_dirty(id);
      });
      Posted p;
      p.kind = Posted::Kind::stream;
      p.conn_id = conn_id_;
      p.headers = std::move(headers);
      p.stream = stream;
      impl_->post(std::move(p));
      return stream;
    }
    bool answered() const noexcept override { return answered_.load(); }

   private:
    std::shared_ptr<Impl> impl_;
    uint64_t conn_id_;
    std::atomic<bool> answered_{false};
  };

  void worker() {
    for (;;) {
      Job job;
      job_sem.acquire();
      {
        std::lock_guard<std::mutex> lock(job_mu);
        if (jobs.empty()) {
          if (stop_workers) return;  // stopping and nothing left
          continue;                  // a job's token taken after stop() cleared the queue
        }
        job = std::move(jobs.front());
        jobs.pop_front();
      }
      ++busy_workers;
      auto responder = std::make_shared<WorkerResponder>(shared_from_this(), job.conn_id);
      try {
        std::shared_ptr<Responder> r = responder;
        handler(*job.req, *r);
      } catch (const std::exception &e) {
        log.error(job.req->head.getMethod() + " " + job.req->path.substr(0, 200) + ": " + e.what());
        if (!responder->answered()) {
          HttpReply reply = http_error_reply(500, "internal error");
          reply.close = true;
          responder->reply(std::move(reply));
        }
      } catch (...) {
        log.error(job.req->head.getMethod() + " " + job.req->path.substr(0, 200) + ": unknown exception");
      }
      if (!responder->answered()) {
        HttpReply reply = http_error_reply(500, "internal error: the request was not answered");
        reply.close = true;
        responder->reply(std::move(reply));
      }
      --busy_workers;
    }
  }
};

HttpReactor::HttpReactor(Poco::Net::ServerSocket listener, ReactorLimits limits, HttpHandler handler,
                         const Logger &log)
    : impl_(std::make_shared<Impl>(std::move(listener), std::move(limits), std::move(handler), log)) {
  Impl &m = *impl_;
  m.listen_fd = static_cast<int>(m.listener.impl()->sockfd());
  const int flags = ::fcntl(m.listen_fd, F_GETFL, 0);
  ::fcntl(m.listen_fd, F_SETFL, flags | O_NONBLOCK);
  m.ep = ::epoll_create1(EPOLL_CLOEXEC);
  if (m.ep < 0) throw std::runtime_error(std::string("epoll_create1: ") + std::strerror(errno));
  m.wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (m.wake_fd < 0) throw std::runtime_error(std::string("eventfd: ") + std::strerror(errno));
  epoll_event e{};
  e.events = EPOLLIN;
  e.data.u64 = kListenerId;
  if (::epoll_ctl(m.ep, EPOLL_CTL_ADD, m.listen_fd, &e) != 0)
    throw std::runtime_error(std::string("epoll_ctl(listener): ") + std::strerror(errno));
  e.data.u64 = kWakeId;
  if (::epoll_ctl(m.ep, EPOLL_CTL_ADD, m.wake_fd, &e) != 0)
    throw std::runtime_error(std::string("epoll_ctl(eventfd): ") + std::strerror(errno));
}

HttpReactor::~HttpReactor() {
  try {
    stop(2000);
  } catch (...) {
  }
}

void HttpReactor::start() {
  Impl &m = *impl_;
  if (m.started) return;
  m.started = true;
  const unsigned n = std::max(1u, m.limits.workers);
  for (unsigned i = 0; i < n; ++i) m.workers.push_back(start_named_thread("tnx-http", [&m] { m.worker(); }));
  m.loop_thread = start_named_thread("tnx-reactor", [&m] { m.loop(); });
}

void HttpReactor::begin_stop() {
  Impl &m = *impl_;
  if (!m.started || m.stopped) return;
  m.stopping = true;
  m.wake();
}

void HttpReactor::stop(int grace_ms) {
  Impl &m = *impl_;
  if (!m.started || m.stopped) return;
  // 1. No new connections; idle ones close at the next tick.
  begin_stop();
  m.stopped = true;
  const auto deadline = Clock::now() + std::chrono::milliseconds(std::max(0, grace_ms));
  // 2. Requests being handled finish and their answers are written.
  for (;;) {
    bool quiet;
    {
      std::lock_guard<std::mutex> lock(m.job_mu);
      quiet = m.jobs.empty() && m.busy_workers.load() == 0;
    }
    if (quiet && m.n_streams.load() == 0) break;
    if (Clock::now() >= deadline) {
      if (const unsigned busy = m.busy_workers.load(); busy != 0)
        m.log.warn("stopping: " + std::to_string(busy) +
                   " request(s) still being handled after the drain timeout (a blocking SendMessage whose "
                   "Task runs on its request thread may be waiting for the store); their connections are "
                   "closed unanswered, and their Tasks finish or fail as the store allows");
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  // 3. Streams nobody ended are ended now (their queued frames written).
  if (const std::size_t open = m.n_streams.load(); open != 0) {
    m.log.warn("stopping: " + std::to_string(open) + " stream(s) still open after the drain timeout; ending them");
    m.end_streams = true;
    m.wake();
    std::this_thread::sleep_for(std::chrono::milliseconds(kTickMs));
  }
  // Give written answers a moment to leave (writes are non-blocking).
  std::this_thread::sleep_for(std::chrono::milliseconds(kTickMs));
  m.stop_loop = true;
  m.wake();
  if (m.loop_thread.joinable()) m.loop_thread.join();
  {
    std::lock_guard<std::mutex> lock(m.job_mu);
    m.stop_workers = true;
    m.jobs.clear();
  }
  m.job_sem.release(static_cast<uint32_t>(m.workers.size()));
  for (auto &w : m.workers) w.join();
  m.workers.clear();
  ::epoll_ctl(m.ep, EPOLL_CTL_DEL, m.listen_fd, nullptr);
  m.listener.close();
}

std::size_t HttpReactor::open_connections() const noexcept { return impl_->n_conns.load(); }
std::size_t HttpReactor::open_streams() const noexcept { return impl_->n_streams.load(); }

}  // namespace toolnexus::server_detail

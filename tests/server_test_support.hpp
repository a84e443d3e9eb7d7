// tests/server_test_support.hpp: helpers for the server tests: a raw-socket
// HTTP/1.1 client (so tests control every byte: chunked bodies, slow
// clients, invalid UTF-8), JSON-RPC calls, temporary directories, polling.
#ifndef TOOLNEXUS_TESTS_SERVER_TEST_SUPPORT_HPP
#define TOOLNEXUS_TESTS_SERVER_TEST_SUPPORT_HPP

#include "toolnexus/registry.hpp"
#include "toolnexus/server.hpp"

#include <doctest/doctest.h>
#include <rapidjson/document.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace tnxtest {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

/// A fresh directory under the system temp dir, removed on destruction.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::random_device rd;
    path = std::filesystem::temp_directory_path() /
           ("toolnexus-server-test-" + std::to_string(::getpid()) + "-" + std::to_string(rd()));
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string str() const { return path.string(); }
};

/// "127.0.0.1", port from "http://127.0.0.1:PORT/".
inline int port_of(const std::string &url) {
  const auto colon = url.rfind(':');
  return std::atoi(url.c_str() + colon + 1);
}

struct HttpResponse {
  int status = 0;
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;
  /// The server closed the connection without a (complete) response.
  bool closed = false;
  std::string header(const std::string &name) const {
    auto it = headers.find(name);
    return it == headers.end() ? std::string() : it->second;
  }
};

/// One HTTP/1.1 connection to 127.0.0.1:port.
class Connection {
 public:
  /// `rcvbuf` > 0: the socket's receive buffer (set before connecting), to
  /// play a client that reads slowly.
  explicit Connection(int port, int rcvbuf = 0) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    if (rcvbuf > 0) ::setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd_, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0)
      throw std::runtime_error(std::string("connect: ") + std::strerror(errno));
    int one = 1;
    ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  ~Connection() {
    if (fd_ >= 0) ::close(fd_);
  }
  Connection(const Connection &) = delete;
  Connection &operator=(const Connection &) = delete;

  /// Sends bytes; false when the peer is gone.
  bool send_raw(std::string_view bytes) {
    std::size_t off = 0;
    while (off < bytes.size()) {
      const ssize_t n = ::send(fd_, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return false;
      off += static_cast<std::size_t>(n);
    }
    return true;
  }

  /// True when the server closed the connection within `timeout` (reads and
  /// discards anything it sends first).
  bool closed_within(std::chrono::milliseconds timeout) {
    const auto deadline = Clock::now() + timeout;
    char buf[4096];
    while (Clock::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (::poll(&p, 1, static_cast<int>(std::max<long long>(1, left.count()))) <= 0) continue;
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) return true;
      received_.append(buf, static_cast<std::size_t>(n));
    }
    return false;
  }

  /// Reads one response (Content-Length bodies; else until close). The
  /// timeout is a liveness bound for a loaded 2-core machine (a request may
  /// wait queue_wait_ms, 10 s, for a worker), not a speed goal.
  HttpResponse read_response(std::chrono::milliseconds timeout = 30000ms) {
    HttpResponse r;
    const auto deadline = Clock::now() + timeout;
    std::string &in = received_;
    std::size_t header_end = std::string::npos;
    std::size_t body_len = std::string::npos;
    char buf[65536];
    for (;;) {
      if (header_end == std::string::npos) {
        header_end = in.find("\r\n\r\n");
        if (header_end != std::string::npos) {
          parse_head(in.substr(0, header_end), r);
          const std::string cl = r.header("content-length");
          if (!cl.empty()) body_len = std::stoul(cl);
          if (r.status == 304 || r.status == 204) body_len = 0;  // never a body (RFC 9110 section 6.4.1)
        }
      }
      if (header_end != std::string::npos && body_len != std::string::npos &&
          in.size() >= header_end + 4 + body_len) {
        r.body = in.substr(header_end + 4, body_len);
        in.erase(0, header_end + 4 + body_len);
        return r;
      }
      if (Clock::now() > deadline) throw std::runtime_error("timed out waiting for a response");
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) {
        if (header_end != std::string::npos && body_len == std::string::npos) {
          r.body = in.substr(header_end + 4);
          in.clear();
          return r;
        }
        r.closed = true;
        return r;
      }
      in.append(buf, static_cast<std::size_t>(n));
    }
  }

  /// Reads one interim (1xx) response: a header block without a body.
  HttpResponse read_interim(std::chrono::milliseconds timeout = 5000ms) {
    HttpResponse r;
    const auto deadline = Clock::now() + timeout;
    char buf[4096];
    for (;;) {
      const std::size_t end = received_.find("\r\n\r\n");
      if (end != std::string::npos) {
        parse_head(received_.substr(0, end), r);
        received_.erase(0, end + 4);
        return r;
      }
      if (Clock::now() > deadline) throw std::runtime_error("timed out waiting for an interim response");
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) {
        r.closed = true;
        return r;
      }
      received_.append(buf, static_cast<std::size_t>(n));
    }
  }

  /// POST / with `body` and extra header lines ("Name: value\r\n").
  HttpResponse post(const std::string &body, const std::string &extra_headers = {}, const std::string &path = "/") {
    const std::string req = "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n" +
                            extra_headers + "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
    if (!send_raw(req)) {
      HttpResponse r;
      r.closed = true;
      return r;
    }
    return read_response();
  }

  HttpResponse get(const std::string &path, const std::string &extra_headers = {}) {
    const std::string req = "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n" + extra_headers + "\r\n";
    if (!send_raw(req)) {
      HttpResponse r;
      r.closed = true;
      return r;
    }
    return read_response();
  }

  int fd() const noexcept { return fd_; }
  /// Bytes received but not consumed by read_response/read_interim.
  std::string take_received() {
    std::string out;
    out.swap(received_);
    return out;
  }

 private:
  static void parse_head(const std::string &head, HttpResponse &r) {
    std::size_t pos = head.find("\r\n");
    const std::string status_line = head.substr(0, pos);
    if (status_line.size() >= 12) r.status = std::atoi(status_line.c_str() + 9);
    while (pos != std::string::npos && pos < head.size()) {
      const std::size_t next = head.find("\r\n", pos + 2);
      const std::string line = head.substr(pos + 2, next == std::string::npos ? std::string::npos : next - pos - 2);
      const auto colon = line.find(':');
      if (colon != std::string::npos) {
        std::string name = line.substr(0, colon);
        for (char &c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        std::string value = line.substr(colon + 1);
        while (!value.empty() && value.front() == ' ') value.erase(0, 1);
        r.headers[name] = value;
      }
      pos = next;
    }
  }

  int fd_ = -1;
  std::string received_;
};

/// One server-sent event.
struct SseEvent {
  std::string id;
  std::string event;  // "" = message
  std::string data;
  std::string retry;  // the frame's "retry:" field ("" = none)
};

/// Reads a text/event-stream response (chunked or close-delimited) from a
/// Connection, event by event.
class SseReader {
 public:
  /// Sends `request` (complete HTTP request bytes) on `conn` and reads the
  /// response head; `status()` and `header()` tell what came back.
  SseReader(Connection &conn, const std::string &request) : conn_(conn) {
    conn_.send_raw(request);
    head_ = conn_.read_interim(5000ms);
    chunked_ = lower(head_.header("transfer-encoding")) == "chunked";
    raw_ = conn_.take_received();
  }
  int status() const { return head_.status; }
  std::string header(const std::string &name) const { return head_.header(name); }
  const HttpResponse &head() const { return head_; }

  /// The next event, or nullopt when the stream ended (last chunk or
  /// close) or `timeout` passed (then timed_out() is true).
  std::optional<SseEvent> next(std::chrono::milliseconds timeout = 5000ms) {
    timed_out_ = false;
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      if (auto e = take_event()) return e;
      if (ended_) return std::nullopt;
      if (Clock::now() > deadline) {
        timed_out_ = true;
        return std::nullopt;
      }
      pump(50);
    }
  }
  /// Comments (": ...") seen so far.
  const std::vector<std::string> &comments() const { return comments_; }
  bool ended() const { return ended_; }
  bool timed_out() const { return timed_out_; }
  /// What arrived but is no whole event (for failure messages).
  std::string unparsed() const { return text_ + raw_; }
  /// Reads the rest of the stream (up to `timeout`); returns the events.
  std::vector<SseEvent> rest(std::chrono::milliseconds timeout = 5000ms) {
    std::vector<SseEvent> out;
    while (auto e = next(timeout)) out.push_back(std::move(*e));
    return out;
  }

 private:
  static std::string lower(std::string s) {
    for (char &c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  }
  // Moves whatever arrived into text_, de-chunking.
  void pump(int wait_ms) {
    dechunk();
    if (text_.find("\n\n") != std::string::npos || ended_) return;
    char buf[65536];
    pollfd p{conn_.fd(), POLLIN, 0};
    if (::poll(&p, 1, wait_ms) > 0) {
      const ssize_t n = ::recv(conn_.fd(), buf, sizeof buf, 0);
      if (n <= 0) {
        ended_ = true;
      } else {
        raw_.append(buf, static_cast<std::size_t>(n));
      }
    }
    dechunk();
  }
  void dechunk() {
    if (!chunked_) {
      text_ += raw_;
      raw_.clear();
      return;
    }
    for (;;) {
      const std::size_t eol = raw_.find("\r\n");
      if (eol == std::string::npos) return;
      const std::size_t size = std::stoul(raw_.substr(0, eol), nullptr, 16);
      if (raw_.size() < eol + 2 + size + 2) return;
      if (size == 0) {
        ended_ = true;
        raw_.erase(0, eol + 4);
        return;
      }
      text_ += raw_.substr(eol + 2, size);
      raw_.erase(0, eol + 2 + size + 2);
    }
  }
  std::optional<SseEvent> take_event() {
    for (;;) {
      const std::size_t end = text_.find("\n\n");
      if (end == std::string::npos) return std::nullopt;
      const std::string block = text_.substr(0, end);
      text_.erase(0, end + 2);
      SseEvent e;
      bool any = false;
      std::size_t pos = 0;
      while (pos <= block.size()) {
        std::size_t nl = block.find('\n', pos);
        if (nl == std::string::npos) nl = block.size();
        const std::string line = block.substr(pos, nl - pos);
        pos = nl + 1;
        if (line.empty()) continue;
        if (line[0] == ':') {
          comments_.push_back(line.substr(line.size() > 1 && line[1] == ' ' ? 2 : 1));
          continue;
        }
        const std::size_t colon = line.find(':');
        const std::string field = line.substr(0, colon);
        std::string value = colon == std::string::npos ? std::string() : line.substr(colon + 1);
        if (!value.empty() && value[0] == ' ') value.erase(0, 1);
        if (field == "id") e.id = value;
        else if (field == "event") e.event = value;
        else if (field == "retry") e.retry = value;
        else if (field == "data") e.data += (e.data.empty() ? "" : "\n") + value, any = true;
      }
      if (any) return e;
    }
  }

  Connection &conn_;
  HttpResponse head_;
  bool chunked_ = false;
  bool ended_ = false;
  bool timed_out_ = false;
  std::string raw_;
  std::string text_;
  std::vector<std::string> comments_;
};

/// A JSON-RPC POST request's bytes.
inline std::string rpc_request(const std::string &method, const std::string &params, const std::string &id = "1",
                               const std::string &extra_headers = {}) {
  const std::string body =
      R"({"jsonrpc":"2.0","id":)" + id + R"(,"method":")" + method + R"(","params":)" + params + "}";
  return "POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\n" +
         extra_headers + "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

/// Parses JSON, failing the test when it is not JSON.
inline rapidjson::Document parse(const std::string &json) {
  rapidjson::Document d;
  d.Parse(json.data(), json.size());
  REQUIRE_MESSAGE(!d.HasParseError(), "not JSON: " << json.substr(0, 500));
  return d;
}

inline std::string to_json(const rapidjson::Value &v) {
  rapidjson::StringBuffer b;
  rapidjson::Writer<rapidjson::StringBuffer> w(b);
  v.Accept(w);
  return std::string(b.GetString(), b.GetSize());
}

/// JSON string literal for `s`.
inline std::string q(std::string_view s) {
  rapidjson::StringBuffer b;
  rapidjson::Writer<rapidjson::StringBuffer> w(b);
  w.String(s.data(), static_cast<rapidjson::SizeType>(s.size()));
  return std::string(b.GetString(), b.GetSize());
}

/// A messageId no other message of this test process (nor, with high
/// probability, of another) uses: "m-<random>-<n>". The server treats a
/// second SendMessage with a messageId it has seen (same principal and
/// contextId, or same Task) as a retry of the first (docs/a2a.md,
/// "Idempotent retries"), so tests that mean two sends use two of these.
inline std::string unique_message_id() {
  static const std::string prefix = [] {
    std::random_device rd;
    return "m-" + std::to_string(rd()) + "-";
  }();
  static std::atomic<uint64_t> n{0};
  return prefix + std::to_string(++n);
}

/// A JSON-RPC client on one keep-alive connection.
class Client {
 public:
  explicit Client(const std::string &url, std::string token = {})
      : conn_(port_of(url)), token_(std::move(token)) {}

  /// Sends {"jsonrpc":"2.0","id":<id_json>,"method":...,"params":<params_json>}
  /// (params left out when empty) and returns the parsed answer.
  rapidjson::Document call(const std::string &method, const std::string &params_json,
                           const std::string &id_json = "1", const std::string &extra_headers = {}) {
    std::string body = R"({"jsonrpc":"2.0","id":)" + id_json + R"(,"method":)" + q(method);
    if (!params_json.empty()) body += R"(,"params":)" + params_json;
    body += "}";
    last_ = post(body, extra_headers);
    REQUIRE_MESSAGE(last_.status == 200, "HTTP " << last_.status << ": " << last_.body);
    return parse(last_.body);
  }

  HttpResponse post(const std::string &body, const std::string &extra_headers = {}) {
    std::string headers = extra_headers;
    if (!token_.empty()) headers += "Authorization: Bearer " + token_ + "\r\n";
    return conn_.post(body, headers);
  }

  /// SendMessage with one text part; `extra` is spliced into the message
  /// object (e.g. R"("taskId":"...")"). Without a `configuration` the call
  /// is non-blocking ({"blocking":false}: answered at once with the Task as
  /// saved); the protocol's default is blocking.
  rapidjson::Document send(const std::string &text, const std::string &extra = {},
                           std::string configuration = R"({"blocking":false})") {
    std::string msg = R"({"role":"user","messageId":)" + q(unique_message_id()) +
                      R"(,"parts":[{"kind":"text","text":)" + q(text) + "}]";
    if (!extra.empty()) msg += "," + extra;
    msg += "}";
    std::string params = R"({"message":)" + msg;
    if (!configuration.empty()) params += R"(,"configuration":)" + configuration;
    params += "}";
    return call("SendMessage", params);
  }

  rapidjson::Document get_task(const std::string &id, const std::string &more = {}) {
    return call("GetTask", R"({"id":)" + q(id) + (more.empty() ? "" : "," + more) + "}");
  }

  /// Polls GetTask until the state is not submitted/working (or `timeout`).
  rapidjson::Document wait_settled(const std::string &id, std::chrono::milliseconds timeout = 5000ms) {
    const auto deadline = Clock::now() + timeout;
    for (;;) {
      rapidjson::Document d = get_task(id);
      REQUIRE_MESSAGE(d.HasMember("result"), to_json(d));
      const std::string state = d["result"]["status"]["state"].GetString();
      if ((state != "submitted" && state != "working") || Clock::now() > deadline) return d;
      std::this_thread::sleep_for(2ms);
    }
  }

  const HttpResponse &last() const { return last_; }
  Connection &connection() { return conn_; }

 private:
  Connection conn_;
  std::string token_;
  HttpResponse last_;
};

/// result.id of a SendMessage answer.
inline std::string task_id(const rapidjson::Document &d) {
  REQUIRE_MESSAGE(d.HasMember("result"), to_json(d));
  return d["result"]["id"].GetString();
}

inline std::string state_of(const rapidjson::Document &d) {
  REQUIRE_MESSAGE(d.HasMember("result"), to_json(d));
  return d["result"]["status"]["state"].GetString();
}

/// error.code of an answer (0 when it is not an error).
inline int error_code(const rapidjson::Document &d) {
  if (!d.HasMember("error")) return 0;
  return d["error"]["code"].GetInt();
}

inline std::string error_message(const rapidjson::Document &d) {
  if (!d.HasMember("error")) return {};
  return d["error"]["message"].GetString();
}

/// Options for an in-process test server on a free loopback port, quiet.
inline toolnexus::ServerOptions test_options() {
  toolnexus::ServerOptions o;
  o.listen = "127.0.0.1:0";
  o.log_level = toolnexus::LogLevel::error;
  return o;
}

/// The Task as stored (with the server-private metadata clients never see),
/// read from the server's store; fails the test when it is not there.
inline rapidjson::Document stored_task(const toolnexus::ServerHandle &server, const std::string &id) {
  auto rec = server.store()->get(id);
  REQUIRE_MESSAGE(rec.has_value(), "Task " << id << " is not in the store");
  return parse(rec->json);
}

/// The text of the first artifact: its text parts concatenated (the echo
/// agent streams its reply as several chunks, each a part).
inline std::string artifact_text(const rapidjson::Value &task) {
  if (!task.HasMember("artifacts") || task["artifacts"].Empty()) return {};
  std::string out;
  for (const auto &p : task["artifacts"][0]["parts"].GetArray())
    if (p.HasMember("text")) out += p["text"].GetString();
  return out;
}

/// The text of status.message.
inline std::string status_text(const rapidjson::Value &task) {
  if (!task["status"].HasMember("message")) return {};
  return task["status"]["message"]["parts"][0]["text"].GetString();
}

/// Waits until `pred` holds or `timeout` passes; returns pred().
inline bool eventually(const std::function<bool()> &pred, std::chrono::milliseconds timeout = 5000ms) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return pred();
}

/// An agent that holds every Task working until `released` (or a cancel),
/// then completes it with the user's text as an artifact. Thread-safe.
class HoldGate final : public toolnexus::AgentExecutor {
 public:
  std::string name() const override { return "gate"; }
  std::vector<toolnexus::AgentSkill> skills() const override { return {}; }
  toolnexus::ExecutionResult execute(const toolnexus::ExecutionContext &ctx) override {
    ++entered;
    while (!released && !ctx.cancel_requested) std::this_thread::sleep_for(1ms);
    auto r = toolnexus::ExecutionResult::completed();
    r.add_text_artifact(ctx.latest_text);
    return r;
  }
  std::atomic<int> entered{0};
  std::atomic<bool> released{false};
};

}  // namespace tnxtest

#endif  // TOOLNEXUS_TESTS_SERVER_TEST_SUPPORT_HPP

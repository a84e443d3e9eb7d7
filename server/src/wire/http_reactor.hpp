// server/src/wire/http_reactor.hpp: the server's HTTP/1.1 connection layer.
//
// Why not Poco's HTTPServer: it gives each connection a thread from the
// moment it is accepted and reads the request header with a per-read
// timeout, so a client that trickles one header byte a second holds a
// thread for ever, and a few hundred such clients shut everybody else out
// (slowloris). It also ties an SSE stream to a thread for its whole life. So
// connections live in one epoll loop (the reactor) until a request is
// complete; only complete requests reach the worker threads, and a worker
// never reads from or writes to a socket. Poco still does the HTTP work that
// is easy to get wrong: the request line and header fields are parsed by
// Poco::Net::HTTPRequest::read, response headers written by
// Poco::Net::HTTPResponse::write, sockets are Poco StreamSockets.
//
// What the reactor enforces (RFC 9112 message framing; limits from
// ServerLimits):
//   - idle connections (no byte of a next request) are closed after
//     keep_alive_timeout_ms (a new connection: read_timeout_ms);
//   - a request whose header or body stops arriving for read_timeout_ms
//     gets 408;
//   - a request header must be complete header_timeout_ms after its first
//     byte (else 408), and at most max_header_bytes long (else 431);
//   - a body must be complete body_deadline_ms after the header (else 408),
//     at most max_body_bytes (413, answered before the body is read when
//     Content-Length announces it);
//   - framing: a Content-Length that is not a plain decimal number, two
//     different Content-Lengths, Content-Length with Transfer-Encoding, a bad
//     chunk size or chunk terminator: 400; a transfer coding other than
//     chunked: 501;
//   - a response or stream that makes no write progress for
//     read_timeout_ms (responses) / stream_stall_ms (streams) is dropped;
//   - at most max_open_connections sockets (further accepts are closed at
//     once); at most max_queued_requests complete requests wait for a worker
//     (further ones get 503).
// Errors it answers itself carry a JSON body {"error": <reason phrase>,
// "message": <what was wrong>} and close the connection (after a lingering
// half-close so that the client reads the answer).
#ifndef TOOLNEXUS_SERVER_HTTP_REACTOR_HPP
#define TOOLNEXUS_SERVER_HTTP_REACTOR_HPP

#include "common/log.hpp"

#include <Poco/Net/HTTPRequest.h>
#include <Poco/Net/ServerSocket.h>
#include <Poco/Net/SocketAddress.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace toolnexus::server_detail {

/// Limits of the connection layer (see the file comment).
struct ReactorLimits {
  std::size_t max_header_bytes = 32 * 1024;
  std::size_t max_body_bytes = 1 << 20;
  int header_timeout_ms = 10000;
  int body_deadline_ms = 30000;
  int keep_alive_timeout_ms = 10000;
  /// A request under way (header or body) silent this long gets 408; a new
  /// connection that sends nothing for this long is closed.
  int read_timeout_ms = 10000;
  /// A plain response that makes no write progress for this long is dropped.
  int write_timeout_ms = 10000;
  /// An SSE stream whose client reads nothing for this long is dropped.
  int stream_stall_ms = 60000;
  unsigned workers = 128;
  std::size_t max_queued_requests = 4096;
  std::size_t max_open_connections = 20000;
  /// Software name for the Server header ("" = none).
  std::string server_name;
};

/// One complete request, as the reactor read it. Owned by the worker while
/// its handler runs.
struct HttpRequest {
  /// Request line and header fields (parsed by Poco).
  Poco::Net::HTTPRequest head;
  /// The request path without the query ("/tasks/x:cancel"), still
  /// percent-encoded.
  std::string path;
  /// The decoded body (a chunked body de-chunked); at most max_body_bytes.
  std::string body;
  /// Whether the body was sent (Content-Length > 0 or chunked).
  bool has_body = false;
  /// The client's address.
  Poco::Net::SocketAddress peer;
  /// This server's side of the connection: the local address and port the
  /// client connected to (getsockname of the accepted socket; a wildcard
  /// listen address gives the interface's own address). Default-constructed
  /// (0.0.0.0:0) when it could not be read.
  Poco::Net::SocketAddress local;
};

/// A complete response to one request.
struct HttpReply {
  int status = 200;
  /// Content-Type ("" = none).
  std::string content_type = "application/json";
  /// Further header fields.
  std::vector<std::pair<std::string, std::string>> headers;
  /// The content (never sent with status 304 or 204, whose answers end at
  /// their header block without a Content-Length).
  std::string body;
  /// Close the connection after this response.
  bool close = false;
  /// HEAD: headers only (Content-Length still says the body's size).
  bool head_only = false;
};

/// {"error": <reason phrase of status>, "message": `message`} as an
/// HttpReply with that status.
HttpReply http_error_reply(int status, std::string_view message);

/// An open server-sent-events response (WHATWG HTML "Server-sent events";
/// text/event-stream). Shared between the reactor (which writes it to the
/// socket) and whoever produces events (any thread). Thread-safe.
///
/// Producers append complete SSE frames with write(); the bytes are queued
/// and written by the reactor without ever blocking the producer. A
/// producer that keeps producing while the client reads nothing sees
/// pending() grow: it should stop and wait for the drain callback (see
/// set_on_drain), which the reactor calls when the queue empties. Nothing
/// is dropped silently: the stream is either written in full or closed.
class SseStream {
 public:
  /// Appends `frame` (one or more complete SSE events, each ending in a
  /// blank line). Returns false (and queues nothing) once the stream is
  /// closed (client gone, stalled, server stopping) or ended.
  bool write(std::string_view frame);
  /// Ends the stream after the queued bytes (chunked: writes the last
  /// chunk; the connection may then serve another request). Idempotent.
  void end();
  /// Bytes queued and not yet written to the socket.
  std::size_t pending() const;
  /// True once the stream can take no more frames (closed or ended).
  bool closed() const noexcept { return closed_.load() || ended_.load(); }
  /// `fn` runs on the reactor thread each time the queue becomes empty
  /// after a write, and once when the stream closes (then closed() is
  /// true). It must not block; it may call write() and end(). Replaces a
  /// previous callback.
  void set_on_drain(std::function<void()> fn);
  /// The request this stream answers (for logging). Unchanging.
  const std::string &label() const noexcept { return label_; }

  /// Internal (the reactor's side).
  struct Internal;
  SseStream(std::string label, std::function<void()> wake);
  ~SseStream();

 private:
  friend struct Internal;
  mutable std::mutex mu_;
  std::string queued_;
  std::function<void()> on_drain_;
  std::function<void()> wake_;
  std::string label_;
  std::atomic<bool> closed_{false};
  std::atomic<bool> ended_{false};
  std::atomic<bool> end_requested_{false};
};

/// How a handler answers its request: exactly one of reply() or
/// start_stream(), from the worker thread running the handler (a handler
/// that returns without either answers 500).
class Responder {
 public:
  virtual ~Responder() = default;
  /// Sends a complete response.
  virtual void reply(HttpReply reply) = 0;
  /// Sends "200" with Content-Type text/event-stream (plus `headers`) and
  /// returns the stream, which lives on after the handler returns. The
  /// response is chunked for HTTP/1.1 clients (the connection is reusable
  /// after end()) and close-delimited for HTTP/1.0 ones. Returns nullptr
  /// when the client is already gone.
  virtual std::shared_ptr<SseStream> start_stream(std::vector<std::pair<std::string, std::string>> headers,
                                                  std::string label) = 0;
  /// True once reply() or start_stream() was called.
  virtual bool answered() const noexcept = 0;
};

/// Runs on a worker thread for each complete request. May throw: the
/// exception is logged and answered 500 (unless the handler answered).
using HttpHandler = std::function<void(HttpRequest &, Responder &)>;

/// The epoll loop and its worker threads. start()/stop() from one thread.
class HttpReactor {
 public:
  /// Takes a bound, listening socket. Throws std::runtime_error when epoll
  /// or the wake-up eventfd cannot be created.
  HttpReactor(Poco::Net::ServerSocket listener, ReactorLimits limits, HttpHandler handler, const Logger &log);
  ~HttpReactor();
  HttpReactor(const HttpReactor &) = delete;
  HttpReactor &operator=(const HttpReactor &) = delete;

  /// Starts the loop thread and the workers.
  void start();
  /// Stops accepting and closes idle connections; requests being handled
  /// and open streams go on (answers say Connection: close). Idempotent.
  void begin_stop();
  /// begin_stop(), then lets requests being handled finish and their
  /// answers be written, and streams end (their writers end them), up to
  /// `grace_ms`; then ends the streams still open (their queued events
  /// written), closes everything and joins the threads. Idempotent.
  void stop(int grace_ms);

  /// Open sockets (idle, reading, handled, writing, streaming).
  std::size_t open_connections() const noexcept;
  /// Open SSE streams.
  std::size_t open_streams() const noexcept;

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace toolnexus::server_detail

#endif  // TOOLNEXUS_SERVER_HTTP_REACTOR_HPP

// server/src/bindings/http.hpp: the HTTP routes. POST / goes to the JSON-RPC
// methods, GET /.well-known/agent-card.json (and agent.json) to the card,
// the HTTP+JSON paths to the REST binding (rest.hpp); everything else is
// 404. Bearer authentication (401 with WWW-Authenticate) and one debug log
// line per request. Connections, framing, limits and timeouts are the
// reactor's (http_reactor.hpp).
#ifndef TOOLNEXUS_SERVER_HTTP_HPP
#define TOOLNEXUS_SERVER_HTTP_HPP

#include "bindings/console.hpp"
#include "bindings/operator.hpp"
#include "service/a2a_methods.hpp"
#include "wire/agent_card.hpp"
#include "wire/auth.hpp"
#include "bindings/jwt_auth.hpp"
#include "common/log.hpp"
#include "delivery/streams.hpp"
#include "domain/task_watch.hpp"

#include <cstdint>
#include <memory>
#include <string>

namespace toolnexus::server_detail {

/// What the request handlers use; must outlive the HttpFrontend.
struct HttpServices {
  A2AMethods *methods = nullptr;
  const TokenAuth *auth = nullptr;
  /// Bearer JWT validation (auth.jwt); null = off. Tried for a bearer
  /// credential the token file does not know.
  const JwtAuth *jwt = nullptr;
  const CardConfig *card = nullptr;
  const Logger *log = nullptr;
  /// Where streams subscribe.
  TaskWatch *watch = nullptr;
  StreamSettings streams;
  ServerLimits limits;
  /// Host (as in the listen address; IPv6 in brackets) used with the bound
  /// port in the card url when a request names no usable host.
  std::string fallback_host;
  /// /healthz and /readyz (before any check of the API); null = none.
  OperatorEndpoints *operator_endpoints = nullptr;
  /// Where A2A requests are counted; null = nowhere.
  ServerMetrics *metrics = nullptr;
  /// The approval console's files under /console/ (after the Host and
  /// Origin checks, without authentication: the page holds no Task data);
  /// null = console off, /console/ is 404.
  const ConsoleFiles *console = nullptr;
};

/// Splits "HOST:PORT" / "[V6]:PORT" / ":PORT". Throws std::invalid_argument
/// naming the text when it is not of that shape or the port is not 0..65535.
void split_listen(const std::string &listen, std::string &host, uint16_t &port);

/// The HTTP server: a listening socket served by an HttpReactor (one event
/// loop for every connection, limits.max_connections request threads).
/// start()/stop() from one thread; stop() is idempotent.
class HttpFrontend {
 public:
  /// Binds (throws std::runtime_error naming the address when it cannot).
  HttpFrontend(const std::string &host, uint16_t port, HttpServices services);
  ~HttpFrontend();
  HttpFrontend(const HttpFrontend &) = delete;
  HttpFrontend &operator=(const HttpFrontend &) = delete;

  void start();
  /// Stops accepting connections and closes idle keep-alive ones; requests
  /// in progress and streams go on (HttpReactor::begin_stop).
  void begin_stop();
  /// Stops accepting connections, lets requests in progress finish (and their
  /// responses be sent), closes idle keep-alive connections, and waits (up
  /// to `grace_ms`) for all of it and for the streams to be ended by their
  /// writers; then ends the streams left.
  void stop(int grace_ms);
  /// The bound port.
  uint16_t port() const noexcept { return port_; }
  /// Open sockets and SSE streams.
  std::size_t open_connections() const noexcept;
  std::size_t open_streams() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  uint16_t port_ = 0;
};

}  // namespace toolnexus::server_detail

#endif  // TOOLNEXUS_SERVER_HTTP_HPP

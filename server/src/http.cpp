// The Poco HTTPServer glue.
#include "http.hpp"

#include "rest.hpp"

#include <Poco/Net/HTTPRequestHandler.h>
#include <Poco/Net/HTTPRequestHandlerFactory.h>
#include <Poco/Net/HTTPServerConnectionFactory.h>
#include <Poco/Net/HTTPServerParams.h>
#include <Poco/Net/HTTPServerRequest.h>
#include <Poco/Net/HTTPServerResponse.h>
#include <Poco/Net/NetException.h>
#include <Poco/Net/ServerSocket.h>
#include <Poco/Net/SocketAddress.h>
#include <Poco/Net/StreamSocket.h>
#include <Poco/Net/TCPServer.h>
#include <Poco/ThreadPool.h>
#include <Poco/Exception.h>
#include <Poco/URI.h>

#include <atomic>
#include <algorithm>
#include <chrono>
#include <istream>
#include <stdexcept>
#include <thread>

namespace toolnexus::server_detail {

using Poco::Net::HTTPRequestHandler;
using Poco::Net::HTTPResponse;
using Poco::Net::HTTPServerRequest;
using Poco::Net::HTTPServerResponse;

void split_listen(const std::string &listen, std::string &host, uint16_t &port) {
  const auto bad = [&](const std::string &why) {
    return std::invalid_argument("invalid listen address '" + listen + "': " + why +
                                 " (expected HOST:PORT, [IPV6]:PORT or :PORT)");
  };
  std::string port_text;
  if (!listen.empty() && listen.front() == '[') {
    const auto close = listen.find(']');
    if (close == std::string::npos || close + 1 >= listen.size() || listen[close + 1] != ':')
      throw bad("unterminated IPv6 address");
    host = listen.substr(1, close - 1);
    port_text = listen.substr(close + 2);
  } else {
    const auto colon = listen.rfind(':');
    if (colon == std::string::npos) throw bad("no port");
    host = listen.substr(0, colon);
    port_text = listen.substr(colon + 1);
    if (host.find(':') != std::string::npos) throw bad("IPv6 addresses go in brackets");
  }
  if (host.empty()) host = "0.0.0.0";
  if (port_text.empty() || port_text.size() > 5 || port_text.find_first_not_of("0123456789") != std::string::npos)
    throw bad("the port must be a number");
  const unsigned long p = std::stoul(port_text);
  if (p > 65535) throw bad("the port must be 0..65535");
  port = static_cast<uint16_t>(p);
}

namespace {

using Clock = std::chrono::steady_clock;

// Reused per connection thread.
struct ThreadBuffers {
  std::string body;
  ResponseWriter out;
  std::string method;
  std::string answer;
};

ThreadBuffers &buffers() {
  thread_local ThreadBuffers b;
  return b;
}

void send_json(HTTPServerResponse &resp, HTTPResponse::HTTPStatus status, std::string_view json) {
  resp.setStatusAndReason(status);
  resp.setContentType("application/json");
  resp.sendBuffer(json.data(), json.size());
}

// A small {"error": <reason>, "message": <text>} body for non-JSON-RPC answers.
void send_http_error(HTTPServerResponse &resp, HTTPResponse::HTTPStatus status, std::string_view message) {
  rapidjson::StringBuffer buf;
  rapidjson::Writer<rapidjson::StringBuffer> w(buf);
  w.StartObject();
  w.Key("error");
  const std::string &reason = HTTPResponse::getReasonForStatus(status);
  w.String(reason.data(), static_cast<rapidjson::SizeType>(reason.size()));
  w.Key("message");
  w.String(message.data(), static_cast<rapidjson::SizeType>(message.size()));
  w.EndObject();
  send_json(resp, status, std::string_view(buf.GetString(), buf.GetSize()));
}

bool has_body(const HTTPServerRequest &req) {
  return req.getChunkedTransferEncoding() || req.getContentLength64() > 0;
}

// The decoded query parameters of the request URI (empty when it has none
// or they cannot be decoded).
std::vector<std::pair<std::string, std::string>> query_of(const std::string &uri) {
  if (uri.find('?') == std::string::npos) return {};
  try {
    return Poco::URI(uri).getQueryParameters();
  } catch (const Poco::Exception &) {
    return {};
  }
}

// The A2A-Version service parameter: the header, else the query parameter
// (A2A v1.0 section 3.6).
std::string a2a_version_of(const HTTPServerRequest &req,
                           const std::vector<std::pair<std::string, std::string>> &query) {
  const std::string &header = req.get("A2A-Version", Poco::Net::HTTPMessage::EMPTY);
  if (!header.empty()) return header;
  for (const auto &[name, value] : query)
    if (name == "A2A-Version" || name == "a2a-version") return value;
  return {};
}

// A body's Content-Type is JSON (application/json or application/a2a+json,
// any parameters), or absent.
bool json_content_type(const HTTPServerRequest &req) {
  std::string_view ct = req.getContentType();
  ct = ct.substr(0, ct.find(';'));
  while (!ct.empty() && ct.back() == ' ') ct.remove_suffix(1);
  if (ct.empty()) return true;
  std::string lower(ct);
  for (char &c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return lower == "application/json" || lower == "application/a2a+json";
}

class RequestHandler final : public HTTPRequestHandler {
 public:
  RequestHandler(const HttpServices &s, const std::string &fallback) : s_(s), fallback_(fallback) {}

  void handleRequest(HTTPServerRequest &req, HTTPServerResponse &resp) override {
    const auto started = Clock::now();
    ThreadBuffers &b = buffers();
    b.method.clear();
    std::string principal;
    int status = 0;
    const std::string &uri = req.getURI();
    const std::string_view path = std::string_view(uri).substr(0, std::string_view(uri).find('?'));
    try {
      if (path == "/") {
        if (req.getMethod() == Poco::Net::HTTPRequest::HTTP_POST) {
          status = rpc(req, resp, b, principal);
        } else {
          status = not_found(req, resp);
        }
      } else if ((path == "/.well-known/agent-card.json" || path == "/.well-known/agent.json") &&
                 (req.getMethod() == Poco::Net::HTTPRequest::HTTP_GET ||
                  req.getMethod() == Poco::Net::HTTPRequest::HTTP_HEAD)) {
        status = card(req, resp);
      } else {
        RestRoute route;
        std::string allow;
        switch (match_rest_route(req.getMethod(), path, route, allow)) {
          case RestMatch::matched: status = rest(req, resp, b, principal, route); break;
          case RestMatch::method_not_allowed: status = method_not_allowed(req, resp, allow); break;
          case RestMatch::not_found: status = not_found(req, resp); break;
        }
      }
    } catch (const Poco::Exception &e) {
      // The client went away or timed out mid-request: nothing to answer.
      resp.setKeepAlive(false);
      if (s_.log->enabled(LogLevel::debug))
        s_.log->debug(req.getMethod() + " " + std::string(path) + ": connection error: " + e.displayText());
      return;
    } catch (const std::exception &e) {
      s_.log->error(req.getMethod() + " " + std::string(path) + ": " + e.what());
      resp.setKeepAlive(false);
      if (!resp.sent()) send_http_error(resp, HTTPResponse::HTTP_INTERNAL_SERVER_ERROR, "internal error");
      return;
    }
    if (s_.log->enabled(LogLevel::debug)) {
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - started).count();
      std::string line = req.getMethod() + " " + std::string(path);
      if (!b.method.empty()) line += " " + b.method.substr(0, 100);
      line += " " + std::to_string(status) + " " + std::to_string(ms) + "ms";
      if (!principal.empty()) line += " principal=" + principal;
      s_.log->debug(line);
    }
  }

 private:
  int not_found(HTTPServerRequest &req, HTTPServerResponse &resp) {
    if (has_body(req)) resp.setKeepAlive(false);
    send_http_error(resp, HTTPResponse::HTTP_NOT_FOUND,
                    "not found: POST / for JSON-RPC, GET /.well-known/agent-card.json for the card, "
                    "/message:send, /tasks, /tasks/{id} and /tasks/{id}:cancel for HTTP+JSON");
    return 404;
  }

  int method_not_allowed(HTTPServerRequest &req, HTTPServerResponse &resp, const std::string &allow) {
    if (has_body(req)) resp.setKeepAlive(false);
    resp.set("Allow", allow);
    send_http_error(resp, HTTPResponse::HTTP_METHOD_NOT_ALLOWED,
                    req.getMethod() + " is not allowed here; this path takes " + allow);
    return 405;
  }

  // Bearer authentication; on failure the 401 is sent and false returned.
  bool authenticate(HTTPServerRequest &req, HTTPServerResponse &resp, std::string &principal) {
    if (!s_.auth->enabled()) return true;
    auto who = s_.auth->authenticate(req.get("Authorization", ""));
    if (!who) {
      if (has_body(req)) resp.setKeepAlive(false);
      resp.set("WWW-Authenticate", "Bearer realm=\"toolnexus\"");
      send_http_error(resp, HTTPResponse::HTTP_UNAUTHORIZED,
                      "this agent requires Authorization: Bearer <token> (see the agent card's "
                      "securitySchemes)");
      return false;
    }
    principal = std::move(*who);
    return true;
  }

  // The HTTP+JSON binding (A2A v1.0 section 11).
  int rest(HTTPServerRequest &req, HTTPServerResponse &resp, ThreadBuffers &b, std::string &principal,
           const RestRoute &route) {
    if (!authenticate(req, resp, principal)) return 401;
    b.method = "REST ";
    b.method += req.getMethod();
    const auto query = query_of(req.getURI());
    const std::string version = a2a_version_of(req, query);
    const std::optional<Dialect> dialect = dialect_for_version(version, Dialect::v1_0);
    int status = 0;
    if (dialect != Dialect::v1_0) {
      if (has_body(req)) resp.setKeepAlive(false);
      status = write_rest_error(
          Failure{rpc_code::kVersionNotSupported,
                  "A2A-Version '" + version.substr(0, 32) +
                      "' is not supported on the HTTP+JSON binding, which speaks A2A 1.0 (A2A 0.3 clients "
                      "use JSON-RPC: POST /)",
                  "A2A-Version"},
          b.answer);
    } else if (has_body(req) && !json_content_type(req)) {
      resp.setKeepAlive(false);
      status = write_rest_error(Failure{rpc_code::kContentTypeNotSupported,
                                        "Content-Type '" + req.getContentType().substr(0, 100) +
                                            "' is not supported; send application/json",
                                        "Content-Type"},
                                b.answer);
    } else {
      if (int s = read_body(req, resp, b); s != 0) return s;
      CallContext call;
      call.principal = principal;
      call.dialect = Dialect::v1_0;
      status = serve_rest(*s_.methods, route, query, b.body, s_.limits.max_json_depth, std::move(call), b.out,
                          b.answer);
    }
    resp.setStatusAndReason(static_cast<HTTPResponse::HTTPStatus>(status));
    resp.setContentType("application/json");
    resp.sendBuffer(b.answer.data(), b.answer.size());
    if (b.body.capacity() > 256 * 1024) std::string().swap(b.body);
    if (b.answer.capacity() > 256 * 1024) std::string().swap(b.answer);
    return status;
  }

  int card(HTTPServerRequest &req, HTTPServerResponse &resp) {
    std::string url = s_.card->options.public_url;
    if (url.empty()) {
      url = reached_url(req.get("Forwarded", ""), req.get("X-Forwarded-Proto", ""),
                        req.get("X-Forwarded-Host", ""), req.getHost(), fallback_);
    }
    if (has_body(req)) resp.setKeepAlive(false);
    const std::string json = agent_card_json(*s_.card, url);
    send_json(resp, HTTPResponse::HTTP_OK, json);
    return 200;
  }

  // Reads the body into b.body within the limits. Returns 0 or the HTTP
  // status already sent.
  int read_body(HTTPServerRequest &req, HTTPServerResponse &resp, ThreadBuffers &b) {
    const std::size_t max = s_.limits.max_body_bytes;
    b.body.clear();
    const bool chunked = req.getChunkedTransferEncoding();
    const auto length = req.getContentLength64();
    const std::string too_large =
        "request body larger than the limit of " + std::to_string(max) + " bytes";
    if (!chunked && length > 0 && static_cast<uint64_t>(length) > max) {
      resp.setKeepAlive(false);  // the body is left unread
      send_http_error(resp, HTTPResponse::HTTP_REQUESTENTITYTOOLARGE, too_large);
      return 413;
    }
    // Without Content-Length or chunked encoding an HTTP/1.1 request has no
    // body (RFC 9112 section 6.3); never read until EOF.
    if (!chunked && length <= 0) return 0;
    // One receive per step through the stream buffer (sgetc refills it with
    // whatever has arrived), so the deadline is checked however slowly the
    // bytes trickle in.
    std::streambuf *in = req.stream().rdbuf();
    const auto deadline = Clock::now() + std::chrono::milliseconds(s_.limits.body_deadline_ms);
    const std::size_t want = chunked ? max + 1 : static_cast<std::size_t>(length);
    if (!chunked) b.body.reserve(want);
    char piece[16 * 1024];
    try {
      while (b.body.size() < want) {
        if (in->sgetc() == std::char_traits<char>::eof()) {
          if (chunked) break;  // end of the chunked body
          resp.setKeepAlive(false);
          send_http_error(resp, HTTPResponse::HTTP_BAD_REQUEST,
                          "the request body ended before Content-Length bytes arrived");
          return 400;
        }
        const std::streamsize avail = std::max<std::streamsize>(1, in->in_avail());
        const std::size_t n = std::min({want - b.body.size(), sizeof piece, static_cast<std::size_t>(avail)});
        const auto got = in->sgetn(piece, static_cast<std::streamsize>(n));
        b.body.append(piece, static_cast<std::size_t>(got));
        if (Clock::now() > deadline) {
          resp.setKeepAlive(false);
          send_http_error(resp, HTTPResponse::HTTP_REQUEST_TIMEOUT,
                          "the request body took longer than " + std::to_string(s_.limits.body_deadline_ms) +
                              " ms to arrive");
          return 408;
        }
      }
    } catch (const Poco::TimeoutException &) {
      resp.setKeepAlive(false);
      send_http_error(resp, HTTPResponse::HTTP_REQUEST_TIMEOUT,
                      "no part of the request body arrived for " + std::to_string(s_.limits.read_timeout_ms) + " ms");
      return 408;
    }
    if (b.body.size() > max) {
      resp.setKeepAlive(false);
      send_http_error(resp, HTTPResponse::HTTP_REQUESTENTITYTOOLARGE, too_large);
      return 413;
    }
    return 0;
  }

  int rpc(HTTPServerRequest &req, HTTPServerResponse &resp, ThreadBuffers &b, std::string &principal) {
    if (!authenticate(req, resp, principal)) return 401;
    if (int status = read_body(req, resp, b); status != 0) return status;
    const std::string version = a2a_version_of(req, query_of(req.getURI()));
    s_.methods->handle(b.body, version, principal, b.out, b.method);
    const std::string_view bytes = b.out.bytes();
    resp.setStatus(HTTPResponse::HTTP_OK);
    resp.setContentType("application/json");
    resp.sendBuffer(bytes.data(), bytes.size());
    if (b.body.capacity() > 256 * 1024) std::string().swap(b.body);  // do not pin big buffers
    return 200;
  }

  const HttpServices &s_;
  const std::string &fallback_;
};

class HandlerFactory final : public Poco::Net::HTTPRequestHandlerFactory {
 public:
  HandlerFactory(const HttpServices &s, const std::string &fallback) : s_(s), fallback_(fallback) {}
  HTTPRequestHandler *createRequestHandler(const HTTPServerRequest &) override {
    return new RequestHandler(s_, fallback_);
  }
  /// Tells every live connection the server stopped: each finishes the
  /// request it serves (abort = false) and shuts its socket down.
  void stop_connections(bool abort) {
    const bool value = abort;
    serverStopped(this, value);
  }

 private:
  const HttpServices &s_;
  const std::string &fallback_;
};

// Poco's TCPServer notices stop() only when its accept poll (250 ms) ends;
// a throw-away connection ends it at once.
void wake_acceptor(const Poco::Net::SocketAddress &bound) {
  try {
    std::string host = bound.host().toString();
    if (bound.host().isWildcard()) host = bound.family() == Poco::Net::AddressFamily::IPv6 ? "::1" : "127.0.0.1";
    Poco::Net::StreamSocket s;
    s.connect(Poco::Net::SocketAddress(host, bound.port()), Poco::Timespan(0, 100000));
    s.close();
  } catch (...) {
  }
}

}  // namespace

struct HttpFrontend::Impl {
  HttpServices services;
  std::string fallback_hostport;
  Poco::Net::ServerSocket socket;
  Poco::Net::HTTPServerParams::Ptr params;
  Poco::Net::HTTPRequestHandlerFactory::Ptr handlers;
  HandlerFactory *handler_factory = nullptr;
  std::unique_ptr<Poco::ThreadPool> pool;
  std::unique_ptr<Poco::Net::TCPServer> server;
  bool started = false;
  bool stopped = false;
};

HttpFrontend::HttpFrontend(const std::string &host, uint16_t port, HttpServices services)
    : impl_(std::make_unique<Impl>()) {
  impl_->services = std::move(services);
  const ServerLimits &l = impl_->services.limits;
  try {
    Poco::Net::SocketAddress addr(host, port);
    impl_->socket.bind(addr, /*reuseAddress=*/true, /*reusePort=*/false);
    impl_->socket.listen(static_cast<int>(std::min<unsigned>(l.max_queued_connections, 4096)));
  } catch (const Poco::Exception &e) {
    throw std::runtime_error("cannot listen on " + host + ":" + std::to_string(port) + ": " + e.displayText());
  }
  port_ = impl_->socket.address().port();
  impl_->fallback_hostport = impl_->services.fallback_host + ":" + std::to_string(port_);
  auto *params = new Poco::Net::HTTPServerParams;
  impl_->params = params;
  params->setTimeout(Poco::Timespan(static_cast<long>(l.read_timeout_ms) * 1000));
  params->setKeepAlive(true);
  params->setKeepAliveTimeout(Poco::Timespan(static_cast<long>(l.keep_alive_timeout_ms) * 1000));
  params->setMaxKeepAliveRequests(0);  // unlimited
  params->setMaxThreads(static_cast<int>(l.max_connections));
  params->setMaxQueued(static_cast<int>(l.max_queued_connections));
  params->setThreadIdleTime(Poco::Timespan(60, 0));
  params->setSoftwareVersion(std::string("toolnexus/") + server_version());
  impl_->handler_factory = new HandlerFactory(impl_->services, impl_->fallback_hostport);
  impl_->handlers = impl_->handler_factory;
  impl_->pool = std::make_unique<Poco::ThreadPool>(2, static_cast<int>(l.max_connections) + 2, 60);
}

HttpFrontend::~HttpFrontend() {
  try {
    stop(2000);
  } catch (...) {
  }
}

void HttpFrontend::start() {
  if (impl_->started) return;
  impl_->server = std::make_unique<Poco::Net::TCPServer>(
      new Poco::Net::HTTPServerConnectionFactory(impl_->params, impl_->handlers), *impl_->pool, impl_->socket, impl_->params);
  impl_->server->start();
  impl_->started = true;
}

void HttpFrontend::stop(int grace_ms) {
  if (!impl_->started || impl_->stopped) return;
  impl_->stopped = true;
  // 1. No new connections; queued ones are dropped.
  std::atomic<bool> stopped{false};
  const Poco::Net::SocketAddress bound = impl_->socket.address();
  std::thread waker([&] {
    while (!stopped) {
      wake_acceptor(bound);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
  impl_->server->stop();
  stopped = true;
  waker.join();
  // 2. Each live connection finishes the request it is serving (the handler
  //    factory's serverStopped event takes the connection's request mutex)
  //    and is then shut down, which also ends idle keep-alive waits.
  impl_->handler_factory->stop_connections(false);
  const auto deadline = Clock::now() + std::chrono::milliseconds(grace_ms);
  while (impl_->server->currentThreads() > 0 && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  impl_->pool->joinAll();
  impl_->server.reset();
}

}  // namespace toolnexus::server_detail

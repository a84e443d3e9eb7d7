// The HTTP routes: JSON-RPC at POST /, the Agent Card, the HTTP+JSON
// binding; served by the reactor (http_reactor.hpp).
#include "bindings/http.hpp"

#include "wire/http_reactor.hpp"
#include "wire/web_origin.hpp"
#include "bindings/rest.hpp"
#include "common/util.hpp"


#include <Poco/Exception.h>
#include <Poco/Net/IPAddress.h>
#include <Poco/Net/NetException.h>
#include <Poco/Net/ServerSocket.h>
#include <Poco/Net/SocketAddress.h>
#include <Poco/String.h>
#include <Poco/URI.h>

#include <algorithm>
#include <chrono>
#include <stdexcept>

namespace toolnexus::server_detail {

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

// Reused per worker thread.
// Answers larger than this are followed by malloc_trim (see Router::handle).
constexpr std::size_t kTrimAfterBytes = 1 << 20;

struct ThreadBuffers {
  ResponseWriter out;
  std::string method;
  std::string answer;
  /// The request's labels for /metrics (ServerMetrics::observe_request):
  /// set by rpc() and rest(); method empty = not an A2A request.
  std::string_view metric_method, metric_dialect, metric_transport;
};

ThreadBuffers &buffers() {
  thread_local ThreadBuffers b;
  return b;
}

HttpReply json_reply(int status, std::string_view json) {
  HttpReply r;
  r.status = status;
  r.body.assign(json.data(), json.size());
  return r;
}

// The A2A-Version service parameter: the header, else the query parameter
// (A2A v1.0 section 3.6).
std::string a2a_version_of(const HttpRequest &req, const std::vector<std::pair<std::string, std::string>> &query) {
  const std::string &header = req.head.get("A2A-Version", Poco::Net::HTTPMessage::EMPTY);
  if (!header.empty()) return header;
  for (const auto &[name, value] : query)
    if (name == "A2A-Version" || name == "a2a-version") return value;
  return {};
}

// The request's Content-Type is JSON: application/json or
// application/a2a+json, any parameters. An absent one is not: a browser's
// cross-site "simple" POST sends text/plain, a form type or none at all
// (a Blob without a type), and must not reach the API (issue 19 item 4).
bool json_content_type(const HttpRequest &req) {
  std::string_view ct = req.head.getContentType();
  ct = ct.substr(0, ct.find(';'));
  while (!ct.empty() && (ct.back() == ' ' || ct.back() == '\t')) ct.remove_suffix(1);
  std::string lower(ct);
  for (char &c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return lower == "application/json" || lower == "application/a2a+json";
}

// What a refused Content-Type is told.
std::string content_type_refusal(const HttpRequest &req) {
  const std::string &ct = req.head.getContentType();
  return (ct.empty() ? std::string("a request body without Content-Type")
                     : "Content-Type " + in_quotes(ct)) +
         " is not supported; send Content-Type: application/json (or application/a2a+json)";
}

// This server's side of a connection, as the card's url needs it. An
// IPv4-mapped IPv6 address (a dual-stack listener) reads as IPv4.
void describe_local(const Poco::Net::SocketAddress &local, CardRequest &how) {
  if (local.port() == 0) return;
  Poco::Net::IPAddress ip = local.host();
  if (ip.family() == Poco::Net::AddressFamily::IPv6 && ip.isIPv4Mapped())
    ip = Poco::Net::IPAddress(static_cast<const unsigned char *>(ip.addr()) + 12, 4);
  if (ip.isWildcard()) return;
  how.local_addr = ip.toString();
  how.local_port = local.port();
  how.loopback = ip.isLoopback();
  const bool v6 = ip.family() == Poco::Net::AddressFamily::IPv6;
  how.local = (v6 ? "[" + how.local_addr + "]" : how.local_addr) + ":" + std::to_string(how.local_port);
}

// CORS (Fetch standard, "CORS protocol"): what a page of an allowed origin
// may send (the request fields this server and A2A clients use, beyond the
// CORS-safelisted ones: application/json is not a safelisted Content-Type),
// the response fields it may read (beyond the safelisted Cache-Control,
// Content-Type, ...), and how long a browser may keep a preflight's answer.
constexpr const char *kCorsAllowHeaders =
    "Content-Type, Authorization, A2A-Version, A2A-Extensions, X-A2A-Extensions, Last-Event-ID";
constexpr const char *kCorsExposeHeaders = "ETag, WWW-Authenticate, Retry-After, Allow";
constexpr int kCorsMaxAgeS = 600;

// A Responder that adds `headers` to every answer sent through it (a Vary
// is merged into one the answer already has). Used for the CORS fields.
class HeaderAddingResponder final : public Responder {
 public:
  explicit HeaderAddingResponder(Responder &inner) : inner_(inner) {}

  std::vector<std::pair<std::string, std::string>> headers;

  void reply(HttpReply reply) override {
    add_to(reply.headers);
    inner_.reply(std::move(reply));
  }
  std::shared_ptr<SseStream> start_stream(std::vector<std::pair<std::string, std::string>> h,
                                          std::string label) override {
    add_to(h);
    return inner_.start_stream(std::move(h), std::move(label));
  }
  bool answered() const noexcept override { return inner_.answered(); }

 private:
  void add_to(std::vector<std::pair<std::string, std::string>> &into) const {
    for (const auto &[name, value] : headers) {
      auto vary = std::find_if(into.begin(), into.end(), [](const auto &h) { return h.first == "Vary"; });
      if (name == "Vary" && vary != into.end())
        vary->second += ", " + value;
      else
        into.emplace_back(name, value);
    }
  }

  Responder &inner_;
};

// The value of the last `name` field line of `head` (empty when none): a
// proxy appends its own (RFC 7239 section 4), so the last is the nearest's.
const std::string &last_field(const Poco::Net::HTTPRequest &head, const std::string &name) {
  const std::string *last = &Poco::Net::HTTPMessage::EMPTY;
  for (auto it = head.find(name); it != head.end() && Poco::icompare(it->first, name) == 0; ++it) last = &it->second;
  return *last;
}

// How the request reached this server: its Host and forwarded fields (views
// into `req`) and the local side of its connection.
CardRequest request_view(const HttpRequest &req) {
  const std::string &empty = Poco::Net::HTTPMessage::EMPTY;
  CardRequest how;
  how.host = req.head.get("Host", empty);
  how.forwarded = last_field(req.head, "Forwarded");
  how.x_forwarded_proto = last_field(req.head, "X-Forwarded-Proto");
  how.x_forwarded_host = last_field(req.head, "X-Forwarded-Host");
  describe_local(req.local, how);
  return how;
}

class Router {
 public:
  Router(const HttpServices &s, const std::string &fallback) : s_(s), fallback_(fallback) {}

  void handle(HttpRequest &req, Responder &out) {
    const auto started = Clock::now();
    ThreadBuffers &b = buffers();
    b.method.clear();
    b.metric_method = {};
    std::string principal;
    int status = 0;
    const std::string &m = req.head.getMethod();
    const std::string_view path = req.path;
    const bool card_path = path == "/.well-known/agent-card.json" || path == "/.well-known/agent.json";
    const CardRequest how = request_view(req);
    const std::string &origin = req.head.get("Origin", Poco::Net::HTTPMessage::EMPTY);
    const bool origin_ok = origin_allowed(s_.card->options, origin, how);
    // Every answer depends on Origin (CORS fields, 403): caches must key on it.
    HeaderAddingResponder reply_to(out);
    reply_to.headers.emplace_back("Vary", "Origin");
    if (!origin.empty() && origin_ok) {
      // The origin echoed, never "*": the page may send Authorization.
      reply_to.headers.emplace_back("Access-Control-Allow-Origin", origin);
      reply_to.headers.emplace_back("Access-Control-Expose-Headers", kCorsExposeHeaders);
    }
    if (s_.operator_endpoints != nullptr && OperatorEndpoints::serves(path)) {
      status = s_.operator_endpoints->handle(req, out, /*metrics_here=*/false);  // probes: no API checks, no CORS
    } else if (req.head.has("Host") && !valid_host_field(how.host)) {
      reply_to.reply(http_error_reply(
          400, how.host.empty() ? std::string("the Host header is empty: it must name this server (host[:port])")
                                : "Host " + in_quotes(std::string(how.host)) +
                                      " is not a valid host[:port] (RFC 9110 section 7.2)"));
      status = 400;
    } else if (m == Poco::Net::HTTPRequest::HTTP_OPTIONS) {
      status = options(req, reply_to, how, origin_ok, card_path);
    } else if (!card_path && (status = cross_site_refusal(how, origin, origin_ok, reply_to)) != 0) {
      // refused: a rebound DNS name or another site's page
    } else if (s_.console != nullptr && ConsoleFiles::serves(path)) {
      status = s_.console->handle(req, reply_to);
    } else if (path == "/") {
      status = m == Poco::Net::HTTPRequest::HTTP_POST ? rpc(req, reply_to, b, principal)
                                                      : method_not_allowed(req, reply_to, "POST");
    } else if (card_path) {
      status = m == Poco::Net::HTTPRequest::HTTP_GET || m == Poco::Net::HTTPRequest::HTTP_HEAD
                   ? card(req, how, reply_to)
                   : method_not_allowed(req, reply_to, "GET, HEAD");
    } else {
      RestRoute route;
      std::string allow;
      switch (match_rest_route(m, path, route, allow)) {
        case RestMatch::matched: status = rest(req, reply_to, b, principal, route); break;
        case RestMatch::method_not_allowed: status = method_not_allowed(req, reply_to, allow); break;
        case RestMatch::not_found: status = not_found(reply_to); break;
        case RestMatch::bad_request:
          reply_to.reply(http_error_reply(400, route.error));
          status = 400;
          break;
      }
    }
    // The answer has been copied out: a large one's buffers are freed now,
    // not when this thread next serves a request (see ResponseWriter::reset).
    const bool large = b.out.bytes().size() > kTrimAfterBytes || b.answer.capacity() > kTrimAfterBytes;
    b.out.reset();
    if (b.answer.capacity() > 256 * 1024) std::string().swap(b.answer);
    // glibc keeps what a request thread freed in that thread's arena; after
    // a Task of megabytes (its record, parsed tree, view and answer) 64 such
    // requests at once left ~900 MB resident for good. Handing the free
    // pages back costs a walk of the arenas, so only after a large answer.
    if (large) release_free_memory();
    if (s_.log->enabled(LogLevel::debug)) {
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - started).count();
      std::string line = m + " " + std::string(path.substr(0, 200));
      if (!b.method.empty()) line += " " + b.method.substr(0, 100);
      line += " " + std::to_string(status) + " " + std::to_string(ms) + "ms";
      if (!principal.empty()) line += " principal=" + principal;
      s_.log->debug(line);
    }
  }

 private:
  int not_found(Responder &out) {
    out.reply(http_error_reply(404, "not found: POST / for JSON-RPC, GET /.well-known/agent-card.json for the card, "
                                    "/message:send, /tasks, /tasks/{id} and /tasks/{id}:cancel for HTTP+JSON"));
    return 404;
  }

  int method_not_allowed(HttpRequest &req, Responder &out, const std::string &allow) {
    HttpReply r = http_error_reply(405, req.head.getMethod() + " is not allowed here; this path takes " + allow);
    r.headers.emplace_back("Allow", allow);
    out.reply(std::move(r));
    return 405;
  }

  // DNS rebinding and cross-site requests (docs/configuration.md, "Web
  // pages and other sites"): an API request's Host must name this server and
  // a browser's Origin must be this server's or an allowed one (`origin_ok`,
  // by origin_allowed). Returns 0, or the status it answered with (421, 403).
  int cross_site_refusal(const CardRequest &how, const std::string &origin, bool origin_ok, Responder &out) {
    if (!how.host.empty() && !host_names_this_server(s_.card->options, how)) {
      out.reply(http_error_reply(
          421, "Host " + in_quotes(std::string(how.host)) +
                   " does not name this server: add it to a2a.allowed_hosts (--allowed-host), or \"*\" to "
                   "accept any Host (refused so that a web page on a rebound DNS name cannot reach the API)"));
      return 421;
    }
    if (!origin_ok) {
      out.reply(http_error_reply(403, "cross-site request from Origin " + in_quotes(origin) +
                                          " refused: add it to a2a.allowed_origins (--allowed-origin) to let "
                                          "that site's pages call this API"));
      return 403;
    }
    return 0;
  }

  // OPTIONS: the methods a path takes (Allow), and for a CORS preflight
  // (Fetch standard: Origin and Access-Control-Request-Method) what a page
  // of an allowed origin may send; 204. A preflight from an origin not
  // allowed is refused like the request it announces (403), as is a Host
  // that does not name this server (421). Never authenticated: a browser
  // sends no Authorization with a preflight.
  int options(HttpRequest &req, Responder &out, const CardRequest &how, bool origin_ok, bool card_path) {
    const std::string &origin = req.head.get("Origin", Poco::Net::HTTPMessage::EMPTY);
    if (!card_path)
      if (const int refused = cross_site_refusal(how, origin, origin_ok, out); refused != 0) return refused;
    std::string allow;
    if (req.path == "/") {
      allow = "POST";
    } else if (card_path) {
      allow = "GET, HEAD";
    } else {
      RestRoute route;
      switch (match_rest_route(Poco::Net::HTTPRequest::HTTP_OPTIONS, req.path, route, allow)) {
        case RestMatch::method_not_allowed: break;
        case RestMatch::bad_request: out.reply(http_error_reply(400, route.error)); return 400;
        case RestMatch::matched:
        case RestMatch::not_found: return not_found(out);
      }
    }
    HttpReply r;
    r.status = 204;
    r.content_type.clear();
    r.headers.emplace_back("Allow", allow + ", OPTIONS");
    if (!origin.empty() && req.head.has("Access-Control-Request-Method")) {
      r.headers.emplace_back("Access-Control-Allow-Methods", allow);
      r.headers.emplace_back("Access-Control-Allow-Headers", kCorsAllowHeaders);
      r.headers.emplace_back("Access-Control-Max-Age", std::to_string(kCorsMaxAgeS));
    }
    out.reply(std::move(r));
    return 204;
  }

  // Bearer authentication (RFC 6750): the token file first, then, for a
  // credential shaped like a JWT, auth.jwt. On failure the 401 is sent and
  // false returned. `tenant` receives a JWT's tenant claim.
  bool authenticate(HttpRequest &req, Responder &out, std::string &principal, std::optional<std::string> &tenant) {
    if (!s_.auth->enabled() && s_.jwt == nullptr) return true;
    const std::string &header = req.head.get("Authorization", Poco::Net::HTTPMessage::EMPTY);
    if (s_.auth->enabled()) {
      if (auto who = s_.auth->authenticate(header)) {
        principal = std::move(*who);
        return true;
      }
    }
    const std::optional<std::string_view> credential = bearer_credential(header);
    if (!credential) {
      // No credentials: no error code (RFC 6750 section 3.1).
      HttpReply r = http_error_reply(401, "this agent requires Authorization: Bearer <token> (see the agent card's "
                                          "securitySchemes)");
      r.headers.emplace_back("WWW-Authenticate", "Bearer realm=\"toolnexus\"");
      out.reply(std::move(r));
      return false;
    }
    // Without a token file, every credential is meant as a JWT: one of
    // another shape is "not a well-formed JWT", as the docs list.
    const char *why = s_.auth->enabled() ? "the token is not valid" : jwt_failure_text(JwtFailure::malformed);
    if (s_.jwt != nullptr && std::count(credential->begin(), credential->end(), '.') == 2) {
      JwtResult r = s_.jwt->validate(*credential);
      if (r.identity) {
        principal = std::move(r.identity->principal);
        tenant = std::move(r.identity->tenant);
        return true;
      }
      why = jwt_failure_text(r.failure);
      if (s_.log->enabled(LogLevel::debug)) s_.log->debug(std::string("bearer JWT refused: ") + r.detail);
    }
    HttpReply r = http_error_reply(401, std::string("the bearer token was refused: ") + why);
    r.headers.emplace_back("WWW-Authenticate", std::string("Bearer realm=\"toolnexus\", error=\"invalid_token\", "
                                                           "error_description=\"") + why + "\"");
    out.reply(std::move(r));
    return false;
  }

  // The HTTP+JSON binding (A2A v1.0 section 11).
  int rest(HttpRequest &req, Responder &out, ThreadBuffers &b, std::string &principal, const RestRoute &route) {
    b.metric_method = method_label(route.method);
    b.metric_dialect = "1.0";
    b.metric_transport = "rest";
    std::optional<std::string> bound_tenant;
    if (!authenticate(req, out, principal, bound_tenant)) return 401;
    b.method = "REST ";
    b.method += req.head.getMethod();
    std::vector<std::pair<std::string, std::string>> query;
    if (std::string bad = parse_query(req.head.getURI(), query); !bad.empty()) {
      const int refused = write_rest_error(Failure{rpc_code::kInvalidRequest, bad, {}}, b.answer);
      out.reply(json_reply(refused, b.answer));
      return refused;
    }
    const std::string version = a2a_version_of(req, query);
    const std::optional<Dialect> dialect = dialect_for_version(version, Dialect::v1_0);
    if (dialect && is_v1(*dialect)) b.metric_dialect = dialect_name(*dialect);
    int status = 0;
    if (!dialect || !is_v1(*dialect)) {
      status = write_rest_error(
          Failure{rpc_code::kVersionNotSupported,
                  "A2A-Version " + in_quotes(version) +
                      " is not supported on the HTTP+JSON binding, which speaks A2A 1.0 and 1.1 (A2A 0.3 clients "
                      "use JSON-RPC: POST /)",
                  "A2A-Version"},
          b.answer);
    } else if ((req.has_body || !req.head.getContentType().empty()) && !json_content_type(req)) {
      // A body must be labelled JSON, and so must a POST that labels its
      // empty body at all (a cross-site form posts one).
      status = write_rest_error(
          Failure{rpc_code::kContentTypeNotSupported, content_type_refusal(req), "Content-Type"}, b.answer);
    } else {
      CallContext call;
      call.principal = principal;
      call.dialect = *dialect;
      call.bound_tenant = std::move(bound_tenant);
      std::optional<StreamPlan> plan;
      status = serve_rest(*s_.methods, route, query, req.body, s_.limits.max_json_depth, std::move(call), b.out,
                          b.answer, req.head.get("Last-Event-ID", Poco::Net::HTTPMessage::EMPTY), &plan);
      if (plan) {
        b.metric_transport = "sse";
        open_task_stream(out, *s_.watch, std::move(*plan), s_.streams, *s_.log);
        return 200;
      }
    }
    out.reply(json_reply(status, b.answer));
    return status;  // handle() frees a large answer's buffers (and trims after it)
  }

  int card(HttpRequest &req, const CardRequest &how, Responder &out) {
    const std::string &empty = Poco::Net::HTTPMessage::EMPTY;
    const AgentCardOptions &o = s_.card->options;
    HttpReply r = json_reply(200, agent_card_json(*s_.card, card_url(o, how, fallback_)));
    r.head_only = req.head.getMethod() == Poco::Net::HTTPRequest::HTTP_HEAD;
    // Cacheable (A2A v1.0 section 8.6.1): max-age and a strong ETag of
    // these bytes (the url in them follows the request, so does the tag).
    const std::string etag = card_etag(r.body);
    r.headers.emplace_back("ETag", etag);
    r.headers.emplace_back("Cache-Control", "public, max-age=" + std::to_string(o.cache_max_age_s));
    if (o.trust_forwarded && o.public_url.empty())
      r.headers.emplace_back("Vary", "Forwarded, X-Forwarded-Proto, X-Forwarded-Host");
    if (if_none_match(req.head.get("If-None-Match", empty), etag)) {
      // RFC 9110 section 15.4.5: no content; ETag and Cache-Control as a
      // 200 would have them.
      r.status = 304;
      r.body.clear();
      r.content_type.clear();
    }
    const int status = r.status;
    out.reply(std::move(r));
    return status;
  }

  int rpc(HttpRequest &req, Responder &out, ThreadBuffers &b, std::string &principal) {
    b.metric_method = "unknown";
    b.metric_dialect = "0.3";
    b.metric_transport = "jsonrpc";
    std::optional<std::string> bound_tenant;
    if (!authenticate(req, out, principal, bound_tenant)) return 401;
    if (!json_content_type(req)) {
      out.reply(http_error_reply(415, content_type_refusal(req)));
      return 415;
    }
    std::vector<std::pair<std::string, std::string>> query;
    if (std::string bad = parse_query(req.head.getURI(), query); !bad.empty()) {
      out.reply(http_error_reply(400, bad));
      return 400;
    }
    const std::string version = a2a_version_of(req, query);
    std::optional<StreamPlan> plan;
    bool is_stream = false;
    Dialect dialect = Dialect::v0_3;
    s_.methods->handle(req.body, version, principal, b.out, b.method,
                       req.head.get("Last-Event-ID", Poco::Net::HTTPMessage::EMPTY), &plan, &is_stream, &dialect,
                       bound_tenant);
    b.metric_method = method_label(b.method);
    b.metric_dialect = dialect_name(dialect);
    if (plan || is_stream) b.metric_transport = "sse";
    if (plan) {
      open_task_stream(out, *s_.watch, std::move(*plan), s_.streams, *s_.log);
    } else if (is_stream) {
      answer_stream_error(out, dialect, b.out.bytes());
    } else {
      out.reply(json_reply(200, b.out.bytes()));
    }
    return 200;
  }

  const HttpServices &s_;
  const std::string &fallback_;
};

}  // namespace

struct HttpFrontend::Impl {
  HttpServices services;
  std::string fallback_hostport;
  std::unique_ptr<Router> router;
  std::unique_ptr<HttpReactor> reactor;
  bool started = false;
};

HttpFrontend::HttpFrontend(const std::string &host, uint16_t port, HttpServices services)
    : impl_(std::make_unique<Impl>()) {
  impl_->services = std::move(services);
  const ServerLimits &l = impl_->services.limits;
  Poco::Net::ServerSocket socket;
  try {
    Poco::Net::SocketAddress addr(host, port);
    socket.bind(addr, /*reuseAddress=*/true, /*reusePort=*/false);
    socket.listen(static_cast<int>(std::min<unsigned>(l.max_queued_connections, 4096)));
  } catch (const Poco::Exception &e) {
    throw std::runtime_error("cannot listen on " + host + ":" + std::to_string(port) + ": " + e.displayText());
  }
  port_ = socket.address().port();
  impl_->fallback_hostport = impl_->services.fallback_host + ":" + std::to_string(port_);
  impl_->router = std::make_unique<Router>(impl_->services, impl_->fallback_hostport);
  ReactorLimits rl;
  rl.max_header_bytes = l.max_header_bytes;
  rl.max_body_bytes = l.max_body_bytes;
  rl.header_timeout_ms = l.header_timeout_ms;
  rl.body_deadline_ms = l.body_deadline_ms;
  rl.keep_alive_timeout_ms = l.keep_alive_timeout_ms;
  rl.read_timeout_ms = l.read_timeout_ms;
  rl.write_timeout_ms = l.read_timeout_ms;
  rl.stream_stall_ms = l.stream_stall_ms;
  rl.workers = l.max_connections;
  rl.max_queued_requests = l.max_queued_connections;
  rl.max_open_connections = l.max_open_connections;
  rl.server_name = std::string("toolnexus/") + server_version();
  Router *router = impl_->router.get();
  impl_->reactor = std::make_unique<HttpReactor>(
      std::move(socket), rl,
      [router, metrics = impl_->services.metrics](HttpRequest &req, Responder &out) {
        const ThreadBuffers &b = buffers();  // the labels the router sets
        MeteredResponder counted(out, metrics, &b.metric_method, &b.metric_dialect, &b.metric_transport);
        router->handle(req, counted);
      },
      *impl_->services.log);
}

HttpFrontend::~HttpFrontend() {
  try {
    stop(2000);
  } catch (...) {
  }
}

void HttpFrontend::start() {
  if (impl_->started) return;
  impl_->reactor->start();
  impl_->started = true;
}

std::size_t HttpFrontend::open_connections() const noexcept { return impl_->reactor->open_connections(); }
std::size_t HttpFrontend::open_streams() const noexcept { return impl_->reactor->open_streams(); }

void HttpFrontend::begin_stop() {
  if (impl_->reactor) impl_->reactor->begin_stop();
}

void HttpFrontend::stop(int grace_ms) {
  if (impl_->reactor) impl_->reactor->stop(grace_ms);
}

}  // namespace toolnexus::server_detail

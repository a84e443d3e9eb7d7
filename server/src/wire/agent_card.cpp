// The Agent Card.
#include "wire/agent_card.hpp"

#include "wire/web_origin.hpp"

#include <Poco/DigestEngine.h>
#include <Poco/SHA2Engine.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cctype>

#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

namespace toolnexus::server_detail {

namespace {

using W = rapidjson::Writer<rapidjson::StringBuffer>;

void put(W &w, const char *key, std::string_view value) {
  w.Key(key);
  w.String(value.data(), static_cast<rapidjson::SizeType>(value.size()));
}

void put_list(W &w, const char *key, const std::vector<std::string> &values) {
  w.Key(key);
  w.StartArray();
  for (const auto &v : values) w.String(v.data(), static_cast<rapidjson::SizeType>(v.size()));
  w.EndArray();
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// Last element of a comma-separated header value: what the nearest proxy
// appended (RFC 7239 section 4; X-Forwarded-* by the same custom).
std::string_view last_of(std::string_view s) {
  const auto comma = s.rfind(',');
  return trim(comma == std::string_view::npos ? s : s.substr(comma + 1));
}

bool valid_host(std::string_view h) {
  if (h.empty() || h.size() > 255) return false;
  for (char c : h) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                    c == '-' || c == '_' || c == ':' || c == '[' || c == ']';
    if (!ok) return false;
  }
  return true;
}

// The value of parameter `name` (proto=, host=) in one element of an RFC 7239
// Forwarded header ("" when the element has none).
std::string_view element_param(std::string_view element, std::string_view name) {
  while (!element.empty()) {
    const auto semi = element.find(';');
    std::string_view pair = trim(element.substr(0, semi));
    const auto eq = pair.find('=');
    if (eq != std::string_view::npos) {
      std::string_view key = trim(pair.substr(0, eq));
      bool same = key.size() == name.size();
      for (std::size_t i = 0; same && i < key.size(); ++i) same = (key[i] | 0x20) == name[i];
      if (same) {
        std::string_view v = trim(pair.substr(eq + 1));
        if (v.size() >= 2 && v.front() == '"' && v.back() == '"') v = v.substr(1, v.size() - 2);
        return v;
      }
    }
    if (semi == std::string_view::npos) break;
    element = element.substr(semi + 1);
  }
  return {};
}

// proto= / host= of an RFC 7239 Forwarded header: from the last element that
// has it. Proxies append their element (section 4), so one a client sent
// ahead of them never wins over what a proxy said; a proxy that adds only
// for= leaves the host an earlier proxy of the chain recorded.
std::string_view forwarded_param(std::string_view forwarded, std::string_view name) {
  while (!forwarded.empty()) {
    const auto comma = forwarded.rfind(',');
    const std::string_view element = comma == std::string_view::npos ? forwarded : forwarded.substr(comma + 1);
    if (std::string_view v = element_param(element, name); !v.empty()) return v;
    if (comma == std::string_view::npos) break;
    forwarded = forwarded.substr(0, comma);
  }
  return {};
}

bool same_text(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  return true;
}

// "name[:port]" / "[v6][:port]" split into the name (brackets kept off) and
// the port text ("" when none). False when the shape is wrong (an empty
// name, a port that is not 1-5 digits, text after "]" that is not ":port").
bool split_host(std::string_view h, std::string_view &name, std::string_view &port) {
  port = {};
  if (!h.empty() && h.front() == '[') {
    const auto close = h.find(']');
    if (close == std::string_view::npos) return false;
    name = h.substr(1, close - 1);
    std::string_view rest = h.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') return false;
      port = rest.substr(1);
      if (port.empty()) return false;
    }
  } else {
    const auto colon = h.find(':');
    name = h.substr(0, colon);
    if (colon != std::string_view::npos) {
      port = h.substr(colon + 1);
      if (port.empty()) return false;
    }
  }
  if (name.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != std::string_view::npos)
    return false;
  return true;
}

uint16_t port_number(std::string_view port, uint16_t default_port) {
  if (port.empty()) return default_port;
  unsigned long v = 0;
  for (char c : port) v = v * 10 + static_cast<unsigned long>(c - '0');
  return v > 65535 ? 0 : static_cast<uint16_t>(v);
}

// localhost, 127.0.0.0/8 in dotted decimal, ::1.
bool loopback_name(std::string_view name) {
  if (same_text(name, "localhost")) return true;
  const std::string n(name);
  in_addr v4{};
  if (::inet_pton(AF_INET, n.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (::inet_pton(AF_INET6, n.c_str(), &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6);
  return false;
}

}  // namespace

bool is_allowed_host(std::string_view host, const std::vector<std::string> &allowed, uint16_t default_port) {
  std::string_view name, port;
  if (!split_host(host, name, port)) return false;
  for (const std::string &entry : allowed) {
    std::string_view ename, eport;
    if (!split_host(entry, ename, eport) || !same_text(name, ename)) continue;
    if (eport.empty() || port_number(eport, 0) == port_number(port, default_port)) return true;
  }
  return false;
}

namespace {

// The Host rule of card_url's step 3: an allowed host, this connection's
// own address, or a loopback name on a loopback connection. `own` tells
// which of them matched.
bool host_is_ours(const AgentCardOptions &options, const CardRequest &request, std::string_view h, bool &own) {
  own = false;
  std::string_view name, port;
  if (!valid_host(h) || !split_host(h, name, port)) return false;
  own = !request.local_addr.empty() && same_text(name, request.local_addr) &&
        port_number(port, 80) == request.local_port;
  return own || is_allowed_host(h, options.allowed_hosts, 80) || (request.loopback && loopback_name(name));
}

// "host[:port]" of an http(s) URL ("" when it has none).
std::string_view authority_of(std::string_view url) {
  const std::size_t scheme_end = url.find("://");
  if (scheme_end == std::string_view::npos) return {};
  url.remove_prefix(scheme_end + 3);
  return url.substr(0, url.find_first_of("/?#"));
}

}  // namespace

bool host_names_this_server(const AgentCardOptions &options, const CardRequest &request) {
  for (const std::string &h : options.allowed_hosts)
    if (h == "*") return true;
  const std::string_view h = trim(request.host);
  bool own = false;
  if (host_is_ours(options, request, h, own)) return true;
  // public_url's host, at its port (the scheme's default when it has none).
  const std::string_view pub = authority_of(options.public_url);
  std::string_view pub_name, pub_port;
  if (pub.empty() || !split_host(pub, pub_name, pub_port)) return false;
  const uint16_t default_port = options.public_url.compare(0, 8, "https://") == 0 ? 443 : 80;
  const std::string entry = std::string(pub_name) + ":" + std::to_string(port_number(pub_port, default_port));
  return is_allowed_host(h, {entry}, default_port);
}

namespace {

// What a trusted proxy says of the request (card_url's step 2): the scheme
// ("https" when proto= / X-Forwarded-Proto says so, else "http") and the
// host, "" when it names none acceptable. Only with options.trust_forwarded.
std::string_view forwarded_host(const AgentCardOptions &options, const CardRequest &request, std::string &scheme) {
  scheme = "http";
  if (!options.trust_forwarded) return {};
  std::string_view proto = forwarded_param(request.forwarded, "proto");
  if (proto.empty()) proto = last_of(request.x_forwarded_proto);
  if (same_text(proto, "https")) scheme = "https";
  std::string_view h = forwarded_param(request.forwarded, "host");
  if (!valid_host(h)) h = last_of(request.x_forwarded_host);
  std::string_view name, port;
  if (valid_host(h) && split_host(h, name, port) &&
      (options.allowed_hosts.empty() || is_allowed_host(h, options.allowed_hosts, scheme == "https" ? 443 : 80)))
    return h;
  return {};
}

}  // namespace

bool origin_allowed(const AgentCardOptions &options, std::string_view origin, const CardRequest &request) {
  origin = trim(origin);
  if (origin.empty()) return true;
  for (const std::string &o : options.allowed_origins)
    if (o == "*") return true;
  if (origin == "null") return false;
  WebOrigin asked;
  if (!parse_web_origin(origin, asked).empty()) return false;
  for (const std::string &o : options.allowed_origins) {
    WebOrigin entry;
    if (parse_web_origin(o, entry).empty() && entry == asked) return true;
  }
  // This server's own origin: as the request reached it (through a trusted
  // proxy: its scheme and host), or public_url's.
  std::string scheme;
  std::string_view host = forwarded_host(options, request, scheme);
  if (host.empty()) host = request.host;
  WebOrigin own;
  if (origin_of_host(scheme, host, own) && own == asked) return true;
  const std::string_view pub = authority_of(options.public_url);
  const std::string pub_scheme = options.public_url.compare(0, 8, "https://") == 0 ? "https" : "http";
  return !pub.empty() && origin_of_host(pub_scheme, pub, own) && own == asked;
}

std::string card_url(const AgentCardOptions &options, const CardRequest &request, std::string_view fallback) {
  if (!options.public_url.empty()) return options.public_url;
  std::string scheme;
  if (const std::string_view h = forwarded_host(options, request, scheme); !h.empty())
    return scheme + "://" + std::string(h) + "/";
  const std::string_view h = trim(request.host);
  std::string_view name, port;
  if (valid_host(h) && split_host(h, name, port)) {
    const bool allowed = is_allowed_host(h, options.allowed_hosts, scheme == "https" ? 443 : 80);
    // This connection's own address, as the client dialled it.
    const bool own = !request.local_addr.empty() && same_text(name, request.local_addr) &&
                     port_number(port, 80) == request.local_port;
    // This server's own socket speaks plain HTTP, whatever a proxy says.
    if (own) return "http://" + std::string(h) + "/";
    const bool local_name = request.loopback && loopback_name(name);
    if (allowed || local_name) return scheme + "://" + std::string(h) + "/";
  }
  if (!request.local.empty()) return "http://" + request.local + "/";
  return "http://" + std::string(fallback) + "/";
}

std::string agent_card_json(const CardConfig &config, std::string_view url) {
  const AgentCardOptions &o = config.options;
  // The HTTP+JSON base: the same URL without its trailing "/", so that
  // clients appending "/message:send" reach /message:send.
  std::string_view rest_url = url;
  while (rest_url.size() > 1 && rest_url.back() == '/' && rest_url.substr(rest_url.size() - 3) != "://")
    rest_url.remove_suffix(1);
  rapidjson::StringBuffer buf;
  W w(buf);
  w.StartObject();
  put(w, "name", o.name);
  put(w, "description", o.description);
  // v1.0 (section 8.4): the interfaces, preferred first.
  w.Key("supportedInterfaces");
  w.StartArray();
  const std::pair<std::string_view, std::pair<const char *, const char *>> interfaces[] = {
      {url, {"JSONRPC", "1.0"}}, {rest_url, {"HTTP+JSON", "1.0"}}, {url, {"JSONRPC", "0.3"}}};
  for (const auto &[u, bv] : interfaces) {
    w.StartObject();
    put(w, "url", u);
    put(w, "protocolBinding", bv.first);
    put(w, "protocolVersion", bv.second);
    w.EndObject();
  }
  w.EndArray();
  // v0.3 (section 5.5): what older clients read.
  put(w, "protocolVersion", "0.3.0");
  put(w, "url", url);
  put(w, "preferredTransport", "JSONRPC");
  w.Key("additionalInterfaces");
  w.StartArray();
  w.StartObject();
  put(w, "url", url);
  put(w, "transport", "JSONRPC");
  w.EndObject();
  w.EndArray();
  if (!o.provider_organization.empty()) {
    w.Key("provider");
    w.StartObject();
    put(w, "organization", o.provider_organization);
    if (!o.provider_url.empty()) put(w, "url", o.provider_url);
    w.EndObject();
  }
  put(w, "version", o.version.empty() ? std::string_view(server_version()) : std::string_view(o.version));
  if (!o.documentation_url.empty()) put(w, "documentationUrl", o.documentation_url);
  w.Key("capabilities");
  w.StartObject();
  w.Key("streaming");
  w.Bool(true);
  w.Key("pushNotifications");
  w.Bool(config.push_notifications);
  w.Key("extendedAgentCard");  // v1.0
  w.Bool(false);
  w.Key("stateTransitionHistory");  // v0.3
  w.Bool(false);
  w.EndObject();
  if (config.bearer_auth) {
    // One scheme object readable in both versions: v0.3's {"type", "scheme"}
    // and v1.0's oneof member "httpAuthSecurityScheme".
    const char *about =
        !config.bearer_jwt ? "Authorization: Bearer <token>; each token maps to a principal who sees only its own Tasks."
        : config.jwt_only  ? "Authorization: Bearer <JWT> (an OAuth 2 / OpenID Connect access token of the configured "
                             "issuer); it names a principal who sees only its own Tasks."
                           : "Authorization: Bearer <token or JWT> (a configured token, or an OAuth 2 / OpenID Connect "
                             "access token of the configured issuer); each maps to a principal who sees only its own "
                             "Tasks.";
    w.Key("securitySchemes");
    w.StartObject();
    w.Key("bearer");
    w.StartObject();
    put(w, "type", "http");
    put(w, "scheme", "bearer");
    if (config.bearer_jwt) put(w, "bearerFormat", "JWT");
    put(w, "description", about);
    w.Key("httpAuthSecurityScheme");
    w.StartObject();
    put(w, "scheme", "Bearer");
    if (config.bearer_jwt) put(w, "bearerFormat", "JWT");
    put(w, "description", about);
    w.EndObject();
    w.EndObject();
    const bool oidc = !config.openid_connect_url.empty();
    if (oidc) {
      // Where a client gets the JWT: v0.3's {"type": "openIdConnect",
      // "openIdConnectUrl"} and v1.0's "openIdConnectSecurityScheme".
      const char *where = "OpenID Connect discovery of the issuer whose access tokens (JWTs) this server accepts as "
                          "Authorization: Bearer.";
      w.Key("oidc");
      w.StartObject();
      put(w, "type", "openIdConnect");
      put(w, "openIdConnectUrl", config.openid_connect_url);
      put(w, "description", where);
      w.Key("openIdConnectSecurityScheme");
      w.StartObject();
      put(w, "openIdConnectUrl", config.openid_connect_url);
      put(w, "description", where);
      w.EndObject();
      w.EndObject();
    }
    w.EndObject();
    // Either scheme satisfies the card: a list of alternatives, each one
    // requirement naming one scheme with no scopes.
    std::vector<const char *> alternatives = {"bearer"};
    if (oidc) alternatives.push_back("oidc");
    w.Key("security");  // v0.3: [{"<scheme>": []}, ...]
    w.StartArray();
    for (const char *name : alternatives) {
      w.StartObject();
      w.Key(name);
      w.StartArray();
      w.EndArray();
      w.EndObject();
    }
    w.EndArray();
    w.Key("securityRequirements");  // v1.0: [{"schemes": {"<scheme>": {"list": []}}}, ...]
    w.StartArray();
    for (const char *name : alternatives) {
      w.StartObject();
      w.Key("schemes");
      w.StartObject();
      w.Key(name);
      w.StartObject();
      w.Key("list");
      w.StartArray();
      w.EndArray();
      w.EndObject();
      w.EndObject();
      w.EndObject();
    }
    w.EndArray();
  }
  put_list(w, "defaultInputModes", {"text/plain"});
  put_list(w, "defaultOutputModes", {"text/plain"});
  w.Key("skills");
  w.StartArray();
  for (const AgentSkill &s : config.skills) {
    w.StartObject();
    put(w, "id", s.id);
    put(w, "name", s.name);
    put(w, "description", s.description);
    put_list(w, "tags", s.tags);
    if (!s.examples.empty()) put_list(w, "examples", s.examples);
    w.EndObject();
  }
  w.EndArray();
  w.Key("supportsAuthenticatedExtendedCard");  // v0.3
  w.Bool(false);
  w.EndObject();
  return std::string(buf.GetString(), buf.GetSize());
}

std::string card_etag(std::string_view card_json) {
  Poco::SHA2Engine sha(Poco::SHA2Engine::SHA_256);
  sha.update(card_json.data(), static_cast<unsigned>(card_json.size()));
  return "\"" + Poco::DigestEngine::digestToHex(sha.digest()) + "\"";
}

bool if_none_match(std::string_view field, std::string_view etag) {
  // RFC 9110: If-None-Match = "*" / #entity-tag; entity-tag = [ "W/" ]
  // DQUOTE *etagc DQUOTE; list elements are separated by OWS "," OWS (and
  // etagc may be a comma, so the list is read tag by tag).
  const auto blank = [](char c) { return c == ' ' || c == '\t'; };
  std::size_t i = 0;
  while (i < field.size() && blank(field[i])) ++i;
  if (field.substr(i, 1) == "*") return field.find_first_not_of(" \t", i + 1) == std::string_view::npos;
  for (;;) {
    while (i < field.size() && (blank(field[i]) || field[i] == ',')) ++i;
    if (i == field.size()) return false;
    if (field.substr(i, 2) == "W/") i += 2;
    if (i == field.size() || field[i] != '"') return false;  // malformed
    const std::size_t close = field.find('"', i + 1);
    if (close == std::string_view::npos) return false;
    if (field.substr(i, close + 1 - i) == etag) return true;
    i = close + 1;
    while (i < field.size() && blank(field[i])) ++i;
    if (i < field.size() && field[i] != ',') return false;  // malformed
  }
}

}  // namespace toolnexus::server_detail

// server/src/wire/agent_card.hpp: the Agent Card (A2A v0.3 section 5.5, v1.0
// section 8.4), served
// at /.well-known/agent-card.json and /.well-known/agent.json.
#ifndef TOOLNEXUS_SERVER_AGENT_CARD_HPP
#define TOOLNEXUS_SERVER_AGENT_CARD_HPP

#include "toolnexus/server.hpp"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace toolnexus::server_detail {

/// What the card says besides its url.
struct CardConfig {
  AgentCardOptions options;
  std::vector<AgentSkill> skills;
  /// Declares the "bearer" HTTP security scheme and requires it.
  bool bearer_auth = false;
  /// The bearer scheme takes JWTs (auth.jwt): bearerFormat "JWT".
  bool bearer_jwt = false;
  /// Only JWTs (no token file): the scheme's description says so.
  bool jwt_only = false;
  /// auth.jwt.openid_configuration_url: when not empty, an "oidc"
  /// openIdConnect scheme is declared too, as an alternative requirement.
  std::string openid_connect_url;
  /// capabilities.pushNotifications.
  bool push_notifications = false;
};

/// The card as JSON, readable by v1.0 and v0.3 clients alike: name,
/// description, supportedInterfaces (v1.0 section 8.4: JSONRPC 1.0 at `url`,
/// HTTP+JSON 1.0 at `url` without its trailing "/", JSONRPC 0.3 at `url`),
/// the v0.3 fields protocolVersion "0.3.0", url, preferredTransport
/// "JSONRPC", additionalInterfaces; provider (only when configured),
/// version, documentationUrl (when set), capabilities {streaming: true,
/// pushNotifications (as configured), extendedAgentCard: false,
/// stateTransitionHistory: false}, securitySchemes with both versions'
/// shapes ("bearer"; "oidc" too when openid_connect_url is set, either one
/// satisfying the card) and security (v0.3) / securityRequirements (v1.0)
/// when bearer_auth, defaultInputModes and defaultOutputModes ["text/plain"],
/// skills, supportsAuthenticatedExtendedCard: false.
std::string agent_card_json(const CardConfig &config, std::string_view url);

/// How one card request reached the server: its header fields (views into
/// the request, "" when absent) and this server's side of the connection.
struct CardRequest {
  std::string_view host;               ///< Host
  std::string_view forwarded;          ///< Forwarded (RFC 7239)
  std::string_view x_forwarded_proto;  ///< X-Forwarded-Proto
  std::string_view x_forwarded_host;   ///< X-Forwarded-Host
  /// The local address the connection arrived on, as "ADDR:PORT" ("[V6]:PORT";
  /// an IPv4-mapped IPv6 address as IPv4); "" when unknown.
  std::string local;
  /// The local address without the port ("127.0.0.1", "::1"; "" unknown).
  std::string local_addr;
  /// The local port (0 unknown).
  uint16_t local_port = 0;
  /// The local address is a loopback address (127.0.0.0/8, ::1).
  bool loopback = false;
};

/// The card's url (the JSON-RPC endpoint; always ends in "/"), chosen so
/// that no client can make the card point elsewhere than the operator
/// allows (the card is cacheable: a forged url would send other clients to
/// an attacker):
///  1. options.public_url when set;
///  2. only with options.trust_forwarded (a proxy in front sets them): the
///     scheme from Forwarded proto= / X-Forwarded-Proto (http or https),
///     the host from Forwarded host= / X-Forwarded-Host, taken from the last
///     field line (the caller passes it) and in it from the last element
///     that has it (the nearest proxy appends its own, RFC 7239 section 4),
///     when it is a
///     well-formed host and, if options.allowed_hosts is not empty, one of
///     them;
///  3. the Host header when it names this server: an entry of
///     options.allowed_hosts (see is_allowed_host), this connection's own
///     local ADDR:PORT (ADDR alone when the port is 80), or, on a loopback
///     connection, a loopback name (localhost, 127.x.y.z, [::1]) with any
///     port;
///  4. else the local address the request arrived on (`fallback`,
///     "HOST:PORT" of the listen address, when that is unknown).
/// The scheme is http, or https when 2. says so and the host comes from 2.,
/// an allowed host or a loopback name (never for this server's own address,
/// whose socket speaks plain HTTP). A host with characters outside
/// [A-Za-z0-9.-_:[]] is never used.
std::string card_url(const AgentCardOptions &options, const CardRequest &request, std::string_view fallback);

/// The card's strong entity tag: the SHA-256 of `card_json` in lower-case
/// hex, in double quotes ("\"9f86...\"", 66 characters).
std::string card_etag(std::string_view card_json);

/// Whether an If-None-Match field value matches `etag` (a strong tag, as
/// card_etag makes them), by RFC 9110 section 13.1.2: "*" matches; else a
/// comma-separated list of entity tags, any of which matches when its
/// opaque tag equals etag's (the weak comparison: "W/" is ignored). An empty
/// or malformed value matches nothing (the full answer is sent).
bool if_none_match(std::string_view field, std::string_view etag);

/// Whether the request's Host names this server, by the rule card_url
/// takes a Host by (step 3: an entry of options.allowed_hosts, this
/// connection's own local ADDR:PORT, a loopback name on a loopback
/// connection) or public_url's host and port; always true when
/// options.allowed_hosts holds "*". The bindings refuse API requests
/// without it (421): a web page whose DNS name was rebound to this server
/// sends its own name as Host.
bool host_names_this_server(const AgentCardOptions &options, const CardRequest &request);

/// Whether a request with Origin `origin` (RFC 6454 serialization; "" =
/// none) may call the API: no Origin (not a browser, or a same-origin GET);
/// an entry of options.allowed_origins ("*" = any, "null" included), the
/// same origin as the Origin (RFC 6454 section 5: scheme, host and port,
/// an absent port being the scheme's default; see parse_web_origin); or
/// this server's own origin as the request reached it: the scheme and host
/// a trusted proxy gives (options.trust_forwarded, the rule of card_url's
/// step 2; else http and the Host header), or public_url's scheme, host and
/// port. "null" (a sandboxed page, a file) is allowed only through "*"; an
/// Origin that is not an http(s) origin never matches an entry.
bool origin_allowed(const AgentCardOptions &options, std::string_view origin, const CardRequest &request);

/// Whether `host` ("name" or "name:port", "[v6]" or "[v6]:port", as in a
/// Host header) matches one of `allowed`: the names compare without case;
/// an entry without a port matches any port, an entry with one matches
/// only that port (a host without a port has `default_port`).
bool is_allowed_host(std::string_view host, const std::vector<std::string> &allowed, uint16_t default_port);

}  // namespace toolnexus::server_detail

#endif  // TOOLNEXUS_SERVER_AGENT_CARD_HPP

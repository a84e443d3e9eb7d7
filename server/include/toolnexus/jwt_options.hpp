// toolnexus/jwt_options.hpp: bearer JWT authentication (OAuth 2 / OpenID
// Connect access tokens; RFC 7519 JWT, RFC 7515 JWS, RFC 7517 JWK, RFC 7518
// algorithms, RFC 6750 bearer usage) for `toolnexus serve`'s "auth.jwt"
// config object and ServerOptions::jwt. Issue 24 item 2; the rules are in
// docs/configuration.md, "JWT bearer tokens".
#ifndef TOOLNEXUS_JWT_OPTIONS_HPP
#define TOOLNEXUS_JWT_OPTIONS_HPP

#include <rapidjson/document.h>

#include <cstddef>
#include <string>
#include <vector>

namespace toolnexus {

/// How "Authorization: Bearer <JWT>" is validated. Plain value type. A
/// token is accepted only when all of these hold: it is a compact JWS whose
/// header "alg" is one of `algorithms` and equals the algorithm of the key
/// that verifies it (the key's JWK "alg", else RS256 for kty RSA, ES256 for
/// kty EC crv P-256, HS256 for kty oct), picked by the header's "kid" (or,
/// without one, any key of that algorithm); its signature verifies; "exp"
/// (required) is after now - clock_skew_s and "nbf" (if present) before
/// now + clock_skew_s; "iss" equals `issuer`; "aud" (a string or an array
/// of strings) holds one of `audience`; `principal_claim` is a non-empty
/// string (and `tenant_claim`, when set, a string if present).
struct JwtOptions {
  /// The issuer ("iss") tokens must name exactly, e.g.
  /// "https://login.example.com/realms/agents". Required.
  std::string issuer;
  /// Accepted audiences: a token's "aud" must hold at least one. Required
  /// (at least one, each non-empty).
  std::vector<std::string> audience;
  /// A JWKS file (RFC 7517 section 5, {"keys": [...]}), read once by
  /// serve(). Exactly one of jwks_file and jwks_url is set.
  std::string jwks_file;
  /// The issuer's JWKS URL (http:// or https://; usually the OIDC discovery
  /// document's jwks_uri), fetched by serve() and again, at most once per
  /// jwks_refresh_min_s, when a token names a "kid" the cached set lacks or
  /// the cached set is older than jwks_max_age_s. Symmetric (kty oct) keys
  /// are never taken from a URL.
  std::string jwks_url;
  /// The claim naming the principal (the owner of the caller's Tasks).
  std::string principal_claim = "sub";
  /// The claim naming the caller's tenant ("" = tenants are not taken from
  /// tokens). A token carrying it binds its caller to that tenant: requests
  /// naming no tenant get it, requests naming another are refused
  /// (-32602 / 400 on params.tenant).
  std::string tenant_claim;
  /// Leeway for "exp" and "nbf", seconds, 0..600.
  int clock_skew_s = 60;
  /// Accepted "alg" values, from RS256, ES256, HS256 (default RS256 and
  /// ES256: a shared secret has to be asked for). "none" is never accepted.
  std::vector<std::string> algorithms = {"RS256", "ES256"};
  /// jwks_url only: the least time between two fetches, seconds (1..86400):
  /// tokens with random "kid"s cause at most one fetch per this interval.
  int jwks_refresh_min_s = 60;
  /// jwks_url only: a cached key set older than this (seconds, 60..604800)
  /// is fetched again on the next request (still at most once per
  /// jwks_refresh_min_s; a failed fetch keeps the old set).
  int jwks_max_age_s = 3600;
  /// jwks_url only: connect/send/receive timeout of one fetch, ms
  /// (1..60000). A fetch holds up only requests that need it; others go on
  /// with the cached set.
  int jwks_timeout_ms = 5000;
  /// The issuer's OpenID Connect discovery document (http:// or https://,
  /// usually `issuer` + "/.well-known/openid-configuration"), or "" (the
  /// default). When set, the agent card declares it as an "openIdConnect"
  /// security scheme named "oidc" (A2A v0.3 section 5.5 / v1.0 section 4.5,
  /// OpenAPI 3 "openIdConnectUrl") beside "bearer", either one satisfying
  /// the card's security requirements, so a client learns where to get a
  /// token. Informational: the server never fetches it; tokens are checked
  /// as above whatever it says.
  std::string openid_configuration_url;
  /// True when JWT authentication is configured (a key source is set).
  bool enabled() const noexcept { return !jwks_file.empty() || !jwks_url.empty(); }
};

/// Parses the "jwt" config object: {"issuer", "audience" (string or array),
/// "jwks_file" | "jwks_url", "principal_claim", "tenant_claim" (string or
/// null), "clock_skew_s", "algorithms", "jwks_refresh_min_s",
/// "jwks_max_age_s", "jwks_timeout_ms", "openid_configuration_url"}. `where` prefixes every error
/// ("cfg.json: auth.jwt"). A relative jwks_file is returned as given (the
/// caller resolves it). Throws std::invalid_argument naming the key and the
/// rule broken, also for an unknown key or a missing required one.
JwtOptions parse_jwt_options(const rapidjson::Value &section, const std::string &where);

/// Checks `o` against the rules above (what parse_jwt_options() enforces).
/// jwks_url and openid_configuration_url must be absolute http(s) URLs with
/// a host, an optional port 1..65535, no user name or password, no fragment,
/// only printable ASCII (percent-encode the rest) and at most 2048 bytes.
/// Throws std::invalid_argument naming the field, the value (control bytes
/// shown as \xNN) and what is wrong; `where` prefixes it.
void check_jwt_options(const JwtOptions &o, const std::string &where);

/// Writes jwks_url and openid_configuration_url with their scheme and host
/// in lower case ("HTTPS://Login.Example.COM/x" -> "https://login.example.com/x"),
/// as the card and the fetcher use them; a URL check_jwt_options() would
/// refuse is left as it is. parse_jwt_options() and serve() call it.
void normalize_jwt_urls(JwtOptions &o);

}  // namespace toolnexus

#endif  // TOOLNEXUS_JWT_OPTIONS_HPP

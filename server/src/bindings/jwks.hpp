// server/src/bindings/jwks.hpp: JSON Web Key Sets (RFC 7517) as verification
// keys for bearer JWTs (jwt_auth.hpp): parsing a JWKS into OpenSSL keys, each
// pinned to one algorithm (RFC 7518 section 3: RS256, ES256, HS256), and
// fetching one from an issuer's URL with Poco's HTTP(S) client.
#ifndef TOOLNEXUS_SERVER_JWKS_HPP
#define TOOLNEXUS_SERVER_JWKS_HPP

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

typedef struct evp_pkey_st EVP_PKEY;

namespace toolnexus::server_detail {

/// base64url without padding (RFC 7515 section 2, RFC 4648 section 5) ->
/// bytes. False on any other character, on padding, or on an impossible
/// length; `out` is then unspecified.
bool base64url_decode(std::string_view in, std::string &out);

/// One verification key. Immutable once parsed; shared between threads.
struct Jwk {
  /// The JWK's "kid" ("" when it has none).
  std::string kid;
  /// The one algorithm this key verifies: its "alg", else RS256 for kty
  /// RSA, ES256 for kty EC (crv P-256), HS256 for kty oct.
  std::string alg;
  /// The public key (RS256, ES256); null for HS256.
  std::shared_ptr<EVP_PKEY> pkey;
  /// The shared secret (HS256 only; bytes of "k").
  std::string secret;
};

/// Parses a JWKS document ({"keys": [...]}, RFC 7517 section 5) with
/// RapidJSON. Keys whose "use" is not "sig", whose algorithm is not in
/// `allowed` (or is not RS256/ES256/HS256), whose kty/crv is not supported,
/// or that are symmetric (kty oct) while `allow_symmetric` is false are left
/// out, each with a line in `*skipped` (may be null) saying which and why.
/// A malformed key (not an object, a member missing or not base64url, an
/// RSA modulus under 2048 bits, an EC point not on P-256) is left out the
/// same way when `skip_malformed` (a set fetched from an issuer), else
/// throws. Throws std::invalid_argument, prefixed with `where`, when the
/// document is not JSON or not {"keys": [...]}: messages name the key by
/// index and kid.
std::vector<Jwk> parse_jwks(std::string_view json, const std::vector<std::string> &allowed, bool allow_symmetric,
                            bool skip_malformed, const std::string &where, std::vector<std::string> *skipped);

/// GETs `url` (http:// or https://; TLS verified against the system CAs)
/// and returns the body. Each of connect, send and receive is bounded by
/// `timeout_ms`, and so is the whole fetch (checked between reads); bodies
/// over `max_bytes` are refused. Throws
/// std::runtime_error naming the URL and the cause (refused, timed out, a
/// status other than 200, too large).
std::string fetch_url(const std::string &url, int timeout_ms, std::size_t max_bytes);

}  // namespace toolnexus::server_detail

#endif  // TOOLNEXUS_SERVER_JWKS_HPP

// server/src/bindings/jwt_auth.hpp: validation of bearer JWTs (RFC 7519; JWS
// compact form, RFC 7515 section 7.1) against JwtOptions
// (toolnexus/jwt_options.hpp): the signature with a key from a JWKS file or
// URL (jwks.hpp), then exp/nbf, iss, aud, and the principal and tenant
// claims. Issue 24 item 2. The Task domain never sees this; only the HTTP
// binding calls it.
#ifndef TOOLNEXUS_SERVER_JWT_AUTH_HPP
#define TOOLNEXUS_SERVER_JWT_AUTH_HPP

#include "bindings/jwks.hpp"
#include "common/log.hpp"
#include "toolnexus/jwt_options.hpp"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace toolnexus::server_detail {

/// Why a token was refused. What the client is told (jwt_failure_text) is
/// deliberately coarse: a token whose signature verifies learns only that
/// it is expired, not yet valid, or not accepted here, never which claim
/// (iss, aud, the principal) failed; the log says which.
enum class JwtFailure {
  malformed,      ///< not a compact JWS, bad base64url or JSON, no/bad "alg"
  unverifiable,   ///< no key for its kid/alg, or the signature does not verify
  expired,        ///< "exp" missing or before now - clock skew
  not_yet_valid,  ///< "nbf" after now + clock skew
  not_accepted,   ///< iss, aud, the principal or the tenant claim failed
};

/// The RFC 6750 error_description sent for `f` (plain ASCII, no quotes).
const char *jwt_failure_text(JwtFailure f) noexcept;

/// Who a valid token names.
struct JwtIdentity {
  /// The principal_claim's value.
  std::string principal;
  /// The tenant_claim's value, when configured and present.
  std::optional<std::string> tenant;
};

/// A validation's outcome: `identity` set, or `failure` and `detail` (for
/// the log only: which check failed; never holds the token).
struct JwtResult {
  std::optional<JwtIdentity> identity;
  JwtFailure failure = JwtFailure::malformed;
  std::string detail;
};

/// Validates bearer JWTs. Thread-safe: validate() may run on every request
/// thread at once; the key set is swapped atomically when refetched.
class JwtAuth {
 public:
  /// Checks `o` (check_jwt_options) and loads the keys: reads jwks_file
  /// (throws std::invalid_argument naming the file and the key at fault,
  /// or when it yields no usable key), or fetches jwks_url (a failure is
  /// logged as a warning and retried on demand: tokens are refused until a
  /// fetch succeeds). Skipped keys are logged as warnings. `log` is
  /// borrowed and must outlive this.
  JwtAuth(JwtOptions o, const Logger &log);

  /// Validates `token` (the credential after "Bearer "). May fetch the
  /// JWKS URL (at most one fetch at a time, at most once per
  /// jwks_refresh_min_s) when the token's kid is unknown or the set is
  /// stale. Never throws except std::bad_alloc.
  JwtResult validate(std::string_view token) const;

  /// The options in force.
  const JwtOptions &options() const noexcept { return o_; }

  /// JWKS URL fetches attempted so far (successful or not).
  uint64_t fetches() const noexcept { return fetches_.load(); }

 private:
  using Keys = std::vector<Jwk>;
  using Clock = std::chrono::steady_clock;
  std::shared_ptr<const Keys> keys() const;
  /// Fetches the URL if allowed now (rate limit; no other fetch running);
  /// `force` = also when the set is fresh (unknown kid).
  void maybe_refresh(bool force) const;
  bool verify_signature(const Jwk &k, std::string_view signing_input, const std::string &sig) const;

  JwtOptions o_;
  const Logger &log_;
  mutable std::mutex keys_mu_;
  mutable std::shared_ptr<const Keys> keys_;
  mutable Clock::time_point fetched_at_{};  // last success (keys_mu_)
  mutable std::mutex fetch_mu_;             // held while a fetch runs
  mutable Clock::time_point last_attempt_{};  // (fetch_mu_)
  mutable bool attempted_ = false;            // (fetch_mu_)
  mutable std::atomic<uint64_t> fetches_{0};
};

}  // namespace toolnexus::server_detail

#endif  // TOOLNEXUS_SERVER_JWT_AUTH_HPP

// Bearer JWT validation: the signature with OpenSSL's EVP interface, the
// header and claims with RapidJSON.
#include "bindings/jwt_auth.hpp"

#include <openssl/crypto.h>
#include <openssl/ecdsa.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <rapidjson/document.h>

#include <cmath>
#include <fstream>
#include <set>
#include <sstream>
#include <stdexcept>

namespace toolnexus::server_detail {
namespace {

constexpr std::size_t kMaxJwksBytes = 1 << 20;
constexpr std::size_t kMaxClaimBytes = 1024;

// A JSON object from base64url `part`; false when it is not one, or names
// a member twice (RFC 7515 section 4 and RFC 7519 section 4 let a JWT with
// duplicate names be refused; taking one copy would read it differently
// from the issuer or another validator).
bool decode_object(std::string_view part, rapidjson::Document &doc) {
  std::string json;
  if (part.empty() || !base64url_decode(part, json)) return false;
  doc.Parse<rapidjson::kParseValidateEncodingFlag | rapidjson::kParseIterativeFlag>(json.data(), json.size());
  if (doc.HasParseError() || !doc.IsObject()) return false;
  std::set<std::string_view> names;
  for (const auto &m : doc.GetObject())
    if (!names.emplace(m.name.GetString(), m.name.GetStringLength()).second) return false;
  return true;
}

// Whether member `name` is present but not of the type it must have.
bool present_not_number(const rapidjson::Value &obj, const char *name) {
  auto it = obj.FindMember(name);
  return it != obj.MemberEnd() && (!it->value.IsNumber() || !std::isfinite(it->value.GetDouble()));
}
bool present_not_string(const rapidjson::Value &obj, const char *name) {
  auto it = obj.FindMember(name);
  return it != obj.MemberEnd() && !it->value.IsString();
}

std::optional<std::string_view> string_claim(const rapidjson::Value &obj, const std::string &name) {
  auto it = obj.FindMember(rapidjson::StringRef(name.data(), name.size()));
  if (it == obj.MemberEnd() || !it->value.IsString()) return std::nullopt;
  return std::string_view(it->value.GetString(), it->value.GetStringLength());
}

// A NumericDate claim (RFC 7519 section 2), seconds; nullopt when absent or
// not a finite number.
std::optional<double> date_claim(const rapidjson::Value &obj, const char *name) {
  auto it = obj.FindMember(name);
  if (it == obj.MemberEnd() || !it->value.IsNumber()) return std::nullopt;
  const double v = it->value.GetDouble();
  if (!std::isfinite(v)) return std::nullopt;
  return v;
}

bool evp_verify(EVP_PKEY *key, std::string_view input, const unsigned char *sig, std::size_t sig_len) {
  EVP_MD_CTX *ctx = EVP_MD_CTX_new();
  if (ctx == nullptr) return false;
  const bool ok = EVP_DigestVerifyInit(ctx, nullptr, EVP_sha256(), nullptr, key) == 1 &&
                  EVP_DigestVerify(ctx, sig, sig_len, reinterpret_cast<const unsigned char *>(input.data()),
                                   input.size()) == 1;
  EVP_MD_CTX_free(ctx);
  return ok;
}

// ES256's JWS signature is R || S, 32 bytes each (RFC 7518 section 3.4);
// OpenSSL verifies the DER ECDSA-Sig-Value.
bool es256_verify(EVP_PKEY *key, std::string_view input, const std::string &sig) {
  if (sig.size() != 64) return false;
  const auto *p = reinterpret_cast<const unsigned char *>(sig.data());
  ECDSA_SIG *es = ECDSA_SIG_new();
  if (es == nullptr) return false;
  BIGNUM *r = BN_bin2bn(p, 32, nullptr), *s = BN_bin2bn(p + 32, 32, nullptr);
  if (r == nullptr || s == nullptr || ECDSA_SIG_set0(es, r, s) != 1) {
    BN_free(r);
    BN_free(s);
    ECDSA_SIG_free(es);
    return false;
  }
  unsigned char *der = nullptr;
  const int der_len = i2d_ECDSA_SIG(es, &der);
  ECDSA_SIG_free(es);
  if (der_len <= 0) return false;
  const bool ok = evp_verify(key, input, der, static_cast<std::size_t>(der_len));
  OPENSSL_free(der);
  return ok;
}

std::string read_file(const std::string &path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::invalid_argument("cannot read the JWKS file " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

const char *jwt_failure_text(JwtFailure f) noexcept {
  switch (f) {
    case JwtFailure::malformed: return "the token is not a well-formed JWT";
    case JwtFailure::unverifiable: return "the token signature cannot be verified";
    case JwtFailure::expired: return "the token is expired";
    case JwtFailure::not_yet_valid: return "the token is not valid yet";
    case JwtFailure::not_accepted: return "the token is not accepted by this server";
  }
  return "the token is not valid";
}

JwtAuth::JwtAuth(JwtOptions o, const Logger &log) : o_(std::move(o)), log_(log) {
  check_jwt_options(o_, "auth.jwt");
  if (!o_.jwks_file.empty()) {
    std::vector<std::string> skipped;
    auto keys = parse_jwks(read_file(o_.jwks_file), o_.algorithms, true, false, "the JWKS file " + o_.jwks_file,
                           &skipped);
    for (const std::string &s : skipped) log_.warn(s);
    if (keys.empty())
      throw std::invalid_argument("the JWKS file " + o_.jwks_file + " holds no key usable with auth.jwt.algorithms");
    keys_ = std::make_shared<const Keys>(std::move(keys));
  } else {
    keys_ = std::make_shared<const Keys>();
    maybe_refresh(true);
  }
}

std::shared_ptr<const JwtAuth::Keys> JwtAuth::keys() const {
  std::lock_guard<std::mutex> lock(keys_mu_);
  return keys_;
}

void JwtAuth::maybe_refresh(bool force) const {
  if (o_.jwks_url.empty()) return;
  const Clock::time_point now = Clock::now();
  if (!force) {
    std::lock_guard<std::mutex> lock(keys_mu_);
    if (!keys_->empty() && now - fetched_at_ < std::chrono::seconds(o_.jwks_max_age_s)) return;
  }
  // One fetch at a time: a request that finds one running goes on with the
  // keys it has.
  std::unique_lock<std::mutex> fetching(fetch_mu_, std::try_to_lock);
  if (!fetching.owns_lock()) return;
  if (attempted_ && now - last_attempt_ < std::chrono::seconds(o_.jwks_refresh_min_s)) return;
  attempted_ = true;
  last_attempt_ = now;
  fetches_.fetch_add(1);
  try {
    const std::string body = fetch_url(o_.jwks_url, o_.jwks_timeout_ms, kMaxJwksBytes);
    std::vector<std::string> skipped;
    auto keys = parse_jwks(body, o_.algorithms, false, true, "the JWKS at " + o_.jwks_url, &skipped);
    for (const std::string &s : skipped) log_.warn(s);
    const std::size_t n = keys.size();
    {
      std::lock_guard<std::mutex> lock(keys_mu_);
      keys_ = std::make_shared<const Keys>(std::move(keys));
      fetched_at_ = Clock::now();
    }
    log_.info("auth.jwt: fetched " + std::to_string(n) + " key(s) from " + o_.jwks_url);
  } catch (const std::exception &e) {
    log_.warn(std::string("auth.jwt: ") + e.what() + " (the keys held are kept; tried again in " +
              std::to_string(o_.jwks_refresh_min_s) + " s at the earliest)");
  }
}

bool JwtAuth::verify_signature(const Jwk &k, std::string_view input, const std::string &sig) const {
  if (k.alg == "RS256")
    return evp_verify(k.pkey.get(), input, reinterpret_cast<const unsigned char *>(sig.data()), sig.size());
  if (k.alg == "ES256") return es256_verify(k.pkey.get(), input, sig);
  if (k.alg == "HS256") {
    unsigned char mac[EVP_MAX_MD_SIZE];
    unsigned int mac_len = 0;
    if (HMAC(EVP_sha256(), k.secret.data(), static_cast<int>(k.secret.size()),
             reinterpret_cast<const unsigned char *>(input.data()), input.size(), mac, &mac_len) == nullptr)
      return false;
    return sig.size() == mac_len && CRYPTO_memcmp(mac, sig.data(), mac_len) == 0;
  }
  return false;
}

JwtResult JwtAuth::validate(std::string_view token) const {
  JwtResult out;
  const auto fail = [&](JwtFailure f, std::string detail) {
    out.failure = f;
    out.detail = std::move(detail);
    return out;
  };
  // Compact JWS: header.payload.signature (a JWE has five parts).
  const auto dot1 = token.find('.');
  const auto dot2 = dot1 == std::string_view::npos ? dot1 : token.find('.', dot1 + 1);
  if (dot2 == std::string_view::npos || token.find('.', dot2 + 1) != std::string_view::npos)
    return fail(JwtFailure::malformed, "not three dot-separated parts");
  rapidjson::Document header, claims;
  if (!decode_object(token.substr(0, dot1), header))
    return fail(JwtFailure::malformed, "the header is not a JSON object with distinct member names");
  const auto alg = string_claim(header, "alg");
  if (!alg) return fail(JwtFailure::malformed, "the header has no alg");
  if (header.HasMember("crit"))
    return fail(JwtFailure::malformed, "the header has crit (no extension is understood; RFC 7515 4.1.11)");
  bool allowed = false;
  for (const std::string &a : o_.algorithms) allowed = allowed || a == *alg;
  if (!allowed) return fail(JwtFailure::unverifiable, "alg " + std::string(*alg) + " is not accepted");
  std::string sig;
  if (!base64url_decode(token.substr(dot2 + 1), sig) || sig.empty())
    return fail(JwtFailure::malformed, "the signature is not base64url");
  const std::string_view signing_input = token.substr(0, dot2);
  if (present_not_string(header, "kid")) return fail(JwtFailure::malformed, "the header's kid is not a string");
  const auto kid = string_claim(header, "kid");

  // The key: by kid (fetching the set again, bounded, when the kid is
  // unknown), else every key of the token's algorithm. The key's own
  // algorithm must be the token's: an HS256 token never meets an RSA key.
  maybe_refresh(false);
  std::shared_ptr<const Keys> keys = this->keys();
  const auto kid_known = [&](const Keys &ks) {
    for (const Jwk &k : ks)
      if (k.kid == *kid) return true;
    return false;
  };
  if (kid && !kid_known(*keys)) {
    maybe_refresh(true);
    keys = this->keys();
    if (!kid_known(*keys)) return fail(JwtFailure::unverifiable, "no key has kid " + std::string(*kid));
  }
  bool verified = false, candidate = false;
  for (const Jwk &k : *keys) {
    if ((kid && k.kid != *kid) || k.alg != *alg) continue;
    candidate = true;
    if (verify_signature(k, signing_input, sig)) {
      verified = true;
      break;
    }
  }
  if (!candidate) return fail(JwtFailure::unverifiable, "no key for alg " + std::string(*alg));
  if (!verified) return fail(JwtFailure::unverifiable, "the signature does not verify");

  // Claims, only once the signature holds.
  if (!decode_object(token.substr(dot1 + 1, dot2 - dot1 - 1), claims))
    return fail(JwtFailure::malformed, "the payload is not a JSON object with distinct member names");
  if (present_not_number(claims, "exp") || present_not_number(claims, "nbf"))
    return fail(JwtFailure::malformed, "exp or nbf is not a NumericDate (RFC 7519 section 2)");
  const double now =
      static_cast<double>(std::chrono::duration_cast<std::chrono::seconds>(
                              std::chrono::system_clock::now().time_since_epoch()).count());
  const auto exp = date_claim(claims, "exp");
  if (!exp) return fail(JwtFailure::malformed, "no exp (this server requires one: docs/configuration.md)");
  if (now >= *exp + o_.clock_skew_s) return fail(JwtFailure::expired, "exp has passed");
  if (const auto nbf = date_claim(claims, "nbf"); nbf && now + o_.clock_skew_s < *nbf)
    return fail(JwtFailure::not_yet_valid, "nbf is ahead");
  const auto iss = string_claim(claims, "iss");
  if (!iss || *iss != o_.issuer) return fail(JwtFailure::not_accepted, "iss is not the issuer");
  bool aud_ok = false;
  const auto aud_matches = [&](const rapidjson::Value &v) {
    if (!v.IsString()) return false;
    const std::string_view a(v.GetString(), v.GetStringLength());
    for (const std::string &want : o_.audience)
      if (a == want) return true;
    return false;
  };
  if (auto it = claims.FindMember("aud"); it != claims.MemberEnd()) {
    if (it->value.IsArray()) {
      for (const auto &a : it->value.GetArray()) aud_ok = aud_ok || aud_matches(a);
    } else {
      aud_ok = aud_matches(it->value);
    }
  }
  if (!aud_ok) return fail(JwtFailure::not_accepted, "aud holds no accepted audience");
  const auto principal = string_claim(claims, o_.principal_claim);
  if (!principal || principal->empty() || principal->size() > kMaxClaimBytes)
    return fail(JwtFailure::not_accepted, "the principal claim " + o_.principal_claim + " is not a string of 1 to " +
                                              std::to_string(kMaxClaimBytes) + " bytes");
  JwtIdentity id;
  id.principal = std::string(*principal);
  if (!o_.tenant_claim.empty()) {
    auto it = claims.FindMember(rapidjson::StringRef(o_.tenant_claim.data(), o_.tenant_claim.size()));
    if (it != claims.MemberEnd()) {  // present: a string (null binds no tenant and is refused)
      if (!it->value.IsString() || it->value.GetStringLength() == 0 || it->value.GetStringLength() > kMaxClaimBytes)
        return fail(JwtFailure::not_accepted, "the tenant claim " + o_.tenant_claim + " is not a string of 1 to " +
                                                  std::to_string(kMaxClaimBytes) + " bytes");
      id.tenant = std::string(it->value.GetString(), it->value.GetStringLength());
    }
  }
  out.identity = std::move(id);
  return out;
}

}  // namespace toolnexus::server_detail

// tests/jwt_mint.hpp: keys, JWKs and compact JWS tokens made with OpenSSL,
// as an issuer makes them, for the JWT tests and jwt_bench (issue 24.2).
// Header-only; base64url is Poco's (RFC 4648 section 5, no padding, as RFC
// 7515 section 2 asks). Functions throw std::runtime_error when OpenSSL
// fails; all are thread-safe.
#ifndef TOOLNEXUS_TESTS_JWT_MINT_HPP
#define TOOLNEXUS_TESTS_JWT_MINT_HPP

#include <Poco/Base64Encoder.h>
#include <openssl/bio.h>
#include <openssl/core_names.h>
#include <openssl/ecdsa.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/pem.h>

#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace tnxtest::jwt {

/// `bytes` in base64url without padding.
inline std::string b64url(std::string_view bytes) {
  std::ostringstream out;
  Poco::Base64Encoder enc(out, Poco::BASE64_URL_ENCODING | Poco::BASE64_NO_PADDING);
  enc.rdbuf()->setLineLength(0);
  enc.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  enc.close();
  return out.str();
}

/// An OpenSSL key, freed with its last owner.
using Pkey = std::shared_ptr<EVP_PKEY>;

inline Pkey checked(EVP_PKEY *k, const char *what) {
  if (k == nullptr) throw std::runtime_error(std::string("jwt_mint: cannot make ") + what);
  return Pkey(k, EVP_PKEY_free);
}
/// A new RSA 2048-bit key (the slow one: about 0.1 s).
inline Pkey rsa_key() { return checked(EVP_RSA_gen(2048), "an RSA key"); }
/// A new EC P-256 key.
inline Pkey ec_key() { return checked(EVP_EC_gen("P-256"), "an EC key"); }

/// Big-number parameter `name` of `k`, big-endian, left-padded to `pad`
/// bytes (0: its own length).
inline std::string bn_param(EVP_PKEY *k, const char *name, int pad = 0) {
  BIGNUM *bn = nullptr;
  if (EVP_PKEY_get_bn_param(k, name, &bn) != 1) throw std::runtime_error(std::string("jwt_mint: no ") + name);
  std::string out(static_cast<std::size_t>(pad > 0 ? pad : BN_num_bytes(bn)), '\0');
  BN_bn2binpad(bn, reinterpret_cast<unsigned char *>(out.data()), static_cast<int>(out.size()));
  BN_free(bn);
  return out;
}

/// The public JWK (RFC 7518 section 6.3) of RSA key `k`, named `kid`.
inline std::string rsa_jwk(EVP_PKEY *k, const std::string &kid) {
  return R"({"kty":"RSA","use":"sig","kid":")" + kid + R"(","n":")" + b64url(bn_param(k, OSSL_PKEY_PARAM_RSA_N)) +
         R"(","e":")" + b64url(bn_param(k, OSSL_PKEY_PARAM_RSA_E)) + R"("})";
}

/// The public JWK (RFC 7518 section 6.2) of P-256 key `k`, named `kid`.
inline std::string ec_jwk(EVP_PKEY *k, const std::string &kid) {
  return R"({"kty":"EC","crv":"P-256","kid":")" + kid + R"(","x":")" +
         b64url(bn_param(k, OSSL_PKEY_PARAM_EC_PUB_X, 32)) + R"(","y":")" +
         b64url(bn_param(k, OSSL_PKEY_PARAM_EC_PUB_Y, 32)) + R"("})";
}

/// The symmetric JWK (RFC 7518 section 6.4) of `secret`, named `kid`.
inline std::string oct_jwk(const std::string &secret, const std::string &kid) {
  return R"({"kty":"oct","kid":")" + kid + R"(","k":")" + b64url(secret) + R"("})";
}

/// The public key of `k` as PEM text.
inline std::string public_pem(EVP_PKEY *k) {
  BIO *bio = BIO_new(BIO_s_mem());
  PEM_write_bio_PUBKEY(bio, k);
  char *data = nullptr;
  const long n = BIO_get_mem_data(bio, &data);
  std::string out(data, static_cast<std::size_t>(n));
  BIO_free(bio);
  return out;
}

/// A SHA-256 signature of `input` with `k` (RSA PKCS#1 v1.5, or ECDSA in DER).
inline std::string evp_sign(EVP_PKEY *k, std::string_view input) {
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX *)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  const auto *in = reinterpret_cast<const unsigned char *>(input.data());
  std::size_t n = 0;
  if (EVP_DigestSignInit(ctx.get(), nullptr, EVP_sha256(), nullptr, k) != 1 ||
      EVP_DigestSign(ctx.get(), nullptr, &n, in, input.size()) != 1)
    throw std::runtime_error("jwt_mint: cannot sign");
  std::string sig(n, '\0');
  if (EVP_DigestSign(ctx.get(), reinterpret_cast<unsigned char *>(sig.data()), &n, in, input.size()) != 1)
    throw std::runtime_error("jwt_mint: cannot sign");
  sig.resize(n);
  return sig;
}

/// A compact JWS (RFC 7515 section 7.1) of `header` and `payload` (JSON
/// texts): "RS256" / "ES256" (R || S, RFC 7518 section 3.4) signed with
/// `key`, "HS256" with `secret`, anything else ("none") unsigned.
inline std::string jws(const std::string &header, const std::string &payload, const std::string &alg, EVP_PKEY *key,
                       const std::string &secret = {}) {
  const std::string input = b64url(header) + "." + b64url(payload);
  std::string sig;
  if (alg == "RS256") {
    sig = evp_sign(key, input);
  } else if (alg == "ES256") {
    const std::string der = evp_sign(key, input);
    const auto *p = reinterpret_cast<const unsigned char *>(der.data());
    ECDSA_SIG *es = d2i_ECDSA_SIG(nullptr, &p, static_cast<long>(der.size()));
    if (es == nullptr) throw std::runtime_error("jwt_mint: ECDSA signature not DER");
    sig.assign(64, '\0');
    BN_bn2binpad(ECDSA_SIG_get0_r(es), reinterpret_cast<unsigned char *>(sig.data()), 32);
    BN_bn2binpad(ECDSA_SIG_get0_s(es), reinterpret_cast<unsigned char *>(sig.data()) + 32, 32);
    ECDSA_SIG_free(es);
  } else if (alg == "HS256") {
    unsigned char mac[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
         reinterpret_cast<const unsigned char *>(input.data()), input.size(), mac, &n);
    sig.assign(reinterpret_cast<const char *>(mac), n);
  }
  return input + "." + b64url(sig);
}

}  // namespace tnxtest::jwt

#endif

// jwt_bench: what a bearer JWT costs the server (issue 24 item 2): bearer
// JWT validations per second on one thread (JwtAuth::validate: signature,
// then claims) for RS256 (2048-bit), ES256 and HS256, and a forged token's
// refusal, keys made here with OpenSSL. Prints numbers; asserts nothing.
//   usage: jwt_bench [SECONDS_PER_CASE]   (default 1)
#include "bindings/jwt_auth.hpp"

#include <openssl/core_names.h>
#include <openssl/ecdsa.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rsa.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace {

using toolnexus::server_detail::JwtAuth;

std::string b64url(std::string_view bytes) {
  static const char *abc = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  std::string out;
  uint32_t acc = 0;
  int bits = 0;
  for (unsigned char c : bytes) {
    acc = (acc << 8) | c;
    bits += 8;
    while (bits >= 6) {
      bits -= 6;
      out.push_back(abc[(acc >> bits) & 63]);
    }
  }
  if (bits > 0) out.push_back(abc[(acc << (6 - bits)) & 63]);
  return out;
}

std::string bn(EVP_PKEY *k, const char *name, int pad = 0) {
  BIGNUM *b = nullptr;
  EVP_PKEY_get_bn_param(k, name, &b);
  std::string out(static_cast<std::size_t>(pad > 0 ? pad : BN_num_bytes(b)), '\0');
  BN_bn2binpad(b, reinterpret_cast<unsigned char *>(out.data()), static_cast<int>(out.size()));
  BN_free(b);
  return out;
}

std::string sign(EVP_PKEY *k, const std::string &input) {
  EVP_MD_CTX *ctx = EVP_MD_CTX_new();
  std::size_t n = 0;
  EVP_DigestSignInit(ctx, nullptr, EVP_sha256(), nullptr, k);
  EVP_DigestSign(ctx, nullptr, &n, reinterpret_cast<const unsigned char *>(input.data()), input.size());
  std::string sig(n, '\0');
  EVP_DigestSign(ctx, reinterpret_cast<unsigned char *>(sig.data()), &n,
                 reinterpret_cast<const unsigned char *>(input.data()), input.size());
  sig.resize(n);
  EVP_MD_CTX_free(ctx);
  return sig;
}

std::string token(const std::string &alg, const std::string &kid, EVP_PKEY *k, const std::string &secret) {
  const std::string claims = R"({"iss":"https://i.example","aud":"bench","sub":"alice","exp":)" +
                             std::to_string(std::time(nullptr) + 3600) + "}";
  const std::string input = b64url(R"({"alg":")" + alg + R"(","kid":")" + kid + R"("})") + "." + b64url(claims);
  std::string sig;
  if (alg == "RS256") {
    sig = sign(k, input);
  } else if (alg == "ES256") {
    const std::string der = sign(k, input);
    const auto *p = reinterpret_cast<const unsigned char *>(der.data());
    ECDSA_SIG *es = d2i_ECDSA_SIG(nullptr, &p, static_cast<long>(der.size()));
    sig.assign(64, '\0');
    BN_bn2binpad(ECDSA_SIG_get0_r(es), reinterpret_cast<unsigned char *>(sig.data()), 32);
    BN_bn2binpad(ECDSA_SIG_get0_s(es), reinterpret_cast<unsigned char *>(sig.data()) + 32, 32);
    ECDSA_SIG_free(es);
  } else {
    unsigned char mac[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
         reinterpret_cast<const unsigned char *>(input.data()), input.size(), mac, &n);
    sig.assign(reinterpret_cast<const char *>(mac), n);
  }
  return input + "." + b64url(sig);
}

void run(const JwtAuth &auth, const char *name, const std::string &tok, double seconds, bool expect_ok) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto until = start + std::chrono::duration<double>(seconds);
  long n = 0;
  bool ok = true;
  while (Clock::now() < until) {
    for (int i = 0; i < 64; ++i) ok = ok && (auth.validate(tok).identity.has_value() == expect_ok);
    n += 64;
  }
  const double s = std::chrono::duration<double>(Clock::now() - start).count();
  std::printf("%-28s %9.0f validations/s  %7.1f us each%s\n", name, static_cast<double>(n) / s, s * 1e6 / static_cast<double>(n),
              ok ? "" : "  (UNEXPECTED OUTCOME)");
}

}  // namespace

int main(int argc, char **argv) {
  const double seconds = argc > 1 ? std::atof(argv[1]) : 1.0;
  EVP_PKEY *rsa = EVP_RSA_gen(2048);
  EVP_PKEY *ec = EVP_EC_gen("P-256");
  const std::string secret = "a-shared-secret-of-at-least-32-bytes!!";
  const std::filesystem::path file = std::filesystem::temp_directory_path() / "jwt_bench_jwks.json";
  {
    std::ofstream f(file);
    f << R"({"keys":[{"kty":"RSA","kid":"r1","n":")" << b64url(bn(rsa, OSSL_PKEY_PARAM_RSA_N)) << R"(","e":")"
      << b64url(bn(rsa, OSSL_PKEY_PARAM_RSA_E)) << R"("},{"kty":"EC","crv":"P-256","kid":"e1","x":")"
      << b64url(bn(ec, OSSL_PKEY_PARAM_EC_PUB_X, 32)) << R"(","y":")" << b64url(bn(ec, OSSL_PKEY_PARAM_EC_PUB_Y, 32))
      << R"("},{"kty":"oct","kid":"h1","k":")" << b64url(secret) << R"("}]})";
  }
  toolnexus::JwtOptions o;
  o.issuer = "https://i.example";
  o.audience = {"bench"};
  o.jwks_file = file.string();
  o.algorithms = {"RS256", "ES256", "HS256"};
  toolnexus::server_detail::Logger log(toolnexus::LogLevel::error, nullptr);
  JwtAuth auth(o, log);
  std::filesystem::remove(file);
  const std::string rs = token("RS256", "r1", rsa, {});
  std::string forged = rs;
  forged[forged.size() - 5] = forged[forged.size() - 5] == 'A' ? 'B' : 'A';
  std::printf("jwt_bench: one thread, %.1f s per case\n", seconds);
  run(auth, "RS256 (2048-bit) valid", rs, seconds, true);
  run(auth, "ES256 (P-256) valid", token("ES256", "e1", ec, {}), seconds, true);
  run(auth, "HS256 valid", token("HS256", "h1", nullptr, secret), seconds, true);
  run(auth, "RS256 forged signature", forged, seconds, false);
  EVP_PKEY_free(rsa);
  EVP_PKEY_free(ec);
  return 0;
}

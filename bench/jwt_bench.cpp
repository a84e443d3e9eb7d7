// jwt_bench: what a bearer JWT costs the server (issue 24 item 2): bearer
// JWT validations per second on one thread (JwtAuth::validate: signature,
// then claims) for RS256 (2048-bit), ES256 and HS256, and a forged token's
// refusal, keys made here with OpenSSL. Prints numbers; asserts nothing.
//   usage: jwt_bench [SECONDS_PER_CASE]   (default 1)
#include "bindings/jwt_auth.hpp"
#include "jwt_mint.hpp"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace {

using toolnexus::server_detail::JwtAuth;
using namespace tnxtest::jwt;

std::string token(const std::string &alg, const std::string &kid, EVP_PKEY *k, const std::string &secret) {
  const std::string claims = R"({"iss":"https://i.example","aud":"bench","sub":"alice","exp":)" +
                             std::to_string(std::time(nullptr) + 3600) + "}";
  return jws(R"({"alg":")" + alg + R"(","kid":")" + kid + R"("})", claims, alg, k, secret);
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
  const Pkey rsa_owner = rsa_key(), ec_owner = ec_key();
  EVP_PKEY *rsa = rsa_owner.get(), *ec = ec_owner.get();
  const std::string secret = "a-shared-secret-of-at-least-32-bytes!!";
  const std::filesystem::path file = std::filesystem::temp_directory_path() / "jwt_bench_jwks.json";
  {
    std::ofstream f(file);
    f << R"({"keys":[)" << rsa_jwk(rsa, "r1") << "," << ec_jwk(ec, "e1") << "," << oct_jwk(secret, "h1") << "]}";
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
  return 0;
}

// JWK Sets to OpenSSL keys (OpenSSL 3 EVP_PKEY_fromdata: no hand-written
// bignum code), and their fetch over HTTP(S).
#include "bindings/jwks.hpp"

#include <Poco/Exception.h>
#include <Poco/Net/Context.h>
#include <Poco/Net/HTTPClientSession.h>
#include <Poco/Net/HTTPRequest.h>
#include <Poco/Net/HTTPResponse.h>
#include <Poco/Net/HTTPSClientSession.h>
#include <Poco/Net/SSLManager.h>
#include <Poco/URI.h>
#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/param_build.h>
#include <rapidjson/document.h>
#include <rapidjson/error/en.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <stdexcept>

namespace toolnexus::server_detail {

bool base64url_decode(std::string_view in, std::string &out) {
  out.clear();
  if (in.size() % 4 == 1) return false;
  out.reserve(in.size() * 3 / 4);
  uint32_t acc = 0;
  int bits = 0;
  for (const char c : in) {
    int v;
    if (c >= 'A' && c <= 'Z') v = c - 'A';
    else if (c >= 'a' && c <= 'z') v = c - 'a' + 26;
    else if (c >= '0' && c <= '9') v = c - '0' + 52;
    else if (c == '-') v = 62;
    else if (c == '_') v = 63;
    else return false;
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xff));
    }
  }
  return true;
}

namespace {

using PkeyPtr = std::shared_ptr<EVP_PKEY>;

struct ParamBld {
  OSSL_PARAM_BLD *b = OSSL_PARAM_BLD_new();
  ~ParamBld() { OSSL_PARAM_BLD_free(b); }
};

struct Bn {
  BIGNUM *n = nullptr;
  ~Bn() { BN_free(n); }
};

// An EVP_PKEY of type `type` ("RSA", "EC") from `params`; null on failure.
PkeyPtr from_params(const char *type, OSSL_PARAM_BLD *bld) {
  OSSL_PARAM *params = OSSL_PARAM_BLD_to_param(bld);
  if (params == nullptr) return nullptr;
  EVP_PKEY_CTX *ctx = EVP_PKEY_CTX_new_from_name(nullptr, type, nullptr);
  EVP_PKEY *key = nullptr;
  if (ctx != nullptr && EVP_PKEY_fromdata_init(ctx) == 1) EVP_PKEY_fromdata(ctx, &key, EVP_PKEY_PUBLIC_KEY, params);
  EVP_PKEY_CTX_free(ctx);
  OSSL_PARAM_free(params);
  if (key == nullptr) return nullptr;
  return PkeyPtr(key, EVP_PKEY_free);
}

class KeyReader {
 public:
  KeyReader(const rapidjson::Value &k, std::string where) : k_(k), where_(std::move(where)) {}

  // The base64url member `name` decoded; throws when absent or bad.
  std::string bytes(const char *name) const {
    auto it = k_.FindMember(name);
    if (it == k_.MemberEnd() || !it->value.IsString() || it->value.GetStringLength() == 0)
      throw std::invalid_argument(where_ + " has no \"" + name + "\" (a base64url string)");
    std::string out;
    if (!base64url_decode(std::string_view(it->value.GetString(), it->value.GetStringLength()), out))
      throw std::invalid_argument(where_ + ": \"" + name + "\" is not base64url");
    return out;
  }

  PkeyPtr rsa() const {
    const std::string n = bytes("n"), e = bytes("e");
    Bn bn_n, bn_e;
    bn_n.n = BN_bin2bn(reinterpret_cast<const unsigned char *>(n.data()), static_cast<int>(n.size()), nullptr);
    bn_e.n = BN_bin2bn(reinterpret_cast<const unsigned char *>(e.data()), static_cast<int>(e.size()), nullptr);
    if (bn_n.n == nullptr || bn_e.n == nullptr) throw std::invalid_argument(where_ + ": bad RSA numbers");
    if (BN_num_bits(bn_n.n) < 2048)
      throw std::invalid_argument(where_ + ": the RSA modulus has " + std::to_string(BN_num_bits(bn_n.n)) +
                                  " bits; at least 2048 are needed (RFC 7518 section 3.3)");
    ParamBld bld;
    if (bld.b == nullptr || OSSL_PARAM_BLD_push_BN(bld.b, OSSL_PKEY_PARAM_RSA_N, bn_n.n) != 1 ||
        OSSL_PARAM_BLD_push_BN(bld.b, OSSL_PKEY_PARAM_RSA_E, bn_e.n) != 1)
      throw std::runtime_error("out of memory building an RSA key");
    PkeyPtr key = from_params("RSA", bld.b);
    if (!key) throw std::invalid_argument(where_ + ": OpenSSL refused the RSA key");
    return key;
  }

  PkeyPtr ec_p256() const {
    const std::string x = bytes("x"), y = bytes("y");
    if (x.size() != 32 || y.size() != 32)
      throw std::invalid_argument(where_ + ": a P-256 key's \"x\" and \"y\" are 32 bytes each");
    std::string point = "\x04" + x + y;  // SEC 1 uncompressed point
    ParamBld bld;
    char group[] = "prime256v1";
    if (bld.b == nullptr ||
        OSSL_PARAM_BLD_push_utf8_string(bld.b, OSSL_PKEY_PARAM_GROUP_NAME, group, 0) != 1 ||
        OSSL_PARAM_BLD_push_octet_string(bld.b, OSSL_PKEY_PARAM_PUB_KEY, point.data(), point.size()) != 1)
      throw std::runtime_error("out of memory building an EC key");
    PkeyPtr key = from_params("EC", bld.b);
    if (!key) throw std::invalid_argument(where_ + ": the point (x, y) is not on P-256");
    // fromdata does not always check the point; a public-key check does.
    EVP_PKEY_CTX *ctx = EVP_PKEY_CTX_new_from_pkey(nullptr, key.get(), nullptr);
    const bool ok = ctx != nullptr && EVP_PKEY_public_check(ctx) == 1;
    EVP_PKEY_CTX_free(ctx);
    if (!ok) throw std::invalid_argument(where_ + ": the point (x, y) is not on P-256");
    return key;
  }

 private:
  const rapidjson::Value &k_;
  std::string where_;
};

std::string member_string(const rapidjson::Value &k, const char *name) {
  auto it = k.FindMember(name);
  if (it == k.MemberEnd() || !it->value.IsString()) return {};
  return std::string(it->value.GetString(), it->value.GetStringLength());
}

}  // namespace

std::vector<Jwk> parse_jwks(std::string_view json, const std::vector<std::string> &allowed, bool allow_symmetric,
                            bool skip_malformed, const std::string &where, std::vector<std::string> *skipped) {
  rapidjson::Document doc;
  doc.Parse<rapidjson::kParseValidateEncodingFlag | rapidjson::kParseIterativeFlag>(json.data(), json.size());
  if (doc.HasParseError())
    throw std::invalid_argument(where + " is not valid JSON: " + rapidjson::GetParseError_En(doc.GetParseError()) +
                                " at byte " + std::to_string(doc.GetErrorOffset()));
  if (!doc.IsObject() || !doc.HasMember("keys") || !doc["keys"].IsArray())
    throw std::invalid_argument(where + " is not a JWK Set: expected {\"keys\": [...]} (RFC 7517 section 5)");
  std::vector<Jwk> out;
  std::size_t i = 0;
  for (const auto &k : doc["keys"].GetArray()) {
    const std::string kid = k.IsObject() ? member_string(k, "kid") : std::string();
    const std::string name = where + " keys[" + std::to_string(i++) + "]" + (kid.empty() ? "" : " (kid " + kid + ")");
    const auto skip = [&](const std::string &why) {
      if (skipped != nullptr) skipped->push_back(name + " is not used: " + why);
    };
    // A malformed key (not an object, a member missing or bad, an RSA key
    // under 2048 bits, an EC point off the curve): in a file the operator
    // wrote, an error at start; in a set fetched from an issuer, that key
    // is left out and the others are used (one bad key must not stall a
    // rotation or keep a removed key trusted).
    const auto malformed = [&](const std::string &why) {
      if (!skip_malformed) throw std::invalid_argument(why);
      if (skipped != nullptr) skipped->push_back(why + " (left out; the other keys are used)");
    };
    if (!k.IsObject()) {
      malformed(name + " is not an object");
      continue;
    }
    const std::string kty = member_string(k, "kty"), use = member_string(k, "use"), alg0 = member_string(k, "alg");
    if (!use.empty() && use != "sig") {
      skip("its use is \"" + use + "\", not \"sig\"");
      continue;
    }
    Jwk key;
    key.kid = kid;
    KeyReader r(k, name);
    if (kty == "RSA") {
      key.alg = alg0.empty() ? "RS256" : alg0;
      if (key.alg != "RS256") {
        skip("alg " + key.alg + " is not supported for RSA keys (RS256 is)");
        continue;
      }
    } else if (kty == "EC") {
      const std::string crv = member_string(k, "crv");
      key.alg = alg0.empty() ? "ES256" : alg0;
      if (crv != "P-256" || key.alg != "ES256") {
        skip("only EC keys on P-256 with ES256 are supported (crv " + crv + ", alg " + key.alg + ")");
        continue;
      }
    } else if (kty == "oct") {
      key.alg = alg0.empty() ? "HS256" : alg0;
      if (key.alg != "HS256") {
        skip("alg " + key.alg + " is not supported for symmetric keys (HS256 is)");
        continue;
      }
      if (!allow_symmetric) {
        skip("symmetric keys are taken from jwks_file only, never from a URL");
        continue;
      }
    } else {
      skip("kty \"" + kty + "\" is not supported (RSA, EC and oct are)");
      continue;
    }
    if (std::find(allowed.begin(), allowed.end(), key.alg) == allowed.end()) {
      skip("its algorithm " + key.alg + " is not in algorithms");
      continue;
    }
    try {
      if (key.alg == "RS256") key.pkey = r.rsa();
      else if (key.alg == "ES256") key.pkey = r.ec_p256();
      else {
        key.secret = r.bytes("k");
        if (key.secret.size() < 32)
          throw std::invalid_argument(name + ": an HS256 secret needs at least 32 bytes (RFC 7518 section 3.2)");
      }
    } catch (const std::invalid_argument &e) {
      malformed(e.what());
      continue;
    }
    out.push_back(std::move(key));
  }
  return out;
}

std::string fetch_url(const std::string &url, int timeout_ms, std::size_t max_bytes) {
  try {
    const Poco::URI uri(url);
    const Poco::Timespan timeout(static_cast<Poco::Timespan::TimeDiff>(timeout_ms) * 1000);
    std::unique_ptr<Poco::Net::HTTPClientSession> session;
    if (uri.getScheme() == "https") {
      static std::once_flag ssl_once;
      std::call_once(ssl_once, [] { Poco::Net::initializeSSL(); });
      static const Poco::Net::Context::Ptr tls = [] {
        Poco::Net::Context::Ptr c = new Poco::Net::Context(Poco::Net::Context::TLS_CLIENT_USE, "", "", "",
                                                           Poco::Net::Context::VERIFY_RELAXED, 9, true);
        c->requireMinimumProtocol(Poco::Net::Context::PROTO_TLSV1_2);
        return c;
      }();
      session = std::make_unique<Poco::Net::HTTPSClientSession>(uri.getHost(), uri.getPort(), tls);
    } else {
      session = std::make_unique<Poco::Net::HTTPClientSession>(uri.getHost(), uri.getPort());
    }
    session->setTimeout(timeout, timeout, timeout);
    // The whole fetch, not only each read, within timeout_ms: a server
    // that sends a byte now and then is cut off.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
    const auto past_deadline = [&] {
      if (std::chrono::steady_clock::now() > deadline)
        throw std::runtime_error("the JWKS URL " + url + " did not answer in full within " +
                                 std::to_string(timeout_ms) + " ms");
    };
    Poco::Net::HTTPRequest req(Poco::Net::HTTPRequest::HTTP_GET, uri.getPathAndQuery(),
                               Poco::Net::HTTPMessage::HTTP_1_1);
    req.set("Accept", "application/jwk-set+json, application/json");
    session->sendRequest(req);
    Poco::Net::HTTPResponse res;
    std::istream &in = session->receiveResponse(res);
    past_deadline();
    if (res.getStatus() != Poco::Net::HTTPResponse::HTTP_OK)
      throw std::runtime_error("the JWKS URL " + url + " answered HTTP " + std::to_string(res.getStatus()));
    std::string body;
    char buf[8192];
    for (;;) {
      // readsome() would not wait; one byte, then what is buffered, keeps
      // each wait within the session's receive timeout and the loop
      // checking the deadline.
      const int c = in.get();
      if (c == std::char_traits<char>::eof()) break;
      body.push_back(static_cast<char>(c));
      const std::streamsize more = in.readsome(buf, sizeof buf);
      if (more > 0) body.append(buf, static_cast<std::size_t>(more));
      past_deadline();
      if (body.size() > max_bytes)
        throw std::runtime_error("the JWKS at " + url + " is larger than " + std::to_string(max_bytes) + " bytes");
    }
    return body;
  } catch (const Poco::Exception &e) {
    throw std::runtime_error("cannot fetch the JWKS URL " + url + ": " + e.displayText());
  }
}

}  // namespace toolnexus::server_detail

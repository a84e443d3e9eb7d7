// Bearer JWTs (issue 24 item 2), over real HTTP: keys made here with
// OpenSSL, tokens signed here (and one by Poco's JWT signer, an independent
// implementation); valid RS256/ES256/HS256 tokens pass, and nothing else
// does: expired, wrong audience, wrong issuer, unknown kid, alg none, an
// HS256 token keyed with the RSA public key, a forged signature. Each
// principal sees only its own Tasks in v0.3 JSON-RPC, v1.0 JSON-RPC and
// v1.0 HTTP+JSON. A JWKS URL (a Poco HTTP server in this process) is
// fetched again for an unknown kid, and no oftener than allowed.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include "jwt_mint.hpp"
#include "server_test_support.hpp"

#include <Poco/Crypto/EVPPKey.h>
#include <Poco/Crypto/RSAKey.h>
#include <Poco/JWT/Signer.h>
#include <Poco/JWT/Token.h>
#include <Poco/Net/HTTPRequestHandler.h>
#include <Poco/Net/HTTPRequestHandlerFactory.h>
#include <Poco/Net/HTTPServer.h>
#include <Poco/Net/HTTPServerRequest.h>
#include <Poco/Net/HTTPServerResponse.h>
#include <Poco/Net/ServerSocket.h>
#include <openssl/rsa.h>

#include <atomic>
#include <fstream>
#include <mutex>
#include <thread>

using namespace tnxtest;
using namespace tnxtest::jwt;

namespace {

const std::string kIssuer = "https://login.example.test/realms/agents";
const std::string kAudience = "toolnexus-api";

int64_t now_s() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

struct Claims {
  std::string sub = "alice";
  std::string iss = kIssuer;
  std::string aud = q(kAudience);  // JSON: a string or an array
  int64_t exp = now_s() + 600;
  std::string extra;  // more members: ,"tenant":"t1"
  std::string json() const {
    return R"({"iss":)" + q(iss) + R"(,"sub":)" + q(sub) + R"(,"aud":)" + aud + R"(,"exp":)" + std::to_string(exp) +
           R"(,"iat":)" + std::to_string(now_s()) + extra + "}";
  }
};

std::string header(const std::string &alg, const std::string &kid) {
  return R"({"alg":)" + q(alg) + R"(,"typ":"JWT")" + (kid.empty() ? "" : R"(,"kid":)" + q(kid)) + "}";
}

struct Keys {
  Pkey rsa = rsa_key();
  Pkey ec = ec_key();
  std::string hmac = "a-shared-secret-of-at-least-32-bytes!!";
  std::string jwks() const {
    return R"({"keys":[)" + rsa_jwk(rsa.get(), "r1") + "," + ec_jwk(ec.get(), "e1") +
           R"(,{"kty":"oct","kid":"h1","k":")" + b64url(hmac) + R"("}]})";
  }
  std::string rs(const Claims &c, const std::string &kid = "r1") const {
    return jws(header("RS256", kid), c.json(), "RS256", rsa.get());
  }
  std::string es(const Claims &c) const { return jws(header("ES256", "e1"), c.json(), "ES256", ec.get()); }
  std::string hs(const Claims &c) const { return jws(header("HS256", "h1"), c.json(), "HS256", nullptr, hmac); }
};

// Made once per process: doctest runs a test case's body again for each
// subcase, and RSA key generation is the slow part.
const Keys &shared_keys() {
  static const Keys keys;
  return keys;
}

std::string bearer(const std::string &token) { return "Authorization: Bearer " + token + "\r\n"; }

// POST / with a v1.0 ListTasks: the status and WWW-Authenticate.
HttpResponse list_as(const toolnexus::ServerHandle &s, const std::string &token) {
  Connection c(port_of(s.url()));
  return c.post(R"({"jsonrpc":"2.0","id":1,"method":"ListTasks","params":{}})",
                "A2A-Version: 1.0\r\n" + (token.empty() ? std::string() : bearer(token)));
}

// A JWKS served over HTTP by this process; counts its GETs.
class JwksServer {
 public:
  JwksServer() : socket_(Poco::Net::SocketAddress("127.0.0.1", 0)) {
    auto *params = new Poco::Net::HTTPServerParams;
    params->setMaxThreads(2);
    server_ = std::make_unique<Poco::Net::HTTPServer>(new Factory(*this), socket_, params);
    server_->start();
  }
  ~JwksServer() { server_->stopAll(true); }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(socket_.address().port()) + "/jwks.json"; }
  void set(std::string body) {
    std::lock_guard<std::mutex> lock(mu_);
    body_ = std::move(body);
  }
  int gets() {
    std::lock_guard<std::mutex> lock(mu_);
    return gets_;
  }
  /// Answer 503 (the issuer is down) until told otherwise.
  void fail(bool down) {
    std::lock_guard<std::mutex> lock(mu_);
    down_ = down;
  }
  /// Send the body a byte every 100 ms (a slow-drip server) until told
  /// otherwise.
  void drip(bool on) { drip_ = on; }

 private:
  struct Handler : Poco::Net::HTTPRequestHandler {
    explicit Handler(JwksServer &s) : s_(s) {}
    void handleRequest(Poco::Net::HTTPServerRequest &, Poco::Net::HTTPServerResponse &res) override {
      std::string body;
      bool down = false;
      {
        std::lock_guard<std::mutex> lock(s_.mu_);
        ++s_.gets_;
        body = s_.body_;
        down = s_.down_;
      }
      if (down) {
        res.setStatusAndReason(Poco::Net::HTTPResponse::HTTP_SERVICE_UNAVAILABLE);
        res.send() << "down";
        return;
      }
      res.setContentType("application/json");
      if (s_.drip_) {
        res.setContentLength(static_cast<std::streamsize>(body.size()));
        std::ostream &out = res.send();
        for (std::size_t i = 0; i < body.size() && out; ++i) {
          out.put(body[i]).flush();
          if (s_.drip_) std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
        return;
      }
      res.sendBuffer(body.data(), body.size());
    }
    JwksServer &s_;
  };
  struct Factory : Poco::Net::HTTPRequestHandlerFactory {
    explicit Factory(JwksServer &s) : s_(s) {}
    Poco::Net::HTTPRequestHandler *createRequestHandler(const Poco::Net::HTTPServerRequest &) override {
      return new Handler(s_);
    }
    JwksServer &s_;
  };
  Poco::Net::ServerSocket socket_;
  std::unique_ptr<Poco::Net::HTTPServer> server_;
  std::mutex mu_;
  std::string body_ = R"({"keys":[]})";
  int gets_ = 0;
  bool down_ = false;
  std::atomic<bool> drip_{false};
};

toolnexus::JwtOptions jwt_options() {
  toolnexus::JwtOptions j;
  j.issuer = kIssuer;
  j.audience = {kAudience};
  j.algorithms = {"RS256", "ES256", "HS256"};
  j.tenant_claim = "tenant";
  return j;
}

}  // namespace

TEST_CASE("only valid JWTs pass; the reason is told in RFC 6750 terms") {
  TempDir dir;
  const Keys &keys = shared_keys();
  {
    std::ofstream f(dir.path / "jwks.json");
    f << keys.jwks();
  }
  {
    std::ofstream f(dir.path / "tokens.json");
    f << R"({"static-token-of-carol-0123456789": "carol"})";
  }
  auto o = test_options();
  o.jwt = jwt_options();
  o.jwt.jwks_file = (dir.path / "jwks.json").string();
  o.auth_tokens = toolnexus::load_auth_tokens(dir.path / "tokens.json");
  toolnexus::ServerHandle server = toolnexus::serve(o);

  Claims good;
  CHECK(list_as(server, keys.rs(good)).status == 200);
  CHECK(list_as(server, keys.es(good)).status == 200);
  CHECK(list_as(server, keys.hs(good)).status == 200);
  // The token file still works beside JWTs.
  CHECK(list_as(server, "static-token-of-carol-0123456789").status == 200);
  // An RS256 token made by Poco's JWT signer (another implementation).
  {
    Poco::JWT::Token t;
    t.setType("JWT");
    t.header().set("kid", std::string("r1"));
    t.setIssuer(kIssuer);
    t.setAudience(kAudience);
    t.setSubject("alice");
    t.setExpiration(Poco::Timestamp() + Poco::Timespan(600, 0));
    EVP_PKEY *raw = keys.rsa.get();
    Poco::JWT::Signer signer(Poco::SharedPtr<Poco::Crypto::RSAKey>(
        new Poco::Crypto::RSAKey(Poco::Crypto::EVPPKey(raw))));
    CHECK(list_as(server, signer.sign(t, Poco::JWT::Signer::ALGO_RS256)).status == 200);
  }

  const auto refused = [&](const std::string &token, const std::string &why) {
    const HttpResponse r = list_as(server, token);
    CHECK(r.status == 401);
    CHECK(r.header("www-authenticate") ==
          "Bearer realm=\"toolnexus\", error=\"invalid_token\", error_description=\"" + why + "\"");
  };
  const std::string unverifiable = "the token signature cannot be verified";
  const std::string not_accepted = "the token is not accepted by this server";

  SUBCASE("no credentials: the plain challenge, no error code") {
    const HttpResponse r = list_as(server, "");
    CHECK(r.status == 401);
    CHECK(r.header("www-authenticate") == "Bearer realm=\"toolnexus\"");
  }
  SUBCASE("expired, also past the clock skew") {
    Claims c;
    c.exp = now_s() - 120;
    refused(keys.rs(c), "the token is expired");
    c.exp = now_s() - 30;  // within the 60 s skew: still valid
    CHECK(list_as(server, keys.rs(c)).status == 200);
  }
  SUBCASE("not yet valid") {
    Claims c;
    c.extra = R"(,"nbf":)" + std::to_string(now_s() + 3600);
    refused(keys.es(c), "the token is not valid yet");
  }
  SUBCASE("wrong audience and wrong issuer say the same") {
    Claims c;
    c.aud = R"(["someone-else"])";
    refused(keys.rs(c), not_accepted);
    c.aud = R"(["someone-else",)" + q(kAudience) + "]";
    CHECK(list_as(server, keys.rs(c)).status == 200);
    Claims d;
    d.iss = "https://evil.example.test/";
    refused(keys.rs(d), not_accepted);
    Claims e;
    e.sub = "";
    refused(keys.rs(e), not_accepted);
  }
  SUBCASE("unknown kid, alg none, HS256 keyed with the RSA public key, a forged signature") {
    refused(keys.rs(good, "no-such-kid"), unverifiable);
    // alg none: with and without a signature part.
    const std::string none = jws(header("none", "r1"), good.json(), "none", nullptr);
    refused(none, unverifiable);
    refused(none + "AAAA", unverifiable);
    // The RSA public key (PEM, as an attacker may fetch it) as the HMAC
    // secret, naming the RSA key's kid, and naming none.
    const std::string pem = public_pem(keys.rsa.get());
    refused(jws(header("HS256", "r1"), good.json(), "HS256", nullptr, pem), unverifiable);
    refused(jws(header("HS256", ""), good.json(), "HS256", nullptr, pem), unverifiable);
    // Claims changed after signing.
    const std::string t = keys.rs(good);
    Claims bob;
    bob.sub = "bob";
    const std::string forged = t.substr(0, t.find('.')) + "." + b64url(bob.json()) + t.substr(t.rfind('.'));
    refused(forged, unverifiable);
    refused("not-a-jwt.at.all", "the token is not a well-formed JWT");
    refused("unknown-static-token", "the token is not valid");  // a token file is in use: not told as a JWT's
  }
  SUBCASE("a name given twice, a kid or a date of the wrong type, no exp, crit: not a well-formed JWT") {
    const std::string malformed = "the token is not a well-formed JWT";
    // Signed: only the shape is wrong. First-wins would read alg HS256 or
    // sub alice where another validator reads none or bob.
    refused(jws(R"({"alg":"HS256","alg":"none","kid":"h1"})", good.json(), "HS256", nullptr, keys.hmac), malformed);
    Claims twice;
    twice.extra = R"(,"sub":"bob")";
    refused(keys.hs(twice), malformed);
    refused(jws(R"({"alg":"HS256","kid":5})", good.json(), "HS256", nullptr, keys.hmac), malformed);
    Claims nbf;
    nbf.extra = R"(,"nbf":"x")";
    refused(keys.hs(nbf), malformed);
    nbf.extra = R"(,"nbf":null)";
    refused(keys.hs(nbf), malformed);
    // No exp: this server requires one (docs/configuration.md, item 3); a
    // crit header names an extension nobody here understands (RFC 7515
    // section 4.1.11). Both are shape faults, not expiry or a bad signature.
    const std::string no_exp =
        R"({"iss":)" + q(kIssuer) + R"(,"sub":"alice","aud":)" + q(kAudience) + "}";
    refused(jws(header("HS256", "h1"), no_exp, "HS256", nullptr, keys.hmac), malformed);
    refused(jws(R"({"alg":"HS256","kid":"h1","crit":["exp"]})", good.json(), "HS256", nullptr, keys.hmac), malformed);
    Claims tenant;  // a tenant claim present binds only as a string; null is not "no tenant"
    tenant.extra = R"(,"tenant":null)";
    refused(keys.hs(tenant), not_accepted);
  }
  SUBCASE("the card declares bearer JWTs in both versions' shapes") {
    Connection c(port_of(server.url()));
    auto card = parse(c.get("/.well-known/agent-card.json").body);
    CHECK(std::string(card["securitySchemes"]["bearer"]["type"].GetString()) == "http");
    CHECK(std::string(card["securitySchemes"]["bearer"]["bearerFormat"].GetString()) == "JWT");
    CHECK(std::string(card["securitySchemes"]["bearer"]["httpAuthSecurityScheme"]["bearerFormat"].GetString()) ==
          "JWT");
    CHECK(card["security"][0].HasMember("bearer"));
    CHECK(card["securityRequirements"][0]["schemes"].HasMember("bearer"));
    // No discovery URL configured: no openIdConnect scheme.
    CHECK_FALSE(card["securitySchemes"].HasMember("oidc"));
    CHECK(card["security"].Size() == 1);
    CHECK(card["securityRequirements"].Size() == 1);
  }
  SUBCASE("openid_configuration_url: the card names the issuer's discovery document as an alternative") {
    const std::string discovery = std::string(kIssuer) + "/.well-known/openid-configuration";
    auto o2 = o;
    o2.jwt.openid_configuration_url = discovery;
    toolnexus::ServerHandle with_oidc = toolnexus::serve(o2);
    Connection c(port_of(with_oidc.url()));
    auto card = parse(c.get("/.well-known/agent-card.json").body);
    const auto &oidc = card["securitySchemes"]["oidc"];
    CHECK(std::string(oidc["type"].GetString()) == "openIdConnect");  // v0.3
    CHECK(std::string(oidc["openIdConnectUrl"].GetString()) == discovery);
    CHECK(std::string(oidc["openIdConnectSecurityScheme"]["openIdConnectUrl"].GetString()) == discovery);  // v1.0
    CHECK(card["securitySchemes"].HasMember("bearer"));
    // Alternatives: [{"bearer": []}, {"oidc": []}], either one satisfies.
    REQUIRE(card["security"].Size() == 2);
    CHECK(card["security"][0].HasMember("bearer"));
    CHECK(card["security"][1].HasMember("oidc"));
    CHECK(card["security"][1]["oidc"].Size() == 0);
    REQUIRE(card["securityRequirements"].Size() == 2);
    CHECK(card["securityRequirements"][1]["schemes"]["oidc"]["list"].Size() == 0);
    // Informational only: the same tokens pass and fail as before.
    CHECK(list_as(with_oidc, keys.rs(good)).status == 200);
    CHECK(list_as(with_oidc, "").status == 401);
  }
}

TEST_CASE("each JWT principal sees only its own Tasks, in every dialect") {
  TempDir dir;
  const Keys &keys = shared_keys();
  {
    std::ofstream f(dir.path / "jwks.json");
    f << keys.jwks();
  }
  auto o = test_options();
  o.agent = "approval";
  o.jwt = jwt_options();
  o.jwt.jwks_file = (dir.path / "jwks.json").string();
  toolnexus::ServerHandle server = toolnexus::serve(o);
  Claims a, b;
  b.sub = "bob";
  const std::string alice = bearer(keys.rs(a)), bobs = bearer(keys.es(b));
  const int port = port_of(server.url());

  // One Task of Alice's per dialect.
  const auto msg = [](const std::string &role) {
    return R"({"role":)" + q(role) + R"(,"messageId":)" + q(unique_message_id()) +
           R"(,"parts":[{"kind":"text","text":"hi"}]})";
  };
  Connection c(port);
  auto r03 = parse(c.post(R"({"jsonrpc":"2.0","id":1,"method":"message/send","params":{"message":)" + msg("user") +
                              R"(,"configuration":{"blocking":false}}})",
                          alice)
                       .body);
  const std::string t03 = r03["result"]["id"].GetString();
  auto r10 = parse(c.post(R"({"jsonrpc":"2.0","id":1,"method":"SendMessage","params":{"message":)" +
                              msg("ROLE_USER") + R"(,"configuration":{"returnImmediately":true}}})",
                          "A2A-Version: 1.0\r\n" + alice)
                       .body);
  const std::string t10 = r10["result"]["task"]["id"].GetString();
  auto rrest = c.post(R"({"message":)" + msg("ROLE_USER") + R"(,"configuration":{"returnImmediately":true}})",
                      "A2A-Version: 1.0\r\n" + alice, "/message:send");
  REQUIRE(rrest.status == 200);
  const std::string trest = parse(rrest.body)["task"]["id"].GetString();
  CHECK(server.store()->get(t03)->owner == "alice");
  CHECK(server.store()->get(t10)->owner == "alice");
  CHECK(server.store()->get(trest)->owner == "alice");

  for (const std::string &id : {t03, t10, trest}) {
    // v0.3 JSON-RPC
    auto mine = parse(c.post(R"({"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{"id":)" + q(id) + "}}", alice).body);
    CHECK(mine.HasMember("result"));
    auto theirs = parse(c.post(R"({"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{"id":)" + q(id) + "}}", bobs).body);
    CHECK(error_code(theirs) == -32001);
    // v1.0 JSON-RPC
    mine = parse(c.post(R"({"jsonrpc":"2.0","id":1,"method":"GetTask","params":{"id":)" + q(id) + "}}",
                        "A2A-Version: 1.0\r\n" + alice).body);
    CHECK(mine.HasMember("result"));
    theirs = parse(c.post(R"({"jsonrpc":"2.0","id":1,"method":"GetTask","params":{"id":)" + q(id) + "}}",
                          "A2A-Version: 1.0\r\n" + bobs).body);
    CHECK(error_code(theirs) == -32001);
    // v1.0 HTTP+JSON
    CHECK(c.get("/tasks/" + id, "A2A-Version: 1.0\r\n" + alice).status == 200);
    CHECK(c.get("/tasks/" + id, "A2A-Version: 1.0\r\n" + bobs).status == 404);
  }
  auto bob_list = parse(c.get("/tasks", "A2A-Version: 1.0\r\n" + bobs).body);
  CHECK(bob_list["tasks"].Size() == 0);
  auto alice_list = parse(c.get("/tasks", "A2A-Version: 1.0\r\n" + alice).body);
  CHECK(alice_list["tasks"].Size() == 3);

  SUBCASE("a tenant claim binds its caller to that tenant") {
    Claims t;
    t.sub = "alice";
    t.extra = R"(,"tenant":"t1")";
    const std::string in_t1 = bearer(keys.rs(t));
    auto made = c.post(R"({"message":)" + msg("ROLE_USER") + R"(,"configuration":{"returnImmediately":true}})",
                       "A2A-Version: 1.0\r\n" + in_t1, "/message:send");
    REQUIRE(made.status == 200);
    const std::string id = parse(made.body)["task"]["id"].GetString();
    CHECK(server.store()->get(id)->tenant == "t1");
    CHECK(c.get("/t1/tasks/" + id, "A2A-Version: 1.0\r\n" + in_t1).status == 200);
    CHECK(c.get("/t2/tasks/" + id, "A2A-Version: 1.0\r\n" + in_t1).status == 400);
    // The same principal without the claim is another tenant's caller.
    CHECK(c.get("/tasks/" + id, "A2A-Version: 1.0\r\n" + alice).status == 404);
    auto rpc = parse(c.post(R"({"jsonrpc":"2.0","id":1,"method":"GetTask","params":{"id":)" + q(id) +
                                R"(,"tenant":"t2"}})",
                            "A2A-Version: 1.0\r\n" + in_t1).body);
    CHECK(error_code(rpc) == -32602);
    rpc = parse(c.post(R"({"jsonrpc":"2.0","id":1,"method":"tasks/get","params":{"id":)" + q(id) + "}}", in_t1).body);
    CHECK(rpc.HasMember("result"));
  }
}

// Server options whose auth.jwt takes its keys from the JWKS URL of `jwks`,
// fetched again for an unknown kid at most once per `refresh_s` seconds.
static toolnexus::ServerOptions url_options(JwksServer &jwks, int refresh_s) {
  auto o = test_options();
  o.jwt = jwt_options();
  o.jwt.jwks_url = jwks.url();
  o.jwt.jwks_refresh_min_s = refresh_s;
  return o;
}

TEST_CASE("a JWKS URL is fetched again for an unknown kid, at most once per interval") {
  const Keys &keys = shared_keys();
  static const Pkey rotated = rsa_key();
  JwksServer jwks;
  jwks.set(R"({"keys":[)" + rsa_jwk(keys.rsa.get(), "r1") + "]}");

  toolnexus::ServerHandle server = toolnexus::serve(url_options(jwks, 1));
  CHECK(jwks.gets() == 1);  // at start
  Claims good;
  CHECK(list_as(server, keys.rs(good)).status == 200);
  CHECK(jwks.gets() == 1);  // a known kid fetches nothing

  // The issuer rotates its key; a token with the new kid makes the server
  // fetch the set again (once the interval since the last fetch passed).
  jwks.set(R"({"keys":[)" + rsa_jwk(keys.rsa.get(), "r1") + "," + rsa_jwk(rotated.get(), "r2") + "]}");
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  const std::string new_kid = jws(header("RS256", "r2"), good.json(), "RS256", rotated.get());
  CHECK(list_as(server, new_kid).status == 200);
  CHECK(jwks.gets() == 2);

  SUBCASE("tokens with random kids cause no fetch storm") {
    toolnexus::ServerHandle strict = toolnexus::serve(url_options(jwks, 3600));
    const int before = jwks.gets();  // its start fetch included
    for (int i = 0; i < 20; ++i) {
      const HttpResponse r = list_as(strict, keys.rs(good, "random-" + std::to_string(i)));
      CHECK(r.status == 401);
    }
    CHECK(jwks.gets() == before);
    CHECK(list_as(strict, new_kid).status == 200);  // the start fetch had r2
  }
  SUBCASE("an issuer down at start: the server starts, refuses tokens, and takes the keys once it is up") {
    jwks.fail(true);
    toolnexus::ServerHandle late = toolnexus::serve(url_options(jwks, 1));
    const HttpResponse r = list_as(late, keys.rs(good));
    CHECK(r.status == 401);
    CHECK(r.header("www-authenticate").find("the token signature cannot be verified") != std::string::npos);
    jwks.fail(false);
    std::this_thread::sleep_for(std::chrono::milliseconds(1100));
    CHECK(list_as(late, keys.rs(good)).status == 200);
  }
  SUBCASE("a malformed key in the fetched set is left out; the others are used, a removed one is not") {
    // r1 is removed, r2 published beside a 1024-bit RSA key (malformed
    // here: under 2048 bits): r2 works and r1 no longer does.
    const Pkey weak = Pkey(EVP_RSA_gen(1024), EVP_PKEY_free);
    jwks.set(R"({"keys":[)" + rsa_jwk(weak.get(), "weak") + "," + rsa_jwk(rotated.get(), "r2") + "]}");
    std::this_thread::sleep_for(std::chrono::milliseconds(1100));
    const std::string another = jws(header("RS256", "r3"), good.json(), "RS256", rotated.get());
    CHECK(list_as(server, another).status == 401);  // unknown kid: makes the server fetch the set again
    CHECK(list_as(server, new_kid).status == 200);
    CHECK(list_as(server, keys.rs(good)).status == 401);
  }
  SUBCASE("a JWKS URL that answers a byte at a time is cut off at jwks_timeout_ms in all") {
    jwks.drip(true);
    auto o2 = url_options(jwks, 60);  // the default interval
    o2.jwt.jwks_timeout_ms = 1000;
    const auto t0 = std::chrono::steady_clock::now();
    toolnexus::ServerHandle slow = toolnexus::serve(o2);  // its start fetch
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CHECK_MESSAGE(s < 4.0, "the start waited " << s << " s for a dripping JWKS URL");
    CHECK(list_as(slow, keys.rs(good)).status == 401);  // no keys: nothing verifies
    jwks.drip(false);
  }
  SUBCASE("HS256 keys are never taken from a URL") {
    jwks.set(R"({"keys":[{"kty":"oct","kid":"h1","k":")" + b64url(keys.hmac) + R"("}]})");
    std::this_thread::sleep_for(std::chrono::milliseconds(1100));
    const HttpResponse r = list_as(server, keys.hs(good));
    CHECK(r.status == 401);
  }
}

TEST_CASE("bad auth.jwt options are refused with the field named") {
  auto parse_opts = [](const std::string &json) {
    rapidjson::Document d;
    d.Parse(json.data(), json.size());
    return toolnexus::parse_jwt_options(d, "cfg.json: auth.jwt");
  };
  const std::string base = R"("issuer":"https://i","audience":"a","jwks_url":"https://i/jwks")";
  CHECK(parse_opts("{" + base + "}").audience == std::vector<std::string>{"a"});
  const auto fails_with = [&](const std::string &json, const std::string &what) {
    try {
      parse_opts(json);
      FAIL("accepted: " << json);
    } catch (const std::invalid_argument &e) {
      CHECK_MESSAGE(std::string(e.what()).find(what) != std::string::npos, std::string(e.what()) << " (wanted: " << what << ")");
    }
  };
  fails_with("{" + base + R"(,"algorithm":["RS256"]})", "cfg.json: auth.jwt.algorithm is not a known key");
  fails_with("{" + base + R"(,"algorithms":["none"]})", "'none' is not supported");
  fails_with("{" + base + R"(,"clock_skew_s":-1})", "auth.jwt.clock_skew_s must be an integer between 0 and 600");
  fails_with(R"({"audience":"a","jwks_url":"https://i/jwks"})", "auth.jwt.issuer is required");
  fails_with(R"({"issuer":"https://i","jwks_url":"https://i/jwks"})", "auth.jwt.audience is required");
  fails_with(R"({"issuer":"https://i","audience":"a"})", "exactly one of jwks_file and jwks_url");
  fails_with(R"({"issuer":"https://i","audience":"a","jwks_url":"ftp://x"})",
             "auth.jwt.jwks_url 'ftp://x': the scheme must be http or https");
  const std::string oidc = R"(,"openid_configuration_url":)";
  fails_with("{" + base + oidc + R"("i/.well-known/openid-configuration"})",
             "auth.jwt.openid_configuration_url 'i/.well-known/openid-configuration': not an absolute URL");
  fails_with("{" + base + oidc + "7}", "auth.jwt.openid_configuration_url");
  // What a prefix check let through: each is named with what is wrong.
  fails_with("{" + base + oidc + R"("https://login.example.com/a b"})", "byte 27 is a blank");
  fails_with("{" + base + oidc + R"("https://login.example.com/\u001b[31m"})",
             "'https://login.example.com/\\x1b[31m': byte 26 is a blank, a control byte");
  fails_with("{" + base + oidc + R"("https:///.well-known/openid-configuration"})", "the host name is empty");
  fails_with("{" + base + oidc + R"("https://login.example.com:99999/x"})", "the port 99999 is not in 1..65535");
  fails_with("{" + base + oidc + R"("https://user:secret@login.example.com/x"})", "no user name or password");
  fails_with("{" + base + oidc + R"("https://login.example.com/x#frag"})", "no fragment ('#' at byte 27)");
  fails_with("{" + base + oidc + R"("https://login.example.com/%zz"})", "'%' at byte 26 is not followed by two hex");
  fails_with("{" + base + oidc + "\"https://l.example/" + std::string(3000, 'a') + "\"}",
             "a URL of 3018 bytes is longer than 2048");
  fails_with(R"({"issuer":"https://i","audience":"a","jwks_url":"https://h:0/jwks"})",
             "auth.jwt.jwks_url 'https://h:0/jwks': the port 0 is not in 1..65535");
  // The scheme and host are case-insensitive (RFC 3986 section 6.2.2.1):
  // taken, and written in lower case.
  const auto o = parse_opts(R"({"issuer":"https://i","audience":"a","jwks_url":"HTTPS://Login.Example.COM/Keys",)"
                            R"("openid_configuration_url":"Http://Login.Example.com:8443/.well-known/X?a=%2F"})");
  CHECK(o.jwks_url == "https://login.example.com/Keys");
  CHECK(o.openid_configuration_url == "http://login.example.com:8443/.well-known/X?a=%2F");
}

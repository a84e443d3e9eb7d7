// Requests from web pages (issue 19 item 4): with authentication off (the
// default on 127.0.0.1) a page on any site could cancel a Task blind with a
// "simple" cross-site POST (text/plain, a form, or no Content-Type: no
// preflight), and a page on a DNS name rebound to 127.0.0.1 could read the
// Task list. API requests now need a JSON Content-Type for a body, a Host
// that names this server, and no foreign Origin; the card stays public.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include "server_test_support.hpp"

using namespace tnxtest;

namespace {

// A raw request: `head` lines after the request line, then the body.
HttpResponse send(int port, const std::string &line, const std::string &head, const std::string &body = {}) {
  Connection c(port);
  std::string req = line + " HTTP/1.1\r\n" + head;
  if (!body.empty()) req += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  c.send_raw(req + "\r\n" + body);
  return c.read_response(5000ms);
}

// What serve(o) throws std::invalid_argument with ("" when it starts).
std::string start_error(const toolnexus::ServerOptions &o) {
  try {
    toolnexus::serve(o);
  } catch (const std::invalid_argument &e) {
    return e.what();
  }
  return {};
}

std::string cancel_body(const std::string &id) {
  return R"({"jsonrpc":"2.0","id":1,"method":"CancelTask","params":{"id":)" + q(id) + "}}";
}

}  // namespace

TEST_CASE("a body must be labelled JSON: text/plain, forms and no Content-Type are refused 415, nothing done") {
  auto o = test_options();
  o.agent = "approval";
  auto server = toolnexus::serve(o);
  const int port = port_of(server.url());
  Client c(server.url());
  const std::string id = task_id(c.send("deploy 3.0"));
  c.wait_settled(id);
  for (const std::string &ct : std::vector<std::string>{"Content-Type: text/plain\r\n", "Content-Type: application/x-www-form-urlencoded\r\n",
                               "Content-Type: multipart/form-data; boundary=x\r\n", std::string()}) {
    CAPTURE(ct);
    HttpResponse r = send(port, "POST /", "Host: 127.0.0.1\r\n" + ct, cancel_body(id));
    CHECK(r.status == 415);
    CHECK(r.body.find("send Content-Type: application/json") != std::string::npos);
    // HTTP+JSON: a labelled empty body too (a cross-site form posts one).
    if (!ct.empty())
      CHECK(send(port, "POST /tasks/" + id + ":cancel", "Host: 127.0.0.1\r\n" + ct, "x=1").status == 415);
  }
  CHECK(state_of(c.call("GetTask", R"({"id":)" + q(id) + "}")) == "input-required");
  // JSON in either spelling, with parameters, is served.
  for (const std::string &ct : std::vector<std::string>{"application/json", "application/a2a+json", "Application/JSON; charset=utf-8"}) {
    CAPTURE(ct);
    HttpResponse r = send(port, "POST /", "Host: 127.0.0.1\r\nContent-Type: " + ct + "\r\n",
                          R"({"jsonrpc":"2.0","id":2,"method":"ListTasks","params":{}})");
    CHECK(r.status == 200);
  }
  // An HTTP+JSON POST without a body or a Content-Type is fine (curl -X POST).
  CHECK(send(port, "POST /tasks/" + id + ":cancel", "Host: 127.0.0.1\r\n").status == 200);
}

TEST_CASE("DNS rebinding: an API request whose Host does not name this server is refused 421; the card is served") {
  auto o = test_options();
  SUBCASE("by default") {
    auto server = toolnexus::serve(o);
    const int port = port_of(server.url());
    const std::string list = R"({"jsonrpc":"2.0","id":1,"method":"ListTasks","params":{}})";
    for (const std::string &host : std::vector<std::string>{"evil.example", "evil.example:" + std::to_string(port), "localhost.evil.example",
                                   "127.0.0.1.evil.example"}) {
      CAPTURE(host);
      HttpResponse rpc = send(port, "POST /", "Host: " + host + "\r\nContent-Type: application/json\r\n", list);
      CHECK(rpc.status == 421);
      CHECK(rpc.body.find("does not name this server") != std::string::npos);
      CHECK(send(port, "GET /tasks", "Host: " + host + "\r\nA2A-Version: 1.0\r\n").status == 421);
      CHECK(send(port, "GET /tasks/x:subscribe", "Host: " + host + "\r\n").status == 421);
      // The card is public; its url never follows a foreign Host.
      HttpResponse card = send(port, "GET /.well-known/agent-card.json", "Host: " + host + "\r\n");
      CHECK(card.status == 200);
      CHECK(std::string(parse(card.body)["url"].GetString()) == server.url());
    }
    // This server's own address and loopback names (over loopback) are served.
    for (const std::string &host : std::vector<std::string>{"127.0.0.1:" + std::to_string(port), "127.0.0.1", "localhost:8080", "[::1]:9",
                                   "LOCALHOST"}) {
      CAPTURE(host);
      CHECK(send(port, "GET /tasks", "Host: " + host + "\r\nA2A-Version: 1.0\r\n").status == 200);
    }
  }
  SUBCASE("a2a.allowed_hosts names more; \"*\" turns the check off") {
    o.card.allowed_hosts = {"agents.example.com"};
    auto server = toolnexus::serve(o);
    const int port = port_of(server.url());
    CHECK(send(port, "GET /tasks", "Host: agents.example.com\r\n").status == 200);
    CHECK(send(port, "GET /tasks", "Host: Agents.Example.COM:443\r\n").status == 200);
    CHECK(send(port, "GET /tasks", "Host: evil.example\r\n").status == 421);
    o.card.allowed_hosts = {"*"};
    auto open = toolnexus::serve(o);
    CHECK(send(port_of(open.url()), "GET /tasks", "Host: evil.example\r\n").status == 200);
  }
  SUBCASE("public_url's host is this server's") {
    o.card.public_url = "https://agents.example.com/a2a/";
    auto server = toolnexus::serve(o);
    const int port = port_of(server.url());
    CHECK(send(port, "GET /tasks", "Host: agents.example.com\r\n").status == 200);
    CHECK(send(port, "GET /tasks", "Host: agents.example.com:443\r\n").status == 200);
    CHECK(send(port, "GET /tasks", "Host: agents.example.com:8443\r\n").status == 421);
  }
}

TEST_CASE("cross-site requests: a foreign Origin is refused 403; this server's own and allowed origins are served") {
  auto o = test_options();
  o.agent = "approval";
  SUBCASE("by default") {
    auto server = toolnexus::serve(o);
    const int port = port_of(server.url());
    Client c(server.url());
    const std::string id = task_id(c.send("deploy 3.1"));
    c.wait_settled(id);
    const std::string json = "Content-Type: application/json\r\n";
    for (const std::string &origin : std::vector<std::string>{"https://evil.example", "http://evil.example:" + std::to_string(port), "null",
                                     "http://127.0.0.1:1"}) {
      CAPTURE(origin);
      HttpResponse r = send(port, "POST /", "Host: 127.0.0.1:" + std::to_string(port) + "\r\n" + json +
                                                "Origin: " + origin + "\r\n",
                            cancel_body(id));
      CHECK(r.status == 403);
      CHECK(r.body.find("cross-site request from Origin") != std::string::npos);
      CHECK(send(port, "POST /tasks/" + id + ":cancel",
                 "Host: 127.0.0.1:" + std::to_string(port) + "\r\nOrigin: " + origin + "\r\n")
                .status == 403);
    }
    CHECK(state_of(c.call("GetTask", R"({"id":)" + q(id) + "}")) == "input-required");
    // Same origin (a page this server served, e.g. a console): served.
    HttpResponse same = send(port, "GET /tasks",
                             "Host: 127.0.0.1:" + std::to_string(port) + "\r\nOrigin: http://127.0.0.1:" +
                                 std::to_string(port) + "\r\n");
    CHECK(same.status == 200);
  }
  SUBCASE("a2a.allowed_origins") {
    o.card.allowed_origins = {"https://console.example.com"};
    auto server = toolnexus::serve(o);
    const int port = port_of(server.url());
    CHECK(send(port, "GET /tasks", "Host: 127.0.0.1\r\nOrigin: https://console.example.com\r\n").status == 200);
    CHECK(send(port, "GET /tasks", "Host: 127.0.0.1\r\nOrigin: https://evil.example\r\n").status == 403);
  }
}

TEST_CASE("same origin is scheme, host and port (RFC 6454): default ports are the same, another scheme is not") {
  auto o = test_options();
  SUBCASE("this server's own origin") {
    auto server = toolnexus::serve(o);
    const int port = port_of(server.url());
    const std::string host = "Host: 127.0.0.1:" + std::to_string(port) + "\r\n";
    // This server speaks plain HTTP: an https page on its host and port is another origin.
    CHECK(send(port, "GET /tasks", host + "Origin: https://127.0.0.1:" + std::to_string(port) + "\r\n").status == 403);
    CHECK(send(port, "GET /tasks", host + "Origin: HTTP://127.0.0.1:" + std::to_string(port) + "\r\n").status == 200);
    // Host without a port is port 80, as is an http origin without one.
    CHECK(send(port, "GET /tasks", "Host: localhost\r\nOrigin: http://localhost:80\r\n").status == 200);
    CHECK(send(port, "GET /tasks", "Host: localhost:80\r\nOrigin: http://localhost\r\n").status == 200);
    CHECK(send(port, "GET /tasks", "Host: localhost\r\nOrigin: https://localhost\r\n").status == 403);
    CHECK(send(port, "GET /tasks", "Host: localhost\r\nOrigin: http://localhost:8080\r\n").status == 403);
  }
  SUBCASE("allowed_origins entries, default ports written or not") {
    o.card.allowed_origins = {"https://console.example.com:443", "http://tools.example.com"};
    auto server = toolnexus::serve(o);
    const int port = port_of(server.url());
    CHECK(send(port, "GET /tasks", "Host: 127.0.0.1\r\nOrigin: https://console.example.com\r\n").status == 200);
    CHECK(send(port, "GET /tasks", "Host: 127.0.0.1\r\nOrigin: http://tools.example.com:80\r\n").status == 200);
    CHECK(send(port, "GET /tasks", "Host: 127.0.0.1\r\nOrigin: http://console.example.com\r\n").status == 403);
    CHECK(send(port, "GET /tasks", "Host: 127.0.0.1\r\nOrigin: https://tools.example.com\r\n").status == 403);
    CHECK(send(port, "GET /tasks", "Host: 127.0.0.1\r\nOrigin: https://console.example.com:8443\r\n").status == 403);
  }
  SUBCASE("behind a trusted proxy: the forwarded scheme and host are this server's origin") {
    o.card.trust_forwarded = true;
    o.card.allowed_hosts = {"agents.example.com"};
    auto server = toolnexus::serve(o);
    const int port = port_of(server.url());
    const std::string upstream = "Host: 127.0.0.1:" + std::to_string(port) + "\r\n";
    CHECK(send(port, "GET /tasks", upstream + "Forwarded: proto=https;host=agents.example.com\r\n"
                                              "Origin: https://agents.example.com\r\n").status == 200);
    CHECK(send(port, "GET /tasks", upstream + "X-Forwarded-Proto: https\r\nX-Forwarded-Host: agents.example.com\r\n"
                                              "Origin: https://agents.example.com\r\n").status == 200);
    // The proxy passes the public Host on and says the scheme.
    CHECK(send(port, "GET /tasks", "Host: agents.example.com\r\nX-Forwarded-Proto: https\r\n"
                                   "Origin: https://agents.example.com\r\n").status == 200);
    CHECK(send(port, "GET /tasks", "Host: agents.example.com\r\nX-Forwarded-Proto: https\r\n"
                                   "Origin: http://agents.example.com\r\n").status == 403);
    // A forwarded host that is not allowed is not this server's name.
    CHECK(send(port, "GET /tasks", upstream + "Forwarded: proto=https;host=evil.example\r\n"
                                              "Origin: https://evil.example\r\n").status == 403);
  }
  SUBCASE("public_url's origin") {
    o.card.public_url = "https://agents.example.com/a2a/";
    auto server = toolnexus::serve(o);
    const int port = port_of(server.url());
    CHECK(send(port, "GET /tasks", "Host: 127.0.0.1\r\nOrigin: https://agents.example.com\r\n").status == 200);
    CHECK(send(port, "GET /tasks", "Host: 127.0.0.1\r\nOrigin: http://agents.example.com\r\n").status == 403);
  }
}

TEST_CASE("a Host that is not a valid host[:port] is refused 400, on the API and the card alike") {
  auto server = toolnexus::serve(test_options());
  const int port = port_of(server.url());
  for (const std::string &host : {std::string(""), std::string("127.0.0.1:"), std::string("127.0.0.1:99999"),
                                  std::string("a b"), std::string("[::1"), std::string("[nope]:80"),
                                  std::string("::1"), std::string("127.0.0.1:80:80"), std::string("h/x"),
                                  std::string("user@127.0.0.1")}) {
    CAPTURE(host);
    HttpResponse api = send(port, "GET /tasks", "Host: " + host + "\r\n");
    CHECK(api.status == 400);
    CHECK(api.body.find("Host") != std::string::npos);
    CHECK(send(port, "POST /", "Host: " + host + "\r\nContent-Type: application/json\r\n",
               R"({"jsonrpc":"2.0","id":1,"method":"ListTasks"})").status == 400);
    CHECK(send(port, "GET /.well-known/agent-card.json", "Host: " + host + "\r\n").status == 400);
  }
  // Any valid Host still gets the card; the API only one naming this server.
  CHECK(send(port, "GET /.well-known/agent-card.json", "Host: anything.example:8080\r\n").status == 200);
  CHECK(send(port, "GET /tasks", "Host: [::1]\r\n").status == 200);
}

TEST_CASE("malformed a2a.allowed_hosts / a2a.allowed_origins entries are refused at start, naming key, entry and fault") {
  const std::vector<std::pair<std::string, std::string>> hosts = {
      {"", "empty"}, {"https://x.example", "not a URL"}, {"x.example/", "no path"}, {"x.example:99999", "1..65535"},
      {"x.example:", "without a port"}, {"*.example", "wildcards"}, {"x y", "cannot be part of a host name"},
      {"2001:db8::1", "brackets"}, {"[zz]", "IPv6"}};
  for (const auto &[entry, why] : hosts) {
    CAPTURE(entry);
    auto o = test_options();
    o.card.allowed_hosts = {"ok.example", entry};
    const std::string message = start_error(o);
    CHECK(message.find("a2a.allowed_hosts (--allowed-host) entry '" + entry + "': ") != std::string::npos);
    CHECK(message.find(why) != std::string::npos);
  }
  const std::vector<std::pair<std::string, std::string>> origins = {
      {"", "empty"}, {"https://x.example/", "write https://x.example"}, {"x.example", "scheme://host"},
      {"ftp://x.example", "http or https"}, {"https://x.example:0", "1..65535"}, {"https://*.example", "wildcards"},
      {"null", "sandboxed"}, {"https://u@x.example", "user name"}, {"https://x.example/app?q", "no path"}};
  for (const auto &[entry, why] : origins) {
    CAPTURE(entry);
    auto o = test_options();
    o.card.allowed_origins = {entry};
    const std::string message = start_error(o);
    CHECK(message.find("a2a.allowed_origins (--allowed-origin) entry '" + entry + "': ") != std::string::npos);
    CHECK(message.find(why) != std::string::npos);
  }
  // The accepted forms.
  auto o = test_options();
  o.card.allowed_hosts = {"*", "agents.example.com", "Agents.Example.com:8443", "10.0.0.7", "[2001:db8::1]:443"};
  o.card.allowed_origins = {"*", "https://console.example.com", "http://127.0.0.1:3000", "https://[2001:db8::1]"};
  CHECK_NOTHROW(toolnexus::serve(o));
}

TEST_CASE("behind a trusted proxy, the nearest proxy's forwarded value counts, not one a client sent ahead of it") {
  auto o = test_options();
  o.card.trust_forwarded = true;
  auto server = toolnexus::serve(o);
  const int port = port_of(server.url());
  const std::string upstream = "Host: 127.0.0.1:" + std::to_string(port) + "\r\n";
  auto card_url = [&](const std::string &fields) {
    HttpResponse r = send(port, "GET /.well-known/agent-card.json", upstream + fields);
    REQUIRE(r.status == 200);
    return std::string(parse(r.body)["url"].GetString());
  };
  // A proxy appends its element (RFC 7239 section 4): the client's own comes first.
  CHECK(card_url("Forwarded: host=evil.example;proto=https, host=agents.example.com;proto=https\r\n") ==
        "https://agents.example.com/");
  CHECK(card_url("Forwarded: host=evil.example\r\nForwarded: host=agents.example.com;proto=https\r\n") ==
        "https://agents.example.com/");
  CHECK(card_url("X-Forwarded-Proto: http, https\r\nX-Forwarded-Host: evil.example, agents.example.com\r\n") ==
        "https://agents.example.com/");
  CHECK(card_url("X-Forwarded-Host: evil.example\r\nX-Forwarded-Host: agents.example.com\r\nX-Forwarded-Proto: https\r\n") ==
        "https://agents.example.com/");
  // And the origin a page on the proxy's public name has is this server's.
  CHECK(send(port, "GET /tasks", upstream + "Forwarded: host=evil.example;proto=https, host=agents.example.com;proto=https\r\n"
                                            "Origin: https://agents.example.com\r\n").status == 200);
  CHECK(send(port, "GET /tasks", upstream + "Forwarded: host=agents.example.com;proto=https, host=evil.example;proto=https\r\n"
                                            "Origin: https://agents.example.com\r\n").status == 403);
}

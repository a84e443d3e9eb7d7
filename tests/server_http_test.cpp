// The HTTP connection layer (server/src/wire/http_reactor.hpp): message framing
// errors answer 400/413/431/501 instead of reaching the JSON-RPC parser,
// pipelined requests are answered in order, 100-continue, HTTP/1.0, and
// slow clients (slowloris) neither hold the request threads nor stop the
// server from serving everybody else.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include "server_test_support.hpp"

#include <atomic>
#include <memory>

using namespace tnxtest;

namespace {

const std::string kList = R"({"jsonrpc":"2.0","id":7,"method":"ListTasks","params":{}})";

std::string post_head(const std::string &extra) {
  return "POST / HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n" + extra + "\r\n";
}

// Sends raw bytes and reads one response.
HttpResponse exchange(int port, const std::string &bytes) {
  Connection c(port);
  c.send_raw(bytes);
  return c.read_response(3000ms);
}

}  // namespace

TEST_CASE("framing errors are refused by the HTTP layer with the reason") {
  auto server = toolnexus::serve(test_options());
  const int port = port_of(server.url());
  struct Case {
    const char *what;
    std::string request;
    int status;
    const char *says;
  };
  const std::vector<Case> cases = {
      {"negative Content-Length", post_head("Content-Length: -5\r\n") + kList, 400, "Content-Length '-5'"},
      {"signed Content-Length", post_head("Content-Length: +5\r\n") + kList, 400, "non-negative decimal"},
      {"Content-Length not a number", post_head("Content-Length: 12abc\r\n") + kList, 400, "Content-Length"},
      {"two different Content-Lengths",
       post_head("Content-Length: 5\r\nContent-Length: 6\r\n") + kList, 400, "two different"},
      {"Content-Length and Transfer-Encoding",
       post_head("Content-Length: 5\r\nTransfer-Encoding: chunked\r\n") + "0\r\n\r\n", 400, "both"},
      {"gzip transfer coding, chunked last", post_head("Transfer-Encoding: gzip, chunked\r\n"), 501, "gzip"},
      // RFC 9112 section 6.3: chunked not the final coding: the length cannot be known, 400.
      {"gzip transfer coding alone", post_head("Transfer-Encoding: gzip\r\n"), 400, "chunked must be the last"},
      {"bad chunk size", post_head("Transfer-Encoding: chunked\r\n") + "zz\r\n{}\r\n0\r\n\r\n", 400,
       "bad chunk size 'zz'"},
      {"negative chunk size", post_head("Transfer-Encoding: chunked\r\n") + "-1\r\n{}\r\n0\r\n\r\n", 400,
       "bad chunk size"},
      {"chunk longer than its size",
       post_head("Transfer-Encoding: chunked\r\n") + "2\r\n{}}\r\n0\r\n\r\n", 400, "not followed by CRLF"},
      {"header larger than the limit", "GET /tasks HTTP/1.1\r\nHost: localhost\r\nX-Big: " + std::string(40000, 'a') + "\r\n\r\n",
       431, "larger than 32768"},
      {"malformed request line", "GET\r\n\r\n", 400, "malformed request header"},
      {"two Host fields", "GET /.well-known/agent-card.json HTTP/1.1\r\nHost: a\r\nhost: b\r\n\r\n", 400,
       "2 Host header fields"},
      {"body over the limit", post_head("Content-Length: 2000000\r\n"), 413, "(limits.max_body_bytes, --max-body)"},
  };
  for (const Case &c : cases) {
    CAPTURE(c.what);
    HttpResponse r = exchange(port, c.request);
    CHECK(r.status == c.status);
    CHECK_MESSAGE(r.body.find(c.says) != std::string::npos, r.body);
    // The answer is JSON and closes the connection.
    CHECK(parse(r.body).HasMember("message"));
  }
  // Nothing reached the store, and the server serves the next client.
  Client ok(server.url());
  CHECK(ok.call("ListTasks", "{}")["result"]["totalSize"].GetInt() == 0);
}

TEST_CASE("request smuggling: a head that a proxy could read otherwise is refused (RFC 9112)") {
  auto server = toolnexus::serve(test_options());
  const int port = port_of(server.url());
  // A complete second request, hidden in the body of the first: a server
  // that ignores the first's framing answers it too.
  const std::string smuggled = "GET /tasks HTTP/1.1\r\nHost: localhost\r\n\r\n";
  const std::string cl = std::to_string(smuggled.size());
  struct Case {
    const char *what;
    std::string request;
    int status;
    const char *says;
  };
  const std::vector<Case> cases = {
      {"whitespace before the colon", post_head("Content-Length : " + cl + "\r\n") + smuggled, 400,
       "whitespace between the field name 'Content-Length' and the colon"},
      {"tab before the colon", post_head("Content-Length\t: " + cl + "\r\n") + smuggled, 400, "and the colon"},
      {"obs-fold", post_head("X-A: 1\r\n Content-Length: " + cl + "\r\n") + smuggled, 400, "obs-fold"},
      {"bare LF ends a line", "POST / HTTP/1.1\r\nHost: x\nContent-Length: " + cl + "\r\n\r\n" + smuggled, 400,
       "bare LF"},
      {"bare CR in a line", post_head("X-A: 1\rContent-Length: " + cl + "\r\n") + smuggled, 400, "bare CR"},
      {"NUL in a value", post_head(std::string("X-A: a\0b\r\n", 10)) + smuggled, 400, "control character"},
      {"field name not a token", post_head("Content[Length]: " + cl + "\r\n") + smuggled, 400, "not a token"},
      {"no colon", post_head("Content-Length " + cl + "\r\n") + smuggled, 400, "has no colon"},
      {"chunked twice in one field", post_head("Transfer-Encoding: chunked, chunked\r\n") + "0\r\n\r\n", 400,
       "more than once"},
      {"chunked in two fields", post_head("Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n") + "0\r\n\r\n",
       400, "more than once"},
      {"chunked not last", post_head("Transfer-Encoding: chunked, identity\r\n") + "0\r\n\r\n", 400, "last"},
      {"empty Transfer-Encoding", post_head("Transfer-Encoding: ,\r\n") + smuggled, 400, "empty"},
      {"HTTP/9.9", "GET /tasks HTTP/9.9\r\nHost: localhost\r\n\r\n", 505, "HTTP version 9.9 is not supported"},
      {"HTTP/2.0 in an HTTP/1 request line", "GET /tasks HTTP/2.0\r\nHost: localhost\r\n\r\n", 505, "2.0"},
      {"HTTP/1.10", "GET /tasks HTTP/1.10\r\nHost: localhost\r\n\r\n", 400, "HTTP/DIGIT.DIGIT"},
      {"lower-case http", "GET /tasks http/1.1\r\nHost: localhost\r\n\r\n", 400, "HTTP/DIGIT.DIGIT"},
      {"two spaces in the request line", "GET  /tasks HTTP/1.1\r\nHost: localhost\r\n\r\n", 400, "single spaces"},
      {"a space in the target", "GET /tasks x HTTP/1.1\r\nHost: localhost\r\n\r\n", 400, "single spaces"},
      {"a raw non-ASCII byte in the target", "GET /tasks/\xc3\xa9 HTTP/1.1\r\nHost: localhost\r\n\r\n", 400,
       "percent-encode"},
      {"HTTP/1.1 without Host", "GET /tasks HTTP/1.1\r\n\r\n", 400, "must have a Host field"},
  };
  for (const Case &c : cases) {
    CAPTURE(c.what);
    Connection conn(port);
    conn.send_raw(c.request);
    HttpResponse r = conn.read_response(3000ms);
    CHECK(r.status == c.status);
    CHECK_MESSAGE(r.body.find(c.says) != std::string::npos, r.body);
    // One answer, then the connection closes: the hidden request is never run.
    HttpResponse second = conn.read_response(3000ms);
    CHECK(second.closed);
    CHECK(second.status == 0);
  }
  // What RFC 9112 allows still works: HTTP/1.2 is served as HTTP/1.1, an
  // HTTP/1.0 request needs no Host, OWS around a value is fine.
  for (const std::string &ok : {std::string("GET /.well-known/agent-card.json HTTP/1.2\r\nHost: localhost\r\n\r\n"),
                                std::string("GET /.well-known/agent-card.json HTTP/1.0\r\n\r\n"),
                                std::string("GET /.well-known/agent-card.json HTTP/1.1\r\nHost:\t x \t\r\n\r\n")}) {
    CAPTURE(ok);
    CHECK(exchange(port, ok).status == 200);
  }
  Client client(server.url());
  CHECK(client.call("ListTasks", "{}")["result"]["totalSize"].GetInt() == 0);
}

TEST_CASE("a chunked body is de-chunked (extensions and trailers allowed)") {
  auto server = toolnexus::serve(test_options());
  Connection c(port_of(server.url()));
  const std::string a = kList.substr(0, 10), b = kList.substr(10);
  char sa[16], sb[16];
  std::snprintf(sa, sizeof sa, "%zx", a.size());
  std::snprintf(sb, sizeof sb, "%zX", b.size());
  c.send_raw(post_head("Transfer-Encoding: chunked\r\n") + sa + ";ext=1\r\n" + a + "\r\n" + sb + "\r\n" + b +
             "\r\n0\r\nX-Trailer: yes\r\n\r\n");
  HttpResponse r = c.read_response();
  REQUIRE(r.status == 200);
  CHECK(parse(r.body)["id"].GetInt() == 7);
}

TEST_CASE("pipelined requests are answered in order on one connection") {
  auto server = toolnexus::serve(test_options());
  Connection c(port_of(server.url()));
  std::string both;
  for (int id : {1, 2, 3}) {
    const std::string body = R"({"jsonrpc":"2.0","id":)" + std::to_string(id) + R"(,"method":"ListTasks"})";
    both += post_head("Content-Length: " + std::to_string(body.size()) + "\r\n") + body;
  }
  c.send_raw(both);
  for (int id : {1, 2, 3}) {
    HttpResponse r = c.read_response();
    REQUIRE(r.status == 200);
    CHECK(parse(r.body)["id"].GetInt() == id);
  }
}

TEST_CASE("Expect: 100-continue gets 100 before the body is sent") {
  auto server = toolnexus::serve(test_options());
  Connection c(port_of(server.url()));
  c.send_raw(post_head("Expect: 100-continue\r\nContent-Length: " + std::to_string(kList.size()) + "\r\n"));
  HttpResponse cont = c.read_interim(2000ms);
  CHECK(cont.status == 100);
  c.send_raw(kList);
  HttpResponse r = c.read_response();
  CHECK(r.status == 200);
  CHECK(parse(r.body)["id"].GetInt() == 7);
}

TEST_CASE("HTTP/1.0: answered, then the connection closes") {
  auto server = toolnexus::serve(test_options());
  Connection c(port_of(server.url()));
  c.send_raw("POST / HTTP/1.0\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(kList.size()) +
             "\r\n\r\n" + kList);
  HttpResponse r = c.read_response();
  CHECK(r.status == 200);
  CHECK(parse(r.body)["id"].GetInt() == 7);
  CHECK(c.closed_within(2000ms));
}

TEST_CASE("slowloris: clients trickling header bytes are cut off and never shut others out") {
  auto o = test_options();
  o.limits.max_connections = 8;  // request threads: far fewer than the slow clients
  o.limits.header_timeout_ms = 5000;
  o.limits.read_timeout_ms = 5000;
  auto server = toolnexus::serve(o);
  const int port = port_of(server.url());

  // 200 connections, each sending one header byte every 100 ms.
  constexpr int kSlow = 200;
  std::vector<std::unique_ptr<Connection>> slow;
  for (int i = 0; i < kSlow; ++i) slow.push_back(std::make_unique<Connection>(port));
  const std::string header = "POST / HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nX-Pad: " + std::string(200, 'a');
  std::atomic<bool> done{false};
  std::atomic<int> rounds{0};
  std::thread trickle([&] {
    for (std::size_t pos = 0; pos < header.size() && !done; ++pos) {
      for (auto &c : slow) c->send_raw(std::string_view(header).substr(pos, 1));
      ++rounds;
      std::this_thread::sleep_for(100ms);
    }
  });
  REQUIRE(eventually([&] { return rounds >= 2; }));  // every slow client has begun its header

  // Meanwhile a normal client is served, request after request, while every
  // slow client is still held. Were the request threads held by the slow
  // clients, these answers would wait until the slow clients are cut off
  // (5 s after their first byte), and the slow clients would have their 408
  // first. (How fast the answers come is measured by bench/slowloris.)
  Client ok(server.url());
  constexpr int kServed = 10;
  for (int i = 0; i < kServed; ++i) {
    auto d = ok.call("ListTasks", "{}");
    REQUIRE(d.HasMember("result"));
    CHECK(d["result"]["totalSize"].GetInt() == 0);
  }
  int held = 0;
  for (auto &c : slow) {
    pollfd p{c->fd(), POLLIN, 0};
    if (::poll(&p, 1, 0) == 0) ++held;  // open, and nothing from the server yet
  }
  MESSAGE("served " << kServed << " requests while " << held << " of " << kSlow << " slow clients were held");
  CHECK(held == kSlow);

  // Every slow client got 408 once its header was 5 s late.
  int timed_out = 0;
  for (auto &c : slow) {
    HttpResponse r = c->read_response(15000ms);
    if (r.status == 408 && r.body.find("not complete 5000 ms after its first byte") != std::string::npos) ++timed_out;
  }
  done = true;
  trickle.join();
  CHECK(timed_out == kSlow);
}

TEST_CASE("a client that stops reading a response does not hold a request thread") {
  auto o = test_options();
  o.limits.max_connections = 2;
  auto server = toolnexus::serve(o);
  Client writer(server.url());
  // Tasks with large artifacts make a large ListTasks answer.
  const std::string big(200 * 1024, 'x');
  for (int i = 0; i < 8; ++i) writer.send(big);
  // Four connections ask for ~1.6 MiB each and never read it.
  std::vector<std::unique_ptr<Connection>> stuck;
  const std::string body = R"({"jsonrpc":"2.0","id":1,"method":"ListTasks","params":{"includeArtifacts":true}})";
  for (int i = 0; i < 4; ++i) {
    stuck.push_back(std::make_unique<Connection>(port_of(server.url())));
    stuck.back()->send_raw(post_head("Content-Length: " + std::to_string(body.size()) + "\r\n") + body);
  }
  // Each answer has begun to arrive (so its handler is done), and none is
  // read any further.
  for (auto &c : stuck) {
    pollfd p{c->fd(), POLLIN, 0};
    REQUIRE(::poll(&p, 1, 10000) == 1);
  }
  // Two request threads only, yet other clients are served.
  Client ok(server.url());
  const auto s = Clock::now();
  CHECK(ok.call("GetTask", R"({"id":"nope"})")["error"]["code"].GetInt() == -32001);
  CHECK(Clock::now() - s < 1000ms);
}

TEST_CASE("every answer reaches its client while many request workers answer at once") {
  // Regression: the event loop lost its wake-up when a worker posted an
  // answer while the loop was draining earlier ones (the flag was cleared
  // before the eventfd was read); every later answer then stayed queued and
  // the server answered nothing more. Many workers answering tiny requests
  // at once hit that window within a few thousand requests.
  auto o = test_options();
  o.limits.max_connections = 64;
  auto server = toolnexus::serve(o);
  const int port = port_of(server.url());
  constexpr int kClients = 48, kEach = 400;
  std::atomic<int> answered{0}, lost{0};
  std::vector<std::thread> clients;
  for (int t = 0; t < kClients; ++t) {
    clients.emplace_back([&] {
      Connection c(port);
      const std::string req = post_head("Content-Length: " + std::to_string(kList.size()) + "\r\n") + kList;
      for (int i = 0; i < kEach; ++i) {
        if (!c.send_raw(req)) {
          ++lost;
          return;
        }
        HttpResponse r = c.read_response(5000ms);
        if (r.status != 200) {
          ++lost;  // nothing within 5 s: the answer was never written
          return;
        }
        ++answered;
      }
    });
  }
  for (auto &t : clients) t.join();
  CHECK(lost.load() == 0);
  CHECK(answered.load() == kClients * kEach);
}

TEST_CASE("chunked bodies are held to RFC 9112 section 7.1: nothing hides behind a bare LF in a chunk line or a trailer") {
  // Found by a fresh-user pass: the head was strict, the chunk-size line and
  // the trailer were not, and a request hidden there was run.
  auto server = toolnexus::serve(test_options());
  const int port = port_of(server.url());
  const std::string hidden = "GET /tasks/SMUGGLED HTTP/1.1\r\nHost: localhost\r\n\r\n";
  const std::string te = post_head("Transfer-Encoding: chunked\r\n");
  const std::string size = [] {
    char b[16];
    std::snprintf(b, sizeof b, "%zx", kList.size());
    return std::string(b);
  }();
  struct Case {
    const char *what;
    std::string request;
    const char *says;
  };
  const std::vector<Case> cases = {
      {"bare LF in a chunk extension", te + "2;\nxx\r\n47\r\n0\r\n\r\n" + hidden, "control byte"},
      {"NUL in a chunk extension", te + size + std::string(";a\0b\r\n", 6) + kList + "\r\n0\r\n\r\n", "control byte"},
      {"whitespace before the size", te + " " + size + "\r\n" + kList + "\r\n0\r\n\r\n", "bad chunk size"},
      {"whitespace after the size", te + size + " \r\n" + kList + "\r\n0\r\n\r\n", "bad chunk size"},
      {"bare LF in the trailer", te + size + "\r\n" + kList + "\r\n0\r\n\n" + hidden, "chunked trailer"},
      {"obs-fold in the trailer", te + size + "\r\n" + kList + "\r\n0\r\nX: a\r\n b\r\n\r\n", "obs-fold"},
      {"a trailer line without colon", te + size + "\r\n" + kList + "\r\n0\r\nGARBAGE\r\n\r\n", "no colon"},
  };
  for (const Case &c : cases) {
    CAPTURE(c.what);
    Connection conn(port);
    conn.send_raw(c.request);
    HttpResponse r = conn.read_response(3000ms);
    CHECK(r.status == 400);
    CHECK_MESSAGE(r.body.find(c.says) != std::string::npos, r.body);
    HttpResponse second = conn.read_response(3000ms);
    CHECK(second.closed);
  }
  // Extensions (with BWS before ';') and sound trailers are still read.
  Connection conn(port);
  conn.send_raw(te + size + " ;name=\"v\"\r\n" + kList + "\r\n0\r\nX-Sum: 1\r\n\r\n");
  HttpResponse ok = conn.read_response(3000ms);
  CHECK(ok.status == 200);
}

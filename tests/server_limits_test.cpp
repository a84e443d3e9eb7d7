// Limits: a 2 MiB body gets 413 without being read (Content-Length and
// chunked), 10,000 nested arrays are refused without recursion and the
// server stays up, invalid UTF-8 is refused, slow clients are timed out.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include "server_test_support.hpp"

using namespace tnxtest;

namespace {

toolnexus::ServerHandle start(int read_timeout_ms = 10000, int body_deadline_ms = 30000) {
  auto o = test_options();
  o.limits.read_timeout_ms = read_timeout_ms;
  o.limits.body_deadline_ms = body_deadline_ms;
  return toolnexus::serve(o);
}

void still_up(const std::string &url) {
  Client c(url);
  const std::string id = task_id(c.send("still here"));
  CHECK(state_of(c.wait_settled(id)) == "completed");
}

}  // namespace

TEST_CASE("a 2 MiB body gets 413 and is not read") {
  auto server = start();
  const int port = port_of(server.url());

  SUBCASE("announced by Content-Length: answered before a byte of the body is sent") {
    Connection conn(port);
    REQUIRE(conn.send_raw("POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          "Content-Length: 2097152\r\n\r\n"));
    auto r = conn.read_response(3000ms);
    CHECK(r.status == 413);
    CHECK(r.body.find("1048576") != std::string::npos);
    CHECK(conn.closed_within(2000ms));
  }
  SUBCASE("a real 2 MiB body") {
    Connection conn(port);
    const std::string body(2 * 1024 * 1024, ' ');
    conn.send_raw("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n");
    conn.send_raw(body);  // may fail part-way: the server stops listening
    auto r = conn.read_response(3000ms);
    CHECK(r.status == 413);
  }
  SUBCASE("chunked: capped while reading") {
    Connection conn(port);
    REQUIRE(conn.send_raw("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"));
    const std::string chunk(64 * 1024, 'a');
    char size_line[32];
    std::snprintf(size_line, sizeof size_line, "%zx\r\n", chunk.size());
    bool ok = true;
    for (int i = 0; i < 32 && ok; ++i) ok = conn.send_raw(std::string(size_line) + chunk + "\r\n");
    if (ok) conn.send_raw("0\r\n\r\n");
    auto r = conn.read_response(3000ms);
    CHECK(r.status == 413);
  }
  SUBCASE("exactly at the limit is read (and is just not JSON-RPC)") {
    Connection conn(port);
    std::string body = R"({"jsonrpc":"2.0","id":9,"method":"ListTasks","params":{},"pad":")";
    body += std::string(1048576 - body.size() - 2, 'x') + "\"}";
    REQUIRE(body.size() == 1048576);
    auto r = conn.post(body);
    CHECK(r.status == 200);
    CHECK(parse(r.body).HasMember("result"));
  }
  still_up(server.url());
}

TEST_CASE("10,000 nested arrays are refused without recursion; the server stays up") {
  auto server = start();
  Client c(server.url());
  const std::string deep = std::string(10000, '[') + std::string(10000, ']');
  auto r = c.post(R"({"jsonrpc":"2.0","id":"deep","method":"SendMessage","params":{"message":{"role":"user",)"
                  R"("messageId":"m","parts":[{"kind":"data","data":{"x":)" + deep + "}}]}}}");
  REQUIRE(r.status == 200);
  auto d = parse(r.body);
  CHECK(error_code(d) == -32600);
  CHECK(error_message(d).find("nested deeper than 64") != std::string::npos);
  // Unbalanced too: the scan stops at level 65.
  r = c.post(std::string(100000, '['));
  CHECK(error_code(parse(r.body)) == -32600);
  // Nesting within the limit is fine and is stored.
  std::string ok_data = std::string(50, '[') + "1" + std::string(50, ']');
  auto fine = c.call("SendMessage", R"({"message":{"role":"user","messageId":"m","parts":[{"kind":"data","data":{"x":)" +
                                        ok_data + "}}]}}");
  CHECK(state_of(fine) == "completed");  // blocking by default: answered when done
  still_up(server.url());
}

TEST_CASE("invalid UTF-8 is refused") {
  auto server = start();
  Client c(server.url());
  auto r = c.post("{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"SendMessage\",\"params\":{\"message\":{\"role\":\"user\","
                  "\"messageId\":\"m\",\"parts\":[{\"kind\":\"text\",\"text\":\"bad \xff\xfe bytes\"}]}}}");
  REQUIRE(r.status == 200);
  auto d = parse(r.body);
  CHECK(error_code(d) == -32700);
  CHECK(error_message(d).find("invalid UTF-8") != std::string::npos);
  // Overlong encoding and a lone surrogate (CESU) are refused too.
  r = c.post("{\"jsonrpc\":\"2.0\",\"id\":4,\"method\":\"GetTask\",\"params\":{\"id\":\"\xc0\xaf\"}}");
  CHECK(error_code(parse(r.body)) == -32700);
  r = c.post("{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"GetTask\",\"params\":{\"id\":\"\xed\xa0\x80\"}}");
  CHECK(error_code(parse(r.body)) == -32700);
  // Nothing was stored.
  auto list = c.call("ListTasks", "{}");
  CHECK(list["result"]["totalSize"].GetUint64() == 0);
  still_up(server.url());
}

TEST_CASE("slow or stuck clients are timed out") {
  auto server = start(/*read_timeout_ms=*/300, /*body_deadline_ms=*/800);
  const int port = port_of(server.url());
  const auto t0 = Clock::now();

  SUBCASE("connects and sends nothing") {
    Connection conn(port);
    CHECK(conn.closed_within(3000ms));
    CHECK(Clock::now() - t0 < 2000ms);
  }
  SUBCASE("sends half the headers and stops") {
    Connection conn(port);
    conn.send_raw("POST / HTTP/1.1\r\nHost: x\r\nContent-Le");
    CHECK(conn.closed_within(3000ms));
    CHECK(Clock::now() - t0 < 2000ms);
  }
  SUBCASE("promises a body and stops sending") {
    Connection conn(port);
    conn.send_raw("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"jsonrpc\"");
    CHECK(conn.closed_within(3000ms));
    CHECK(Clock::now() - t0 < 2000ms);
  }
  SUBCASE("dribbles a body slower than the whole-body deadline") {
    Connection conn(port);
    const std::string body = R"({"jsonrpc":"2.0","id":1,"method":"ListTasks","params":{}})";
    conn.send_raw("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n" + body);
    // 1 KiB every 100 ms keeps each read under the 300 ms socket timeout.
    bool answered = false;
    for (int i = 0; i < 40 && !answered; ++i) {
      std::this_thread::sleep_for(100ms);
      if (!conn.send_raw(std::string(1024, ' '))) answered = true;
      pollfd p{conn.fd(), POLLIN, 0};
      if (::poll(&p, 1, 0) > 0) answered = true;
    }
    REQUIRE(answered);
    auto r = conn.read_response(2000ms);
    CHECK((r.status == 408 || r.closed));
    CHECK(Clock::now() - t0 < 3000ms);
  }
  SUBCASE("an idle keep-alive connection is closed") {
    auto o = test_options();
    o.limits.keep_alive_timeout_ms = 200;
    auto s2 = toolnexus::serve(o);
    Connection conn(port_of(s2.url()));
    CHECK(conn.post(R"({"jsonrpc":"2.0","id":1,"method":"ListTasks"})").status == 200);
    const auto t1 = Clock::now();
    CHECK(conn.closed_within(3000ms));
    CHECK(Clock::now() - t1 < 1500ms);
  }
  still_up(server.url());
}

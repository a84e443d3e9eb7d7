// The HTTP front door held to its RFCs, as a fresh-user pass tried it:
// echoed client text stays valid JSON and whole; request targets in their
// RFC 9112 forms (and 414 for a long one); query strings read strictly;
// repeated single-value fields refused, a repeated list field combined;
// 405 with Allow on the fixed paths; the status name of every REST error
// matching its code; a request pipelined behind a stream answered after it.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include "server_test_support.hpp"

using namespace tnxtest;

namespace {

toolnexus::ServerHandle serve_approval() {
  auto o = test_options();
  o.agent = "approval";
  return toolnexus::serve(o);
}

// The request bytes with a Host and, when `body` is given, a JSON body.
std::string raw(const std::string &line, const std::string &headers = {}, const std::string &body = {}) {
  std::string req = line + "\r\nHost: 127.0.0.1\r\n" + headers;
  if (!body.empty()) req += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  return req + "\r\n" + body;
}

HttpResponse send(Connection &conn, const std::string &bytes) {
  REQUIRE(conn.send_raw(bytes));
  return conn.read_response();
}

HttpResponse send_new(const toolnexus::ServerHandle &server, const std::string &bytes) {
  Connection conn(port_of(server.url()));
  return send(conn, bytes);
}

// `body` parsed as JSON whose strings are valid UTF-8 (RapidJSON's default
// parse does not check the encoding); fails the test otherwise.
rapidjson::Document strict_json(const std::string &body) {
  rapidjson::Document d;
  d.Parse<rapidjson::kParseValidateEncodingFlag>(body.data(), body.size());
  REQUIRE_MESSAGE(!d.HasParseError(), "not valid UTF-8 JSON: " << body.substr(0, 300));
  return d;
}

// The error message of a plain HTTP error, a REST error or a JSON-RPC error.
std::string message_of(const std::string &body) {
  const rapidjson::Document d = strict_json(body);
  REQUIRE_MESSAGE(d.HasMember("error"), body);
  const rapidjson::Value &e = d["error"];
  if (e.IsObject()) return {e["message"].GetString(), e["message"].GetStringLength()};
  return {d["message"].GetString(), d["message"].GetStringLength()};
}

bool has(const std::string &text, const std::string &part) { return text.find(part) != std::string::npos; }

const std::string kJson = "Content-Type: application/json\r\n";
const std::string kV1 = "A2A-Version: 1.0\r\n";

}  // namespace

TEST_CASE("client text echoed in an error is valid UTF-8 JSON, whole, NUL shown (\\x00), never cut") {
  auto server = serve_approval();
  Connection conn(port_of(server.url()));
  // A method name with NUL: the whole name, the NUL visible.
  HttpResponse r = send(conn, raw("POST / HTTP/1.1", kJson + kV1,
                                  R"({"jsonrpc":"2.0","id":1,"method":"tasks/get\u0000x"})"));
  CHECK(r.status == 200);
  std::string m = message_of(r.body);
  CHECK_MESSAGE(m.rfind("method 'tasks/get\\x00x' not found", 0) == 0, m);
  // A method name that is long: cut with "...", not silently.
  r = send(conn,
           raw("POST / HTTP/1.1", kJson, R"({"jsonrpc":"2.0","id":2,"method":")" + std::string(300, 'm') + "\"}"));
  m = message_of(r.body);
  CHECK_MESSAGE(has(m, "'" + std::string(200, 'm') + "...'"), m);
  // A2A-Version bytes that are not UTF-8, in the header: JSON-RPC -32009.
  r = send(conn, raw("POST / HTTP/1.1", kJson + "A2A-Version: 9\xff\r\n",
                     R"({"jsonrpc":"2.0","id":3,"method":"GetTask","params":{"id":"x"}})"));
  CHECK(strict_json(r.body)["error"]["code"].GetInt() == -32009);
  CHECK_MESSAGE(message_of(r.body).rfind("A2A-Version '9\\xff' is not supported", 0) == 0, r.body);
  // ... and on HTTP+JSON (400), with a NUL from the query parameter too.
  r = send(conn, raw("GET /tasks HTTP/1.1", "A2A-Version: 9\xff\r\n"));
  CHECK(r.status == 400);
  CHECK_MESSAGE(message_of(r.body).rfind("A2A-Version '9\\xff' is not supported", 0) == 0, r.body);
  r = send(conn, raw("GET /tasks?A2A-Version=1%00x HTTP/1.1"));
  CHECK(r.status == 400);
  CHECK_MESSAGE(message_of(r.body).rfind("A2A-Version '1\\x00x' is not supported", 0) == 0, r.body);
  // Content-Type (415 on both bindings) and Content-Length (400).
  r = send(conn, raw("POST / HTTP/1.1", "Content-Type: text/\xe9t\xe9\r\n", "{}"));
  CHECK(r.status == 415);
  CHECK_MESSAGE(message_of(r.body).rfind("Content-Type 'text/\\xe9t\\xe9' is not supported", 0) == 0, r.body);
  r = send(conn, raw("POST /message:send HTTP/1.1", "Content-Type: text/\xe9\r\n", "{}"));
  CHECK(r.status == 415);
  CHECK_MESSAGE(message_of(r.body).rfind("Content-Type 'text/\\xe9' is not supported", 0) == 0, r.body);
  r = send_new(server, raw("POST / HTTP/1.1", kJson + "Content-Length: 1\xff\r\n"));
  CHECK(r.status == 400);
  CHECK_MESSAGE(has(message_of(r.body), "Content-Length '1\\xff' is not"), r.body);
  // A push config id with NUL (JSON-RPC and REST).
  const std::string id = task_id(Client(server.url()).send("deploy 1"));
  r = send_new(server, raw("POST / HTTP/1.1", kJson + kV1,
                           R"({"jsonrpc":"2.0","id":4,"method":"GetTaskPushNotificationConfig","params":{"taskId":")" +
                               id + R"(","id":"c\u0000d"}})"));
  CHECK_MESSAGE(has(message_of(r.body), "has no push notification config 'c\\x00d'"), r.body);
}

TEST_CASE("request targets: origin-form, absolute-form (its authority is the Host), '*' only for OPTIONS; 414") {
  auto server = serve_approval();
  // No leading '/': 400, saying what a target must be.
  HttpResponse r = send_new(server, raw("GET tasks HTTP/1.1"));
  CHECK(r.status == 400);
  CHECK_MESSAGE(has(message_of(r.body), "request target 'tasks' is neither origin-form (it must start with '/')"),
                r.body);
  // Absolute-form is served as its path and query (RFC 9112 section 3.2.2).
  Connection conn(port_of(server.url()));
  r = send(conn, raw("GET http://127.0.0.1/tasks?pageSize=1 HTTP/1.1", kV1));
  CHECK(r.status == 200);
  CHECK_MESSAGE(strict_json(r.body).HasMember("tasks"), r.body);
  r = send(conn, raw("GET HTTP://127.0.0.1 HTTP/1.1"));  // an empty path is "/": JSON-RPC takes only POST
  CHECK(r.status == 405);
  // ... and its authority, not the Host field, names the server.
  r = send(conn, "GET http://127.0.0.1/tasks HTTP/1.1\r\nHost: evil.example\r\n\r\n");
  CHECK(r.status == 200);
  r = send(conn, "GET http://evil.example/tasks HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
  CHECK(r.status == 421);
  CHECK_MESSAGE(has(message_of(r.body), "'evil.example'"), r.body);
  // Other forms: 400 with the reason.
  for (const std::string target : {"ftp://127.0.0.1/tasks", "http:///tasks", "http://u@127.0.0.1/tasks",
                                   "127.0.0.1:80", "/tasks#frag", "*"}) {
    CAPTURE(target);
    r = send_new(server, raw("GET " + target + " HTTP/1.1"));
    CHECK(r.status == 400);
    CHECK_MESSAGE(has(message_of(r.body), "malformed request target: the request target '" + target + "'"), r.body);
  }
  r = send_new(server, raw("OPTIONS * HTTP/1.1"));
  CHECK(r.status != 400);
  // Longer than 16384 bytes: 414 naming the limit, both below and above
  // the header limit (32 KiB).
  for (const std::size_t size : {17 * 1024, 40 * 1024}) {
    CAPTURE(size);
    r = send_new(server, raw("GET /tasks?contextId=" + std::string(size, 'a') + " HTTP/1.1"));
    CHECK(r.status == 414);
    CHECK_MESSAGE(has(message_of(r.body), "16384 bytes"), r.body);
  }
}

TEST_CASE("query strings: malformed escapes and repeated parameters are 400 naming them; names exact") {
  auto server = serve_approval();
  Connection conn(port_of(server.url()));
  const auto get = [&](const std::string &target) { return send(conn, raw("GET " + target + " HTTP/1.1", kV1)); };
  for (const std::string q : {"pageSize=%ZZ", "pageSize=1%", "pageSize=%4", "page%G0Size=1", "%"}) {
    CAPTURE(q);
    const HttpResponse r = get("/tasks?" + q);
    CHECK(r.status == 400);
    CHECK_MESSAGE(has(message_of(r.body), "malformed percent-escape"), r.body);
    CHECK(std::string(strict_json(r.body)["error"]["status"].GetString()) == "INVALID_ARGUMENT");
  }
  HttpResponse r = get("/tasks?pageSize=%ZZ");
  CHECK(message_of(r.body) == "malformed percent-escape '%ZZ' in the value of the query parameter 'pageSize' "
                              "(RFC 3986 section 2.1: '%' and two hex digits)");
  // JSON-RPC reads the query too (A2A-Version): the same 400.
  r = send(conn, raw("POST /?A2A-Version=%ZZ HTTP/1.1", kJson, R"({"jsonrpc":"2.0","id":1,"method":"ListTasks"})"));
  CHECK(r.status == 400);
  CHECK_MESSAGE(has(message_of(r.body), "malformed percent-escape '%ZZ'"), r.body);
  // Given twice, under one name or under its two spellings.
  r = get("/tasks?pageSize=1&pageSize=2");
  CHECK(r.status == 400);
  CHECK(message_of(r.body) == "the query parameter 'pageSize' is given more than once; give it once");
  r = get("/tasks?pageSize=1&page_size=2");
  CHECK(r.status == 400);
  CHECK_MESSAGE(has(message_of(r.body), "'page_size'"), r.body);
  // Exactly the camelCase and the proto name; near misses are refused.
  CHECK(get("/tasks?page_size=1&historyLength=0&include_artifacts=true").status == 200);
  for (const std::string name : {"history__length", "historyLength_", "HistoryLength", "historylength", "page-size"}) {
    CAPTURE(name);
    r = get("/tasks?" + name + "=1");
    CHECK(r.status == 400);
    CHECK_MESSAGE(has(message_of(r.body), "unknown query parameter '" + name + "': did you mean '"), r.body);
  }
  // Other names are no request field: ignored (A2A v1.0 section 5.7).
  CHECK(get("/tasks?_=12345").status == 200);
}

TEST_CASE("repeated single-value header fields are 400 naming the field; If-None-Match fields combine") {
  auto server = serve_approval();
  for (const std::string &twice : {std::string("Content-Type: application/json\r\nContent-Type: text/plain\r\n"),
                                   std::string("A2A-Version: 1.0\r\nA2A-Version: 0.3\r\n"),
                                   std::string("Last-Event-ID: 1\r\nLast-Event-ID: 2\r\n"),
                                   std::string("Authorization: Bearer a\r\nAuthorization: Bearer b\r\n")}) {
    CAPTURE(twice);
    const std::string name = twice.substr(0, twice.find(':'));
    const HttpResponse r = send_new(server, raw("POST / HTTP/1.1", twice + (name == "Content-Type" ? "" : kJson),
                                                R"({"jsonrpc":"2.0","id":1,"method":"ListTasks"})"));
    CHECK(r.status == 400);
    CHECK_MESSAGE(has(message_of(r.body), "the request has 2 " + name + " header fields"), r.body);
  }
  // If-None-Match is a list (RFC 9110 section 13.1.2): every field counts,
  // in either order.
  Connection conn(port_of(server.url()));
  const std::string card = "GET /.well-known/agent-card.json HTTP/1.1";
  const std::string etag = send(conn, raw(card)).header("etag");
  REQUIRE(!etag.empty());
  CHECK(send(conn, raw(card, "If-None-Match: \"x\"\r\nIf-None-Match: " + etag + "\r\n")).status == 304);
  CHECK(send(conn, raw(card, "If-None-Match: " + etag + "\r\nIf-None-Match: \"x\"\r\n")).status == 304);
  CHECK(send(conn, raw(card, "If-None-Match: \"x\"\r\nIf-None-Match: \"y\"\r\n")).status == 200);
}

TEST_CASE("a fixed path asked with another method: 405 with Allow") {
  auto server = serve_approval();
  Connection conn(port_of(server.url()));
  for (const std::string path : {"/.well-known/agent-card.json", "/.well-known/agent.json"}) {
    for (const std::string method : {"POST", "PUT", "DELETE"}) {
      CAPTURE(method + " " + path);
      const HttpResponse r = send(conn, raw(method + " " + path + " HTTP/1.1", kJson, "{}"));
      CHECK(r.status == 405);
      CHECK(r.header("allow") == "GET, HEAD");
      CHECK(message_of(r.body) == method + " is not allowed here; this path takes GET, HEAD");
    }
  }
  HttpResponse r = send(conn, raw("GET / HTTP/1.1"));
  CHECK(r.status == 405);
  CHECK(r.header("allow") == "POST");
  r = send(conn, raw("PUT /tasks HTTP/1.1"));
  CHECK(r.status == 405);
  CHECK(r.header("allow") == "GET");
  r = send(conn, raw("GET /message:send HTTP/1.1"));
  CHECK(r.status == 405);
  CHECK(r.header("allow") == "POST");
}

TEST_CASE("a request pipelined behind an SSE stream is answered after the stream ends (RFC 9112 section 9.3.2)") {
  auto server = serve_approval();
  Client c(server.url());
  const std::string id = task_id(c.send("deploy 2.0"));
  c.wait_settled(id, 20s);
  Connection conn(port_of(server.url()));
  SseReader sse(conn, "GET /tasks/" + id + ":subscribe HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
  REQUIRE(sse.status() == 200);
  REQUIRE(sse.next());  // the snapshot: the stream is open
  // Pipelined while the stream is open.
  REQUIRE(conn.send_raw(raw("GET /tasks/" + id + " HTTP/1.1", kV1)));
  CHECK(!sse.next(300ms));  // the Task waits: so does the stream
  c.send("approve", R"("taskId":)" + q(id));
  sse.rest();
  REQUIRE(sse.ended());
  // The answer to the pipelined request follows the stream's last chunk.
  std::string in = sse.unparsed();
  const auto deadline = Clock::now() + 10s;
  std::size_t head_end = std::string::npos;
  std::size_t need = std::string::npos;
  while (Clock::now() < deadline) {
    head_end = in.find("\r\n\r\n");
    if (head_end != std::string::npos && need == std::string::npos) {
      const std::size_t cl = in.find("Content-Length: ");
      if (cl != std::string::npos && cl < head_end) need = head_end + 4 + std::stoul(in.substr(cl + 16));
    }
    if (need != std::string::npos && in.size() >= need) break;
    pollfd p{conn.fd(), POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    char buf[65536];
    const ssize_t n = ::recv(conn.fd(), buf, sizeof buf, 0);
    if (n <= 0) break;
    in.append(buf, static_cast<std::size_t>(n));
  }
  REQUIRE_MESSAGE(need != std::string::npos, "no answer to the pipelined request: " << in.substr(0, 300));
  REQUIRE(in.size() >= need);
  CHECK(in.rfind("HTTP/1.1 200", 0) == 0);
  const rapidjson::Document task = strict_json(in.substr(head_end + 4, need - head_end - 4));
  CHECK(std::string(task["id"].GetString()) == id);
  CHECK(std::string(task["status"]["state"].GetString()) == "TASK_STATE_COMPLETED");
}

TEST_CASE("more than a head and 64 KiB pipelined behind a stream: the connection closes after the stream") {
  auto server = serve_approval();
  Client c(server.url());
  const std::string id = task_id(c.send("deploy 2.1"));
  c.wait_settled(id, 20s);
  Connection conn(port_of(server.url()));
  SseReader sse(conn, "GET /tasks/" + id + ":subscribe HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
  REQUIRE(sse.status() == 200);
  REQUIRE(sse.next());
  // A body of 200 KB (under the 1 MiB body limit): more than is kept.
  const std::string big = R"({"message":{"role":"ROLE_USER","messageId":"m","parts":[{"text":")" +
                          std::string(200 * 1000, 'x') + "\"}]}}";
  REQUIRE(conn.send_raw(raw("POST /message:send HTTP/1.1", kJson, big)));
  CHECK(!sse.next(300ms));
  c.send("approve", R"("taskId":)" + q(id));
  const auto events = sse.rest();
  REQUIRE(sse.ended());
  REQUIRE(!events.empty());
  CHECK(std::string(parse(events.back().data)["statusUpdate"]["status"]["state"].GetString()) ==
        "TASK_STATE_COMPLETED");
  // Then the connection closes, the pipelined request unanswered (the
  // client retries it: RFC 9112 section 9.3.2); no second Task was made.
  CHECK(sse.unparsed().empty());
  CHECK(conn.closed_within(10s));
  CHECK(c.call("ListTasks", "{}")["result"]["tasks"].Size() == 1);
}

TEST_CASE("every HTTP+JSON error: status is the google.rpc.Code of its HTTP status; ErrorInfo names the A2A error") {
  auto server = serve_approval();
  Client c(server.url());
  const std::string done = task_id(c.send("deploy 3"));
  c.wait_settled(done, 20s);
  c.send("approve", R"("taskId":)" + q(done));
  REQUIRE(state_of(c.wait_settled(done, 20s)) == "completed");
  auto o = test_options();
  o.push.enabled = false;
  auto no_push = toolnexus::serve(o);
  struct Case {
    std::string request;
    int code;
    std::string status;
    std::string reason;
    const toolnexus::ServerHandle *to = nullptr;  // null: `server`
  };
  const std::string send = "POST /message:send HTTP/1.1";
  const std::vector<Case> cases = {
      {raw("GET /tasks/no-such-task HTTP/1.1"), 404, "NOT_FOUND", "TASK_NOT_FOUND"},
      {raw("POST /tasks/" + done + ":cancel HTTP/1.1"), 409, "FAILED_PRECONDITION", "TASK_NOT_CANCELABLE"},
      {raw("GET /tasks/" + done + ":subscribe HTTP/1.1"), 400, "UNIMPLEMENTED", "UNSUPPORTED_OPERATION"},
      {raw("GET /tasks/" + done + "/pushNotificationConfigs/nope HTTP/1.1"), 404, "NOT_FOUND", "TASK_NOT_FOUND"},
      {raw("GET /tasks/x/pushNotificationConfigs HTTP/1.1"), 400, "UNIMPLEMENTED",
       "PUSH_NOTIFICATION_NOT_SUPPORTED", &no_push},
      {raw("GET /extendedAgentCard HTTP/1.1"), 400, "FAILED_PRECONDITION", "EXTENDED_AGENT_CARD_NOT_CONFIGURED"},
      {raw("GET /tasks HTTP/1.1", "A2A-Version: 9.9\r\n"), 400, "FAILED_PRECONDITION", "VERSION_NOT_SUPPORTED"},
      {raw(send, "Content-Type: text/plain\r\n", "{}"), 415, "INVALID_ARGUMENT", "CONTENT_TYPE_NOT_SUPPORTED"},
      {raw(send, kJson, "{not json"), 400, "INVALID_ARGUMENT", "PARSE_ERROR"},
      {raw(send, kJson, "[1]"), 400, "INVALID_ARGUMENT", "INVALID_REQUEST"},
      {raw("POST /message:send HTTP/1.1", kJson + "Content-Length: 0\r\n"), 400, "INVALID_ARGUMENT", "INVALID_PARAMS"},
      {raw("GET /tasks/" + done + "?historyLength=abc HTTP/1.1"), 400, "INVALID_ARGUMENT", "INVALID_PARAMS"},
      {raw("GET /tasks?pageSize=%ZZ HTTP/1.1"), 400, "INVALID_ARGUMENT", "INVALID_REQUEST"},
      {raw("GET /tasks?history__length=1 HTTP/1.1"), 400, "INVALID_ARGUMENT", "INVALID_REQUEST"},
  };
  for (const Case &k : cases) {
    CAPTURE(k.request);
    const HttpResponse r = send_new(k.to != nullptr ? *k.to : server, k.request);
    CHECK(r.status == k.code);
    const rapidjson::Document d = strict_json(r.body);
    REQUIRE_MESSAGE(d["error"].IsObject(), r.body);
    CHECK(d["error"]["code"].GetInt() == k.code);
    CHECK(std::string(d["error"]["status"].GetString()) == k.status);
    REQUIRE(d["error"]["details"].IsArray());
    CHECK(std::string(d["error"]["details"][0]["reason"].GetString()) == k.reason);
    CHECK(std::string(d["error"]["message"].GetString()).size() > 10);
  }
}

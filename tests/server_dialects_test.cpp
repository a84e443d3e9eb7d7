// A2A v1.0 beside v0.3 (issue 9), over raw HTTP: the v1.0 JSON-RPC shapes
// byte for byte, one stored form read through both dialects, the
// HTTP+JSON binding (routes, query parameters, error mapping), tenants,
// version negotiation, the dual Agent Card, and server-private metadata
// hidden in every view.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include "server_test_support.hpp"

#include <regex>
#include <set>

using namespace tnxtest;

namespace {

const std::string kV1 = "A2A-Version: 1.0\r\n";

// A v1.0 JSON-RPC call.
rapidjson::Document call_v1(Client &c, const std::string &method, const std::string &params,
                            const std::string &id_json = "1") {
  return c.call(method, params, id_json, kV1);
}

// A v1.0 message with one text part.
std::string v1_message(const std::string &text, const std::string &message_id, const std::string &extra = {}) {
  return R"({"role":"ROLE_USER","messageId":)" + q(message_id) + R"(,"parts":[{"text":)" + q(text) + "}]" +
         (extra.empty() ? "" : "," + extra) + "}";
}

std::vector<std::string> keys_of(const rapidjson::Value &obj) {
  std::vector<std::string> out;
  for (auto it = obj.MemberBegin(); it != obj.MemberEnd(); ++it) out.emplace_back(it->name.GetString());
  return out;
}

bool is_v1_timestamp(const std::string &s) {
  static const std::regex re(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z)");
  return std::regex_match(s, re);
}

// An HTTP request with any method; `body` may be empty.
HttpResponse request(Connection &conn, const std::string &method, const std::string &path,
                     const std::string &body = {}, const std::string &headers = {}) {
  std::string req = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n" + headers;
  if (!body.empty()) req += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  else if (method == "POST") req += "Content-Length: 0\r\n";
  req += "\r\n" + body;
  REQUIRE(conn.send_raw(req));
  return conn.read_response();
}

// The REST error body's parts: {code, status, message, details:[ErrorInfo]}.
struct RestError {
  int code = 0;
  std::string status, reason, field, message;
};

RestError rest_error(const HttpResponse &r) {
  auto d = parse(r.body);
  INFO(r.body);
  REQUIRE(d.HasMember("error"));
  const auto &e = d["error"];
  RestError out;
  out.code = e["code"].GetInt();
  out.status = e["status"].GetString();
  out.message = e["message"].GetString();
  REQUIRE(e["details"].IsArray());
  REQUIRE(e["details"].Size() == 1);
  const auto &info = e["details"][0];
  CHECK(std::string(info["@type"].GetString()) == "type.googleapis.com/google.rpc.ErrorInfo");
  CHECK(std::string(info["domain"].GetString()) == "a2a-protocol.org");
  out.reason = info["reason"].GetString();
  if (info.HasMember("metadata")) out.field = info["metadata"]["field"].GetString();
  return out;
}

std::string reason_of(const rapidjson::Document &d) {
  REQUIRE_MESSAGE(d.HasMember("error"), to_json(d));
  REQUIRE(d["error"]["data"].IsArray());
  return d["error"]["data"][0]["reason"].GetString();
}

toolnexus::ServerHandle serve_agent(const std::string &agent, toolnexus::StoreSpec store = {}) {
  auto o = test_options();
  o.agent = agent;
  o.store = std::move(store);
  return toolnexus::serve(o);
}

}  // namespace

TEST_CASE("v1.0 SendMessage: wrapped result, TASK_STATE_*, ROLE_*, proto parts, no kind, ms timestamps") {
  auto server = serve_agent("echo");
  Client c(server.url());
  auto d = call_v1(c, "SendMessage", R"({"message":)" + v1_message("hello", "m-1", R"("contextId":"ctx-1")") + "}");
  INFO(c.last().body);
  REQUIRE(d.HasMember("result"));
  CHECK(keys_of(d["result"]) == std::vector<std::string>{"task"});  // SendMessageResponse oneof
  const auto &t = d["result"]["task"];
  const std::string id = t["id"].GetString();
  // Blocking by default: answered when the Task is terminal.
  CHECK(std::string(t["status"]["state"].GetString()) == "TASK_STATE_COMPLETED");
  CHECK(keys_of(t) == std::vector<std::string>{"id", "contextId", "status", "artifacts", "history"});
  CHECK(is_v1_timestamp(t["status"]["timestamp"].GetString()));
  // The user message, byte for byte in the v1.0 shape.
  CHECK(to_json(t["history"][0]) == R"({"messageId":"m-1","contextId":"ctx-1","taskId":)" + q(id) +
                                        R"(,"role":"ROLE_USER","parts":[{"text":"hello"}]})");
  CHECK(t["history"].Size() == 1);
  REQUIRE(t["artifacts"].Size() == 1);
  CHECK(keys_of(t["artifacts"][0]) == std::vector<std::string>{"artifactId", "name", "parts"});
  CHECK(to_json(t["artifacts"][0]["parts"]) == R"([{"text":"hello"}])");
  // Nowhere a v0.3 "kind", a lower-case state or role, or private metadata.
  const std::string body = c.last().body;
  CHECK(body.find("\"kind\"") == std::string::npos);
  CHECK(body.find("toolnexus/") == std::string::npos);
  CHECK(body.find("\"completed\"") == std::string::npos);
  CHECK(c.last().header("content-type").find("application/json") != std::string::npos);

  // returnImmediately: answered at once, before the Task is done.
  auto now = call_v1(c, "SendMessage", R"({"message":)" + v1_message("later", "m-2") +
                                           R"(,"configuration":{"returnImmediately":true}})");
  const std::string state = now["result"]["task"]["status"]["state"].GetString();
  CHECK((state == "TASK_STATE_SUBMITTED" || state == "TASK_STATE_WORKING" || state == "TASK_STATE_COMPLETED"));
  CHECK(!now["result"]["task"].HasMember("metadata"));  // the lease is server-private

  // ProtoJSON parsers accept the proto field names too.
  auto snake = call_v1(c, "SendMessage",
                       R"({"message":{"role":"ROLE_USER","message_id":"m-3","context_id":"ctx-s","parts":[{"text":"s"}]}})");
  CHECK(std::string(snake["result"]["task"]["contextId"].GetString()) == "ctx-s");
}

TEST_CASE("the v0.3 default is blocking too, and blocking:false still answers at once") {
  auto server = serve_agent("echo");
  Client c(server.url());
  auto d = c.call("message/send", R"({"message":{"role":"user","messageId":"a","parts":[{"kind":"text","text":"x"}]}})");
  CHECK(state_of(d) == "completed");
  CHECK(std::string(d["result"]["kind"].GetString()) == "task");  // v0.3: the Task itself is the result
  auto nb = c.send("y");  // the test client sends {"blocking":false}
  CHECK(state_of(nb) == "submitted");
}

TEST_CASE("one stored form: every part written through one dialect reads right through the other") {
  TempDir dir;
  auto server = serve_agent("approval", "file:" + dir.str());
  Client c(server.url());
  const std::string v1_parts =
      // In proto field order (content, metadata, filename, mediaType), the
      // order the server writes, so the round trip is byte for byte.
      R"([{"text":"deploy","metadata":{"lang":"en"},"mediaType":"text/markdown"},)"
      R"({"raw":"aGVsbG8=","filename":"h.bin","mediaType":"application/octet-stream"},)"
      R"({"url":"https://example.com/f.pdf","filename":"f.pdf","mediaType":"application/pdf"},)"
      R"({"data":{"k":[1,2]},"mediaType":"application/json"},{"data":[1,"two"]}])";
  auto sent = call_v1(c, "SendMessage",
                      R"({"message":{"role":"ROLE_USER","messageId":"m-1","parts":)" + v1_parts + "}}");
  REQUIRE_MESSAGE(sent.HasMember("result"), c.last().body);
  const std::string id = sent["result"]["task"]["id"].GetString();
  CHECK(std::string(sent["result"]["task"]["status"]["state"].GetString()) == "TASK_STATE_INPUT_REQUIRED");

  // Read back through v1.0: the same parts, byte for byte.
  auto v1 = call_v1(c, "GetTask", R"({"id":)" + q(id) + "}");
  CHECK(to_json(v1["result"]["history"][0]["parts"]) == v1_parts);

  // Read through v0.3: the stored (v0.3) parts.
  auto v03 = c.get_task(id);
  CHECK(to_json(v03["result"]["history"][0]["parts"]) ==
        R"([{"kind":"text","text":"deploy","mediaType":"text/markdown","metadata":{"lang":"en"}},)"
        R"({"kind":"file","file":{"bytes":"aGVsbG8=","mimeType":"application/octet-stream","name":"h.bin"}},)"
        R"({"kind":"file","file":{"uri":"https://example.com/f.pdf","mimeType":"application/pdf","name":"f.pdf"}},)"
        R"({"kind":"data","data":{"k":[1,2]},"mediaType":"application/json"},)"
        // v0.3 data is an object: a v1.0 value that is not one, wrapped.
        R"({"kind":"data","data":{"value":[1,"two"]},"metadata":{"toolnexus.wrappedValue":true}}])");
  CHECK(std::string(v03["result"]["history"][0]["role"].GetString()) == "user");
  CHECK(std::string(v03["result"]["status"]["state"].GetString()) == "input-required");

  // Continued through v0.3, read through v1.0.
  c.send("approve", R"("taskId":)" + q(id));
  auto done = c.wait_settled(id);
  REQUIRE(state_of(done) == "completed");
  auto v1_done = call_v1(c, "GetTask", R"({"id":)" + q(id) + "}");
  const auto &h = v1_done["result"]["history"];
  REQUIRE(h.Size() == 4);  // request, prompt, approve, "Approved."
  CHECK(std::string(h[2]["role"].GetString()) == "ROLE_USER");
  CHECK(to_json(h[2]["parts"]) == R"([{"text":"approve"}])");
  CHECK(std::string(v1_done["result"]["status"]["state"].GetString()) == "TASK_STATE_COMPLETED");
}

TEST_CASE("historyLength in both dialects: 0 leaves history out in v1.0, N keeps the newest N") {
  auto server = serve_agent("approval");
  Client c(server.url());
  auto d = call_v1(c, "SendMessage", R"({"message":)" + v1_message("one", "m-1") + "}");
  const std::string id = d["result"]["task"]["id"].GetString();
  auto h0 = call_v1(c, "GetTask", R"({"id":)" + q(id) + R"(,"historyLength":0})");
  CHECK(!h0["result"].HasMember("history"));
  auto h1 = call_v1(c, "GetTask", R"({"id":)" + q(id) + R"(,"historyLength":1})");
  REQUIRE(h1["result"]["history"].Size() == 1);
  CHECK(std::string(h1["result"]["history"][0]["role"].GetString()) == "ROLE_AGENT");
  auto all = call_v1(c, "GetTask", R"({"id":)" + q(id) + "}");
  CHECK(all["result"]["history"].Size() == 2);
  auto sent0 = call_v1(c, "SendMessage", R"({"message":)" + v1_message("two", "m-2") +
                                              R"(,"configuration":{"historyLength":0}})");
  CHECK(!sent0["result"]["task"].HasMember("history"));
  // v0.3 shows an empty history for 0.
  CHECK(c.get_task(id, R"("historyLength":0)")["result"]["history"].Size() == 0);
}

TEST_CASE("v1.0 errors carry google.rpc.ErrorInfo with the spec's reasons") {
  auto server = serve_agent("approval");
  Client c(server.url());
  auto nf = call_v1(c, "GetTask", R"({"id":"nope"})", "7");
  CHECK(error_code(nf) == -32001);
  CHECK(to_json(nf["id"]) == "7");
  CHECK(to_json(nf["error"]["data"]) ==
        R"([{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"TASK_NOT_FOUND",)"
        R"("domain":"a2a-protocol.org","metadata":{"field":"params.id"}}])");
  // v0.3 keeps its own error.data.
  CHECK(to_json(c.get_task("nope")["error"]["data"]) == R"({"field":"params.id"})");

  // Cancel: input-required -> canceled; again -> TaskNotCancelable.
  auto d = call_v1(c, "SendMessage", R"({"message":)" + v1_message("x", "m-1") + "}");
  const std::string id = d["result"]["task"]["id"].GetString();
  auto canceled = call_v1(c, "CancelTask", R"({"id":)" + q(id) + "}");
  CHECK(std::string(canceled["result"]["status"]["state"].GetString()) == "TASK_STATE_CANCELED");
  auto again = call_v1(c, "CancelTask", R"({"id":)" + q(id) + "}");
  CHECK(error_code(again) == -32002);
  CHECK(reason_of(again) == "TASK_NOT_CANCELABLE");
  auto late = call_v1(c, "SendMessage", R"({"message":)" + v1_message("approve", "m-2", R"("taskId":)" + q(id)) + "}");
  CHECK(error_code(late) == -32004);
  CHECK(reason_of(late) == "UNSUPPORTED_OPERATION");

  // A v0.3 message under A2A-Version: 1.0, and the other way round.
  auto v03_in_v1 = call_v1(c, "SendMessage",
                           R"({"message":{"role":"user","messageId":"m","parts":[{"kind":"text","text":"x"}]}})");
  CHECK(error_code(v03_in_v1) == -32602);
  CHECK(reason_of(v03_in_v1) == "INVALID_PARAMS");
  CHECK(error_message(v03_in_v1).find("0.3 spelling") != std::string::npos);
  auto v1_in_v03 = c.call("SendMessage", R"({"message":)" + v1_message("x", "m") + "}");
  CHECK(error_code(v1_in_v03) == -32602);
  CHECK(error_message(v1_in_v03).find("A2A-Version: 1.0") != std::string::npos);
  auto two = call_v1(c, "SendMessage",
                     R"({"message":{"role":"ROLE_USER","messageId":"m","parts":[{"text":"a","url":"b"}]}})");
  CHECK(error_code(two) == -32602);
  CHECK(std::string(two["error"]["data"][0]["metadata"]["field"].GetString()) == "params.message.parts[0]");
  auto raw = call_v1(c, "SendMessage",
                     R"({"message":{"role":"ROLE_USER","messageId":"m","parts":[{"raw":"not base64!"}]}})");
  CHECK(std::string(raw["error"]["data"][0]["metadata"]["field"].GetString()) == "params.message.parts[0].raw");
  // A stream of a missing Task: the error before any stream, as plain JSON.
  auto streaming = call_v1(c, "SubscribeToTask", R"({"id":"nope"})");
  CHECK(reason_of(streaming) == "TASK_NOT_FOUND");
  auto method = call_v1(c, "NoSuchMethod", "{}");
  CHECK(error_code(method) == -32601);
  CHECK(reason_of(method) == "METHOD_NOT_FOUND");
}

TEST_CASE("the version comes from the header or the query parameter, never the method name") {
  auto server = serve_agent("echo");
  Client c(server.url());
  const std::string body =
      R"({"jsonrpc":"2.0","id":1,"method":"message/send","params":{"message":)" + v1_message("q", "m") + "}}";
  auto r = c.connection().post(body, "", "/?A2A-Version=1.0");
  auto d = parse(r.body);
  REQUIRE_MESSAGE(d.HasMember("result"), r.body);
  CHECK(std::string(d["result"]["task"]["status"]["state"].GetString()) == "TASK_STATE_COMPLETED");
  // "1" and "1.0.3" are 1.0; "0.2" is v0.3 shapes.
  CHECK(call_v1(c, "ListTasks", "{}").HasMember("result"));
  auto one = c.call("GetTask", R"({"id":)" + q(d["result"]["task"]["id"].GetString()) + "}", "1", "A2A-Version: 1\r\n");
  CHECK(std::string(one["result"]["status"]["state"].GetString()) == "TASK_STATE_COMPLETED");
  auto patch = c.call("ListTasks", "{}", "1", "A2A-Version: 1.0.3\r\n");
  CHECK(std::string(patch["result"]["tasks"][0]["status"]["state"].GetString()) == "TASK_STATE_COMPLETED");
  auto old = c.call("ListTasks", "{}", "1", "A2A-Version: 0.2\r\n");
  CHECK(std::string(old["result"]["tasks"][0]["status"]["state"].GetString()) == "completed");
}

TEST_CASE("tenant: stored with the Task, and a Task is visible only with its tenant") {
  auto server = serve_agent("approval");
  Client c(server.url());
  auto d = call_v1(c, "SendMessage", R"({"tenant":"acme","message":)" + v1_message("x", "m-1") + "}");
  const std::string id = d["result"]["task"]["id"].GetString();
  CHECK(server.store()->get(id)->tenant == "acme");
  CHECK(error_code(call_v1(c, "GetTask", R"({"id":)" + q(id) + "}")) == -32001);
  CHECK(error_code(c.get_task(id)) == -32001);  // v0.3 has no tenant
  CHECK(call_v1(c, "GetTask", R"({"id":)" + q(id) + R"(,"tenant":"acme"})").HasMember("result"));
  CHECK(error_code(call_v1(c, "GetTask", R"({"id":)" + q(id) + R"(,"tenant":"other"})")) == -32001);
  CHECK(call_v1(c, "ListTasks", R"({"tenant":"acme"})")["result"]["totalSize"].GetInt() == 1);
  CHECK(call_v1(c, "ListTasks", "{}")["result"]["totalSize"].GetInt() == 0);
  // HTTP+JSON: the tenant is the first path segment.
  Connection conn(port_of(server.url()));
  CHECK(request(conn, "GET", "/acme/tasks/" + id).status == 200);
  CHECK(request(conn, "GET", "/tasks/" + id).status == 404);
  CHECK(parse(request(conn, "GET", "/acme/tasks").body)["totalSize"].GetInt() == 1);
  // Continuing and canceling need the tenant too.
  CHECK(error_code(call_v1(c, "CancelTask", R"({"id":)" + q(id) + "}")) == -32001);
  auto r = request(conn, "POST", "/acme/tasks/" + id + ":cancel");
  CHECK(r.status == 200);
  CHECK(std::string(parse(r.body)["status"]["state"].GetString()) == "TASK_STATE_CANCELED");
}

TEST_CASE("HTTP+JSON: send, get, cancel, list with filters and pages, and errors mapped to HTTP") {
  auto server = serve_agent("approval");
  Connection conn(port_of(server.url()));
  auto sent = request(conn, "POST", "/message:send",
                      R"({"message":)" + v1_message("ship it", "m-1", R"("contextId":"ctx-r")") + "}");
  REQUIRE_MESSAGE(sent.status == 200, sent.body);
  auto s = parse(sent.body);
  const std::string id = s["task"]["id"].GetString();
  CHECK(std::string(s["task"]["status"]["state"].GetString()) == "TASK_STATE_INPUT_REQUIRED");

  auto got = request(conn, "GET", "/tasks/" + id + "?historyLength=1");
  REQUIRE(got.status == 200);
  auto g = parse(got.body);
  CHECK(g["history"].Size() == 1);
  CHECK(!g.HasMember("kind"));

  // Multi-turn on the same Task id.
  auto approved = request(conn, "POST", "/message:send",
                          R"({"message":)" + v1_message("approve", "m-2", R"("taskId":)" + q(id)) + "}");
  REQUIRE(approved.status == 200);
  CHECK(std::string(parse(approved.body)["task"]["status"]["state"].GetString()) == "TASK_STATE_COMPLETED");
  CHECK(std::string(parse(approved.body)["task"]["id"].GetString()) == id);

  // Canceling a completed Task: 409 FAILED_PRECONDITION (A2A v1.0 section 5.4), TASK_NOT_CANCELABLE.
  auto nc = request(conn, "POST", "/tasks/" + id + ":cancel");
  CHECK(nc.status == 409);
  auto e = rest_error(nc);
  CHECK(e.code == 409);
  CHECK(e.status == "FAILED_PRECONDITION");
  CHECK(e.reason == "TASK_NOT_CANCELABLE");

  // Three more in one context; list by status with pages of 2.
  for (int i = 0; i < 3; ++i)
    REQUIRE(request(conn, "POST", "/message:send",
                    R"({"message":)" + v1_message("t" + std::to_string(i), "n" + std::to_string(i),
                                                  R"("contextId":"ctx-r")") + "}")
                .status == 200);
  auto page1 = parse(request(conn, "GET", "/tasks?contextId=ctx-r&status=TASK_STATE_INPUT_REQUIRED&pageSize=2").body);
  CHECK(page1["totalSize"].GetInt() == 3);
  CHECK(page1["pageSize"].GetInt() == 2);
  REQUIRE(page1["tasks"].Size() == 2);
  CHECK(!page1["tasks"][0].HasMember("artifacts"));
  const std::string token = page1["nextPageToken"].GetString();
  REQUIRE(!token.empty());
  std::string encoded;
  for (char ch : token) {
    if (std::isalnum(static_cast<unsigned char>(ch))) encoded += ch;
    else {
      char buf[4];
      std::snprintf(buf, sizeof buf, "%%%02X", static_cast<unsigned char>(ch));
      encoded += buf;
    }
  }
  auto page2 = parse(request(conn, "GET", "/tasks?contextId=ctx-r&status=TASK_STATE_INPUT_REQUIRED&pageSize=2&pageToken=" +
                                              encoded).body);
  REQUIRE(page2["tasks"].Size() == 1);
  CHECK(std::string(page2["nextPageToken"].GetString()).empty());
  std::set<std::string> seen{page1["tasks"][0]["id"].GetString(), page1["tasks"][1]["id"].GetString(),
                             page2["tasks"][0]["id"].GetString()};
  CHECK(seen.size() == 3);
  CHECK(seen.count(id) == 0);
  auto with_art = parse(request(conn, "GET", "/tasks?status=TASK_STATE_COMPLETED&includeArtifacts=true").body);
  REQUIRE(with_art["tasks"].Size() == 1);
  CHECK(with_art["tasks"][0]["artifacts"].Size() == 1);

  // Errors.
  auto nf = request(conn, "GET", "/tasks/unknown-id");
  CHECK(nf.status == 404);
  CHECK(rest_error(nf).reason == "TASK_NOT_FOUND");
  auto bad_len = request(conn, "GET", "/tasks/" + id + "?historyLength=abc");
  CHECK(bad_len.status == 400);
  auto be = rest_error(bad_len);
  CHECK(be.status == "INVALID_ARGUMENT");
  CHECK(be.reason == "INVALID_PARAMS");
  CHECK(be.field == "historyLength");
  CHECK(be.message.find("historyLength must be an integer") != std::string::npos);
  auto bad_state = request(conn, "GET", "/tasks?status=DONE");
  CHECK(rest_error(bad_state).field == "status");
  auto not_json = request(conn, "POST", "/message:send", "{not json");
  CHECK(not_json.status == 400);
  CHECK(rest_error(not_json).reason == "PARSE_ERROR");
  auto no_body = request(conn, "POST", "/message:send");
  CHECK(no_body.status == 400);
  auto stream = request(conn, "POST", "/tasks/nope:subscribe");
  CHECK(stream.status == 404);
  CHECK(rest_error(stream).reason == "TASK_NOT_FOUND");
  CHECK(rest_error(request(conn, "GET", "/tasks/nope/pushNotificationConfigs")).reason == "TASK_NOT_FOUND");
  auto old = request(conn, "GET", "/tasks/" + id, {}, "A2A-Version: 0.3\r\n");
  CHECK(old.status == 400);
  CHECK(rest_error(old).reason == "VERSION_NOT_SUPPORTED");
  auto wrong = request(conn, "DELETE", "/tasks/" + id);
  CHECK(wrong.status == 405);
  CHECK(wrong.header("allow") == "GET");
  // The connection served all of these.
  CHECK(request(conn, "GET", "/tasks/" + id).status == 200);
  // A base URL with a trailing "/" works as clients join it.
  CHECK(request(conn, "GET", "//tasks/" + id).status == 200);
}

TEST_CASE("the Agent Card serves v1.0 (supportedInterfaces) and v0.3 clients") {
  auto server = serve_agent("echo");
  Connection conn(port_of(server.url()));
  auto r = conn.get("/.well-known/agent-card.json");
  auto card = parse(r.body);
  const std::string base = "http://127.0.0.1/";  // the test client's Host header (a loopback literal)
  const std::string url = card["url"].GetString();
  CHECK(to_json(card["supportedInterfaces"]) ==
        R"([{"url":)" + q(url) + R"(,"protocolBinding":"JSONRPC","protocolVersion":"1.0"},)" +
            R"({"url":)" + q(url.substr(0, url.size() - 1)) + R"(,"protocolBinding":"HTTP+JSON","protocolVersion":"1.0"},)" +
            R"({"url":)" + q(url) + R"(,"protocolBinding":"JSONRPC","protocolVersion":"0.3"}])");
  CHECK(url == base);
  CHECK(std::string(card["protocolVersion"].GetString()) == "0.3.0");
  CHECK(std::string(card["preferredTransport"].GetString()) == "JSONRPC");
  CHECK(card["capabilities"]["extendedAgentCard"].IsFalse());
  CHECK(card["capabilities"]["streaming"].IsTrue());
}

TEST_CASE("server-private metadata is in the store and in no view") {
  auto server = serve_agent("approval");
  Client c(server.url());
  // A client's own metadata is kept and shown.
  auto d = c.call("SendMessage", R"({"message":{"role":"user","messageId":"m","parts":[{"kind":"text","text":"x"}]}})");
  const std::string id = task_id(d);
  REQUIRE(state_of(d) == "input-required");
  auto stored = stored_task(server, id);
  REQUIRE(stored["metadata"].HasMember("toolnexus/pending"));
  // Plant a public member beside the private one, as an embedding program might.
  {
    auto rec = server.store()->get(id);
    toolnexus::Task t = rec->task();
    auto &a = t.allocator();
    t.json()["metadata"].AddMember("team", "ops", a);
    toolnexus::SaveOptions so;
    so.owner = rec->owner;
    server.store()->save(t, so);
  }
  const std::vector<std::string> bodies = {
      to_json(c.get_task(id)),                                      // v0.3 fast path
      to_json(c.get_task(id, R"("historyLength":1)")),             // v0.3 through a DOM
      to_json(call_v1(c, "GetTask", R"({"id":)" + q(id) + "}")),  // v1.0
      to_json(c.call("ListTasks", "{}")), to_json(call_v1(c, "ListTasks", "{}")),
  };
  for (const auto &b : bodies) {
    INFO(b);
    CHECK(b.find("toolnexus/") == std::string::npos);
    CHECK(b.find(R"("metadata":{"team":"ops"})") != std::string::npos);
  }
}

TEST_CASE("v1.0 timestamps are right before 1582 and 1970 too (milliseconds, floored)") {
  auto server = serve_agent("echo");
  Client c(server.url());
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"0001-01-01T00:00:00.5Z", "0001-01-01T00:00:00.500Z"},
      {"1000-01-01T12:34:56.789999Z", "1000-01-01T12:34:56.789Z"},
      {"1500-06-15T23:59:59.9999Z", "1500-06-15T23:59:59.999Z"},
      {"1969-12-31T23:59:59.9999Z", "1969-12-31T23:59:59.999Z"},
      {"2026-03-12T10:00:00.123456+01:00", "2026-03-12T09:00:00.123Z"},
  };
  int n = 0;
  for (const auto &[stored, shown] : cases) {
    CAPTURE(stored);
    const std::string id = "old-" + std::to_string(++n);
    server.store()->save(toolnexus::Task::parse(R"({"id":")" + id + R"(","contextId":"c","status":{"state":"completed","timestamp":")" +
                                                stored + R"("},"kind":"task"})"));
    auto d = call_v1(c, "GetTask", R"({"id":)" + q(id) + "}");
    REQUIRE(d.HasMember("result"));
    CHECK(std::string(d["result"]["status"]["timestamp"].GetString()) == shown);
  }
}

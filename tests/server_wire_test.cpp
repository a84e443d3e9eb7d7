// Wire details found by real clients and schema checks (issue 18, item 6),
// over raw HTTP: v0.3 parts are refused without "kind" and stored without
// members a strict parser would trip on; a v1.0 data part that is no object
// has a valid v0.3 form; the Agent Card carries Cache-Control and a strong
// ETag and answers a matching If-None-Match with 304; v1.0 input accepts the
// proto field names (task_id) beside the JSON names (taskId).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include "server_test_support.hpp"

#include <regex>

using namespace tnxtest;

namespace {

const std::string kV1 = "A2A-Version: 1.0\r\n";

toolnexus::ServerHandle serve_agent(const std::string &agent) {
  auto o = test_options();
  o.agent = agent;
  return toolnexus::serve(o);
}

// error.data.field of a v0.3 error.
std::string v03_field(const rapidjson::Document &d) {
  REQUIRE_MESSAGE(d.HasMember("error"), to_json(d));
  REQUIRE_MESSAGE(d["error"].HasMember("data"), to_json(d));
  return d["error"]["data"]["field"].GetString();
}

// The ErrorInfo's metadata.field of a v1.0 error.
std::string v1_field(const rapidjson::Document &d) {
  REQUIRE_MESSAGE(d.HasMember("error"), to_json(d));
  REQUIRE_MESSAGE(d["error"]["data"].IsArray(), to_json(d));
  return d["error"]["data"][0]["metadata"]["field"].GetString();
}

// v0.3 message/send params with the given parts (blocking: the echo agent
// answers with the Task done).
std::string v03_send(const std::string &parts) {
  return R"({"message":{"role":"user","messageId":"m-1","parts":)" + parts + "}}";
}

// An HTTP request with any method and extra header lines.
HttpResponse request(Connection &conn, const std::string &method, const std::string &path,
                     const std::string &headers = {}, const std::string &body = {}) {
  std::string req = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n" + headers;
  if (!body.empty()) req += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  req += "\r\n" + body;
  REQUIRE(conn.send_raw(req));
  return conn.read_response();
}

}  // namespace

TEST_CASE("v0.3: a part without kind is refused like kind:\"bogus\", naming the field") {
  auto server = serve_agent("echo");
  Client c(server.url());
  auto bogus = c.call("message/send", v03_send(R"([{"kind":"bogus","text":"x"}])"));
  CHECK(error_code(bogus) == -32602);
  CHECK(v03_field(bogus) == "params.message.parts[0].kind");

  auto plain = c.call("message/send", v03_send(R"([{"kind":"text","text":"a"},{"text":"plain"}])"));
  CHECK(error_code(plain) == -32602);
  CHECK(v03_field(plain) == "params.message.parts[1].kind");
  // It says what to send, and that a v1.0 part needs the header.
  CHECK(error_message(plain).find("\"kind\"") != std::string::npos);
  CHECK(error_message(plain).find("A2A-Version: 1.0") != std::string::npos);
  for (const char *p : {R"([{"data":{"a":1}}])", R"([{"file":{"uri":"https://example.com/f"}}])"}) {
    auto d = c.call("message/send", v03_send(p));
    CHECK(error_code(d) == -32602);
    CHECK(v03_field(d) == "params.message.parts[0].kind");
  }
  // Nothing was stored.
  auto list = c.call("ListTasks", "{}");
  CHECK(list["result"]["tasks"].Size() == 0);
}

TEST_CASE("v0.3: members a part does not define are not stored, nor served back") {
  auto server = serve_agent("echo");
  Client c(server.url());
  const std::string parts =
      R"([{"kind":"text","text":"hi","file":{"uri":"https://example.com/x"},"extra":[1],"metadata":{"k":"v"}},)"
      R"({"kind":"file","file":{"uri":"https://example.com/f.pdf","mimeType":"application/pdf","name":"f.pdf","size":3},"text":"t"},)"
      R"({"kind":"data","data":{"a":{"b_c":1}},"raw":"aGk=","mediaType":"application/json"}])";
  auto d = c.call("message/send", v03_send(parts));
  REQUIRE_MESSAGE(d.HasMember("result"), c.last().body);
  const std::string id = task_id(d);
  const std::string kept =
      R"([{"kind":"text","text":"hi","metadata":{"k":"v"}},)"
      R"({"kind":"file","file":{"uri":"https://example.com/f.pdf","mimeType":"application/pdf","name":"f.pdf"}},)"
      R"({"kind":"data","data":{"a":{"b_c":1}},"mediaType":"application/json"}])";
  CHECK(to_json(d["result"]["history"][0]["parts"]) == kept);
  CHECK(to_json(c.get_task(id)["result"]["history"][0]["parts"]) == kept);
  CHECK(to_json(stored_task(server, id)["history"][0]["parts"]) == kept);

  // Members of the wrong type are refused, naming them.
  auto md = c.call("message/send", v03_send(R"([{"kind":"text","text":"x","metadata":[1]}])"));
  CHECK(error_code(md) == -32602);
  CHECK(v03_field(md) == "params.message.parts[0].metadata");
  auto both = c.call("message/send",
                     v03_send(R"([{"kind":"file","file":{"uri":"https://example.com/f","bytes":"aGk="}}])"));
  CHECK(error_code(both) == -32602);
  CHECK(v03_field(both) == "params.message.parts[0].file");
}

TEST_CASE("a v1.0 data part that is not an object reads as a valid v0.3 DataPart, and round-trips in v1.0") {
  auto server = serve_agent("echo");
  Client c(server.url());
  const std::string v1_parts =
      R"([{"data":[1,2,3]},{"data":"s","metadata":{"k":1}},{"data":null},{"data":{"value":5}},)"
      R"({"data":{"a":1},"mediaType":"application/json"}])";
  auto sent = c.call("SendMessage", R"({"message":{"role":"ROLE_USER","messageId":"m-1","parts":)" + v1_parts + "}}",
                     "1", kV1);
  REQUIRE_MESSAGE(sent.HasMember("result"), c.last().body);
  const std::string id = sent["result"]["task"]["id"].GetString();
  CHECK(to_json(sent["result"]["task"]["history"][0]["parts"]) == v1_parts);
  auto v1 = c.call("GetTask", R"({"id":)" + q(id) + "}", "2", kV1);
  CHECK(to_json(v1["result"]["history"][0]["parts"]) == v1_parts);

  // v0.3: every DataPart's data is an object; a wrapped value says so in
  // the part's metadata.
  auto v03 = c.get_task(id);
  CHECK(to_json(v03["result"]["history"][0]["parts"]) ==
        R"([{"kind":"data","data":{"value":[1,2,3]},"metadata":{"toolnexus.wrappedValue":true}},)"
        R"({"kind":"data","data":{"value":"s"},"metadata":{"k":1,"toolnexus.wrappedValue":true}},)"
        R"({"kind":"data","data":{"value":null},"metadata":{"toolnexus.wrappedValue":true}},)"
        R"({"kind":"data","data":{"value":5}},)"
        R"({"kind":"data","data":{"a":1},"mediaType":"application/json"}])");

  // The marker is the server's: a v1.0 client may not send it.
  auto reserved = c.call("SendMessage",
                         R"({"message":{"role":"ROLE_USER","messageId":"m-2","parts":)"
                         R"([{"data":{"value":1},"metadata":{"toolnexus.wrappedValue":true}}]}})",
                         "3", kV1);
  CHECK(error_code(reserved) == -32602);
  CHECK(v1_field(reserved) == "params.message.parts[0].metadata.toolnexus.wrappedValue");
}

TEST_CASE("the Agent Card: Cache-Control max-age, a strong ETag, and 304 for a matching If-None-Match") {
  auto server = serve_agent("echo");
  Connection conn(port_of(server.url()));
  const std::string path = "/.well-known/agent-card.json";
  const HttpResponse first = request(conn, "GET", path);
  REQUIRE(first.status == 200);
  CHECK(first.header("cache-control") == "public, max-age=300");
  // The url follows no forwarded header here; CORS fields follow Origin.
  CHECK(first.header("vary") == "Origin");
  const std::string etag = first.header("etag");
  static const std::regex strong(R"("[0-9a-f]{64}")");
  CHECK_MESSAGE(std::regex_match(etag, strong), etag);
  // The same bytes, the same tag; the older path too.
  CHECK(request(conn, "GET", path).header("etag") == etag);
  const HttpResponse old = request(conn, "GET", "/.well-known/agent.json");
  CHECK(old.body == first.body);
  CHECK(old.header("etag") == etag);
  CHECK(old.header("cache-control") == "public, max-age=300");
  // Other bytes (the url follows a loopback Host name), another tag.
  Connection conn2(port_of(server.url()));
  REQUIRE(conn2.send_raw("GET " + path + " HTTP/1.1\r\nHost: localhost:" + std::to_string(port_of(server.url())) +
                         "\r\n\r\n"));
  const HttpResponse other = conn2.read_response();
  REQUIRE(other.status == 200);
  REQUIRE(other.body != first.body);
  CHECK(other.header("etag") != etag);

  // If-None-Match (RFC 9110 section 13.1.2): the tag, the tag in a list,
  // its weak form (weak comparison), "*": 304 with the tag and no body.
  for (const std::string &inm : {etag, "\"x\", " + etag, "\"x\"," + etag + " ,\"y\"", "W/" + etag, std::string("*")}) {
    CAPTURE(inm);
    const HttpResponse r = request(conn, "GET", path, "If-None-Match: " + inm + "\r\n");
    CHECK(r.status == 304);
    CHECK(r.body.empty());
    CHECK(r.header("etag") == etag);
    CHECK(r.header("cache-control") == "public, max-age=300");
  }
  const HttpResponse head = request(conn, "HEAD", path, "If-None-Match: " + etag + "\r\n");
  CHECK(head.status == 304);
  // No match: the card.
  for (const std::string &inm : {std::string("\"x\""), std::string("\"") + etag + "\"", std::string("W/\"x\"")}) {
    CAPTURE(inm);
    const HttpResponse r = request(conn, "GET", path, "If-None-Match: " + inm + "\r\n");
    CHECK(r.status == 200);
    CHECK(r.body == first.body);
  }
  // The connection still serves requests after the bodiless 304s.
  CHECK(request(conn, "GET", path).status == 200);
}

TEST_CASE("the card's max-age is configurable") {
  auto o = test_options();
  o.card.cache_max_age_s = 60;
  auto server = toolnexus::serve(o);
  Connection conn(port_of(server.url()));
  CHECK(request(conn, "GET", "/.well-known/agent-card.json").header("cache-control") == "public, max-age=60");
}

TEST_CASE("v1.0 input: proto field names beside JSON names, on JSON-RPC and HTTP+JSON; output stays camelCase") {
  auto server = serve_agent("echo");
  Client c(server.url());
  // Proto names at every level of SendMessage: message, configuration.
  auto sent = c.call("SendMessage",
                     R"({"message":{"role":"ROLE_USER","message_id":"m-1","context_id":"ctx-p",)"
                     R"("parts":[{"text":"hi","media_type":"text/markdown"},{"data":{"a_b":1}}],"metadata":{"my_key":1}},)"
                     R"("configuration":{"history_length":0,"accepted_output_modes":["text/plain"]}})",
                     "1", kV1);
  REQUIRE_MESSAGE(sent.HasMember("result"), c.last().body);
  const auto &t = sent["result"]["task"];
  const std::string id = t["id"].GetString();
  CHECK(std::string(t["contextId"].GetString()) == "ctx-p");
  CHECK(!t.HasMember("history"));  // history_length 0
  auto got = c.call("GetTask", R"({"id":)" + q(id) + "}", "2", kV1);
  const auto &m = got["result"]["history"][0];
  CHECK(std::string(m["messageId"].GetString()) == "m-1");
  // Free-form values (metadata, data) keep their keys as sent.
  CHECK(to_json(m["metadata"]) == R"({"my_key":1})");
  CHECK(to_json(m["parts"]) == R"([{"text":"hi","mediaType":"text/markdown"},{"data":{"a_b":1}}])");
  CHECK(c.last().body.find("_id") == std::string::npos);

  auto short_history = c.call("GetTask", R"({"id":)" + q(id) + R"(,"history_length":0})", "3", kV1);
  CHECK(!short_history["result"].HasMember("history"));
  c.call("SendMessage", R"({"message":{"role":"ROLE_USER","messageId":"m-2","parts":[{"text":"x"}]}})", "4", kV1);
  auto page = c.call("ListTasks", R"({"context_id":"ctx-p","page_size":1,"include_artifacts":true})", "5", kV1);
  REQUIRE_MESSAGE(page.HasMember("result"), c.last().body);
  CHECK(page["result"]["tasks"].Size() == 1);
  CHECK(page["result"]["totalSize"].GetInt() == 1);
  CHECK(page["result"]["tasks"][0].HasMember("artifacts"));

  // Both names of one field: refused, naming it.
  auto twice = c.call("GetTask", R"({"id":)" + q(id) + R"(,"historyLength":1,"history_length":0})", "6", kV1);
  CHECK(error_code(twice) == -32602);
  CHECK(v1_field(twice) == "params.historyLength");
  CHECK(error_message(twice).find("history_length") != std::string::npos);
  auto twice_m = c.call("SendMessage",
                        R"({"message":{"role":"ROLE_USER","messageId":"a","message_id":"b","parts":[{"text":"x"}]}})",
                        "7", kV1);
  CHECK(error_code(twice_m) == -32602);
  CHECK(v1_field(twice_m) == "params.message.messageId");

  // HTTP+JSON: the body and the query.
  Connection conn(port_of(server.url()));
  const std::string body =
      R"({"message":{"role":"ROLE_USER","message_id":"m-3","context_id":"ctx-r","parts":[{"text":"r"}]},)"
      R"("configuration":{"return_immediately":false}})";
  const HttpResponse rest = request(conn, "POST", "/message:send", {}, body);
  REQUIRE_MESSAGE(rest.status == 200, rest.body);
  auto rd = parse(rest.body);
  CHECK(std::string(rd["task"]["contextId"].GetString()) == "ctx-r");
  CHECK(std::string(rd["task"]["status"]["state"].GetString()) == "TASK_STATE_COMPLETED");
  const HttpResponse listed = request(conn, "GET", "/tasks?context_id=ctx-r&page_size=5");
  REQUIRE_MESSAGE(listed.status == 200, listed.body);
  CHECK(parse(listed.body)["tasks"].Size() == 1);
  const HttpResponse both = request(conn, "GET", "/tasks?pageSize=1&page_size=5");
  CHECK(both.status == 400);
  CHECK(both.body.find("pageSize") != std::string::npos);

  // v0.3 is JSON Schema, camelCase only: there proto names mean nothing.
  auto v03 = c.call("GetTask", R"({"id":)" + q(id) + R"(,"history_length":0})");
  CHECK(v03["result"]["history"].Size() >= 1);
}

// Wire details found by real clients and schema checks (issue 18, item 6),
// over raw HTTP: v0.3 parts are refused without "kind" and stored without
// members a strict parser would trip on.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include "server_test_support.hpp"

#include <regex>

using namespace tnxtest;

namespace {

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

// v0.3 message/send params with the given parts (blocking: the echo agent
// answers with the Task done).
std::string v03_send(const std::string &parts) {
  return R"({"message":{"role":"user","messageId":"m-1","parts":)" + parts + "}}";
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


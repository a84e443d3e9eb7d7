// Bearer authentication and owner scoping: two principals who cannot see
// each other's Tasks; 401 with WWW-Authenticate; the card stays public and
// declares the scheme; tokens never reach the log.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include "server_test_support.hpp"

#include <fstream>
#include <mutex>

using namespace tnxtest;

namespace {

const std::string kAliceToken = "alice-secret-token-4f1d9c";
const std::string kBobToken = "bob-secret-token-77aa01";

struct Logged {
  std::mutex mu;
  std::string text;
};

}  // namespace

TEST_CASE("two principals cannot see each other's Tasks") {
  TempDir dir;
  {
    std::ofstream f(dir.path / "tokens.json");
    f << R"({")" << kAliceToken << R"(": "alice", ")" << kBobToken << R"(": "bob"})";
  }
  auto log = std::make_shared<Logged>();
  auto o = test_options();
  o.agent = "approval";
  o.auth_tokens = toolnexus::load_auth_tokens(dir.path / "tokens.json");
  REQUIRE(o.auth_tokens.size() == 2);
  o.log_level = toolnexus::LogLevel::debug;
  o.log_sink = [log](toolnexus::LogLevel, std::string_view line) {
    std::lock_guard<std::mutex> lock(log->mu);
    log->text.append(line).append("\n");
  };
  toolnexus::ServerHandle server = toolnexus::serve(o);

  SUBCASE("no or a wrong token: 401 with WWW-Authenticate; the card stays public") {
    Connection conn(port_of(server.url()));
    auto r = conn.post(R"({"jsonrpc":"2.0","id":1,"method":"ListTasks"})");
    CHECK(r.status == 401);
    CHECK(r.header("www-authenticate").find("Bearer") == 0);
    Connection conn2(port_of(server.url()));
    r = conn2.post(R"({"jsonrpc":"2.0","id":1,"method":"ListTasks"})", "Authorization: Bearer nope\r\n");
    CHECK(r.status == 401);
    Connection conn3(port_of(server.url()));
    r = conn3.post(R"({"jsonrpc":"2.0","id":1,"method":"ListTasks"})", "Authorization: Basic " + kAliceToken + "\r\n");
    CHECK(r.status == 401);
    Connection conn4(port_of(server.url()));
    auto card = conn4.get("/.well-known/agent-card.json");
    REQUIRE(card.status == 200);
    auto c = parse(card.body);
    CHECK(std::string(c["securitySchemes"]["bearer"]["type"].GetString()) == "http");
    CHECK(std::string(c["securitySchemes"]["bearer"]["scheme"].GetString()) == "bearer");
    CHECK(c["security"][0].HasMember("bearer"));
    // The scheme word is case-insensitive.
    Connection conn5(port_of(server.url()));
    r = conn5.post(R"({"jsonrpc":"2.0","id":1,"method":"ListTasks"})", "Authorization: bearer " + kAliceToken + "\r\n");
    CHECK(r.status == 200);
  }

  SUBCASE("GetTask, CancelTask, SendMessage and ListTasks only see the caller's own Tasks") {
    Client alice(server.url(), kAliceToken);
    Client bob(server.url(), kBobToken);
    const std::string a1 = task_id(alice.send("alice's request"));
    REQUIRE(state_of(alice.wait_settled(a1)) == "input-required");
    const std::string b1 = task_id(bob.send("bob's request"));
    REQUIRE(state_of(bob.wait_settled(b1)) == "input-required");

    // The owner is the ABI record's owner field.
    CHECK(server.store()->get(a1)->owner == "alice");
    CHECK(server.store()->get(b1)->owner == "bob");

    // Bob asking for Alice's Task gets exactly what a missing Task gets.
    auto theirs = bob.get_task(a1);
    auto missing = bob.get_task("00000000-0000-4000-8000-000000000000");
    CHECK(error_code(theirs) == -32001);
    CHECK(error_code(missing) == -32001);
    CHECK(error_message(theirs) == "Task '" + a1 + "' not found");
    CHECK(error_message(missing) == "Task '00000000-0000-4000-8000-000000000000' not found");
    CHECK(to_json(theirs["error"]["data"]) == to_json(missing["error"]["data"]));

    CHECK(error_code(bob.call("CancelTask", R"({"id":)" + q(a1) + "}")) == -32001);
    CHECK(error_code(bob.send("approve", R"("taskId":)" + q(a1))) == -32001);
    CHECK(state_of(alice.get_task(a1)) == "input-required");  // untouched

    auto bob_list = bob.call("ListTasks", "{}");
    REQUIRE(bob_list["result"]["tasks"].Size() == 1);
    CHECK(std::string(bob_list["result"]["tasks"][0]["id"].GetString()) == b1);
    CHECK(bob_list["result"]["totalSize"].GetUint64() == 1);
    auto alice_list = alice.call("ListTasks", "{}");
    REQUIRE(alice_list["result"]["tasks"].Size() == 1);
    CHECK(std::string(alice_list["result"]["tasks"][0]["id"].GetString()) == a1);

    // Alice continues her own Task; the owner is kept through every save.
    alice.send("approve", R"("taskId":)" + q(a1));
    auto done = alice.wait_settled(a1);
    CHECK(state_of(done) == "completed");
    CHECK(artifact_text(done["result"]) == "alice's request");
    CHECK(server.store()->get(a1)->owner == "alice");
    CHECK(error_code(bob.get_task(a1)) == -32001);

    // Bob cancels his own.
    CHECK(state_of(bob.call("CancelTask", R"({"id":)" + q(b1) + "}")) == "canceled");
    CHECK(server.store()->get(b1)->owner == "bob");
  }

  server.stop();
  std::lock_guard<std::mutex> lock(log->mu);
  CHECK(log->text.find("principal=alice") != std::string::npos);  // requests are logged...
  CHECK(log->text.find(kAliceToken) == std::string::npos);        // ...tokens never
  CHECK(log->text.find(kBobToken) == std::string::npos);
}

TEST_CASE("the token file is checked") {
  TempDir dir;
  auto write = [&](const std::string &text) {
    std::ofstream f(dir.path / "t.json");
    f << text;
  };
  write("[]");
  CHECK_THROWS_WITH_AS(toolnexus::load_auth_tokens(dir.path / "t.json"), doctest::Contains("JSON object"),
                       std::runtime_error);
  write(R"({"tok": ""})");
  CHECK_THROWS_AS(toolnexus::load_auth_tokens(dir.path / "t.json"), std::runtime_error);
  write(R"({"secret-in-error": 3})");
  try {
    toolnexus::load_auth_tokens(dir.path / "t.json");
    FAIL("no exception");
  } catch (const std::runtime_error &e) {
    CHECK(std::string(e.what()).find("secret-in-error") == std::string::npos);
  }
  CHECK_THROWS_AS(toolnexus::load_auth_tokens(dir.path / "missing.json"), std::runtime_error);
}

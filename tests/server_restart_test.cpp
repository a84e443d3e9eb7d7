// The seed's example 2 across a real restart: a Task parked in
// input-required by the approval agent survives the server being stopped,
// is input-required in <dir>/<id>.json, and a NEW server on the same
// directory resumes it to completed from what is persisted alone.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include "server_test_support.hpp"

#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <vector>

using namespace tnxtest;

namespace {

std::string read_file(const std::filesystem::path &p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

TEST_CASE("an input-required Task survives a restart and is resumed by the next server") {
  TempDir dir;
  std::string id, context_id;
  {
    auto o = test_options();
    o.store = "file:" + dir.str();
    o.agent = "approval";
    toolnexus::ServerHandle server = toolnexus::serve(o);
    Client c(server.url());
    auto sent = c.send("go");
    id = task_id(sent);
    context_id = sent["result"]["contextId"].GetString();
    CHECK(state_of(sent) == "submitted");
    CHECK(id.size() == 36);  // a server-made UUID

    auto final = c.wait_settled(id);
    REQUIRE(state_of(final) == "input-required");
    const std::string prompt = status_text(final["result"]);
    CHECK(prompt.find("Approval required") != std::string::npos);
    CHECK(prompt.find("\"go\"") != std::string::npos);
    // The pending request is in the stored Task itself; clients never see it.
    CHECK(!final["result"].HasMember("metadata"));
    const auto stored = stored_task(server, id);
    const auto &pending = stored["metadata"]["toolnexus/pending"];
    CHECK(std::string(pending["data"]["originalText"].GetString()) == "go");
    CHECK(!stored["metadata"].HasMember("toolnexus/lease"));
    server.stop();
  }

  // "restart": with no live server, the file is on disk and input-required.
  const auto file = dir.path / (id + ".json");
  REQUIRE(std::filesystem::exists(file));
  auto on_disk = parse(read_file(file));
  CHECK(std::string(on_disk["id"].GetString()) == id);
  CHECK(std::string(on_disk["status"]["state"].GetString()) == "input-required");
  CHECK(on_disk["history"].Size() == 2);

  // A new server (new instance id) on the same directory.
  auto o = test_options();
  o.store = toolnexus::resolve_store("file:" + dir.str());
  o.agent = "approval";
  toolnexus::ServerHandle server = toolnexus::serve(o);
  Client c(server.url());
  CHECK(state_of(c.get_task(id)) == "input-required");

  auto resumed = c.send("approve", R"("taskId":)" + q(id) + R"(,"contextId":)" + q(context_id));
  REQUIRE_MESSAGE(resumed.HasMember("result"), to_json(resumed));
  CHECK(task_id(resumed) == id);
  auto done = c.wait_settled(id);
  REQUIRE(state_of(done) == "completed");
  const auto &t = done["result"];
  CHECK(artifact_text(t) == "go");
  CHECK(std::string(t["contextId"].GetString()) == context_id);
  REQUIRE(t["history"].Size() == 4);
  CHECK(std::string(t["history"][0]["parts"][0]["text"].GetString()) == "go");
  CHECK(std::string(t["history"][1]["role"].GetString()) == "agent");
  CHECK(std::string(t["history"][2]["parts"][0]["text"].GetString()) == "approve");
  CHECK(std::string(t["history"][3]["role"].GetString()) == "agent");
  CHECK(!t.HasMember("metadata"));  // lease and pending request are gone
  server.stop();

  // And the completed Task is what is on disk.
  auto after = parse(read_file(file));
  CHECK(std::string(after["status"]["state"].GetString()) == "completed");
  CHECK(artifact_text(after) == "go");
}

TEST_CASE("approval: deny rejects, anything else asks again, and both spellings of the methods work") {
  auto o = test_options();
  o.agent = "approval";
  toolnexus::ServerHandle server = toolnexus::serve(o);
  Client c(server.url());

  auto first = c.send("ship it");
  const std::string id = task_id(first);
  REQUIRE(state_of(c.wait_settled(id)) == "input-required");

  c.send("maybe?", R"("taskId":)" + q(id));
  auto again = c.wait_settled(id);
  REQUIRE(state_of(again) == "input-required");
  CHECK(status_text(again["result"]).find("Please answer") != std::string::npos);
  CHECK(!again["result"].HasMember("metadata"));
  CHECK(std::string(stored_task(server, id)["metadata"]["toolnexus/pending"]["data"]["originalText"].GetString()) ==
        "ship it");

  // v0.3 spelling: message/send, tasks/get.
  auto no = c.call("message/send", R"({"message":{"role":"user","messageId":"x1","taskId":)" + q(id) +
                                        R"(,"parts":[{"kind":"text","text":"  No "}]}})");
  REQUIRE_MESSAGE(no.HasMember("result"), to_json(no));
  const auto deadline = Clock::now() + 5s;
  std::string state;
  while (Clock::now() < deadline) {
    auto g = c.call("tasks/get", R"({"id":)" + q(id) + "}");
    state = state_of(g);
    if (state != "working") break;
    std::this_thread::sleep_for(2ms);
  }
  CHECK(state == "rejected");
  auto final = c.get_task(id);
  CHECK(status_text(final["result"]).find("Denied") != std::string::npos);
  CHECK(!final["result"].HasMember("artifacts"));
}

TEST_CASE("one unreadable task file does not take ListTasks away: it is left out and logged") {
  TempDir dir;
  auto o = test_options();
  o.store = "file:" + dir.str();
  o.agent = "echo";
  auto lines = std::make_shared<std::vector<std::string>>();
  auto mu = std::make_shared<std::mutex>();
  o.log_sink = [lines, mu](toolnexus::LogLevel, std::string_view text) {
    std::lock_guard<std::mutex> l(*mu);
    lines->emplace_back(text);
  };
  toolnexus::ServerHandle server = toolnexus::serve(o);
  Client c(server.url());
  const std::string a = task_id(c.send("one"));
  const std::string b = task_id(c.send("two"));
  REQUIRE(state_of(c.wait_settled(a)) == "completed");
  REQUIRE(state_of(c.wait_settled(b)) == "completed");
  {
    std::ofstream broken(dir.path / (b + ".json"), std::ios::binary | std::ios::trunc);
    broken << R"({"id": ")" << b << R"(", broken)";
  }
  auto listed = c.call("ListTasks", "{}", "1");
  REQUIRE_MESSAGE(listed.HasMember("result"), to_json(listed));
  const auto &tasks = listed["result"]["tasks"];
  REQUIRE(tasks.Size() == 1);
  CHECK(std::string(tasks[0]["id"].GetString()) == a);
  CHECK(listed["result"]["totalSize"].GetUint64() == 1);
  // Not silent: the log names the file and says what to run.
  bool logged = false;
  {
    std::lock_guard<std::mutex> l(*mu);
    for (const auto &line : *lines)
      logged = logged || (line.find("ListTasks left out an unreadable record") != std::string::npos &&
                          line.find(b + ".json") != std::string::npos &&
                          line.find("toolnexus store check") != std::string::npos);
  }
  CHECK(logged);
  // The Task itself still answers with an error, never as something else.
  auto got = c.get_task(b);
  REQUIRE(got.HasMember("error"));
  CHECK(got["error"]["code"].GetInt() == -32603);
  server.stop();
}

TEST_CASE("a stored record that is not a valid A2A Task (no status, no contextId) is never served as a Task") {
  auto o = test_options();
  o.agent = "echo";
  auto lines = std::make_shared<std::vector<std::string>>();
  auto mu = std::make_shared<std::mutex>();
  o.log_sink = [lines, mu](toolnexus::LogLevel, std::string_view text) {
    std::lock_guard<std::mutex> l(*mu);
    lines->emplace_back(text);
  };
  toolnexus::ServerHandle server = toolnexus::serve(o);
  Client c(server.url());
  const std::string good = task_id(c.send("one"));
  REQUIRE(state_of(c.wait_settled(good)) == "completed");
  // What `toolnexus store put` refuses, saved past it (the store's own
  // contract is only "an object with an id"): a hand-made file, an old tool.
  server.store()->save(toolnexus::Task::parse(R"({"id":"bare"})"));
  server.store()->save(toolnexus::Task::parse(R"({"id":"no-ctx","status":{"state":"working"}})"));
  auto logged = [&](const std::string &a, const std::string &b) {
    std::lock_guard<std::mutex> l(*mu);
    for (const auto &line : *lines)
      if (line.find(a) != std::string::npos && line.find(b) != std::string::npos) return true;
    return false;
  };
  const std::string why_bare =
      "stored task 'bare' is not a valid A2A Task: \"contextId\" is required (a non-empty string); \"status\" with a "
      "\"state\" is required, e.g. {\"state\":\"submitted\"}";
  // GetTask: the error a corrupt record gets, in every view (the v0.3 fast
  // path without a DOM, historyLength, v1.0), and the log says why.
  for (const std::string &more : {std::string(), std::string(R"("historyLength":1)")}) {
    auto got = c.get_task("bare", more);
    REQUIRE_MESSAGE(got.HasMember("error"), to_json(got));
    CHECK(got["error"]["code"].GetInt() == -32603);
    CHECK(error_message(got) == "internal error: the task store failed (corrupt); details are in the server log");
  }
  auto v1 = c.call("GetTask", R"({"id":"no-ctx"})", "1", "A2A-Version: 1.0\r\n");
  REQUIRE_MESSAGE(v1.HasMember("error"), to_json(v1));
  CHECK(logged(why_bare, "GetTask"));
  CHECK(logged("stored task 'no-ctx' is not a valid A2A Task: \"contextId\" is required", "GetTask"));
  // Nor through the other methods that read a stored Task.
  CHECK(error_code(c.call("CancelTask", R"({"id":"bare"})")) == -32603);
  CHECK(error_code(c.send("more", R"("taskId":"bare")")) == -32603);
  // ListTasks leaves it out and logs it, naming it and what is missing.
  auto listed = c.call("ListTasks", "{}");
  REQUIRE_MESSAGE(listed.HasMember("result"), to_json(listed));
  REQUIRE(listed["result"]["tasks"].Size() == 1);
  CHECK(std::string(listed["result"]["tasks"][0]["id"].GetString()) == good);
  CHECK(logged("ListTasks left out an unreadable record", why_bare));
  // The record itself is left as it is: nothing rewrote it.
  CHECK(server.store()->get("bare")->json == R"({"id":"bare"})");
  server.stop();
}

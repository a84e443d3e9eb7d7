// 16 clients sending at once: no Task is lost, none is duplicated, every one
// completes with its own text.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include "server_test_support.hpp"

#include <mutex>
#include <set>

using namespace tnxtest;

TEST_CASE("16 concurrent clients, no lost Task") {
  constexpr int kClients = 16;
  constexpr int kEach = 40;
  auto o = test_options();
  toolnexus::ServerHandle server = toolnexus::serve(o);

  std::mutex mu;
  std::map<std::string, std::string> sent;  // id -> text
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      try {
        Client client(server.url());
        for (int i = 0; i < kEach; ++i) {
          const std::string text = "client " + std::to_string(c) + " message " + std::to_string(i);
          auto d = client.send(text);
          if (!d.HasMember("result")) {
            ++failures;
            continue;
          }
          std::lock_guard<std::mutex> lock(mu);
          sent.emplace(d["result"]["id"].GetString(), text);
        }
      } catch (...) {
        ++failures;
      }
    });
  }
  for (auto &t : threads) t.join();
  REQUIRE(failures == 0);
  REQUIRE(sent.size() == kClients * kEach);  // distinct ids

  Client c(server.url());
  // Every Task completes with its own text.
  for (const auto &[id, text] : sent) {
    auto d = c.wait_settled(id);
    REQUIRE(state_of(d) == "completed");
    CHECK(artifact_text(d["result"]) == text);
  }
  // And ListTasks pages through exactly these, newest first.
  std::set<std::string> listed;
  std::string token;
  int64_t previous = INT64_MAX;
  int pages = 0;
  do {
    auto page = c.call("ListTasks", R"({"pageSize":100,"pageToken":)" + q(token) + "}");
    REQUIRE(page.HasMember("result"));
    CHECK(page["result"]["totalSize"].GetUint64() == kClients * kEach);
    for (const auto &t : page["result"]["tasks"].GetArray()) {
      listed.insert(t["id"].GetString());
      int64_t us = 0;
      REQUIRE(toolnexus::parse_timestamp(t["status"]["timestamp"].GetString(), us));
      CHECK(us <= previous);
      previous = us;
    }
    token = page["result"]["nextPageToken"].GetString();
    ++pages;
  } while (!token.empty() && pages < 100);
  CHECK(pages == (kClients * kEach + 99) / 100);
  CHECK(listed.size() == sent.size());
  for (const auto &kv : sent) CHECK(listed.count(kv.first) == 1);
}

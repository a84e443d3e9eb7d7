// The methods' behaviour: GetTask historyLength, ListTasks filters and
// paging, blocking SendMessage, executor failures, and the Agent Card.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include "server_test_support.hpp"

#include <ifaddrs.h>
#include <net/if.h>

#include <mutex>
#include <set>

using namespace tnxtest;

namespace {

class Thrower final : public toolnexus::AgentExecutor {
 public:
  std::string name() const override { return "thrower"; }
  std::vector<toolnexus::AgentSkill> skills() const override {
    return {toolnexus::AgentSkill{"boom", "Boom", "Always fails.", {"test"}, {}}};
  }
  toolnexus::ExecutionResult execute(const toolnexus::ExecutionContext &ctx) override {
    if (ctx.latest_text == "fail politely") return toolnexus::ExecutionResult::failed("could not do it");
    throw std::runtime_error("kaboom");
  }
};

}  // namespace

TEST_CASE("SendMessage: a new Task, blocking, contextId kept, historyLength") {
  auto server = toolnexus::serve(test_options());
  Client c(server.url());

  auto d = c.send("hello", R"("contextId":"my-context")", R"({"blocking":true})");
  REQUIRE(state_of(d) == "completed");  // blocking: answered when terminal
  const auto &t = d["result"];
  CHECK(std::string(t["contextId"].GetString()) == "my-context");
  CHECK(std::string(t["kind"].GetString()) == "task");
  CHECK(artifact_text(t) == "hello");
  CHECK(std::string(t["history"][0]["taskId"].GetString()) == t["id"].GetString());
  CHECK(std::string(t["history"][0]["contextId"].GetString()) == "my-context");
  int64_t us = 0;
  CHECK(toolnexus::parse_timestamp(t["status"]["timestamp"].GetString(), us));

  auto nb = c.send("later");
  CHECK(state_of(nb) == "submitted");  // answered at once
  CHECK(nb["result"]["contextId"].GetStringLength() == 36);  // a new context
  CHECK(std::string(nb["result"]["contextId"].GetString()) != "my-context");
  // The lease is server-private (server_lease_test reads it from the store).
  CHECK(!nb["result"].HasMember("metadata"));

  auto h0 = c.send("no history please", "", R"({"blocking":true,"historyLength":0})");
  CHECK(h0["result"]["history"].Size() == 0);
}

TEST_CASE("GetTask honours historyLength") {
  auto o = test_options();
  o.agent = "approval";
  auto server = toolnexus::serve(o);
  Client c(server.url());
  const std::string id = task_id(c.send("one"));
  c.wait_settled(id);
  c.send("two", R"("taskId":)" + q(id));
  c.wait_settled(id);  // input-required again: history one, prompt, two, prompt
  auto all = c.get_task(id);
  REQUIRE(all["result"]["history"].Size() == 4);
  auto none = c.get_task(id, R"("historyLength":0)");
  CHECK(none["result"]["history"].Size() == 0);
  auto last2 = c.get_task(id, R"("historyLength":2)");
  REQUIRE(last2["result"]["history"].Size() == 2);
  CHECK(std::string(last2["result"]["history"][0]["parts"][0]["text"].GetString()) == "two");
  auto more = c.get_task(id, R"("historyLength":100)");
  CHECK(more["result"]["history"].Size() == 4);
}

TEST_CASE("ListTasks: filters, newest first, cursor, artifacts only when asked") {
  auto server = toolnexus::serve(test_options());
  Client c(server.url());
  std::vector<std::string> ctx_a, ctx_b;
  for (int i = 0; i < 5; ++i) {
    ctx_a.push_back(task_id(c.send("a" + std::to_string(i), R"("contextId":"ctx-a")", R"({"blocking":true})")));
    std::this_thread::sleep_for(2ms);
  }
  const std::string between = toolnexus::format_timestamp(toolnexus::now_us());
  std::this_thread::sleep_for(2ms);
  for (int i = 0; i < 3; ++i)
    ctx_b.push_back(task_id(c.send("b" + std::to_string(i), R"("contextId":"ctx-b")", R"({"blocking":true})")));

  auto all = c.call("ListTasks", "{}");
  REQUIRE(all["result"]["tasks"].Size() == 8);
  CHECK(all["result"]["totalSize"].GetUint64() == 8);
  CHECK(all["result"]["pageSize"].GetInt() == 50);
  CHECK(std::string(all["result"]["nextPageToken"].GetString()).empty());
  // Newest first.
  CHECK(std::string(all["result"]["tasks"][0]["id"].GetString()) == ctx_b.back());
  CHECK(std::string(all["result"]["tasks"][7]["id"].GetString()) == ctx_a.front());
  // Artifacts left out unless asked.
  CHECK(!all["result"]["tasks"][0].HasMember("artifacts"));
  auto with = c.call("ListTasks", R"({"includeArtifacts":true,"historyLength":0})");
  CHECK(artifact_text(with["result"]["tasks"][0]) == "b2");
  CHECK(with["result"]["tasks"][0]["history"].Size() == 0);

  auto a = c.call("ListTasks", R"({"contextId":"ctx-a"})");
  CHECK(a["result"]["tasks"].Size() == 5);
  CHECK(a["result"]["totalSize"].GetUint64() == 5);
  auto after = c.call("ListTasks", R"({"statusTimestampAfter":)" + q(between) + "}");
  CHECK(after["result"]["tasks"].Size() == 3);
  auto completed = c.call("ListTasks", R"({"status":"completed"})");
  CHECK(completed["result"]["tasks"].Size() == 8);
  auto completed_v1 = c.call("ListTasks", R"({"status":"TASK_STATE_COMPLETED"})");
  CHECK(completed_v1["result"]["tasks"].Size() == 8);
  auto working = c.call("tasks/list", R"({"status":"working"})");
  CHECK(working["result"]["tasks"].Size() == 0);
  CHECK(working["result"]["totalSize"].GetUint64() == 0);

  // Paging: 3 + 3 + 2, then an empty token.
  std::set<std::string> seen;
  std::string token;
  std::vector<size_t> sizes;
  do {
    auto page = c.call("ListTasks", R"({"pageSize":3,"pageToken":)" + q(token) + "}");
    CHECK(page["result"]["pageSize"].GetInt() == 3);
    sizes.push_back(page["result"]["tasks"].Size());
    for (const auto &t : page["result"]["tasks"].GetArray()) seen.insert(t["id"].GetString());
    token = page["result"]["nextPageToken"].GetString();
  } while (!token.empty() && sizes.size() < 10);
  CHECK(sizes == std::vector<size_t>{3, 3, 2});
  CHECK(seen.size() == 8);
}

TEST_CASE("an executor error never crashes the server: the Task fails with the error") {
  auto o = test_options();
  o.executor = std::make_shared<Thrower>();
  auto server = toolnexus::serve(o);
  Client c(server.url());
  auto d = c.send("anything", "", R"({"blocking":true})");
  REQUIRE(state_of(d) == "failed");
  CHECK(status_text(d["result"]).find("kaboom") != std::string::npos);
  d = c.send("fail politely", "", R"({"blocking":true})");
  REQUIRE(state_of(d) == "failed");
  CHECK(status_text(d["result"]) == "could not do it");
  auto card = parse(c.connection().get("/.well-known/agent-card.json").body);
  CHECK(std::string(card["skills"][0]["id"].GetString()) == "boom");
}

TEST_CASE("the Agent Card") {
  auto o = test_options();
  o.card.name = "Approver";
  o.card.description = "Asks before it acts.";
  o.card.version = "2.3.4";
  o.agent = "approval";

  SUBCASE("fields, and the url as the client reached the server") {
    auto server = toolnexus::serve(o);
    Connection conn(port_of(server.url()));
    auto card = parse(conn.get("/.well-known/agent-card.json").body);
    CHECK(std::string(card["name"].GetString()) == "Approver");
    CHECK(std::string(card["description"].GetString()) == "Asks before it acts.");
    CHECK(std::string(card["version"].GetString()) == "2.3.4");
    CHECK(std::string(card["protocolVersion"].GetString()) == "0.3.0");
    CHECK(std::string(card["preferredTransport"].GetString()) == "JSONRPC");
    CHECK(!card.HasMember("provider"));
    CHECK(!card.HasMember("securitySchemes"));
    CHECK(card["capabilities"]["pushNotifications"].GetBool() == true);
    CHECK(card["capabilities"]["streaming"].GetBool() == true);
    CHECK(std::string(card["defaultInputModes"][0].GetString()) == "text/plain");
    CHECK(std::string(card["defaultOutputModes"][0].GetString()) == "text/plain");
    CHECK(std::string(card["skills"][0]["id"].GetString()) == "approval");
    // The test client's Host: 127.0.0.1, a loopback name on a loopback connection.
    CHECK(std::string(card["url"].GetString()) == "http://127.0.0.1/");
  }
  SUBCASE("provider only when configured; a public url overrides") {
    o.card.provider_organization = "Example Org";
    o.card.provider_url = "https://example.org";
    o.card.public_url = "https://public.example/a2a/";
    auto server = toolnexus::serve(o);
    Connection conn(port_of(server.url()));
    auto card = parse(conn.get("/.well-known/agent-card.json").body);
    CHECK(std::string(card["provider"]["organization"].GetString()) == "Example Org");
    CHECK(std::string(card["provider"]["url"].GetString()) == "https://example.org");
    CHECK(std::string(card["url"].GetString()) == "https://public.example/a2a/");
  }
}

namespace {

// GET the card with exactly these header lines (Host included or not: a
// request without Host is HTTP/1.0, since HTTP/1.1 requires one).
std::string card_url_for(int port, const std::string &headers) {
  Connection conn(port);
  const char *version = headers.find("Host:") == std::string::npos ? "HTTP/1.0" : "HTTP/1.1";
  REQUIRE(conn.send_raw(std::string("GET /.well-known/agent-card.json ") + version + "\r\n" + headers + "\r\n"));
  auto r = conn.read_response();
  REQUIRE(r.status == 200);
  auto card = parse(r.body);
  const std::string url = card["url"].GetString();
  // Every interface of the card says the same.
  CHECK(std::string(card["supportedInterfaces"][0]["url"].GetString()) == url);
  CHECK(std::string(card["additionalInterfaces"][0]["url"].GetString()) == url);
  return url;
}

// A non-loopback IPv4 address of this machine ("" when it has none).
std::string non_loopback_ipv4() {
  ifaddrs *list = nullptr;
  if (::getifaddrs(&list) != 0) return {};
  std::string found;
  for (ifaddrs *i = list; i != nullptr && found.empty(); i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET || (i->ifa_flags & IFF_LOOPBACK) != 0) continue;
    char text[INET_ADDRSTRLEN] = {};
    const auto *a = reinterpret_cast<const sockaddr_in *>(i->ifa_addr);
    if (::inet_ntop(AF_INET, &a->sin_addr, text, sizeof text) != nullptr) found = text;
  }
  ::freeifaddrs(list);
  return found;
}

// GET the card over a connection to `ip`:`port` with `headers`.
std::string card_url_via(const std::string &ip, int port, const std::string &headers) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  REQUIRE(::inet_pton(AF_INET, ip.c_str(), &a.sin_addr) == 1);
  REQUIRE(::connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0);
  const std::string req = "GET /.well-known/agent-card.json HTTP/1.1\r\n" + headers + "Connection: close\r\n\r\n";
  REQUIRE(::send(fd, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size()));
  std::string in;
  char buf[8192];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) in.append(buf, static_cast<std::size_t>(n));
  ::close(fd);
  const auto body = in.find("\r\n\r\n");
  REQUIRE(body != std::string::npos);
  return parse(in.substr(body + 4))["url"].GetString();
}

}  // namespace

TEST_CASE("the card's url: a forged Host or forwarded header never makes it point elsewhere") {
  auto o = test_options();
  SUBCASE("by default: forwarded headers are ignored, Host only when it names this server") {
    auto server = toolnexus::serve(o);
    const int port = port_of(server.url());
    const std::string self = "http://127.0.0.1:" + std::to_string(port) + "/";
    // A forged Host: the local address the request arrived on.
    CHECK(card_url_for(port, "Host: evil.example\r\n") == self);
    CHECK(card_url_for(port, "Host: evil.example:" + std::to_string(port) + "\r\n") == self);
    // Forwarded headers from a client: ignored, whatever they say.
    CHECK(card_url_for(port, "Host: evil.example\r\nX-Forwarded-Proto: https\r\nX-Forwarded-Host: evil.example\r\n") ==
          self);
    CHECK(card_url_for(port, "Host: 127.0.0.1:" + std::to_string(port) +
                                 "\r\nForwarded: for=1.2.3.4;proto=https;host=\"evil.example\"\r\n") == self);
    // No Host at all (HTTP/1.1 requires one; the reactor lets it through).
    CHECK(card_url_for(port, "") == self);
    // Names of this server: its own address and port, and loopback names on
    // a loopback connection (what local clients and the JS SDKs send).
    CHECK(card_url_for(port, "Host: 127.0.0.1:" + std::to_string(port) + "\r\n") == self);
    CHECK(card_url_for(port, "Host: localhost:" + std::to_string(port) + "\r\n") ==
          "http://localhost:" + std::to_string(port) + "/");
    CHECK(card_url_for(port, "Host: LocalHost:9999\r\n") == "http://LocalHost:9999/");  // an ssh tunnel, say
    CHECK(card_url_for(port, "Host: 127.0.0.2\r\n") == "http://127.0.0.2/");
    CHECK(card_url_for(port, "Host: [::1]:8080\r\n") == "http://[::1]:8080/");
    // Look-alikes are not loopback names.
    CHECK(card_url_for(port, "Host: localhost.evil.example\r\n") == self);
    CHECK(card_url_for(port, "Host: 127.0.0.1.evil.example\r\n") == self);
    CHECK(card_url_for(port, "Host: 127.1\r\n") == self);
    // Not a host[:port] at all: 400 (issue 19), the card's too.
    Connection bad(port);
    REQUIRE(bad.send_raw("GET /.well-known/agent-card.json HTTP/1.1\r\nHost: a\"b<c>\r\n\r\n"));
    CHECK(bad.read_response().status == 400);
  }
  SUBCASE("allowed hosts: the names the operator lists, with or without a port") {
    o.card.allowed_hosts = {"agents.example.com", "edge.example:8443"};
    auto server = toolnexus::serve(o);
    const int port = port_of(server.url());
    const std::string self = "http://127.0.0.1:" + std::to_string(port) + "/";
    CHECK(card_url_for(port, "Host: agents.example.com\r\n") == "http://agents.example.com/");
    CHECK(card_url_for(port, "Host: Agents.Example.COM:8080\r\n") == "http://Agents.Example.COM:8080/");
    CHECK(card_url_for(port, "Host: edge.example:8443\r\n") == "http://edge.example:8443/");
    CHECK(card_url_for(port, "Host: edge.example\r\n") == self);  // port 80 is not 8443
    CHECK(card_url_for(port, "Host: edge.example:9443\r\n") == self);
    CHECK(card_url_for(port, "Host: evil.agents.example.com\r\n") == self);
    // Still no forwarded headers without trust_forwarded.
    CHECK(card_url_for(port, "Host: agents.example.com\r\nX-Forwarded-Proto: https\r\n") ==
          "http://agents.example.com/");
  }
  SUBCASE("trust_forwarded: a proxy in front says how clients reached it") {
    o.card.trust_forwarded = true;
    auto server = toolnexus::serve(o);
    const int port = port_of(server.url());
    const std::string self = "http://127.0.0.1:" + std::to_string(port) + "/";
    const std::string host = "Host: 127.0.0.1:" + std::to_string(port) + "\r\n";
    CHECK(card_url_for(port, host + "X-Forwarded-Proto: https\r\nX-Forwarded-Host: agents.example.com\r\n") ==
          "https://agents.example.com/");
    CHECK(card_url_for(port, host + "Forwarded: for=1.2.3.4;proto=https;host=\"edge.example:8443\", for=5.6.7.8\r\n"
                                    "X-Forwarded-Host: other.example\r\n") == "https://edge.example:8443/");
    // A malformed forwarded host is ignored; the Host rules apply, and this
    // server's own address is plain http whatever the proxy says.
    CHECK(card_url_for(port, host + "X-Forwarded-Proto: https\r\nX-Forwarded-Host: a\"b<c>\r\n") == self);
    CHECK(card_url_for(port, "Host: evil.example\r\nX-Forwarded-Proto: https\r\n") == self);
  }
  SUBCASE("trust_forwarded with allowed hosts: forwarded hosts must be listed too") {
    o.card.trust_forwarded = true;
    o.card.allowed_hosts = {"agents.example.com"};
    auto server = toolnexus::serve(o);
    const int port = port_of(server.url());
    const std::string self = "http://127.0.0.1:" + std::to_string(port) + "/";
    CHECK(card_url_for(port, "Host: x\r\nX-Forwarded-Proto: https\r\nX-Forwarded-Host: agents.example.com\r\n") ==
          "https://agents.example.com/");
    CHECK(card_url_for(port, "Host: x\r\nX-Forwarded-Proto: https\r\nX-Forwarded-Host: evil.example\r\n") == self);
    // A proxy that passes the client's Host on: listed names only, with its scheme.
    CHECK(card_url_for(port, "Host: agents.example.com\r\nX-Forwarded-Proto: https\r\n") ==
          "https://agents.example.com/");
  }
  SUBCASE("public_url wins over every header") {
    o.card.public_url = "https://public.example/a2a/";
    o.card.trust_forwarded = true;
    o.card.allowed_hosts = {"agents.example.com"};
    auto server = toolnexus::serve(o);
    const int port = port_of(server.url());
    CHECK(card_url_for(port, "Host: agents.example.com\r\nX-Forwarded-Host: agents.example.com\r\n") ==
          "https://public.example/a2a/");
  }
  SUBCASE("a connection that is not on loopback: loopback names are not this server") {
    const std::string ip = non_loopback_ipv4();
    if (ip.empty()) {
      MESSAGE("no non-loopback IPv4 address on this machine; skipped");
      return;
    }
    o.listen = "0.0.0.0:0";
    auto server = toolnexus::serve(o);
    const int port = port_of(server.url());
    const std::string self = "http://" + ip + ":" + std::to_string(port) + "/";
    CHECK(card_url_via(ip, port, "Host: localhost:" + std::to_string(port) + "\r\n") == self);
    CHECK(card_url_via(ip, port, "Host: 127.0.0.1\r\n") == self);
    CHECK(card_url_via(ip, port, "Host: evil.example\r\n") == self);
    CHECK(card_url_via(ip, port, "Host: " + ip + ":" + std::to_string(port) + "\r\n") == self);
    // A wildcard listener: the address this connection arrived on, not 0.0.0.0.
    CHECK(card_url_via("127.0.0.1", port, "Host: evil.example\r\n") ==
          "http://127.0.0.1:" + std::to_string(port) + "/");
  }
}

TEST_CASE("serve() refuses what it cannot run") {
  auto o = test_options();
  o.store = "nosuchscheme:somewhere";
  CHECK_THROWS_WITH_AS(toolnexus::serve(o), doctest::Contains("nosuchscheme"), std::invalid_argument);
  o = test_options();
  o.agent = "nosuchagent";
  CHECK_THROWS_WITH_AS(toolnexus::serve(o), doctest::Contains("approval, echo"), std::invalid_argument);
  o = test_options();
  o.listen = "127.0.0.1";
  CHECK_THROWS_AS(toolnexus::serve(o), std::invalid_argument);
  // A port in use.
  auto first = toolnexus::serve(test_options());
  o = test_options();
  o.listen = "127.0.0.1:" + std::to_string(first.port());
  CHECK_THROWS_WITH_AS(toolnexus::serve(o), doctest::Contains("cannot listen"), std::runtime_error);
}

TEST_CASE("a full queue slows SendMessage down, then answers busy without creating a Task") {
  struct Gate final : toolnexus::AgentExecutor {
    std::string name() const override { return "gate"; }
    std::vector<toolnexus::AgentSkill> skills() const override { return {}; }
    toolnexus::ExecutionResult execute(const toolnexus::ExecutionContext &ctx) override {
      while (!released && !ctx.cancel_requested) std::this_thread::sleep_for(1ms);
      return toolnexus::ExecutionResult::completed();
    }
    std::atomic<bool> released{false};
  };
  auto gate = std::make_shared<Gate>();
  auto o = test_options();
  o.executor = gate;
  o.workers = 1;
  o.limits.max_queued_tasks = 2;
  o.limits.queue_wait_ms = 150;
  auto server = toolnexus::serve(o);
  Client c(server.url());
  std::vector<std::string> ids;
  ids.push_back(task_id(c.send("running")));
  REQUIRE(eventually([&] { return state_of(c.get_task(ids[0])) == "working"; }));
  ids.push_back(task_id(c.send("queued 1")));
  ids.push_back(task_id(c.send("queued 2")));
  const auto t0 = Clock::now();
  auto busy = c.send("one too many");
  CHECK(Clock::now() - t0 >= 140ms);  // it waited for room first
  CHECK(error_code(busy) == -32603);
  CHECK(error_message(busy).find("busy") != std::string::npos);
  CHECK(c.call("ListTasks", "{}")["result"]["totalSize"].GetUint64() == 3);
  // Room appears while a sender waits: it gets in.
  std::thread later([&] {
    std::this_thread::sleep_for(50ms);
    gate->released = true;
  });
  auto admitted = c.send("admitted after waiting");
  later.join();
  REQUIRE(admitted.HasMember("result"));
  ids.push_back(task_id(admitted));
  for (const auto &id : ids) CHECK(state_of(c.wait_settled(id)) == "completed");
}

namespace {

// A store that refuses to save completed Tasks (a full disk, say).
class FailingStore final : public toolnexus::TaskStore {
 public:
  explicit FailingStore(std::shared_ptr<toolnexus::TaskStore> inner) : inner_(std::move(inner)) {}
  std::optional<toolnexus::TaskRecord> get(std::string_view id) override { return inner_->get(id); }
  void remove(std::string_view id, uint64_t expected) override { inner_->remove(id, expected); }
  toolnexus::ListPage list(const toolnexus::ListQuery &q) override { return inner_->list(q); }
  toolnexus::StoreInfo info() const override { return inner_->info(); }

 protected:
  uint64_t do_save(const toolnexus::TaskRecord &rec, uint64_t expected) override {
    if (rec.state == "completed") throw toolnexus::StoreError(toolnexus::Status::io, "disk full (test)");
    toolnexus::SaveOptions so;
    so.expected_version = expected;
    so.owner = rec.owner;
    so.tenant = rec.tenant;
    return inner_->save(rec.task(), so);
  }

 private:
  std::shared_ptr<toolnexus::TaskStore> inner_;
};

}  // namespace

TEST_CASE("a store error during fulfilment is logged and surfaces as the Task's state") {
  auto store = std::make_shared<FailingStore>(toolnexus::resolve_store("memory"));
  auto errors = std::make_shared<std::string>();
  auto mu = std::make_shared<std::mutex>();
  auto o = test_options();
  o.store = store;
  o.log_sink = [errors, mu](toolnexus::LogLevel level, std::string_view line) {
    std::lock_guard<std::mutex> lock(*mu);
    if (level == toolnexus::LogLevel::error) errors->append(line).append("\n");
  };
  auto server = toolnexus::serve(o);
  Client c(server.url());
  auto d = c.send("will not fit", "", R"({"blocking":true})");
  REQUIRE(state_of(d) == "failed");
  CHECK(status_text(d["result"]).find("the task store failed (io)") != std::string::npos);
  CHECK(status_text(d["result"]).find("disk full") == std::string::npos);  // details stay in the log
  CHECK(!d["result"].HasMember("metadata"));
  std::lock_guard<std::mutex> lock(*mu);
  CHECK(errors->find("disk full (test)") != std::string::npos);
}

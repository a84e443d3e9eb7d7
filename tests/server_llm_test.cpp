// The llm agent (toolnexus/llm_executor.hpp) against a fake OpenAI-compatible
// chat completions endpoint written here (a Poco HTTPServer on loopback, with
// TLS for the https cases): no network.
//
// The seed's example 2 ("the realistic case") runs through the real
// `toolnexus serve --agent llm` program: the model asks for `authorize`, the
// Task is input-required in its file on disk, the server is stopped, the file
// is still input-required, and the next server resumes it to completed.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include "server_test_support.hpp"

#include "toolnexus/llm_executor.hpp"

#include <Poco/Net/Context.h>
#include <Poco/Net/HTTPRequestHandler.h>
#include <Poco/Net/HTTPRequestHandlerFactory.h>
#include <Poco/Net/HTTPServer.h>
#include <Poco/Net/HTTPServerParams.h>
#include <Poco/Net/HTTPServerRequest.h>
#include <Poco/Net/HTTPServerResponse.h>
#include <Poco/Net/SSLManager.h>
#include <Poco/Net/SecureServerSocket.h>
#include <Poco/Net/ServerSocket.h>
#include <Poco/StreamCopier.h>
#include <Poco/ThreadPool.h>

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <fstream>
#include <mutex>
#include <regex>
#include <sstream>

extern char **environ;

using namespace tnxtest;

namespace {

// A self-signed certificate for 127.0.0.1 and localhost (EC P-256, valid
// 2000-01-01 to 2999-12-31, CA:true), made for this test only.
constexpr const char *kTestCert = R"(-----BEGIN CERTIFICATE-----
MIIBWjCCAQGgAwIBAgIUOXlANaPleEfPM8UzEqj7TkmzE7cwCgYIKoZIzj0EAwIw
FDESMBAGA1UEAwwJMTI3LjAuMC4xMCAXDTAwMDEwMTAwMDAwMFoYDzI5OTkxMjMx
MDAwMDAwWjAUMRIwEAYDVQQDDAkxMjcuMC4wLjEwWTATBgcqhkjOPQIBBggqhkjO
PQMBBwNCAAQrUIBFbs0C8SPR0VRwReHiNAnnCJKE5BYbyXXJGqU0k365EYHLIGsc
KGFe2LtFMupDj0VjkcQR2qpoEVs8Ec/toy8wLTAaBgNVHREEEzARhwR/AAABggls
b2NhbGhvc3QwDwYDVR0TAQH/BAUwAwEB/zAKBggqhkjOPQQDAgNHADBEAiA0s0Pa
A+tN+XmnpRVlA0+7qO+68X66YHVBJsLxfpubIgIgWrnZRolkvtgADcIfh3y5lRAl
Z1MA+B4ff1l86MBPQHM=
-----END CERTIFICATE-----
)";
constexpr const char *kTestKey = R"(-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgrU0kHh6Yxgdhvm6L
2UtjABMNWMDiIu5g4s/L8rJFvtihRANCAAQrUIBFbs0C8SPR0VRwReHiNAnnCJKE
5BYbyXXJGqU0k365EYHLIGscKGFe2LtFMupDj0VjkcQR2qpoEVs8Ec/t
-----END PRIVATE KEY-----
)";

void write_file(const std::filesystem::path &p, const std::string &text) {
  std::ofstream out(p, std::ios::binary);
  out << text;
  REQUIRE_MESSAGE(out.good(), "cannot write " << p);
}

std::string read_file(const std::filesystem::path &p) {
  std::ifstream in(p, std::ios::binary);
  REQUIRE_MESSAGE(in.good(), "cannot read " << p);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// ---- the fake chat completions endpoint --------------------------------------

struct FakeReply {
  FakeReply(int s = 200, std::string b = {}, std::map<std::string, std::string> h = {}, int delay = 0)
      : status(s), body(std::move(b)), headers(std::move(h)), delay_ms(delay) {}
  int status;
  std::string body;
  std::map<std::string, std::string> headers;
  /// Waits this long before answering.
  int delay_ms;
};

/// {"choices":[{"message":{"role":"assistant","content":TEXT},"finish_reason":"stop"}]}
std::string answer(const std::string &text, const std::string &finish = "stop") {
  return R"({"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":)" +
         q(text) + R"(},"finish_reason":)" + q(finish) +
         R"(}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}})";
}

struct Call {
  std::string id, name, arguments;
};

/// An assistant message asking for `calls` (the seed's llm_plug).
std::string tool_calls(const std::vector<Call> &calls) {
  std::string tc;
  for (const Call &c : calls) {
    if (!tc.empty()) tc += ",";
    tc += R"({"id":)" + q(c.id) + R"(,"type":"function","function":{"name":)" + q(c.name) + R"(,"arguments":)" +
          q(c.arguments) + "}}";
  }
  return R"({"choices":[{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[)" + tc +
         R"(]},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}})";
}

/// A chat completions endpoint on 127.0.0.1 that answers with `script(n,
/// request)` (n = 0 for the first request) and records every request.
class FakeLlm {
 public:
  using Script = std::function<FakeReply(std::size_t n, const rapidjson::Document &request)>;

  struct Seen {
    std::string method, uri, authorization, body;
  };

  explicit FakeLlm(Script script, bool tls = false) : script_(std::move(script)), tls_(tls) {
    auto params = new Poco::Net::HTTPServerParams;
    params->setMaxThreads(8);
    params->setKeepAlive(false);
    if (tls) {
      static std::once_flag once;
      std::call_once(once, [] { Poco::Net::initializeSSL(); });
      write_file(dir_.path / "cert.pem", kTestCert);
      write_file(dir_.path / "key.pem", kTestKey);
      Poco::Net::Context::Ptr ctx =
          new Poco::Net::Context(Poco::Net::Context::TLS_SERVER_USE, (dir_.path / "key.pem").string(),
                                 (dir_.path / "cert.pem").string(), "", Poco::Net::Context::VERIFY_NONE);
      Poco::Net::SecureServerSocket sock(Poco::Net::SocketAddress("127.0.0.1", 0), 64, ctx);
      port_ = sock.address().port();
      server_ = std::make_unique<Poco::Net::HTTPServer>(new Factory(*this), pool_, sock, params);
    } else {
      Poco::Net::ServerSocket sock(Poco::Net::SocketAddress("127.0.0.1", 0));
      port_ = sock.address().port();
      server_ = std::make_unique<Poco::Net::HTTPServer>(new Factory(*this), pool_, sock, params);
    }
    server_->start();
  }
  ~FakeLlm() {
    server_->stopAll(true);
    server_.reset();
    // The connection threads end here (not at exit), so OpenSSL frees their
    // per-thread state and LeakSanitizer sees no leak.
    pool_.stopAll();
  }

  /// "http://127.0.0.1:PORT/v1" (https with tls).
  std::string base_url() const {
    return std::string(tls_ ? "https" : "http") + "://127.0.0.1:" + std::to_string(port_) + "/v1";
  }
  /// The certificate's file (for llm.ca_file).
  std::string cert_file() const { return (dir_.path / "cert.pem").string(); }

  std::size_t count() {
    std::lock_guard<std::mutex> lock(mu_);
    return seen_.size();
  }
  Seen seen(std::size_t i) {
    std::lock_guard<std::mutex> lock(mu_);
    REQUIRE(i < seen_.size());
    return seen_[i];
  }
  /// The JSON body of request i.
  rapidjson::Document request(std::size_t i) { return parse(seen(i).body); }

 private:
  struct Handler : Poco::Net::HTTPRequestHandler {
    explicit Handler(FakeLlm &f) : fake(f) {}
    void handleRequest(Poco::Net::HTTPServerRequest &req, Poco::Net::HTTPServerResponse &resp) override {
      try {
        std::string body;
        Poco::StreamCopier::copyToString(req.stream(), body);
        std::size_t n = 0;
        {
          std::lock_guard<std::mutex> lock(fake.mu_);
          n = fake.seen_.size();
          fake.seen_.push_back(Seen{req.getMethod(), req.getURI(), req.get("Authorization", ""), body});
        }
        rapidjson::Document d;
        d.Parse(body.data(), body.size());
        const FakeReply r = fake.script_(n, d);
        if (r.delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(r.delay_ms));
        resp.setStatusAndReason(static_cast<Poco::Net::HTTPResponse::HTTPStatus>(r.status));
        for (const auto &h : r.headers) resp.set(h.first, h.second);
        resp.setContentType("application/json");
        resp.setContentLength(static_cast<std::streamsize>(r.body.size()));
        resp.send() << r.body;
      } catch (...) {
        // The client gave up (a timeout test): nothing to answer.
      }
    }
    FakeLlm &fake;
  };
  struct Factory : Poco::Net::HTTPRequestHandlerFactory {
    explicit Factory(FakeLlm &f) : fake(f) {}
    Poco::Net::HTTPRequestHandler *createRequestHandler(const Poco::Net::HTTPServerRequest &) override {
      return new Handler(fake);
    }
    FakeLlm &fake;
  };

  TempDir dir_;
  Poco::ThreadPool pool_{2, 16};
  Script script_;
  bool tls_;
  uint16_t port_ = 0;
  std::unique_ptr<Poco::Net::HTTPServer> server_;
  std::mutex mu_;
  std::vector<Seen> seen_;
};

toolnexus::LlmOptions options_for(const FakeLlm &fake, std::vector<toolnexus::LlmTool> tools = {}) {
  toolnexus::LlmOptions o;
  o.base_url = fake.base_url();
  o.model = "test-model";
  o.tools = std::move(tools);
  o.timeout_ms = 5000;
  o.retry_initial_ms = 10;
  o.retry_max_ms = 50;
  return o;
}

toolnexus::LlmTool tool(const std::string &name, bool approval, const std::string &result = {},
                        const std::string &params = R"({"type":"object","properties":{}})") {
  toolnexus::LlmTool t;
  t.name = name;
  t.description = "the " + name + " tool";
  t.needs_approval = approval;
  t.result = result;
  t.parameters_json = params;
  return t;
}

/// An in-process server with the llm agent on `store`.
toolnexus::ServerHandle llm_server(toolnexus::LlmOptions o, toolnexus::StoreSpec store = {}) {
  toolnexus::ServerOptions so = test_options();
  so.store = std::move(store);
  so.executor = toolnexus::make_llm_executor(std::move(o));
  return toolnexus::serve(std::move(so));
}

/// messages[i] of a recorded request as compact JSON.
std::string message_json(const rapidjson::Document &req, rapidjson::SizeType i) {
  REQUIRE(req.HasMember("messages"));
  REQUIRE(i < req["messages"].Size());
  return to_json(req["messages"][i]);
}

// ---- the real program ---------------------------------------------------------

const std::string kExe = std::string(TOOLNEXUS_BIN_DIR) + "/toolnexus";

/// `toolnexus ARGS...` as a child process with its stdout and stderr piped.
struct Program {
  pid_t pid = -1;
  int out = -1, err = -1;
  std::string out_buf, err_buf;

  explicit Program(const std::vector<std::string> &args) {
    int o[2], e[2];
    REQUIRE(::pipe(o) == 0);
    REQUIRE(::pipe(e) == 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, o[1], 1);
    posix_spawn_file_actions_adddup2(&fa, e[1], 2);
    posix_spawn_file_actions_addclose(&fa, o[0]);
    posix_spawn_file_actions_addclose(&fa, e[0]);
    std::vector<char *> argv{const_cast<char *>(kExe.c_str())};
    for (const auto &a : args) argv.push_back(const_cast<char *>(a.c_str()));
    argv.push_back(nullptr);
    const int rc = posix_spawn(&pid, kExe.c_str(), &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    ::close(o[1]);
    ::close(e[1]);
    out = o[0];
    err = e[0];
    REQUIRE_MESSAGE(rc == 0, "cannot run " << kExe);
  }
  ~Program() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      int st = 0;
      ::waitpid(pid, &st, 0);
    }
    ::close(out);
    ::close(err);
  }
  void pump(int ms) {
    pollfd p[2] = {{out, POLLIN, 0}, {err, POLLIN, 0}};
    if (::poll(p, 2, ms) <= 0) return;
    char buf[4096];
    if (p[0].revents & (POLLIN | POLLHUP)) {
      const ssize_t n = ::read(out, buf, sizeof buf);
      if (n > 0) out_buf.append(buf, static_cast<size_t>(n));
    }
    if (p[1].revents & (POLLIN | POLLHUP)) {
      const ssize_t n = ::read(err, buf, sizeof buf);
      if (n > 0) err_buf.append(buf, static_cast<size_t>(n));
    }
  }
  /// The URL of the first stdout line "listening on URL".
  std::string url() {
    const auto deadline = Clock::now() + 10000ms;
    while (out_buf.find('\n') == std::string::npos && Clock::now() < deadline) pump(50);
    const auto nl = out_buf.find('\n');
    REQUIRE_MESSAGE(nl != std::string::npos, "no stdout line; stderr: " << err_buf);
    static const std::regex re(R"(^listening on (http://127\.0\.0\.1:[0-9]+/)$)");
    std::smatch m;
    const std::string line = out_buf.substr(0, nl);
    REQUIRE_MESSAGE(std::regex_match(line, m, re), "first line: '" << line << "'; stderr: " << err_buf);
    return m[1];
  }
  /// Waits for exit; the wait status, or -1 after `timeout`.
  int wait_exit(std::chrono::milliseconds timeout = 15000ms) {
    const auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      int st = 0;
      if (::waitpid(pid, &st, WNOHANG) == pid) {
        pid = -1;
        for (int i = 0; i < 5; ++i) pump(10);
        return st;
      }
      pump(10);
    }
    return -1;
  }
};

}  // namespace

// -----------------------------------------------------------------------------

TEST_CASE("seed example 2: the model asks for authorize; the Task survives `toolnexus serve` stopping, on disk, "
          "and the next server resumes it to completed") {
  TempDir dir;
  const std::string store_dir = (dir.path / "tasks").string();
  // The seed's llm_plug: whatever is asked, call authorize; once the tool's
  // result is in the conversation, answer.
  FakeLlm fake([](std::size_t, const rapidjson::Document &req) {
    const rapidjson::Value &msgs = req["messages"];
    const rapidjson::Value &last = msgs[msgs.Size() - 1];
    if (std::string(last["role"].GetString()) == "tool") return FakeReply{200, answer("Authorized; all done.")};
    return FakeReply{200, tool_calls({{"c1", "authorize", "{}"}})};
  });
  ::setenv("TNX_TEST_LLM_KEY", "k-seed-secret", 1);
  const std::string config = (dir.path / "serve.json").string();
  write_file(config, R"({"agent": "llm", "a2a": {"store": )" + q("file:" + store_dir) + R"(},
    "llm": {"base_url": )" + q(fake.base_url()) + R"(, "model": "m", "api_key_env": "TNX_TEST_LLM_KEY",
            "tools": [{"name": "authorize", "description": "Always suspends for approval",
                       "parameters": {"type": "object", "properties": {}}, "approval": true}]}})");

  std::string id, ctx;
  {
    Program server({"serve", "--config", config, "--listen", "127.0.0.1:0"});
    Client c(server.url());
    auto sent = c.send("go");
    id = task_id(sent);
    ctx = sent["result"]["contextId"].GetString();
    auto settled = c.wait_settled(id);
    REQUIRE(state_of(settled) == "input-required");
    CHECK(status_text(settled["result"]) ==
          "Approval required: the agent wants to call authorize with {}. Reply \"approve\" to run it or \"deny\" "
          "to refuse.");
    // The first request: the Task's history as messages, the declared tool,
    // the key from the environment.
    REQUIRE(fake.count() == 1);
    const FakeLlm::Seen first = fake.seen(0);
    CHECK(first.method == "POST");
    CHECK(first.uri == "/v1/chat/completions");
    CHECK(first.authorization == "Bearer k-seed-secret");
    auto req = fake.request(0);
    CHECK(std::string(req["model"].GetString()) == "m");
    CHECK(to_json(req["messages"]) == R"([{"role":"user","content":"go"}])");
    CHECK(to_json(req["tools"]) ==
          R"([{"type":"function","function":{"name":"authorize","description":"Always suspends for approval",)"
          R"("parameters":{"type":"object","properties":{}}}}])");

    // input-required on disk, read straight from the file.
    const auto file = std::filesystem::path(store_dir) / (id + ".json");
    REQUIRE(std::filesystem::exists(file));
    CHECK(std::string(parse(read_file(file))["status"]["state"].GetString()) == "input-required");

    ::kill(server.pid, SIGTERM);
    const int st = server.wait_exit();
    REQUIRE_MESSAGE(st != -1, "toolnexus serve did not exit after SIGTERM; stderr: " << server.err_buf);
    CHECK(WIFEXITED(st));
    CHECK(WEXITSTATUS(st) == 0);
    CHECK_MESSAGE(server.err_buf.find("k-seed-secret") == std::string::npos, "the API key was logged");
  }
  // No server at all: the file alone.
  const auto file = std::filesystem::path(store_dir) / (id + ".json");
  auto on_disk = parse(read_file(file));
  CHECK(std::string(on_disk["status"]["state"].GetString()) == "input-required");
  const rapidjson::Value &pending = on_disk["metadata"]["toolnexus/pending"]["data"];
  CHECK(std::string(pending["kind"].GetString()) == "llm-tool-call");
  CHECK(to_json(pending["calls"]) == R"([{"id":"c1","name":"authorize","arguments":"{}"}])");
  CHECK(read_file(file).find("k-seed-secret") == std::string::npos);

  {
    Program server({"serve", "--config", config, "--listen", "127.0.0.1:0"});
    Client c(server.url());
    CHECK(state_of(c.get_task(id)) == "input-required");
    c.send("approve", R"("taskId":)" + q(id) + R"(,"contextId":)" + q(ctx));
    auto done = c.wait_settled(id);
    REQUIRE(state_of(done) == "completed");
    CHECK(artifact_text(done["result"]) == "Authorized; all done.");
    CHECK(std::string(done["result"]["artifacts"][0]["name"].GetString()) == "answer");
    // The resumed conversation: the saved messages, the tool's result.
    REQUIRE(fake.count() == 2);
    auto req = fake.request(1);
    CHECK(to_json(req["messages"]) ==
          R"([{"role":"user","content":"go"},)"
          R"({"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function",)"
          R"("function":{"name":"authorize","arguments":"{}"}}]},)"
          R"({"role":"tool","tool_call_id":"c1","content":"approved"}])");
    ::kill(server.pid, SIGTERM);
    CHECK(server.wait_exit() != -1);
  }
  CHECK(std::string(parse(read_file(file))["status"]["state"].GetString()) == "completed");
}

TEST_CASE("toolnexus serve --agent llm: needs the llm section; config errors name the key") {
  TempDir dir;
  {
    Program p({"serve", "--agent", "llm", "--listen", "127.0.0.1:0"});
    const int st = p.wait_exit();
    REQUIRE(st != -1);
    CHECK(WEXITSTATUS(st) == 2);
    CHECK_MESSAGE(p.err_buf.find("--agent llm needs an \"llm\" section in the config file") != std::string::npos,
                  p.err_buf);
  }
  const std::string config = (dir.path / "bad.json").string();
  write_file(config, R"({"agent": "llm", "llm": {"base_url": "http://127.0.0.1:1/v1", "model": "m",
    "tools": [{"name": "has space", "approval": true}]}})");
  Program p({"serve", "--config", config, "--listen", "127.0.0.1:0"});
  const int st = p.wait_exit();
  REQUIRE(st != -1);
  CHECK(WEXITSTATUS(st) == 2);
  CHECK_MESSAGE(p.err_buf.find("llm.tools[0].name 'has space' must be 1 to 64 of A-Z a-z 0-9 _ -") !=
                    std::string::npos,
                p.err_buf);
}

TEST_CASE("deny: the denial and the user's comment go back to the model as the tool's result") {
  FakeLlm fake([](std::size_t n, const rapidjson::Document &) {
    if (n == 0) return FakeReply{200, tool_calls({{"call-7", "deploy", R"({"env": "prod"})"}})};
    return FakeReply{200, answer("Understood, I did not deploy.")};
  });
  auto server = llm_server(options_for(fake, {tool("deploy", true, "deployed",
                                                   R"({"type":"object","properties":{"env":{"type":"string"}}})")}));
  Client c(server.url());
  const std::string id = task_id(c.send("ship it"));
  auto parked = c.wait_settled(id);
  REQUIRE(state_of(parked) == "input-required");
  CHECK(status_text(parked["result"]) ==
        "Approval required: the agent wants to call deploy with {\"env\":\"prod\"}. Reply \"approve\" to run it or "
        "\"deny\" to refuse.");
  c.send("Deny: not on a Friday", R"("taskId":)" + q(id));
  auto done = c.wait_settled(id);
  REQUIRE(state_of(done) == "completed");
  CHECK(artifact_text(done["result"]) == "Understood, I did not deploy.");
  REQUIRE(fake.count() == 2);
  CHECK(message_json(fake.request(1), 2) ==
        R"({"role":"tool","tool_call_id":"call-7","content":"denied: the user did not approve this call\nUser comment: not on a Friday"})");
}

TEST_CASE("tools without approval run at once; unknown tools and bad arguments get an error text") {
  FakeLlm fake([](std::size_t n, const rapidjson::Document &) {
    if (n == 0)
      return FakeReply{200, tool_calls({{"a", "lookup", R"({"q":"x"})"},
                                        {"b", "rm_rf", "{}"},
                                        {"c", "lookup", "{not json"},
                                        {"d", "lookup", "[1]"},
                                        {"e", "lookup", ""}})};
    return FakeReply{200, answer("The answer is 42.")};
  });
  auto server = llm_server(options_for(fake, {tool("lookup", false, "42"), tool("authorize", true)}));
  Client c(server.url());
  const std::string id = task_id(c.send("what is it?"));
  auto done = c.wait_settled(id);
  REQUIRE(state_of(done) == "completed");
  CHECK(artifact_text(done["result"]) == "The answer is 42.");
  REQUIRE(fake.count() == 2);
  auto req = fake.request(1);
  REQUIRE(req["messages"].Size() == 7);
  CHECK(message_json(req, 2) == R"({"role":"tool","tool_call_id":"a","content":"42"})");
  CHECK(message_json(req, 3) ==
        R"J({"role":"tool","tool_call_id":"b","content":"error: there is no tool named 'rm_rf' (tools: lookup, authorize)"})J");
  CHECK(message_json(req, 4) ==
        R"({"role":"tool","tool_call_id":"c","content":"error: the arguments are not a JSON object: Missing a name for object member. at byte 1"})");
  CHECK(message_json(req, 5) ==
        R"({"role":"tool","tool_call_id":"d","content":"error: the arguments are not a JSON object: a JSON value that is not an object"})");
  CHECK(message_json(req, 6) == R"({"role":"tool","tool_call_id":"e","content":"42"})");
}

TEST_CASE("two approvals in one turn, each answered after a restart on a file store; an unclear reply asks again") {
  TempDir dir;
  const std::string sel = "file:" + dir.str();
  FakeLlm fake([](std::size_t n, const rapidjson::Document &) {
    if (n == 0)
      return FakeReply{200, tool_calls({{"x1", "charge", R"({"amount": 5})"}, {"x2", "refund", R"({"amount": 3})"}})};
    return FakeReply{200, answer("Charged 5, did not refund.")};
  });
  const std::vector<toolnexus::LlmTool> tools = {tool("charge", true, "charged"), tool("refund", true)};
  std::string id;
  {
    auto server = llm_server(options_for(fake, tools), sel);
    Client c(server.url());
    id = task_id(c.send("settle the account"));
    auto parked = c.wait_settled(id);
    REQUIRE(state_of(parked) == "input-required");
    CHECK(status_text(parked["result"]).find("call charge with {\"amount\":5}") != std::string::npos);
  }
  {
    auto server = llm_server(options_for(fake, tools), sel);
    Client c(server.url());
    c.send("maybe later", R"("taskId":)" + q(id));
    auto again = c.wait_settled(id);
    REQUIRE(state_of(again) == "input-required");
    CHECK(status_text(again["result"]).rfind("Please answer \"approve\" or \"deny\". Approval required: the agent "
                                             "wants to call charge",
                                             0) == 0);
    CHECK(fake.count() == 1);  // the model was not asked
    c.send("yes", R"("taskId":)" + q(id));
    auto second = c.wait_settled(id);
    REQUIRE(state_of(second) == "input-required");
    CHECK(status_text(second["result"]).find("call refund with {\"amount\":3}") != std::string::npos);
    CHECK(fake.count() == 1);  // both calls answered before the model is asked again
  }
  {
    auto server = llm_server(options_for(fake, tools), sel);
    Client c(server.url());
    c.send("no", R"("taskId":)" + q(id));
    auto done = c.wait_settled(id);
    REQUIRE(state_of(done) == "completed");
    CHECK(artifact_text(done["result"]) == "Charged 5, did not refund.");
  }
  REQUIRE(fake.count() == 2);
  auto req = fake.request(1);
  REQUIRE(req["messages"].Size() == 4);
  CHECK(message_json(req, 2) == R"({"role":"tool","tool_call_id":"x1","content":"charged"})");
  CHECK(message_json(req, 3) ==
        R"({"role":"tool","tool_call_id":"x2","content":"denied: the user did not approve this call"})");
}

TEST_CASE("the system prompt comes first; no Authorization without api_key_env; finish_reason length is noted") {
  FakeLlm fake([](std::size_t, const rapidjson::Document &) { return FakeReply{200, answer("Hel", "length")}; });
  auto o = options_for(fake);
  o.system_prompt = "You are terse.";
  auto server = llm_server(o);
  Client c(server.url());
  const std::string id = task_id(c.send("hello"));
  auto done = c.wait_settled(id);
  REQUIRE(state_of(done) == "completed");
  CHECK(artifact_text(done["result"]) == "Hel");
  CHECK(status_text(done["result"]) == "The answer was cut off at the model's length limit.");
  REQUIRE(fake.count() == 1);
  CHECK(fake.seen(0).authorization.empty());
  auto req = fake.request(0);
  CHECK(to_json(req["messages"]) == R"([{"role":"system","content":"You are terse."},{"role":"user","content":"hello"}])");
  CHECK(!req.HasMember("tools"));
}

TEST_CASE("a message without text is rejected without calling the model") {
  FakeLlm fake([](std::size_t, const rapidjson::Document &) { return FakeReply{200, answer("never")}; });
  auto server = llm_server(options_for(fake));
  Client c(server.url());
  auto sent = c.call("SendMessage", R"({"configuration":{"blocking":false},"message":{"role":"user","messageId":"d1",)"
                                    R"("parts":[{"kind":"data","data":{"x":1}}]}})");
  const std::string id = task_id(sent);
  auto done = c.wait_settled(id);
  REQUIRE(state_of(done) == "rejected");
  CHECK(status_text(done["result"]) == "The llm agent reads text parts only, and this Task's messages have none.");
  CHECK(fake.count() == 0);
}

TEST_CASE("429 and 5xx are retried with backoff, then succeed") {
  FakeLlm fake([](std::size_t n, const rapidjson::Document &) {
    if (n == 0) return FakeReply{503, R"({"error":{"message":"overloaded"}})"};
    if (n == 1) return FakeReply{429, R"({"error":{"message":"slow down"}})", {{"Retry-After", "0"}}};
    return FakeReply{200, answer("finally")};
  });
  auto server = llm_server(options_for(fake));
  Client c(server.url());
  const std::string id = task_id(c.send("hi"));
  auto done = c.wait_settled(id);
  REQUIRE(state_of(done) == "completed");
  CHECK(artifact_text(done["result"]) == "finally");
  CHECK(fake.count() == 3);
}

TEST_CASE("retries are bounded; the failed state quotes the endpoint's error") {
  FakeLlm fake([](std::size_t, const rapidjson::Document &) {
    return FakeReply{429, R"({"error":{"message":"Rate limit reached for requests","type":"requests","code":"rate_limit_exceeded"}})"};
  });
  auto o = options_for(fake);
  o.max_retries = 2;
  auto server = llm_server(o);
  Client c(server.url());
  const std::string id = task_id(c.send("hi"));
  auto done = c.wait_settled(id);
  REQUIRE(state_of(done) == "failed");
  CHECK(status_text(done["result"]) == "The model endpoint failed: POST " + fake.base_url() +
                                           "/chat/completions answered HTTP 429 Too Many Requests "
                                           "(rate_limit_exceeded): Rate limit reached for requests (after 3 attempts)");
  CHECK(fake.count() == 3);
}

TEST_CASE("a 4xx is not retried, and the API key never appears in the failed state") {
  ::setenv("TNX_TEST_LLM_KEY2", "sk-test-do-not-show", 1);
  FakeLlm fake([](std::size_t, const rapidjson::Document &) {
    return FakeReply{401, R"({"error":{"message":"Incorrect API key provided: sk-test-do-not-show. See the docs.",)"
                          R"("type":"invalid_request_error","code":"invalid_api_key"}})"};
  });
  auto o = options_for(fake);
  o.api_key_env = "TNX_TEST_LLM_KEY2";
  auto server = llm_server(o);
  Client c(server.url());
  const std::string id = task_id(c.send("hi"));
  auto done = c.wait_settled(id);
  REQUIRE(state_of(done) == "failed");
  const std::string msg = status_text(done["result"]);
  CHECK(msg == "The model endpoint failed: POST " + fake.base_url() +
                   "/chat/completions answered HTTP 401 Unauthorized (invalid_api_key): Incorrect API key provided: "
                   "[redacted]. See the docs.");
  CHECK(msg.find("sk-test-do-not-show") == std::string::npos);
  CHECK(fake.count() == 1);
  CHECK(fake.seen(0).authorization == "Bearer sk-test-do-not-show");
  CHECK(to_json(stored_task(server, id)).find("sk-test-do-not-show") == std::string::npos);
}

TEST_CASE("the API key is redacted from everything the agent stores or returns, not only failure messages") {
  const std::string key = "sk-test-leak-7f3a";
  ::setenv("TNX_TEST_LLM_KEY3", key.c_str(), 1);
  const auto o_with_key = [&](const FakeLlm &fake, std::vector<toolnexus::LlmTool> tools = {}) {
    auto o = options_for(fake, std::move(tools));
    o.api_key_env = "TNX_TEST_LLM_KEY3";
    return o;
  };
  SUBCASE("a 200 answer's content: the artifact, the stored Task, GetTask, ListTasks") {
    FakeLlm fake([&](std::size_t, const rapidjson::Document &) {
      return FakeReply{200, answer("Your key is " + key + ", and again: " + key + ".")};
    });
    auto server = llm_server(o_with_key(fake));
    Client c(server.url());
    const std::string id = task_id(c.send("what is my key?"));
    auto done = c.wait_settled(id);
    REQUIRE(state_of(done) == "completed");
    CHECK(artifact_text(done["result"]) == "Your key is [redacted], and again: [redacted].");
    CHECK(to_json(done).find(key) == std::string::npos);
    CHECK(to_json(stored_task(server, id)).find(key) == std::string::npos);
    auto listed = c.call("ListTasks", "{}");
    CHECK(to_json(listed).find(id) != std::string::npos);
    CHECK(to_json(listed).find(key) == std::string::npos);
    CHECK(fake.seen(0).authorization == "Bearer " + key);
  }
  SUBCASE("a tool call: its arguments, the approval prompt, the pending request, and what follows") {
    FakeLlm fake([&](std::size_t n, const rapidjson::Document &) {
      if (n == 0) {
        std::string body = tool_calls({{"k1", "authorize", R"({"token": ")" + key + R"("})"}});
        // The assistant's text beside the call holds the key too.
        const std::string null_content = R"("content":null)";
        body.replace(body.find(null_content), null_content.size(), R"("content":"using )" + key + R"(")");
        return FakeReply{200, body};
      }
      return FakeReply{200, answer("done with " + key)};
    });
    auto server = llm_server(o_with_key(fake, {tool("authorize", true)}));
    Client c(server.url());
    const std::string id = task_id(c.send("authorize me"));
    auto parked = c.wait_settled(id);
    REQUIRE(state_of(parked) == "input-required");
    CHECK(status_text(parked["result"]) ==
          "Approval required: the agent wants to call authorize with {\"token\":\"[redacted]\"}. Reply \"approve\" "
          "to run it or \"deny\" to refuse.");
    CHECK(to_json(parked).find(key) == std::string::npos);
    const std::string stored_parked = to_json(stored_task(server, id));
    CHECK(stored_parked.find("toolnexus/pending") != std::string::npos);
    CHECK(stored_parked.find(key) == std::string::npos);
    c.send("approve", R"("taskId":)" + q(id));
    auto done = c.wait_settled(id);
    REQUIRE(state_of(done) == "completed");
    CHECK(artifact_text(done["result"]) == "done with [redacted]");
    CHECK(to_json(done).find(key) == std::string::npos);
    CHECK(to_json(stored_task(server, id)).find(key) == std::string::npos);
  }
}

TEST_CASE("a slow endpoint times out (retried, bounded); an unreachable one fails clearly") {
  SUBCASE("timeout") {
    FakeLlm fake([](std::size_t, const rapidjson::Document &) { return FakeReply{200, answer("late"), {}, 1500}; });
    auto o = options_for(fake);
    o.timeout_ms = 200;
    o.max_retries = 1;
    auto server = llm_server(o);
    Client c(server.url());
    const std::string id = task_id(c.send("hi"));
    auto done = c.wait_settled(id, 10000ms);
    REQUIRE(state_of(done) == "failed");
    CHECK(status_text(done["result"]) == "The model endpoint could not be reached: POST " + fake.base_url() +
                                             "/chat/completions: no answer within 200 ms (llm.timeout_ms) (after 2 "
                                             "attempts)");
    CHECK(fake.count() == 2);
  }
  SUBCASE("connection refused") {
    Poco::Net::ServerSocket closed(Poco::Net::SocketAddress("127.0.0.1", 0));
    const uint16_t port = closed.address().port();
    closed.close();
    toolnexus::LlmOptions o;
    o.base_url = "http://127.0.0.1:" + std::to_string(port);
    o.model = "m";
    o.max_retries = 1;
    o.retry_initial_ms = 10;
    auto server = llm_server(o);
    Client c(server.url());
    const std::string id = task_id(c.send("hi"));
    auto done = c.wait_settled(id);
    REQUIRE(state_of(done) == "failed");
    const std::string msg = status_text(done["result"]);
    CHECK(msg.rfind("The model endpoint could not be reached: POST http://127.0.0.1:" + std::to_string(port) +
                        "/chat/completions: ",
                    0) == 0);
    CHECK(msg.find("refused") != std::string::npos);
    CHECK(msg.find("(after 2 attempts)") != std::string::npos);
  }
}

TEST_CASE("malformed answers fail the Task saying what was wrong") {
  SUBCASE("not JSON") {
    FakeLlm fake([](std::size_t, const rapidjson::Document &) { return FakeReply{200, "<html>oops</html>"}; });
    auto server = llm_server(options_for(fake));
    Client c(server.url());
    const std::string id = task_id(c.send("hi"));
    auto done = c.wait_settled(id);
    REQUIRE(state_of(done) == "failed");
    CHECK(status_text(done["result"]) == "The model endpoint " + fake.base_url() +
                                             "/chat/completions answered HTTP 200 with a body that is not a JSON "
                                             "object (Invalid value. at byte 0): <html>oops</html>");
    CHECK(fake.count() == 1);
  }
  SUBCASE("no choices") {
    FakeLlm fake([](std::size_t, const rapidjson::Document &) { return FakeReply{200, R"({"choices":[]})"}; });
    auto server = llm_server(options_for(fake));
    Client c(server.url());
    const std::string id = task_id(c.send("hi"));
    auto done = c.wait_settled(id);
    REQUIRE(state_of(done) == "failed");
    CHECK(status_text(done["result"]) == "The model endpoint " + fake.base_url() +
                                             "/chat/completions answered HTTP 200 without choices[0].message: "
                                             R"({"choices":[]})");
  }
  SUBCASE("an answer over 16 MiB (not retried)") {
    FakeLlm fake([](std::size_t, const rapidjson::Document &) {
      return FakeReply{200, std::string((16u << 20) + 10, ' ') + "{}"};
    });
    auto server = llm_server(options_for(fake));
    Client c(server.url());
    const std::string id = task_id(c.send("hi"));
    auto done = c.wait_settled(id, 10000ms);
    REQUIRE(state_of(done) == "failed");
    CHECK(status_text(done["result"]) == "The model endpoint failed: POST " + fake.base_url() +
                                             "/chat/completions: the answer is larger than 16777216 bytes");
    CHECK(fake.count() == 1);
  }
  SUBCASE("an empty answer") {
    FakeLlm fake([](std::size_t, const rapidjson::Document &) { return FakeReply{200, answer("")}; });
    auto server = llm_server(options_for(fake));
    Client c(server.url());
    const std::string id = task_id(c.send("hi"));
    auto done = c.wait_settled(id);
    REQUIRE(state_of(done) == "failed");
    CHECK(status_text(done["result"]) == "The model returned neither an answer nor a tool call.");
  }
}

TEST_CASE("a model that keeps calling tools is stopped after max_model_calls") {
  FakeLlm fake([](std::size_t n, const rapidjson::Document &) {
    return FakeReply{200, tool_calls({{"l" + std::to_string(n), "lookup", "{}"}})};
  });
  auto o = options_for(fake, {tool("lookup", false)});
  o.max_model_calls = 3;
  auto server = llm_server(o);
  Client c(server.url());
  const std::string id = task_id(c.send("loop"));
  auto done = c.wait_settled(id);
  REQUIRE(state_of(done) == "failed");
  CHECK(status_text(done["result"]) ==
        "The model called tools 3 times in a row without answering (llm.max_model_calls).");
  CHECK(fake.count() == 3);
}

TEST_CASE("a cancel stops the retries: the server stops without waiting out the backoff") {
  FakeLlm fake([](std::size_t, const rapidjson::Document &) { return FakeReply{503, "{}"}; });
  auto o = options_for(fake);
  o.max_retries = 5;
  o.retry_initial_ms = 4000;
  o.retry_max_ms = 4000;
  std::shared_ptr<toolnexus::TaskStore> store = toolnexus::resolve_store("memory");
  auto server = llm_server(o, store);
  Client c(server.url());
  const std::string id = task_id(c.send("hi"));
  REQUIRE(eventually([&] { return fake.count() == 1; }));
  auto canceled = c.call("CancelTask", R"({"id":)" + q(id) + "}");
  REQUIRE(state_of(canceled) == "canceled");
  const auto t0 = Clock::now();
  server.stop();  // waits for the running executor
  CHECK(Clock::now() - t0 < 3000ms);  // one backoff is 4 s; five would be 20 s
  CHECK(fake.count() == 1);
  CHECK(std::string(parse(store->get(id)->json)["status"]["state"].GetString()) == "canceled");
}

TEST_CASE("https: the endpoint's certificate is verified against llm.ca_file (or the system's CAs)") {
  FakeLlm fake([](std::size_t, const rapidjson::Document &) { return FakeReply{200, answer("over TLS")}; }, true);
  SUBCASE("trusted through ca_file") {
    auto o = options_for(fake);
    o.ca_file = fake.cert_file();
    auto server = llm_server(o);
    Client c(server.url());
    const std::string id = task_id(c.send("hi"));
    auto done = c.wait_settled(id);
    REQUIRE(state_of(done) == "completed");
    CHECK(artifact_text(done["result"]) == "over TLS");
  }
  SUBCASE("not trusted by the system's CAs") {
    auto o = options_for(fake);
    o.max_retries = 0;
    auto server = llm_server(o);
    Client c(server.url());
    const std::string id = task_id(c.send("hi"));
    auto done = c.wait_settled(id);
    REQUIRE(state_of(done) == "failed");
    const std::string msg = status_text(done["result"]);
    CHECK(msg.rfind("The model endpoint could not be reached: POST " + fake.base_url() + "/chat/completions: ", 0) ==
          0);
    CHECK_MESSAGE(msg.find("certificate verify failed") != std::string::npos, msg);
    CHECK(fake.count() == 0);
  }
}

TEST_CASE("parse_llm_options and make_llm_executor refuse bad settings, naming the key") {
  auto parse_err = [](const std::string &json) {
    rapidjson::Document d;
    d.Parse(json.data(), json.size());
    REQUIRE(!d.HasParseError());
    try {
      toolnexus::parse_llm_options(d, "cfg.json: llm");
    } catch (const std::invalid_argument &e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  CHECK(parse_err(R"({"model":"m"})") == "cfg.json: llm.base_url is required");
  CHECK(parse_err(R"({"base_url":"http://h","model":"m","modle":"x"})").rfind(
            "cfg.json: llm.modle is not a known key (keys: base_url, model,", 0) == 0);
  CHECK(parse_err(R"({"base_url":"http://h","model":"m","timeout_ms":0})") ==
        "cfg.json: llm.timeout_ms must be an integer between 1 and 86400000");
  CHECK(parse_err(R"({"base_url":"http://h","model":"m","tools":{}})") ==
        "cfg.json: llm.tools must be an array of tool objects");
  CHECK(parse_err(R"({"base_url":"http://h","model":"m","tools":[{"name":"t","parameters":[]}]})") ==
        "cfg.json: llm.tools[0].parameters must be a JSON Schema object");
  CHECK(parse_err(R"({"base_url":"http://h","model":"m","tools":[{"name":"t","approval":"yes"}]})") ==
        "cfg.json: llm.tools[0].approval must be true or false");
  CHECK(parse_err(R"({"base_url":"http://h","model":"m","tools":[{"name":"t","run":"rm -rf /"}]})").rfind(
            "cfg.json: llm.tools[0].run is not a known key", 0) == 0);

  auto make_err = [](toolnexus::LlmOptions o) {
    try {
      toolnexus::make_llm_executor(std::move(o));
    } catch (const std::exception &e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  toolnexus::LlmOptions good;
  good.base_url = "http://127.0.0.1:9/v1/";
  good.model = "m";
  CHECK(make_err(good) == "(no error)");
  auto o = good;
  o.base_url = "ftp://h/v1";
  CHECK(make_err(o) == "llm.base_url 'ftp://h/v1' must be http://HOST[:PORT][/PATH] or https://...");
  o.base_url = "http://user:pw@h/v1";
  CHECK(make_err(o).rfind("llm.base_url must not hold credentials", 0) == 0);
  o.base_url = "http://h/v1?x=1";
  CHECK(make_err(o) == "llm.base_url 'http://h/v1?x=1' must have no query or fragment");
  o = good;
  ::unsetenv("TNX_TEST_LLM_UNSET");
  o.api_key_env = "TNX_TEST_LLM_UNSET";
  CHECK(make_err(o) ==
        "llm.api_key_env names the environment variable TNX_TEST_LLM_UNSET, which is not set (or empty)");
  o = good;
  o.tools = {tool("a", false), tool("a", true)};
  CHECK(make_err(o) == "llm.tools[1].name 'a' is declared twice");
  o.tools = {tool(std::string(65, 'x'), false)};
  CHECK(make_err(o).find("must be 1 to 64 of A-Z a-z 0-9 _ -") != std::string::npos);
  o = good;
  o.base_url = "https://127.0.0.1:9/v1";
  o.ca_file = "/nonexistent/ca.pem";
  CHECK(make_err(o).rfind("llm: cannot set up TLS with llm.ca_file /nonexistent/ca.pem: ", 0) == 0);
}

TEST_CASE("a Task parked by another agent is not resumed by the llm agent") {
  TempDir dir;
  const std::string sel = "file:" + dir.str();
  std::string id;
  {
    toolnexus::ServerOptions so = test_options();
    so.store = sel;
    so.agent = "approval";
    auto server = toolnexus::serve(std::move(so));
    Client c(server.url());
    id = task_id(c.send("deploy"));
    REQUIRE(state_of(c.wait_settled(id)) == "input-required");
  }
  FakeLlm fake([](std::size_t, const rapidjson::Document &) { return FakeReply{200, answer("never")}; });
  auto server = llm_server(options_for(fake), sel);
  Client c(server.url());
  c.send("approve", R"("taskId":)" + q(id));
  auto done = c.wait_settled(id);
  REQUIRE(state_of(done) == "failed");
  CHECK(status_text(done["result"]) ==
        "This Task's pending request was not saved by the llm agent (or is damaged), so the llm agent cannot resume "
        "it.");
  CHECK(fake.count() == 0);
}

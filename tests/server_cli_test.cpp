// The real `toolnexus serve` program as a child process: first stdout line,
// a request, SIGTERM -> exit 0; config file; bad selector -> non-zero exit
// with a clear message.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include "server_test_support.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <algorithm>
#include <fstream>
#include <regex>

extern char **environ;

using namespace tnxtest;

namespace {

const std::string kExe = std::string(TOOLNEXUS_BIN_DIR) + "/toolnexus";

struct Child {
  pid_t pid = -1;
  int out = -1;  // stdout read end
  int err = -1;  // stderr read end
  std::string out_buf, err_buf;

  explicit Child(const std::vector<std::string> &args) {
    int o[2], e[2];
    REQUIRE(::pipe(o) == 0);
    REQUIRE(::pipe(e) == 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, o[1], 1);
    posix_spawn_file_actions_adddup2(&fa, e[1], 2);
    posix_spawn_file_actions_addclose(&fa, o[0]);
    posix_spawn_file_actions_addclose(&fa, e[0]);
    std::vector<char *> argv;
    argv.push_back(const_cast<char *>(kExe.c_str()));
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
  ~Child() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      int st = 0;
      ::waitpid(pid, &st, 0);
    }
    ::close(out);
    ::close(err);
  }

  // Drains both pipes for up to `ms`.
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

  std::string first_stdout_line(std::chrono::milliseconds timeout = 5000ms) {
    const auto deadline = Clock::now() + timeout;
    while (out_buf.find('\n') == std::string::npos && Clock::now() < deadline) pump(50);
    const auto nl = out_buf.find('\n');
    REQUIRE_MESSAGE(nl != std::string::npos, "no stdout line; stderr: " << err_buf);
    return out_buf.substr(0, nl);
  }

  // Waits for exit; returns the wait status (or -1 on timeout).
  int wait_exit(std::chrono::milliseconds timeout = 5000ms) {
    const auto deadline = Clock::now() + timeout;
    while (Clock::now() < deadline) {
      int st = 0;
      const pid_t r = ::waitpid(pid, &st, WNOHANG);
      if (r == pid) {
        pid = -1;
        for (int i = 0; i < 5; ++i) pump(10);
        return st;
      }
      pump(10);
    }
    return -1;
  }
};

std::string url_from(const std::string &line) {
  static const std::regex re(R"(^listening on (http://127\.0\.0\.1:[0-9]+/)$)");
  std::smatch m;
  REQUIRE_MESSAGE(std::regex_match(line, m, re), "first line: '" << line << "'");
  return m[1];
}

}  // namespace

TEST_CASE("toolnexus serve: first line, a request, SIGTERM -> exit 0, the Task on disk") {
  TempDir dir;
  Child child({"serve", "--listen", "127.0.0.1:0", "--store", "file:" + dir.str(), "--agent", "approval",
               "--name", "cli-agent", "--log-level", "debug"});
  const std::string url = url_from(child.first_stdout_line());
  Client c(url);
  const std::string id = task_id(c.send("deploy"));
  CHECK(state_of(c.wait_settled(id)) == "input-required");
  auto card = parse(c.connection().get("/.well-known/agent-card.json").body);
  CHECK(std::string(card["name"].GetString()) == "cli-agent");

  REQUIRE(::kill(child.pid, SIGTERM) == 0);
  const int st = child.wait_exit();
  REQUIRE_MESSAGE(st != -1, "did not exit; stderr: " << child.err_buf);
  CHECK(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 0);
  CHECK(child.err_buf.find("POST / SendMessage 200") != std::string::npos);  // one line per request
  CHECK(std::filesystem::exists(dir.path / (id + ".json")));
  auto store = toolnexus::resolve_store("file:" + dir.str());
  CHECK(store->get(id)->state == "input-required");
}

TEST_CASE("toolnexus serve --config, flags override, SIGINT") {
  TempDir dir;
  {
    std::ofstream f(dir.path / "serve.json");
    f << R"({"listen": "127.0.0.1:1", "agent": "approval", "log_level": "warn",
             "a2a": {"name": "from-config", "store": "file:)"
      << (dir.path / "tasks").string() << R"(", "provider": {"organization": "Org"}},
             "lease": {"lease_ms": 20000, "renew_interval_ms": 5000}})";
  }
  Child child({"serve", "--config", (dir.path / "serve.json").string(), "--listen", "127.0.0.1:0"});
  const std::string url = url_from(child.first_stdout_line());
  Client c(url);
  auto card = parse(c.connection().get("/.well-known/agent-card.json").body);
  CHECK(std::string(card["name"].GetString()) == "from-config");
  CHECK(std::string(card["provider"]["organization"].GetString()) == "Org");
  const std::string id = task_id(c.send("x"));
  CHECK(state_of(c.wait_settled(id)) == "input-required");  // the approval agent from the config
  REQUIRE(::kill(child.pid, SIGINT) == 0);
  const int st = child.wait_exit();
  CHECK(WIFEXITED(st));
  CHECK(WEXITSTATUS(st) == 0);
  CHECK(std::filesystem::exists(dir.path / "tasks" / (id + ".json")));
}

TEST_CASE("toolnexus serve: the Task size limits and the card's url options, from the config and from flags") {
  TempDir dir;
  {
    std::ofstream f(dir.path / "serve.json");
    f << R"({"agent": "approval",
             "a2a": {"allowed_hosts": ["agents.example.com"], "trust_forwarded": true, "card_max_age_s": 42},
             "limits": {"max_message_parts": 2, "max_task_history": 3, "max_task_bytes": 8192}})";
  }
  const std::string parts3 = R"([{"kind":"text","text":"a"},{"kind":"text","text":"b"},{"kind":"text","text":"c"}])";
  {
    Child child({"serve", "--config", (dir.path / "serve.json").string(), "--listen", "127.0.0.1:0"});
    const std::string url = url_from(child.first_stdout_line());
    Client c(url);
    auto d = c.call("SendMessage", R"({"message":{"role":"user","messageId":"m1","parts":)" + parts3 + "}}");
    CHECK(error_message(d).find("past the limit of 2 parts per message (limits.max_message_parts)") !=
          std::string::npos);
    const std::string id = task_id(c.send("deploy"));
    c.wait_settled(id);  // history: deploy, the prompt
    c.send("not yet", R"("taskId":)" + q(id));
    c.wait_settled(id);  // 4 now: the next is refused
    d = c.send("approve", R"("taskId":)" + q(id));
    CHECK(error_message(d).find("past the limit of 3 messages per Task (limits.max_task_history)") !=
          std::string::npos);
    d = c.send(std::string(9000, 'x'));
    CHECK(error_message(d).find("past the limit of 8192 bytes per stored Task (limits.max_task_bytes)") !=
          std::string::npos);
    Connection conn(port_of(url));
    REQUIRE(conn.send_raw("GET /.well-known/agent-card.json HTTP/1.1\r\nHost: agents.example.com\r\n"
                          "X-Forwarded-Proto: https\r\n\r\n"));
    const HttpResponse card = conn.read_response();
    CHECK(std::string(parse(card.body)["url"].GetString()) == "https://agents.example.com/");
    CHECK(card.header("cache-control") == "public, max-age=42");
    // The url follows these headers: a shared cache must key on them too.
    CHECK(card.header("vary") == "Forwarded, X-Forwarded-Proto, X-Forwarded-Host, Origin");
  }
  {
    Child child({"serve", "--listen", "127.0.0.1:0", "--agent", "approval", "--max-message-parts", "1",
                 "--max-task-history=5", "--max-task-bytes", "4096", "--allowed-host", "edge.example:8443",
                 "--trust-forwarded", "--card-max-age", "0"});
    const std::string url = url_from(child.first_stdout_line());
    Client c(url);
    auto d = c.call("SendMessage", R"({"message":{"role":"user","messageId":"m1","parts":)" + parts3 + "}}");
    CHECK(error_message(d).find("past the limit of 1 parts per message") != std::string::npos);
    d = c.send(std::string(5000, 'x'));
    CHECK(error_message(d).find("past the limit of 4096 bytes per stored Task") != std::string::npos);
    Connection conn(port_of(url));
    REQUIRE(conn.send_raw("GET /.well-known/agent-card.json HTTP/1.1\r\nHost: x\r\n"
                          "Forwarded: proto=https;host=edge.example:8443\r\n\r\n"));
    const HttpResponse card = conn.read_response();
    CHECK(std::string(parse(card.body)["url"].GetString()) == "https://edge.example:8443/");
    CHECK(card.header("cache-control") == "public, max-age=0");
    REQUIRE(conn.send_raw("GET /.well-known/agent-card.json HTTP/1.1\r\nHost: x\r\n"
                          "Forwarded: proto=https;host=evil.example\r\n\r\n"));
    CHECK(std::string(parse(conn.read_response().body)["url"].GetString()) == url);
  }
  {
    Child child({"serve", "--listen", "127.0.0.1:0", "--max-task-bytes", "100"});
    CHECK(WEXITSTATUS(child.wait_exit()) == 2);
    CHECK(child.err_buf.find("--max-task-bytes must be an integer between 4096") != std::string::npos);
  }
  {
    std::ofstream f(dir.path / "bad.json");
    f << R"({"a2a": {"allowed_hosts": "agents.example.com"}})";
  }
  {
    Child child({"serve", "--config", (dir.path / "bad.json").string(), "--listen", "127.0.0.1:0"});
    CHECK(WEXITSTATUS(child.wait_exit()) == 2);
    CHECK(child.err_buf.find("a2a.allowed_hosts must be an array of host names") != std::string::npos);
  }
}

namespace {
/// A blocking v0.3 SendMessage of `text` under `message_id` (and `task_id`).
rapidjson::Document send_as(Client &c, const std::string &text, const std::string &message_id,
                            const std::string &task_id = {}) {
  std::string msg = R"({"role":"user","messageId":)" + q(message_id) + R"(,"parts":[{"kind":"text","text":)" +
                    q(text) + "}]" + (task_id.empty() ? "" : R"(,"taskId":)" + q(task_id)) + "}";
  return c.call("SendMessage", R"({"message":)" + msg + R"(,"configuration":{"blocking":true}})");
}
size_t history_size(const rapidjson::Document &d) {
  REQUIRE_MESSAGE(d.HasMember("result"), to_json(d));
  return d["result"]["history"].Size();
}
}  // namespace

TEST_CASE("toolnexus serve: idempotency from the config: the recent-messages bound, off, and bad values refused") {
  TempDir dir;
  {
    // recent_messages 2: a retry of one of the last two messages to a Task
    // is the first send's outcome; an older messageId is a new message.
    std::ofstream(dir.path / "two.json") << R"({"agent": "approval", "idempotency": {"recent_messages": 2}})";
    Child child({"serve", "--config", (dir.path / "two.json").string(), "--listen", "127.0.0.1:0"});
    Client c(url_from(child.first_stdout_line()));
    auto first = send_as(c, "deploy", "new-1");
    const std::string id = task_id(first);
    CHECK(history_size(first) == 2);  // deploy, the prompt
    CHECK(task_id(send_as(c, "deploy", "new-1")) == id);  // a new Task's retry: the same Task
    CHECK(history_size(send_as(c, "hmm", "a", id)) == 4);
    CHECK(history_size(send_as(c, "hmm", "b", id)) == 6);
    CHECK(history_size(send_as(c, "hmm", "c", id)) == 8);
    CHECK(history_size(send_as(c, "hmm", "c", id)) == 8);  // recent: no second turn
    CHECK(history_size(send_as(c, "hmm", "b", id)) == 8);
    CHECK(history_size(send_as(c, "hmm", "a", id)) == 10);  // forgotten past 2: a new turn
    auto changed = send_as(c, "approve", "c", id);  // same messageId, another body
    CHECK(error_message(changed).find("messageId 'c' was already used with a different message") !=
          std::string::npos);
  }
  {
    std::ofstream(dir.path / "off.json") << R"({"agent": "approval", "idempotency": {"enabled": false}})";
    Child child({"serve", "--config", (dir.path / "off.json").string(), "--listen", "127.0.0.1:0"});
    Client c(url_from(child.first_stdout_line()));
    CHECK(task_id(send_as(c, "deploy", "same")) != task_id(send_as(c, "deploy", "same")));
  }
  const std::pair<const char *, const char *> bad[] = {
      {R"({"idempotency": {"enabled": "yes"}})", "idempotency.enabled must be true or false"},
      {R"({"idempotency": {"recent_messages": 0}})", "idempotency.recent_messages must be an integer between 1 and"},
      {R"({"idempotency": {"window_ms": -5}})", "idempotency.window_ms must be an integer between 1 and"},
      {R"({"idempotency": []})", "idempotency must be an object"},
  };
  for (const auto &[config, why] : bad) {
    CAPTURE(config);
    std::ofstream(dir.path / "bad.json") << config;
    Child child({"serve", "--config", (dir.path / "bad.json").string(), "--listen", "127.0.0.1:0"});
    CHECK(WEXITSTATUS(child.wait_exit()) == 2);
    CHECK_MESSAGE(child.err_buf.find(why) != std::string::npos, child.err_buf);
  }
}

TEST_CASE("toolnexus serve with bearer tokens") {
  TempDir dir;
  {
    std::ofstream f(dir.path / "tokens.json");
    f << R"({"cli-secret-1": "ops"})";
  }
  Child child({"serve", "--listen", "127.0.0.1:0", "--auth-tokens", (dir.path / "tokens.json").string(),
               "--log-level", "debug"});
  const std::string url = url_from(child.first_stdout_line());
  Connection anon(port_of(url));
  CHECK(anon.post(R"({"jsonrpc":"2.0","id":1,"method":"ListTasks"})").status == 401);
  Client ops(url, "cli-secret-1");
  CHECK(ops.call("ListTasks", "{}").HasMember("result"));
  ::kill(child.pid, SIGTERM);
  CHECK(child.wait_exit() == 0);
  CHECK(child.err_buf.find("principal=ops") != std::string::npos);
  CHECK(child.err_buf.find("cli-secret-1") == std::string::npos);
}

TEST_CASE("toolnexus serve with auth.jwt: jwks_file relative to the config; bad keys refused by name") {
  TempDir dir;
  {
    std::ofstream f(dir.path / "keys.json");
    f << R"({"keys":[{"kty":"oct","kid":"h1","k":"MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY"}]})";
  }
  {
    std::ofstream f(dir.path / "c.json");
    f << R"({"auth":{"jwt":{"issuer":"https://i.example","audience":"a","jwks_file":"keys.json",)"
         R"("algorithms":["HS256"]}}})";
  }
  {
    Child child({"serve", "--listen", "127.0.0.1:0", "--config", (dir.path / "c.json").string()});
    const std::string url = url_from(child.first_stdout_line());
    Connection anon(port_of(url));
    const HttpResponse r = anon.post(R"({"jsonrpc":"2.0","id":1,"method":"ListTasks"})");
    CHECK(r.status == 401);
    Connection card(port_of(url));
    CHECK(card.get("/.well-known/agent-card.json").body.find(R"("bearerFormat":"JWT")") != std::string::npos);
    ::kill(child.pid, SIGTERM);
    CHECK(child.wait_exit() == 0);
  }
  {
    std::ofstream f(dir.path / "bad.json");
    f << R"({"auth":{"jwt":{"issuer":"https://i.example","audience":"a","jwks_file":"keys.json","skew":5}}})";
  }
  Child bad({"serve", "--listen", "127.0.0.1:0", "--config", (dir.path / "bad.json").string()});
  CHECK(WEXITSTATUS(bad.wait_exit()) == 2);
  CHECK(bad.err_buf.find("auth.jwt.skew is not a known key") != std::string::npos);
  // The default algorithms (RS256, ES256) leave an HS256-only file with no key.
  {
    std::ofstream f(dir.path / "nokey.json");
    f << R"({"auth":{"jwt":{"issuer":"https://i.example","audience":"a","jwks_file":"keys.json"}}})";
  }
  Child nokey({"serve", "--listen", "127.0.0.1:0", "--config", (dir.path / "nokey.json").string()});
  CHECK(WEXITSTATUS(nokey.wait_exit()) == 1);
  CHECK(nokey.err_buf.find("keys.json holds no key usable with auth.jwt.algorithms") != std::string::npos);
}

TEST_CASE("toolnexus serve refuses what it cannot run, with a clear message and a non-zero exit") {
  SUBCASE("unknown store selector") {
    Child child({"serve", "--listen", "127.0.0.1:0", "--store", "nosuch:place"});
    const int st = child.wait_exit();
    REQUIRE(st != -1);
    CHECK(WEXITSTATUS(st) == 1);
    CHECK(child.err_buf.find("nosuch") != std::string::npos);
    CHECK(child.out_buf.empty());
  }
  SUBCASE("a store its plugin cannot open") {
    TempDir dir;
    { std::ofstream f(dir.path / "not-a-dir"); f << "x"; }
    Child child({"serve", "--listen", "127.0.0.1:0", "--store", "file:" + (dir.path / "not-a-dir").string()});
    const int st = child.wait_exit();
    REQUIRE(st != -1);
    CHECK(WEXITSTATUS(st) == 1);
    CHECK(child.err_buf.find("not-a-dir") != std::string::npos);
  }
  SUBCASE("unknown agent, bad flag, bad listen") {
    {
      Child child({"serve", "--agent", "nope"});
      CHECK(WEXITSTATUS(child.wait_exit()) == 1);
      CHECK(child.err_buf.find("unknown agent") != std::string::npos);
    }
    {
      Child child({"serve", "--bogus"});
      CHECK(WEXITSTATUS(child.wait_exit()) == 2);
      CHECK(child.err_buf.find("--bogus") != std::string::npos);
    }
    {
      Child child({"serve", "--listen", "nohost"});
      CHECK(WEXITSTATUS(child.wait_exit()) == 1);
      CHECK(child.err_buf.find("nohost") != std::string::npos);
    }
  }
  SUBCASE("a malformed allowed origin or host, from a flag or the config file") {
    {
      Child child({"serve", "--listen", "127.0.0.1:0", "--allowed-origin", "https://x.example/"});
      CHECK(WEXITSTATUS(child.wait_exit()) == 1);
      CHECK(child.err_buf.find("a2a.allowed_origins (--allowed-origin) entry 'https://x.example/': an origin has no "
                               "path") != std::string::npos);
    }
    TempDir dir;
    { std::ofstream f(dir.path / "c.json"); f << R"({"a2a":{"allowed_hosts":["x.example:99999"]}})"; }
    Child child({"serve", "--listen", "127.0.0.1:0", "--config", (dir.path / "c.json").string()});
    CHECK(WEXITSTATUS(child.wait_exit()) == 1);
    CHECK(child.err_buf.find("a2a.allowed_hosts (--allowed-host) entry 'x.example:99999': the port 99999 is not in "
                             "1..65535") != std::string::npos);
    CHECK(child.out_buf.empty());
  }
  SUBCASE("a card URL that is not an absolute http(s) URL, from a flag or the config file") {
    {
      Child child({"serve", "--listen", "127.0.0.1:0", "--public-url", "https://user:pw@agents.example.com/"});
      CHECK(WEXITSTATUS(child.wait_exit()) == 1);
      CHECK(child.err_buf.find("a2a.public_url (--public-url) 'https://user:pw@agents.example.com/': a URL here holds "
                               "no user name or password") != std::string::npos);
    }
    TempDir dir;
    // A control byte in the value is shown escaped: the message cannot
    // drive the terminal or forge a line.
    { std::ofstream f(dir.path / "c.json"); f << R"({"a2a":{"documentation_url":"https://docs.example/\u001b[2J\n"}})"; }
    Child child({"serve", "--listen", "127.0.0.1:0", "--config", (dir.path / "c.json").string()});
    CHECK(WEXITSTATUS(child.wait_exit()) == 1);
    CHECK(child.err_buf.find("a2a.documentation_url 'https://docs.example/\\x1b[2J\\x0a': byte 21 is a blank, a "
                             "control byte") != std::string::npos);
    CHECK(child.err_buf.find('\x1b') == std::string::npos);
  }
  SUBCASE("a key given twice in one object of the config file") {
    TempDir dir;
    {
      std::ofstream f(dir.path / "c.json");
      f << R"({"a2a":{"store":"memory","name":"x"},"auth":{"jwt":{"issuer":"https://a","issuer":"https://b"}}})";
    }
    Child child({"serve", "--listen", "127.0.0.1:0", "--config", (dir.path / "c.json").string()});
    CHECK(WEXITSTATUS(child.wait_exit()) == 2);
    CHECK(child.err_buf.find("the key auth.jwt.issuer is given twice in one object") != std::string::npos);
    CHECK(child.out_buf.empty());
  }
  SUBCASE("--help") {
    Child child({"serve", "--help"});
    CHECK(WEXITSTATUS(child.wait_exit()) == 0);
    CHECK(child.out_buf.find("usage: toolnexus serve") != std::string::npos);
    CHECK(child.out_buf.find("\"openid_configuration_url\"") != std::string::npos);
  }
}

TEST_CASE("two toolnexus processes share one multi-process store: created by one, resumed by the other") {
  toolnexus::PluginRegistry::global().load();
  const auto schemes = toolnexus::PluginRegistry::global().schemes();
  if (std::find(schemes.begin(), schemes.end(), "sqlite") == schemes.end()) {
    MESSAGE("no sqlite plugin built: skipped");
    return;
  }
  TempDir dir;
  const std::string selector = "sqlite:" + (dir.path / "tasks.db").string();
  Child a({"serve", "--listen", "127.0.0.1:0", "--store", selector, "--agent", "approval", "--settle-interval-ms",
           "50", "--lease-ms", "1000", "--lease-renew-ms", "100"});
  Child b({"serve", "--listen", "127.0.0.1:0", "--store", selector, "--agent", "approval", "--settle-interval-ms",
           "50", "--lease-ms", "1000", "--lease-renew-ms", "100"});
  Client ca(url_from(a.first_stdout_line()));
  Client cb(url_from(b.first_stdout_line()));
  const std::string id = task_id(ca.send("shared"));
  REQUIRE(state_of(ca.wait_settled(id)) == "input-required");
  CHECK(state_of(cb.get_task(id)) == "input-required");
  cb.send("yes", R"("taskId":)" + q(id));
  auto done = ca.wait_settled(id);
  CHECK(state_of(done) == "completed");
  CHECK(artifact_text(done["result"]) == "shared");
  ::kill(a.pid, SIGTERM);
  ::kill(b.pid, SIGTERM);
  CHECK(a.wait_exit() == 0);
  CHECK(b.wait_exit() == 0);
  CHECK(a.err_buf.find("settled") == std::string::npos);  // neither settled the other's Task
  CHECK(b.err_buf.find("settled") == std::string::npos);
}

TEST_CASE("--allow-insecure-plugins, which every refusal suggests, is accepted by serve and toolnexus-conformance") {
  // A plugin directory writable by its group: refused, with the advice...
  TempDir dir;
  const std::filesystem::path plugins = dir.path / "plugins";
  std::filesystem::create_directories(plugins);
  std::filesystem::copy_file(std::string(TOOLNEXUS_TEST_FIXTURE_DIR) + "/good/libfixture_good.so",
                             plugins / "libfixture.so");
  std::filesystem::permissions(plugins, std::filesystem::perms::group_write, std::filesystem::perm_options::add);
  {
    Child child({"serve", "--listen", "127.0.0.1:0", "--plugin-dir", plugins.string(), "--store", "fixture:x"});
    const int st = child.wait_exit();
    REQUIRE(st != -1);
    CHECK(WEXITSTATUS(st) != 0);
    CHECK_MESSAGE(child.err_buf.find("use --allow-insecure-plugins") != std::string::npos, child.err_buf);
  }
  // ...which serve then takes, as a flag and as a config key.
  {
    Child child({"serve", "--listen", "127.0.0.1:0", "--plugin-dir", plugins.string(), "--allow-insecure-plugins",
                 "--store", "fixture:x"});
    url_from(child.first_stdout_line());
    REQUIRE(::kill(child.pid, SIGTERM) == 0);
    CHECK(child.wait_exit() != -1);
  }
  {
    const std::filesystem::path config = dir.path / "serve.json";
    std::ofstream(config) << R"({"plugin_dirs": ["plugins"], "allow_insecure_plugins": true, "a2a": {"store": "fixture:x"}})";
    Child child({"serve", "--listen", "127.0.0.1:0", "--config", config.string()});
    url_from(child.first_stdout_line());
    REQUIRE(::kill(child.pid, SIGTERM) == 0);
    CHECK(child.wait_exit() != -1);
  }
  // toolnexus-conformance too.
  const std::string conf = std::string(TOOLNEXUS_BIN_DIR) + "/toolnexus-conformance";
  const std::string cmd = "'" + conf + "' --allow-insecure-plugins --plugin-dir '" + plugins.string() +
                          "' --rule info fixture:x >/dev/null 2>&1";
  const int st = std::system(cmd.c_str());
  CHECK((WIFEXITED(st) && WEXITSTATUS(st) == 0));
  std::filesystem::permissions(plugins, std::filesystem::perms::group_write, std::filesystem::perm_options::remove);
}

namespace {

std::vector<std::string> stream_server_args(const std::string &store, const std::string &agent) {
  return {"serve", "--listen", "127.0.0.1:0", "--store", store, "--agent", agent, "--echo-chunk-delay-ms", "300",
          "--progress-interval-ms", "1", "--lease-ms", "1000", "--lease-renew-ms", "400", "--settle-interval-ms",
          "200", "--stream-poll-ms", "50"};
}

}  // namespace

TEST_CASE("streams across a SIGKILL: a reconnect with Last-Event-ID to the restarted server loses and repeats nothing") {
  TempDir dir;
  const std::string store = "file:" + dir.str();
  std::vector<SseEvent> before;
  std::string task;
  {
    Child a(stream_server_args(store, "echo"));
    const std::string url = url_from(a.first_stdout_line());
    Connection conn(port_of(url));
    // Eight words: four chunks, 300 ms apart.
    SseReader sse(conn, rpc_request("SendStreamingMessage",
                                    R"({"message":{"role":"ROLE_USER","messageId":"k1","parts":[{"text":)"
                                    R"("one two three four five six seven eight"}]}})",
                                    "1", "A2A-Version: 1.0\r\n"));
    // The Task, working and the first chunks; then the server dies mid-Task.
    while (before.size() < 4) {
      auto e = sse.next(5000ms);
      REQUIRE_MESSAGE(e.has_value(), "the stream ended early; stderr: " << a.err_buf);
      before.push_back(*e);
    }
    task = parse(before[0].data)["result"]["task"]["id"].GetString();
    ::kill(a.pid, SIGKILL);
    a.wait_exit();
  }
  Child b(stream_server_args(store, "echo"));
  const std::string url = url_from(b.first_stdout_line());
  Connection conn(port_of(url));
  SseReader sse(conn, rpc_request("SubscribeToTask", R"({"id":)" + q(task) + "}", "2",
                                  "A2A-Version: 1.0\r\nLast-Event-ID: " + before.back().id + "\r\n"));
  REQUIRE(sse.status() == 200);
  const std::vector<SseEvent> after = sse.rest(10000ms);
  CHECK(sse.ended());
  REQUIRE(!after.empty());
  // Every event number once, in order, across both connections.
  std::vector<SseEvent> all = before;
  all.insert(all.end(), after.begin(), after.end());
  for (std::size_t i = 1; i < all.size(); ++i) {
    CAPTURE(i);
    CHECK(std::stoull(all[i].id) == std::stoull(all[i - 1].id) + 1);
  }
  // The run died with its server: the next server settles it (lease expiry)
  // and the subscriber sees that as the last event.
  auto last = parse(after.back().data);
  CHECK(std::string(last["result"]["statusUpdate"]["status"]["state"].GetString()) == "TASK_STATE_FAILED");
  const std::string why = last["result"]["statusUpdate"]["status"]["message"]["parts"][0]["text"].GetString();
  CHECK(why.find("The server that ran this Task stopped before finishing it") == 0);
}

TEST_CASE("subscribe after a restart: the parked Task's snapshot, then its run once a message resumes it") {
  TempDir dir;
  const std::string store = "file:" + dir.str();
  std::string task;
  {
    Child a(stream_server_args(store, "approval"));
    Client c(url_from(a.first_stdout_line()));
    task = task_id(c.send("ship 2.0"));
    CHECK(state_of(c.wait_settled(task)) == "input-required");
    ::kill(a.pid, SIGKILL);
    a.wait_exit();
  }
  Child b(stream_server_args(store, "approval"));
  const std::string url = url_from(b.first_stdout_line());
  Connection conn(port_of(url));
  SseReader sse(conn, rpc_request("tasks/resubscribe", R"({"id":)" + q(task) + "}", "3"));
  auto snap = sse.next();
  REQUIRE(snap);
  CHECK(std::string(parse(snap->data)["result"]["status"]["state"].GetString()) == "input-required");
  Client c(url);
  c.send("approve", R"("taskId":)" + q(task), "");
  auto rest = sse.rest();
  REQUIRE(rest.size() == 3);
  CHECK(std::string(parse(rest[0].data)["result"]["status"]["state"].GetString()) == "working");
  CHECK(std::string(parse(rest[1].data)["result"]["kind"].GetString()) == "artifact-update");
  auto done = parse(rest[2].data);
  CHECK(std::string(done["result"]["status"]["state"].GetString()) == "completed");
  CHECK(done["result"]["final"].GetBool());
}

namespace {

// The v1.0 state of a StreamResponse frame ("" when it has none).
std::string frame_state(const SseEvent &e) {
  auto d = parse(e.data);
  if (!d.HasMember("result")) return "";
  const auto &r = d["result"];
  if (r.HasMember("statusUpdate")) return r["statusUpdate"]["status"]["state"].GetString();
  if (r.HasMember("task")) return r["task"]["status"]["state"].GetString();
  return "";
}

// A v1.0 SendStreamingMessage with one text part, as request bytes.
std::string stream_request(const std::string &text) {
  return rpc_request("SendStreamingMessage",
                     R"({"message":{"role":"ROLE_USER","messageId":"d1","parts":[{"text":)" + q(text) + "}]}}", "7",
                     "A2A-Version: 1.0\r\n");
}

// Checks that `e` is the frame a stopping server ends a stream with: retry,
// event: error, a JSON-RPC error naming the Task and the Last-Event-ID to
// resubscribe with.
void check_reconnect_frame(const SseEvent &e, const std::string &task, const std::string &last_id) {
  CHECK(e.event == "error");
  CHECK(e.retry == "1000");
  auto d = parse(e.data);
  REQUIRE_MESSAGE(d.HasMember("error"), e.data);
  CHECK(d["id"].GetInt() == 7);
  CHECK(d["error"]["code"].GetInt() == -32603);
  CHECK(std::string(d["error"]["message"].GetString()).find("Last-Event-ID: " + last_id) != std::string::npos);
  const auto &md = d["error"]["data"][0]["metadata"];
  CHECK(std::string(md["taskId"].GetString()) == task);
  CHECK(std::string(md["lastEventId"].GetString()) == last_id);
}

// The first three events of a streamed echo (the Task, working, the first
// chunk); fails naming the child's stderr when the stream ends before.
std::vector<SseEvent> first_three_events(SseReader &sse, const Child &child) {
  std::vector<SseEvent> events;
  while (events.size() < 3) {
    auto e = sse.next(5000ms);
    REQUIRE_MESSAGE(e.has_value(), "the stream ended early; stderr: " << child.err_buf);
    events.push_back(*e);
  }
  return events;
}

}  // namespace

TEST_CASE("SIGTERM mid-Task: the Task's stream stays open through the drain and ends with the Task's last event") {
  TempDir dir;
  Child a({"serve", "--listen", "127.0.0.1:0", "--store", "file:" + dir.str(), "--echo-chunk-delay-ms", "400"});
  const std::string url = url_from(a.first_stdout_line());
  Connection conn(port_of(url));
  SseReader sse(conn, stream_request("one two three four"));
  std::vector<SseEvent> events = first_three_events(sse, a);  // the Task, working, the first chunk
  REQUIRE(::kill(a.pid, SIGTERM) == 0);
  // The run goes on for about another 1.2 s; the stream with it.
  for (auto &e : sse.rest(10000ms)) events.push_back(e);
  CHECK(sse.ended());
  REQUIRE(!events.empty());
  CHECK(events.back().event.empty());
  CHECK(frame_state(events.back()) == "TASK_STATE_COMPLETED");
  std::size_t chunks = 0;
  for (const auto &e : events) chunks += e.data.find("artifactUpdate") != std::string::npos ? 1 : 0;
  CHECK(chunks == 4);
  const int st = a.wait_exit(10000ms);
  CHECK((st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0));
}

TEST_CASE("SIGTERM: a stream of a Task not running here, or outliving the drain, ends with a reconnect frame") {
  TempDir dir;
  SUBCASE("a parked Task's stream ends at once") {
    Child a({"serve", "--listen", "127.0.0.1:0", "--store", "file:" + dir.str(), "--agent", "approval"});
    const std::string url = url_from(a.first_stdout_line());
    Client c(url);
    const std::string task = task_id(c.send("ship it"));
    REQUIRE(state_of(c.wait_settled(task)) == "input-required");
    Connection conn(port_of(url)), conn03(port_of(url)), conn_rest(port_of(url));
    SseReader sse(conn, rpc_request("SubscribeToTask", R"({"id":)" + q(task) + "}", "7", "A2A-Version: 1.0\r\n"));
    SseReader sse03(conn03, rpc_request("tasks/resubscribe", R"({"id":)" + q(task) + "}", "8"));
    SseReader sse_rest(conn_rest, "GET /tasks/" + task + ":subscribe HTTP/1.1\r\nHost: localhost\r\n\r\n");
    auto snap = sse.next();
    REQUIRE(snap);
    REQUIRE(sse03.next());
    REQUIRE(sse_rest.next());
    REQUIRE(::kill(a.pid, SIGTERM) == 0);
    auto rest = sse.rest(5000ms);
    CHECK(sse.ended());
    REQUIRE(rest.size() == 1);
    check_reconnect_frame(rest[0], task, snap->id);
    // v0.3: the same error, its facts in error.data.
    auto rest03 = sse03.rest(5000ms);
    REQUIRE(rest03.size() == 1);
    CHECK(rest03[0].event == "error");
    auto e03 = parse(rest03[0].data);
    CHECK(e03["id"].GetInt() == 8);
    CHECK(std::string(e03["error"]["data"]["taskId"].GetString()) == task);
    CHECK(std::string(e03["error"]["data"]["lastEventId"].GetString()) == snap->id);
    // HTTP+JSON: a google.rpc.Status, 503 UNAVAILABLE.
    auto rest_rest = sse_rest.rest(5000ms);
    REQUIRE(rest_rest.size() == 1);
    CHECK(rest_rest[0].event == "error");
    CHECK(rest_rest[0].retry == "1000");
    auto er = parse(rest_rest[0].data);
    CHECK(er["error"]["code"].GetInt() == 503);
    CHECK(std::string(er["error"]["status"].GetString()) == "UNAVAILABLE");
    CHECK(std::string(er["error"]["details"][0]["metadata"]["lastEventId"].GetString()) == snap->id);
    CHECK(a.wait_exit(10000ms) != -1);
  }
  SUBCASE("a Task running past --drain-timeout-ms") {
    Child a({"serve", "--listen", "127.0.0.1:0", "--store", "file:" + dir.str(), "--echo-chunk-delay-ms", "5000",
             "--drain-timeout-ms", "300"});
    const std::string url = url_from(a.first_stdout_line());
    Connection conn(port_of(url));
    SseReader sse(conn, stream_request("one two three four"));
    std::vector<SseEvent> events = first_three_events(sse, a);  // the Task, working, the first chunk
    const std::string task = parse(events[0].data)["result"]["task"]["id"].GetString();
    REQUIRE(::kill(a.pid, SIGTERM) == 0);
    auto rest = sse.rest(10000ms);
    CHECK(sse.ended());
    REQUIRE(!rest.empty());
    check_reconnect_frame(rest.back(), task, events.back().id);
    CHECK(a.wait_exit(10000ms) != -1);
    // The Task fails saying why: not the agent's answer to being asked to
    // stop (the echo agent's "canceled": nobody canceled it).
    auto store = toolnexus::resolve_store("file:" + dir.str());
    auto stored = store->get(task);
    REQUIRE(stored);
    CHECK(stored->state == "failed");
    const std::string text = to_json(stored->task().json()["status"]["message"]);
    CHECK_MESSAGE(text.find("The server stopped before this Task finished") != std::string::npos, text);
    CHECK_MESSAGE(text.find("drain timeout (300 ms)") != std::string::npos, text);
    CHECK_MESSAGE(text.find("canceled") == std::string::npos, text);
  }
}

namespace {

// The instance id a server logged at start ("..., instance ID ...").
std::string logged_instance(Child &c) {
  const auto deadline = Clock::now() + 5000ms;
  static const std::regex re(R"(instance ([0-9a-f-]{36}))");
  std::smatch m;
  while (!std::regex_search(c.err_buf, m, re) && Clock::now() < deadline) c.pump(50);
  REQUIRE_MESSAGE(std::regex_search(c.err_buf, m, re), "no instance id logged: " << c.err_buf);
  return m[1];
}

std::vector<std::string> restart_args(const std::string &store) {
  // A lease of a minute: a settle by lease expiry would come far too late.
  return {"serve", "--listen", "127.0.0.1:0", "--store", store, "--echo-chunk-delay-ms", "1500",
          "--progress-interval-ms", "1", "--lease-ms", "60000", "--lease-renew-ms", "1000", "--settle-interval-ms",
          "60000", "--stream-poll-ms", "50"};
}

}  // namespace

TEST_CASE("a server restarted after SIGKILL is the same instance and settles what it left running at once") {
  TempDir dir;
  const std::string store = "file:" + dir.str();
  std::vector<SseEvent> before;
  std::string task, first_id;
  {
    Child a(restart_args(store));
    Connection conn(port_of(url_from(a.first_stdout_line())));
    first_id = logged_instance(a);
    SseReader sse(conn, stream_request("one two three four"));
    while (before.size() < 3) {
      auto e = sse.next(5000ms);
      REQUIRE_MESSAGE(e.has_value(), "the stream ended early; stderr: " << a.err_buf);
      before.push_back(*e);
    }
    task = parse(before[0].data)["result"]["task"]["id"].GetString();
    ::kill(a.pid, SIGKILL);
    a.wait_exit();
  }
  Child b(restart_args(store));
  const std::string url = url_from(b.first_stdout_line());
  CHECK(logged_instance(b) == first_id);  // kept in the store's directory
  Connection conn(port_of(url));
  SseReader sse(conn, rpc_request("SubscribeToTask", R"({"id":)" + q(task) + "}", "2",
                                  "A2A-Version: 1.0\r\nLast-Event-ID: " + before.back().id + "\r\n"));
  REQUIRE(sse.status() == 200);
  // Not one lease (a minute) later: at once.
  const std::vector<SseEvent> after = sse.rest(10000ms);
  CHECK(sse.ended());
  REQUIRE(!after.empty());
  CHECK(std::stoull(after.front().id) == std::stoull(before.back().id) + 1);
  REQUIRE(frame_state(after.back()) == "TASK_STATE_FAILED");
  const std::string why =
      parse(after.back().data)["result"]["statusUpdate"]["status"]["message"]["parts"][0]["text"].GetString();
  CHECK(why.find("restarted while the Task was running") != std::string::npos);

  // A replica on the same store is another instance, and a restart of b
  // never settles the replica's running Task.
  Child c(restart_args(store));
  Client cc(url_from(c.first_stdout_line()));
  CHECK(logged_instance(c) != first_id);
  const std::string running = task_id(cc.send("five six seven eight"));
  ::kill(b.pid, SIGKILL);
  b.wait_exit();
  Child b2(restart_args(store));
  Client cb(url_from(b2.first_stdout_line()));
  CHECK(logged_instance(b2) == first_id);
  auto done = cc.wait_settled(running, 15000ms);
  CHECK(state_of(done) == "completed");
  CHECK(artifact_text(done["result"]) == "five six seven eight");
}

TEST_CASE("--admin-listen: /readyz answers 503 from the start of the drain after SIGTERM, while streams still run") {
  TempDir dir;
  Child a({"serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--store", "file:" + dir.str(),
           "--echo-chunk-delay-ms", "800"});
  const std::string url = url_from(a.first_stdout_line());
  // The second stdout line names the admin listener.
  const auto deadline = Clock::now() + 5000ms;
  while (std::count(a.out_buf.begin(), a.out_buf.end(), '\n') < 2 && Clock::now() < deadline) a.pump(50);
  static const std::regex admin_re(R"(^listening on [^\n]*\nadmin listening on (http://127\.0\.0\.1:([0-9]+)/)\n)");
  std::smatch m;
  REQUIRE_MESSAGE(std::regex_search(a.out_buf, m, admin_re), "stdout: " << a.out_buf);
  const int admin_port = std::stoi(m[2]);
  REQUIRE(admin_port != port_of(url));
  const auto readyz = [admin_port] {
    Connection c(admin_port);
    return c.get("/readyz");
  };
  CHECK(readyz().status == 200);
  {
    Connection api(port_of(url));
    CHECK(api.get("/readyz").status == 200);  // the API listener has the probes too
  }

  Connection conn(port_of(url));
  SseReader sse(conn, stream_request("one two three four"));
  std::vector<SseEvent> events = first_three_events(sse, a);  // the Task, working, the first chunk
  REQUIRE(::kill(a.pid, SIGTERM) == 0);
  HttpResponse draining;
  REQUIRE(eventually([&] { return (draining = readyz()).status == 503; }, 5000ms));
  CHECK(draining.body ==
        "not ready: this server is stopping (the drain began); send new requests to another replica\n");
  // The balancer was told while the Task's stream still runs: its next
  // chunks come after the 503.
  CHECK(!sse.ended());
  {
    Connection admin(admin_port);
    const std::string page = admin.get("/metrics").body;
    CHECK(page.find("\ntoolnexus_ready 0\n") != std::string::npos);
    CHECK(page.find("\ntoolnexus_streams_open 1\n") != std::string::npos);
    CHECK(page.find("\ntoolnexus_tasks_running 1\n") != std::string::npos);
  }
  for (auto &e : sse.rest(15000ms)) events.push_back(e);
  CHECK(sse.ended());
  CHECK(frame_state(events.back()) == "TASK_STATE_COMPLETED");
  std::size_t chunks = 0;
  for (const auto &e : events) chunks += e.data.find("artifactUpdate") != std::string::npos ? 1 : 0;
  CHECK(chunks == 4);
  const int st = a.wait_exit(10000ms);
  CHECK((st != -1 && WIFEXITED(st) && WEXITSTATUS(st) == 0));
}

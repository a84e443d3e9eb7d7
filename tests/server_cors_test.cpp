// CORS for a2a.allowed_origins (issue 19, item 4's sibling): a listed
// site's page could pass the Origin check, but the server sent no CORS
// fields and answered the preflight OPTIONS 404, so a browser never let the
// page send a JSON request or read an answer. The Fetch standard's CORS
// protocol: preflights answered 204 with what the page may send; actual
// answers (errors and streams too) carry Access-Control-Allow-Origin.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include "server_test_support.hpp"

#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <thread>

using namespace tnxtest;

namespace {

const std::string kConsole = "https://console.example.com";

HttpResponse send(int port, const std::string &line, const std::string &head, const std::string &body = {}) {
  Connection c(port);
  std::string req = line + " HTTP/1.1\r\nHost: 127.0.0.1:" + std::to_string(port) + "\r\n" + head;
  if (!body.empty()) req += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  c.send_raw(req + "\r\n" + body);
  return c.read_response(5000ms);
}

std::string preflight(const std::string &origin, const std::string &method, const std::string &headers) {
  return "Origin: " + origin + "\r\nAccess-Control-Request-Method: " + method +
         "\r\nAccess-Control-Request-Headers: " + headers + "\r\n";
}

bool lists(const std::string &field, const std::string &name) {
  std::string f = field, n = name;
  for (char &c : f) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (char &c : n) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  std::size_t at = 0;
  while ((at = f.find(n, at)) != std::string::npos) {
    const bool start = at == 0 || f[at - 1] == ' ' || f[at - 1] == ',';
    const std::size_t end = at + n.size();
    if (start && (end == f.size() || f[end] == ',' || f[end] == ' ')) return true;
    at = end;
  }
  return false;
}

const std::string kList = R"({"jsonrpc":"2.0","id":1,"method":"ListTasks","params":{}})";

}  // namespace

TEST_CASE("a preflight from an allowed origin is answered 204 with what its page may send") {
  auto o = test_options();
  o.card.allowed_origins = {kConsole};
  auto server = toolnexus::serve(o);
  const int port = port_of(server.url());
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"/", "POST"}, {"/tasks", "GET"}, {"/message:stream", "POST"}, {"/tasks/x:cancel", "POST"},
      {"/tasks/x:subscribe", "GET"}};
  for (const auto &[path, method] : cases) {
    CAPTURE(path);
    HttpResponse r = send(port, "OPTIONS " + path,
                          preflight(kConsole, method, "content-type,authorization,a2a-version,last-event-id"));
    CHECK(r.status == 204);
    CHECK(r.body.empty());
    CHECK(r.header("access-control-allow-origin") == kConsole);
    CHECK(lists(r.header("access-control-allow-methods"), method));
    for (const char *h : {"Content-Type", "Authorization", "A2A-Version", "A2A-Extensions", "Last-Event-ID"})
      CHECK(lists(r.header("access-control-allow-headers"), h));
    CHECK(r.header("access-control-max-age") == "600");
    CHECK(lists(r.header("vary"), "Origin"));
    CHECK(r.header("access-control-allow-credentials").empty());
  }
  // "*" allows any origin, and still echoes it (a page may send Authorization).
  o.card.allowed_origins = {"*"};
  auto any = toolnexus::serve(o);
  HttpResponse r = send(port_of(any.url()), "OPTIONS /", preflight("https://other.example", "POST", "content-type"));
  CHECK(r.status == 204);
  CHECK(r.header("access-control-allow-origin") == "https://other.example");
}

TEST_CASE("a preflight from an origin not allowed is refused 403 with the Origin check's message") {
  auto o = test_options();
  o.card.allowed_origins = {kConsole};
  auto server = toolnexus::serve(o);
  const int port = port_of(server.url());
  for (const std::string &origin : {std::string("https://evil.example"), std::string("http://console.example.com")}) {
    CAPTURE(origin);
    HttpResponse r = send(port, "OPTIONS /", preflight(origin, "POST", "content-type"));
    CHECK(r.status == 403);
    CHECK(r.body.find("cross-site request from Origin '" + origin + "' refused") != std::string::npos);
    CHECK(r.header("access-control-allow-origin").empty());
    CHECK(r.header("access-control-allow-methods").empty());
  }
  // OPTIONS without a preflight says what the path takes.
  HttpResponse plain = send(port, "OPTIONS /tasks", "");
  CHECK(plain.status == 204);
  CHECK(plain.header("allow") == "GET, OPTIONS");
  CHECK(send(port, "OPTIONS /nowhere", "").status == 404);
}

TEST_CASE("answers to an allowed origin carry Access-Control-Allow-Origin: results, errors and streams") {
  auto o = test_options();
  o.card.allowed_origins = {kConsole};
  o.auth_tokens = {{"t0ken", "alice"}};
  auto server = toolnexus::serve(o);
  const int port = port_of(server.url());
  const std::string from = "Origin: " + kConsole + "\r\n";
  const std::string auth = "Authorization: Bearer t0ken\r\n";
  const auto cors = [](const HttpResponse &r) {
    CHECK(r.header("access-control-allow-origin") == kConsole);
    CHECK(lists(r.header("vary"), "Origin"));
    CHECK(lists(r.header("access-control-expose-headers"), "WWW-Authenticate"));
  };
  HttpResponse ok = send(port, "POST /", from + auth + "Content-Type: application/json\r\n", kList);
  CHECK(ok.status == 200);
  cors(ok);
  HttpResponse denied = send(port, "GET /tasks", from);
  CHECK(denied.status == 401);
  CHECK(!denied.header("www-authenticate").empty());
  cors(denied);
  HttpResponse unsupported = send(port, "POST /", from + auth + "Content-Type: text/plain\r\n", kList);
  CHECK(unsupported.status == 415);
  cors(unsupported);
  HttpResponse missing = send(port, "GET /tasks/nope", from + auth);
  CHECK(missing.status == 404);
  cors(missing);
  // A stream's head.
  Connection conn(port);
  const std::string body = R"({"message":{"role":"ROLE_USER","messageId":"m-1","parts":[{"text":"hi"}]}})";
  SseReader sse(conn, "POST /message:stream HTTP/1.1\r\nHost: 127.0.0.1\r\n" + from + auth +
                          "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
                          "\r\n\r\n" + body);
  CHECK(sse.status() == 200);
  CHECK(sse.header("content-type").find("text/event-stream") == 0);
  cors(sse.head());
  CHECK(!sse.rest().empty());
  // No Origin: no CORS fields, but the answer still varies by Origin.
  HttpResponse plain = send(port, "GET /tasks", auth);
  CHECK(plain.status == 200);
  CHECK(plain.header("access-control-allow-origin").empty());
  CHECK(lists(plain.header("vary"), "Origin"));
}

namespace {

// Serves `html` to every request on 127.0.0.1 (another origin than the
// API's: another port) until destroyed.
class PageServer {
 public:
  explicit PageServer(std::string html) : html_(std::move(html)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd_, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0);
    REQUIRE(::listen(fd_, 16) == 0);
    socklen_t len = sizeof a;
    ::getsockname(fd_, reinterpret_cast<sockaddr *>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this] {
      for (;;) {
        const int c = ::accept(fd_, nullptr, nullptr);
        if (c < 0 || stop_) {
          if (c >= 0) ::close(c);
          return;
        }
        char buf[4096];
        (void)::recv(c, buf, sizeof buf, 0);
        const std::string answer = "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nConnection: close\r\n"
                                   "Content-Length: " + std::to_string(html_.size()) + "\r\n\r\n" + html_;
        (void)::send(c, answer.data(), answer.size(), MSG_NOSIGNAL);
        ::close(c);
      }
    });
  }
  ~PageServer() {
    stop_ = true;
    ::shutdown(fd_, SHUT_RDWR);
    thread_.join();
    ::close(fd_);
  }
  int port() const { return port_; }

 private:
  std::string html_;
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// The page's DOM after chromium ran its script ("" when chromium is absent).
std::string chromium_dom(const std::string &url, const TempDir &dir) {
  const std::string out = (dir.path / "dom.html").string();
  const std::string cmd = "timeout 120 chromium --headless --no-sandbox --disable-gpu --disable-dev-shm-usage "
                          "--user-data-dir=" +
                          (dir.path / "profile").string() + " --virtual-time-budget=15000 --dump-dom '" + url +
                          "' >" + out + " 2>/dev/null";
  if (std::system(cmd.c_str()) != 0) return {};
  std::ifstream f(out);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

}  // namespace

TEST_CASE("chromium: a page of an allowed origin calls the API (preflighted JSON POST, a REST GET); others cannot") {
  if (std::system("command -v chromium >/dev/null 2>&1") != 0) {
    MESSAGE("chromium is not installed: skipped (apt-get install chromium)");
    return;
  }
  {
    // A chromium that cannot run here (no /dev/shm, a bare chroot) is not
    // what this test checks: it must run a page's script first.
    TempDir probe;
    const std::string dom = chromium_dom("data:text/html,<p id=p></p><script>p.textContent=6*7</script>", probe);
    if (dom.find("<p id=\"p\">42</p>") == std::string::npos) {
      MESSAGE("chromium does not run a page here: skipped (" << dom.substr(0, 200) << ")");
      return;
    }
  }
  auto o = test_options();
  o.auth_tokens = {{"t0ken", "alice"}};
  // The page's origin is known only once its server listens.
  const std::string script = R"(<!doctype html><html><body><pre id="out">pending</pre><script>
const api = location.hash.slice(1);
const headers = {'Content-Type': 'application/json', 'Authorization': 'Bearer t0ken', 'A2A-Version': '1.0'};
Promise.all([
  fetch(api + '/', {method: 'POST', headers, body: JSON.stringify({jsonrpc: '2.0', id: 7, method: 'ListTasks', params: {}})})
    .then(r => r.json().then(j => 'rpc ' + r.status + ' id=' + j.id)),
  fetch(api + '/tasks', {headers}).then(r => 'rest ' + r.status),
  fetch(api + '/tasks/nope', {headers}).then(r => r.text().then(t => 'missing ' + r.status))
]).then(all => { document.getElementById('out').textContent = 'done ' + all.join(' | '); },
        e => { document.getElementById('out').textContent = 'failed ' + e; });
</script></body></html>)";
  PageServer page(script);
  const std::string page_origin = "http://127.0.0.1:" + std::to_string(page.port());
  TempDir dir;
  SUBCASE("allowed") {
    o.card.allowed_origins = {page_origin};
    auto server = toolnexus::serve(o);
    const std::string api = "http://127.0.0.1:" + std::to_string(port_of(server.url()));
    const std::string dom = chromium_dom(page_origin + "/#" + api, dir);
    CAPTURE(dom);
    CHECK(dom.find("done rpc 200 id=7 | rest 200") != std::string::npos);
    CHECK(dom.find("missing 404") != std::string::npos);
  }
  SUBCASE("not allowed") {
    o.card.allowed_origins = {"https://console.example.com"};
    auto server = toolnexus::serve(o);
    const std::string api = "http://127.0.0.1:" + std::to_string(port_of(server.url()));
    const std::string dom = chromium_dom(page_origin + "/#" + api, dir);
    CAPTURE(dom);
    CHECK(dom.find("failed TypeError") != std::string::npos);
  }
}

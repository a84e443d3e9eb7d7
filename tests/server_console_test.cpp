// The approval console's static files (issue 24 part 1): served under
// /console/ only when the console is on, by exact name (no listing, no
// "..", no symlink out of the directory, no hidden file), with the right
// Content-Type, an ETag answered 304, and the strict Content-Security-Policy
// the page relies on. The page's own API calls are same-origin: they pass
// the Origin check. The browser half is tests/console/console.test.mjs.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include "server_test_support.hpp"

#include <sys/wait.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <tuple>

using namespace tnxtest;

namespace {

const std::string kCsp =
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

HttpResponse send(int port, const std::string &line, const std::string &head = {}) {
  Connection c(port);
  c.send_raw(line + " HTTP/1.1\r\nHost: 127.0.0.1:" + std::to_string(port) + "\r\n" + head + "\r\n");
  return c.read_response(5000ms);
}

void write_file(const std::filesystem::path &p, const std::string &text) {
  std::filesystem::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << text;
}

// A console directory with a page, a module, a hidden file, and symlinks
// in and out of it; `outside` holds a secret next to it.
struct ConsoleTree {
  TempDir tmp;
  std::filesystem::path dir = tmp.path / "console";
  ConsoleTree() {
    write_file(dir / "index.html", "<!doctype html><title>t</title>");
    write_file(dir / "app.js", "export const x = 1;\n");
    write_file(dir / "style.css", "body{}\n");
    write_file(dir / "img" / "logo.svg", "<svg/>");
    write_file(dir / ".env", "SECRET=1");
    write_file(tmp.path / "secret.txt", "top secret");
    std::filesystem::create_symlink(tmp.path / "secret.txt", dir / "escape.txt");
    std::filesystem::create_symlink(tmp.path, dir / "up");
    std::filesystem::create_symlink(dir / "app.js", dir / "alias.js");
  }
};

toolnexus::ServerOptions console_options(const std::string &dir) {
  auto o = test_options();
  o.console = true;
  o.console_dir = dir;
  return o;
}

}  // namespace

TEST_CASE("the console is off by default: /console/ is 404 like any unknown path") {
  ConsoleTree t;
  auto o = test_options();
  o.console_dir = t.dir.string();  // a directory alone does not turn it on
  auto server = toolnexus::serve(o);
  const int port = port_of(server.url());
  CHECK(send(port, "GET /console/").status == 404);
  CHECK(send(port, "GET /console/index.html").status == 404);
  CHECK(send(port, "GET /console/index.html").header("content-security-policy").empty());
}

TEST_CASE("its files are served by exact name, with their type and the console's security headers") {
  ConsoleTree t;
  auto server = toolnexus::serve(console_options(t.dir.string()));
  const int port = port_of(server.url());
  const std::vector<std::pair<std::string, std::string>> files = {
      {"/console/", "text/html; charset=utf-8"},
      {"/console/index.html", "text/html; charset=utf-8"},
      {"/console/app.js", "text/javascript; charset=utf-8"},
      {"/console/style.css", "text/css; charset=utf-8"},
      {"/console/img/logo.svg", "image/svg+xml"},
      {"/console/alias.js", "text/javascript; charset=utf-8"},  // a symlink that stays inside
  };
  for (const auto &[path, type] : files) {
    CAPTURE(path);
    const HttpResponse r = send(port, "GET " + path);
    CHECK(r.status == 200);
    CHECK(r.header("content-type") == type);
    CHECK(r.header("content-security-policy") == kCsp);
    CHECK(r.header("x-content-type-options") == "nosniff");
    CHECK(r.header("referrer-policy") == "no-referrer");
    CHECK(r.header("etag").size() == 66);
  }
  CHECK(send(port, "GET /console/index.html").body == "<!doctype html><title>t</title>");
  CHECK(send(port, "GET /console/app.js?v=2").body == "export const x = 1;\n");
  // HEAD: the header block only, with the GET's Content-Length.
  Connection c(port);
  REQUIRE(c.send_raw("HEAD /console/app.js HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"));
  REQUIRE(c.closed_within(1500ms) == false);
  const std::string head = c.take_received();
  CHECK(head.rfind("HTTP/1.1 200", 0) == 0);
  CHECK(head.find("Content-Length: 20\r\n") != std::string::npos);
  CHECK(head.substr(head.size() - 4) == "\r\n\r\n");
}

TEST_CASE("nothing else leaves the directory: no listing, no dot-dot, no hidden file, no symlink out") {
  ConsoleTree t;
  auto server = toolnexus::serve(console_options(t.dir.string()));
  const int port = port_of(server.url());
  for (const std::string path :
       {"/console/img/", "/console/img", "/console/../secret.txt", "/console/%2e%2e/secret.txt",
        "/console/img/../app.js", "/console/./app.js", "/console/.env", "/console/escape.txt",
        "/console/up/secret.txt", "/console//app.js", "/console/nope.js", "/console/app.js/"}) {
    CAPTURE(path);
    const HttpResponse r = send(port, "GET " + path);
    CHECK(r.status == 404);
    CHECK(r.body.find("top secret") == std::string::npos);
    CHECK(r.header("content-security-policy") == kCsp);
  }
}

TEST_CASE("/console redirects to /console/, other methods are 405, an ETag revalidates with 304") {
  ConsoleTree t;
  auto server = toolnexus::serve(console_options(t.dir.string()));
  const int port = port_of(server.url());
  const HttpResponse redirect = send(port, "GET /console");
  CHECK(redirect.status == 308);
  CHECK(redirect.header("location") == "/console/");
  const HttpResponse post = send(port, "POST /console/index.html", "Content-Length: 0\r\n");
  CHECK(post.status == 405);
  CHECK(post.header("allow") == "GET, HEAD");
  const std::string etag = send(port, "GET /console/app.js").header("etag");
  const HttpResponse again = send(port, "GET /console/app.js", "If-None-Match: " + etag + "\r\n");
  CHECK(again.status == 304);
  CHECK(again.body.empty());
  CHECK(again.header("etag") == etag);
  CHECK(send(port, "GET /console/app.js", "If-None-Match: \"other\"\r\n").status == 200);
}

TEST_CASE("the page's own API calls are same-origin: they pass the Origin check; another site's do not") {
  auto server = toolnexus::serve(test_options());
  const int port = port_of(server.url());
  const std::string self = "Origin: http://127.0.0.1:" + std::to_string(port) + "\r\n";
  CHECK(send(port, "GET /tasks?pageSize=1", self).status == 200);
  Connection c(port);
  const std::string body = R"({"message":{"messageId":"m1","role":"ROLE_USER","parts":[{"text":"hi"}]}})";
  c.send_raw("POST /message:send HTTP/1.1\r\nHost: 127.0.0.1:" + std::to_string(port) + "\r\n" + self +
             "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body);
  CHECK(c.read_response(5000ms).status == 200);
  CHECK(send(port, "GET /tasks?pageSize=1", "Origin: https://evil.example\r\n").status == 403);
}

TEST_CASE("a console directory that is missing or has no index.html stops the start, naming it") {
  TempDir tmp;
  const auto missing = tmp.path / "nope";
  const std::string missing_text = missing.string();
  CHECK_THROWS_WITH_AS(toolnexus::serve(console_options(missing_text)), doctest::Contains(missing_text.c_str()),
                       std::invalid_argument);
  write_file(tmp.path / "empty" / "app.js", "");
  CHECK_THROWS_WITH_AS(toolnexus::serve(console_options((tmp.path / "empty").string())),
                       doctest::Contains("has no index.html"), std::invalid_argument);
  auto o = test_options();
  o.console = true;
  CHECK_THROWS_AS(toolnexus::serve(o), std::invalid_argument);
}

TEST_CASE("the shipped console serves its page, whose every script and style is a file of its own") {
  auto server = toolnexus::serve(console_options(TOOLNEXUS_SOURCE_DIR "/console"));
  const int port = port_of(server.url());
  const HttpResponse page = send(port, "GET /console/");
  REQUIRE(page.status == 200);
  // script-src 'self' and style-src 'self': an inline script or style
  // would be blocked, so the page must have none.
  CHECK(page.body.find("<script type=\"module\" src=\"app.js\"></script>") != std::string::npos);
  CHECK(page.body.find("<style") == std::string::npos);
  CHECK(page.body.find("style=") == std::string::npos);
  CHECK(page.body.find("onclick") == std::string::npos);
  for (const std::string f : {"app.js", "api.js", "sse.js", "dom.js", "list.js", "task.js", "style.css"})
    CHECK_MESSAGE(send(port, "GET /console/" + f).status == 200, f);
}

namespace {

// `toolnexus serve ARGS` run to its exit (each case here fails before
// listening): the exit code and stderr.
std::pair<int, std::string> serve_cli(const TempDir &tmp, const std::string &args) {
  const std::string err = (tmp.path / "stderr").string();
  const int st = std::system((std::string(TOOLNEXUS_BIN_DIR) + "/toolnexus serve --listen 127.0.0.1:0 " + args +
                              " </dev/null >/dev/null 2>" + err)
                                 .c_str());
  std::ifstream in(err);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, text};
}

}  // namespace

TEST_CASE("the CLI: --console, --console-dir and the config's console section; bad values name the key") {
  TempDir tmp;
  write_file(tmp.path / "a.json", R"({"console": true})");
  auto [code, err] = serve_cli(tmp, "--config " + (tmp.path / "a.json").string());
  CHECK(code == 2);
  CHECK(err.find("console must be an object") != std::string::npos);
  write_file(tmp.path / "b.json", R"({"console": {"enabled": true, "dri": "x"}})");
  std::tie(code, err) = serve_cli(tmp, "--config " + (tmp.path / "b.json").string());
  CHECK(code == 2);
  CHECK(err.find("unknown key console.dri") != std::string::npos);
  // console.dir is relative to the config file.
  write_file(tmp.path / "conf" / "c.json", R"({"console": {"enabled": true, "dir": "nowhere"}})");
  std::tie(code, err) = serve_cli(tmp, "--config " + (tmp.path / "conf" / "c.json").string());
  CHECK(code == 1);
  CHECK(err.find("'" + (tmp.path / "conf" / "nowhere").string() + "' is not a readable directory") !=
        std::string::npos);
  std::tie(code, err) = serve_cli(tmp, "--console --console-dir " + (tmp.path / "none").string());
  CHECK(code == 1);
  CHECK(err.find((tmp.path / "none").string()) != std::string::npos);
  std::tie(code, err) = serve_cli(tmp, "--console-dir=");
  CHECK(code == 2);
  CHECK(err.find("--console-dir needs a directory") != std::string::npos);
}

// The approval console's static files: read once, answered by exact name
// with the security headers the page relies on (console.hpp).
#include "bindings/console.hpp"

#include "wire/agent_card.hpp"

#include <Poco/Net/HTTPRequest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <system_error>

namespace toolnexus::server_detail {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kPrefix = "/console/";

// The Content-Type of a console file, by its extension.
std::string content_type_of(std::string_view name) {
  const auto dot = name.rfind('.');
  const std::string_view ext = dot == std::string_view::npos ? std::string_view{} : name.substr(dot + 1);
  if (ext == "html") return "text/html; charset=utf-8";
  if (ext == "js" || ext == "mjs") return "text/javascript; charset=utf-8";
  if (ext == "css") return "text/css; charset=utf-8";
  if (ext == "json") return "application/json";
  if (ext == "svg") return "image/svg+xml";
  if (ext == "png") return "image/png";
  if (ext == "ico") return "image/x-icon";
  if (ext == "txt") return "text/plain; charset=utf-8";
  return "application/octet-stream";
}

// A relative path the console serves: segments of [A-Za-z0-9._-], none
// empty or starting with '.' (so no "..", no hidden file).
bool servable_name(std::string_view rel) {
  if (rel.empty()) return false;
  bool segment_start = true;
  for (const char c : rel) {
    if (c == '/') {
      if (segment_start) return false;
      segment_start = true;
      continue;
    }
    if (segment_start && c == '.') return false;
    segment_start = false;
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
                    c == '_' || c == '-';
    if (!ok) return false;
  }
  return !segment_start;
}

bool inside(const fs::path &root, const fs::path &p) {
  auto r = root.begin();
  auto q = p.begin();
  for (; r != root.end(); ++r, ++q)
    if (q == p.end() || *q != *r) return false;
  return true;
}

// The headers of every console answer.
void add_security_headers(HttpReply &r) {
  r.headers.emplace_back("Content-Security-Policy", kConsoleCsp);
  r.headers.emplace_back("X-Content-Type-Options", "nosniff");
  r.headers.emplace_back("Referrer-Policy", "no-referrer");
  r.headers.emplace_back("X-Frame-Options", "DENY");
}

}  // namespace

ConsoleFiles::ConsoleFiles(const std::string &dir) {
  std::error_code ec;
  const fs::path root = fs::canonical(dir, ec);
  if (ec || !fs::is_directory(root, ec))
    throw std::invalid_argument("the console directory '" + dir + "' is not a readable directory" +
                                (ec ? ": " + ec.message() : std::string()) +
                                " (set --console-dir, or the config's console.dir)");
  for (auto it = fs::recursive_directory_iterator(root, fs::directory_options::none, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    const fs::path rel = it->path().lexically_relative(root);
    const std::string name = rel.generic_string();
    if (!servable_name(name)) {
      if (it->is_directory(ec)) it.disable_recursion_pending();
      continue;
    }
    // A symlink counts only when what it leads to stays inside the root.
    const fs::path real = fs::canonical(it->path(), ec);
    if (ec || !inside(root, real) || !fs::is_regular_file(real, ec)) {
      ec.clear();
      continue;
    }
    std::ifstream in(real, std::ios::binary);
    if (!in) throw std::invalid_argument("cannot read the console file '" + real.string() + "'");
    File f;
    f.bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    f.content_type = content_type_of(name);
    f.etag = card_etag(f.bytes);
    files_.emplace(name, std::move(f));
  }
  if (ec)
    throw std::invalid_argument("cannot list the console directory '" + root.string() + "': " + ec.message());
  if (files_.find("index.html") == files_.end())
    throw std::invalid_argument("the console directory '" + root.string() +
                                "' has no index.html (set --console-dir to the installed share/toolnexus/console)");
}

bool ConsoleFiles::serves(std::string_view path) noexcept {
  return path == "/console" || path.substr(0, kPrefix.size()) == kPrefix;
}

int ConsoleFiles::handle(const HttpRequest &req, Responder &out) const {
  const std::string &m = req.head.getMethod();
  HttpReply r;
  add_security_headers(r);
  if (m != Poco::Net::HTTPRequest::HTTP_GET && m != Poco::Net::HTTPRequest::HTTP_HEAD) {
    r.status = 405;
    r.content_type = "text/plain; charset=utf-8";
    r.body = m + " is not allowed here; the console's files take GET, HEAD\n";
    r.headers.emplace_back("Allow", "GET, HEAD");
  } else if (req.path == "/console") {
    r.status = 308;
    r.content_type.clear();
    r.headers.emplace_back("Location", "/console/");
  } else {
    std::string_view name = std::string_view(req.path).substr(kPrefix.size());
    if (name.empty()) name = "index.html";
    const auto it = files_.find(name);
    if (it == files_.end()) {
      r.status = 404;
      r.content_type = "text/plain; charset=utf-8";
      r.body = "not found: the console has no file '" + std::string(name.substr(0, 200)) + "'\n";
    } else {
      const File &f = it->second;
      r.headers.emplace_back("ETag", f.etag);
      // Revalidated each load (cheap: 304), so an upgrade is seen at once.
      r.headers.emplace_back("Cache-Control", "no-cache");
      if (if_none_match(req.head.get("If-None-Match", Poco::Net::HTTPMessage::EMPTY), f.etag)) {
        r.status = 304;
        r.content_type.clear();
      } else {
        r.content_type = f.content_type;
        r.body = f.bytes;
        r.head_only = m == Poco::Net::HTTPRequest::HTTP_HEAD;
      }
    }
  }
  const int status = r.status;
  out.reply(std::move(r));
  return status;
}

}  // namespace toolnexus::server_detail

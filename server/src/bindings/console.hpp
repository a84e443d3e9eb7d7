// server/src/bindings/console.hpp: the approval console's static files
// (docs/console.md), served under /console/ when ServerOptions::console is
// on. The page itself talks to the A2A HTTP+JSON API like any client; this
// only hands out its HTML, CSS and ES modules.
#ifndef TOOLNEXUS_SERVER_CONSOLE_HPP
#define TOOLNEXUS_SERVER_CONSOLE_HPP

#include "wire/http_reactor.hpp"

#include <map>
#include <string>
#include <string_view>

namespace toolnexus::server_detail {

/// The Content-Security-Policy of every console answer: the page's own
/// scripts, styles and API only; no inline script or style, no plugin, no
/// frame, no form target, no <base>.
inline constexpr const char *kConsoleCsp =
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The console's files, read into memory once (construction) from a
/// directory, and answered by exact path. Immutable after construction:
/// handle() may be called from any number of threads at once.
class ConsoleFiles {
 public:
  /// Reads every regular file under `dir` (recursively) whose relative path
  /// is made of [A-Za-z0-9._-] segments (no segment starting with '.').
  /// A symlink is followed only when its target stays inside `dir`.
  /// Throws std::invalid_argument naming `dir` when it is not a readable
  /// directory or holds no index.html.
  explicit ConsoleFiles(const std::string &dir);

  /// Whether `path` (the request path, no query) is the console's:
  /// "/console" or anything under "/console/".
  static bool serves(std::string_view path) noexcept;

  /// Answers one request for a path serves() accepted: GET/HEAD of a known
  /// file 200 (304 when If-None-Match matches its ETag), "/console" a 308 to
  /// "/console/", "/console/" is index.html, an unknown path 404, another
  /// method 405. Every answer carries the console's security headers
  /// (kConsoleCsp, nosniff, no-referrer). Returns the status sent.
  int handle(const HttpRequest &req, Responder &out) const;

  /// Files held (for the start log line).
  std::size_t size() const noexcept { return files_.size(); }

 private:
  struct File {
    std::string bytes;
    std::string content_type;
    std::string etag;
  };
  /// Relative path ("index.html", "js/app.js") -> file.
  std::map<std::string, File, std::less<>> files_;
};

}  // namespace toolnexus::server_detail

#endif  // TOOLNEXUS_SERVER_CONSOLE_HPP

// fuzz/rest_route_fuzz.cpp: the HTTP+JSON router (match_rest_route,
// server/src/bindings/rest.hpp).
//
// Input: the HTTP method, a newline, then the request path (still
// percent-encoded).
//
// Invariants: bad_request only for a path with a malformed '%' escape, with
// a sentence saying where; a path without '%' routes to ids that are
// slash-free pieces of it; method_not_allowed lists in `allow` the methods
// the path takes, and each of them matches it.
#include "bindings/rest.hpp"
#include "fuzz_check.hpp"

#include <cctype>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

using namespace toolnexus::server_detail;

namespace {

bool malformed_escape(std::string_view path) {
  for (std::size_t i = path.find('%'); i != std::string_view::npos; i = path.find('%', i + 1)) {
    if (i + 2 >= path.size()) return true;
    if (std::isxdigit(static_cast<unsigned char>(path[i + 1])) == 0 ||
        std::isxdigit(static_cast<unsigned char>(path[i + 2])) == 0)
      return true;
  }
  return false;
}

void check_piece(std::string_view path, const std::string &piece, const char *what) {
  FUZZ_CHECK(piece.find('/') == std::string::npos, std::string(what) + " with a slash: " + piece);
  FUZZ_CHECK(path.find(piece) != std::string_view::npos, std::string(what) + " not in the path: " + piece);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, std::size_t size) {
  const std::string_view in(reinterpret_cast<const char *>(data), size);
  const std::size_t nl = in.find('\n');
  if (nl == std::string_view::npos) return 0;
  const std::string_view method = in.substr(0, nl);
  const std::string_view path = in.substr(nl + 1);
  RestRoute route;
  std::string allow;
  const RestMatch m = match_rest_route(method, path, route, allow);
  const bool bad_escape = malformed_escape(path);
  FUZZ_CHECK((m == RestMatch::bad_request) == bad_escape, std::string(path));
  if (m == RestMatch::bad_request) {
    FUZZ_CHECK(route.error.find("percent-escape") != std::string::npos, route.error);
    return 0;
  }
  if (m == RestMatch::matched && path.find('%') == std::string_view::npos) {
    check_piece(path, route.task_id, "task id");
    check_piece(path, route.tenant, "tenant");
    check_piece(path, route.config_id, "config id");
  }
  if (m == RestMatch::method_not_allowed) {
    FUZZ_CHECK(!allow.empty(), "method_not_allowed without Allow");
    std::size_t p = 0;
    while (p <= allow.size()) {
      std::size_t comma = allow.find(", ", p);
      if (comma == std::string::npos) comma = allow.size();
      const std::string other = allow.substr(p, comma - p);
      FUZZ_CHECK(other != method, "Allow lists the refused method " + other);
      RestRoute r2;
      std::string allow2;
      FUZZ_CHECK(match_rest_route(other, path, r2, allow2) == RestMatch::matched,
                 "Allow lists " + other + " but it does not match " + std::string(path));
      p = comma + 2;
    }
  }
  return 0;
}

// fuzz/rest_route_fuzz.cpp: the HTTP+JSON router (match_rest_route,
// server/src/bindings/rest.hpp).
//
// Input: the HTTP method, a newline, then the request path (still
// percent-encoded).
//
// Invariants: bad_request only for a path with a malformed '%' escape, with
// a sentence saying where; a path without '%' routes to ids that are
// slash-free pieces of it; method_not_allowed lists in `allow` the methods
// the path takes, and each of them matches it. The same bytes read as a
// query (parse_query) are refused exactly for a malformed escape after the
// '?' or a name given twice; accepted, the names are distinct and '%' free
// bytes come back as they were ('+' as a space).
#include "bindings/rest.hpp"
#include "fuzz_check.hpp"

#include <cctype>
#include <cstddef>
#include <cstdint>
#include <string>
#include <set>
#include <string_view>
#include <utility>
#include <vector>

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

void check_query(std::string_view uri) {
  std::vector<std::pair<std::string, std::string>> params;
  const std::string why = parse_query(uri, params);
  const std::size_t q = uri.find('?');
  if (q == std::string_view::npos) {
    FUZZ_CHECK(why.empty() && params.empty(), "a query read from a target without '?'");
    return;
  }
  const std::string_view query = uri.substr(q + 1);
  if (malformed_escape(query)) {
    FUZZ_CHECK(why.find("malformed percent-escape") != std::string::npos, "malformed escape read: " + why);
    return;
  }
  if (!why.empty()) {
    FUZZ_CHECK(why.find("is given more than once") != std::string::npos, why);
    return;
  }
  std::set<std::string> names;
  for (const auto &[name, value] : params) FUZZ_CHECK(names.insert(name).second, "a name kept twice: " + name);
  if (query.find('%') == std::string_view::npos && query.find('=') == std::string_view::npos) {
    std::string expect;
    for (char c : query) expect += c == '+' ? ' ' : c;
    std::string got;
    for (const auto &[name, value] : params) got += (got.empty() ? "" : "&") + name;
    std::string want;  // the non-empty pieces
    std::size_t p = 0;
    while (p <= expect.size()) {
      std::size_t amp = expect.find('&', p);
      if (amp == std::string::npos) amp = expect.size();
      if (amp > p) want += (want.empty() ? "" : "&") + expect.substr(p, amp - p);
      p = amp + 1;
    }
    FUZZ_CHECK(got == want, "query names " + got + " read from " + std::string(query));
  }
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
  check_query(path);
  return 0;
}

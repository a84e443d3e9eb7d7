// fuzz/http_head_fuzz.cpp: the strict check of an HTTP/1.1 request head
// (check_request_head) and the Transfer-Encoding reader
// (parse_transfer_encoding), server/src/wire/http_head.hpp.
//
// Input: a request head. It is checked as a head (less its leading empty
// lines, up to its first empty line or with "\r\n\r\n" appended when it has
// none, as the reactor hands over complete heads that start with a request
// line);
// its lines after the first are also read as a Transfer-Encoding field's
// values.
//
// Invariants: a verdict is 0, 400, 414 or 505, with a reason exactly when
// it refuses (414 only for a target over kMaxRequestTarget bytes); an
// accepted head has CRLF line ends only (no bare LF or CR), no obs-fold, no
// whitespace before a field's colon, no control character but HTAB in a
// field line, and a request line "METHOD SP TARGET SP HTTP/d.d".
// A Transfer-Encoding verdict is 0, 400 or 501, and 0 only when the last
// coding listed is "chunked" and no other coding is. An accepted head's
// target read by read_request_target is served as origin-form ('/...'), or
// "*" for OPTIONS only, with an authority exactly for absolute-form.
#include "fuzz_check.hpp"
#include "wire/http_head.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

using toolnexus::server_detail::check_request_head;
using toolnexus::server_detail::iequals;
using toolnexus::server_detail::kMaxRequestTarget;
using toolnexus::server_detail::parse_transfer_encoding;
using toolnexus::server_detail::read_request_target;
using toolnexus::server_detail::trim_ows;

namespace {

bool is_tchar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

// The lines of an accepted head (CRLF-separated, without the final empty one).
std::vector<std::string_view> lines_of(std::string_view head) {
  std::vector<std::string_view> out;
  std::size_t pos = 0;
  while (pos < head.size()) {
    const std::size_t eol = head.find("\r\n", pos);
    if (eol == std::string_view::npos || eol == pos) break;
    out.push_back(head.substr(pos, eol - pos));
    pos = eol + 2;
  }
  return out;
}

void check_head(std::string_view head) {
  const auto v = check_request_head(head);
  FUZZ_CHECK(v.status == 0 || v.status == 400 || v.status == 414 || v.status == 505, std::to_string(v.status));
  FUZZ_CHECK((v.status == 0) == v.why.empty(), v.why);
  if (v.status != 0) return;
  for (std::size_t i = 0; i < head.size(); ++i) {
    if (head[i] == '\n') FUZZ_CHECK(i > 0 && head[i - 1] == '\r', "bare LF accepted");
    if (head[i] == '\r') FUZZ_CHECK(i + 1 < head.size() && head[i + 1] == '\n', "bare CR accepted");
  }
  const auto lines = lines_of(head);
  FUZZ_CHECK(!lines.empty(), "a head without a request line accepted");
  // Request line: token SP target SP HTTP/d.d, single spaces.
  const std::string_view rl = lines[0];
  const std::size_t sp1 = rl.find(' ');
  FUZZ_CHECK(sp1 != std::string_view::npos && sp1 > 0, "request line without method");
  for (std::size_t i = 0; i < sp1; ++i) FUZZ_CHECK(is_tchar(rl[i]), "method not a token");
  const std::size_t sp2 = rl.find(' ', sp1 + 1);
  FUZZ_CHECK(sp2 != std::string_view::npos && sp2 > sp1 + 1, "request line without target");
  for (std::size_t i = sp1 + 1; i < sp2; ++i) FUZZ_CHECK(rl[i] > 0x20 && rl[i] < 0x7f, "target not visible ASCII");
  FUZZ_CHECK(sp2 - sp1 - 1 <= kMaxRequestTarget, "a target over the limit accepted");
  const std::string_view method = rl.substr(0, sp1);
  const auto t = read_request_target(method, rl.substr(sp1 + 1, sp2 - sp1 - 1));
  FUZZ_CHECK((t.status == 0) == t.why.empty() && (t.status == 0 || t.status == 400), t.why);
  if (t.status == 0) {
    FUZZ_CHECK(t.origin.find('#') == std::string::npos, "a fragment served: " + t.origin);
    const bool asterisk = t.origin == "*" && method == "OPTIONS" && t.authority.empty();
    FUZZ_CHECK((!t.origin.empty() && t.origin[0] == '/') || asterisk, "target served as " + t.origin);
    FUZZ_CHECK(t.authority.find_first_of("@/?") == std::string::npos, "authority " + t.authority);
  }
  const std::string_view version = rl.substr(sp2 + 1);
  FUZZ_CHECK(version.size() == 8 && version.substr(0, 7) == "HTTP/1." && version[7] >= '0' && version[7] <= '9',
             "version '" + std::string(version) + "' accepted");
  for (std::size_t n = 1; n < lines.size(); ++n) {
    const std::string_view l = lines[n];
    FUZZ_CHECK(l[0] != ' ' && l[0] != '\t', "obs-fold accepted");
    const std::size_t colon = l.find(':');
    FUZZ_CHECK(colon != std::string_view::npos && colon > 0, "field line without a name");
    for (std::size_t i = 0; i < colon; ++i) FUZZ_CHECK(is_tchar(l[i]), "field name not a token");
    for (std::size_t i = colon + 1; i < l.size(); ++i) {
      const auto c = static_cast<unsigned char>(l[i]);
      FUZZ_CHECK(c == '\t' || (c >= 0x20 && c != 0x7f), "control character in a field value");
    }
  }
}

void check_transfer_encoding(std::string_view input) {
  std::vector<std::string> values;
  std::size_t pos = 0;
  while (pos <= input.size()) {
    std::size_t eol = input.find('\n', pos);
    if (eol == std::string_view::npos) eol = input.size();
    values.emplace_back(input.substr(pos, eol - pos));
    pos = eol + 1;
  }
  const auto t = parse_transfer_encoding(values.data(), values.size());
  FUZZ_CHECK(t.status == 0 || t.status == 400 || t.status == 501, std::to_string(t.status));
  FUZZ_CHECK((t.status == 0) == t.why.empty(), t.why);
  if (t.status != 0) return;
  // Accepted: the non-empty list elements are exactly one "chunked".
  int chunked = 0, other = 0;
  for (const auto &v : values) {
    std::size_t p = 0;
    while (p <= v.size()) {
      std::size_t comma = v.find(',', p);
      if (comma == std::string::npos) comma = v.size();
      const std::string_view e = trim_ows(std::string_view(v).substr(p, comma - p));
      if (!e.empty()) (iequals(e, "chunked") ? chunked : other) += 1;
      p = comma + 1;
    }
  }
  FUZZ_CHECK(chunked == 1 && other == 0, "Transfer-Encoding accepted as chunked: " + std::string(input));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, std::size_t size) {
  std::string head(reinterpret_cast<const char *>(data), size);
  // The reactor drops empty lines before the request line (RFC 9112
  // section 2.2) and hands over a head that starts with one.
  while (head.size() >= 2 && head[0] == '\r' && head[1] == '\n') head.erase(0, 2);
  if (head.empty()) return 0;
  // The head ends at its first empty line: what follows is the body.
  if (const std::size_t end = head.find("\r\n\r\n"); end != std::string::npos)
    head.resize(end + 4);
  else
    head += "\r\n\r\n";
  check_head(head);
  const std::string_view in(reinterpret_cast<const char *>(data), size);
  const std::size_t first = in.find('\n');
  if (first != std::string_view::npos) check_transfer_encoding(in.substr(first + 1));
  return 0;
}

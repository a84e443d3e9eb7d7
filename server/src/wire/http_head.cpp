// The strict check of a request head (see http_head.hpp).
#include "wire/http_head.hpp"

#include "common/util.hpp"

#include <cctype>
#include <vector>

namespace toolnexus::server_detail {

namespace {

// RFC 9110 section 5.6.2 tchar.
bool is_tchar(unsigned char c) noexcept {
  if (std::isalnum(c) != 0 && c < 0x80) return true;
  switch (c) {
    case '!': case '#': case '$': case '%': case '&': case '\'': case '*': case '+': case '-': case '.':
    case '^': case '_': case '`': case '|': case '~': return true;
    default: return false;
  }
}

bool is_token(std::string_view s) noexcept {
  if (s.empty()) return false;
  for (char c : s)
    if (!is_tchar(static_cast<unsigned char>(c))) return false;
  return true;
}

HeadVerdict bad(int status, std::size_t line, const std::string &what) {
  return {status, "line " + std::to_string(line) + ": " + what};
}

HeadVerdict check_request_line(std::string_view line, bool &http11) {
  const std::size_t sp1 = line.find(' ');
  const std::size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || line.find(' ', sp2 + 1) != std::string_view::npos)
    return bad(400, 1,
               "the request line " + in_quotes(line) +
                   " is not 'METHOD SP target SP HTTP-version' with single spaces (RFC 9112 section 3)");
  const std::string_view method = line.substr(0, sp1);
  const std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  const std::string_view version = line.substr(sp2 + 1);
  if (!is_token(method)) return bad(400, 1, "the method " + in_quotes(method) + " is not a token");
  if (target.empty()) return bad(400, 1, "the request target is empty");
  if (target.size() > kMaxRequestTarget)
    return {414, "the request target is " + std::to_string(target.size()) + " bytes long; the limit is " +
                     std::to_string(kMaxRequestTarget) + " bytes (RFC 9110 section 15.5.15)"};
  for (char ch : target) {
    const auto c = static_cast<unsigned char>(ch);
    if (c <= 0x20 || c >= 0x7f)
      return bad(400, 1, "the request target " + in_quotes(target) +
                             " has a byte that is not visible ASCII (percent-encode it: RFC 3986)");
  }
  if (version.size() != 8 || version.substr(0, 5) != "HTTP/" || std::isdigit(static_cast<unsigned char>(version[5])) == 0 ||
      version[6] != '.' || std::isdigit(static_cast<unsigned char>(version[7])) == 0)
    return bad(400, 1, "the HTTP version " + in_quotes(version) + " is not HTTP/DIGIT.DIGIT (RFC 9112 section 2.3)");
  if (version[5] != '1')
    return {505, "HTTP version " + std::string(version.substr(5)) + " is not supported (this server speaks HTTP/1.1 and HTTP/1.0)"};
  http11 = version[7] != '0';
  return {};
}

}  // namespace

bool iequals(std::string_view a, std::string_view b) noexcept {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i])))
      return false;
  return true;
}

std::string_view trim_ows(std::string_view s) noexcept {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

std::string field_line_problem(std::string_view line) {
  if (line.find_first_of("\r\n") != std::string_view::npos)
    return "a bare CR or LF in the line (RFC 9112 section 2.2)";
  if (!line.empty() && (line.front() == ' ' || line.front() == '\t'))
    return "a field line starts with whitespace (obs-fold is not accepted: RFC 9112 section 5.2)";
  const std::size_t colon = line.find(':');
  if (colon == std::string_view::npos) return "the field line " + in_quotes(line) + " has no colon";
  const std::string_view name = line.substr(0, colon);
  if (!name.empty() && (name.back() == ' ' || name.back() == '\t'))
    return "whitespace between the field name " + in_quotes(trim_ows(name)) + " and the colon (RFC 9112 section 5.1)";
  if (!is_token(name)) return "the field name " + in_quotes(name) + " is not a token (RFC 9110 section 5.1)";
  for (char ch : line.substr(colon + 1)) {
    const auto c = static_cast<unsigned char>(ch);
    if ((c < 0x20 && c != '\t') || c == 0x7f)
      return "the value of field " + in_quotes(name) + " has a control character (RFC 9110 section 5.5)";
  }
  return {};
}

HeadVerdict check_request_head(std::string_view head) {
  // Lines, each ended by CRLF; the head ends with an empty line.
  std::size_t pos = 0;
  std::size_t n = 0;
  bool http11 = false;
  bool host = false;
  while (pos < head.size()) {
    ++n;
    const std::size_t lf = head.find('\n', pos);
    if (lf == std::string_view::npos) return bad(400, n, "the line does not end with CRLF");
    if (lf == pos || head[lf - 1] != '\r') return bad(400, n, "a bare LF ends the line (lines end with CRLF: RFC 9112 section 2.2)");
    const std::string_view line = head.substr(pos, lf - 1 - pos);
    pos = lf + 1;
    if (line.find('\r') != std::string_view::npos)
      return bad(400, n, "a bare CR in the line (RFC 9112 section 2.2)");
    if (line.empty()) break;  // the end of the head
    if (n == 1) {
      HeadVerdict v = check_request_line(line, http11);
      if (v.status != 0) return v;
      continue;
    }
    if (std::string why = field_line_problem(line); !why.empty()) return bad(400, n, why);
    const std::string_view name = line.substr(0, line.find(':'));
    if (iequals(name, "Host")) host = true;
  }
  if (n == 0) return bad(400, 1, "the request line is missing");
  if (http11 && !host) return {400, "an HTTP/1.1 request must have a Host field (RFC 9112 section 3.2)"};
  return {};
}

RequestTarget read_request_target(std::string_view method, std::string_view target) {
  RequestTarget t;
  const auto refuse = [&](const std::string &what) {
    t.status = 400;
    t.why = "the request target " + in_quotes(target) + " " + what;
    return t;
  };
  if (target.find('#') != std::string_view::npos)
    return refuse("has a '#' fragment, which is no part of a request target (RFC 9112 section 3.2)");
  if (!target.empty() && target.front() == '/') {
    t.origin = std::string(target);
    return t;
  }
  if (target == "*") {
    if (method != "OPTIONS")
      return refuse("(asterisk-form) is only for OPTIONS (RFC 9112 section 3.2.4); this is " + in_quotes(method));
    t.origin = "*";
    return t;
  }
  const std::size_t sep = target.find("://");
  const std::string_view scheme = sep == std::string_view::npos ? std::string_view() : target.substr(0, sep);
  if (!iequals(scheme, "http") && !iequals(scheme, "https"))
    return refuse("is neither origin-form (it must start with '/') nor absolute-form (http://host/path) "
                  "(RFC 9112 section 3.2)");
  std::string_view rest = target.substr(sep + 3);
  const std::size_t end = rest.find_first_of("/?");
  const std::string_view authority = rest.substr(0, end);
  if (authority.empty()) return refuse("has no host after \"" + std::string(scheme) + "://\" (RFC 9112 section 3.2.2)");
  if (authority.find('@') != std::string_view::npos)
    return refuse("has a userinfo (\"user@\") in its authority, which http URIs do not take (RFC 9110 section 4.2.4)");
  rest.remove_prefix(authority.size());
  t.origin = rest.empty() || rest.front() == '?' ? "/" + std::string(rest) : std::string(rest);
  t.authority = std::string(authority);
  return t;
}

TransferCoding parse_transfer_encoding(const std::string *values, std::size_t n) {
  std::vector<std::string_view> codings;
  for (std::size_t i = 0; i < n; ++i) {
    std::string_view v = values[i];
    while (!v.empty()) {
      const std::size_t comma = v.find(',');
      const std::string_view item = trim_ows(v.substr(0, comma));
      if (!item.empty()) codings.push_back(item);
      if (comma == std::string_view::npos) break;
      v.remove_prefix(comma + 1);
    }
  }
  if (codings.empty()) return {400, "Transfer-Encoding is empty"};
  for (std::size_t i = 0; i < codings.size(); ++i) {
    const bool chunked = iequals(codings[i], "chunked");
    if (chunked && i + 1 != codings.size())
      return {400, "Transfer-Encoding: chunked is given more than once or is not the last coding (RFC 9112 section 6.3)"};
    if (!chunked)
      return {i + 1 == codings.size() ? 400 : 501,
              "Transfer-Encoding " + in_quotes(codings[i]) + " is not supported (only chunked)" +
                  (i + 1 == codings.size() ? std::string(", and chunked must be the last coding (RFC 9112 section 6.3)")
                                           : std::string())};
  }
  return {};
}

}  // namespace toolnexus::server_detail

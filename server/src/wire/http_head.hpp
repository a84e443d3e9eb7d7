// server/src/wire/http_head.hpp: the strict check of an HTTP/1.1 request
// head (request line and field lines) that runs before Poco parses it.
//
// Poco's MessageHeader reader is lenient: it takes "Content-Length : 5" as a
// field named "Content-Length " (so the body was ignored and run as a second
// request: request smuggling), joins obs-fold lines, accepts bare LF and any
// "HTTP/x.y". Where a proxy in front of this server reads the same bytes
// differently, the two disagree about where a request ends. So every head is
// held to RFC 9112 first, and anything ambiguous is refused (the connection
// is closed after the answer):
//  - lines end with CRLF; a bare LF or bare CR is 400 (section 2.2);
//  - request-line = method SP request-target SP HTTP-version, single spaces,
//    method a token, request-target visible ASCII (section 3);
//  - HTTP-version = "HTTP/" DIGIT "." DIGIT (section 2.3), else 400; a major
//    version other than 1 is 505 (RFC 9110 section 15.6.6); HTTP/1.2..1.9 is
//    served as HTTP/1.1 (RFC 9110 section 6.2);
//  - a request target longer than kMaxRequestTarget is 414;
//  - a field line starting with whitespace (obs-fold) is 400 (section 5.2);
//  - whitespace between a field name and its colon is 400 (section 5.1,
//    MUST); a field name that is not a token is 400;
//  - a field value with a control character other than HTAB (NUL, CR, LF,
//    DEL, ...) is 400 (RFC 9110 section 5.5);
//  - an HTTP/1.1 request without Host is 400 (section 3.2, MUST).
// Body framing (Content-Length, Transfer-Encoding) is checked by the reactor
// on the parsed head (http_reactor.cpp, framing()), with
// parse_transfer_encoding() below.
#ifndef TOOLNEXUS_SERVER_WIRE_HTTP_HEAD_HPP
#define TOOLNEXUS_SERVER_WIRE_HTTP_HEAD_HPP

#include <string>
#include <string_view>

namespace toolnexus::server_detail {

/// The verdict on a request head: `status` 0 when it may be parsed, else the
/// HTTP status to refuse it with (400 or 505) and `why`, a sentence naming
/// the line and what is wrong with it ("line 3: whitespace between the field
/// name 'Content-Length' and the colon (RFC 9112 section 5.1)").
struct HeadVerdict {
  int status = 0;
  std::string why;
};

/// The longest request target served, in bytes (Poco's reader refuses
/// longer ones): a longer one is 414 URI Too Long (RFC 9110 section 15.5.15).
inline constexpr std::size_t kMaxRequestTarget = 16384;

/// Checks `head`: the request's bytes from the request line up to and
/// including the empty line that ends the head ("...\r\n\r\n"). Pure; never
/// throws (std::bad_alloc aside). Thread-safe.
HeadVerdict check_request_head(std::string_view head);

/// What is wrong with one field line (a header or chunked-trailer line,
/// without its CRLF) by the rules above: a bare CR/LF, obs-fold, no colon,
/// whitespace before the colon, a name that is no token, a control byte in
/// the value. "" when it is sound. Never throws (std::bad_alloc aside).
std::string field_line_problem(std::string_view line);

/// The Transfer-Encoding of a request, from the values of all its
/// Transfer-Encoding fields (in order, each a comma-separated list).
struct TransferCoding {
  /// 0: the body is chunked (chunked is the only coding, given once);
  /// else the status to refuse the request with: 400 when chunked is not
  /// the final coding or given twice, or the list is empty (RFC 9112
  /// section 6.3: the length cannot be determined), 501 for a coding this
  /// server does not implement (gzip, ...; RFC 9112 section 6.1).
  int status = 0;
  std::string why;
};

/// Reads the Transfer-Encoding list made of `values` (each one field's
/// value). Coding names are case-insensitive; empty list elements are
/// skipped (RFC 9110 section 5.6.1). Never throws (std::bad_alloc aside).
TransferCoding parse_transfer_encoding(const std::string *values, std::size_t n);

/// A request target read by its form (RFC 9112 section 3.2).
struct RequestTarget {
  /// 0, or 400 with `why` (the target is in none of the forms below).
  int status = 0;
  std::string why;
  /// What to serve, in origin-form ("/path?query"): an origin-form target
  /// as it came; an absolute-form one's path and query ("/" for an empty
  /// path); "*" for the asterisk-form of OPTIONS.
  std::string origin;
  /// An absolute-form target's authority (host[:port]): the request's Host
  /// from now on, whatever its Host field says (RFC 9112 section 3.2.2:
  /// the server MUST ignore the field then). Empty for the other forms.
  std::string authority;
};

/// Reads `target`, the request line's request-target for `method`:
/// origin-form ("/..."), absolute-form ("http://host/..." or https: the
/// server MUST accept it, section 3.2.2), asterisk-form ("*", OPTIONS
/// only); anything else (no leading '/', authority-form, another scheme, a
/// userinfo "user@" in the authority, a '#' fragment) is 400 with the
/// reason. `target` is visible ASCII (check_request_head checked it). Never
/// throws (std::bad_alloc aside). Thread-safe.
RequestTarget read_request_target(std::string_view method, std::string_view target);

/// ASCII case-insensitive equality (field names, coding names).
bool iequals(std::string_view a, std::string_view b) noexcept;

/// `s` without leading and trailing SP and HTAB (RFC 9110 OWS).
std::string_view trim_ows(std::string_view s) noexcept;

}  // namespace toolnexus::server_detail

#endif  // TOOLNEXUS_SERVER_WIRE_HTTP_HEAD_HPP

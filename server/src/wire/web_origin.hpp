// server/src/wire/web_origin.hpp: the syntax of a Host field value, of a
// web origin, and of the entries of a2a.allowed_hosts / a2a.allowed_origins.
// Pure functions of their arguments: thread-safe, no I/O.
#ifndef TOOLNEXUS_SERVER_WEB_ORIGIN_HPP
#define TOOLNEXUS_SERVER_WEB_ORIGIN_HPP

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace toolnexus::server_detail {

/// Whether `host` is a valid Host field value (RFC 9110 section 7.2:
/// uri-host [":" port], uri-host being RFC 3986 section 3.2.2's host): a
/// non-empty reg-name (unreserved, sub-delims, percent-escapes), an IPv4
/// address, or an IPv6 address in brackets, then optionally ":" and a port
/// of 1-5 digits at most 65535. An empty value is not (RFC 9110 section
/// 4.2.1: an "http" URI has a non-empty host), nor a ":" without a port.
/// Blanks around the value are ignored.
bool valid_host_field(std::string_view host);

/// A web origin (RFC 6454 section 4): the scheme and host in lower case
/// (an IPv6 host without its brackets) and the port, the scheme's default
/// (80 for http, 443 for https) when the serialization has none. Two
/// origins are the same origin when all three are equal (section 5).
struct WebOrigin {
  std::string scheme;  ///< "http" or "https"
  std::string host;    ///< "console.example.com", "127.0.0.1", "::1"
  uint16_t port = 0;   ///< 1..65535
  /// Same scheme, host and port.
  bool operator==(const WebOrigin &other) const {
    return scheme == other.scheme && host == other.host && port == other.port;
  }
};

/// Parses an origin "scheme://host[:port]" (an Origin header or an
/// a2a.allowed_origins entry; case does not matter) into `out`. The scheme
/// must be http or https, the host a DNS name (letters, digits, '-', '.',
/// '_'), an IPv4 address or a bracketed IPv6 address, the port 1..65535;
/// nothing may follow (no path, not even "/", no query, no user info).
/// Returns "" on success, else what is wrong (a phrase for an error
/// message, e.g. "an origin has no path: write https://x.example").
std::string parse_web_origin(std::string_view text, WebOrigin &out);

/// The origin of `scheme` ("http"/"https") and a Host-like `host`
/// ("name[:port]", "[v6][:port]"), the port defaulting to the scheme's;
/// false when `host` is not a valid Host field value or the scheme is
/// neither.
bool origin_of_host(std::string_view scheme, std::string_view host, WebOrigin &out);

/// What is wrong with an a2a.allowed_hosts entry ("" when nothing): it must
/// be "*" or "name" / "name:port", name being a DNS name (letters, digits,
/// '-', '.', '_'), an IPv4 address or a bracketed IPv6 address, the port
/// 1..65535. Refused, with the reason: "", a URL ("https://..."), a path,
/// a wildcard name ("*.example"), a bad port ("x:99999", "x:").
std::string allowed_host_problem(std::string_view entry);

/// What is wrong with an a2a.allowed_origins entry ("" when nothing): "*",
/// or an origin parse_web_origin takes. "null" is refused (it is the origin
/// of every sandboxed page and local file: only "*" lets those in).
std::string allowed_origin_problem(std::string_view entry);

/// Longest URL the configuration takes (bytes): a card, a log line and an
/// error message each repeat it.
inline constexpr std::size_t kMaxConfigUrlBytes = 2048;

/// Checks an absolute http(s) URL the configuration names (a2a.public_url,
/// a2a.documentation_url, a2a.provider.url, auth.jwt.jwks_url,
/// auth.jwt.openid_configuration_url): RFC 3986 "scheme://authority[path]
/// [?query]" with the scheme http or https (any case), a host as
/// allowed_host_problem takes it (DNS name, IPv4, bracketed IPv6), an
/// optional port 1..65535, no user name or password, no fragment, only
/// printable ASCII (a blank, a control byte or a non-ASCII byte must be
/// percent-encoded), every '%' followed by two hex digits, and at most
/// kMaxConfigUrlBytes bytes. On success returns "" and sets `normalized` to
/// `text` with its scheme and host in lower case (RFC 3986 section 6.2.2.1);
/// else returns what is wrong, naming the byte offset where one applies,
/// and leaves `normalized` alone. Pure; thread-safe.
std::string parse_http_url(std::string_view text, std::string &normalized);

}  // namespace toolnexus::server_detail

#endif  // TOOLNEXUS_SERVER_WEB_ORIGIN_HPP

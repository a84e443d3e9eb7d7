// Host field values, web origins and the allowed_hosts / allowed_origins
// entries.
#include "wire/web_origin.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>

namespace toolnexus::server_detail {

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char &c : out)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return out;
}

bool alnum(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'); }
bool hex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

// RFC 3986 section 3.2.2 reg-name, non-empty.
bool reg_name(std::string_view s) {
  if (s.empty()) return false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (alnum(c) || std::string_view("-._~!$&'()*+,;=").find(c) != std::string_view::npos) continue;
    if (c == '%' && i + 2 < s.size() && hex(s[i + 1]) && hex(s[i + 2])) {
      i += 2;
      continue;
    }
    return false;
  }
  return true;
}

bool ipv6(std::string_view s) {
  in6_addr a{};
  return ::inet_pton(AF_INET6, std::string(s).c_str(), &a) == 1;
}

// What is wrong with a host name as the configuration takes it (a DNS name,
// IPv4 address or bracketed IPv6 address, without the port); "" if nothing.
std::string name_problem(std::string_view name) {
  if (name.empty()) return "the host name is empty";
  if (name.front() == '[') {
    if (name.back() != ']' || !ipv6(name.substr(1, name.size() - 2)))
      return "'" + std::string(name) + "' is not an IPv6 address in brackets";
    return {};
  }
  if (name.find('*') != std::string_view::npos)
    return "wildcards are not supported: list each name (or \"*\" alone for any)";
  bool dotted_digits = true;
  for (char c : name) {
    if (!alnum(c) && c != '-' && c != '.' && c != '_')
      return "'" + std::string(1, c) + "' cannot be part of a host name (letters, digits, '-', '.', '_')";
    if (!(c >= '0' && c <= '9') && c != '.') dotted_digits = false;
  }
  if (name.front() == '.' || name.find("..") != std::string_view::npos) return "a host name has no empty labels";
  in_addr a{};
  if (dotted_digits && ::inet_pton(AF_INET, std::string(name).c_str(), &a) != 1)
    return "'" + std::string(name) + "' is not an IPv4 address";
  return {};
}

// Splits "name[:port]" / "[v6][:port]" at the port's colon. The port is
// checked here: 1-5 digits, 1..65535 (`allow_zero`: 0 too). "" or the fault.
std::string split_port(std::string_view hp, std::string_view &name, std::string_view &port, bool allow_zero) {
  port = {};
  std::size_t colon = std::string_view::npos;
  if (!hp.empty() && hp.front() == '[') {
    const auto close = hp.find(']');
    if (close == std::string_view::npos) return "'[' without ']'";
    if (close + 1 < hp.size()) {
      if (hp[close + 1] != ':') return "only ':PORT' may follow ']'";
      colon = close + 1;
    }
  } else {
    colon = hp.find(':');
    if (colon != std::string_view::npos && hp.find(':', colon + 1) != std::string_view::npos)
      return "an IPv6 address goes in brackets ([2001:db8::1]:8443)";
  }
  name = hp.substr(0, colon);
  if (colon == std::string_view::npos) return {};
  port = hp.substr(colon + 1);
  if (port.empty()) return "':' without a port";
  if (port.size() > 5 || port.find_first_not_of("0123456789") != std::string_view::npos)
    return "the port '" + std::string(port) + "' is not a number 1..65535";
  const unsigned long p = std::stoul(std::string(port));
  if (p > 65535 || (p == 0 && !allow_zero)) return "the port " + std::string(port) + " is not in 1..65535";
  return {};
}

uint16_t port_or(std::string_view port, uint16_t default_port) {
  return port.empty() ? default_port : static_cast<uint16_t>(std::stoul(std::string(port)));
}

}  // namespace

bool valid_host_field(std::string_view host) {
  host = trim(host);
  std::string_view name, port;
  if (!split_port(host, name, port, /*allow_zero=*/true).empty() || name.empty()) return false;
  if (name.front() == '[') return name.size() > 2 && name.back() == ']' && ipv6(name.substr(1, name.size() - 2));
  return reg_name(name);
}

std::string parse_web_origin(std::string_view text, WebOrigin &out) {
  const std::size_t sep = text.find("://");
  if (sep == std::string_view::npos) return "an origin is scheme://host[:port] (https://console.example.com)";
  const std::string scheme = lower(text.substr(0, sep));
  if (scheme != "http" && scheme != "https") return "the scheme must be http or https";
  const std::string_view hp = text.substr(sep + 3);
  const auto extra = hp.find_first_of("/?#@");
  if (extra != std::string_view::npos) {
    const std::string bare = scheme + "://" + std::string(hp.substr(0, extra));
    if (hp[extra] == '@') return "an origin has no user name";
    return "an origin has no path, query or fragment (not even a trailing '/'): write " + bare;
  }
  std::string_view name, port;
  if (std::string why = split_port(hp, name, port, false); !why.empty()) return why;
  if (std::string why = name_problem(name); !why.empty()) return why;
  out.scheme = scheme;
  out.host = lower(name.front() == '[' ? name.substr(1, name.size() - 2) : name);
  out.port = port_or(port, scheme == "https" ? 443 : 80);
  return {};
}

bool origin_of_host(std::string_view scheme, std::string_view host, WebOrigin &out) {
  host = trim(host);
  if ((scheme != "http" && scheme != "https") || !valid_host_field(host)) return false;
  std::string_view name, port;
  split_port(host, name, port, true);
  out.scheme = std::string(scheme);
  out.host = lower(name.front() == '[' ? name.substr(1, name.size() - 2) : name);
  out.port = port_or(port, scheme == "https" ? 443 : 80);
  return true;
}

std::string allowed_host_problem(std::string_view entry) {
  if (entry == "*") return {};
  if (entry.empty()) return "an empty entry names no host";
  if (entry.find("://") != std::string_view::npos)
    return "a host name, not a URL: write the host[:port] alone (agents.example.com)";
  if (entry.find_first_of("/?#@") != std::string_view::npos)
    return "a host name has no path, query or user name: write the host[:port] alone";
  std::string_view name, port;
  if (std::string why = split_port(entry, name, port, false); !why.empty()) return why;
  return name_problem(name);
}

std::string parse_http_url(std::string_view text, std::string &normalized) {
  if (text.empty()) return "an empty URL";
  if (text.size() > kMaxConfigUrlBytes)
    return "a URL of " + std::to_string(text.size()) + " bytes is longer than " +
           std::to_string(kMaxConfigUrlBytes);
  for (std::size_t i = 0; i < text.size(); ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c <= 0x20 || c >= 0x7f)
      return "byte " + std::to_string(i) +
             " is a blank, a control byte or not ASCII (percent-encode it: a space is %20)";
    if (c == '#') return "a URL here has no fragment ('#' at byte " + std::to_string(i) + ")";
    if (c == '%' && (i + 2 >= text.size() || !hex(text[i + 1]) || !hex(text[i + 2])))
      return "the '%' at byte " + std::to_string(i) + " is not followed by two hex digits";
  }
  const std::size_t sep = text.find("://");
  if (sep == std::string_view::npos) return "not an absolute URL (http://host/path or https://host/path)";
  const std::string scheme = lower(text.substr(0, sep));
  if (scheme != "http" && scheme != "https") return "the scheme must be http or https";
  const std::string_view rest = text.substr(sep + 3);
  const std::string_view authority = rest.substr(0, rest.find_first_of("/?"));
  if (authority.find('@') != std::string_view::npos)
    return "a URL here holds no user name or password (user@host): give credentials another way";
  std::string_view name, port;
  if (std::string why = split_port(authority, name, port, false); !why.empty()) return why;
  if (std::string why = name_problem(name); !why.empty()) return why;
  normalized = scheme + "://" + lower(authority) + std::string(rest.substr(authority.size()));
  return {};
}

std::string allowed_origin_problem(std::string_view entry) {
  if (entry == "*") return {};
  if (entry.empty()) return "an empty entry names no origin";
  if (entry == "null")
    return "\"null\" is the origin of every sandboxed page and local file: only \"*\" lets those in";
  WebOrigin o;
  return parse_web_origin(entry, o);
}

}  // namespace toolnexus::server_detail

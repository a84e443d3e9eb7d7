// server/src/delivery/push_targets.hpp: which addresses a push notification
// may reach (SSRF; A2A v1.0 section 13.2).
//
// A webhook is judged by the addresses its host resolves to, against the
// IANA IPv4 and IPv6 Special-Purpose Address Registries (RFC 6890 and the
// RFCs that updated them), encoded row by row in push_targets.cpp: an
// address whose most specific registry row says it is not globally
// reachable is refused, and so is IPv6 outside global unicast 2000::/3
// (RFC 4291 section 2.4) and multicast of either family. An IPv6 address
// that embeds or maps an IPv4 address is judged by that IPv4 address:
// IPv4-mapped ::ffff:a.b.c.d and IPv4-compatible ::a.b.c.d (RFC 4291
// section 2.5.5), IPv4-translated ::ffff:0:a.b.c.d (RFC 2765 section 2.1),
// NAT64 64:ff9b::/96 (RFC 6052), 6to4 2002::/16 (RFC 3056), Teredo
// 2001::/32 (its obfuscated client address, RFC 4380 section 4), and an
// ISATAP interface id ::0:5efe:a.b.c.d / ::200:5efe:a.b.c.d (RFC 5214
// section 6.1; refused when either its prefix or its IPv4 address is).
// The local-use NAT64 prefix 64:ff9b:1::/48 (RFC 8215) places the IPv4
// address where its operator chose, so it is refused whole.
#ifndef TOOLNEXUS_SERVER_PUSH_TARGETS_HPP
#define TOOLNEXUS_SERVER_PUSH_TARGETS_HPP

#include <Poco/Net/IPAddress.h>

#include <string>
#include <utility>
#include <vector>

namespace toolnexus::server_detail {

/// Which webhook addresses may be contacted. Immutable after construction,
/// so thread-safe.
class TargetPolicy {
 public:
  /// `allow`: CIDR ranges ("127.0.0.0/8", "::1/128", "10.0.0.5") allowed
  /// even though the registries say they are not globally reachable, or "*"
  /// for any. An IPv6 address that embeds an IPv4 address is allowed when
  /// the range holds either of them. Throws std::invalid_argument naming a
  /// bad entry.
  explicit TargetPolicy(const std::vector<std::string> &allow);
  /// Why `a` may not be contacted ("" = it may), e.g. "a loopback address
  /// (RFC 1122)" or "an IPv6 address embedding 10.0.0.1 (6to4, RFC 3056),
  /// which is a private-use address (RFC 1918)".
  std::string refusal(const Poco::Net::IPAddress &a) const;
  /// The addresses of `host` (a name, an IP literal, or "[v6]") that may
  /// be contacted, in resolver order. Throws std::runtime_error saying why
  /// none (cannot resolve; every address refused, naming the first and
  /// why).
  std::vector<Poco::Net::IPAddress> addresses(const std::string &host) const;

 private:
  bool allowed(const Poco::Net::IPAddress &a) const;
  bool any_ = false;
  std::vector<std::pair<Poco::Net::IPAddress, unsigned>> allow_;
};

}  // namespace toolnexus::server_detail

#endif  // TOOLNEXUS_SERVER_PUSH_TARGETS_HPP

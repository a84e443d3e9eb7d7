// Push targets: the IANA special-purpose registries as tables, and the IPv6
// forms that carry an IPv4 address (see push_targets.hpp).
#include "delivery/push_targets.hpp"

#include <Poco/Exception.h>
#include <Poco/Net/DNS.h>
#include <Poco/Net/HostEntry.h>

#include <array>
#include <cstring>
#include <optional>
#include <stdexcept>

namespace toolnexus::server_detail {

namespace {

// One registry row: `net`/`prefix`, whether the registry says it is
// globally reachable, what it is, and the RFC that assigned it.
struct Row {
  const char *net;
  unsigned prefix;
  bool global;
  const char *name;
  const char *rfc;
};

// IANA IPv4 Special-Purpose Address Registry (RFC 6890 section 2.2.2 and
// its updates), every row; plus multicast (IANA IPv4 Multicast Address
// Space, RFC 5771), which no webhook is. The most specific row decides.
const Row kIPv4[] = {
    {"0.0.0.0", 8, false, "a \"this network\" address", "RFC 791 section 3.2"},
    {"0.0.0.0", 32, false, "the \"this host on this network\" address", "RFC 1122 section 3.2.1.3"},
    {"10.0.0.0", 8, false, "a private-use address", "RFC 1918"},
    {"100.64.0.0", 10, false, "a shared (carrier-grade NAT) address", "RFC 6598"},
    {"127.0.0.0", 8, false, "a loopback address", "RFC 1122 section 3.2.1.3"},
    {"169.254.0.0", 16, false, "a link-local address", "RFC 3927"},
    {"172.16.0.0", 12, false, "a private-use address", "RFC 1918"},
    {"192.0.0.0", 24, false, "an IETF protocol assignment", "RFC 6890 section 2.1"},
    {"192.0.0.0", 29, false, "an IPv4 service continuity address", "RFC 7335"},
    {"192.0.0.8", 32, false, "the IPv4 dummy address", "RFC 7600"},
    {"192.0.0.9", 32, true, "the Port Control Protocol anycast address", "RFC 7723"},
    {"192.0.0.10", 32, true, "the TURN anycast address", "RFC 8155"},
    {"192.0.0.170", 32, false, "a NAT64/DNS64 discovery address", "RFC 8880, RFC 7050 section 2.2"},
    {"192.0.0.171", 32, false, "a NAT64/DNS64 discovery address", "RFC 8880, RFC 7050 section 2.2"},
    {"192.0.2.0", 24, false, "a documentation address (TEST-NET-1)", "RFC 5737"},
    {"192.31.196.0", 24, true, "an AS112-v4 address", "RFC 7535"},
    {"192.52.193.0", 24, true, "an AMT address", "RFC 7450"},
    {"192.88.99.0", 24, false, "a deprecated 6to4 relay anycast address", "RFC 7526"},
    {"192.88.99.2", 32, true, "the 6a44 relay anycast address", "RFC 6751"},
    {"192.168.0.0", 16, false, "a private-use address", "RFC 1918"},
    {"192.175.48.0", 24, true, "a direct delegation AS112 address", "RFC 7534"},
    {"198.18.0.0", 15, false, "a benchmarking address", "RFC 2544"},
    {"198.51.100.0", 24, false, "a documentation address (TEST-NET-2)", "RFC 5737"},
    {"203.0.113.0", 24, false, "a documentation address (TEST-NET-3)", "RFC 5737"},
    {"224.0.0.0", 4, false, "a multicast address", "RFC 5771"},
    {"240.0.0.0", 4, false, "a reserved address", "RFC 1112 section 4"},
    {"255.255.255.255", 32, false, "the limited broadcast address", "RFC 8190, RFC 919 section 7"},
};

// IANA IPv6 Special-Purpose Address Registry (RFC 6890 section 2.2.3 and
// its updates), every row; plus what IANA's IPv6 Address Space says is not
// global unicast (all but 2000::/3: reserved by the IETF, RFC 4291 section
// 2.4), multicast and deprecated site-local. The rows for the forms that
// carry an IPv4 address (::ffff:0:0/96, 64:ff9b::/96, 2001::/32, 2002::/16)
// are never reached: those are judged by that address (embedded_ipv4()).
const Row kIPv6[] = {
    {"::", 0, false, "an address outside global unicast (reserved by the IETF)", "RFC 4291 section 2.4"},
    {"2000::", 3, true, "a global unicast address", "RFC 4291 section 2.4"},
    {"::", 128, false, "the unspecified address", "RFC 4291"},
    {"::1", 128, false, "a loopback address", "RFC 4291"},
    {"::ffff:0:0", 96, false, "an IPv4-mapped address", "RFC 4291"},
    {"64:ff9b::", 96, true, "an IPv4-IPv6 translation address", "RFC 6052"},
    {"64:ff9b:1::", 48, false, "a local-use IPv4/IPv6 translation address", "RFC 8215"},
    {"100::", 64, false, "a discard-only address", "RFC 6666"},
    {"100:0:0:1::", 64, false, "a dummy IPv6 address", "RFC 9780"},
    {"2001::", 23, false, "an IETF protocol assignment", "RFC 2928"},
    {"2001::", 32, false, "a Teredo address", "RFC 4380, RFC 8190"},
    {"2001:1::1", 128, true, "the Port Control Protocol anycast address", "RFC 7723"},
    {"2001:1::2", 128, true, "the TURN anycast address", "RFC 8155"},
    {"2001:1::3", 128, true, "the DNS-SD service registration protocol anycast address", "RFC 9665"},
    {"2001:2::", 48, false, "a benchmarking address", "RFC 5180"},
    {"2001:3::", 32, true, "an AMT address", "RFC 7450"},
    {"2001:4:112::", 48, true, "an AS112-v6 address", "RFC 7535"},
    {"2001:10::", 28, false, "a deprecated ORCHID address", "RFC 4843"},
    {"2001:20::", 28, true, "an ORCHIDv2 address", "RFC 7343"},
    {"2001:30::", 28, true, "a drone remote ID entity tag", "RFC 9374"},
    {"2001:db8::", 32, false, "a documentation address", "RFC 3849"},
    {"2002::", 16, false, "a 6to4 address", "RFC 3056"},
    {"2620:4f:8000::", 48, true, "a direct delegation AS112 address", "RFC 7534"},
    {"3fff::", 20, false, "a documentation address", "RFC 9637"},
    {"5f00::", 16, false, "a segment routing (SRv6) SID", "RFC 9602"},
    {"fc00::", 7, false, "a unique-local address", "RFC 4193, RFC 8190"},
    {"fe80::", 10, false, "a link-local address", "RFC 4291"},
    {"fec0::", 10, false, "a deprecated site-local address", "RFC 3879"},
    {"ff00::", 8, false, "a multicast address", "RFC 4291 section 2.7"},
};

using V4 = std::array<unsigned char, 4>;

// Do the first `prefix` bits of `a` and `net` agree?
bool prefix_match(const unsigned char *a, const unsigned char *net, unsigned prefix) {
  const unsigned bytes = prefix / 8, bits = prefix % 8;
  if (std::memcmp(a, net, bytes) != 0) return false;
  if (bits == 0) return true;
  const auto mask = static_cast<unsigned char>(0xff << (8 - bits));
  return (a[bytes] & mask) == (net[bytes] & mask);
}

// Does `a` lie in net/prefix? (Same family only.)
bool in_range(const Poco::Net::IPAddress &a, const Poco::Net::IPAddress &net, unsigned prefix) {
  if (a.family() != net.family()) return false;
  return prefix_match(static_cast<const unsigned char *>(a.addr()), static_cast<const unsigned char *>(net.addr()),
                      prefix);
}

// The most specific row of `table` holding `a` (a has the table's family).
template <std::size_t N>
const Row *row_of(const Poco::Net::IPAddress &a, const Row (&table)[N]) {
  const Row *best = nullptr;
  for (const Row &r : table) {
    if ((best == nullptr || r.prefix >= best->prefix) && in_range(a, Poco::Net::IPAddress(r.net), r.prefix)) best = &r;
  }
  return best;
}

// An IPv4 address an IPv6 address carries, and the form that carries it.
struct Embedded {
  V4 v4{};
  const char *form = "";
  bool isatap = false;  // the prefix is judged too
};

std::optional<Embedded> embedded_ipv4(const unsigned char *b) {
  static const unsigned char zero[12] = {};
  Embedded e;
  auto take = [&](int at, const char *form) {
    std::memcpy(e.v4.data(), b + at, 4);
    e.form = form;
    return e;
  };
  // ::/128 and ::1/128 are themselves, not 0.0.0.0 and 0.0.0.1.
  if (std::memcmp(b, zero, 12) == 0 && b[12] == 0 && b[13] == 0 && b[14] == 0 && b[15] <= 1) return std::nullopt;
  if (std::memcmp(b, zero, 10) == 0 && b[10] == 0xff && b[11] == 0xff)
    return take(12, "IPv4-mapped, RFC 4291 section 2.5.5.2");
  if (std::memcmp(b, zero, 8) == 0 && b[8] == 0xff && b[9] == 0xff && b[10] == 0 && b[11] == 0)
    return take(12, "IPv4-translated, RFC 2765 section 2.1");
  if (std::memcmp(b, zero, 12) == 0) return take(12, "IPv4-compatible, RFC 4291 section 2.5.5.1");
  static const unsigned char nat64[12] = {0x00, 0x64, 0xff, 0x9b};
  if (std::memcmp(b, nat64, 12) == 0) return take(12, "NAT64, RFC 6052");
  if (b[0] == 0x20 && b[1] == 0x02) return take(2, "6to4, RFC 3056");
  if (b[0] == 0x20 && b[1] == 0x01 && b[2] == 0 && b[3] == 0) {
    // Teredo: the client's address is the last 32 bits, inverted.
    e = take(12, "Teredo client, RFC 4380 section 4");
    for (unsigned char &x : e.v4) x = static_cast<unsigned char>(~x);
    return e;
  }
  if ((b[8] == 0x00 || b[8] == 0x02) && b[9] == 0 && b[10] == 0x5e && b[11] == 0xfe) {
    e = take(12, "ISATAP interface id, RFC 5214 section 6.1");
    e.isatap = true;
    return e;
  }
  return std::nullopt;
}

std::string describe(const Row &r) { return std::string(r.name) + " (" + r.rfc + ")"; }

}  // namespace

TargetPolicy::TargetPolicy(const std::vector<std::string> &allow) {
  for (const std::string &entry : allow) {
    if (entry == "*") {
      any_ = true;
      continue;
    }
    const auto slash = entry.find('/');
    Poco::Net::IPAddress net;
    if (!Poco::Net::IPAddress::tryParse(entry.substr(0, slash), net))
      throw std::invalid_argument("push.allow_targets: '" + entry + "' is not an IP address or CIDR range");
    const unsigned max = net.family() == Poco::Net::AddressFamily::IPv4 ? 32 : 128;
    unsigned prefix = max;
    if (slash != std::string::npos) {
      const std::string p = entry.substr(slash + 1);
      if (p.empty() || p.size() > 3 || p.find_first_not_of("0123456789") != std::string::npos ||
          std::stoul(p) > max)
        throw std::invalid_argument("push.allow_targets: '" + entry + "' has a bad prefix length");
      prefix = static_cast<unsigned>(std::stoul(p));
    }
    allow_.emplace_back(net, prefix);
  }
}

bool TargetPolicy::allowed(const Poco::Net::IPAddress &a) const {
  if (any_) return true;
  for (const auto &[net, prefix] : allow_)
    if (in_range(a, net, prefix)) return true;
  return false;
}

std::string TargetPolicy::refusal(const Poco::Net::IPAddress &a) const {
  if (allowed(a)) return {};
  if (a.family() == Poco::Net::AddressFamily::IPv4) {
    const Row *r = row_of(a, kIPv4);
    return r == nullptr || r->global ? std::string() : describe(*r);
  }
  const auto *b = static_cast<const unsigned char *>(a.addr());
  if (const std::optional<Embedded> e = embedded_ipv4(b)) {
    const Poco::Net::IPAddress v4(e->v4.data(), 4);
    if (e->isatap) {
      // The prefix routes it first: it must be reachable by itself too.
      const Row *p = row_of(a, kIPv6);
      if (p != nullptr && !p->global) return describe(*p);
    }
    if (allowed(v4)) return {};
    const Row *r = row_of(v4, kIPv4);
    if (r == nullptr || r->global) return {};
    return "an IPv6 address embedding " + v4.toString() + " (" + e->form + "), which is " + describe(*r);
  }
  const Row *r = row_of(a, kIPv6);
  return r == nullptr || r->global ? std::string() : describe(*r);
}

std::vector<Poco::Net::IPAddress> TargetPolicy::addresses(const std::string &host) const {
  std::vector<Poco::Net::IPAddress> all;
  Poco::Net::IPAddress literal;
  std::string h = host;
  if (h.size() > 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  if (Poco::Net::IPAddress::tryParse(h, literal)) {
    all.push_back(literal);
  } else {
    try {
      const Poco::Net::HostEntry he = Poco::Net::DNS::resolve(h);
      all = he.addresses();
    } catch (const Poco::Exception &e) {
      throw std::runtime_error("cannot resolve '" + h + "': " + e.displayText());
    }
  }
  std::vector<Poco::Net::IPAddress> ok;
  std::string first_refusal;
  for (const auto &a : all) {
    const std::string why = refusal(a);
    if (why.empty()) ok.push_back(a);
    else if (first_refusal.empty()) first_refusal = a.toString() + ", " + why;
  }
  if (ok.empty()) {
    if (first_refusal.empty()) throw std::runtime_error("'" + h + "' has no address");
    throw std::runtime_error("'" + h + "' resolves to " + first_refusal +
                             ", which push notifications may not reach (an operator can allow it with "
                             "push.allow_targets)");
  }
  return ok;
}

}  // namespace toolnexus::server_detail

// server/src/wire/auth.hpp: optional bearer-token authentication (A2A v0.3
// section 4, "Authentication and Authorization": HTTP auth schemes declared
// in the card, credentials in headers). Tokens are kept only as SHA-256
// digests and compared in constant time; they are never logged.
#ifndef TOOLNEXUS_SERVER_AUTH_HPP
#define TOOLNEXUS_SERVER_AUTH_HPP

#include <array>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace toolnexus::server_detail {

/// The credential of an Authorization header value "Bearer <credential>"
/// (scheme case-insensitive, surrounding spaces dropped; RFC 6750 section
/// 2.1), or nullopt when the value is not that or the credential is empty.
std::optional<std::string_view> bearer_credential(std::string_view authorization);

/// Maps "Authorization: Bearer <token>" to a principal name. Immutable after
/// construction; thread-safe.
class TokenAuth {
 public:
  /// `tokens`: token -> principal. Empty = authentication off.
  explicit TokenAuth(const std::map<std::string, std::string> &tokens);
  /// True when tokens are configured.
  bool enabled() const noexcept { return !entries_.empty(); }
  /// The principal for an Authorization header value ("Bearer <token>",
  /// scheme case-insensitive), or nullopt. Checks every configured token in
  /// constant time (digest comparison, no early exit).
  std::optional<std::string> authenticate(std::string_view authorization) const;

 private:
  struct Entry {
    std::array<uint8_t, 32> digest;
    std::string principal;
  };
  std::vector<Entry> entries_;
};

}  // namespace toolnexus::server_detail

#endif  // TOOLNEXUS_SERVER_AUTH_HPP

// plugins/encrypt/keys.hpp: the keys of the encrypt decorator: loaded from a
// key file (mode 0600 or stricter, checked) or an environment variable, each
// with an id; the last one listed is the newest and seals every new write.
//
// Text of a key file or variable: entries "<id>:<64 hex digits>" (a 32-byte
// XChaCha20-Poly1305 key) separated by white space or newlines; '#' starts
// a comment up to the end of the line. An id is 1..32 of [A-Za-z0-9_.-].
#ifndef TOOLNEXUS_ENCRYPT_KEYS_HPP
#define TOOLNEXUS_ENCRYPT_KEYS_HPP

#include <array>
#include <string>
#include <string_view>
#include <vector>

namespace toolnexus::encrypt {

/// One key. `check` is a key check value: the first 8 bytes of
/// BLAKE2b(key, "toolnexus-encrypt key check"); it is stored beside every
/// sealed record so that a wrong key is told apart from a damaged record.
struct Key {
  std::string id;
  std::array<unsigned char, 32> bytes{};
  std::array<unsigned char, 8> check{};
};

/// The keys of one store, oldest first. Immutable once loaded: thread-safe.
class KeyRing {
 public:
  /// Loads from option key=<file> or env=<VAR> (exactly one). Throws
  /// sdk::Error(TNX_EINVAL) naming the file or variable and the line (never
  /// a key byte): missing, group/other-readable file, bad entry, duplicate
  /// id, no key at all.
  static KeyRing load(const std::string *key_file, const std::string *env_var);

  /// The newest key (seals new writes).
  const Key &newest() const noexcept { return keys_.back(); }
  /// The key with id `id`, or nullptr.
  const Key *find(std::string_view id) const noexcept;
  /// "k1, k2" for messages.
  std::string ids() const;
  /// Where the keys came from: "key file '/etc/tnx/key'" or "environment variable 'TNX_KEY'".
  const std::string &source() const noexcept { return source_; }

 private:
  std::vector<Key> keys_;
  std::string source_;
};

/// Parses key text; `where` names its source in messages. Throws as load.
std::vector<Key> parse_keys(std::string_view text, const std::string &where);

}  // namespace toolnexus::encrypt

#endif

// plugins/encrypt/envelope.hpp: the sealed form of a Task, as the inner
// store keeps it. The inner store gets a small JSON object that still
// parses as a Task (stores that read their index fields from the JSON,
// such as file:, keep working) and holds the whole Task sealed:
//
//   {"id":"t1","contextId":"c1","status":{"state":"working",
//    "timestamp":"2026-12-04T17:00:00.000000Z"},
//    "tnxSealed":"tnx1.<key id>.<key check, 16 hex>.<base64 of nonce|ciphertext>"}
//
// Cipher: XChaCha20-Poly1305 (IETF, libsodium), a random 24-byte nonce per
// record. Associated data (authenticated, not encrypted): the format tag,
// the key id, the Task id, the version the record is bound to, contextId,
// state, status time, owner and tenant; so a record copied under another
// id, rolled back under a newer version, or given another owner fails to
// open (docs/encryption.md).
#ifndef TOOLNEXUS_ENCRYPT_ENVELOPE_HPP
#define TOOLNEXUS_ENCRYPT_ENVELOPE_HPP

#include "keys.hpp"

#include <cstdint>
#include <string>
#include <string_view>

namespace toolnexus::encrypt {

/// The index fields of a record (borrowed), all bound as associated data.
struct IndexFields {
  std::string_view id, context_id, state, owner, tenant;
  int64_t time_us = 0;
};

/// The sealed token of a stored envelope (views into the stored bytes).
struct Sealed {
  std::string_view kid, check_hex, b64;
};

/// The envelope JSON of Task `json` sealed with `key`, bound to `f` and
/// `version` (0: bound to no version). Thread-safe.
std::string seal(const Key &key, const IndexFields &f, uint64_t version, std::string_view json);

/// Finds the sealed token in `stored`: false when `stored` is no envelope
/// (a plaintext Task); throws sdk::Error(TNX_ECORRUPT) naming task `id`
/// when the token is malformed.
bool find_sealed(std::string_view stored, std::string_view id, Sealed &out);

/// Opens `s` with the key it names. Throws sdk::Error: TNX_EINVAL when the
/// key is missing or is not the one it was sealed with (naming the key id:
/// a key problem, not a damaged record), TNX_ECORRUPT naming the Task id
/// when authentication fails (a flipped byte, a record swapped, copied
/// under another id or rolled back to an old version).
std::string open(const KeyRing &keys, const IndexFields &f, uint64_t version, const Sealed &s);

/// status_time_us as RFC 3339 with microseconds ("...T17:00:00.000000Z").
std::string rfc3339(int64_t us);

}  // namespace toolnexus::encrypt

#endif

// plugins/file/index_format.hpp: the on-disk format of .tnx-index (layout
// comment of file_plugin.cpp): an append-only log of framed records
//   u32 length | u8 type | payload | u32 crc32(type + payload)
// (little-endian) and the record types. The identities it keeps of task
// files and of the directory (FileId, Stamp) are in basics.hpp.
//
// Pure functions and value types: thread-safe, no I/O.
#ifndef TOOLNEXUS_FILE_INDEX_FORMAT_HPP
#define TOOLNEXUS_FILE_INDEX_FORMAT_HPP

#include <endian.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace toolnexus::file_plugin {

/// The index file in <dir>.
inline constexpr const char *kIndexName = ".tnx-index";
/// A compacted index being written, renamed over kIndexName when complete.
inline constexpr const char *kIndexNewName = ".tnx-index.new";
/// The magic string of the header record.
inline constexpr const char *kIndexMagic = "toolnexus file index";
/// The format number of the header record.
inline constexpr uint64_t kIndexFormat = 1;

/// The type byte of a record; the comments list the payload's fields.
enum RecType : uint8_t {
  kRecHeader = 1,   // magic, format
  kRecTask = 2,     // key, contextId, state, owner, tenant, time, version, file id, corrupt, problem,
                    // due time (since ABI 1.5; absent in older records)
  kRecDel = 3,      // key, its last version (a tombstone)
  kRecOpen = 4,     // pid
  kRecClose = 5,    // directory stamp, last
  kRecMoved = 7,    // this file was replaced by a compacted one
  kRecReset = 8,    // processes open now
  kRecEpoch = 9,    // version epoch (raised by every rebuild of an index that was not trusted)
};

/// CRC-32 (IEEE 802.3, reflected: zlib's, gzip's and PNG's) of a record, by
/// ISA-L, which picks a carry-less-multiply version for the CPU at run time:
/// the same values as zlib's crc32 (so indexes written before read as they
/// are), 11x faster on 155-byte records (zlib took 6 ms of a 45 ms
/// `store list` of 50,000 Tasks).
uint32_t crc32(std::string_view d) noexcept;

/// Appends `v` little-endian to `out`.
inline void put_u32(std::string &out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFFu));
}
/// Appends `v` little-endian to `out`.
inline void put_u64(std::string &out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFFu));
}
/// The little-endian u32 at `p` (4 readable bytes).
inline uint32_t get_u32(const char *p) noexcept {
  uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return le32toh(v);
}
/// The little-endian u64 at `p` (8 readable bytes).
inline uint64_t get_u64(const char *p) noexcept {
  uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return le64toh(v);
}

/// Builds one record's payload; frame_into() wraps it as
/// u32 length | u8 type | payload | u32 crc32(type + payload).
class RecWriter {
 public:
  /// A record of type `t`; the fields follow in the order of its payload.
  explicit RecWriter(RecType t) { body_.push_back(static_cast<char>(t)); }
  /// Appends one byte.
  RecWriter &u8(uint8_t v) {
    body_.push_back(static_cast<char>(v));
    return *this;
  }
  /// Appends a little-endian u64.
  RecWriter &u64(uint64_t v) {
    put_u64(body_, v);
    return *this;
  }
  /// Appends an i64 (two's complement, as a u64).
  RecWriter &i64(int64_t v) { return u64(static_cast<uint64_t>(v)); }
  /// Appends a string: u32 length, then its bytes.
  RecWriter &str(std::string_view s) {
    put_u32(body_, static_cast<uint32_t>(s.size()));
    body_.append(s);
    return *this;
  }
  /// Appends the framed record to `out`.
  void frame_into(std::string &out) const {
    put_u32(out, static_cast<uint32_t>(body_.size()));
    out += body_;
    put_u32(out, crc32(body_));
  }

 private:
  std::string body_;
};

/// Reads a payload; ok() turns false on any overrun.
class RecReader {
 public:
  /// Reads payload `p` (borrowed: it must outlive the reader and its views).
  explicit RecReader(std::string_view p) : p_(p) {}
  /// The next byte (0 on overrun).
  uint8_t u8() {
    if (p_.size() < 1) return fail<uint8_t>();
    const auto v = static_cast<uint8_t>(p_[0]);
    p_.remove_prefix(1);
    return v;
  }
  /// The next u64 (0 on overrun).
  uint64_t u64() {
    if (p_.size() < 8) return fail<uint64_t>();
    const uint64_t v = get_u64(p_.data());
    p_.remove_prefix(8);
    return v;
  }
  /// The next i64 (0 on overrun).
  int64_t i64() { return static_cast<int64_t>(u64()); }
  // A string field as a view into the payload (valid while it is).
  std::string_view view() {
    if (p_.size() < 4) return fail<std::string_view>();
    const uint32_t n = get_u32(p_.data());
    if (p_.size() - 4 < n) return fail<std::string_view>();
    const std::string_view s = p_.substr(4, n);
    p_.remove_prefix(4 + static_cast<size_t>(n));
    return s;
  }
  /// A string field, copied ("" on overrun).
  std::string str() {
    if (p_.size() < 4) return fail<std::string>();
    const uint32_t n = get_u32(p_.data());
    if (p_.size() - 4 < n) return fail<std::string>();
    std::string s(p_.substr(4, n));
    p_.remove_prefix(4 + static_cast<size_t>(n));
    return s;
  }
  /// False once any read overran the payload.
  bool ok() const noexcept { return ok_; }
  /// Bytes not read yet (a field appended by a later format is read only
  /// when there are enough).
  size_t left() const noexcept { return p_.size(); }

 private:
  template <class T>
  T fail() {
    ok_ = false;
    p_ = std::string_view();
    return T();
  }
  std::string_view p_;
  bool ok_ = true;
};

/// How many bytes the framed record at data[off..] takes in all, as far as
/// its length field says (0 when the length field is not all there); for a
/// reader that fetches the file piece by piece.
size_t record_extent(std::string_view data, size_t off) noexcept;

/// The next framed record in data[off..]: its type and payload; returns the
/// bytes it takes, 0 when incomplete or damaged (a torn tail).
size_t next_record(std::string_view data, size_t off, uint8_t &type, std::string_view &payload);

/// The epoch of a rebuild: seconds since 2000-01-01T00:00:00Z (at least 1).
/// Versions are epoch * 2^32 + n, so this lasts until 2136.
uint64_t clock_epoch() noexcept;

}  // namespace toolnexus::file_plugin

#endif  // TOOLNEXUS_FILE_INDEX_FORMAT_HPP

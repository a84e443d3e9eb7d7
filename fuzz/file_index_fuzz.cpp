// fuzz/file_index_fuzz.cpp: the file store's .tnx-index reader
// (plugins/file/index_format.hpp: next_record, record_extent, RecReader;
// index.hpp: Index::apply).
//
// Input: byte 0 picks the mode.
//  - even: the rest is an index file as read from disk (torn, damaged or
//    made up): its records are framed, checked and applied in order, as the
//    store does at open.
//  - odd: the rest is a list of records, each [type u8][length u8][payload],
//    framed here with a correct CRC (so the payload decoders are reached
//    past the checksum), read back and applied.
//
// Invariants: a record read takes no more bytes than are there and as many
// as its length field says (record_extent); its CRC matches; a framed
// record reads back as written; a Task record that applies is found under
// its key with the version it carries, and a tombstone that applies
// removes its key; next_version of a key is above every version the index
// has seen for it.
#include "fuzz_check.hpp"
#include "index.hpp"
#include "index_format.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

using namespace toolnexus::file_plugin;

namespace {

void apply_checked(Index &index, uint8_t type, std::string_view payload) {
  const bool ok = index.apply(type, payload);
  if (!ok) return;
  RecReader r(payload);
  if (type == kRecTask) {
    const std::string_view key = r.view();
    for (int i = 0; i < 4; ++i) (void)r.view();
    (void)r.i64();
    const uint64_t version = r.u64();
    const Index::Slot *s = index.find(key);
    FUZZ_CHECK(s != nullptr, "an applied Task record is not in the index");
    FUZZ_CHECK(s->version == version, "an applied Task record has another version");
    if (version < UINT64_MAX) FUZZ_CHECK(index.next_version(key) > version, "next_version not above the last one");
  } else if (type == kRecDel) {
    const std::string key = r.str();
    FUZZ_CHECK(index.find(key) == nullptr, "a deleted key is still in the index");
  }
}

void read_file(std::string_view data) {
  Index index;
  std::size_t off = 0;
  for (;;) {
    uint8_t type = 0;
    std::string_view payload;
    const std::size_t n = next_record(data, off, type, payload);
    if (n == 0) break;
    FUZZ_CHECK(n <= data.size() - off, "a record longer than the data");
    FUZZ_CHECK(n == record_extent(data, off), "next_record and record_extent disagree");
    FUZZ_CHECK(payload.size() + 9 == n, "payload size");
    FUZZ_CHECK(crc32(data.substr(off + 4, n - 8)) == get_u32(data.data() + off + n - 4), "CRC mismatch accepted");
    if (type == kRecMoved) break;
    apply_checked(index, type, payload);
    off += n;
  }
}

void read_framed(std::string_view in) {
  std::string file;
  std::string_view rest = in;
  while (rest.size() >= 2) {
    const auto type = static_cast<uint8_t>(rest[0]);
    const std::size_t len = std::min<std::size_t>(static_cast<uint8_t>(rest[1]), rest.size() - 2);
    std::string body(1, static_cast<char>(type));
    body.append(rest.substr(2, len));
    rest.remove_prefix(2 + len);
    const std::size_t at = file.size();
    put_u32(file, static_cast<uint32_t>(body.size()));
    file += body;
    put_u32(file, crc32(body));
    uint8_t t2 = 0;
    std::string_view p2;
    FUZZ_CHECK(next_record(file, at, t2, p2) == body.size() + 8, "a framed record does not read back");
    FUZZ_CHECK(t2 == type && p2 == std::string_view(body).substr(1), "a framed record reads back changed");
  }
  read_file(file);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, std::size_t size) {
  if (size < 1) return 0;
  const std::string_view in(reinterpret_cast<const char *>(data) + 1, size - 1);
  if ((data[0] & 1) == 0)
    read_file(in);
  else
    read_framed(in);
  return 0;
}

// plugins/file: the "file" scheme. One JSON file per Task in a directory,
// compatible with the original (Elixir) FileTaskStore. Built against the SDK
// header only (plus Poco::Foundation for SHA-256, RapidJSON for parsing and
// ISA-L for the index's CRC-32).
//
// ===========================================================================
// On-disk layout of file:<dir>
// ===========================================================================
//
// <dir> is the text after "file:", all of it (no ?options): a relative path
// is taken against the working directory at open; the directory and its
// missing parents are created (mode 0777 minus the umask, each new entry
// fsynced into its parent). The store only ever creates, replaces or removes
// names directly inside <dir>, always relative to a descriptor of <dir>
// opened once. Files are created 0666 minus the umask. Opened with the
// host's TNX_OPEN_READ_ONLY (ABI 1.2) the store changes nothing at all: a
// missing <dir> is TNX_ENOTFOUND (not created), stray files are left alone,
// save and del are TNX_EUNSUPPORTED.
//
//   <stem>.json   The Task: exactly the task_json bytes of the last save, as
//                 the seed wrote them. Nothing else is in it. contextId,
//                 status.state and status.timestamp are re-derived from it on
//                 every read.
//   <stem>.meta   Optional sidecar with the owner and tenant (which are not
//                 part of the Task JSON), a small JSON object:
//                   {"owner":"...","tenant":"..."}
//                 possibly with a "prev" slot (see "Atomicity" below):
//                   {"owner":..,"tenant":..,
//                    "prev":{"owner":..,"tenant":..,"sha256":"<64 hex>"}}
//                 Absent = owner and tenant empty, so a directory written by
//                 the seed (only <id>.json files) opens as is. A task saved
//                 with empty owner and tenant never gets a sidecar.
//   .tnx-<pid>-<n>.tmp
//                 Temporary file of a save in progress (name unique per
//                 process and store: pid plus a process-wide counter, created
//                 with O_EXCL). Stray ones left by a crash are removed when a
//                 store opens <dir> read-write and no other process has it
//                 open (the process slots of .tnx-lock, below, say so): what
//                 a live process is writing is never touched. Nothing else is
//                 removed then except orphan sidecars (a <stem>.meta without
//                 <stem>.json, left by a crash during the first save of a
//                 task) and a stray .tnx-index.new.
//   .tnx-lock     Empty; its bytes carry OFD record locks (fcntl
//                 F_OFD_SETLK, so they work between the threads of one
//                 process too): byte 0 the index lock (appending to or
//                 rewriting .tnx-index), bytes 16..271 one process slot per
//                 open read-write store (held while it is open: how many
//                 processes have the store open), bytes 1024..5119 the write
//                 lock of the ids hashing to that slot (held by a save or
//                 delete from its compare-and-set check until its change is
//                 in the index). Created by the first read-write open.
//   .tnx-index    The index: a derived cache of every task file's index
//                 fields, version and identity (inode, size, mtime), so that
//                 list and count read no task file they do not deliver. An
//                 append-only log of checksummed binary records (header,
//                 task, delete-with-last-version, open, close with the
//                 directory's stamp, epoch, reset), rewritten whole
//                 (.tnx-index.new, renamed over it) when it grows past 4x its
//                 live size; followers of the old file find a "moved" record
//                 at its end. A torn tail (a crash) is ignored and cut off by
//                 the next appender. Deleting it loses nothing: it is rebuilt.
//                 The directory stays the seed's: <id>.json files alone open
//                 as a store, and a directory written while no toolnexus
//                 process had it open is re-indexed at the next open.
//   anything else Ignored (README, the seed's own *.tmp files, files whose
//                 name is not a canonical task file name as defined below).
//
// The stem of a Task id:
//   - An id of 1..250 bytes made only of [A-Za-z0-9_-] is its own stem, so
//     "abc-1_Z" is stored as <dir>/abc-1_Z.json exactly (the seed's layout).
//   - Any other id: "~" followed by the id with every byte outside
//     [A-Za-z0-9_-] written as %XX (upper-case hex), if that fits in 250
//     bytes ("a/b" -> "~a%2Fb", ".." -> "~%2E%2E", "ü" -> "~%C3%BC").
//   - Otherwise (very long ids): "~sha256-" + the lower-case hex SHA-256 of
//     the id. The file's "id" member is checked against the requested id on
//     every read.
//   Plain stems never contain '~' and never start with '.', escaped stems
//   always contain '%', hashed stems never do: no two ids share a stem, no
//   stem is a temporary or a foreign name, and no stem contains '/' or NUL,
//   so nothing is ever created outside <dir>. Stems are at most 250 bytes, so
//   "<stem>.json" and "<stem>.meta" fit NAME_MAX (255). On read, a .json file
//   counts as a task file only if its stem is canonical (decoding and
//   re-encoding gives the same stem); then its "id" must be the id the name
//   stands for, or the file is reported corrupt.
//
// Atomicity and durability of a save (the usual fast path is the bare
// write-fsync-rename-fsync(dir) sequence):
//   1. write the new bytes to a fresh .tnx-*.tmp (all of them, retrying short
//      writes and EINTR), fdatasync, close, rename over <stem>.json,
//   2. fsync <dir> (concurrent saves share one directory fsync when it
//      started after all of their renames: a group commit), then report.
//   Any failed step removes the temporary file and reports TNX_EIO naming the
//   path and the system error; the previous <stem>.json is untouched.
//   The sidecar is written (same temp-fsync-rename-fsync(dir) steps) only
//   when owner/tenant change. It is written before the Task file, so a crash
//   in between must not pair the old Task with the new owner: when a stored
//   Task changes owner and bytes in one save, the sidecar first gets the new
//   owner plus a "prev" slot holding the old owner and the SHA-256 of the
//   old Task bytes; a reader whose Task file still has those bytes uses
//   "prev". After the Task file is in place, the sidecar is rewritten without
//   "prev" (best effort; any later save with a "prev" present cleans it).
//   A failure after the rename (directory fsync) cannot be undone: it is
//   reported as TNX_EIO saying the change may not survive a crash.
//
// Versions and compare-and-set: versions live in the index (first seen on
// disk = 1, every save +1, a deleted id's last version kept so a re-created
// id continues upwards). A save or delete takes its id's lock (a mutex per
// slot and the OFD lock of that slot in .tnx-lock), reads the index (catching
// up with what other processes appended), checks that the task file is the
// one the index describes (same inode, size, mtime; otherwise it changed
// behind the index, e.g. by another program or a writer that crashed between
// rename and index append, and is read again with a new version), compares,
// writes, appends the new entry, and releases. So compare-and-set holds
// between threads, stores and processes (TNX_CAP_MULTI_PROCESS); different
// ids save in parallel. Reads take no lock: get returns the bytes it read
// only with the version whose entry names that very file, else re-checks
// under the id's lock: never old bytes with a newer version.
// When the index cannot be trusted at open (see below) and is rebuilt, the
// epoch is raised to at least the seconds since 2000-01-01 (and above the
// last one): versions handed out from then on are above 2^32 x epoch, so a
// version lost with the index's tail in a crash, or with the whole index
// (deleted, emptied), is never given again. Only a directory no toolnexus
// store opened before (no .tnx-lock: the seed's) starts at epoch 0.
//
// Trusting the index at open: with other processes open (process slots
// held), when its open/close records match their number; alone, when the
// last process closed it cleanly and the directory's mtime/ctime/inode are
// what that close recorded. Otherwise (a crash, files changed while no
// process had the store open, a missing or damaged index) it is rebuilt:
// every task file whose identity differs from its entry is read again (a
// missing index: every file). Read-only opens trust it by the same rule and
// otherwise build it in memory only, changing nothing. Not seen until a
// read or the next untrusted open: a task file edited in place (not by
// rename) while processes have the store open; list notices it when it
// delivers the record (identity check) and re-reads it.
//
// Saves are checked first (TNX_EINVAL, nothing written): task_json must be a
// Task the host would accept (an object with a non-empty string "id", string
// contextId/status.state, RFC 3339 status.timestamp) whose id, contextId,
// state and timestamp equal the record's, since reads re-derive them.
//
// list walks the index in list order, takes the first page_size + 1 matches
// and reads only the task files (and sidecars) of the page_size it delivers
// (none with omit_json); a file found changed is re-indexed and the page
// made again. count (ABI 1.3) answers from counters kept with the index
// (per owner/tenant/state and per contextId); a time window walks that part
// of the order. Corrupt files sort last (TNX_TIME_NONE) and are not counted.
// The cursor is sdk::ListKey's "<time>.<hex id>"; for ids over ~500 bytes,
// whose ListKey would exceed the ABI's 1024-byte cursor limit, it is
// "<ListKey of time and the first 460 id bytes>.<sha256 hex of the id>".
//
// Errors: a task file that cannot be decoded (empty, truncated, not JSON, not
// an object, no string "id", a bad contextId/status, an "id" that is not the
// one its name stands for, not a regular file) and an unreadable sidecar are
// TNX_ECORRUPT naming the file; list stops on them when it reaches them
// (they sort last), unless deliver_corrupt asks for them.
#include "toolnexus/plugin.hpp"

#include "../common/task_counts.hpp"
#include "../common/wakeup.hpp"

#include <Poco/DigestEngine.h>
#include <Poco/SHA2Engine.h>
#include <isa-l/crc.h>
#include <rapidjson/document.h>
#include <rapidjson/error/en.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include <dirent.h>
#include <endian.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <cerrno>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <ctime>
#include <memory>
#include <memory_resource>
#include <new>
#include <mutex>
#include <optional>
#include <set>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <system_error>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

namespace {

using toolnexus::sdk::Error;
using toolnexus::sdk::ListKey;
using toolnexus::sdk::view;
using toolnexus::sdk::quote;

// ---------------------------------------------------------------------------
// Small helpers
// ---------------------------------------------------------------------------

constexpr size_t kMaxStem = 250;  // NAME_MAX (255) minus ".json"
constexpr std::string_view kJsonExt = ".json";
constexpr std::string_view kMetaExt = ".meta";
constexpr std::string_view kHashPrefix = "~sha256-";
constexpr std::string_view kTempPrefix = ".tnx-";
constexpr std::string_view kTempSuffix = ".tmp";
constexpr size_t kMaxCursor = 1024;
// Id bytes kept in a cursor for ids too long for the plain ListKey form.
constexpr size_t kCursorIdPrefix = 460;

// A zeroed record with its header filled in.
tnx_task_record empty_record() noexcept {
  tnx_task_record r{};
  r.header.struct_size = static_cast<uint32_t>(sizeof(tnx_task_record));
  r.header.abi_major = TNX_ABI_MAJOR;
  r.header.abi_minor = TNX_ABI_MINOR;
  return r;
}

std::string errtext(int e) { return std::error_code(e, std::generic_category()).message(); }

bool starts_with(std::string_view s, std::string_view p) noexcept {
  return s.size() >= p.size() && s.compare(0, p.size(), p) == 0;
}
bool ends_with(std::string_view s, std::string_view p) noexcept {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}

std::string sha256_hex(std::string_view data) {
  Poco::SHA2Engine engine(Poco::SHA2Engine::SHA_256);
  engine.update(data.data(), data.size());
  return Poco::DigestEngine::digestToHex(engine.digest());
}

// Owns a file descriptor.
class Fd {
 public:
  explicit Fd(int fd = -1) noexcept : fd_(fd) {}
  Fd(Fd &&o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd &operator=(Fd &&o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  Fd(const Fd &) = delete;
  Fd &operator=(const Fd &) = delete;
  ~Fd() { reset(); }
  int get() const noexcept { return fd_; }
  int release() noexcept { return std::exchange(fd_, -1); }
  void reset() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
};

// ---------------------------------------------------------------------------
// Task id <-> file stem (see the layout comment)
// ---------------------------------------------------------------------------

bool plain_byte(unsigned char c) noexcept {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '-';
}

bool all_plain(std::string_view s) noexcept {
  for (char c : s)
    if (!plain_byte(static_cast<unsigned char>(c))) return false;
  return true;
}

// The stem ("<stem>.json") of the Task `id` (non-empty).
std::string stem_for(std::string_view id) {
  if (id.size() <= kMaxStem && all_plain(id)) return std::string(id);
  static const char *hex = "0123456789ABCDEF";
  std::string enc = "~";
  for (char ch : id) {
    if (enc.size() > kMaxStem) break;
    const auto c = static_cast<unsigned char>(ch);
    if (plain_byte(c)) {
      enc.push_back(ch);
    } else {
      enc.push_back('%');
      enc.push_back(hex[c >> 4]);
      enc.push_back(hex[c & 15]);
    }
  }
  if (enc.size() <= kMaxStem) return enc;
  return std::string(kHashPrefix) + sha256_hex(id);
}

enum class StemKind { plain, escaped, hashed };

// What a stem found on disk stands for. `id` is empty for hashed stems (the
// id is then only known from the file).
struct StemInfo {
  StemKind kind;
  std::string id;
};

int hex_value(char h, bool upper) noexcept {
  if (h >= '0' && h <= '9') return h - '0';
  if (upper && h >= 'A' && h <= 'F') return h - 'A' + 10;
  if (!upper && h >= 'a' && h <= 'f') return h - 'a' + 10;
  return -1;
}

// Classifies a stem; nullopt when it is not a canonical task file stem.
std::optional<StemInfo> classify(std::string_view stem) {
  if (stem.empty() || stem.size() > kMaxStem) return std::nullopt;
  if (all_plain(stem)) return StemInfo{StemKind::plain, std::string(stem)};
  if (stem.size() == kHashPrefix.size() + 64 && starts_with(stem, kHashPrefix)) {
    for (size_t i = kHashPrefix.size(); i < stem.size(); ++i)
      if (hex_value(stem[i], false) < 0) return std::nullopt;
    return StemInfo{StemKind::hashed, std::string()};
  }
  if (stem[0] != '~') return std::nullopt;
  std::string id;
  for (size_t i = 1; i < stem.size();) {
    const auto c = static_cast<unsigned char>(stem[i]);
    if (plain_byte(c)) {
      id.push_back(stem[i]);
      ++i;
    } else if (c == '%' && i + 2 < stem.size() && hex_value(stem[i + 1], true) >= 0 &&
               hex_value(stem[i + 2], true) >= 0) {
      id.push_back(static_cast<char>(hex_value(stem[i + 1], true) * 16 + hex_value(stem[i + 2], true)));
      i += 3;
    } else {
      return std::nullopt;
    }
  }
  if (id.empty() || stem_for(id) != stem) return std::nullopt;
  return StemInfo{StemKind::escaped, std::move(id)};
}

bool is_temp_name(std::string_view n) noexcept {
  if (!starts_with(n, kTempPrefix) || !ends_with(n, kTempSuffix)) return false;
  std::string_view mid = n.substr(kTempPrefix.size(), n.size() - kTempPrefix.size() - kTempSuffix.size());
  const size_t dash = mid.find('-');
  if (dash == std::string_view::npos || dash == 0 || dash + 1 == mid.size()) return false;
  for (size_t i = 0; i < mid.size(); ++i)
    if (i != dash && (mid[i] < '0' || mid[i] > '9')) return false;
  return true;
}

// ---------------------------------------------------------------------------
// RFC 3339 timestamps (same acceptance as the host: Z/z or +HH:MM/-HH:MM,
// T or t, optional fraction truncated to microseconds, second 60 allowed)
// ---------------------------------------------------------------------------

int64_t days_from_civil(int64_t y, int64_t m, int64_t d) noexcept {
  y -= m <= 2 ? 1 : 0;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const int64_t yoe = y - era * 400;
  const int64_t doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
  const int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + doe - 719468;
}

bool parse_rfc3339(std::string_view t, int64_t &out_us) noexcept {
  auto num = [&](size_t pos, size_t n, int64_t &v) {
    if (pos + n > t.size()) return false;
    v = 0;
    for (size_t i = pos; i < pos + n; ++i) {
      if (t[i] < '0' || t[i] > '9') return false;
      v = v * 10 + (t[i] - '0');
    }
    return true;
  };
  int64_t year = 0, month = 0, day = 0, hour = 0, minute = 0, second = 0;
  if (t.size() < 20 || !num(0, 4, year) || t[4] != '-' || !num(5, 2, month) || t[7] != '-' ||
      !num(8, 2, day) || (t[10] != 'T' && t[10] != 't') || !num(11, 2, hour) || t[13] != ':' ||
      !num(14, 2, minute) || t[16] != ':' || !num(17, 2, second))
    return false;
  size_t p = 19;
  int64_t frac = 0;
  if (p < t.size() && t[p] == '.') {
    const size_t start = ++p;
    int digits = 0;
    while (p < t.size() && t[p] >= '0' && t[p] <= '9') {
      if (digits < 6) {
        frac = frac * 10 + (t[p] - '0');
        ++digits;
      }
      ++p;
    }
    if (p == start) return false;
    for (; digits < 6; ++digits) frac *= 10;
  }
  if (p >= t.size()) return false;
  int64_t offset_s = 0;
  if (t[p] == 'Z' || t[p] == 'z') {
    if (p + 1 != t.size()) return false;
  } else if (t[p] == '+' || t[p] == '-') {
    int64_t oh = 0, om = 0;
    if (p + 6 != t.size() || !num(p + 1, 2, oh) || t[p + 3] != ':' || !num(p + 4, 2, om)) return false;
    offset_s = (t[p] == '-' ? -1 : 1) * (oh * 3600 + om * 60);
  } else {
    return false;
  }
  static const int kDays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  if (month < 1 || month > 12 || day < 1 || hour > 23 || minute > 59 || second > 60) return false;
  const bool leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
  const int64_t dim = kDays[month - 1] + (month == 2 && leap ? 1 : 0);
  if (day > dim) return false;
  const int64_t secs = days_from_civil(year, month, day) * 86400 + hour * 3600 + minute * 60 + second -
                       offset_s;
  out_us = secs * 1000000 + frac;
  return true;
}

// ---------------------------------------------------------------------------
// Task JSON and sidecar codecs
// ---------------------------------------------------------------------------

// The index fields of a Task, derived from its JSON.
struct TaskFields {
  std::string id, context_id, state;
  int64_t time_us = TNX_TIME_NONE;
};

// Parses Task JSON; returns "" or why it is not a valid Task. Mirrors the
// host's validation, so what the host accepts decodes here and vice versa.
std::string parse_task(std::string_view json, TaskFields &f) {
  if (json.empty()) return "is empty";
  rapidjson::Document d;
  d.Parse<rapidjson::kParseIterativeFlag>(json.data(), json.size());
  if (d.HasParseError())
    return std::string("is not valid JSON: ") + rapidjson::GetParseError_En(d.GetParseError()) +
           " at byte " + std::to_string(d.GetErrorOffset());
  if (!d.IsObject()) return "is not a JSON object";
  auto str = [](const rapidjson::Value &v) { return std::string(v.GetString(), v.GetStringLength()); };
  auto id = d.FindMember("id");
  if (id == d.MemberEnd() || !id->value.IsString()) return "has no string \"id\"";
  f.id = str(id->value);
  if (f.id.empty()) return "has an empty \"id\"";
  if (f.id.find('\0') != std::string::npos) return "has an \"id\" containing NUL";
  auto ctx = d.FindMember("contextId");
  f.context_id.clear();
  if (ctx != d.MemberEnd()) {
    if (!ctx->value.IsString()) return "has a \"contextId\" that is not a string";
    f.context_id = str(ctx->value);
  }
  f.state.clear();
  f.time_us = TNX_TIME_NONE;
  auto st = d.FindMember("status");
  if (st != d.MemberEnd()) {
    if (!st->value.IsObject()) return "has a \"status\" that is not an object";
    auto state = st->value.FindMember("state");
    if (state != st->value.MemberEnd()) {
      if (!state->value.IsString()) return "has a \"status.state\" that is not a string";
      f.state = str(state->value);
    }
    auto ts = st->value.FindMember("timestamp");
    if (ts != st->value.MemberEnd()) {
      int64_t us = 0;
      if (!ts->value.IsString() || !parse_rfc3339(str(ts->value), us))
        return "has a \"status.timestamp\" that is not an RFC 3339 time";
      f.time_us = us;
    }
  }
  return std::string();
}

// Owner and tenant of a task, with the optional "prev" slot (layout comment).
struct Meta {
  std::string owner, tenant;
  bool has_prev = false;
  std::string prev_owner, prev_tenant, prev_sha;
};

std::string parse_meta(std::string_view bytes, Meta &m) {
  if (bytes.empty()) return "is empty";
  rapidjson::Document d;
  d.Parse<rapidjson::kParseIterativeFlag>(bytes.data(), bytes.size());
  if (d.HasParseError())
    return std::string("is not valid JSON: ") + rapidjson::GetParseError_En(d.GetParseError()) +
           " at byte " + std::to_string(d.GetErrorOffset());
  if (!d.IsObject()) return "is not a JSON object";
  auto get = [](const rapidjson::Value &o, const char *key, std::string &out) {
    auto it = o.FindMember(key);
    out.clear();
    if (it == o.MemberEnd()) return true;
    if (!it->value.IsString()) return false;
    out.assign(it->value.GetString(), it->value.GetStringLength());
    return true;
  };
  if (!get(d, "owner", m.owner) || !get(d, "tenant", m.tenant))
    return "has an \"owner\" or \"tenant\" that is not a string";
  auto prev = d.FindMember("prev");
  m.has_prev = prev != d.MemberEnd();
  if (m.has_prev) {
    if (!prev->value.IsObject() || !get(prev->value, "owner", m.prev_owner) ||
        !get(prev->value, "tenant", m.prev_tenant) || !get(prev->value, "sha256", m.prev_sha) ||
        m.prev_sha.size() != 64)
      return "has a malformed \"prev\"";
  }
  return std::string();
}

std::string encode_meta(const Meta &m) {
  rapidjson::StringBuffer buf;
  rapidjson::Writer<rapidjson::StringBuffer> w(buf);
  auto s = [&](const std::string &v) { w.String(v.data(), static_cast<rapidjson::SizeType>(v.size())); };
  w.StartObject();
  w.Key("owner");
  s(m.owner);
  w.Key("tenant");
  s(m.tenant);
  if (m.has_prev) {
    w.Key("prev");
    w.StartObject();
    w.Key("owner");
    s(m.prev_owner);
    w.Key("tenant");
    s(m.prev_tenant);
    w.Key("sha256");
    s(m.prev_sha);
    w.EndObject();
  }
  w.EndObject();
  std::string out(buf.GetString(), buf.GetSize());
  out.push_back('\n');
  return out;
}

// ---------------------------------------------------------------------------
// Directory fsync with group commit
// ---------------------------------------------------------------------------

// Makes renames/unlinks in one directory durable. A caller takes a ticket
// after its change and waits; one fsync of the directory that started after
// a change covers it, so concurrent savers share fsyncs. A failed fsync is
// reported to every caller it was meant to cover (the kernel reports a
// writeback error only once per open file).
//
// One caller at a time runs the fsync (the leader). When it ends, the
// leader wakes each caller it covered and hands the lead to the first
// caller not covered (who arrived during it); the others sleep on. Each
// caller is woken once, by its own Wakeup: a shared condition variable
// woke every waiter after every fsync.
class DirSync {
 public:
  explicit DirSync(int fd) noexcept : fd_(fd) {}

  uint64_t changed() {
    std::lock_guard<std::mutex> l(m_);
    return ++changes_;
  }

  // 0 or the errno of the fsync covering `ticket`.
  int wait(uint64_t ticket) {
    Waiter me;
    me.ticket = ticket;
    {
      std::lock_guard<std::mutex> l(m_);
      if (synced_ >= ticket) return 0;
      if (!syncing_) {
        syncing_ = true;
        me.lead = true;
      } else {
        (tail_ != nullptr ? tail_->next : head_) = &me;
        tail_ = &me;
      }
    }
    if (!me.lead) {
      me.wake.wait();
      if (!me.lead) return me.err;
    }
    // The leader: its ticket is at most changes_ now, so this fsync covers it.
    uint64_t target = 0;
    {
      std::lock_guard<std::mutex> l(m_);
      target = changes_;
    }
    int err = 0;
    while (::fsync(fd_) != 0) {
      if (errno != EINTR) {
        err = errno;
        break;
      }
    }
    Waiter *covered = nullptr, *next_leader = nullptr;
    {
      std::lock_guard<std::mutex> l(m_);
      if (err == 0 && target > synced_) synced_ = target;
      // Split the queue: covered callers leave it; the rest keep their order.
      Waiter *keep_head = nullptr, *keep_tail = nullptr, **cov_end = &covered;
      for (Waiter *w = head_; w != nullptr;) {
        Waiter *next = w->next;
        w->next = nullptr;
        if (w->ticket <= target) {
          *cov_end = w;
          cov_end = &w->next;
        } else {
          (keep_tail != nullptr ? keep_tail->next : keep_head) = w;
          keep_tail = w;
        }
        w = next;
      }
      next_leader = keep_head;
      if (next_leader != nullptr) {
        head_ = next_leader->next;
        tail_ = head_ != nullptr ? keep_tail : nullptr;
        next_leader->next = nullptr;
        next_leader->lead = true;
      } else {
        head_ = tail_ = nullptr;
        syncing_ = false;
      }
    }
    for (Waiter *w = covered; w != nullptr;) {
      Waiter *next = w->next;  // read before the wake lets its owner return
      w->err = err;
      w->wake.post();
      w = next;
    }
    if (next_leader != nullptr) next_leader->wake.post();
    return err;
  }

 private:
  // A caller waiting for an fsync (on its stack).
  struct Waiter {
    uint64_t ticket = 0;
    int err = 0;        // set before `wake` when covered
    bool lead = false;  // set before `wake` when it is to run the next fsync
    Waiter *next = nullptr;
    toolnexus::plugins::Wakeup wake;
  };
  int fd_;
  std::mutex m_;
  uint64_t changes_ = 0;
  uint64_t synced_ = 0;
  bool syncing_ = false;                          // a leader is running (or about to run) an fsync
  Waiter *head_ = nullptr, *tail_ = nullptr;      // waiting callers, in arrival order
};

// ---------------------------------------------------------------------------
// The index (.tnx-index) and the locks (.tnx-lock): see the layout comment
// ---------------------------------------------------------------------------

constexpr const char *kLockName = ".tnx-lock";
constexpr const char *kIndexName = ".tnx-index";
constexpr const char *kIndexNewName = ".tnx-index.new";
constexpr const char *kIndexMagic = "toolnexus file index";
constexpr uint64_t kIndexFormat = 1;
// Lock bytes of .tnx-lock (OFD record locks, one byte each).
constexpr off_t kIndexLockByte = 0;
constexpr off_t kProcessSlotBase = 16;
constexpr int kProcessSlots = 256;
constexpr off_t kIdLockBase = 1024;
constexpr size_t kIdSlots = 4096;

enum RecType : uint8_t {
  kRecHeader = 1,   // magic, format
  kRecTask = 2,     // key, contextId, state, owner, tenant, time, version, file id, corrupt, problem
  kRecDel = 3,      // key, its last version (a tombstone)
  kRecOpen = 4,     // pid
  kRecClose = 5,    // directory stamp, last
  kRecMoved = 7,    // this file was replaced by a compacted one
  kRecReset = 8,    // processes open now
  kRecEpoch = 9,    // version epoch (raised by every rebuild of an index that was not trusted)
};

// CRC-32 (IEEE 802.3, reflected: zlib's, gzip's and PNG's) of a record, by
// ISA-L, which picks a carry-less-multiply version for the CPU at run time:
// the same values as zlib's crc32 (so indexes written before read as they
// are), 11x faster on 155-byte records (zlib took 6 ms of a 45 ms
// `store list` of 50,000 Tasks).
uint32_t crc32(std::string_view d) noexcept {
  return crc32_gzip_refl(0, reinterpret_cast<const unsigned char *>(d.data()), d.size());
}

void put_u32(std::string &out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFFu));
}
void put_u64(std::string &out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xFFu));
}
uint32_t get_u32(const char *p) noexcept {
  uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return le32toh(v);
}
uint64_t get_u64(const char *p) noexcept {
  uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return le64toh(v);
}

// Builds one record's payload; frame() wraps it as
// u32 length | u8 type | payload | u32 crc32(type + payload).
class RecWriter {
 public:
  explicit RecWriter(RecType t) { body_.push_back(static_cast<char>(t)); }
  RecWriter &u8(uint8_t v) {
    body_.push_back(static_cast<char>(v));
    return *this;
  }
  RecWriter &u64(uint64_t v) {
    put_u64(body_, v);
    return *this;
  }
  RecWriter &i64(int64_t v) { return u64(static_cast<uint64_t>(v)); }
  RecWriter &str(std::string_view s) {
    put_u32(body_, static_cast<uint32_t>(s.size()));
    body_.append(s);
    return *this;
  }
  void frame_into(std::string &out) const {
    put_u32(out, static_cast<uint32_t>(body_.size()));
    out += body_;
    put_u32(out, crc32(body_));
  }

 private:
  std::string body_;
};

// Reads a payload; ok() turns false on any overrun.
class RecReader {
 public:
  explicit RecReader(std::string_view p) : p_(p) {}
  uint8_t u8() {
    if (p_.size() < 1) return fail<uint8_t>();
    const auto v = static_cast<uint8_t>(p_[0]);
    p_.remove_prefix(1);
    return v;
  }
  uint64_t u64() {
    if (p_.size() < 8) return fail<uint64_t>();
    const uint64_t v = get_u64(p_.data());
    p_.remove_prefix(8);
    return v;
  }
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
  std::string str() {
    if (p_.size() < 4) return fail<std::string>();
    const uint32_t n = get_u32(p_.data());
    if (p_.size() - 4 < n) return fail<std::string>();
    std::string s(p_.substr(4, n));
    p_.remove_prefix(4 + static_cast<size_t>(n));
    return s;
  }
  bool ok() const noexcept { return ok_; }

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

// How many bytes the framed record at data[off..] takes in all, as far as
// its length field says (0 when the length field is not all there); for a
// reader that fetches the file piece by piece.
size_t record_extent(std::string_view data, size_t off) noexcept {
  if (data.size() - off < 4) return 0;
  return 8 + static_cast<size_t>(get_u32(data.data() + off));
}

// The next framed record in data[off..]: its type and payload; returns the
// bytes it takes, 0 when incomplete or damaged (a torn tail).
size_t next_record(std::string_view data, size_t off, uint8_t &type, std::string_view &payload) {
  if (data.size() - off < 9) return 0;
  const uint32_t len = get_u32(data.data() + off);
  if (len == 0 || len > (1u << 28) || data.size() - off - 8 < len) return 0;
  const std::string_view body = data.substr(off + 4, len);
  if (crc32(body) != get_u32(data.data() + off + 4 + len)) return 0;
  type = static_cast<uint8_t>(body[0]);
  payload = body.substr(1);
  return 8 + static_cast<size_t>(len);
}

// What identifies the bytes of a task file: a save renames a new inode in,
// an edit in place changes size or mtime.
struct FileId {
  uint64_t ino = 0, size = 0;
  int64_t mtime_ns = 0;
  bool operator==(const FileId &o) const noexcept {
    return ino == o.ino && size == o.size && mtime_ns == o.mtime_ns;
  }
  bool operator!=(const FileId &o) const noexcept { return !(*this == o); }
  static FileId of(const struct stat &st) noexcept {
    return FileId{static_cast<uint64_t>(st.st_ino), static_cast<uint64_t>(st.st_size),
                  static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec};
  }
};

// What the directory looked like when the last process closed the store.
struct Stamp {
  int64_t mtime_ns = 0, ctime_ns = 0;
  uint64_t ino = 0;
  bool operator==(const Stamp &o) const noexcept {
    return mtime_ns == o.mtime_ns && ctime_ns == o.ctime_ns && ino == o.ino;
  }
};

// The epoch of a rebuild: seconds since 2000-01-01T00:00:00Z (at least 1).
// Versions are epoch * 2^32 + n, so this lasts until 2136.
uint64_t clock_epoch() noexcept {
  const int64_t s = static_cast<int64_t>(::time(nullptr)) - 946684800;
  return s > 0 ? static_cast<uint64_t>(s) : 1;
}

// The index fields of one task file. A corrupt one has no fields (time
// TNX_TIME_NONE) and the reason in `problem`. EntryView views them (in an
// IEntry, an index slot or an index record being read); IEntry owns them:
// what is built before it goes into the index, and a copy taken out of it
// to use without its lock.
template <class Str>
struct EntryFields {
  Str context_id, state, owner, tenant;
  int64_t time_us = TNX_TIME_NONE;
  uint64_t version = 0;
  FileId file;
  bool corrupt = false;
  bool unreadable = false;  // corrupt because it cannot be read (TNX_EIO), not decoded
  Str problem;
};
using EntryView = EntryFields<std::string_view>;

struct IEntry : EntryFields<std::string> {
  EntryView view() const noexcept {
    return EntryView{context_id, state, owner, tenant, time_us, version, file, corrupt, unreadable, problem};
  }
  static IEntry of(const EntryView &v) {
    IEntry e;
    e.context_id.assign(v.context_id);
    e.state.assign(v.state);
    e.owner.assign(v.owner);
    e.tenant.assign(v.tenant);
    e.time_us = v.time_us;
    e.version = v.version;
    e.file = v.file;
    e.corrupt = v.corrupt;
    e.unreadable = v.unreadable;
    e.problem.assign(v.problem);
    return e;
  }
};

// Where the index's nodes and strings live: a pool (fast, no per-block
// header) over this resource, which gives the pool's large chunks (1 MiB
// and up) as anonymous mappings aligned to 2 MiB and advised for
// transparent huge pages, and anything smaller from the heap. A 50,000-Task
// index is ~15 MB of small blocks: from malloc, every 4 KiB page of it was
// a page fault and every lookup a TLB miss (expensive in a VM); in huge
// pages a `toolnexus store list` of it ran 20% faster. Not thread-safe
// (the index is used under FileStore::imu_).
class IndexMemory final : public std::pmr::memory_resource {
  static constexpr size_t kHuge = size_t{2} << 20;
  static constexpr size_t kBig = size_t{1} << 20;
  static size_t mapped_size(size_t bytes) noexcept { return (bytes + kHuge - 1) & ~(kHuge - 1); }

  void *do_allocate(size_t bytes, size_t align) override {
    if (bytes < kBig || align > kHuge) return ::operator new(bytes, std::align_val_t(align));
    const size_t len = mapped_size(bytes);
    void *p = ::mmap(nullptr, len + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    const auto raw = reinterpret_cast<uintptr_t>(p);
    const uintptr_t at = (raw + kHuge - 1) & ~uintptr_t(kHuge - 1);
    if (at != raw) ::munmap(p, at - raw);
    if (at + len != raw + len + kHuge) ::munmap(reinterpret_cast<void *>(at + len), raw + kHuge - at);
#ifdef MADV_HUGEPAGE
    (void)::madvise(reinterpret_cast<void *>(at), len, MADV_HUGEPAGE);  // advice only
#endif
    return reinterpret_cast<void *>(at);
  }
  void do_deallocate(void *p, size_t bytes, size_t align) override {
    if (bytes < kBig || align > kHuge) return ::operator delete(p, bytes, std::align_val_t(align));
    ::munmap(p, mapped_size(bytes));
  }
  bool do_is_equal(const std::pmr::memory_resource &o) const noexcept override { return this == &o; }
};

// The in-memory index: every task file of the directory by key (the Task
// id; for a corrupt file whose id is not known, '\0' + its file name), in
// list order, with counters. Guarded by FileStore::imu_. Not copyable or
// movable: its containers allocate from its own pool (replace it whole
// through a unique_ptr).
struct Index {
  // One entry as the index keeps it: its strings back to back in one block
  // of the pool (key, contextId, state, owner, tenant, problem), so an
  // entry costs two small blocks (this node and its text) instead of five
  // heap strings; the map's key views the text's first part.
  struct Slot {
    int64_t time_us = TNX_TIME_NONE;
    uint64_t version = 0;
    FileId file;
    char *text = nullptr;
    uint32_t len[6] = {};  // key, context_id, state, owner, tenant, problem
    bool corrupt = false, unreadable = false;

    size_t text_size() const noexcept {
      return size_t{len[0]} + len[1] + len[2] + len[3] + len[4] + len[5];
    }
    EntryView view() const noexcept {
      size_t off = len[0];
      auto next = [&](int i) {
        std::string_view s(text + off, len[i]);
        off += len[i];
        return s;
      };
      EntryView v;
      v.context_id = next(1);
      v.state = next(2);
      v.owner = next(3);
      v.tenant = next(4);
      v.problem = next(5);
      v.time_us = time_us;
      v.version = version;
      v.file = file;
      v.corrupt = corrupt;
      v.unreadable = unreadable;
      return v;
    }
  };
  using Map = std::pmr::unordered_map<std::string_view, Slot>;
  using Node = Map::value_type;
  // A place in list order: (time, delivered id, keyed by name), then names
  // last, and the entry it stands for. `id` views the key inside `node`'s
  // text, which stays put until the entry is replaced or erased (put and
  // erase take its OKey out of `order` first), so the order holds no copy
  // of any id and list reaches an entry without a hash lookup. A probe key
  // (a lookup bound) has no node; its `id` need only outlive the lookup.
  struct OKey {
    int64_t time;
    std::string_view id;
    bool named;
    const Node *node;
  };
  struct OOrder {
    bool operator()(const OKey &a, const OKey &b) const noexcept {
      if (a.time != b.time) return a.time > b.time;
      const int c = a.id.compare(b.id);
      if (c != 0) return c < 0;
      return a.named < b.named;
    }
  };
  using Order = std::pmr::set<OKey, OOrder>;

  Index() = default;
  Index(const Index &) = delete;
  Index &operator=(const Index &) = delete;
  // The containers are not destroyed one node at a time: their every block
  // is the pool's, which `pool_`'s destructor returns at once (a 50,000-Task
  // index took 3 ms to free node by node). No destructor of theirs has any
  // other effect.
  ~Index() { store_.destroy(); }

 private:
  IndexMemory chunks_;
  std::pmr::unsynchronized_pool_resource pool_{[] {
                                                 std::pmr::pool_options o;
                                                 o.max_blocks_per_chunk = 1 << 14;
                                                 o.largest_required_pool_block = 512;
                                                 return o;
                                               }(),
                                               &chunks_};
  // The containers, in storage whose destructor does nothing (see ~Index).
  struct Containers {
    Map entries;
    Order order;
    explicit Containers(std::pmr::memory_resource *r) : entries(r), order(r) {}
  };
  struct Store {
    alignas(Containers) unsigned char raw[sizeof(Containers)];
    Containers *c = nullptr;
    void create(std::pmr::memory_resource *r) { c = new (raw) Containers(r); }
    void destroy() noexcept {}  // left to the pool: see ~Index
  } store_;
  bool made_ = (store_.create(&pool_), true);

 public:
  Map &entries = store_.c->entries;
  Order &order = store_.c->order;
  // Built on first use (build_counts, from count()), then kept up to date
  // by put and erase: a process that only lists (`toolnexus store list`)
  // never pays for them, nor an open for their ~750 instructions per Task.
  toolnexus::plugins::TaskCounts counts;
  bool counts_ready = false;
  std::unordered_map<std::string, uint64_t> tombs;  // last version of each deleted key
  // The bytes a compacted .tnx-index takes for `entries` and `tombs` (what
  // compaction compares the file with: estimating 128 bytes an entry made
  // an index of large entries, or of tombstones, rewrite itself on every
  // save).
  uint64_t live_bytes = 0;
  uint64_t epoch = 0;
  int64_t live = 0;  // processes that appended OPEN and not CLOSE, since RESET
  bool last_is_close = false, last_close_was_last = false;
  Stamp last_stamp;
  bool header_ok = false;

  static bool named(std::string_view key) noexcept { return !key.empty() && key[0] == '\0'; }
  static std::string shown(std::string_view key) {
    return std::string(named(key) ? key.substr(1) : key);
  }
  // The OKey of `n` with the time `time_us` (the entry's, or the one it is
  // about to get).
  static OKey okey(const Node &n, int64_t time_us) noexcept {
    const bool nm = named(n.first);
    return OKey{time_us, nm ? n.first.substr(1) : n.first, nm, &n};
  }

  // The entry of `key`, or null.
  const Slot *find(std::string_view key) const {
    auto it = entries.find(key);
    return it == entries.end() ? nullptr : &it->second;
  }

  // Bulk mode (a whole index file read from its start): records update
  // `entries` and `tombs` only; end_bulk() then builds `order` from one
  // sort (counts wait for their first use: build_counts). Updating the tree
  // and the counters per record made opening a 50,000-Task store twice as
  // slow; inserting unsorted left the tree's nodes scattered in memory, so
  // every list walked it through cache misses.
  bool bulk = false;
  void end_bulk() {
    bulk = false;
    std::pmr::vector<OKey> keys(&pool_);
    keys.reserve(entries.size());
    for (const Node &n : entries) keys.push_back(okey(n, n.second.time_us));
    std::sort(keys.begin(), keys.end(), OOrder());
    for (const OKey &k : keys) order.emplace_hint(order.end(), k);
  }

  // Counts every sound entry once; then put and erase keep the counters.
  void build_counts() {
    if (counts_ready) return;
    counts.clear();
    for (const Node &n : entries)
      if (!n.second.corrupt) count(n.second, +1);
    counts_ready = true;
  }

  void erase(std::string_view key) {
    auto it = entries.find(key);
    if (it == entries.end()) return;
    if (!bulk) {
      order.erase(okey(*it, it->second.time_us));
      if (counts_ready && !it->second.corrupt) count(it->second, -1);
    }
    char *old = it->second.text;
    const size_t old_size = it->second.text_size();
    live_bytes -= record_bytes(it->second);
    entries.erase(it);
    free_text(old, old_size);
  }
  // Adds or replaces the entry of `key`.
  void put(std::string_view key, const EntryView &e) {
    const size_t size = key.size() + e.context_id.size() + e.state.size() + e.owner.size() + e.tenant.size() +
                        e.problem.size();
    char *text = size == 0 ? nullptr : static_cast<char *>(pool_.allocate(size, 1));
    Slot s;
    s.time_us = e.time_us;
    s.version = e.version;
    s.file = e.file;
    s.text = text;
    s.corrupt = e.corrupt;
    s.unreadable = e.unreadable;
    size_t off = 0;
    int i = 0;
    for (std::string_view f : {key, e.context_id, e.state, e.owner, e.tenant, e.problem}) {
      if (!f.empty()) std::memcpy(text + off, f.data(), f.size());
      s.len[i++] = static_cast<uint32_t>(f.size());
      off += f.size();
    }
    const std::string_view k(text, key.size());
    auto [it, fresh] = entries.try_emplace(k, s);
    if (!fresh) {
      if (!bulk) {
        order.erase(okey(*it, it->second.time_us));
        if (counts_ready && !it->second.corrupt) count(it->second, -1);
      }
      live_bytes -= record_bytes(it->second);
      // The node's key views the old text: give it the new one.
      auto nh = entries.extract(it);
      free_text(nh.mapped().text, nh.mapped().text_size());
      nh.key() = k;
      nh.mapped() = s;
      it = entries.insert(std::move(nh)).position;
    } else if (!tombs.empty()) {
      untomb(key);
    }
    live_bytes += record_bytes(s);
    if (!bulk) {
      order.insert(okey(*it, s.time_us));
      if (counts_ready && !s.corrupt) count(s, +1);
    }
  }
  // The version the next save of `key` gets: above its entry, its
  // tombstone and everything of earlier epochs.
  uint64_t next_version(std::string_view key) const {
    uint64_t base = epoch << 32;
    if (const Slot *s = find(key); s != nullptr && s->version > base) base = s->version;
    if (!tombs.empty()) {
      auto t = tombs.find(std::string(key));
      if (t != tombs.end() && t->second > base) base = t->second;
    }
    return base + 1;
  }
  // Drops `key`, keeping its last version as a tombstone.
  void remove(std::string_view key) {
    const Slot *s = find(key);
    if (s == nullptr) return;
    tomb(key, s->version);
    erase(key);
  }

  // Applies one record; false when its payload is malformed.
  bool apply(uint8_t type, std::string_view payload) {
    RecReader r(payload);
    last_is_close = false;
    switch (type) {
      case kRecHeader: {
        const std::string magic = r.str();
        const uint64_t format = r.u64();
        header_ok = r.ok() && magic == kIndexMagic && format == kIndexFormat;
        return r.ok();
      }
      case kRecTask: {
        const std::string_view key = r.view();
        EntryView e;
        e.context_id = r.view();
        e.state = r.view();
        e.owner = r.view();
        e.tenant = r.view();
        e.time_us = r.i64();
        e.version = r.u64();
        e.file.ino = r.u64();
        e.file.size = r.u64();
        e.file.mtime_ns = r.i64();
        const uint8_t flags = r.u8();
        e.corrupt = (flags & 1) != 0;
        e.unreadable = (flags & 2) != 0;
        e.problem = r.view();
        if (!r.ok() || key.empty()) return false;
        if (e.corrupt) e.time_us = TNX_TIME_NONE;
        put(key, e);
        return true;
      }
      case kRecDel: {
        const std::string key = r.str();
        const uint64_t v = r.u64();
        if (!r.ok()) return false;
        remove(key);
        tomb(key, v);
        return true;
      }
      case kRecEpoch: {
        const uint64_t v = r.u64();
        if (v > epoch) epoch = v;
        return r.ok();
      }
      case kRecOpen:
        (void)r.u64();
        ++live;
        return r.ok();
      case kRecClose:
        last_stamp.mtime_ns = r.i64();
        last_stamp.ctime_ns = r.i64();
        last_stamp.ino = r.u64();
        last_close_was_last = r.u8() != 0;
        --live;
        last_is_close = true;
        return r.ok();
      case kRecReset:
        live = r.i64();
        return r.ok();
      default:
        return true;  // kRecMoved (handled by the reader) and unknown types
    }
  }

  static void task_record(std::string &out, std::string_view key, const EntryView &e) {
    RecWriter(kRecTask)
        .str(key)
        .str(e.context_id)
        .str(e.state)
        .str(e.owner)
        .str(e.tenant)
        .i64(e.time_us)
        .u64(e.version)
        .u64(e.file.ino)
        .u64(e.file.size)
        .i64(e.file.mtime_ns)
        .u8(static_cast<uint8_t>((e.corrupt ? 1 : 0) | (e.unreadable ? 2 : 0)))
        .str(e.problem)
        .frame_into(out);
  }

 private:
  // What the record of `s` (a task record) or of a tombstone of `key` (a
  // delete record) takes in .tnx-index: framing 8, type 1, then the fields.
  static uint64_t record_bytes(const Slot &s) noexcept { return 8 + 1 + 6 * 4 + 5 * 8 + 1 + s.text_size(); }
  static uint64_t tomb_bytes(std::string_view key) noexcept { return 8 + 1 + 4 + key.size() + 8; }
  // Keeps `v` as the last version of deleted `key` (the larger one wins).
  void tomb(std::string_view key, uint64_t v) {
    auto [t, fresh] = tombs.try_emplace(std::string(key), v);
    if (fresh) live_bytes += tomb_bytes(key);
    else if (v > t->second) t->second = v;
  }
  void untomb(std::string_view key) {
    if (tombs.erase(std::string(key)) != 0) live_bytes -= tomb_bytes(key);
  }
  void count(const Slot &s, int64_t delta) {
    const EntryView v = s.view();
    counts.add(v.context_id, v.state, v.owner, v.tenant, delta);
  }
  void free_text(char *text, size_t size) {
    if (text != nullptr) pool_.deallocate(text, size, 1);
  }
};

// Takes or drops an OFD record lock on one byte of `fd`. Returns false when
// `wait` is false and another holder has it.
bool ofd_lock(int fd, short type, off_t byte, bool wait, const std::string &what) {
  struct flock fl {};
  fl.l_type = type;
  fl.l_whence = SEEK_SET;
  fl.l_start = byte;
  fl.l_len = 1;
  while (::fcntl(fd, wait ? F_OFD_SETLKW : F_OFD_SETLK, &fl) != 0) {
    if (errno == EINTR) continue;
    if (!wait && (errno == EAGAIN || errno == EACCES)) return false;
    throw Error(TNX_EIO, "cannot lock '" + what + "': " + errtext(errno));
  }
  return true;
}

// True when another open file description holds a lock on `byte`.
bool ofd_held(int fd, off_t byte) {
  struct flock fl {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  fl.l_start = byte;
  fl.l_len = 1;
  if (::fcntl(fd, F_OFD_GETLK, &fl) != 0) return false;
  return fl.l_type != F_UNLCK;
}

uint64_t fnv1a(std::string_view s) noexcept {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

void write_all_fd(int fd, std::string_view data, const std::string &what) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error(TNX_EIO, "cannot write '" + what + "': " + errtext(errno));
    }
    if (n == 0) throw Error(TNX_EIO, "cannot write '" + what + "': no progress");
    done += static_cast<size_t>(n);
  }
}

// Process-wide counter for temporary file names.
std::atomic<uint64_t> g_temp_counter{0};

// ---------------------------------------------------------------------------
// The store
// ---------------------------------------------------------------------------

// A TNX_EIO failure of one task file alone (permission, a read error), as
// opposed to the directory or the process: list's deliver_corrupt hands the
// record over with this message instead of failing the whole list.
struct UnreadableFile : Error {
  using Error::Error;
};

class FileStore final : public toolnexus::sdk::Store {
 public:
  FileStore(Fd dir, std::string path, bool read_only)
      : dir_(std::move(dir)),
        path_(std::move(path)),
        sync_(dir_.get()),
        ro_(read_only),
        slots_(new std::mutex[kIdSlots]) {}

  ~FileStore() override {
    if (index_fd_ >= 0) ::close(index_fd_);
    if (lock_fd_ >= 0) ::close(lock_fd_);
  }

  // Opens the index (see the layout comment): takes this process's slot,
  // loads .tnx-index, checks it can be trusted, rebuilds it otherwise,
  // cleans up when no other process has the store open, and records the
  // open. Read-only: creates and changes nothing; an index that cannot be
  // trusted (or none) is rebuilt in memory only.
  // Opens the store's own file `name` (.tnx-lock, .tnx-index) in <dir>,
  // with O_NONBLOCK so that a FIFO put there cannot hang the open (it did,
  // for every read-only command) and O_NOFOLLOW so that a symlink put there
  // cannot make the store append to (or lock) a file elsewhere, as root
  // perhaps (a hard link needs write access to its target already, under
  // Linux's protected_hardlinks). Anything but a regular file is refused as
  // TNX_EIO naming it. Returns -1 with errno when it cannot be opened.
  int open_own(const char *name, int flags, mode_t mode = 0) const {
    const int fd = ::openat(dir_.get(), name, flags | O_NONBLOCK | O_CLOEXEC | O_NOFOLLOW, mode);
    if (fd < 0) {
      if (errno == ELOOP)
        throw Error(TNX_EIO, "'" + path(name) + "' is a symbolic link: refused (the store never follows one for "
                                                "its own files); move it away (the store makes a new one)");
      return -1;
    }
    struct stat st;
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      throw Error(TNX_EIO, "'" + path(name) + "' is not a regular file: move it away (the store makes a new one)");
    }
    return fd;
  }

  // The directory's stamp is taken under the index lock (shared for a
  // read-only open), so that it and the index describe one moment: taken
  // before waiting for the lock, a process that saved and closed meanwhile
  // made the stamp disagree with its close record, and a sound index was
  // rebuilt with a new epoch (found by a fresh-user pass).
  void open_index() {
    if (ro_) {
      lock_fd_ = open_own(kLockName, O_RDONLY);
      indexed_before_ = lock_fd_ >= 0;
      std::optional<IndexLock> il;
      if (lock_fd_ >= 0) il.emplace(*this, F_RDLCK);
      const Stamp now = dir_stamp();
      const int others = lock_fd_ >= 0 ? live_slots() : 0;
      std::unique_lock<std::shared_mutex> l(imu_);
      const bool loaded = lock_fd_ >= 0 && load_file_locked();
      if (!(loaded && trusted(now, others))) {
        if (index_fd_ >= 0) ::close(index_fd_);
        index_fd_ = -1;  // a snapshot of the directory, not followed
        rebuild_locked(loaded, nullptr);
      }
      return;
    }
    struct stat lst;
    indexed_before_ = ::fstatat(dir_.get(), kLockName, &lst, AT_SYMLINK_NOFOLLOW) == 0;
    lock_fd_ = open_own(kLockName, O_RDWR | O_CREAT, 0666);
    if (lock_fd_ < 0)
      throw Error(TNX_EIO, "file: cannot create task files in '" + path_ + "' (its lock file '" + path(kLockName) +
                               "'): " + errtext(errno));
    std::lock_guard<std::mutex> am(append_mu_);
    IndexLock il(*this);
    const Stamp before = dir_stamp();
    const int others = live_slots();
    for (int k = 0; k < kProcessSlots && my_slot_ < 0; ++k)
      if (ofd_lock(lock_fd_, F_WRLCK, kProcessSlotBase + k, false, path(kLockName))) my_slot_ = k;
    if (my_slot_ < 0)
      throw Error(TNX_EIO, "file: '" + path_ + "' is open in " + std::to_string(kProcessSlots) +
                               " processes already; no slot left in '" + path(kLockName) + "'");
    {
      std::unique_lock<std::shared_mutex> l(imu_);
      const bool loaded = load_file_locked();
      if (!(loaded && trusted(before, others))) {
        rebuild_locked(loaded, nullptr);
        compact_locked(others);
      }
    }
    if (others == 0) recover();  // nobody else is writing here: leftovers are a crash's
    std::string rec;
    RecWriter(kRecOpen).u64(static_cast<uint64_t>(::getpid())).frame_into(rec);
    catch_up_locked();
    append_raw_locked(rec);
  }

  // Fails open, naming the directory and the reason, when no task file could
  // be created in it (read-only mount, no permission, /proc): better than a
  // server that starts and then fails every save. Creates and removes one
  // empty temp file (named like a save's, so a crash leaves nothing that
  // recover() would not remove).
  void probe_writable() {
    std::string tmp;
    Fd fd = create_temp(tmp);
    if (fd.get() < 0) {
      const int e = errno;
      throw Error(TNX_EIO, "file: cannot create task files in '" + path_ + "': " + errtext(e));
    }
    ::unlinkat(dir_.get(), tmp.c_str(), 0);
  }

  // Creates a new, empty .tnx-<pid>-<n>.tmp (O_EXCL; the next name on a
  // clash) and sets `tmp` to its name. On failure returns an invalid Fd
  // with errno set.
  Fd create_temp(std::string &tmp) const {
    for (;;) {
      tmp = std::string(kTempPrefix) + std::to_string(::getpid()) + "-" +
            std::to_string(g_temp_counter.fetch_add(1, std::memory_order_relaxed)) + std::string(kTempSuffix);
      Fd fd(::openat(dir_.get(), tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666));
      if (fd.get() >= 0 || errno != EEXIST) return fd;
    }
  }

  // Removes stray temporary files, a stray .tnx-index.new and orphan
  // sidecars. Only called when no other process has the store open (the
  // process slots of .tnx-lock say so): what a live process is writing is
  // never touched.
  void recover() {
    std::vector<std::string> names = scan();
    std::vector<std::string> jsons;
    for (const auto &n : names)
      if (ends_with(n, kJsonExt)) jsons.push_back(n);
    std::sort(jsons.begin(), jsons.end());
    bool removed = false;
    for (const auto &n : names) {
      bool remove = is_temp_name(n) || n == kIndexNewName;
      if (!remove && ends_with(n, kMetaExt) && n[0] != '.') {
        const std::string stem = n.substr(0, n.size() - kMetaExt.size());
        remove = classify(stem).has_value() &&
                 !std::binary_search(jsons.begin(), jsons.end(), stem + std::string(kJsonExt));
      }
      if (!remove) continue;
      if (::unlinkat(dir_.get(), n.c_str(), 0) != 0 && errno != ENOENT)
        throw Error(TNX_EIO, "cannot remove leftover '" + path(n) + "': " + errtext(errno));
      removed = true;
    }
    if (removed) durable(path_);
  }

  bool get(std::string_view idv, const toolnexus::sdk::RecordOut &out) override {
    const std::string id(idv);
    const std::string stem = stem_for(id);
    catch_up();
    for (int attempt = 0; attempt < 8; ++attempt) {
      std::optional<IEntry> e = entry_of(id);
      std::optional<Loaded> l = load(stem);
      if (!l && !e) return false;
      if (l && l->fields.id != id)
        throw Error(TNX_ECORRUPT, "'" + path(stem + std::string(kJsonExt)) + "' holds task id " +
                                      quote(l->fields.id) + ", not " + quote(id));
      // The bytes read belong to the version the index names: never old
      // bytes with a newer version.
      if (l && e && !e->corrupt && e->file == l->file) {
        out(record(*l, e->version, false));
        return true;
      }
      if (ro_) {  // changed behind the index: a version this store has not seen
        if (!l) return false;
        out(record(*l, e ? e->version + 1 : 1, false));
        return true;
      }
      SlotGuard g(*this, id);
      catch_up();
      (void)current(id, stem);
    }
    throw Error(TNX_EIO, "'" + path(stem + std::string(kJsonExt)) + "' kept changing while being read");
  }

  uint64_t save(const tnx_task_record &rec, uint64_t expected) override {
    const std::string id(view(rec.id));
    const std::string_view json = view(rec.task_json);
    validate(rec, id, json);
    const std::string stem = stem_for(id);
    const std::string jname = stem + std::string(kJsonExt), mname = stem + std::string(kMetaExt);
    const std::string owner(view(rec.owner)), tenant(view(rec.tenant));

    SlotGuard g(*this, id);
    catch_up();
    const Current cur = current(id, stem);
    const uint64_t cur_version = cur.present ? cur.version : 0;
    if (expected != TNX_VERSION_ANY && expected != cur_version)
      throw Error(TNX_ECONFLICT, "save of task " + quote(id) + ": expected version " +
                                     std::to_string(expected) + ", stored " + std::to_string(cur_version));

    // What the sidecar says now. A sidecar we cannot read is replaced.
    std::optional<std::string> meta_bytes;
    try {
      meta_bytes = read_file(mname);
    } catch (const Error &e) {
      if (e.code != TNX_ECORRUPT) throw;
      meta_bytes = std::string();  // present but unusable
    }
    Meta meta;
    const bool meta_ok = meta_bytes && parse_meta(*meta_bytes, meta).empty();
    const bool want_meta = !owner.empty() || !tenant.empty();
    const bool fast = (!meta_bytes && !want_meta) ||
                      (cur.present && meta_ok && !meta.has_prev && meta.owner == owner && meta.tenant == tenant);
    bool committed = false;
    FileId file = cur.file;
    IEntry e;
    e.context_id.assign(view(rec.context_id));
    e.state.assign(view(rec.state));
    e.owner = owner;
    e.tenant = tenant;
    e.time_us = rec.status_time_us;
    uint64_t version = 0;
    try {
      if (fast) {
        file = replace(jname, json, id);
        committed = true;
      } else {
        save_with_meta(id, jname, mname, json, cur.present, meta_bytes.has_value(), meta_ok, meta, owner, tenant,
                       committed, file);
      }
      e.file = file;
      version = index_put(id, std::move(e));
      durable(path(jname));
    } catch (...) {
      if (committed && version == 0) {
        // The file is in place but the index was not told: the next reader
        // sees a file that changed behind the index and re-reads it.
      }
      throw;
    }
    return version;
  }

  void del(std::string_view idv, uint64_t expected) override {
    const std::string id(idv);
    const std::string stem = stem_for(id);
    const std::string jname = stem + std::string(kJsonExt), mname = stem + std::string(kMetaExt);
    SlotGuard g(*this, id);
    catch_up();
    const Current cur = current(id, stem);
    if (!cur.present) throw Error(TNX_ENOTFOUND, "no task with id " + quote(id));
    if (expected != TNX_VERSION_ANY && expected != cur.version)
      throw Error(TNX_ECONFLICT, "delete of task " + quote(id) + ": expected version " +
                                     std::to_string(expected) + ", stored " + std::to_string(cur.version));
    if (::unlinkat(dir_.get(), jname.c_str(), 0) != 0) {
      const int e = errno;
      if (e == ENOENT) throw Error(TNX_ENOTFOUND, "no task with id " + quote(id));
      throw Error(TNX_EIO, "cannot delete '" + path(jname) + "': " + errtext(e));
    }
    // The Task is gone; a sidecar left behind (unlink failure, crash) is an
    // orphan that saves overwrite and the next lone open removes.
    ::unlinkat(dir_.get(), mname.c_str(), 0);
    index_del(id);
    durable(path(jname));
  }

  std::string list(const tnx_list_query &q, const toolnexus::sdk::RecordOut &out) override {
    const size_t limit = toolnexus::sdk::page_size(q);
    std::optional<Cursor> cursor;
    if (q.cursor.len != 0) cursor = decode_cursor(view(q.cursor));
    const bool omit = q.omit_json != 0;
    const bool deliver_corrupt = TNX_HAS_FIELD(&q, tnx_list_query, deliver_corrupt) && q.deliver_corrupt != 0;
    catch_up();
    for (int attempt = 0;; ++attempt) {
      // The page from the index: up to `limit` matches, and whether one more
      // exists (a next page). With omit_json every entry is delivered from
      // the index alone, in list order, at once, under the index lock: no
      // copy of its fields is made (the sink copies what it keeps;
      // task_store.h says a sink must not call back into the store). Such
      // a page never goes round again (no file is read, so nothing is
      // stale), so nothing is delivered twice.
      std::vector<Cand> cands;
      bool more = false;
      size_t delivered = 0;
      int64_t last_time = 0;
      std::string last_id;
      {
        std::shared_lock<std::shared_mutex> l(imu_);
        size_t found = 0;
        const Index::OKey *last = nullptr;
        for (auto it = start_of(cursor); it != index_->order.end(); ++it) {
          const EntryView e = it->node->second.view();
          if (!e.corrupt && !toolnexus::sdk::matches(q, e.context_id, e.state, e.owner, e.tenant, e.time_us))
            continue;
          if (found == limit) {
            more = true;
            break;
          }
          ++found;
          if (omit) {
            tnx_task_record r = empty_record();
            r.id = toolnexus::sdk::str(it->id);
            if (e.corrupt) {
              // Corrupt entries share the "no time" end of the order with
              // sound Tasks that have no timestamp: delivered in their place.
              if (!deliver_corrupt) throw Error(e.unreadable ? TNX_EIO : TNX_ECORRUPT, std::string(e.problem));
              r.status_time_us = TNX_TIME_NONE;
              r.problem = toolnexus::sdk::str(e.problem);
            } else {
              r.context_id = toolnexus::sdk::str(e.context_id);
              r.state = toolnexus::sdk::str(e.state);
              r.status_time_us = e.time_us;
              r.owner = toolnexus::sdk::str(e.owner);
              r.tenant = toolnexus::sdk::str(e.tenant);
              r.version = e.version;
            }
            if (!out(r)) return std::string();
            ++delivered;
            last = &*it;
          } else {
            cands.push_back(Cand{std::string(it->node->first), std::string(it->id), IEntry::of(e)});
          }
        }
        if (last != nullptr) {
          last_time = last->time;
          last_id.assign(last->id);
        }
      }
      // Read what is delivered (only without omit_json, so nothing was
      // delivered above); a file that changed behind the index is
      // re-indexed and the page made again.
      std::vector<Item> items;
      std::vector<std::string> stale;
      for (Cand &c : cands) {
        if (c.e.corrupt) {
          if (!deliver_corrupt) throw Error(c.e.unreadable ? TNX_EIO : TNX_ECORRUPT, c.e.problem);
          std::optional<std::string> raw;
          try {
            raw = read_file(Index::named(c.key) ? c.shown : stem_for(c.key) + std::string(kJsonExt));
          } catch (const Error &) {
            raw = std::string();
          }
          items.push_back(Item{TNX_TIME_NONE, c.shown, 0, "", "", "", "", omit || !raw ? std::string() : std::move(*raw),
                               c.e.problem});
          continue;
        }
        std::optional<Loaded> l;
        std::optional<Error> bad;
        try {
          l = load(stem_for(c.key));
        } catch (const Error &err) {
          const bool this_file = err.code == TNX_ECORRUPT || dynamic_cast<const UnreadableFile *>(&err) != nullptr;
          if (!this_file) throw;
          bad = err;
        }
        if (bad && attempt == 0) {  // re-indexed: an edit in place turns the entry corrupt
          stale.push_back(c.key);
          continue;
        }
        if (bad) {  // e.g. a damaged sidecar beside an unchanged Task file
          if (!deliver_corrupt) throw *bad;
          std::optional<std::string> raw;
          try {
            raw = read_file(stem_for(c.key) + std::string(kJsonExt));
          } catch (const Error &) {
            raw = std::string();
          }
          items.push_back(Item{TNX_TIME_NONE, c.shown, 0, "", "", "", "", omit || !raw ? std::string() : std::move(*raw),
                               bad->message});
          continue;
        }
        if (!l || l->file != c.e.file || l->fields.id != c.key || l->owner != c.e.owner || l->tenant != c.e.tenant) {
          stale.push_back(c.key);
          continue;
        }
        items.push_back(Item{c.e.time_us, c.shown, c.e.version, c.e.context_id, c.e.state, c.e.owner, c.e.tenant,
                             std::move(l->json), std::string()});
      }
      if (!stale.empty() && attempt < 3) {
        for (const std::string &key : stale) reindex(key);
        continue;
      }
      if (!stale.empty()) {
        // Saves keep racing this page: take each such Task as it is now,
        // read while no save of it is under way (its SlotGuard), in its
        // place now. (A Task saved during a listing may be seen at its new
        // place or its old one, as with any keyset listing.)
        for (const std::string &key : stale) {
          if (Index::named(key)) continue;
          std::optional<Loaded> l;
          std::optional<IEntry> e;
          {
            std::unique_ptr<SlotGuard> g;
            if (!ro_) g = std::make_unique<SlotGuard>(*this, key);
            catch_up();
            if (!ro_) (void)current(key, stem_for(key));
            e = entry_of(key);
            try {
              l = load(stem_for(key));
            } catch (const Error &) {
              l.reset();
            }
          }
          if (!l || !e || e->corrupt || l->fields.id != key) continue;
          if (!toolnexus::sdk::matches(q, e->context_id, e->state, l->owner, l->tenant, e->time_us)) continue;
          if (cursor && !cursor->long_form && !cursor->key.before(e->time_us, key)) continue;
          items.push_back(Item{e->time_us, key, e->version, e->context_id, e->state, l->owner, l->tenant,
                               omit ? std::string() : std::move(l->json), std::string()});
        }
        std::sort(items.begin(), items.end(), [](const Item &a, const Item &b) {
          if (a.time_us != b.time_us) return a.time_us > b.time_us;
          return a.id < b.id;
        });
        if (items.size() > limit) items.resize(limit);
      }
      for (const Item &item : items) {
        tnx_task_record r = empty_record();
        r.id = toolnexus::sdk::str(item.id);
        r.context_id = toolnexus::sdk::str(item.context_id);
        r.state = toolnexus::sdk::str(item.state);
        r.status_time_us = item.time_us;
        r.owner = toolnexus::sdk::str(item.owner);
        r.tenant = toolnexus::sdk::str(item.tenant);
        r.task_json = toolnexus::sdk::str(item.json);
        r.version = item.version;
        r.problem = toolnexus::sdk::str(item.problem);
        if (!out(r)) return std::string();
      }
      if (!more) return std::string();
      if (delivered != 0) return encode_cursor(last_time, last_id);
      // Every candidate of the page was dropped (it kept changing, or went
      // away): the next page starts after them, not nowhere.
      if (items.empty())
        return cands.empty() ? std::string() : encode_cursor(cands.back().e.time_us, cands.back().shown);
      return encode_cursor(items.back().time_us, items.back().id);
    }
  }

  // ABI 1.3: from the index's counters; a time window walks that window.
  uint64_t count(const tnx_list_query &q) override {
    catch_up();
    if (toolnexus::plugins::TaskCounts::answers(q)) {
      for (;;) {
        {
          std::shared_lock<std::shared_mutex> l(imu_);
          if (index_->counts_ready) return index_->counts.count(q);
        }
        // First count since the index was (re)loaded: build the counters.
        std::unique_lock<std::shared_mutex> l(imu_);
        index_->build_counts();
      }
    }
    std::shared_lock<std::shared_mutex> l(imu_);
    auto it = index_->order.begin();
    if (q.filter_flags & TNX_FILTER_BEFORE) {
      if (q.before_us == INT64_MIN) return 0;
      it = index_->order.lower_bound(Index::OKey{q.before_us - 1, std::string_view(), false, nullptr});
    }
    uint64_t n = 0;
    for (; it != index_->order.end(); ++it) {
      if ((q.filter_flags & TNX_FILTER_AFTER) && !(it->time > q.after_us)) break;
      const EntryView e = it->node->second.view();
      if (e.corrupt) continue;
      if (toolnexus::sdk::matches(q, e.context_id, e.state, e.owner, e.tenant, e.time_us)) ++n;
    }
    return n;
  }

  // Records the close (with the directory's stamp when this is the last
  // process), so that the next lone open can trust the index.
  void close() override {
    if (ro_ || lock_fd_ < 0 || my_slot_ < 0) return;
    std::lock_guard<std::mutex> am(append_mu_);
    IndexLock il(*this);
    catch_up_locked();
    bool others = false;
    for (int k = 0; k < kProcessSlots && !others; ++k) others = k != my_slot_ && ofd_held(lock_fd_, kProcessSlotBase + k);
    {
      std::unique_lock<std::shared_mutex> l(imu_);
      if (!others && big_locked()) compact_locked(index_->live);
    }
    const Stamp s = dir_stamp();
    std::string rec;
    RecWriter(kRecClose).i64(s.mtime_ns).i64(s.ctime_ns).u64(s.ino).u8(others ? 0 : 1).frame_into(rec);
    append_raw_locked(rec);
    ofd_lock(lock_fd_, F_UNLCK, kProcessSlotBase + my_slot_, true, path(kLockName));
    my_slot_ = -1;
  }

 private:
  struct Loaded {
    std::string json;
    TaskFields fields;
    std::string owner, tenant;
    FileId file;  // of the task file the bytes came from
  };

  // The stored state of an id, after reconciling the index with the disk.
  struct Current {
    bool present = false;
    uint64_t version = 0;
    FileId file;
  };

  struct Cand {
    std::string key, shown;
    IEntry e;
  };

  struct Item {
    int64_t time_us;
    std::string id;
    uint64_t version;
    std::string context_id, state, owner, tenant, json;
    std::string problem;  // deliver_corrupt: why the record is unreadable
  };

  // A decoded cursor. Ids whose plain ListKey cursor would exceed 1024 bytes
  // use "<ListKey of (time, first 460 id bytes)>.<sha256 of the id>".
  struct Cursor {
    ListKey key;
    bool long_form = false;
    std::string sha;
  };

  // The index lock (.tnx-lock byte 0) of this store, for appending to,
  // compacting or rebuilding the index. The caller holds append_mu_ (OFD
  // locks of one open file do not exclude its own threads).
  class IndexLock {
   public:
    // F_WRLCK to append or rewrite; F_RDLCK (a read-only open) to read the
    // index and the directory's stamp while no one appends.
    explicit IndexLock(FileStore &s, short type = F_WRLCK) : s_(s) {
      ofd_lock(s_.lock_fd_, type, kIndexLockByte, true, s_.path(kLockName));
    }
    ~IndexLock() {
      try {
        ofd_lock(s_.lock_fd_, F_UNLCK, kIndexLockByte, true, s_.path(kLockName));
      } catch (...) {
      }
    }
    IndexLock(const IndexLock &) = delete;
    IndexLock &operator=(const IndexLock &) = delete;

   private:
    FileStore &s_;
  };

  // Serialises saves and deletes of one id between threads (a mutex per
  // slot of the id's hash) and between processes (an OFD lock on byte
  // 1024 + slot of .tnx-lock): compare-and-set then holds across processes.
  class SlotGuard {
   public:
    SlotGuard(FileStore &s, std::string_view id) : s_(s), slot_(fnv1a(id) % kIdSlots), lock_(s.slots_[slot_]) {
      ofd_lock(s_.lock_fd_, F_WRLCK, kIdLockBase + static_cast<off_t>(slot_), true, s_.path(kLockName));
    }
    ~SlotGuard() {
      try {
        ofd_lock(s_.lock_fd_, F_UNLCK, kIdLockBase + static_cast<off_t>(slot_), true, s_.path(kLockName));
      } catch (...) {
      }
    }
    SlotGuard(const SlotGuard &) = delete;
    SlotGuard &operator=(const SlotGuard &) = delete;

   private:
    FileStore &s_;
    size_t slot_;
    std::lock_guard<std::mutex> lock_;
  };

  std::string path(std::string_view name) const {
    return (path_ == "/" ? path_ : path_ + "/") + std::string(name);
  }

  Stamp dir_stamp() const {
    struct stat st;
    if (::fstat(dir_.get(), &st) != 0) throw Error(TNX_EIO, "cannot stat '" + path_ + "': " + errtext(errno));
    return Stamp{static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec,
                 static_cast<int64_t>(st.st_ctim.tv_sec) * 1000000000 + st.st_ctim.tv_nsec,
                 static_cast<uint64_t>(st.st_ino)};
  }

  // Process slots of .tnx-lock held by other open stores.
  int live_slots() const {
    int n = 0;
    for (int k = 0; k < kProcessSlots; ++k)
      if (k != my_slot_ && ofd_held(lock_fd_, kProcessSlotBase + k)) ++n;
    return n;
  }

  // The index can be used as it is: with other processes open, when the
  // opens it records match them; alone, when the last process closed it
  // cleanly and the directory has not changed since.
  bool trusted(const Stamp &now, int others) const {
    if (!index_->header_ok) return false;
    if (others > 0) return index_->live == others;
    return index_->live == 0 && index_->last_is_close && index_->last_close_was_last && index_->last_stamp == now;
  }

  // Opens and reads .tnx-index (imu_ held exclusively); false when there is
  // none or it is not an index.
  bool load_file_locked() {
    if (index_fd_ >= 0) ::close(index_fd_);
    index_fd_ = open_own(kIndexName, ro_ ? O_RDONLY : O_RDWR | O_APPEND);
    index_ = std::make_unique<Index>();
    offset_ = 0;
    if (index_fd_ < 0) {
      if (errno == ENOENT) return false;
      throw Error(TNX_EIO, "cannot open '" + path(kIndexName) + "': " + errtext(errno));
    }
    struct stat st;
    if (::fstat(index_fd_, &st) != 0) throw Error(TNX_EIO, "cannot stat '" + path(kIndexName) + "': " + errtext(errno));
    // A sparse bucket array: most inserts of a new key find an empty bucket
    // and touch no other entry (each such touch is a cache miss).
    index_->entries.max_load_factor(0.5f);
    index_->entries.reserve(static_cast<size_t>(st.st_size) / 96);
    read_new_locked(static_cast<uint64_t>(st.st_size));
    return index_->header_ok;
  }

  // Applies the records of .tnx-index from offset_ up to `size` (imu_ held
  // exclusively). Stops before a torn or damaged record (a write under way
  // in another process, or a crash's: the next appender truncates it).
  void read_new_locked(uint64_t size) {
    for (int moves = 0; moves < 8; ++moves) {
      if (size <= offset_) return;
      index_->bulk = offset_ == 0;  // the whole file: see Index::bulk
      // Read in pieces of 256 KiB (grown only for a larger record): a whole
      // 6 MB index in one buffer cost more in page faults than parsing it.
      constexpr size_t kPiece = 256 * 1024;
      std::string data;
      size_t off = 0;         // parsed bytes of `data`
      uint64_t read_to = offset_;  // file offset just past `data`
      bool moved = false, stop = false, eof = false;
      while (!stop) {
        // Keep the unparsed tail, then fetch enough for the next record.
        data.erase(0, off);
        off = 0;
        const size_t want = std::max(kPiece, record_extent(data, 0));
        if (!eof && data.size() < want && read_to < size) {
          const size_t keep = data.size();
          const size_t ask = static_cast<size_t>(std::min<uint64_t>(want - keep, size - read_to));
          data.resize(keep + ask);
          size_t got = 0;
          while (got < ask) {
            const ssize_t n = ::pread(index_fd_, &data[keep + got], ask - got, static_cast<off_t>(read_to + got));
            if (n < 0) {
              if (errno == EINTR) continue;
              throw Error(TNX_EIO, "cannot read '" + path(kIndexName) + "': " + errtext(errno));
            }
            if (n == 0) {
              eof = true;
              break;
            }
            got += static_cast<size_t>(n);
          }
          data.resize(keep + got);
          read_to += got;
        }
        const bool last_piece = eof || read_to >= size;
        for (;;) {
          uint8_t type = 0;
          std::string_view payload;
          const size_t n = next_record(data, off, type, payload);
          if (n == 0) {
            // Incomplete here: fetch more, unless this is all there is (a
            // torn or damaged tail, or a record still being appended).
            if (last_piece || record_extent(data, off) > (size_t{1} << 28) + 8 ||
                (record_extent(data, off) != 0 && data.size() - off >= record_extent(data, off)))
              stop = true;
            break;
          }
          if (type == kRecMoved) {
            moved = true;
            stop = true;
            break;
          }
          if (!index_->apply(type, payload)) {
            stop = true;
            break;
          }
          off += n;
          offset_ += n;
        }
        if (!stop && last_piece) stop = true;
      }
      if (index_->bulk) index_->end_bulk();
      if (!moved) return;
      // A compacted index replaced this file: read it from the start.
      ::close(index_fd_);
      index_fd_ = open_own(kIndexName, ro_ ? O_RDONLY : O_RDWR | O_APPEND);
      if (index_fd_ < 0) throw Error(TNX_EIO, "cannot open '" + path(kIndexName) + "': " + errtext(errno));
      index_ = std::make_unique<Index>();
      offset_ = 0;
      struct stat st;
      if (::fstat(index_fd_, &st) != 0) throw Error(TNX_EIO, "cannot stat '" + path(kIndexName) + "': " + errtext(errno));
      size = static_cast<uint64_t>(st.st_size);
    }
  }

  // Brings the in-memory index up to what other processes appended.
  void catch_up() {
    if (index_fd_ < 0) return;
    struct stat st;
    if (::fstat(index_fd_, &st) != 0) throw Error(TNX_EIO, "cannot stat '" + path(kIndexName) + "': " + errtext(errno));
    {
      std::shared_lock<std::shared_mutex> l(imu_);
      if (static_cast<uint64_t>(st.st_size) == offset_) return;
    }
    std::unique_lock<std::shared_mutex> l(imu_);
    read_new_locked(static_cast<uint64_t>(st.st_size));
  }

  // catch_up() with the index lock held: a tail that does not parse is a
  // crashed writer's and is cut off, so that appends stay readable.
  void catch_up_locked() {
    catch_up();
    struct stat st;
    if (::fstat(index_fd_, &st) != 0) throw Error(TNX_EIO, "cannot stat '" + path(kIndexName) + "': " + errtext(errno));
    std::unique_lock<std::shared_mutex> l(imu_);
    if (static_cast<uint64_t>(st.st_size) > offset_ && ::ftruncate(index_fd_, static_cast<off_t>(offset_)) != 0)
      throw Error(TNX_EIO, "cannot repair '" + path(kIndexName) + "': " + errtext(errno));
  }

  // Appends framed records and applies them to the in-memory index. The
  // caller holds append_mu_ and the index lock and has caught up
  // (catch_up_locked), so the file ends at offset_ and nobody else appends:
  // what is written is applied as written, not read back (that took 4
  // fstat and a pread per save). imu_ is held from before the write until
  // offset_ is past it: a catch_up() of another thread of this process
  // would otherwise read the new records in between, and they would be
  // applied twice (offset_ then ran past the file's end, and this process
  // missed or cut off other processes' records).
  void append_raw_locked(const std::string &records) {
    std::unique_lock<std::shared_mutex> l(imu_);
    write_all_fd(index_fd_, records, path(kIndexName));
    for (size_t off = 0; off < records.size();) {
      uint8_t type = 0;
      std::string_view payload;
      const size_t n = next_record(records, off, type, payload);
      if (n == 0 || !index_->apply(type, payload))
        throw Error(TNX_EINTERNAL, "an index record written to '" + path(kIndexName) + "' does not apply");
      off += n;
      offset_ += n;
    }
    if (big_locked()) compact_locked(index_->live);
  }

  // Records `e` (its version assigned here) for `key` in the index; returns
  // the version. The caller holds the id's SlotGuard.
  uint64_t index_put(const std::string &key, IEntry e) {
    std::lock_guard<std::mutex> am(append_mu_);
    IndexLock il(*this);
    catch_up_locked();
    std::string rec;
    {
      std::unique_lock<std::shared_mutex> l(imu_);
      e.version = index_->next_version(key);
      Index::task_record(rec, key, e.view());
    }
    append_raw_locked(rec);
    return e.version;
  }

  void index_del(const std::string &key) {
    std::lock_guard<std::mutex> am(append_mu_);
    IndexLock il(*this);
    catch_up_locked();
    uint64_t last = 0;
    if (std::optional<IEntry> e = entry_of(key)) last = e->version;
    std::string rec;
    RecWriter(kRecDel).str(key).u64(last).frame_into(rec);
    append_raw_locked(rec);
  }

  // The index file (offset_ bytes: called caught up, the index lock held)
  // is past 8 MiB and 4 times what its live entries take.
  bool big_locked() const {
    if (index_fd_ < 0) return false;
    const uint64_t live_bytes = index_->live_bytes + 4096;  // + header, epoch and reset records
    return offset_ > (8u << 20) && offset_ > 4 * live_bytes;
  }

  // Writes the whole index to .tnx-index.new and renames it over
  // .tnx-index (imu_ exclusive, the index lock held); followers of the old
  // file see its last record "moved" and read the new one. `live`: the
  // processes open now.
  void compact_locked(int64_t live) {
    std::string data;
    RecWriter(kRecHeader).str(kIndexMagic).u64(kIndexFormat).frame_into(data);
    RecWriter(kRecEpoch).u64(index_->epoch).frame_into(data);
    RecWriter(kRecReset).i64(live).frame_into(data);
    // In list order: the next load allocates the entries in that order, so
    // a listing walks memory forwards (in hash order, `store list` of
    // 50,000 Tasks spent a quarter of its time on cache misses).
    for (const Index::OKey &k : index_->order) Index::task_record(data, k.node->first, k.node->second.view());
    for (const auto &[key, v] : index_->tombs) RecWriter(kRecDel).str(key).u64(v).frame_into(data);
    // A fresh file, never one found there: whatever has the name (a
    // crash's leftover, or a symlink someone put there to have the store
    // overwrite a file elsewhere) is removed, and O_EXCL | O_NOFOLLOW
    // refuse anything that appears meanwhile.
    if (::unlinkat(dir_.get(), kIndexNewName, 0) != 0 && errno != ENOENT)
      throw Error(TNX_EIO, "cannot remove '" + path(kIndexNewName) + "': " + errtext(errno));
    Fd fd(::openat(dir_.get(), kIndexNewName, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666));
    if (fd.get() < 0) throw Error(TNX_EIO, "cannot create '" + path(kIndexNewName) + "': " + errtext(errno));
    write_all_fd(fd.get(), data, path(kIndexNewName));
    while (::fdatasync(fd.get()) != 0)
      if (errno != EINTR) throw Error(TNX_EIO, "cannot sync '" + path(kIndexNewName) + "': " + errtext(errno));
    fd.reset();
    if (::renameat(dir_.get(), kIndexNewName, dir_.get(), kIndexName) != 0)
      throw Error(TNX_EIO, "cannot rename '" + path(kIndexNewName) + "': " + errtext(errno));
    durable(path(kIndexName));
    if (index_fd_ >= 0) {
      std::string moved;
      RecWriter(kRecMoved).frame_into(moved);
      (void)::write(index_fd_, moved.data(), moved.size());  // best effort: followers also check the name
      ::close(index_fd_);
    }
    index_fd_ = open_own(kIndexName, O_RDWR | O_APPEND);
    if (index_fd_ < 0) throw Error(TNX_EIO, "cannot open '" + path(kIndexName) + "': " + errtext(errno));
    offset_ = data.size();
    index_->live = live;
    index_->header_ok = true;
  }

  // Makes the index match the directory (imu_ exclusive): every canonical
  // task file whose identity differs from its entry (or that has none) is
  // read again with a new version; entries without a file are dropped.
  // `loaded`: the current index is a base worth keeping.
  void rebuild_locked(bool loaded, std::string *) {
    // An index that is there but cannot be trusted may have lost records
    // of versions handed out (a crash): a new epoch puts every version
    // given from now on above all of them. A directory never indexed (the
    // seed's) starts at epoch 0, version 1.
    //
    // A missing or unreadable index (no header) in a directory a toolnexus
    // store opened before (.tnx-lock was there) lost its versions with it:
    // starting again at epoch 0 gave version 1 back to Tasks saved many
    // times, and a client's stale --expect-version 1 then overwrote a newer
    // save (found by a fresh-user pass). Epochs are therefore never below
    // the seconds since 2000-01-01 at the rebuild: above every epoch an
    // earlier rebuild can have used, while the clock does not go back.
    const uint64_t clock = clock_epoch();
    if (!loaded) {
      index_ = std::make_unique<Index>();
      if (indexed_before_) index_->epoch = clock;
    } else {
      index_->epoch = std::max(index_->epoch + 1, clock);
    }
    index_->header_ok = true;
    std::unordered_map<std::string, bool> seen;
    std::vector<std::string> names = scan();
    std::sort(names.begin(), names.end());
    for (const auto &name : names) {
      if (name[0] == '.' || !ends_with(name, kJsonExt)) continue;
      const std::string stem = name.substr(0, name.size() - kJsonExt.size());
      std::optional<StemInfo> info = classify(stem);
      if (!info) continue;
      struct stat st;
      if (::fstatat(dir_.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
      if (info->kind != StemKind::hashed) {
        const Index::Slot *have = index_->find(info->id);
        if (have != nullptr && have->file == FileId::of(st) && S_ISREG(st.st_mode)) {
          seen[info->id] = true;
          continue;
        }
      }
      std::string key;
      IEntry e = read_entry(name, info, key);
      e.version = index_->next_version(key);
      seen[key] = true;
      index_->put(key, e.view());
    }
    std::vector<std::string> gone;
    for (const auto &kv : index_->entries)
      if (seen.find(std::string(kv.first)) == seen.end()) gone.emplace_back(kv.first);
    for (const auto &k : gone) index_->remove(k);
  }

  // The entry of task file `name` read from disk; `key` receives its key.
  IEntry read_entry(const std::string &name, const std::optional<StemInfo> &info, std::string &key) {
    const std::string stem = name.substr(0, name.size() - kJsonExt.size());
    IEntry e;
    try {
      std::optional<Loaded> l = load(stem);
      if (!l) throw Error(TNX_EIO, "'" + path(name) + "' disappeared");
      if (info->kind != StemKind::hashed && l->fields.id != info->id)
        throw Error(TNX_ECORRUPT, "'" + path(name) + "' holds task id " + quote(l->fields.id) + ", not " +
                                      quote(info->id) + " as its name says");
      if (info->kind == StemKind::hashed && stem_for(l->fields.id) != stem)
        throw Error(TNX_ECORRUPT, "'" + path(name) + "' holds task id " + quote(l->fields.id) +
                                      ", which is not stored under this name");
      key = l->fields.id;
      e.context_id = l->fields.context_id;
      e.state = l->fields.state;
      e.owner = l->owner;
      e.tenant = l->tenant;
      e.time_us = l->fields.time_us;
      e.file = l->file;
    } catch (const Error &err) {
      const bool this_file = err.code == TNX_ECORRUPT || dynamic_cast<const UnreadableFile *>(&err) != nullptr;
      if (!this_file) throw;
      key = info->kind != StemKind::hashed ? info->id : std::string(1, '\0') + name;
      e = IEntry();
      e.corrupt = true;
      e.unreadable = err.code != TNX_ECORRUPT;
      e.problem = err.message;
      struct stat st;
      if (::fstatat(dir_.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) e.file = FileId::of(st);
    }
    return e;
  }

  // The stored state of `id`, after making the index agree with its file
  // (the caller holds the id's SlotGuard): a file that changed behind the
  // index (another program, a crashed writer) is read again and gets a new
  // version; a file gone is dropped.
  Current current(const std::string &id, const std::string &stem) {
    const std::string jname = stem + std::string(kJsonExt);
    struct stat st;
    bool on_disk = true;
    if (::fstatat(dir_.get(), jname.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno != ENOENT) throw Error(TNX_EIO, "cannot stat '" + path(jname) + "': " + errtext(errno));
      on_disk = false;
    }
    std::optional<IEntry> e = entry_of(id);
    if (!on_disk && !e) return Current{};
    if (on_disk && e && e->file == FileId::of(st)) return Current{true, e->version, e->file};
    if (!on_disk) {
      index_del(id);
      return Current{};
    }
    std::optional<StemInfo> info = classify(stem);
    if (!info) info = StemInfo{StemKind::plain, id};
    std::string key;
    IEntry fresh = read_entry(jname, info, key);
    if (key != id) key = id;  // the file of this id's name, whatever it holds
    const FileId file = fresh.file;
    const uint64_t v = index_put(key, std::move(fresh));
    return Current{true, v, file};
  }

  // Re-reads the file of `key` into the index (list found it changed).
  void reindex(const std::string &key) {
    if (Index::named(key)) return;
    const std::string stem = stem_for(key);
    if (ro_) {
      std::optional<StemInfo> info = classify(stem);
      if (!info) info = StemInfo{StemKind::plain, key};
      struct stat st;
      std::unique_lock<std::shared_mutex> l(imu_);
      if (::fstatat(dir_.get(), (stem + std::string(kJsonExt)).c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
        index_->remove(key);
        return;
      }
      std::string k;
      IEntry e = read_entry(stem + std::string(kJsonExt), info, k);
      e.version = index_->next_version(key);
      index_->put(key, e.view());
      return;
    }
    SlotGuard g(*this, key);
    catch_up();
    (void)current(key, stem);
  }

  std::optional<IEntry> entry_of(const std::string &key) const {
    std::shared_lock<std::shared_mutex> l(imu_);
    const Index::Slot *s = index_->find(key);
    if (s == nullptr) return std::nullopt;
    return IEntry::of(s->view());
  }

  // Where a page after `cursor` starts in the index order (imu_ held).
  std::set<Index::OKey, Index::OOrder>::const_iterator start_of(const std::optional<Cursor> &cursor) const {
    if (!cursor) return index_->order.begin();
    if (!cursor->long_form)
      return index_->order.upper_bound(Index::OKey{cursor->key.time_us, cursor->key.id, true, nullptr});
    // Long form: the id with that prefix and hash, if it still exists;
    // otherwise every id with the prefix again (a repeat beats a loss).
    const auto first = index_->order.lower_bound(Index::OKey{cursor->key.time_us, cursor->key.id, false, nullptr});
    for (auto it = first; it != index_->order.end() && it->time == cursor->key.time_us &&
                          starts_with(it->id, cursor->key.id);
         ++it)
      if (sha256_hex(it->id) == cursor->sha) return std::next(it);
    return first;
  }

  static std::string encode_cursor(int64_t time_us, const std::string &id) {
    std::string c = ListKey{time_us, id}.encode();
    if (c.size() <= kMaxCursor) return c;
    return ListKey{time_us, id.substr(0, kCursorIdPrefix)}.encode() + "." + sha256_hex(id);
  }

  static Cursor decode_cursor(std::string_view c) {
    Cursor out;
    const size_t first = c.find('.');
    const size_t last = c.rfind('.');
    if (first != std::string_view::npos && first != last) {
      const std::string_view sha = c.substr(last + 1);
      bool ok = sha.size() == 64;
      for (char h : sha) ok = ok && hex_value(h, false) >= 0;
      if (!ok) throw Error(TNX_EINVAL, "list: malformed cursor '" + std::string(c.substr(0, 64)) + "'");
      out.key = ListKey::decode(c.substr(0, last));
      out.long_form = true;
      out.sha = std::string(sha);
      return out;
    }
    out.key = ListKey::decode(c);
    return out;
  }
  // Save input check: the JSON must be a Task whose index fields are the
  // record's (what we write must read back as what was saved).
  void validate(const tnx_task_record &rec, const std::string &id, std::string_view json) const {
    TaskFields f;
    const std::string why = parse_task(json, f);
    if (!why.empty()) throw Error(TNX_EINVAL, "save of task " + quote(id) + ": task_json " + why);
    auto mismatch = [&](const char *field, const std::string &in_json, const std::string &in_rec) {
      return Error(TNX_EINVAL, "save of task " + quote(id) + ": the record's " + field + " " +
                                   quote(in_rec) + " differs from the task_json's " + quote(in_json));
    };
    if (f.id != id) throw mismatch("id", f.id, id);
    if (f.context_id != view(rec.context_id))
      throw mismatch("context_id", f.context_id, std::string(view(rec.context_id)));
    if (f.state != view(rec.state)) throw mismatch("state", f.state, std::string(view(rec.state)));
    if (f.time_us != rec.status_time_us)
      throw Error(TNX_EINVAL, "save of task " + quote(id) + ": the record's status_time_us " +
                                  std::to_string(rec.status_time_us) +
                                  " differs from the task_json's status.timestamp (" +
                                  std::to_string(f.time_us) + ")");
  }

  bool exists(const std::string &name) const {
    struct stat st;
    if (::fstatat(dir_.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) return true;
    if (errno == ENOENT) return false;
    throw Error(TNX_EIO, "cannot stat '" + path(name) + "': " + errtext(errno));
  }

  // All names in the directory (except "." and "..").
  std::vector<std::string> scan() const {
    Fd fd(::openat(dir_.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (fd.get() < 0) throw Error(TNX_EIO, "cannot open directory '" + path_ + "': " + errtext(errno));
    DIR *d = ::fdopendir(fd.get());
    if (d == nullptr) throw Error(TNX_EIO, "cannot read directory '" + path_ + "': " + errtext(errno));
    fd.release();
    std::unique_ptr<DIR, int (*)(DIR *)> guard(d, &::closedir);
    std::vector<std::string> names;
    for (;;) {
      errno = 0;
      const dirent *e = ::readdir(d);
      if (e == nullptr) {
        if (errno != 0) throw Error(TNX_EIO, "cannot read directory '" + path_ + "': " + errtext(errno));
        break;
      }
      const std::string_view n(e->d_name);
      if (n == "." || n == "..") continue;
      names.emplace_back(n);
    }
    return names;
  }

  // Reads a whole file of the directory; nullopt if it does not exist.
  // `ino` receives its inode (to detect replacement).
  std::optional<std::string> read_file(const std::string &name, FileId *id = nullptr) const {
    Fd fd(::openat(dir_.get(), name.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
    if (fd.get() < 0) {
      const int e = errno;
      if (e == ENOENT) return std::nullopt;
      if (e == ELOOP)
        throw Error(TNX_ECORRUPT, "'" + path(name) + "' is a symbolic link, not a task file");
      if (e == EACCES || e == EPERM)
        throw UnreadableFile(TNX_EIO, "cannot open '" + path(name) + "': " + errtext(e));
      throw Error(TNX_EIO, "cannot open '" + path(name) + "': " + errtext(e));
    }
    struct stat st;
    if (::fstat(fd.get(), &st) != 0)
      throw Error(TNX_EIO, "cannot stat '" + path(name) + "': " + errtext(errno));
    if (!S_ISREG(st.st_mode)) throw Error(TNX_ECORRUPT, "'" + path(name) + "' is not a regular file");
    if (id != nullptr) *id = FileId::of(st);
    std::string data;
    data.resize(static_cast<size_t>(st.st_size) + 1);
    size_t got = 0;
    for (;;) {
      if (got == data.size()) data.resize(data.size() * 2);
      const ssize_t n = ::read(fd.get(), &data[got], data.size() - got);
      if (n < 0) {
        if (errno == EINTR) continue;
        throw UnreadableFile(TNX_EIO, "cannot read '" + path(name) + "': " + errtext(errno));
      }
      if (n == 0) break;
      got += static_cast<size_t>(n);
    }
    data.resize(got);
    return std::optional<std::string>(std::move(data));
  }

  // Reads and decodes the Task stored under `stem` with its owner/tenant;
  // nullopt if there is none. Throws ECORRUPT naming the file.
  std::optional<Loaded> load(const std::string &stem) const {
    const std::string jname = stem + std::string(kJsonExt), mname = stem + std::string(kMetaExt);
    for (int attempt = 0; attempt < 16; ++attempt) {
      Loaded l;
      std::optional<std::string> json = read_file(jname, &l.file);
      if (!json) return std::nullopt;
      l.json = std::move(*json);
      const std::string why = parse_task(l.json, l.fields);
      if (!why.empty()) throw Error(TNX_ECORRUPT, "task file '" + path(jname) + "' " + why);
      std::optional<std::string> meta_bytes = read_file(mname);
      if (!meta_bytes) return std::optional<Loaded>(std::move(l));
      const ino_t ino = static_cast<ino_t>(l.file.ino);
      Meta m;
      const std::string mwhy = parse_meta(*meta_bytes, m);
      if (!mwhy.empty()) throw Error(TNX_ECORRUPT, "owner/tenant file '" + path(mname) + "' " + mwhy);
      // The sidecar must belong to the Task bytes we read: if the Task was
      // replaced in between, read both again.
      struct stat now;
      if (::fstatat(dir_.get(), jname.c_str(), &now, AT_SYMLINK_NOFOLLOW) != 0 || now.st_ino != ino) continue;
      if (m.has_prev && sha256_hex(l.json) == m.prev_sha) {
        l.owner = std::move(m.prev_owner);
        l.tenant = std::move(m.prev_tenant);
      } else {
        l.owner = std::move(m.owner);
        l.tenant = std::move(m.tenant);
      }
      return std::optional<Loaded>(std::move(l));
    }
    throw Error(TNX_EIO, "'" + path(jname) + "' kept changing while being read");
  }

  tnx_task_record record(const Loaded &l, uint64_t version, bool omit_json) const {
    tnx_task_record r = empty_record();
    r.id = toolnexus::sdk::str(l.fields.id);
    r.context_id = toolnexus::sdk::str(l.fields.context_id);
    r.state = toolnexus::sdk::str(l.fields.state);
    r.status_time_us = l.fields.time_us;
    r.owner = toolnexus::sdk::str(l.owner);
    r.tenant = toolnexus::sdk::str(l.tenant);
    if (!omit_json) r.task_json = toolnexus::sdk::str(l.json);
    r.version = version;
    return r;
  }

  // Atomically replaces `name` with `data`: temp file, full write, fdatasync,
  // rename. Not yet durable (see durable()). On failure nothing is left
  // behind and `name` is untouched.
  FileId replace(const std::string &name, std::string_view data, const std::string &id) {
    std::string tmp;
    Fd fd = create_temp(tmp);
    if (fd.get() < 0) {
      const int e = errno;
      throw Error(TNX_EIO, "save of task " + quote(id) + ": cannot create '" + path(tmp) + "': " + errtext(e));
    }
    auto fail = [&](const char *what, int e) {
      fd.reset();
      ::unlinkat(dir_.get(), tmp.c_str(), 0);
      return Error(TNX_EIO, "save of task " + quote(id) + ": cannot " + what + " '" + path(tmp) +
                                "' (for '" + path(name) + "'): " + errtext(e));
    };
    size_t done = 0;
    while (done < data.size()) {
      const ssize_t n = ::write(fd.get(), data.data() + done, data.size() - done);
      if (n < 0) {
        if (errno == EINTR) continue;
        throw fail("write", errno);
      }
      if (n == 0) throw fail("write", EIO);
      done += static_cast<size_t>(n);
    }
    while (::fdatasync(fd.get()) != 0)
      if (errno != EINTR) throw fail("sync", errno);
    struct stat st;
    if (::fstat(fd.get(), &st) != 0) throw fail("stat", errno);
    const int raw = fd.release();
    if (::close(raw) != 0 && errno != EINTR) throw fail("close", errno);
    if (::renameat(dir_.get(), tmp.c_str(), dir_.get(), name.c_str()) != 0) {
      const int e = errno;
      ::unlinkat(dir_.get(), tmp.c_str(), 0);
      throw Error(TNX_EIO, "save of task " + quote(id) + ": cannot rename '" + path(tmp) + "' to '" +
                               path(name) + "': " + errtext(e));
    }
    return FileId::of(st);  // a rename keeps the inode, size and mtime
  }

  // Makes the directory's changes so far durable; `what` names the change.
  void durable(const std::string &what) {
    const int e = sync_.wait(sync_.changed());
    if (e != 0)
      throw Error(TNX_EIO, "'" + what + "' was changed but syncing directory '" + path_ +
                               "' failed: " + errtext(e) + "; the change may not survive a crash");
  }

  void remove_meta(const std::string &mname) {
    if (::unlinkat(dir_.get(), mname.c_str(), 0) != 0 && errno != ENOENT)
      throw Error(TNX_EIO, "cannot remove '" + path(mname) + "': " + errtext(errno));
  }

  // The save path when the sidecar must change (see the layout comment).
  void save_with_meta(const std::string &id, const std::string &jname, const std::string &mname,
                      std::string_view json, bool present, bool meta_exists, bool meta_ok, const Meta &meta,
                      const std::string &owner, const std::string &tenant, bool &committed, FileId &file) {
    auto read_old = [&]() -> std::optional<std::string> {
      try {
        return read_file(jname);
      } catch (const Error &) {
        return std::nullopt;  // unreadable: it is being replaced anyway
      }
    };
    // Owner/tenant of the stored version, when they can be known.
    bool eff_known = false;
    std::string eff_owner, eff_tenant;
    std::optional<std::string> old;
    if (present) {
      if (!meta_exists) {
        eff_known = true;
      } else if (meta_ok) {
        if (meta.has_prev) old = read_old();
        if (!meta.has_prev || old) {
          eff_known = true;
          const bool use_prev = meta.has_prev && sha256_hex(*old) == meta.prev_sha;
          eff_owner = use_prev ? meta.prev_owner : meta.owner;
          eff_tenant = use_prev ? meta.prev_tenant : meta.tenant;
        }
      }
    }
    const bool want_meta = !owner.empty() || !tenant.empty();
    const bool changes = !eff_known || eff_owner != owner || eff_tenant != tenant;
    if (present && changes && !old) old = read_old();
    const bool same_bytes = old && *old == json;
    Meta clean;
    clean.owner = owner;
    clean.tenant = tenant;

    if (present && eff_known && changes && old && !same_bytes) {
      // Owner and bytes change: the sidecar keeps the old owner for the old
      // bytes until the Task file is replaced.
      Meta m = clean;
      m.has_prev = true;
      m.prev_owner = eff_owner;
      m.prev_tenant = eff_tenant;
      m.prev_sha = sha256_hex(*old);
      replace(mname, encode_meta(m), id);
      durable(path(mname));
      file = replace(jname, json, id);
      committed = true;
      durable(path(jname));
      try {  // drop "prev"; a later save does it if this fails
        if (want_meta) replace(mname, encode_meta(clean), id);
        else remove_meta(mname);
        durable(path(mname));
      } catch (const Error &) {
      }
      return;
    }
    // Otherwise the owner is the same for the old and the new bytes, or the
    // bytes do not change (the sidecar is then the commit), or there is no
    // stored Task (an orphan sidecar is overwritten).
    if (want_meta) replace(mname, encode_meta(clean), id);
    else if (meta_exists) remove_meta(mname);
    durable(path(mname));
    if (present && same_bytes) {
      committed = true;  // the Task file stays as it is: `file` is its identity
      return;
    }
    try {
      file = replace(jname, json, id);
    } catch (const Error &) {
      if (!present && want_meta) ::unlinkat(dir_.get(), mname.c_str(), 0);
      throw;
    }
    committed = true;
  }

  Fd dir_;
  const std::string path_;  // absolute path of the directory, for messages
  DirSync sync_;
  const bool ro_;
  int lock_fd_ = -1;   // .tnx-lock (read-only: O_RDONLY, may be -1)
  int index_fd_ = -1;  // .tnx-index being followed (-1: an in-memory snapshot)
  int my_slot_ = -1;   // process slot held in .tnx-lock (read-write)
  uint64_t offset_ = 0;  // bytes of .tnx-index applied; guarded by imu_
  mutable std::shared_mutex imu_;  // guards index_, offset_, index_fd_ reopening
  std::unique_ptr<Index> index_ = std::make_unique<Index>();
  bool indexed_before_ = false;  // .tnx-lock was there at open: a toolnexus store had opened <dir>
  std::mutex append_mu_;  // this process's holder of the index lock
  std::unique_ptr<std::mutex[]> slots_;  // per id slot, with the OFD id locks
};

// ---------------------------------------------------------------------------
// open
// ---------------------------------------------------------------------------

void fsync_dir_path(const std::string &dir) {
  Fd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0 || ::fsync(fd.get()) != 0)
    throw Error(TNX_EIO, "cannot sync directory '" + dir + "': " + errtext(errno));
}

// mkdir -p, making each created entry durable in its parent.
void make_dirs(const std::string &dir) {
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = dir.find('/', pos + 1);
    const std::string prefix = dir.substr(0, pos);
    if (prefix.empty() || prefix == "." || prefix == "..") continue;
    if (::mkdir(prefix.c_str(), 0777) == 0) {
      const size_t slash = prefix.find_last_of('/');
      fsync_dir_path(slash == std::string::npos ? "." : slash == 0 ? "/" : prefix.substr(0, slash));
      continue;
    }
    const int e = errno;
    if (e == EEXIST) continue;
    throw Error(e == ENOTDIR ? TNX_EINVAL : TNX_EIO,
                "file: cannot create directory '" + prefix + "': " + errtext(e));
  }
}

toolnexus::sdk::Store *open_file(const tnx_open_args &args) {
  const std::string loc(view(args.location));
  if (loc.empty()) throw Error(TNX_EINVAL, "file: needs a directory, e.g. file:/var/lib/toolnexus/tasks");
  if (loc.find('\0') != std::string::npos)
    throw Error(TNX_EINVAL, "file: the directory name contains a NUL byte");
  std::string abs = loc;
  if (loc[0] != '/') {
    std::string cwd(4096, '\0');
    if (::getcwd(&cwd[0], cwd.size()) == nullptr)
      throw Error(TNX_EIO, "file: cannot get the working directory for '" + loc + "': " + errtext(errno));
    cwd.resize(std::strlen(cwd.c_str()));
    abs = (cwd == "/" ? cwd : cwd + "/") + loc;
  }
  // Drop "." segments and repeated slashes, so messages show the path
  // plainly ("/srv/./tasks/" -> "/srv/tasks"). ".." stays: through a
  // symlink it may mean something other than its text.
  {
    std::string clean;
    size_t i = 0;
    while (i < abs.size()) {
      const size_t j = abs.find('/', i + 1);
      const std::string seg = abs.substr(i, (j == std::string::npos ? abs.size() : j) - i);  // "/name"
      if (seg != "/" && seg != "/.") clean += seg;
      i = j == std::string::npos ? abs.size() : j;
    }
    abs = clean.empty() ? "/" : clean;
  }
  const bool read_only = toolnexus::sdk::open_read_only(args);
  if (!read_only) make_dirs(abs);
  Fd fd(::open(abs.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0) {
    const int e = errno;
    if (read_only && e == ENOENT)
      throw Error(TNX_ENOTFOUND, "file: no store at '" + abs + "': the directory does not exist "
                                 "(opened read-only, so it was not created)");
    throw Error(e == ENOTDIR ? TNX_EINVAL : TNX_EIO, "file: cannot open directory '" + abs + "': " +
                                                         (e == ENOTDIR ? "not a directory" : errtext(e)));
  }
  auto store = std::make_unique<FileStore>(std::move(fd), abs, read_only);
  store->open_index();  // read-write: also cleans up when no other process has it open
  if (!read_only) store->probe_writable();
  return store.release();
}

const char *const kSchemes[] = {"file", nullptr};

const tnx_plugin_descriptor kDescriptor = {
    TNX_HEADER_INIT(tnx_plugin_descriptor),
    "toolnexus-file",
    "0.1.0",
    "One JSON file per Task in a directory (file:<dir>), atomic durable writes, an index for "
    "list and count; compare-and-set holds between processes (file locks)",
    kSchemes,
    TNX_CAP_THREAD_SAFE | TNX_CAP_PAGINATED_LIST | TNX_CAP_COMPARE_AND_SET | TNX_CAP_DURABLE |
        TNX_CAP_MULTI_PROCESS | TNX_CAP_PERSISTENT,
    &toolnexus::sdk::open_trampoline<open_file>,
    nullptr,
    "file:<dir>",
};

}  // namespace

/// Entry point of the file plugin: returns the descriptor of the "file"
/// scheme (one JSON file per Task in file:<dir>; see the layout comment at
/// the top of this file), or NULL for a host of a different ABI major.
extern "C" TNX_PLUGIN_EXPORT const tnx_plugin_descriptor *toolnexus_plugin_entry(
    const tnx_host_info *host) {
  return toolnexus::sdk::entry<kDescriptor>(host);
}

// plugins/file: the "file" scheme. One JSON file per Task in a directory,
// compatible with the original (Elixir) FileTaskStore. Built against the SDK
// header only (plus Poco::Foundation for SHA-256 and RapidJSON for parsing).
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
//                 store opens <dir>; nothing else is removed there except
//                 orphan sidecars (a <stem>.meta without <stem>.json, left by
//                 a crash during the first save of a task).
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
// Versions and compare-and-set: versions are not on disk. Each open store
// numbers them in memory (first seen on disk = 1, every save +1, kept across
// deletes so a re-created id continues upwards). The check and the write of
// one id run under a per-id mutex; different ids save in parallel. So CAS
// holds between threads of one process, not between processes or between two
// stores opened on the same directory (no TNX_CAP_MULTI_PROCESS). Reads take
// no lock: they note the version before reading the file, so a read racing a
// save may pair the new bytes with the previous version (a CAS save based on
// it then conflicts), never the old bytes with a newer version.
//
// Saves are checked first (TNX_EINVAL, nothing written): task_json must be a
// Task the host would accept (an object with a non-empty string "id", string
// contextId/status.state, RFC 3339 status.timestamp) whose id, contextId,
// state and timestamp equal the record's, since reads re-derive them.
//
// list reads every task file of <dir> (and its sidecar) per call, keeps the
// first page_size + 1 matches in list order and delivers page_size of them.
// The cursor is sdk::ListKey's "<time>.<hex id>"; for ids over ~500 bytes,
// whose ListKey would exceed the ABI's 1024-byte cursor limit, it is
// "<ListKey of time and the first 460 id bytes>.<sha256 hex of the id>".
//
// Errors: a task file that cannot be decoded (empty, truncated, not JSON, not
// an object, no string "id", a bad contextId/status, an "id" that is not the
// one its name stands for, not a regular file) and an unreadable sidecar are
// TNX_ECORRUPT naming the file; list stops on them too.
#include "toolnexus/plugin.hpp"

#include <Poco/DigestEngine.h>
#include <Poco/SHA2Engine.h>
#include <rapidjson/document.h>
#include <rapidjson/error/en.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstddef>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
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
class DirSync {
 public:
  explicit DirSync(int fd) noexcept : fd_(fd) {}

  uint64_t changed() {
    std::lock_guard<std::mutex> l(m_);
    return ++changes_;
  }

  // 0 or the errno of the fsync covering `ticket`.
  int wait(uint64_t ticket) {
    std::unique_lock<std::mutex> l(m_);
    for (;;) {
      if (synced_ >= ticket) return 0;
      if (run_) {
        std::shared_ptr<Run> r = run_;
        cv_.wait(l, [&] { return r->done; });
        if (r->target >= ticket && r->err != 0) return r->err;
        continue;
      }
      auto r = std::make_shared<Run>();
      r->target = changes_;
      run_ = r;
      l.unlock();
      int err = 0;
      while (::fsync(fd_) != 0) {
        if (errno != EINTR) {
          err = errno;
          break;
        }
      }
      l.lock();
      r->err = err;
      r->done = true;
      run_.reset();
      if (err == 0 && r->target > synced_) synced_ = r->target;
      cv_.notify_all();
      if (err != 0) return err;
    }
  }

 private:
  struct Run {
    uint64_t target = 0;
    int err = 0;
    bool done = false;
  };
  int fd_;
  std::mutex m_;
  std::condition_variable cv_;
  uint64_t changes_ = 0;
  uint64_t synced_ = 0;
  std::shared_ptr<Run> run_;
};

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
  FileStore(Fd dir, std::string path) : dir_(std::move(dir)), path_(std::move(path)), sync_(dir_.get()) {}

  // Removes stray temporary files and orphan sidecars (called once by open).
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

  void recover() {
    std::vector<std::string> names = scan();
    std::vector<std::string> jsons;
    for (const auto &n : names)
      if (ends_with(n, kJsonExt)) jsons.push_back(n);
    std::sort(jsons.begin(), jsons.end());
    bool removed = false;
    for (const auto &n : names) {
      bool remove = is_temp_name(n);
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
    const Snapshot snap = snapshot(id);  // before reading: never an old Task with a newer version
    std::optional<Loaded> l = load(stem);
    if (!l) return false;
    if (l->fields.id != id)
      throw Error(TNX_ECORRUPT, "'" + path(stem + std::string(kJsonExt)) + "' holds task id " +
                                    quote(l->fields.id) + ", not " + quote(id));
    out(record(*l, current_version(snap, true), false));
    return true;
  }

  uint64_t save(const tnx_task_record &rec, uint64_t expected) override {
    const std::string id(view(rec.id));
    const std::string_view json = view(rec.task_json);
    validate(rec, id, json);
    const std::string stem = stem_for(id);
    const std::string jname = stem + std::string(kJsonExt), mname = stem + std::string(kMetaExt);
    const std::string owner(view(rec.owner)), tenant(view(rec.tenant));

    IdState &st = state_for(id);
    std::lock_guard<std::mutex> write_lock(st.write);
    const bool present = exists(jname);
    const Snapshot snap = snapshot_of(st);
    const uint64_t cur = current_version(snap, present);
    if (expected != TNX_VERSION_ANY && expected != cur)
      throw Error(TNX_ECONFLICT, "save of task " + quote(id) + ": expected version " +
                                     std::to_string(expected) + ", stored " + std::to_string(cur));
    const uint64_t next = std::max(cur, snap.version) + 1;

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
                      (present && meta_ok && !meta.has_prev && meta.owner == owner && meta.tenant == tenant);
    bool committed = false;
    try {
      if (fast) {
        replace(jname, json, id);
        committed = true;
        durable(path(jname));
      } else {
        save_with_meta(id, jname, mname, json, present, meta_bytes.has_value(), meta_ok, meta, owner,
                       tenant, committed);
      }
    } catch (...) {
      if (committed) publish(st, next, true);
      throw;
    }
    publish(st, next, true);
    return next;
  }

  void del(std::string_view idv, uint64_t expected) override {
    const std::string id(idv);
    const std::string stem = stem_for(id);
    const std::string jname = stem + std::string(kJsonExt), mname = stem + std::string(kMetaExt);
    IdState &st = state_for(id);
    std::lock_guard<std::mutex> write_lock(st.write);
    const bool present = exists(jname);
    const Snapshot snap = snapshot_of(st);
    const uint64_t cur = current_version(snap, present);
    if (!present) throw Error(TNX_ENOTFOUND, "no task with id " + quote(id));
    if (expected != TNX_VERSION_ANY && expected != cur)
      throw Error(TNX_ECONFLICT, "delete of task " + quote(id) + ": expected version " +
                                     std::to_string(expected) + ", stored " + std::to_string(cur));
    const uint64_t last = std::max(cur, snap.version);
    if (::unlinkat(dir_.get(), jname.c_str(), 0) != 0) {
      const int e = errno;
      if (e == ENOENT) throw Error(TNX_ENOTFOUND, "no task with id " + quote(id));
      throw Error(TNX_EIO, "cannot delete '" + path(jname) + "': " + errtext(e));
    }
    // The Task is gone; a sidecar left behind (unlink failure, crash) is an
    // orphan that saves overwrite and the next open removes.
    ::unlinkat(dir_.get(), mname.c_str(), 0);
    try {
      durable(path(jname));
    } catch (...) {
      publish(st, last, false);
      throw;
    }
    publish(st, last, false);
  }

  std::string list(const tnx_list_query &q, const toolnexus::sdk::RecordOut &out) override {
    const size_t limit = toolnexus::sdk::page_size(q);
    std::optional<Cursor> cursor;
    if (q.cursor.len != 0) cursor = decode_cursor(view(q.cursor));
    const bool omit = q.omit_json != 0;
    const bool deliver_corrupt = TNX_HAS_FIELD(&q, tnx_list_query, deliver_corrupt) && q.deliver_corrupt != 0;

    std::vector<std::string> names = scan();
    std::sort(names.begin(), names.end());  // deterministic: the first corrupt file by name
    std::vector<Item> best;  // a heap whose front is the record that comes last
    std::vector<Item> ambiguous;  // long-id cursor ties resolved after the scan
    std::optional<std::string> cursor_id;  // the full id of a long-form cursor, once found

    for (const auto &name : names) {
      if (name[0] == '.' || !ends_with(name, kJsonExt)) continue;
      const std::string stem = name.substr(0, name.size() - kJsonExt.size());
      std::optional<StemInfo> info = classify(stem);
      if (!info) continue;
      std::optional<Loaded> l;
      Snapshot snap;
      try {
      if (info->kind != StemKind::hashed) {
        snap = snapshot(info->id);
        l = load(stem);
        if (!l) continue;  // deleted meanwhile
        if (l->fields.id != info->id)
          throw Error(TNX_ECORRUPT, "'" + path(name) + "' holds task id " + quote(l->fields.id) +
                                        ", not " + quote(info->id) + " as its name says");
      } else {
        // The id is only known from the file: read it, take the version,
        // read again (so the content is never older than the version).
        l = load(stem);
        if (!l) continue;
        const std::string id = l->fields.id;
        snap = snapshot(id);
        l = load(stem);
        if (!l) continue;
        if (l->fields.id != id || stem_for(id) != stem)
          throw Error(TNX_ECORRUPT, "'" + path(name) + "' holds task id " + quote(l->fields.id) +
                                        ", which is not stored under this name");
      }
      } catch (const Error &e) {
        // deliver_corrupt: an undecodable record, or one whose own file
        // cannot be read (no permission, a bad sector), is delivered; any
        // other failure still ends the list.
        const bool this_file = e.code == TNX_ECORRUPT || dynamic_cast<const UnreadableFile *>(&e) != nullptr;
        if (!this_file || !deliver_corrupt) throw;
        // ABI 1.1 deliver_corrupt: hand the raw bytes over under the id the
        // name says (or the file name when only a hash is known), whatever
        // the filters, and go on.
        std::optional<std::string> raw;
        try {
          raw = read_file(name);
        } catch (const Error &) {
          raw = std::string();
        }
        if (!raw) continue;
        Item item{TNX_TIME_NONE, info->kind != StemKind::hashed ? info->id : name, 0, std::string(),
                  std::string(), std::string(), std::string(), omit ? std::string() : std::move(*raw),
                  e.message};
        if (cursor && cursor->after(item.time_us, item.id) <= 0) continue;
        keep(best, std::move(item), limit);
        continue;
      }
      const TaskFields &f = l->fields;
      if (cursor && cursor->long_form && !cursor_id && f.id.size() > cursor->key.id.size() &&
          starts_with(f.id, cursor->key.id) && sha256_hex(f.id) == cursor->sha)
        cursor_id = f.id;
      if (!toolnexus::sdk::matches(q, f.context_id, f.state, l->owner, l->tenant, f.time_us)) continue;
      Item item{f.time_us, f.id, current_version(snap, true), f.context_id, f.state, l->owner, l->tenant,
                omit ? std::string() : std::move(l->json), std::string()};
      if (cursor) {
        const int after = cursor->after(item.time_us, item.id);
        if (after == 0) continue;
        if (after < 0) {
          ambiguous.push_back(std::move(item));
          continue;
        }
      }
      keep(best, std::move(item), limit);
    }
    for (auto &item : ambiguous) {
      // Same time and same id prefix as a long-form cursor: exact when the
      // cursor's record still exists, otherwise delivered (a repeat is
      // better than a loss).
      if (cursor_id && !(std::string_view(*cursor_id) < std::string_view(item.id))) continue;
      keep(best, std::move(item), limit);
    }

    std::vector<Item> page = std::move(best);
    std::sort_heap(page.begin(), page.end(), ItemOrder());
    const bool more = page.size() > limit;
    if (more) page.resize(limit);
    for (const Item &item : page) {
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
    return encode_cursor(page.back().time_us, page.back().id);
  }

  void close() override {}

 private:
  // Per-id state. `write` serialises save/del of the id (held across the
  // I/O); version/present are guarded by map_mu_.
  struct IdState {
    std::mutex write;
    uint64_t version = 0;  // last version given or seen (0: none yet)
    bool present = false;  // whether the Task existed after that
  };

  // A copy of an id's version state.
  struct Snapshot {
    bool known = false;
    uint64_t version = 0;
    bool present = false;
  };

  struct Loaded {
    std::string json;
    TaskFields fields;
    std::string owner, tenant;
  };

  struct Item {
    int64_t time_us;
    std::string id;
    uint64_t version;
    std::string context_id, state, owner, tenant, json;
    std::string problem;  // deliver_corrupt: why the record is unreadable
  };

  // Heap order: a < b when a comes first in list order, so the heap's front
  // is the record that comes last.
  struct ItemOrder {
    bool operator()(const Item &a, const Item &b) const noexcept {
      if (a.time_us != b.time_us) return a.time_us > b.time_us;
      return a.id < b.id;
    }
  };

  // A decoded cursor. Ids whose plain ListKey cursor would exceed 1024 bytes
  // use "<ListKey of (time, first 460 id bytes)>.<sha256 of the id>".
  struct Cursor {
    ListKey key;
    bool long_form = false;
    std::string sha;

    // 1: (time, id) comes after the cursor; 0: not; -1: cannot tell yet
    // (long form, same time, id extends the kept prefix).
    int after(int64_t time_us, const std::string &id) const {
      if (time_us != key.time_us) return time_us < key.time_us ? 1 : 0;
      if (!long_form) return key.before(time_us, id) ? 1 : 0;
      if (id.size() > key.id.size() && starts_with(id, key.id)) return -1;
      return std::string_view(key.id) < std::string_view(id) ? 1 : 0;
    }
  };

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

  // Keeps the first limit + 1 records in list order (one more than a page
  // tells whether a next page exists).
  static void keep(std::vector<Item> &best, Item item, size_t limit) {
    best.push_back(std::move(item));
    std::push_heap(best.begin(), best.end(), ItemOrder());
    if (best.size() > limit + 1) {
      std::pop_heap(best.begin(), best.end(), ItemOrder());
      best.pop_back();
    }
  }

  std::string path(std::string_view name) const {
    return (path_ == "/" ? path_ : path_ + "/") + std::string(name);
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

  IdState &state_for(const std::string &id) {
    std::lock_guard<std::mutex> l(map_mu_);
    auto &p = states_[id];
    if (!p) p = std::make_unique<IdState>();
    return *p;
  }

  Snapshot snapshot(const std::string &id) const {
    std::lock_guard<std::mutex> l(map_mu_);
    auto it = states_.find(id);
    if (it == states_.end()) return Snapshot{};
    return Snapshot{true, it->second->version, it->second->present};
  }

  Snapshot snapshot_of(const IdState &st) const {
    std::lock_guard<std::mutex> l(map_mu_);
    return Snapshot{st.version != 0 || st.present, st.version, st.present};
  }

  void publish(IdState &st, uint64_t version, bool present) {
    std::lock_guard<std::mutex> l(map_mu_);
    st.version = version;
    st.present = present;
  }

  // The version of an id given what we knew (snap) and whether its file is
  // on disk now. A file that appeared behind our back counts as a new
  // version; one first seen is version 1.
  static uint64_t current_version(const Snapshot &snap, bool on_disk) noexcept {
    if (!on_disk) return 0;
    if (!snap.known) return 1;
    return snap.present ? snap.version : snap.version + 1;
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
  std::optional<std::string> read_file(const std::string &name, ino_t *ino = nullptr) const {
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
    if (ino != nullptr) *ino = st.st_ino;
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
      ino_t ino = 0;
      std::optional<std::string> json = read_file(jname, &ino);
      if (!json) return std::nullopt;
      l.json = std::move(*json);
      const std::string why = parse_task(l.json, l.fields);
      if (!why.empty()) throw Error(TNX_ECORRUPT, "task file '" + path(jname) + "' " + why);
      std::optional<std::string> meta_bytes = read_file(mname);
      if (!meta_bytes) return std::optional<Loaded>(std::move(l));
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
  void replace(const std::string &name, std::string_view data, const std::string &id) {
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
    const int raw = fd.release();
    if (::close(raw) != 0 && errno != EINTR) throw fail("close", errno);
    if (::renameat(dir_.get(), tmp.c_str(), dir_.get(), name.c_str()) != 0) {
      const int e = errno;
      ::unlinkat(dir_.get(), tmp.c_str(), 0);
      throw Error(TNX_EIO, "save of task " + quote(id) + ": cannot rename '" + path(tmp) + "' to '" +
                               path(name) + "': " + errtext(e));
    }
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
                      const std::string &owner, const std::string &tenant, bool &committed) {
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
      replace(jname, json, id);
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
      committed = true;
      return;
    }
    try {
      replace(jname, json, id);
    } catch (const Error &) {
      if (!present && want_meta) ::unlinkat(dir_.get(), mname.c_str(), 0);
      throw;
    }
    committed = true;
    durable(path(jname));
  }

  Fd dir_;
  const std::string path_;  // absolute path of the directory, for messages
  DirSync sync_;
  mutable std::mutex map_mu_;
  std::unordered_map<std::string, std::unique_ptr<IdState>> states_;
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
  auto store = std::make_unique<FileStore>(std::move(fd), abs);
  if (!read_only) {
    store->recover();  // removing stray files is a change
    store->probe_writable();
  }
  return store.release();
}

const char *const kSchemes[] = {"file", nullptr};

const tnx_plugin_descriptor kDescriptor = {
    TNX_HEADER_INIT(tnx_plugin_descriptor),
    "toolnexus-file",
    "0.1.0",
    "One JSON file per Task in a directory (file:<dir>), atomic durable writes; "
    "compare-and-set holds within one process only",
    kSchemes,
    TNX_CAP_THREAD_SAFE | TNX_CAP_PAGINATED_LIST | TNX_CAP_COMPARE_AND_SET | TNX_CAP_DURABLE |
        TNX_CAP_PERSISTENT,
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

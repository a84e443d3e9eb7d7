// `toolnexus store ...`: inspect, copy and check Task stores through the same
// resolve_store() the server uses.
#include "commands.hpp"
#include "line_reader.hpp"
#include "options.hpp"
#include "store_common.hpp"

#include "toolnexus/registry.hpp"
#include "toolnexus/server.hpp"

#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <optional>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

namespace toolnexus::cli {
namespace store_detail {

const char *kHelp =
    "usage: toolnexus store COMMAND [--plugin-dir DIR]... [--allow-insecure-plugins] ARGS\n"
    "  get SELECTOR ID            print the Task JSON (its version on stderr)  exit 1: no such Task\n"
    "  put SELECTOR [FILE|-]      save one Task JSON (stdin without FILE), print its id;\n"
    "      [--owner P] [--tenant T] [--expect-version N | --force]\n"
    "                             a new Task only, unless --expect-version N (the version\n"
    "                             `store get` printed: refused if it changed since) or\n"
    "                             --force; owner and tenant not given are kept\n"
    "                             exit 1: the Task exists / changed since it was read\n"
    "                             JSON lines (one Task per line): streamed (memory of a\n"
    "                             few Tasks); one transaction where the store has them\n"
    "                             (sqlite, postgres: a bad line or an existing Task saves\n"
    "                             nothing), else Task by Task with grouped fsyncs (file:\n"
    "                             a FILE is checked whole first; a pipe is checked as\n"
    "                             read, and a failure leaves the lines before the one\n"
    "                             named saved and says how many); errors name the line\n"
    "      [--resume]             skip Tasks stored as the input has them: run a put\n"
    "                             that stopped (bad line, crash, kill) again to finish it\n"
    "      [--running-as STATE]   a submitted or working Task without a server's lease\n"
    "                             is refused (exit 2, nothing saved): no server runs it,\n"
    "                             and a server would fail it (\"stopped before finishing\n"
    "                             it\") once its status is older than one lease (30 s);\n"
    "                             --running-as input-required|auth-required|failed|\n"
    "                             canceled|rejected|completed saves it in STATE instead,\n"
    "                             with a status message saying so\n"
    "  list SELECTOR [--context-id X] [--state S] [--owner P] [--limit N] [--json]\n"
    "                             newest first: id, state, timestamp, contextId per line\n"
    "                             (--json: one JSON object per line)\n"
    "                             exit 1: some records could not be read (each reported, skipped)\n"
    "  rm SELECTOR ID             delete a Task                 exit 1: no such Task\n"
    "  copy FROM TO               copy every Task (owner and tenant kept); safe to re-run;\n"
    "                             streamed, in one transaction where TO has them\n"
    "                             exit 1: some records could not be read (each reported)\n"
    "  check SELECTOR             read every record, report each corrupt or invalid one\n"
    "                             exit 1: some record is not sound\n"
    "  gc [SELECTOR] [--config F] [--older-than D] [--state S]... [--dry-run]\n"
    "                             delete Tasks past their retention, expire waiting ones\n"
    "                             (see `toolnexus store gc --help`)\n"
    "  rekey SELECTOR [--checkpoint FILE]\n"
    "                             re-save every Task, so an encrypt: store seals each with its\n"
    "                             newest key (see `toolnexus store rekey --help`)\n"
    "  Exit 2 on any other error (bad selector, store unusable, usage).\n"
    "  SELECTOR: memory | file:<dir> | sqlite:<path> | <scheme>:<location> (see `toolnexus plugins`)\n"
    "  --allow-insecure-plugins: load plugins from group/other-writable or foreign-owned\n"
    "  files and directories (the permission checks off; symlinks must stay inside)\n";

int usage_error(const std::string &msg) {
  std::cerr << "toolnexus store: " << msg << "\n" << kHelp;
  return 2;
}

// True when selectors `a` and `b` name the same store as far as the CLI can
// tell: equal text, or file:/sqlite: paths (before any "?options") that lead
// to the same place. Other schemes compare by text only.
bool same_location(const std::string &a, const std::string &b) {
  if (a == b) return true;
  const size_t ca = a.find(':'), cb = b.find(':');
  if (ca == std::string::npos || cb == std::string::npos || a.compare(0, ca, b, 0, cb) != 0) return false;
  const std::string scheme = a.substr(0, ca);
  if (scheme != "file" && scheme != "sqlite") return false;
  auto path_of = [&](const std::string &s, size_t colon) {
    std::string p = s.substr(colon + 1);
    if (scheme == "sqlite") p = p.substr(0, p.find('?'));
    std::error_code ec;
    auto c = std::filesystem::weakly_canonical(std::filesystem::absolute(p, ec), ec);
    return ec ? std::filesystem::path(p).lexically_normal() : c;
  };
  return path_of(a, ca) == path_of(b, cb);
}

// Text from a store (an id, a reason) as it may be printed on a terminal:
// valid UTF-8 kept, control bytes and bytes of invalid UTF-8 shown as \xHH
// (a damaged record's name may be anything; a terminal must not obey it).
std::string printable(std::string_view s) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = 0;  // length of a valid multi-byte sequence starting here
    if (c >= 0x80)
      for (size_t k = 2; k <= 4 && n == 0 && i + k <= s.size(); ++k)
        if (is_valid_utf8(s.substr(i, k))) n = k;
    if (n != 0) {
      out.append(s.substr(i, n));
      i += n;
    } else if (c < 0x20 || c >= 0x7f) {
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
      ++i;
    } else {
      out += static_cast<char>(c);
      ++i;
    }
  }
  return out;
}

std::string time_text(int64_t us) { return us == kNoTime ? "-" : format_timestamp(us); }

// Appends `s` to a table line as printable() shows it: a control byte in an
// id or contextId must not start a new line or move the terminal's cursor.
void append_printable(std::string &out, std::string_view s) {
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c >= 0x7f) {
      out += printable(s);
      return;
    }
  }
  out.append(s);
}

// Every record of `q` across pages, handed to `f` one at a time.
template <class F>
void for_each_record(TaskStore &s, ListQuery q, F &&f) {
  for (;;) {
    ListPage p = s.list(q);
    for (auto &r : p.records) f(r);
    if (p.next_cursor.empty()) return;
    q.cursor = std::move(p.next_cursor);
  }
}

// Why a delivered record is not sound, or "" when it is: its bytes must parse
// as a Task that `store put` would take (and the server serve: the same
// a2a_task_problem()), and its index fields must agree with the JSON.
std::string unsound(const TaskRecord &r) {
  if (!r.problem.empty()) return r.problem;  // the store's own reason (ABI 1.2)
  Task t;
  try {
    t = Task::parse(r.json);
  } catch (const InvalidTask &e) {
    return e.what();
  }
  if (t.id() != r.id) return "stored under id '" + r.id + "' but its JSON says '" + std::string(t.id()) + "'";
  if (const std::string why = a2a_task_problem(t); !why.empty()) return "not a valid A2A Task: " + why;
  if (t.context_id() != r.context_id) return "index contextId '" + r.context_id + "' differs from the JSON's";
  if (t.state() != r.state) return "index state '" + r.state + "' differs from the JSON's '" + std::string(t.state()) + "'";
  if (t.status_time_us() != r.status_time_us) return "index status time differs from the JSON's status.timestamp";
  return "";
}

// A progress bar on stderr when it is a terminal: done/total, the rate
// (Tasks/s, since the start) and the time left at that rate.
class Progress {
 public:
  explicit Progress(uint64_t total)
      : total_(total), tty_(::isatty(2) == 1), start_(std::chrono::steady_clock::now()) {}
  void step(uint64_t done) {
    if (!tty_ || (done % 64 != 0 && done != total_)) return;
    const int width = 30;
    int filled = total_ == 0 ? width : static_cast<int>(static_cast<double>(done) / static_cast<double>(total_) * width);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    const double rate = secs > 0 ? static_cast<double>(done) / secs : 0;
    const double left = rate > 0 && total_ > done ? static_cast<double>(total_ - done) / rate : 0;
    std::fprintf(stderr, "\r[%-*s] %llu/%llu  %.0f/s  ETA %s ", width,
                 std::string(static_cast<size_t>(filled), '#').c_str(), static_cast<unsigned long long>(done),
                 static_cast<unsigned long long>(total_), rate, duration_text(left).c_str());
    std::fflush(stderr);
  }
  /// "1h02m", "3m05s", "12s".
  static std::string duration_text(double secs) {
    const auto s = static_cast<long long>(secs + 0.5);
    char buf[32];
    if (s >= 3600) std::snprintf(buf, sizeof buf, "%lldh%02lldm", s / 3600, (s / 60) % 60);
    else if (s >= 60) std::snprintf(buf, sizeof buf, "%lldm%02llds", s / 60, s % 60);
    else std::snprintf(buf, sizeof buf, "%llds", s);
    return buf;
  }
  void finish() {
    if (tty_) std::fprintf(stderr, "\n");
  }

 private:
  uint64_t total_;
  bool tty_;
  std::chrono::steady_clock::time_point start_;
};

int cmd_get(const Options &o) {
  if (o.positional.size() != 3) return usage_error("get takes SELECTOR ID");
  auto s = resolve_store(o.positional[1], kInspect);
  auto r = s->get(o.positional[2]);
  if (!r) {
    std::cerr << "toolnexus store get: no Task with id '" << o.positional[2] << "' in " << o.positional[1] << "\n";
    return 1;
  }
  (void)r->task();  // a corrupt record is an error (exit 2), never printed as if sound
  std::cout << r->json << "\n";
  // What `store put --expect-version` needs to replace exactly this version.
  std::cerr << "version " << r->version << "\n";
  return 0;
}

// Parses `text` as a Task an A2A server can serve; "" or why not.
std::string parse_a2a_task(const std::string &text, Task &t) {
  try {
    t = Task::parse(text);
  } catch (const InvalidTask &e) {
    return std::string("not a valid Task: ") + e.what();
  }
  // The store accepts any object with an id (the seed's contract), but a
  // Task an A2A server will serve needs what the spec requires of one.
  if (const std::string why = a2a_task_problem(t); !why.empty()) return "not a valid A2A Task: " + why;
  return "";
}

// What is wrong with the server's lease of a submitted or working `t`
// (metadata["toolnexus/lease"], as a server writes it: "instance" a
// non-empty string, "expiresAt" an RFC 3339 time), or "" when it has one.
std::string lease_problem(const Task &t) {
  const auto &doc = t.json();
  const auto md = doc.FindMember("metadata");
  if (md == doc.MemberEnd() || !md->value.IsObject()) return "it has no server's lease";
  const auto lease = md->value.FindMember("toolnexus/lease");
  if (lease == md->value.MemberEnd()) return "it has no server's lease";
  if (!lease->value.IsObject()) return "its metadata[\"toolnexus/lease\"] is not an object";
  const auto instance = lease->value.FindMember("instance");
  if (instance == lease->value.MemberEnd() || !instance->value.IsString() || instance->value.GetStringLength() == 0)
    return "its metadata[\"toolnexus/lease\"] names no server (\"instance\" must be a non-empty string)";
  const auto expires = lease->value.FindMember("expiresAt");
  int64_t us = 0;
  if (expires == lease->value.MemberEnd() || !expires->value.IsString() ||
      !parse_timestamp(std::string_view(expires->value.GetString(), expires->value.GetStringLength()), us))
    return "its metadata[\"toolnexus/lease\"] has no valid \"expiresAt\" (an RFC 3339 time)";
  return "";
}

// Whether `t` is submitted or working without a server's lease: nobody
// runs it, and a server would settle it to failed once its status is older
// than one lease.
bool unheld_running(const Task &t) {
  const std::string_view state = t.state();
  if (state != task_state::kSubmitted && state != task_state::kWorking) return false;
  return !lease_problem(t).empty();
}

// Why `t` is refused without --running-as (see unheld_running).
std::string unheld_running_why(const Task &t) {
  return "Task '" + printable(t.id()) + "' is " + std::string(t.state()) + " and no server runs it (" +
         lease_problem(t) +
         "): a server would fail it once its status is older than one lease; import it as a state that waits or "
         "ends with --running-as STATE (input-required, auth-required, failed, canceled, rejected, completed)";
}

// The states --running-as takes: every one that no server has to run.
bool valid_running_as(const std::string &s) {
  return s == task_state::kInputRequired || s == task_state::kAuthRequired || s == task_state::kFailed ||
         s == task_state::kCanceled || s == task_state::kRejected || s == task_state::kCompleted;
}

// The messageId of the status message --running-as gives the Task of
// input `text`: "import-" and 16 hex digits of its FNV-1a hash, the same
// for the same input, so that a put run again (--resume) knows its own
// import.
std::string import_message_id(std::string_view text) {
  uint64_t h = 14695981039346656037ull;
  for (char c : text) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ull;
  }
  static const char kHex[] = "0123456789abcdef";
  std::string mid = "import-";
  for (int i = 15; i >= 0; --i) mid += kHex[(h >> (4 * i)) & 15];
  return mid;
}

// Moves `t` (unheld_running) to `state`, with an agent status message (also
// added to its history, its messageId `mid`) that says what was done and
// why.
void reset_running(Task &t, const std::string &state, const std::string &mid) {
  auto &a = t.allocator();
  const std::string was(t.state());
  const std::string text = "Imported by `toolnexus store put --running-as " + state + "` while " + was +
                           ": no server was running this Task, so it was set to " + state + ".";
  auto make = [&] {
    rapidjson::Value m(rapidjson::kObjectType);
    m.AddMember("role", "agent", a);
    rapidjson::Value parts(rapidjson::kArrayType);
    rapidjson::Value part(rapidjson::kObjectType);
    part.AddMember("kind", "text", a);
    part.AddMember("text", rapidjson::Value(text.c_str(), static_cast<rapidjson::SizeType>(text.size()), a), a);
    parts.PushBack(part, a);
    m.AddMember("parts", parts, a);
    m.AddMember("messageId", rapidjson::Value(mid.c_str(), static_cast<rapidjson::SizeType>(mid.size()), a), a);
    const std::string id(t.id()), ctx(t.context_id());
    m.AddMember("taskId", rapidjson::Value(id.c_str(), static_cast<rapidjson::SizeType>(id.size()), a), a);
    m.AddMember("contextId", rapidjson::Value(ctx.c_str(), static_cast<rapidjson::SizeType>(ctx.size()), a), a);
    m.AddMember("kind", "message", a);
    return m;
  };
  auto &doc = t.json();
  auto history = doc.FindMember("history");
  if (history == doc.MemberEnd()) {
    doc.AddMember("history", rapidjson::Value(rapidjson::kArrayType), a);
    history = doc.FindMember("history");
  }
  if (history->value.IsArray()) history->value.PushBack(make(), a);
  t.set_status(state, make());
}

// Applies --running-as to `t`, read from input `text`: "" when it may be
// saved (reset when it was an unheld running Task and the option is
// given; `import_id`, if given, then receives its status message's
// messageId), else why not.
std::string running_as(const Options &o, Task &t, std::string_view text, std::string *import_id) {
  if (!unheld_running(t)) return "";
  const auto v = o.value("--running-as");
  if (!v) return unheld_running_why(t);
  const std::string mid = import_message_id(text);
  reset_running(t, *v, mid);
  if (import_id != nullptr) *import_id = mid;
  return "";
}

// The SaveOptions of replacing `t` (`current`: what is stored, if any):
// owner and tenant not given on the command line are kept.
SaveOptions put_options(const Options &o, const Task &t, const std::optional<TaskRecord> &current) {
  SaveOptions so;
  so.due_us = task_due_us(t);
  if (current) {
    so.owner = current->owner;
    so.tenant = current->tenant;
  }
  if (auto v = o.value("--owner")) so.owner = *v;
  if (auto v = o.value("--tenant")) so.tenant = *v;
  return so;
}

int cmd_put(const Options &o) {
  if (o.positional.size() < 2 || o.positional.size() > 3) return usage_error("put takes SELECTOR [FILE]");
  int fd = 0;
  std::string name = "stdin";
  if (o.positional.size() == 3 && o.positional[2] != "-") {
    name = o.positional[2];
    fd = ::open(name.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      std::cerr << "toolnexus store put: cannot read '" << name << "': " << std::strerror(errno) << "\n";
      return 2;
    }
  }
  struct CloseFd {
    int fd;
    ~CloseFd() {
      if (fd > 0) ::close(fd);
    }
  } close_fd{fd};
  if (o.flag("--force") && o.value("--expect-version"))
    return usage_error("--force and --expect-version exclude each other");
  if (auto v = o.value("--running-as"); v && !valid_running_as(*v))
    return usage_error("--running-as '" + *v + "' is not a state that no server has to run (input-required, "
                       "auth-required, failed, canceled, rejected, completed)");
  std::optional<uint64_t> expect;
  if (auto v = o.value("--expect-version")) {
    try {
      size_t used = 0;
      if (v->empty() || (*v)[0] < '0' || (*v)[0] > '9') throw std::invalid_argument("not a number");
      expect = std::stoull(*v, &used);
      if (used != v->size() || *expect == 0) throw std::invalid_argument("junk");
    } catch (const std::exception &) {
      return usage_error("--expect-version needs the version `store get` printed (a whole number >= 1), got '" +
                         *v + "'");
    }
  }
  // JSON lines when the first line is a whole Task and another follows;
  // else the input is one JSON document (read whole: one Task).
  LineReader in(fd, name);
  std::string text, second;
  size_t first_no = 0, second_no = 0;
  if (in.next(text, first_no)) {
    bool first_is_task = true;
    try {
      (void)Task::parse(text);
    } catch (const InvalidTask &) {
      first_is_task = false;
    }
    if (first_is_task && in.next(second, second_no)) {
      in.push_back(std::move(text), first_no);
      in.push_back(std::move(second), second_no);
      return put_lines(o, in);
    }
    if (!first_is_task) {
      text.push_back('\n');
      in.rest(text);
    }
  }
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r' || text.back() == ' ')) text.pop_back();
  Task t;
  std::string why = parse_a2a_task(text, t);
  if (why.empty()) why = running_as(o, t, text);
  if (!why.empty()) {
    std::cerr << "toolnexus store put: " << why << "\n";
    return 2;
  }
  auto s = resolve_store(o.positional[1]);
  const bool force = o.flag("--force");
  for (int attempt = 1;; ++attempt) {
    const std::optional<TaskRecord> current = s->get(t.id());
    SaveOptions so = put_options(o, t, current);
    if (force) {
      so.expected_version = current ? current->version : kNoVersion;  // owner/tenant from what it replaces
    } else if (expect) {
      so.expected_version = *expect;
    } else {
      so.expected_version = kNoVersion;
    }
    try {
      s->save(t, so);
      break;
    } catch (const StoreError &e) {
      if (e.code() != Status::conflict) throw;
      // --force replaces whatever is stored: another writer came between
      // the read and the save, so read again (a writer that never stops
      // wins after 100 tries).
      if (force && attempt < 100) continue;
    }
    const std::optional<TaskRecord> now = s->get(t.id());
    std::cerr << "toolnexus store put: Task '" << printable(t.id()) << "' ";
    if (!now) std::cerr << "does not exist (any more); nothing written\n";
    else if (force)
      std::cerr << "kept changing while --force tried to replace it (100 tries, now at version " << now->version
                << "); nothing written\n";
    else if (expect)
      std::cerr << "changed since it was read: it is at version " << now->version << ", not " << *expect
                << "; nothing written (`store get` it again)\n";
    else
      std::cerr << "exists (version " << now->version << "); nothing written: pass --expect-version " << now->version
                << " (the version `store get` printed) to replace it, or --force\n";
    return 1;
  }
  s->close();
  std::cout << t.id() << "\n";
  return 0;
}

int cmd_list(const Options &o) {
  if (o.positional.size() != 2) return usage_error("list takes SELECTOR");
  ListQuery q;
  q.page_size = 500;
  if (auto v = o.value("--context-id")) q.context_id = *v;
  if (auto v = o.value("--state")) {
    if (!task_state::is_known(*v))
      return usage_error("--state '" + *v + "' is not a TaskState (submitted, working, input-required, auth-required, "
                         "completed, canceled, failed, rejected, unknown)");
    q.state = *v;
  }
  if (auto v = o.value("--owner")) q.owner = *v;
  uint64_t limit = UINT64_MAX;
  if (auto v = o.value("--limit")) {
    try {
      size_t used = 0;
      if (v->empty() || (*v)[0] < '0' || (*v)[0] > '9') throw std::invalid_argument("not a number");
      limit = std::stoull(*v, &used);
      if (used != v->size()) throw std::invalid_argument("junk");
    } catch (const std::exception &) {
      return usage_error("--limit needs a whole number, got '" + *v + "'");
    }
    if (limit == 0) return usage_error("--limit must be at least 1");
  }
  const bool json = o.flag("--json");
  // The table needs the index fields only: no Task bytes are read.
  q.omit_json = !json;
  // An unreadable record is reported and skipped, not the end of the list.
  q.deliver_corrupt = true;
  auto s = resolve_store(o.positional[1], kInspect);
  uint64_t n = 0, skipped = 0;
  std::string out;  // a page of lines, written at once (an ostream insert per field cost 4x more)
  for (;;) {
    if (n >= limit) break;
    if (limit - n < q.page_size) q.page_size = static_cast<uint32_t>(limit - n);
    ListPage p = s->list(q);
    for (const auto &r : p.records) {
      std::string why = r.version == 0 ? (r.problem.empty() ? std::string("unreadable") : r.problem) : "";
      std::optional<Task> task;
      if (why.empty() && json) {
        try {
          task = r.task();
        } catch (const std::exception &e) {
          why = e.what();
        }
      }
      if (!why.empty()) {
        ++skipped;
        std::cerr << "toolnexus store list: skipped unreadable record '" << printable(r.id) << "': " << printable(why)
                  << "\n";
        continue;
      }
      if (json) {
        // One object per line: a file written by hand may span lines.
        if (r.json.find_first_of("\r\n") == std::string::npos) out += r.json;
        else out += task->to_json();
      } else {
        append_printable(out, r.id);
        out += '\t';
        if (r.state.empty()) out += '-';
        else append_printable(out, r.state);
        out += '\t';
        out += time_text(r.status_time_us);
        out += '\t';
        if (r.context_id.empty()) out += '-';
        else append_printable(out, r.context_id);
      }
      out += '\n';
      ++n;
    }
    std::cout.write(out.data(), static_cast<std::streamsize>(out.size()));
    out.clear();
    if (p.next_cursor.empty()) break;
    q.cursor = std::move(p.next_cursor);
  }
  return skipped == 0 ? 0 : 1;
}

int cmd_rm(const Options &o) {
  if (o.positional.size() != 3) return usage_error("rm takes SELECTOR ID");
  // A read-only look first, so that a mistyped selector is "no store at
  // ..." (exit 2) rather than a new empty store with no such Task.
  resolve_store(o.positional[1], kInspect)->close();
  auto s = resolve_store(o.positional[1]);
  try {
    s->remove(o.positional[2]);
  } catch (const StoreError &e) {
    if (e.code() != Status::not_found) throw;
    std::cerr << "toolnexus store rm: no Task with id '" << o.positional[2] << "' in " << o.positional[1] << "\n";
    return 1;
  }
  s->close();
  return 0;
}

int cmd_copy(const Options &o) {
  if (o.positional.size() != 3) return usage_error("copy takes FROM TO");
  if (same_location(o.positional[1], o.positional[2])) {
    std::cerr << "toolnexus store copy: FROM and TO are the same store ('" << o.positional[1] << "' and '"
              << o.positional[2] << "'); nothing copied\n";
    return 2;
  }
  auto from = resolve_store(o.positional[1], kInspect);
  auto to = resolve_store(o.positional[2]);
  ListQuery q;
  q.page_size = 500;
  q.deliver_corrupt = true;
  const uint64_t total = ::isatty(2) == 1 ? from->count(ListQuery{}) : 0;  // only the progress bar needs it
  Progress progress(total);
  // Page by page from FROM into save_stream of TO: one page and one Task
  // in memory at a time, one transaction where TO has them, else Task by
  // Task with the fsyncs grouped.
  uint64_t copied = 0, failed = 0, seen = 0;
  ListPage page;
  size_t at = 0;
  bool more = true, started = false;
  Task task;
  BatchItem item;
  item.task = &task;
  item.options.expected_version = kAnyVersion;
  auto source = [&]() -> const BatchItem * {
    started = true;
    for (;;) {
      if (at == page.records.size()) {
        if (!more) return nullptr;
        page = from->list(q);
        at = 0;
        more = !page.next_cursor.empty();
        q.cursor = std::move(page.next_cursor);
        if (page.records.empty()) continue;
      }
      const TaskRecord &r = page.records[at++];
      ++seen;
      progress.step(seen);
      // A record that is not sound (unparsable, or JSON of another id) is
      // reported, never copied: copying it would overwrite the real Task.
      const std::string why = unsound(r);
      if (!why.empty()) {
        ++failed;
        if (::isatty(2)) std::fprintf(stderr, "\n");
        std::cerr << "toolnexus store copy: cannot copy record '" << printable(r.id) << "' of " << o.positional[1]
                  << ": " << printable(why) << "\n";
        continue;
      }
      task = Task::parse(r.json);
      item.options.owner = r.owner;
      item.options.tenant = r.tenant;
      item.options.due_us = task_due_us(task);  // as a server would (the source may keep none)
      return &item;
    }
  };
  try {
    copied = to->save_stream(source, true);
  } catch (const StoreError &e) {
    if (e.code() != Status::unsupported || started) throw;
    copied = to->save_stream(source, false);
  }
  progress.finish();
  to->close();
  std::cout << "copied " << copied << " Task(s), " << failed << " unreadable\n";
  return failed == 0 ? 0 : 1;
}

int cmd_check(const Options &o) {
  if (o.positional.size() != 2) return usage_error("check takes SELECTOR");
  auto s = resolve_store(o.positional[1], kInspect);
  ListQuery q;
  q.page_size = 500;
  q.deliver_corrupt = true;
  uint64_t sound = 0, bad = 0;
  for_each_record(*s, q, [&](const TaskRecord &r) {
    std::string why = unsound(r);
    if (why.empty()) {
      ++sound;
    } else {
      ++bad;
      std::cout << "BAD " << printable(r.id) << ": " << printable(why) << "\n";
    }
  });
  std::cout << sound << " sound, " << bad << " bad\n";
  return bad == 0 ? 0 : 1;
}

}  // namespace store_detail

using namespace store_detail;

int run_store(int argc, char **argv) {
  // gc has repeatable options of its own (--state, --retention).
  if (argc >= 2 && std::string(argv[1]) == "gc") return run_gc(argc - 1, argv + 1);
  if (argc >= 2 && std::string(argv[1]) == "rekey") return run_rekey(argc - 1, argv + 1);
  Options o(argc, argv, {"--json", "--force", "--resume"},
            {"--context-id", "--state", "--owner", "--tenant", "--limit", "--expect-version", "--running-as"});
  if (o.help) {
    std::cout << kHelp;
    return 0;
  }
  if (!o.error.empty()) return usage_error(o.error);
  if (o.positional.empty()) return usage_error("missing COMMAND");
  const std::string &cmd = o.positional[0];
  try {
    if (cmd == "get") return cmd_get(o);
    if (cmd == "put") return cmd_put(o);
    if (cmd == "list") return cmd_list(o);
    if (cmd == "rm") return cmd_rm(o);
    if (cmd == "copy") return cmd_copy(o);
    if (cmd == "check") return cmd_check(o);
  } catch (const std::invalid_argument &e) {
    // A bad selector, often "no plugin serves X" because the plugin file was
    // refused: say why each refused file was, as serve does.
    std::cerr << "toolnexus store " << cmd << ": " << e.what() << "\n";
    for (const PluginFailure &f : PluginRegistry::global().failures())
      std::cerr << "toolnexus store " << cmd << ": " << plugin_failure_text(f) << "\n";
    return 2;
  } catch (const std::exception &e) {
    std::cerr << "toolnexus store " << cmd << ": " << e.what() << "\n";
    return 2;
  }
  return usage_error("unknown command '" + cmd + "'");
}

}  // namespace toolnexus::cli

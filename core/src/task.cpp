// The Task value type: parsing, validation, serialisation, timestamps.
#include "toolnexus/task.hpp"

#include "toolnexus/task_store.hpp"

#include <Poco/DateTime.h>
#include <Poco/DateTimeFormat.h>
#include <Poco/DateTimeParser.h>
#include <Poco/Exception.h>
#include <Poco/Timestamp.h>
#include <rapidjson/encodings.h>
#include <rapidjson/error/en.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include <chrono>
#include <cstring>
#include <ctime>

namespace toolnexus {

namespace task_state {
bool is_terminal(std::string_view s) noexcept {
  return s == kCompleted || s == kCanceled || s == kFailed || s == kRejected;
}
bool is_interrupted(std::string_view s) noexcept { return s == kInputRequired || s == kAuthRequired; }
bool is_known(std::string_view s) noexcept {
  return s == kSubmitted || s == kWorking || is_interrupted(s) || is_terminal(s) || s == kUnknown;
}
}  // namespace task_state

namespace {

std::string_view member_string(const rapidjson::Value &obj, const char *name) noexcept {
  if (!obj.IsObject()) return {};
  auto it = obj.FindMember(name);
  if (it == obj.MemberEnd() || !it->value.IsString()) return {};
  return std::string_view(it->value.GetString(), it->value.GetStringLength());
}

// Deepest nesting of objects/arrays in `json`, stopping early past `limit`.
// Linear and non-recursive; strings (with escapes) are skipped.
int nesting_depth(std::string_view json, int limit) noexcept {
  int depth = 0, max_depth = 0;
  bool in_string = false, escaped = false;
  for (char c : json) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '[' || c == '{') {
      if (++depth > max_depth) {
        max_depth = depth;
        if (max_depth > limit) return max_depth;
      }
    } else if (c == ']' || c == '}') --depth;
  }
  return max_depth;
}

struct NullOutput {
  using Ch = char;
  void Put(char) noexcept {}
};

}  // namespace

namespace {

// Bytes for rapidjson::UTF8<>::Validate, '\0' past the end (which no
// sequence continues with). Not RapidJSON's EncodedInputStream over a
// MemoryStream: it skips the bytes EF, BB, BF where it starts (a byte order
// mark's, each alone too), so is_valid_utf8("\xbb") was true.
struct ByteStream {
  using Ch = char;
  const char *p;
  const char *end;
  char Take() noexcept { return p == end ? '\0' : *p++; }
};

// The offset of the first byte of `s` that starts no valid UTF-8 sequence,
// or npos. Runs of ASCII are skipped eight bytes at a time (stored Tasks
// are mostly ASCII), the rest decoded by RapidJSON's validator.
std::size_t utf8_error_at(std::string_view s) noexcept {
  std::size_t i = 0;
  while (i < s.size()) {
    while (i + 8 <= s.size()) {
      uint64_t word;
      std::memcpy(&word, s.data() + i, 8);
      if ((word & 0x8080808080808080ULL) != 0) break;
      i += 8;
    }
    while (i < s.size() && static_cast<unsigned char>(s[i]) < 0x80) ++i;
    if (i == s.size()) break;
    // A non-ASCII byte: validate sequences until ASCII again.
    ByteStream is{s.data() + i, s.data() + s.size()};
    NullOutput out;
    while (is.p != is.end && static_cast<unsigned char>(*is.p) >= 0x80) {
      const std::size_t at = static_cast<std::size_t>(is.p - s.data());
      if (!rapidjson::UTF8<>::Validate(is, out)) return at;
    }
    i = static_cast<std::size_t>(is.p - s.data());
  }
  return std::string_view::npos;
}

}  // namespace

bool is_valid_utf8(std::string_view s) noexcept { return utf8_error_at(s) == std::string_view::npos; }

Task::Task() { doc_.SetObject(); }

Task::Task(const Task &other) { doc_.CopyFrom(other.doc_, doc_.GetAllocator()); }

Task &Task::operator=(const Task &other) {
  if (this != &other) {
    rapidjson::Document fresh;
    fresh.CopyFrom(other.doc_, fresh.GetAllocator());
    doc_.Swap(fresh);
  }
  return *this;
}

std::size_t lone_surrogate_escape(std::string_view json) noexcept {
  if (json.find("\\u") == std::string_view::npos) return std::string_view::npos;  // the common case
  const auto hex4 = [&](std::size_t at, unsigned &code) {
    if (at + 4 > json.size()) return false;
    code = 0;
    for (std::size_t i = at; i < at + 4; ++i) {
      const char c = json[i];
      const unsigned d = c >= '0' && c <= '9'   ? static_cast<unsigned>(c - '0')
                         : c >= 'a' && c <= 'f' ? static_cast<unsigned>(c - 'a' + 10)
                         : c >= 'A' && c <= 'F' ? static_cast<unsigned>(c - 'A' + 10)
                                                : 16u;
      if (d == 16u) return false;
      code = code * 16 + d;
    }
    return true;
  };
  bool in_string = false;
  for (std::size_t i = 0; i < json.size(); ++i) {
    const char c = json[i];
    if (!in_string) {
      in_string = c == '"';
      continue;
    }
    if (c == '"') {
      in_string = false;
    } else if (c == '\\') {
      if (i + 1 < json.size() && json[i + 1] == 'u') {
        unsigned code = 0;
        if (!hex4(i + 2, code)) return std::string_view::npos;  // not JSON
        if (code >= 0xDC00 && code <= 0xDFFF) return i;          // a low one first: alone
        if (code >= 0xD800 && code <= 0xDBFF) {
          unsigned low = 0;
          if (i + 7 >= json.size() || json[i + 6] != '\\' || json[i + 7] != 'u' || !hex4(i + 8, low) ||
              low < 0xDC00 || low > 0xDFFF)
            return i;
          i += 6;  // the pair's low half
        }
        i += 5;
      } else {
        ++i;  // the escaped character
      }
    }
  }
  return std::string_view::npos;
}

Task Task::parse(std::string_view json) {
  if (nesting_depth(json, kMaxTaskDepth) > kMaxTaskDepth)
    throw InvalidTask("task JSON nests deeper than " + std::to_string(kMaxTaskDepth) + " levels");
  Task t;
  // Full precision: the default is not exact, and a number changed on
  // every save and load (2.222222222222222e57 -> ...24e57).
  t.doc_.Parse<rapidjson::kParseValidateEncodingFlag | rapidjson::kParseIterativeFlag |
               rapidjson::kParseFullPrecisionFlag>(json.data(), json.size());
  if (t.doc_.HasParseError()) {
    throw InvalidTask(std::string("task is not valid JSON: ") +
                      rapidjson::GetParseError_En(t.doc_.GetParseError()) + " at byte " +
                      std::to_string(t.doc_.GetErrorOffset()));
  }
  // Else to_json() would refuse the Task parse() accepted.
  if (const std::size_t at = lone_surrogate_escape(json); at != std::string_view::npos)
    throw InvalidTask("task is not valid JSON: a \\u escape of a lone surrogate (U+D800..U+DFFF), which is "
                      "no character, at byte " + std::to_string(at));
  t.validate();
  return t;
}

namespace {

// Forwards a RapidJSON reader's events to `out` (a document being built),
// stopping the parse at nesting deeper than kMaxTaskDepth. RapidJSON's
// recursive parser calls StartObject/StartArray before it descends, so its
// recursion stays as shallow as the limit: no pre-scan of the bytes needed.
template <class Out>
struct DepthLimit {
  Out &out;
  int depth = 0;
  bool too_deep = false;
  bool open() {
    too_deep = ++depth > kMaxTaskDepth;
    return !too_deep;
  }
  bool Null() { return out.Null(); }
  bool Bool(bool b) { return out.Bool(b); }
  bool Int(int i) { return out.Int(i); }
  bool Uint(unsigned i) { return out.Uint(i); }
  bool Int64(int64_t i) { return out.Int64(i); }
  bool Uint64(uint64_t i) { return out.Uint64(i); }
  bool Double(double d) { return out.Double(d); }
  bool RawNumber(const char *s, rapidjson::SizeType n, bool copy) { return out.RawNumber(s, n, copy); }
  bool String(const char *s, rapidjson::SizeType n, bool copy) { return out.String(s, n, copy); }
  bool Key(const char *s, rapidjson::SizeType n, bool copy) { return out.Key(s, n, copy); }
  bool StartObject() { return open() && out.StartObject(); }
  bool EndObject(rapidjson::SizeType n) {
    --depth;
    return out.EndObject(n);
  }
  bool StartArray() { return open() && out.StartArray(); }
  bool EndArray(rapidjson::SizeType n) {
    --depth;
    return out.EndArray(n);
  }
};

bool json_blank(char c) noexcept { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

}  // namespace

void Task::parse_stored_json(std::string_view json, bool in_place, rapidjson::Document &doc) {
  // What guards the output is checked on every read, cheaply: UTF-8 (a
  // word-at-a-time scan of the ASCII), lone surrogate escapes, syntax and
  // depth (by the parse itself). What the host checked before the save
  // and a parse cannot notice for free is trusted: see task.hpp.
  if (const std::size_t at = utf8_error_at(json); at != std::string_view::npos)
    throw InvalidTask("task is not valid JSON: bytes that are not UTF-8 at byte " + std::to_string(at));
  if (const std::size_t at = lone_surrogate_escape(json); at != std::string_view::npos)
    throw InvalidTask("task is not valid JSON: a \\u escape of a lone surrogate (U+D800..U+DFFF), which is "
                      "no character, at byte " + std::to_string(at));
  rapidjson::ParseResult result;
  bool too_deep = false;
  std::size_t end = json.size();
  auto generate = [&](rapidjson::Document &handler) {
    DepthLimit<rapidjson::Document> limit{handler};
    rapidjson::Reader reader;
    if (in_place) {
      // Strings are decoded into the bytes and point there; a NUL ends
      // the text, so the parse stops at the value and what follows it is
      // checked below.
      rapidjson::InsituStringStream is(const_cast<char *>(json.data()));
      result = reader.Parse<rapidjson::kParseInsituFlag | rapidjson::kParseFullPrecisionFlag |
                            rapidjson::kParseStopWhenDoneFlag>(is, limit);
      end = is.Tell();
    } else {
      rapidjson::MemoryStream ms(json.data(), json.size());
      result = reader.Parse<rapidjson::kParseFullPrecisionFlag | rapidjson::kParseStopWhenDoneFlag>(ms, limit);
      end = ms.Tell();
    }
    too_deep = limit.too_deep;
    return !result.IsError();
  };
  doc.Populate(generate);
  if (too_deep)
    throw InvalidTask("task JSON nests deeper than " + std::to_string(kMaxTaskDepth) + " levels");
  if (result.IsError())
    throw InvalidTask(std::string("task is not valid JSON: ") + rapidjson::GetParseError_En(result.Code()) +
                      " at byte " + std::to_string(result.Offset()));
  for (std::size_t p = end; p < json.size(); ++p)
    if (!json_blank(json[p]))
      throw InvalidTask("task is not valid JSON: bytes after the value at byte " + std::to_string(p));
  check_fields(doc, false);
}

Task Task::parse_stored(std::string_view json) {
  Task t;
  parse_stored_json(json, false, t.doc_);
  return t;
}

Task Task::from_document(rapidjson::Document &&doc) {
  Task t;
  t.doc_.Swap(doc);
  t.validate();
  return t;
}

void Task::validate() const { check_fields(doc_, true); }

void Task::check_fields(const rapidjson::Value &d, bool check_time) {
  if (!d.IsObject()) throw InvalidTask("task must be a JSON object");
  auto id = d.FindMember("id");
  if (id == d.MemberEnd()) throw InvalidTask("task has no \"id\"");
  if (!id->value.IsString()) throw InvalidTask("task \"id\" must be a string");
  std::string_view idv(id->value.GetString(), id->value.GetStringLength());
  if (idv.empty()) throw InvalidTask("task \"id\" must not be empty");
  if (idv.find('\0') != std::string_view::npos) throw InvalidTask("task \"id\" must not contain NUL");
  auto ctx = d.FindMember("contextId");
  if (ctx != d.MemberEnd() && !ctx->value.IsString())
    throw InvalidTask("task \"contextId\" must be a string");
  auto st = d.FindMember("status");
  if (st != d.MemberEnd()) {
    if (!st->value.IsObject()) throw InvalidTask("task \"status\" must be an object");
    auto state = st->value.FindMember("state");
    if (state != st->value.MemberEnd() && !state->value.IsString())
      throw InvalidTask("task \"status.state\" must be a string");
    if (state != st->value.MemberEnd() &&
        !task_state::is_known(std::string_view(state->value.GetString(), state->value.GetStringLength())))
      throw InvalidTask("task \"status.state\" '" + std::string(state->value.GetString(), state->value.GetStringLength()) +
                        "' is not a TaskState (submitted, working, input-required, auth-required, completed, "
                        "canceled, failed, rejected, unknown)");
    auto ts = st->value.FindMember("timestamp");
    if (check_time && ts != st->value.MemberEnd()) {
      int64_t us = 0;
      if (!ts->value.IsString() ||
          !parse_timestamp(std::string_view(ts->value.GetString(), ts->value.GetStringLength()), us))
        throw InvalidTask("task \"status.timestamp\" must be an RFC 3339 time such as "
                          "\"2026-01-31T12:00:00Z\"");
    }
  }
}

std::string Task::to_json() const {
  rapidjson::StringBuffer buf;
  rapidjson::Writer<rapidjson::StringBuffer, rapidjson::UTF8<>, rapidjson::UTF8<>,
                    rapidjson::CrtAllocator, rapidjson::kWriteValidateEncodingFlag>
      w(buf);
  if (!doc_.Accept(w)) throw InvalidTask("task holds a string that is not valid UTF-8");
  std::string out(buf.GetString(), buf.GetSize());
  // What parse() would refuse must not be written: a store would hold a Task
  // it can never read back.
  if (nesting_depth(out, kMaxTaskDepth) > kMaxTaskDepth)
    throw InvalidTask("task JSON nests deeper than " + std::to_string(kMaxTaskDepth) + " levels");
  return out;
}

std::string_view Task::id() const noexcept { return member_string(doc_, "id"); }
std::string_view Task::context_id() const noexcept { return member_string(doc_, "contextId"); }

std::string_view Task::state() const noexcept {
  if (!doc_.IsObject()) return {};
  auto st = doc_.FindMember("status");
  if (st == doc_.MemberEnd()) return {};
  return member_string(st->value, "state");
}

int64_t Task::status_time_us() const noexcept {
  if (!doc_.IsObject()) return kNoTime;
  auto st = doc_.FindMember("status");
  if (st == doc_.MemberEnd()) return kNoTime;
  std::string_view ts = member_string(st->value, "timestamp");
  int64_t us = kNoTime;
  if (ts.empty() || !parse_timestamp(ts, us)) return kNoTime;
  return us;
}

void Task::set_status(std::string_view state, rapidjson::Value message, int64_t time_us) {
  auto &a = doc_.GetAllocator();
  rapidjson::Value status(rapidjson::kObjectType);
  status.AddMember("state", rapidjson::Value(state.data(), static_cast<rapidjson::SizeType>(state.size()), a), a);
  if (!message.IsNull()) status.AddMember("message", message, a);
  std::string ts = format_timestamp(time_us == kNoTime ? now_us() : time_us);
  status.AddMember("timestamp", rapidjson::Value(ts.c_str(), static_cast<rapidjson::SizeType>(ts.size()), a), a);
  auto it = doc_.FindMember("status");
  if (it != doc_.MemberEnd()) it->value = status;
  else doc_.AddMember("status", status, a);
}

Task TaskRecord::task() const {
  if (!problem.empty()) throw StoreError(Status::corrupt, "stored task '" + id + "' is unreadable: " + problem);
  Task t;
  try {
    t = Task::parse(json);
  } catch (const InvalidTask &e) {
    throw StoreError(Status::corrupt, "stored task '" + id + "' is unreadable: " + e.what());
  }
  // A record whose JSON names another Task must never be served as this one.
  if (t.id() != id)
    throw StoreError(Status::corrupt, "stored task '" + id + "' holds the JSON of task '" + std::string(t.id()) + "'");
  return t;
}

Task TaskRecord::a2a_task() const {
  Task t;
  if (version == 0) {  // not delivered by a store as sound: every check
    t = task();
  } else {
    if (!problem.empty()) throw StoreError(Status::corrupt, "stored task '" + id + "' is unreadable: " + problem);
    try {
      t = Task::parse_stored(json);
    } catch (const InvalidTask &e) {
      throw StoreError(Status::corrupt, "stored task '" + id + "' is unreadable: " + e.what());
    }
  }
  check_served(t.json());
  return t;
}

void TaskRecord::check_served(const rapidjson::Value &doc) const {
  // A record whose JSON names another Task must never be served as this one.
  const auto it = doc.FindMember("id");
  const std::string_view json_id(it->value.GetString(), it->value.GetStringLength());  // checked: a string
  if (json_id != id)
    throw StoreError(Status::corrupt, "stored task '" + id + "' holds the JSON of task '" + std::string(json_id) + "'");
  if (const std::string why = a2a_task_problem(doc); !why.empty())
    throw StoreError(Status::corrupt, "stored task '" + id + "' is not a valid A2A Task: " + why);
}

void TaskRecord::a2a_task_in_place(rapidjson::Document &doc) {
  if (version == 0) {
    const Task t = a2a_task();
    doc.CopyFrom(t.json(), doc.GetAllocator());
    return;
  }
  if (!problem.empty()) throw StoreError(Status::corrupt, "stored task '" + id + "' is unreadable: " + problem);
  try {
    Task::parse_stored_json(json, true, doc);
  } catch (const InvalidTask &e) {
    throw StoreError(Status::corrupt, "stored task '" + id + "' is unreadable: " + e.what());
  }
  check_served(doc);
}

std::string a2a_task_problem(const Task &t) { return a2a_task_problem(t.json()); }

std::string a2a_task_problem(const rapidjson::Value &d) {
  std::string out;
  auto add = [&](const char *why) { out += (out.empty() ? "" : "; ") + std::string(why); };
  if (!d.IsObject()) return "a Task must be a JSON object";
  auto ctx = d.FindMember("contextId");
  if (ctx == d.MemberEnd() || !ctx->value.IsString() || ctx->value.GetStringLength() == 0)
    add("\"contextId\" is required (a non-empty string)");
  auto st = d.FindMember("status");
  if (st == d.MemberEnd() || !st->value.IsObject() || !st->value.HasMember("state"))
    add("\"status\" with a \"state\" is required, e.g. {\"state\":\"submitted\"}");
  auto kind = d.FindMember("kind");
  if (kind != d.MemberEnd() &&
      (!kind->value.IsString() ||
       std::string_view(kind->value.GetString(), kind->value.GetStringLength()) != "task"))
    add("\"kind\" must be \"task\"");
  return out;
}

int64_t now_us() noexcept {
  using namespace std::chrono;
  return duration_cast<microseconds>(system_clock::now().time_since_epoch()).count();
}

std::string format_timestamp(int64_t time_us) {
  // The calendar conversion is libc's gmtime_r, once per day a thread sees
  // (lists are in time order, so most calls hit the cached date); only the
  // digits are written here. Poco's DateTimeFormatter took ~2,700
  // instructions a call (a floating-point Julian day and a format-string
  // interpreter), a fifth of `toolnexus store list` at 50,000 Tasks. Years
  // outside 0000..9999 (no RFC 3339 form; "0000-01-01T00:00:00+01:00" is
  // one, in UTC) are written as ECMAScript's expanded years, sign and six
  // digits ("-000001-12-31T23:00:00.000000Z"), which Date.parse reads.
  int64_t secs = time_us / 1000000;
  int64_t micros = time_us % 1000000;
  if (micros < 0) {
    micros += 1000000;
    --secs;
  }
  int64_t day = secs / 86400;
  int64_t sod = secs % 86400;
  if (sod < 0) {
    sod += 86400;
    --day;
  }
  thread_local int64_t cached_day = INT64_MIN;
  thread_local bool cached_ok = false;
  thread_local char cached_date[13];  // YYYY-MM-DD or ±YYYYYY-MM-DD
  thread_local size_t cached_len = 0;
  auto put = [](char *out, int width, int64_t v) {
    for (int i = width - 1; i >= 0; --i, v /= 10) out[i] = static_cast<char>('0' + v % 10);
  };
  if (day != cached_day) {
    const std::time_t t = static_cast<std::time_t>(day * 86400);
    std::tm tm{};
    // int64 microseconds span +-292,277 years: gmtime_r always answers.
    cached_ok = ::gmtime_r(&t, &tm) != nullptr;
    if (cached_ok) {
      const int64_t year = int64_t{tm.tm_year} + 1900;
      char *d = cached_date;
      if (year >= 0 && year <= 9999) {
        put(d, 4, year);
        d += 4;
      } else {
        *d++ = year < 0 ? '-' : '+';
        put(d, 6, year < 0 ? -year : year);
        d += 6;
      }
      *d++ = '-';
      put(d, 2, tm.tm_mon + 1);
      d[2] = '-';
      put(d + 3, 2, tm.tm_mday);
      cached_len = static_cast<size_t>(d + 5 - cached_date);
    }
    cached_day = day;
  }
  if (!cached_ok) return std::to_string(time_us) + "us";  // not reached: see above
  char out[30];  // YYYY-MM-DDTHH:MM:SS.ffffffZ, or with a ±YYYYYY year
  std::memcpy(out, cached_date, cached_len);
  char *o = out + cached_len;
  o[0] = 'T';
  put(o + 1, 2, sod / 3600);
  o[3] = ':';
  put(o + 4, 2, sod / 60 % 60);
  o[6] = ':';
  put(o + 7, 2, sod % 60);
  o[9] = '.';
  put(o + 10, 6, micros);
  o[16] = 'Z';
  return std::string(out, cached_len + 17);
}

bool parse_timestamp(std::string_view text, int64_t &time_us) noexcept {
  // Shape check first: Poco's parser is lenient, RFC 3339 is not.
  // YYYY-MM-DDTHH:MM:SS[.frac](Z|+HH:MM|-HH:MM)
  auto digits = [&](size_t pos, size_t n) {
    if (pos + n > text.size()) return false;
    for (size_t i = pos; i < pos + n; ++i)
      if (text[i] < '0' || text[i] > '9') return false;
    return true;
  };
  if (text.size() < 20 || !digits(0, 4) || text[4] != '-' || !digits(5, 2) || text[7] != '-' ||
      !digits(8, 2) || (text[10] != 'T' && text[10] != 't') || !digits(11, 2) || text[13] != ':' ||
      !digits(14, 2) || text[16] != ':' || !digits(17, 2))
    return false;
  size_t p = 19;
  if (p < text.size() && text[p] == '.') {
    size_t start = ++p;
    while (p < text.size() && text[p] >= '0' && text[p] <= '9') ++p;
    if (p == start) return false;
  }
  if (p >= text.size()) return false;
  if (text[p] == 'Z' || text[p] == 'z') {
    if (p + 1 != text.size()) return false;
  } else if (text[p] == '+' || text[p] == '-') {
    if (p + 6 != text.size() || !digits(p + 1, 2) || text[p + 3] != ':' || !digits(p + 4, 2)) return false;
  } else {
    return false;
  }
  // Every field in its range (second 60, hour 24 and the like are left to
  // Poco below, which decides them as it always did): the arithmetic here
  // gives what Poco gives, without its format-string parser (most of
  // the cost of a v1.0 view's status timestamp).
  {
    const auto num = [&](size_t pos, size_t n) {
      int v = 0;
      for (size_t i = pos; i < pos + n; ++i) v = v * 10 + (text[i] - '0');
      return v;
    };
    const int year = num(0, 4), month = num(5, 2), day = num(8, 2);
    const int hour = num(11, 2), minute = num(14, 2), second = num(17, 2);
    const bool leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
    static constexpr int kDays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    int offset_s = 0;
    bool offset_ok = true;
    if (text[p] == '+' || text[p] == '-') {
      const int oh = num(p + 1, 2), om = num(p + 4, 2);
      offset_ok = oh <= 23 && om <= 59;
      offset_s = (text[p] == '-' ? -1 : 1) * (oh * 3600 + om * 60);
    }
    if (month >= 1 && month <= 12 && day >= 1 && day <= kDays[month - 1] + (month == 2 && leap ? 1 : 0) &&
        hour <= 23 && minute <= 59 && second <= 59 && offset_ok) {
      int64_t micros = 0;  // the first six digits of the fraction, Poco's way
      if (text[19] == '.') {
        size_t i = 20;
        for (int k = 0; k < 6; ++k, ++i) micros = micros * 10 + (i < p ? text[i] - '0' : 0);
      }
      // Days from 1970-01-01 to the date, proleptic Gregorian (as Poco): March-based years make February last.
      const int64_t y = year - (month <= 2 ? 1 : 0);
      const int64_t era = (y >= 0 ? y : y - 399) / 400;
      const int64_t yoe = y - era * 400;
      const int64_t doy = (153 * (month > 2 ? month - 3 : month + 9) + 2) / 5 + day - 1;
      const int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
      const int64_t days = era * 146097 + doe - 719468;
      time_us = ((days * 86400 + hour * 3600 + minute * 60 + second) - offset_s) * 1000000 + micros;
      return true;
    }
  }
  try {
    int tzd = 0;
    Poco::DateTime dt;
    std::string s(text);
    if (s[10] == 't') s[10] = 'T';
    if (s.back() == 'z') s.back() = 'Z';
    if (!Poco::DateTimeParser::tryParse(Poco::DateTimeFormat::ISO8601_FRAC_FORMAT, s, dt, tzd))
      return false;
    const int month = std::stoi(s.substr(5, 2)), day = std::stoi(s.substr(8, 2));
    if (dt.month() != month || dt.day() != day || dt.hour() > 23 || std::stoi(s.substr(17, 2)) > 60)
      return false;
    time_us = dt.timestamp().epochMicroseconds() - static_cast<int64_t>(tzd) * 1000000;
    return true;
  } catch (...) {
    return false;
  }
}

}  // namespace toolnexus

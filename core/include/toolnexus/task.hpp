// toolnexus/task.hpp: the Task value type (A2A v0.3 JSON shape) and the
// record a store keeps for it.
//
// Where a Task is parsed: Task::parse(). Where it is turned back into bytes:
// Task::to_json(). Both keep every field, known or not, so a Task saved and
// read back is the same JSON (object member order included).
#ifndef TOOLNEXUS_TASK_HPP
#define TOOLNEXUS_TASK_HPP

#include <rapidjson/document.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

namespace toolnexus {

/// Thrown when bytes or a document are not a valid Task: not JSON, not
/// UTF-8, not an object, no non-empty string "id", nesting too deep. The
/// message says what and where (byte offset or member name).
class InvalidTask : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// "No status timestamp" for status_time_us (same value as TNX_TIME_NONE).
inline constexpr int64_t kNoTime = INT64_MIN;

/// Maximum JSON nesting depth Task::parse() accepts (objects + arrays).
inline constexpr int kMaxTaskDepth = 64;

/// A2A Task states (TaskState, spec v0.3 section 6.3) in their v0.3 spelling.
namespace task_state {
inline constexpr std::string_view kSubmitted = "submitted";
inline constexpr std::string_view kWorking = "working";
inline constexpr std::string_view kInputRequired = "input-required";
inline constexpr std::string_view kAuthRequired = "auth-required";
inline constexpr std::string_view kCompleted = "completed";
inline constexpr std::string_view kCanceled = "canceled";
inline constexpr std::string_view kFailed = "failed";
inline constexpr std::string_view kRejected = "rejected";
inline constexpr std::string_view kUnknown = "unknown";
/// completed, canceled, failed, rejected: a Task in one never changes again.
bool is_terminal(std::string_view state) noexcept;
/// input-required, auth-required: the Task waits for the client.
bool is_interrupted(std::string_view state) noexcept;
/// One of the nine names above.
bool is_known(std::string_view state) noexcept;
}  // namespace task_state

/// A Task: a JSON object that has at least a non-empty string "id".
///
/// Owns its rapidjson::Document. Copyable (deep copy) and movable. Not
/// thread-safe: one Task object must not be used by two threads at once
/// (distinct Task objects are independent).
class Task {
 public:
  /// An empty object `{}` (not yet valid: validate() throws until an id is set).
  Task();
  Task(const Task &other);
  Task &operator=(const Task &other);
  Task(Task &&) noexcept = default;
  Task &operator=(Task &&) noexcept = default;

  /// Parses UTF-8 JSON bytes into a Task and validate()s it.
  /// Throws InvalidTask: not JSON (with byte offset and RapidJSON's reason),
  /// invalid UTF-8, nesting deeper than kMaxTaskDepth, or validate() fails.
  static Task parse(std::string_view json);

  /// Parses the JSON of a record a store delivered as sound (a version,
  /// no problem) for serving: TaskRecord::a2a_task(). The host checked
  /// these bytes with parse() before the save, so only what guards the
  /// output is checked again, at a fraction of parse()'s cost (the trust
  /// line, docs/architecture.md "Reads: what a stored record is trusted
  /// for"):
  ///  - checked: one JSON value and nothing after it but blanks, UTF-8
  ///    (an eight-bytes-at-a-time scan of the ASCII), no lone surrogate
  ///    escape, nesting at most kMaxTaskDepth (counted by the parse,
  ///    which stops there), and the rules of validate() but one;
  ///  - trusted: "status.timestamp" is an RFC 3339 time (a stored one that
  ///    is not is served as it is: status_time_us() is then kNoTime).
  /// So whatever a store returns, a Task parse_stored() accepts is written
  /// back as valid JSON. Throws InvalidTask (what and where) otherwise.
  static Task parse_stored(std::string_view json);

  /// Takes ownership of a document and validate()s it; throws InvalidTask.
  static Task from_document(rapidjson::Document &&doc);

  /// Checks the rules a stored Task must meet: an object; "id" a non-empty
  /// string without NUL; "contextId" absent or a string; "status" absent or
  /// an object whose "state" (if present) is a TaskState name and whose "timestamp"
  /// (if present) is an RFC 3339 time. Throws InvalidTask naming the field.
  void validate() const;

  /// validate()'s rules on `doc` (any JSON value); `check_time` false
  /// leaves "status.timestamp" unchecked (parse_stored()). Throws InvalidTask.
  static void check_fields(const rapidjson::Value &doc, bool check_time);

  /// The JSON, for reading and editing. Allocate new values with
  /// allocator(). Valid while the Task lives.
  rapidjson::Document &json() noexcept { return doc_; }
  const rapidjson::Document &json() const noexcept { return doc_; }
  rapidjson::Document::AllocatorType &allocator() noexcept { return doc_.GetAllocator(); }

  /// Compact UTF-8 JSON. Throws InvalidTask if a string holds invalid UTF-8
  /// or the JSON nests deeper than kMaxTaskDepth (parse() would refuse it).
  std::string to_json() const;

  /// "id", or "" when absent. View valid until the Task is modified.
  std::string_view id() const noexcept;
  /// "contextId", or "".
  std::string_view context_id() const noexcept;
  /// "status.state", or "".
  std::string_view state() const noexcept;
  /// "status.timestamp" in microseconds since the Unix epoch (UTC), or
  /// kNoTime when absent or unparsable.
  int64_t status_time_us() const noexcept;

  /// Sets "status" to {"state", "timestamp": now (or `time_us`)} and keeps
  /// `message` (a Message object, moved in) when not null. Other members of
  /// "status" are dropped: a new status replaces the old one (spec 6.2).
  void set_status(std::string_view state, rapidjson::Value message = rapidjson::Value(),
                  int64_t time_us = kNoTime);

 private:
  friend struct TaskRecord;
  // parse_stored() into `doc` (its allocator). `in_place`: RapidJSON's
  // in-situ parse, which decodes the strings into `json`'s bytes (which
  // must be followed by a NUL, as std::string's are) and points `doc`'s
  // strings there.
  static void parse_stored_json(std::string_view json, bool in_place, rapidjson::Document &doc);

  rapidjson::Document doc_;
};

/// What a store keeps for one Task: the index fields (derived from the JSON
/// by TaskStore::save) plus the JSON bytes and the version. Plain value type.
struct TaskRecord {
  std::string id;
  std::string context_id;
  std::string state;
  int64_t status_time_us = kNoTime;
  std::string owner;
  std::string tenant;
  /// The Task's JSON bytes exactly as saved (empty when a list asked to omit it).
  std::string json;
  /// 1 after the first save, +1 on each save.
  uint64_t version = 0;
  /// Only on a record a list delivered because of ListQuery::deliver_corrupt:
  /// the store's reason it cannot be decoded, naming where (ABI 1.2; "" from
  /// older plugins, whose unreadable records show only by their JSON).
  std::string problem;
  /// The due time saved with it (SaveOptions::due_us), µs since the epoch,
  /// or kNoTime (none, or a store without TNX_CAP_DUE_INDEX).
  int64_t due_us = kNoTime;

  /// Parses `json`. Throws StoreError(Status::corrupt) naming the id when the
  /// record has a problem, or the stored bytes are not a valid Task or are
  /// the JSON of another id.
  Task task() const;

  /// task(), for serving: also throws StoreError(Status::corrupt) "stored
  /// task 'ID' is not a valid A2A Task: WHY" when a2a_task_problem() finds
  /// something missing. What a server answers and streams goes through here,
  /// so a record the store took (it asks only for an id) but `store put`
  /// would refuse is treated as unreadable, never served without a status.
  /// A record with a version (one a store delivered as sound) is parsed by
  /// Task::parse_stored(), which trusts what the host checked before the
  /// save; one without (version 0: built by hand, or delivered by
  /// deliver_corrupt) gets every check of task(). Thread-safe on distinct
  /// records.
  Task a2a_task() const;

  /// a2a_task() without a Task: parses `json` in place (RapidJSON in-situ)
  /// into `doc`, allocating in `doc`'s allocator, with the same checks and
  /// errors. Afterwards `json` holds scratch bytes that `doc`'s strings
  /// point into: keep the record alive and unmodified while `doc` is used,
  /// and read its JSON through `doc` only. For ListTasks, which writes each
  /// record of a page once (no copy of its strings, and `doc` may reuse
  /// one allocator for a whole page). On a throw `doc` is unspecified.
  void a2a_task_in_place(rapidjson::Document &doc);

 private:
  // The checks a2a_task() adds to a parsed record (`doc` passed
  // Task::check_fields): its "id" is this record's, and a2a_task_problem().
  void check_served(const rapidjson::Value &doc) const;
};

/// "" when `t` has what A2A requires of a Task that is served (v0.3 section
/// 6.1 Task, v1.0 section 4.1.1: "id", "contextId" a non-empty string,
/// "status" an object with a "state"; "kind", when present, "task", since
/// v1.0 has no kind); otherwise every problem found, joined by "; ", e.g.
/// "\"status\" with a \"state\" is required, e.g. {\"state\":\"submitted\"}".
/// Task::validate() is the store's contract (an object with an id); this is
/// the rule of `toolnexus store put`, `store check` and the server. Pure.
std::string a2a_task_problem(const Task &t);

/// a2a_task_problem() of a Task's JSON (any value; a non-object is a problem).
std::string a2a_task_problem(const rapidjson::Value &task_json);

/// Current time in microseconds since the Unix epoch (UTC).
int64_t now_us() noexcept;

/// Formats microseconds since the epoch as RFC 3339 UTC with microseconds:
/// "2026-11-29T20:58:33.123456Z" (27 characters) for years 0000..9999; other
/// years (which RFC 3339 cannot write) as ECMAScript's expanded years, sign
/// and six digits: "-000001-12-31T23:00:00.000000Z" (30 characters). Never
/// throws except std::bad_alloc; thread-safe (a per-thread day cache).
std::string format_timestamp(int64_t time_us);

/// Parses an ISO 8601 / RFC 3339 time ("2026-11-29T20:58:33Z",
/// "...33.5+01:00", fractions up to nanoseconds) to microseconds since the
/// epoch (UTC). Returns false on anything else. Thread-safe.
bool parse_timestamp(std::string_view text, int64_t &time_us) noexcept;

/// True when `s` is valid UTF-8 (RFC 3629: no overlongs, no surrogates).
bool is_valid_utf8(std::string_view s) noexcept;

/// The byte offset in the JSON text `json` of the first "\u" escape of a
/// lone surrogate (U+D800..U+DFFF not in a high-low pair), or
/// std::string_view::npos when there is none. Such an escape is no
/// character (RFC 8259 section 8.2), yet RapidJSON 1.1 decodes a lone low
/// one ("\udc00") into bytes that are not UTF-8, even with
/// kParseValidateEncodingFlag: callers that parse JSON and keep its
/// strings refuse it. Reads escapes inside strings only; `json` should be
/// JSON that parsed (on other text the answer is meaningless but safe).
/// Linear, no allocation; thread-safe.
std::size_t lone_surrogate_escape(std::string_view json) noexcept;

}  // namespace toolnexus

#endif  // TOOLNEXUS_TASK_HPP

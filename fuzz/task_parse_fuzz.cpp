// fuzz/task_parse_fuzz.cpp: Task::parse and Task::to_json (core).
//
// Input: the bytes of a Task file / a stored Task record.
//
// Invariants: a refusal is InvalidTask with a message; a parsed Task has a
// non-empty id without NUL, a known state or none; to_json() is valid JSON
// that parses again into a Task with the same id, contextId, state and
// status time, and serializes to the same bytes (a fixpoint: a Task saved
// and loaded stays as it is). Task::parse_stored (a read of a stored
// record) never crashes, refuses with a message, writes what it accepts as
// valid JSON, and accepts what parse() accepts (but bytes after a NUL, which
// RapidJSON's parse() takes for the end, or after a byte order mark's bytes,
// which it skips) as the same Task.
#include "fuzz_check.hpp"
#include "toolnexus/task.hpp"

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

using toolnexus::InvalidTask;
using toolnexus::Task;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, std::size_t size) {
  const std::string_view json(reinterpret_cast<const char *>(data), size);
  std::optional<std::string> stored;  // what parse_stored() accepted, as to_json() writes it
  try {
    const Task s = Task::parse_stored(json);
    try {
      stored = s.to_json();
    } catch (const InvalidTask &e) {
      FUZZ_CHECK(false, std::string("parse_stored() took what to_json() refuses: ") + e.what());
    }
    FUZZ_CHECK(toolnexus::fuzz::valid_json(*stored), *stored);
  } catch (const InvalidTask &e) {
    FUZZ_CHECK(e.what()[0] != '\0', "a refusal without a message");
  }
  Task t;
  try {
    t = Task::parse(json);
  } catch (const InvalidTask &e) {
    FUZZ_CHECK(e.what()[0] != '\0', "a refusal without a message");
    return 0;
  }
  FUZZ_CHECK(!t.id().empty() && t.id().find('\0') == std::string_view::npos, std::string(t.id()));
  FUZZ_CHECK(t.state().empty() || toolnexus::task_state::is_known(t.state()), std::string(t.state()));
  const std::string once = t.to_json();
  FUZZ_CHECK(toolnexus::fuzz::valid_json(once), once);
  // (RapidJSON's parse() skips a byte order mark's bytes at the start and
  // takes a NUL for the end; no stored record the host wrote has either.)
  const bool bom = !json.empty() && (json[0] == '\xef' || json[0] == '\xbb' || json[0] == '\xbf');
  if (json.find('\0') == std::string_view::npos && !bom)
    FUZZ_CHECK(stored && *stored == once, "parse_stored() differs from parse(): " + once);
  Task again;
  try {
    again = Task::parse(once);
  } catch (const InvalidTask &e) {
    FUZZ_CHECK(false, std::string("to_json() wrote what parse() refuses: ") + e.what() + ": " + once);
  }
  FUZZ_CHECK(again.id() == t.id(), once);
  FUZZ_CHECK(again.context_id() == t.context_id(), once);
  FUZZ_CHECK(again.state() == t.state(), once);
  FUZZ_CHECK(again.status_time_us() == t.status_time_us(), once);
  FUZZ_CHECK(again.to_json() == once, once);
  return 0;
}

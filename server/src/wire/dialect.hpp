// server/src/wire/dialect.hpp: the two A2A dialects the server speaks, each a
// view of the one stored form of a Task.
//
// Stored form: A2A v0.3 JSON (what the original Elixir project wrote to
// disk, so its directories still open): states "input-required", roles
// "user"/"agent", parts {"kind":"text","text"} / {"kind":"file","file":{...}}
// / {"kind":"data","data"}, "kind" members, RFC 3339 timestamps with
// microseconds. Metadata keys starting "toolnexus/" (lease, pending request)
// are server-private and never shown in either dialect.
//
// v0.3 view (no A2A-Version, or "0.x"): the stored JSON itself, less the
// private metadata.
// v1.0 view (A2A-Version: 1.0; spec v1.0 section 5.5 ProtoJSON): states
// TASK_STATE_*, roles ROLE_*, parts as the proto oneof (text | raw | url |
// data, with mediaType, filename, metadata), no "kind", timestamps in UTC
// with milliseconds, empty lists left out.
//
// Part members v1.0 can express and v0.3 cannot (mediaType of a text or data
// part) are kept in the stored part as an extra "mediaType" member, so a Task
// written through one dialect reads the same through the other. A v1.0 data
// value that is no object (v0.3 DataPart.data must be one) is stored wrapped,
// {"value": ...}, with kWrappedValueKey: true in the part's metadata; the
// v1.0 view unwraps it (docs/a2a.md, "Parts").
#ifndef TOOLNEXUS_SERVER_DIALECT_HPP
#define TOOLNEXUS_SERVER_DIALECT_HPP

#include <rapidjson/document.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace toolnexus::server_detail {

/// The protocol version a request speaks (A2A v1.0 section 3.6). v1_1 is
/// v1_0 plus what the A2A 1.1 draft (the spec's dev-1.1 branch) adds and
/// this server keeps: Task.generation, on Tasks and on status and artifact
/// update events (its section 3.2.7); ifGenerationMatch and
/// TaskGenerationMismatchError (3.2.2, 3.3.2); GetTask's currentGeneration
/// long-poll. Everything else of it is written as v1_0.
enum class Dialect { v0_3, v1_0, v1_1 };

/// True for the v1.x dialects (v1_0, v1_1): the shapes of A2A v1.0.
constexpr bool is_v1(Dialect d) noexcept { return d != Dialect::v0_3; }

/// The JSON writer every response is built with.
using JsonWriter = rapidjson::Writer<rapidjson::StringBuffer>;

/// "0.3", "1.0" or "1.1".
const char *dialect_name(Dialect d) noexcept;

/// The dialect of a request from its A2A-Version service parameter (header,
/// else query parameter; A2A v1.0 section 3.6): "" = `absent` (v0_3 on
/// JSON-RPC, whose v0.3 clients send no header; v1_0 on the HTTP+JSON
/// binding, which only v1.0 defines); "0.x" (x any number, patch allowed) =
/// v0_3; "1", "1.0", "1.0.x" = v1_0; "1.1", "1.1.x" = v1_1. Leading/trailing blanks are ignored.
/// Returns std::nullopt for anything else (the caller answers
/// VersionNotSupported, -32009).
std::optional<Dialect> dialect_for_version(std::string_view version, Dialect absent) noexcept;

/// True for a Task metadata key the server keeps for itself ("toolnexus/...":
/// lease, pending request); such keys are never shown to clients.
bool is_private_metadata_key(std::string_view key) noexcept;

/// Stored state name -> v1.0 enum name ("input-required" ->
/// "TASK_STATE_INPUT_REQUIRED"; "unknown" and unrecognised names ->
/// "TASK_STATE_UNSPECIFIED").
std::string_view state_to_v1(std::string_view stored) noexcept;

/// A state filter in either spelling ("input-required" or
/// "TASK_STATE_INPUT_REQUIRED"; "TASK_STATE_CANCELLED" too) -> stored name,
/// or std::nullopt when it names no state.
std::optional<std::string> state_from_any(std::string_view s);

/// A stored RFC 3339 time in the v1.0 form: UTC, milliseconds,
/// "2026-03-12T10:00:00.123Z". Text that does not parse is returned as is.
std::string timestamp_to_v1(std::string_view stored);

/// How much of a Task a response shows.
struct TaskView {
  /// < 0: the whole history; 0: none (v1.0 leaves "history" out, v0.3 shows
  /// []); N: the N most recent messages (A2A historyLength).
  int64_t history_length = -1;
  /// false: "artifacts" left out (ListTasks without includeArtifacts).
  bool include_artifacts = true;
};

/// Writes a stored Task (`task`, an object) as `d` shows it, following
/// `view`. Private metadata is left out (and "metadata" with it when nothing
/// else is in it). Does not modify `task`.
void write_task(JsonWriter &w, const rapidjson::Value &task, Dialect d, const TaskView &view);

/// Writes a stored Message as `d` shows it.
void write_message(JsonWriter &w, const rapidjson::Value &message, Dialect d);

/// Writes a stored TaskStatus ({"state", "timestamp"?, "message"?}) as `d`
/// shows it (v1.0: TASK_STATE_*, millisecond timestamp).
void write_status(JsonWriter &w, const rapidjson::Value &status, Dialect d);

/// Writes a stored Artifact as `d` shows it.
void write_artifact(JsonWriter &w, const rapidjson::Value &artifact, Dialect d);

/// The v0.3 view of stored Task bytes without building a DOM (GetTask's fast
/// path): appends to `out` the JSON of `json` less its private metadata.
/// Returns false (leaving `out` with partial output the caller discards)
/// when `json` is not one well-formed, UTF-8-valid JSON object (no lone
/// surrogate escape, nesting at most kMaxTaskDepth) whose
/// top-level "id" is `id` (bytes that belong to another Task are never
/// served as this one), or lacks what a2a_task_problem() requires (a
/// non-empty "contextId", "status" with a "state", "kind" "task" if
/// present). Iterative (no recursion on nesting).
bool filter_stored_task_v03(std::string_view json, std::string_view id, rapidjson::StringBuffer &out);

/// The check of filter_stored_task_v03 alone, writing nothing: `json` is one
/// well-formed, UTF-8-valid JSON object whose top-level "id" is `id`, with
/// what a2a_task_problem() requires.
bool is_stored_task_of(std::string_view json, std::string_view id);

/// The part metadata key that marks a stored data part whose "data" is
/// {"value": V}, V being a v1.0 data value that is not an object (v0.3
/// DataPart.data is an object): the v0.3 view shows the wrapped form and the
/// key, the v1.0 view shows V and not the key. A v1.0 client may not send it.
inline constexpr std::string_view kWrappedValueKey = "toolnexus.wrappedValue";

/// Renames the proto field names of a v1.0 request to their JSON names
/// ("task_id" -> "taskId", "push_notification_config" ->
/// "pushNotificationConfig": the proto name without its underscores, each
/// letter after one upper-cased), as ProtoJSON parsers accept both (A2A v1.0
/// section 5.5; output stays camelCase). Applies to `params` and every object
/// in it, through arrays, except inside free-form values (the values of
/// "metadata", a google.protobuf.Struct, and "data", a Value), whose keys are
/// the client's own. Keys without "_" are left alone. Throws
/// RpcError(-32602 invalid params) naming the field under `base`
/// ("params.message.messageId") when one object has both names of a field.
/// Recursive: `params` must nest no deeper than the request depth limit
/// (limits.max_json_depth, at most 64), which the parsers check first.
void accept_proto_names(rapidjson::Value &params, const std::string &base, rapidjson::Document::AllocatorType &a);

/// Converts a v1.0 Message (A2A v1.0 section 4.1.4 Message, 4.1.6 Part) to
/// the stored form, allocated in `a`. Checks it as it goes and throws
/// RpcError(-32602 invalid params) naming the offending member under `base`
/// ("params.message.parts[0]: a part must have exactly one of text, raw,
/// url or data"). Reads the JSON names only: proto names (message_id) are
/// renamed before (accept_proto_names). A data value that is no object is
/// stored wrapped (see kWrappedValueKey).
rapidjson::Value message_from_v1(const rapidjson::Value &m, const std::string &base,
                                 rapidjson::Document::AllocatorType &a);

}  // namespace toolnexus::server_detail

#endif  // TOOLNEXUS_SERVER_DIALECT_HPP

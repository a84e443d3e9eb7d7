// server/src/common/util.hpp: small helpers shared by the server's parts: UUIDs,
// RapidJSON member access, A2A Message construction, Task metadata keys.
#ifndef TOOLNEXUS_SERVER_UTIL_HPP
#define TOOLNEXUS_SERVER_UTIL_HPP

#include "toolnexus/task.hpp"

#include <rapidjson/document.h>

#include <cstddef>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

namespace toolnexus::server_detail {

/// metadata key of a running Task's lease: {"instance", "expiresAt"}
/// (leases written by earlier versions also hold "host" and "pid").
inline constexpr const char *kLeaseKey = "toolnexus/lease";
/// metadata key of an input-required Task's pending request:
/// {"prompt", "data", "askedAt"}.
inline constexpr const char *kPendingKey = "toolnexus/pending";

/// A random (version 4) UUID, "xxxxxxxx-xxxx-4xxx-yxxx-xxxxxxxxxxxx".
/// Thread-safe (per-thread generator seeded from std::random_device).
std::string new_uuid();

/// `s` in single quotes for a message or a log line: control bytes, DEL and
/// bytes that are not valid UTF-8 shown as \xNN, cut after 200 bytes with
/// "..." ("'a\x00b'"). The result is valid UTF-8 without NUL, so it survives
/// std::exception::what() (a C string: an id with NUL used to cut the
/// message there) and JSON output (invalid UTF-8 made the answer invalid).
std::string in_quotes(std::string_view s);

/// `s` made valid UTF-8 for a JSON string: each byte that is not part of a
/// valid UTF-8 sequence is replaced by the text \xNN (as in_quotes shows
/// it); everything else, NUL and other control bytes included, is kept (the
/// JSON writer escapes them: NUL reads \u0000). Nothing is cut. The error
/// bodies of both bindings pass their messages through it, so no client
/// bytes echoed in a message can make an answer invalid JSON (issue 19).
/// Pure; thread-safe; never throws (std::bad_alloc aside).
std::string valid_utf8_text(std::string_view s);

/// The member `name` of `obj`, or nullptr when `obj` is not an object or has
/// no such member.
const rapidjson::Value *find(const rapidjson::Value &obj, std::string_view name) noexcept;
rapidjson::Value *find(rapidjson::Value &obj, std::string_view name) noexcept;

/// A string value's bytes ("" when `v` is null or not a string).
std::string_view str(const rapidjson::Value *v) noexcept;

/// A string Value copied into `a`.
rapidjson::Value make_string(std::string_view s, rapidjson::Document::AllocatorType &a);

/// Sets obj[name] = value (replacing an existing member, keeping its place).
/// `obj` must be an object; `name` is copied.
void set_member(rapidjson::Value &obj, std::string_view name, rapidjson::Value value,
                rapidjson::Document::AllocatorType &a);

/// Removes obj[name] if present.
void remove_member(rapidjson::Value &obj, std::string_view name);

/// The text parts of an A2A Message ({"parts": [{"kind":"text","text"}]}),
/// joined with "\n".
std::string message_text(const rapidjson::Value &message);

/// An agent Message {"role":"agent","parts":[{"kind":"text","text"}],
/// "messageId", "taskId", "contextId", "kind":"message"} allocated in `a`.
rapidjson::Value agent_message(std::string_view text, std::string_view task_id,
                               std::string_view context_id, rapidjson::Document::AllocatorType &a);

/// metadata[key] of a Task, or nullptr.
const rapidjson::Value *task_metadata(const Task &task, std::string_view key) noexcept;
/// Sets metadata[key] (creating "metadata" if needed).
void set_task_metadata(Task &task, std::string_view key, rapidjson::Value value);
/// Removes metadata[key]; removes "metadata" when it becomes empty.
void remove_task_metadata(Task &task, std::string_view key);

/// Appends `message` (moved) to the Task's "history" (created if needed).
void append_history(Task &task, rapidjson::Value message);

/// This machine's host name ("" if unknown). Cached.
const std::string &host_name();

/// Names the calling thread (Linux: at most 15 bytes are kept; longer names
/// are cut), as `top -H`, `ps -L`, gdb and perf show it. The server's
/// threads: tnx-http (request workers), tnx-reactor (connections), tnx-run
/// (executor workers), tnx-renew, tnx-settle, tnx-push, tnx-push-sweep,
/// tnx-watch, tnx-watch-poll. Errors are ignored (a name is only a label).
void name_this_thread(const char *name) noexcept;

/// A std::thread named `name` (a string literal: it is read on the new
/// thread) running `body`. Throws std::system_error as std::thread does.
template <class F>
std::thread start_named_thread(const char *name, F &&body) {
  return std::thread([name, body = std::forward<F>(body)]() mutable {
    name_this_thread(name);
    body();
  });
}

/// Hands the free pages of every malloc arena back to the system
/// (glibc's malloc_trim(0)); call after freeing a large answer, since glibc
/// keeps what a thread freed in that thread's arena. Thread-safe. A no-op
/// when built with AddressSanitizer/ThreadSanitizer/MemorySanitizer: their
/// allocator replaces malloc, so glibc's arenas hold nothing, and glibc's
/// malloc_trim lazily initialises those arenas without a lock, which
/// crashed (SEGV in mtrim) when two threads made the first call at once.
void release_free_memory() noexcept;

/// The length in bytes of `v` written as compact JSON (what Task::to_json,
/// and so a store, makes of it), counted without building the text.
std::size_t serialized_size(const rapidjson::Value &v);

}  // namespace toolnexus::server_detail

#endif  // TOOLNEXUS_SERVER_UTIL_HPP

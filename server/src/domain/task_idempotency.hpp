// server/src/domain/task_idempotency.hpp: idempotent SendMessage retries
// (issue 22 item 2; A2A discussion #1987). A client that did not hear the
// answer to a SendMessage sends it again with the same messageId; the retry
// gets the outcome of the first send: the same Task, no second Task and no
// second turn, on any server sharing the store and after a restart, since
// everything needed is in the stored Task.
//
// New Task: its id is a name-based UUID (version 5, SHA-1) of (tenant,
// principal, contextId or "", messageId) under kIdempotencyNamespace, and it
// is saved create-only (expected version: none) before it runs; a conflict
// means the first send made it (a retry), found in O(1) by id on every store.
//
// Existing Task: metadata["toolnexus/recentMessages"] is a bounded list
// (IdempotencyRules::recent_messages, oldest first) of
// {"messageId", "digest", "at"}: digest = SHA-256 (hex) of the canonical
// message body (message_digest()), at = RFC 3339 time it was accepted;
// entries older than window_ms are dropped. A recorded messageId with the
// same digest is a retry; with another digest the request is refused.
//
// Pure functions on a Task: no wire, no store. Thread-safe (no state).
#ifndef TOOLNEXUS_SERVER_TASK_IDEMPOTENCY_HPP
#define TOOLNEXUS_SERVER_TASK_IDEMPOTENCY_HPP

#include "toolnexus/task.hpp"

#include <rapidjson/document.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace toolnexus::server_detail {

/// metadata key of a Task's recent client messageIds (see the file comment).
inline constexpr const char *kRecentMessagesKey = "toolnexus/recentMessages";

/// The namespace UUID of idempotent Task ids (fixed forever: changing it
/// makes retries of sends made before the change create second Tasks).
inline constexpr const char *kIdempotencyNamespace = "6f0c2b1e-5a3d-4c8e-9b7a-2d1e0f3c4b5a";

/// The `idempotency` settings (ServerOptions::idempotency).
struct IdempotencyRules {
  /// Off: new Tasks get random ids and a blocking send may defer its first
  /// save (TaskLifecycle::create defer_save); no messageId is remembered.
  bool enabled = true;
  /// Entries kept per Task (at least 1); the oldest is dropped first.
  std::size_t recent_messages = 32;
  /// Entries older than this (ms) are dropped, and not matched.
  int64_t window_ms = 86400000;
};

/// The id of the Task a SendMessage without taskId creates: a version 5
/// UUID ("xxxxxxxx-xxxx-5xxx-yxxx-xxxxxxxxxxxx") of the four strings, each
/// prefixed with its length so no two tuples share a name. Deterministic;
/// thread-safe.
std::string idempotent_task_id(std::string_view tenant, std::string_view principal, std::string_view context_id,
                               std::string_view message_id);

/// SHA-256 (64 lower-case hex digits) of `message` (an A2A Message in its
/// stored v0.3 form) written canonically: object members sorted by name
/// (byte order), compact, RapidJSON's escaping; the members a Task binds
/// ("taskId", "contextId", "kind") are left out, so a message and its copy
/// in a Task's history digest alike. Thread-safe.
std::string message_digest(const rapidjson::Value &message);

/// What a Task's recentMessages say of a message.
enum class SeenMessage {
  no,         ///< not recorded (or only older than the window)
  same,       ///< recorded with the same digest: a retry
  different,  ///< recorded with another digest: a reuse to refuse
};

/// Looks `message_id` up in `task`'s recentMessages, ignoring entries
/// older than `now_us` - `window_ms` (and malformed ones).
SeenMessage seen_message(const Task &task, std::string_view message_id, std::string_view digest, int64_t now_us,
                         int64_t window_ms);

/// Records (message_id, digest, now_us) at the end of `task`'s
/// recentMessages, dropping entries older than the window and then the
/// oldest past rules.recent_messages.
void remember_message(Task &task, std::string_view message_id, std::string_view digest, int64_t now_us,
                      const IdempotencyRules &rules);

/// The message of a refused reuse: "messageId 'm1' was already used with a
/// different message" (the id quoted as in_quotes() does).
std::string reused_message_text(std::string_view message_id);

}  // namespace toolnexus::server_detail

#endif  // TOOLNEXUS_SERVER_TASK_IDEMPOTENCY_HPP

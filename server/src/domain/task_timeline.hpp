// server/src/domain/task_timeline.hpp: a Task's event timeline, kept in the
// stored Task itself.
//
// Every client-visible change of a Task (a new status, an artifact or an
// artifact chunk) is an event with a per-Task sequence number. The last
// kMaxEvents events live in the Task record's server-private metadata,
//   metadata["toolnexus/events"] = {"seq": <last>, "log": [<entry>, ...]}
//   entry = {"seq": n, "status": {"state", "timestamp"}, "messageId"?}
//         | {"seq": n, "artifact": {"index": i, "from": a, "to": b},
//            "append": bool, "lastChunk": bool}
// (a status event names its status message by messageId: the message itself
// is in history; an artifact event names parts [a, b) of artifacts[i], so
// nothing is stored twice). Because the sequence is stored with the Task,
// it survives a restart and is the same on every replica sharing the store:
// a subscriber that reconnects with Last-Event-ID: n gets exactly the events
// after n, from any server, or the Task snapshot when some of them have
// already left the timeline.
//
// This is the Task domain: it knows Tasks and their events, never how a
// binding shows them (wire/sse.hpp renders events as stream frames).
#ifndef TOOLNEXUS_SERVER_DOMAIN_TASK_TIMELINE_HPP
#define TOOLNEXUS_SERVER_DOMAIN_TASK_TIMELINE_HPP

#include "toolnexus/task.hpp"

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace toolnexus::server_detail {

/// metadata key of the timeline.
inline constexpr const char *kEventsKey = "toolnexus/events";
/// Events kept in a Task's timeline; older ones are dropped (a subscriber
/// that missed them gets the Task snapshot instead).
inline constexpr std::size_t kMaxEvents = 64;

/// The sequence number of the Task's newest event (0: none yet).
uint64_t event_seq(const Task &task) noexcept;

/// The Task's generation (A2A 1.1, section 3.2.7 of the dev-1.1 text):
/// 1 when created, +1 exactly per status or artifact change, which is the
/// sequence number of its newest event (every such change is one event).
/// A Task stored without a timeline (by `store put`, or by hand) is at
/// generation 1; its first change makes it 2. Never 0 (which tells a 1.1
/// client the server does not keep generations). Thread-safety: reads only.
uint64_t task_generation(const Task &task) noexcept;

/// task_generation() of a stored Task's JSON object (as a view writes it).
uint64_t generation_of(const rapidjson::Value &task) noexcept;

/// Gives a new Task an empty timeline, so that its first event (its
/// creation's status) is sequence 1, generation 1. Call once, before the
/// first add_status_event(). Throws only std::bad_alloc.
void start_timeline(Task &task);

/// The sequence number of the oldest event still in the timeline (0: none).
uint64_t oldest_event_seq(const Task &task) noexcept;

/// Appends an event for the Task's current status (and its status message,
/// if any, which must be in history). Returns its sequence number. Throws
/// only std::bad_alloc.
uint64_t add_status_event(Task &task);

/// Appends an event for parts [from, to) of artifacts[index]; `append`:
/// the parts extend an artifact sent before; `last_chunk`: the artifact is
/// complete. Returns its sequence number. Throws only std::bad_alloc.
uint64_t add_artifact_event(Task &task, uint32_t index, uint32_t from, uint32_t to, bool append, bool last_chunk);

/// One event of a timeline, read back. Its pointers and views point into
/// the Task it was read from and are valid while that Task is unchanged.
struct TimelineEvent {
  uint64_t seq = 0;
  /// A status event: the status as it was ({"state", "timestamp"?}, its
  /// message left out); null for an artifact event.
  const rapidjson::Value *status = nullptr;
  /// A status event: its status message (from history), or null.
  const rapidjson::Value *message = nullptr;
  /// An artifact event: the artifact (artifacts[index]) and the parts of
  /// it the event carries, [from, to) of its "parts" (checked in range).
  const rapidjson::Value *artifact = nullptr;
  uint32_t from = 0;
  uint32_t to = 0;
  /// An artifact event: the parts extend an artifact sent before.
  bool append = false;
  /// An artifact event: the artifact is complete.
  bool last_chunk = true;

  bool is_status() const noexcept { return status != nullptr; }
  /// The state of a status event ("" for an artifact event).
  std::string_view state() const noexcept;
};

/// Fills `out` (cleared first) with the Task's events after sequence
/// `after`, oldest first. Returns false, leaving `out` empty, when the
/// timeline no longer holds all of them (they were dropped, or an artifact
/// event names parts the Task no longer has): the reader must fall back to
/// the Task snapshot. `after` at or past the newest event gives true and
/// nothing. Thread-safety: reads `task` only.
bool timeline_events_after(const Task &task, uint64_t after, std::vector<TimelineEvent> &out);

}  // namespace toolnexus::server_detail

#endif  // TOOLNEXUS_SERVER_DOMAIN_TASK_TIMELINE_HPP

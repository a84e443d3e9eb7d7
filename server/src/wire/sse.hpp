// server/src/wire/sse.hpp: a Task's events (domain/task_timeline.hpp) as
// the stream payloads of each binding and dialect, and their server-sent
// event frames.
//
// Streams (A2A v1.0 section 3.1.2, 3.1.6, 9.4.2, 11.7; v0.3 section 7.2,
// 7.9): each frame is "id: <seq>\ndata: <one line of JSON>\n\n". JSON-RPC
// frames carry a complete JSON-RPC response echoing the request id, whose
// result is, in v1.0, a StreamResponse ({"task"} | {"statusUpdate"} |
// {"artifactUpdate"}) and, in v0.3, the bare Task / TaskStatusUpdateEvent
// (kind "status-update", "final") / TaskArtifactUpdateEvent (kind
// "artifact-update"). HTTP+JSON frames carry the bare StreamResponse. An
// error is a frame "event: error" whose data is the binding's error object.
#ifndef TOOLNEXUS_SERVER_WIRE_SSE_HPP
#define TOOLNEXUS_SERVER_WIRE_SSE_HPP

#include "domain/task_timeline.hpp"
#include "domain/task_watch.hpp"
#include "wire/dialect.hpp"
#include "toolnexus/task.hpp"

#include <cstdint>
#include <functional>
#include <map>
#include <vector>
#include <string>
#include <string_view>

namespace toolnexus::server_detail {

/// How a stream frames its events.
enum class Binding { jsonrpc, rest };
struct FrameStyle {
  Binding binding = Binding::jsonrpc;
  Dialect dialect = Dialect::v1_0;
  /// JSON-RPC: the request's id as JSON text ("7", "\"abc\"").
  std::string rpc_id = "null";
};

/// Appends the frame of the whole Task (StreamResponse.task; v0.3: the
/// Task) with SSE id `seq`, private metadata left out, history as `history_length`
/// says (< 0: all).
void append_snapshot_frame(std::string &out, const Task &task, const FrameStyle &style, uint64_t seq,
                           int64_t history_length = -1);

/// Appends one frame for each timeline event with sequence > `after`, in
/// order. Returns false, appending nothing, when the timeline no longer
/// holds all of them (they were dropped: send a snapshot instead).
/// `*last_state` receives the state of the newest status event appended
/// (unchanged when none).
bool append_event_frames(std::string &out, const Task &task, uint64_t after, const FrameStyle &style,
                         std::string *last_state);

/// Calls `fn(seq, json, state)` for each timeline event with sequence >
/// `after`, in order: `json` is the event's payload as `style` frames it
/// (JSON-RPC envelope included), `state` the state of a status event ("" for
/// an artifact event). Returns false, calling nothing, when the timeline no
/// longer holds all of them.
bool for_each_event(const Task &task, uint64_t after, const FrameStyle &style,
                    const std::function<void(uint64_t, std::string_view, std::string_view)> &fn);

/// The payload of the whole Task as `style` frames it (no SSE framing).
std::string snapshot_payload(const Task &task, const FrameStyle &style, int64_t history_length = -1);

/// The payloads of a Task's events and snapshots, rendered once for every
/// stream of the Task: an event never changes once written (its status
/// message is in history, its artifact parts are appended, never
/// rewritten), so a payload serves every stream and every later version of
/// the Task; streams only wrap it (JSON-RPC envelope, SSE framing). Not
/// thread-safe: one user (the TaskWatch delivery thread) at a time.
class EventRenderCache : public SharedRenderState {
 public:
  struct Event {
    uint64_t seq = 0;
    /// The event as HTTP+JSON frames it (v1.0 StreamResponse; v0.3 the
    /// bare event object).
    std::string payload;
    /// The state of a status event ("" for an artifact event).
    std::string state;
  };
  /// The events of `task` after `after`, in order, into `out` (pointers
  /// valid until the next call). False when the timeline no longer holds
  /// them all.
  bool events_after(const Task &task, uint64_t after, Dialect d, std::vector<const Event *> &out);
  /// The Task's snapshot payload (as HTTP+JSON frames it) at `version`.
  const std::string &snapshot(const Task &task, uint64_t version, Dialect d, int64_t history_length);

 private:
  std::map<uint64_t, Event> events_[3];  // by Dialect
  struct Snap {
    uint64_t version = UINT64_MAX;
    int64_t history_length = 0;
    std::string payload;
  };
  Snap snaps_[3];  // by Dialect
  /// The events being rendered (reused between calls).
  std::vector<TimelineEvent> timeline_;
};

/// Appends the SSE frame of `payload` (as HTTP+JSON frames it) in `style`
/// (JSON-RPC: wrapped in a response echoing style.rpc_id) with id `seq`.
void append_payload_frame(std::string &out, const FrameStyle &style, uint64_t seq, std::string_view payload);

/// Appends an "event: error" frame: JSON-RPC: a complete error response
/// (v0.3: error.data {"field"}; v1.0: [ErrorInfo]); HTTP+JSON: the
/// {"error": {...}} body of section 11.6.
void append_error_frame(std::string &out, const FrameStyle &style, int code, std::string_view message,
                        std::string_view field = {});

/// Appends an SSE comment (": text\n\n"), e.g. a keep-alive.
void append_comment_frame(std::string &out, std::string_view text);

}  // namespace toolnexus::server_detail

#endif  // TOOLNEXUS_SERVER_WIRE_SSE_HPP

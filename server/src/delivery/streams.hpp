// server/src/delivery/streams.hpp: the SSE stream of one Task (SendStreamingMessage,
// SubscribeToTask; A2A v1.0 sections 3.1.2, 3.1.6, 9.4.2, 11.7; v0.3
// sections 7.2, 7.9).
//
// A stream is a TaskWatch subscriber with a cursor into the Task's stored
// event timeline (task_events.hpp). It begins with the Task (snapshot
// frame), or, when the client reconnects with Last-Event-ID: n, with the
// events after n (the snapshot when they have left the timeline); then one
// frame per event as the Task changes, here or on any server sharing the
// store. It ends (the response completes) once the Task is terminal, or
// interrupted (input-required, auth-required) after a change made while the
// stream was open: a SendStreamingMessage stream ends at the first such
// state, a SubscribeToTask stream opened on an interrupted Task stays open
// until the Task has moved on and stopped again.
//
// When the server stops, a stream whose Task runs on this server stays open
// through the drain and ends as usual when the Task ends; every other one
// (its Task parked, running elsewhere, or still running when the drain
// timeout passes) ends with a reconnect frame: "retry:" and an "event:
// error" frame whose error names the Task and the Last-Event-ID to resubscribe
// with (TaskWatch::begin_drain, docs/streaming.md "Server stop").
//
// A slow client never slows anyone else: frames are queued on its
// connection without blocking; when more than kHighWaterBytes are queued
// the stream stops rendering and, once the client has read them, renders
// again from the newest record (so it catches up with whatever happened,
// from the timeline or a snapshot). A client that reads nothing for
// limits.stream_stall_ms is dropped. Idle streams get a keep-alive comment
// every keepalive_ms. A client that disconnects frees the stream at once.
#ifndef TOOLNEXUS_SERVER_STREAMS_HPP
#define TOOLNEXUS_SERVER_STREAMS_HPP

#include "domain/task_watch.hpp"
#include "wire/http_reactor.hpp"
#include "wire/sse.hpp"

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string_view>

namespace toolnexus::server_detail {

/// A stream a streaming method (SendStreamingMessage, SubscribeToTask)
/// decided to open (service/a2a_methods.cpp fills it); the bindings open it
/// with open_task_stream(). Move-only.
struct StreamPlan {
  /// Keeps the Task watched from before it could change.
  std::unique_ptr<TaskWatch::Hold> hold;
  /// The Task the stream begins with (its snapshot is the first frame);
  /// null when the stream resumes after `resume_after`.
  SnapshotPtr first;
  /// Last-Event-ID of a reconnecting client: the stream carries the events
  /// after it (or the snapshot, when they are gone) instead of beginning with
  /// the Task.
  std::optional<uint64_t> resume_after;
  /// SubscribeToTask: an interrupted state the Task was already in when the
  /// stream began does not end it (only a later terminal or interrupted
  /// state does). SendStreamingMessage ends at the first one.
  bool subscribe = false;
  /// historyLength for the snapshot frames (< 0: all).
  int64_t history_length = -1;
  /// Frames: binding, dialect, JSON-RPC id.
  FrameStyle style;
};

/// Stream settings.
struct StreamSettings {
  /// Open streams at most (past it: -32603 / HTTP 503 "too many streams").
  std::size_t max_streams = 10000;
  /// An idle stream gets ": keep-alive" this often.
  int keepalive_ms = 15000;
};

/// The reconnect delay a stream ended by a server stop suggests (its SSE
/// "retry:" field and its error's retryAfterMs), in ms.
inline constexpr int kReconnectRetryMs = 1000;

/// Queued bytes above which a stream waits for its client.
inline constexpr std::size_t kHighWaterBytes = 256 * 1024;

/// Opens the stream `plan` describes on `out` and subscribes it to the
/// watch. When max_streams are open, answers instead with an error: a
/// JSON-RPC error response (binding jsonrpc, HTTP 200; v0.3: as an SSE error
/// event, which is what v0.3 clients read), or HTTP 503 (rest).
void open_task_stream(Responder &out, TaskWatch &watch, StreamPlan plan, const StreamSettings &settings,
                      const Logger &log);

/// Answers a streaming request that failed before its stream began, as the
/// client expects it: v0.3 JSON-RPC: an SSE stream holding one "event:
/// error" frame with `error_response` (a complete JSON-RPC error
/// response); otherwise the plain JSON answer.
void answer_stream_error(Responder &out, Dialect dialect, std::string_view error_response);

}  // namespace toolnexus::server_detail

#endif  // TOOLNEXUS_SERVER_STREAMS_HPP

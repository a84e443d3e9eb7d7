// The SSE stream of one Task (see streams.hpp).
#include "delivery/streams.hpp"
#include "common/util.hpp"

#include "wire/errors.hpp"
#include "wire/sse.hpp"

namespace toolnexus::server_detail {

namespace ts = toolnexus::task_state;
using Clock = std::chrono::steady_clock;

namespace {

// The frame that ends a stream whose server stops before its Task does (see
// streams.hpp and docs/streaming.md, "Server stop"): the SSE retry field,
// then an "event: error" frame whose error says to resubscribe elsewhere
// from `last_seq`: JSON-RPC -32603 (v1.0: with an ErrorInfo; v0.3: error.data
// {taskId, lastEventId, retryAfterMs}), HTTP+JSON a 503 UNAVAILABLE
// google.rpc.Status with the same ErrorInfo metadata.
void append_reconnect_frame(std::string &out, const FrameStyle &style, const std::string &task_id,
                            uint64_t last_seq) {
  const std::string message = "the server is stopping before Task '" + task_id +
                              "' ends: resubscribe (SubscribeToTask with Last-Event-ID: " + std::to_string(last_seq) +
                              ") on another server sharing the store, or on this one once it is back";
  const ErrorMetadata md = {{"taskId", task_id},
                            {"lastEventId", std::to_string(last_seq)},
                            {"retryAfterMs", std::to_string(kReconnectRetryMs)}};
  std::string body;
  if (style.binding == Binding::jsonrpc) {
    ResponseWriter rw;
    rw.error(RpcId::from_json(style.rpc_id), rpc_code::kInternalError, message, {}, style.dialect, &md);
    body.assign(rw.bytes());
  } else {
    Failure f{rpc_code::kInternalError, message, {}, md};
    f.unavailable = true;
    write_rest_error(f, body);
  }
  out += "retry: " + std::to_string(kReconnectRetryMs) + "\n";
  out += "event: error\ndata: ";
  out += body;
  out += "\n\n";
}

class TaskStream final : public TaskSubscriber, public std::enable_shared_from_this<TaskStream> {
 public:
  TaskStream(std::string id, std::shared_ptr<SseStream> sse, StreamPlan plan, int keepalive_ms)
      : TaskSubscriber(std::move(id)),
        sse_(std::move(sse)),
        first_(std::move(plan.first)),
        resume_after_(plan.resume_after),
        subscribe_(plan.subscribe),
        history_length_(plan.history_length),
        style_(std::move(plan.style)),
        keepalive_(std::chrono::milliseconds(keepalive_ms)),
        last_write_(Clock::now()) {}

  /// Pokes the watch when the client has read what was queued and the
  /// stream had stopped rendering for it (or when the client is gone: then
  /// the stream's place under the cap is given back at once, on the
  /// reactor thread, before the reactor counts the stream closed).
  void attach(TaskWatch &watch) {
    std::weak_ptr<TaskStream> weak = shared_from_this();
    TaskWatch *w = &watch;
    watch_ = w;
    sse_->set_on_drain([weak, w] {
      auto self = weak.lock();
      if (!self) return;
      const bool gone = self->sse_->closed();
      if (gone) w->release_place(*self);
      if (gone || self->behind_.load()) w->poke(self->task_id());
    });
  }

  bool on_update(const SnapshotPtr &latest, std::unique_ptr<SharedRenderState> &shared) override {
    // Every subscriber of a Task is a TaskStream: the shared state is their
    // render cache.
    if (!shared) shared = std::make_unique<EventRenderCache>();
    EventRenderCache &cache = static_cast<EventRenderCache &>(*shared);
    if (sse_->closed()) return false;
    if (sse_->pending() > kHighWaterBytes) {
      behind_ = true;
      return true;
    }
    behind_ = false;
    std::string frames;
    const Dialect d = style_.dialect;
    if (!started_) {
      started_ = true;
      if (resume_after_) {
        cursor_ = *resume_after_;
        // A cursor from the future (another Task's id, a store restored
        // from a backup): start over as a new subscriber would, with the
        // snapshot and then the live events. Nothing changed since the
        // stream began, so a parked Task keeps it open (docs/streaming.md).
        if (cursor_ > event_seq(latest->task)) {
          append_payload_frame(frames, style_, event_seq(latest->task),
                               cache.snapshot(latest->task, latest->version, d, history_length_));
          cursor_ = event_seq(latest->task);
        }
      } else if (first_) {
        // The Task as the stream began (not cached: rendered once).
        append_snapshot_frame(frames, first_->task, style_, event_seq(first_->task), history_length_);
        cursor_ = event_seq(first_->task);
      } else {
        append_payload_frame(frames, style_, event_seq(latest->task),
                             cache.snapshot(latest->task, latest->version, d, history_length_));
        cursor_ = event_seq(latest->task);
      }
      first_.reset();
    }
    const uint64_t newest = event_seq(latest->task);
    if (newest > cursor_) {
      if (cache.events_after(latest->task, cursor_, d, events_)) {
        for (const EventRenderCache::Event *e : events_) append_payload_frame(frames, style_, e->seq, e->payload);
      } else {
        // Events the client missed have left the timeline: the Task as it is.
        append_payload_frame(frames, style_, newest, cache.snapshot(latest->task, latest->version, d, history_length_));
      }
      cursor_ = newest;
      changed_ = true;
    }
    if (!frames.empty()) {
      if (!sse_->write(frames)) return false;
      last_write_ = Clock::now();
    }
    // Caught up with the newest record: does the stream end here?
    const std::string_view state = latest->task.state();
    if (cursor_ >= newest &&
        (ts::is_terminal(state) || (ts::is_interrupted(state) && (!subscribe_ || changed_)))) {
      // A newer record than the client has, with no event of its own (a Task
      // finished by hand with `toolnexus store put`): its last frame is the
      // Task as it is, so the stream never ends on a state it did not say.
      if (frames.empty() && sent_version_ != 0 && latest->version > sent_version_) {
        std::string last;
        append_payload_frame(last, style_, newest, cache.snapshot(latest->task, latest->version, d, history_length_));
        sse_->write(last);
      }
      end();
      return false;
    }
    if (!frames.empty()) sent_version_ = latest->version;
    return true;
  }

  void on_gone() override {
    std::string frame;
    append_error_frame(frame, style_, rpc_code::kTaskNotFound, "Task " + in_quotes(task_id()) + " was removed from the store",
                       style_.binding == Binding::jsonrpc ? "params.id" : "id");
    sse_->write(frame);
    end();
  }

  void on_server_stop() override {
    std::string frame;
    append_reconnect_frame(frame, style_, task_id(), cursor_);
    sse_->write(frame);
    end();
  }

  bool on_idle(Clock::time_point now) override {
    if (sse_->closed()) return false;
    if (now - last_write_ >= keepalive_ && sse_->pending() == 0) {
      std::string frame;
      append_comment_frame(frame, "keep-alive");
      if (!sse_->write(frame)) return false;
      last_write_ = now;
    }
    return true;
  }

  /// For an error before any frame (too many streams).
  void fail(int code, std::string_view message) {
    std::string frame;
    append_error_frame(frame, style_, code, message);
    sse_->write(frame);
    sse_->end();
  }

 private:
  // Ends the stream, giving back its place under the cap first: a client
  // that opens its next stream as soon as it reads this end is not refused.
  void end() {
    if (watch_ != nullptr) watch_->release_place(*this);
    sse_->end();
  }

  TaskWatch *watch_ = nullptr;  // set by attach(); outlives the stream
  std::shared_ptr<SseStream> sse_;
  SnapshotPtr first_;
  std::optional<uint64_t> resume_after_;
  bool subscribe_;
  int64_t history_length_;
  FrameStyle style_;
  Clock::duration keepalive_;
  Clock::time_point last_write_;
  uint64_t cursor_ = 0;
  /// The record version the last frames written came from (0: none yet).
  uint64_t sent_version_ = 0;
  bool started_ = false;
  bool changed_ = false;
  std::atomic<bool> behind_{false};
  std::vector<const EventRenderCache::Event *> events_;
};

std::string too_many(std::size_t n) {
  return "too many open streams (" + std::to_string(n) +
         ", the server's streams.max_streams); retry later or poll with GetTask";
}

}  // namespace

void answer_stream_error(Responder &out, Dialect dialect, std::string_view error_response) {
  if (dialect == Dialect::v0_3) {
    std::shared_ptr<SseStream> sse = out.start_stream({}, "error");
    if (!sse) return;
    std::string frame = "event: error\ndata: ";
    frame += error_response;
    frame += "\n\n";
    sse->write(frame);
    sse->end();
    return;
  }
  HttpReply r;
  r.body.assign(error_response.data(), error_response.size());
  out.reply(std::move(r));
}

void open_task_stream(Responder &out, TaskWatch &watch, StreamPlan plan, const StreamSettings &settings,
                      const Logger &log) {
  const std::size_t open = watch.subscribers();
  if (open >= settings.max_streams) {
    log.warn("refused a stream of Task '" + plan.hold->id() + "': " + too_many(settings.max_streams));
    if (plan.style.binding == Binding::rest) {
      std::string body;
      Failure f{rpc_code::kInternalError, too_many(settings.max_streams), {}};
      f.unavailable = true;
      write_rest_error(f, body);
      HttpReply r;
      r.status = 503;
      r.body = std::move(body);
      r.headers.emplace_back("Retry-After", "1");
      out.reply(std::move(r));
    } else {
      ResponseWriter rw;
      rw.error(RpcId::from_json(plan.style.rpc_id), rpc_code::kInternalError, too_many(settings.max_streams), {},
               plan.style.dialect);
      answer_stream_error(out, plan.style.dialect, rw.bytes());
    }
    return;
  }
  const std::string id = plan.hold->id();
  std::shared_ptr<SseStream> sse = out.start_stream({}, "of Task '" + id + "'");
  if (!sse) return;
  std::unique_ptr<TaskWatch::Hold> hold = std::move(plan.hold);
  auto stream = std::make_shared<TaskStream>(id, sse, std::move(plan), settings.keepalive_ms);
  stream->attach(watch);
  if (!watch.subscribe(*hold, stream)) stream->fail(rpc_code::kInternalError, too_many(settings.max_streams));
}

}  // namespace toolnexus::server_detail

// A Task's events as stream payloads and SSE frames (see sse.hpp).
#include "wire/sse.hpp"

#include "common/util.hpp"
#include "wire/errors.hpp"
#include "wire/jsonrpc.hpp"

#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include <utility>
#include <vector>

namespace toolnexus::server_detail {

namespace ts = toolnexus::task_state;

namespace {

void put(JsonWriter &w, std::string_view key, std::string_view value) {
  w.Key(key.data(), static_cast<rapidjson::SizeType>(key.size()));
  w.String(value.data(), static_cast<rapidjson::SizeType>(value.size()));
}

// Opens the frame's JSON: the JSON-RPC envelope up to "result":.
void begin_payload(JsonWriter &w, const FrameStyle &style) {
  if (style.binding != Binding::jsonrpc) return;
  w.StartObject();
  w.Key("jsonrpc");
  w.String("2.0");
  w.Key("id");
  w.RawValue(style.rpc_id.data(), style.rpc_id.size(), rapidjson::kObjectType);
  w.Key("result");
}

void end_payload(JsonWriter &w, const FrameStyle &style) {
  if (style.binding == Binding::jsonrpc) w.EndObject();
}

// A2A 1.1 (section 3.2.7 of the dev-1.1 text): an update event carries the
// Task's generation after the change it reports, which is the event's
// sequence number (the SSE id it is sent with).
void write_generation(JsonWriter &w, const TimelineEvent &e, Dialect d) {
  if (d != Dialect::v1_1) return;
  w.Key("generation");
  w.Uint64(e.seq);
}

// One status event as its payload.
void write_status_event(JsonWriter &w, const Task &task, const TimelineEvent &e, Dialect d) {
  // The status as it was, with its message from history.
  rapidjson::Document st(rapidjson::kObjectType);
  auto &a = st.GetAllocator();
  if (e.status->IsObject()) st.CopyFrom(*e.status, a);
  if (e.message != nullptr) {
    rapidjson::Value copy(*e.message, a);
    set_member(st, "message", std::move(copy), a);
  }
  const std::string_view state = str(find(st, "state"));
  const bool v1 = is_v1(d);
  w.StartObject();
  if (v1) {
    w.Key("statusUpdate");
    w.StartObject();
  }
  put(w, "taskId", task.id());
  put(w, "contextId", task.context_id());
  w.Key("status");
  write_status(w, st, d);
  write_generation(w, e, d);
  if (!v1) {
    w.Key("final");
    w.Bool(ts::is_terminal(state) || ts::is_interrupted(state));
    put(w, "kind", "status-update");
  } else {
    w.EndObject();
  }
  w.EndObject();
}

// One artifact event as its payload.
void write_artifact_event(JsonWriter &w, const Task &task, const TimelineEvent &e, Dialect d) {
  const rapidjson::Value &art = *e.artifact;
  const rapidjson::Value &parts = *find(art, "parts");
  // The artifact with only the parts of this event.
  rapidjson::Document chunk(rapidjson::kObjectType);
  auto &a = chunk.GetAllocator();
  for (auto it = art.MemberBegin(); it != art.MemberEnd(); ++it) {
    if (std::string_view(it->name.GetString(), it->name.GetStringLength()) == "parts") continue;
    chunk.AddMember(rapidjson::Value(it->name, a), rapidjson::Value(it->value, a), a);
  }
  rapidjson::Value slice(rapidjson::kArrayType);
  for (auto i = e.from; i < e.to; ++i) slice.PushBack(rapidjson::Value(parts[i], a), a);
  chunk.AddMember("parts", slice, a);
  const bool v1 = is_v1(d);
  w.StartObject();
  if (v1) {
    w.Key("artifactUpdate");
    w.StartObject();
  }
  put(w, "taskId", task.id());
  put(w, "contextId", task.context_id());
  w.Key("artifact");
  write_artifact(w, chunk, d);
  w.Key("append");
  w.Bool(e.append);
  w.Key("lastChunk");
  w.Bool(e.last_chunk);
  write_generation(w, e, d);
  if (!v1) {
    put(w, "kind", "artifact-update");
  } else {
    w.EndObject();
  }
  w.EndObject();
}

// One event as its payload.
void write_event(JsonWriter &w, const Task &task, const TimelineEvent &e, Dialect d) {
  if (e.is_status()) {
    write_status_event(w, task, e, d);
  } else {
    write_artifact_event(w, task, e, d);
  }
}

}  // namespace

std::string snapshot_payload(const Task &task, const FrameStyle &style, int64_t history_length) {
  rapidjson::StringBuffer buf;
  JsonWriter w(buf);
  begin_payload(w, style);
  TaskView view;
  view.history_length = history_length;
  if (is_v1(style.dialect)) {
    w.StartObject();
    w.Key("task");
    write_task(w, task.json(), style.dialect, view);
    w.EndObject();
  } else {
    write_task(w, task.json(), style.dialect, view);
  }
  end_payload(w, style);
  return std::string(buf.GetString(), buf.GetSize());
}

void append_snapshot_frame(std::string &out, const Task &task, const FrameStyle &style, uint64_t seq,
                           int64_t history_length) {
  out += "id: ";
  out += std::to_string(seq);
  out += "\ndata: ";
  out += snapshot_payload(task, style, history_length);
  out += "\n\n";
}

bool for_each_event(const Task &task, uint64_t after, const FrameStyle &style,
                    const std::function<void(uint64_t, std::string_view, std::string_view)> &fn) {
  std::vector<TimelineEvent> events;
  if (!timeline_events_after(task, after, events)) return false;
  std::vector<std::string> payloads;
  payloads.reserve(events.size());
  for (const TimelineEvent &e : events) {
    rapidjson::StringBuffer buf;
    JsonWriter w(buf);
    begin_payload(w, style);
    write_event(w, task, e, style.dialect);
    end_payload(w, style);
    payloads.emplace_back(buf.GetString(), buf.GetSize());
  }
  for (std::size_t i = 0; i < events.size(); ++i) fn(events[i].seq, payloads[i], events[i].state());
  return true;
}

bool EventRenderCache::events_after(const Task &task, uint64_t after, Dialect d, std::vector<const Event *> &out) {
  out.clear();
  if (!timeline_events_after(task, after, timeline_)) return false;
  if (timeline_.empty()) return true;
  auto &cache = events_[static_cast<std::size_t>(d)];
  // Events that left the timeline leave the cache too.
  const uint64_t oldest = oldest_event_seq(task);
  while (!cache.empty() && cache.begin()->first < oldest) cache.erase(cache.begin());
  for (const TimelineEvent &te : timeline_) {
    auto it = cache.find(te.seq);
    if (it == cache.end()) {
      rapidjson::StringBuffer buf;
      JsonWriter w(buf);
      write_event(w, task, te, d);
      Event e;
      e.seq = te.seq;
      e.state = std::string(te.state());
      e.payload.assign(buf.GetString(), buf.GetSize());
      it = cache.emplace(te.seq, std::move(e)).first;
    }
    out.push_back(&it->second);
  }
  return true;
}

const std::string &EventRenderCache::snapshot(const Task &task, uint64_t version, Dialect d, int64_t history_length) {
  Snap &s = snaps_[static_cast<std::size_t>(d)];
  if (s.version != version || s.history_length != history_length) {
    FrameStyle style;
    style.binding = Binding::rest;
    style.dialect = d;
    s.payload = snapshot_payload(task, style, history_length);
    s.version = version;
    s.history_length = history_length;
  }
  return s.payload;
}

void append_payload_frame(std::string &out, const FrameStyle &style, uint64_t seq, std::string_view payload) {
  out += "id: ";
  out += std::to_string(seq);
  out += "\ndata: ";
  if (style.binding == Binding::jsonrpc) {
    out += R"({"jsonrpc":"2.0","id":)";
    out += style.rpc_id;
    out += R"(,"result":)";
    out += payload;
    out += "}";
  } else {
    out += payload;
  }
  out += "\n\n";
}

bool append_event_frames(std::string &out, const Task &task, uint64_t after, const FrameStyle &style,
                         std::string *last_state) {
  std::string frames, state;
  const bool ok = for_each_event(task, after, style, [&](uint64_t seq, std::string_view json, std::string_view st) {
    frames += "id: ";
    frames += std::to_string(seq);
    frames += "\ndata: ";
    frames += json;
    frames += "\n\n";
    if (!st.empty()) state = std::string(st);
  });
  if (!ok) return false;
  out += frames;
  if (last_state != nullptr && !state.empty()) *last_state = state;
  return true;
}

void append_error_frame(std::string &out, const FrameStyle &style, int code, std::string_view message,
                        std::string_view field) {
  std::string body;
  if (style.binding == Binding::jsonrpc) {
    ResponseWriter rw;
    rw.error(RpcId::from_json(style.rpc_id), code, message, field, style.dialect);
    body.assign(rw.bytes());
  } else {
    write_rest_error(Failure{code, std::string(message), std::string(field)}, body);
  }
  out += "event: error\ndata: ";
  out += body;
  out += "\n\n";
}

void append_comment_frame(std::string &out, std::string_view text) {
  out += ": ";
  out += text;
  out += "\n\n";
}

}  // namespace toolnexus::server_detail

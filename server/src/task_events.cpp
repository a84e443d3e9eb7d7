// A Task's event timeline and its SSE frames (see task_events.hpp).
#include "task_events.hpp"

#include "jsonrpc.hpp"
#include "rest.hpp"
#include "util.hpp"

#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include <utility>
#include <vector>

namespace toolnexus::server_detail {

namespace ts = toolnexus::task_state;

namespace {

rapidjson::Value *timeline(Task &task) {
  rapidjson::Value *md = find(task.json(), "metadata");
  if (md == nullptr || !md->IsObject()) return nullptr;
  rapidjson::Value *ev = find(*md, kEventsKey);
  return ev != nullptr && ev->IsObject() ? ev : nullptr;
}

const rapidjson::Value *timeline(const Task &task) {
  const rapidjson::Value *ev = task_metadata(task, kEventsKey);
  return ev != nullptr && ev->IsObject() ? ev : nullptr;
}

uint64_t seq_of(const rapidjson::Value &entry) {
  const rapidjson::Value *s = find(entry, "seq");
  return s != nullptr && s->IsUint64() ? s->GetUint64() : 0;
}

// Appends `entry` (which gets the next "seq") and trims the log.
uint64_t append_entry(Task &task, rapidjson::Value entry) {
  auto &a = task.allocator();
  if (timeline(task) == nullptr) {
    rapidjson::Value ev(rapidjson::kObjectType);
    ev.AddMember("seq", uint64_t{0}, a);
    ev.AddMember("log", rapidjson::Value(rapidjson::kArrayType), a);
    set_task_metadata(task, kEventsKey, std::move(ev));
  }
  rapidjson::Value &ev = *timeline(task);
  rapidjson::Value *seq = find(ev, "seq");
  if (seq == nullptr || !seq->IsUint64()) {
    set_member(ev, "seq", rapidjson::Value(uint64_t{0}), a);
    seq = find(ev, "seq");
  }
  rapidjson::Value *log = find(ev, "log");
  if (log == nullptr || !log->IsArray()) {
    set_member(ev, "log", rapidjson::Value(rapidjson::kArrayType), a);
    log = find(ev, "log");
  }
  const uint64_t next = seq->GetUint64() + 1;
  seq->SetUint64(next);
  entry.AddMember("seq", next, a);
  log->PushBack(entry, a);
  while (log->Size() > kMaxEvents) log->Erase(log->Begin());
  return next;
}

const rapidjson::Value *history_message(const Task &task, std::string_view message_id) {
  const rapidjson::Value *h = find(task.json(), "history");
  if (h == nullptr || !h->IsArray() || message_id.empty()) return nullptr;
  for (auto i = h->Size(); i > 0; --i) {
    const rapidjson::Value &m = (*h)[i - 1];
    if (str(find(m, "messageId")) == message_id) return &m;
  }
  return nullptr;
}

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

// One status event as its payload.
void write_status_event(JsonWriter &w, const Task &task, const rapidjson::Value &entry, Dialect d) {
  const rapidjson::Value *status = find(entry, "status");
  // The status as it was, with its message from history.
  rapidjson::Document st(rapidjson::kObjectType);
  auto &a = st.GetAllocator();
  if (status != nullptr && status->IsObject()) st.CopyFrom(*status, a);
  if (const rapidjson::Value *m = history_message(task, str(find(entry, "messageId")))) {
    rapidjson::Value copy(*m, a);
    set_member(st, "message", std::move(copy), a);
  }
  const std::string_view state = str(find(st, "state"));
  const bool v1 = d == Dialect::v1_0;
  w.StartObject();
  if (v1) {
    w.Key("statusUpdate");
    w.StartObject();
  }
  put(w, "taskId", task.id());
  put(w, "contextId", task.context_id());
  w.Key("status");
  write_status(w, st, d);
  if (!v1) {
    w.Key("final");
    w.Bool(ts::is_terminal(state) || ts::is_interrupted(state));
    put(w, "kind", "status-update");
  } else {
    w.EndObject();
  }
  w.EndObject();
}

// One artifact event as its payload; false when the artifact it names is
// not (or no longer) in the Task.
bool write_artifact_event(JsonWriter &w, const Task &task, const rapidjson::Value &entry, Dialect d) {
  const rapidjson::Value *ref = find(entry, "artifact");
  const rapidjson::Value *arts = find(task.json(), "artifacts");
  if (ref == nullptr || arts == nullptr || !arts->IsArray()) return false;
  const rapidjson::Value *index = find(*ref, "index");
  const rapidjson::Value *from = find(*ref, "from");
  const rapidjson::Value *to = find(*ref, "to");
  if (index == nullptr || !index->IsUint() || index->GetUint() >= arts->Size() || from == nullptr ||
      !from->IsUint() || to == nullptr || !to->IsUint())
    return false;
  const rapidjson::Value &art = (*arts)[index->GetUint()];
  const rapidjson::Value *parts = find(art, "parts");
  if (parts == nullptr || !parts->IsArray() || to->GetUint() > parts->Size() || from->GetUint() > to->GetUint())
    return false;
  // The artifact with only the parts of this event.
  rapidjson::Document chunk(rapidjson::kObjectType);
  auto &a = chunk.GetAllocator();
  for (auto it = art.MemberBegin(); it != art.MemberEnd(); ++it) {
    if (std::string_view(it->name.GetString(), it->name.GetStringLength()) == "parts") continue;
    chunk.AddMember(rapidjson::Value(it->name, a), rapidjson::Value(it->value, a), a);
  }
  rapidjson::Value slice(rapidjson::kArrayType);
  for (auto i = from->GetUint(); i < to->GetUint(); ++i) slice.PushBack(rapidjson::Value((*parts)[i], a), a);
  chunk.AddMember("parts", slice, a);
  const rapidjson::Value *append = find(entry, "append");
  const rapidjson::Value *last = find(entry, "lastChunk");
  const bool v1 = d == Dialect::v1_0;
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
  w.Bool(append != nullptr && append->IsBool() && append->GetBool());
  w.Key("lastChunk");
  w.Bool(last == nullptr || !last->IsBool() || last->GetBool());
  if (!v1) {
    put(w, "kind", "artifact-update");
  } else {
    w.EndObject();
  }
  w.EndObject();
  return true;
}

}  // namespace

uint64_t event_seq(const Task &task) noexcept {
  const rapidjson::Value *ev = timeline(task);
  if (ev == nullptr) return 0;
  const rapidjson::Value *s = find(*ev, "seq");
  return s != nullptr && s->IsUint64() ? s->GetUint64() : 0;
}

uint64_t add_status_event(Task &task) {
  auto &a = task.allocator();
  rapidjson::Value entry(rapidjson::kObjectType);
  rapidjson::Value status(rapidjson::kObjectType);
  std::string message_id;
  if (const rapidjson::Value *s = find(task.json(), "status"); s != nullptr && s->IsObject()) {
    for (auto it = s->MemberBegin(); it != s->MemberEnd(); ++it) {
      const std::string_view name(it->name.GetString(), it->name.GetStringLength());
      if (name == "message") {
        message_id = std::string(str(find(it->value, "messageId")));
        continue;
      }
      status.AddMember(rapidjson::Value(it->name, a), rapidjson::Value(it->value, a), a);
    }
  }
  entry.AddMember("status", status, a);
  if (!message_id.empty()) entry.AddMember("messageId", make_string(message_id, a), a);
  return append_entry(task, std::move(entry));
}

uint64_t add_artifact_event(Task &task, uint32_t index, uint32_t from, uint32_t to, bool append, bool last_chunk) {
  auto &a = task.allocator();
  rapidjson::Value entry(rapidjson::kObjectType);
  rapidjson::Value ref(rapidjson::kObjectType);
  ref.AddMember("index", index, a);
  ref.AddMember("from", from, a);
  ref.AddMember("to", to, a);
  entry.AddMember("artifact", ref, a);
  entry.AddMember("append", append, a);
  entry.AddMember("lastChunk", last_chunk, a);
  return append_entry(task, std::move(entry));
}

std::string snapshot_payload(const Task &task, const FrameStyle &style, int64_t history_length) {
  rapidjson::StringBuffer buf;
  JsonWriter w(buf);
  begin_payload(w, style);
  TaskView view;
  view.history_length = history_length;
  if (style.dialect == Dialect::v1_0) {
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
  const rapidjson::Value *ev = timeline(task);
  const uint64_t newest = event_seq(task);
  if (after >= newest) return true;
  const rapidjson::Value *log = ev == nullptr ? nullptr : find(*ev, "log");
  if (log == nullptr || !log->IsArray() || log->Empty()) return false;
  // Every event after `after` must still be in the log.
  if (seq_of((*log)[0]) > after + 1) return false;
  std::vector<std::pair<uint64_t, std::pair<std::string, std::string>>> out;
  for (const auto &entry : log->GetArray()) {
    const uint64_t seq = seq_of(entry);
    if (seq <= after) continue;
    rapidjson::StringBuffer buf;
    JsonWriter w(buf);
    begin_payload(w, style);
    std::string state;
    if (const rapidjson::Value *st = find(entry, "status")) {
      write_status_event(w, task, entry, style.dialect);
      state = std::string(str(find(*st, "state")));
    } else if (!write_artifact_event(w, task, entry, style.dialect)) {
      return false;  // the Task was changed behind the timeline's back
    }
    end_payload(w, style);
    out.push_back({seq, {std::string(buf.GetString(), buf.GetSize()), std::move(state)}});
  }
  for (const auto &[seq, p] : out) fn(seq, p.first, p.second);
  return true;
}

bool EventRenderCache::events_after(const Task &task, uint64_t after, Dialect d, std::vector<const Event *> &out) {
  out.clear();
  const rapidjson::Value *ev = timeline(task);
  const uint64_t newest = event_seq(task);
  if (after >= newest) return true;
  const rapidjson::Value *log = ev == nullptr ? nullptr : find(*ev, "log");
  if (log == nullptr || !log->IsArray() || log->Empty()) return false;
  if (seq_of((*log)[0]) > after + 1) return false;
  auto &cache = events_[d == Dialect::v1_0 ? 1 : 0];
  const uint64_t oldest = seq_of((*log)[0]);
  // Events that left the timeline leave the cache too.
  while (!cache.empty() && cache.begin()->first < oldest) cache.erase(cache.begin());
  FrameStyle style;
  style.binding = Binding::rest;
  style.dialect = d;
  for (const auto &entry : log->GetArray()) {
    const uint64_t seq = seq_of(entry);
    if (seq <= after) continue;
    auto it = cache.find(seq);
    if (it == cache.end()) {
      rapidjson::StringBuffer buf;
      JsonWriter w(buf);
      Event e;
      e.seq = seq;
      if (const rapidjson::Value *st = find(entry, "status")) {
        write_status_event(w, task, entry, d);
        e.state = std::string(str(find(*st, "state")));
      } else if (!write_artifact_event(w, task, entry, d)) {
        return false;
      }
      e.payload.assign(buf.GetString(), buf.GetSize());
      it = cache.emplace(seq, std::move(e)).first;
    }
    out.push_back(&it->second);
  }
  return true;
}

const std::string &EventRenderCache::snapshot(const Task &task, uint64_t version, Dialect d, int64_t history_length) {
  Snap &s = snaps_[d == Dialect::v1_0 ? 1 : 0];
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

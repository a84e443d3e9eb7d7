// A Task's event timeline (see task_timeline.hpp).
#include "domain/task_timeline.hpp"

#include "common/util.hpp"

#include <utility>

namespace toolnexus::server_detail {

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

const rapidjson::Value *timeline_log(const Task &task) {
  const rapidjson::Value *ev = timeline(task);
  const rapidjson::Value *log = ev == nullptr ? nullptr : find(*ev, "log");
  return log != nullptr && log->IsArray() ? log : nullptr;
}

uint64_t seq_of(const rapidjson::Value &entry) {
  const rapidjson::Value *s = find(entry, "seq");
  return s != nullptr && s->IsUint64() ? s->GetUint64() : 0;
}

// Appends `entry` (which gets the next "seq") and trims the log.
uint64_t append_entry(Task &task, rapidjson::Value entry) {
  auto &a = task.allocator();
  if (timeline(task) == nullptr) {
    // A Task that exists without a timeline (stored by hand: `store put`)
    // counts as generation 1, so its first event is 2; a new Task's is 1
    // (start_timeline()).
    rapidjson::Value ev(rapidjson::kObjectType);
    ev.AddMember("seq", uint64_t{1}, a);
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

// Reads an artifact entry into `e`; false when it names parts the Task does
// not have (the Task was changed behind the timeline's back).
bool read_artifact_entry(const Task &task, const rapidjson::Value &entry, TimelineEvent &e) {
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
  const rapidjson::Value *append = find(entry, "append");
  const rapidjson::Value *last = find(entry, "lastChunk");
  e.artifact = &art;
  e.from = from->GetUint();
  e.to = to->GetUint();
  e.append = append != nullptr && append->IsBool() && append->GetBool();
  e.last_chunk = last == nullptr || !last->IsBool() || last->GetBool();
  return true;
}

}  // namespace

std::string_view TimelineEvent::state() const noexcept { return status == nullptr ? "" : str(find(*status, "state")); }

uint64_t event_seq(const Task &task) noexcept {
  const rapidjson::Value *ev = timeline(task);
  if (ev == nullptr) return 0;
  const rapidjson::Value *s = find(*ev, "seq");
  return s != nullptr && s->IsUint64() ? s->GetUint64() : 0;
}

uint64_t task_generation(const Task &task) noexcept { return generation_of(task.json()); }

uint64_t generation_of(const rapidjson::Value &task) noexcept {
  const rapidjson::Value *md = find(task, "metadata");
  const rapidjson::Value *ev = md != nullptr && md->IsObject() ? find(*md, kEventsKey) : nullptr;
  const rapidjson::Value *s = ev != nullptr && ev->IsObject() ? find(*ev, "seq") : nullptr;
  const uint64_t seq = s != nullptr && s->IsUint64() ? s->GetUint64() : 0;
  return seq == 0 ? 1 : seq;
}

void start_timeline(Task &task) {
  auto &a = task.allocator();
  rapidjson::Value ev(rapidjson::kObjectType);
  ev.AddMember("seq", uint64_t{0}, a);
  ev.AddMember("log", rapidjson::Value(rapidjson::kArrayType), a);
  set_task_metadata(task, kEventsKey, std::move(ev));
}

uint64_t oldest_event_seq(const Task &task) noexcept {
  const rapidjson::Value *log = timeline_log(task);
  return log == nullptr || log->Empty() ? 0 : seq_of((*log)[0]);
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

bool timeline_events_after(const Task &task, uint64_t after, std::vector<TimelineEvent> &out) {
  out.clear();
  if (after >= event_seq(task)) return true;
  const rapidjson::Value *log = timeline_log(task);
  if (log == nullptr || log->Empty()) return false;
  // Every event after `after` must still be in the log.
  if (seq_of((*log)[0]) > after + 1) return false;
  for (const auto &entry : log->GetArray()) {
    TimelineEvent e;
    e.seq = seq_of(entry);
    if (e.seq <= after) continue;
    if (const rapidjson::Value *st = find(entry, "status"); st != nullptr) {
      static const rapidjson::Value kEmpty(rapidjson::kObjectType);
      e.status = st->IsObject() ? st : &kEmpty;
      e.message = history_message(task, str(find(entry, "messageId")));
    } else if (!read_artifact_entry(task, entry, e)) {
      out.clear();
      return false;
    }
    out.push_back(e);
  }
  return true;
}

}  // namespace toolnexus::server_detail

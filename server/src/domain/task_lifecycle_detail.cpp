// Helpers the parts of the lifecycle share (see task_lifecycle_detail.hpp).
#include "domain/task_lifecycle_detail.hpp"

#include "common/util.hpp"
#include "domain/task_timeline.hpp"

namespace toolnexus::server_detail::lifecycle_detail {

namespace ts = toolnexus::task_state;

Lease read_lease(const Task &task) {
  Lease l;
  const rapidjson::Value *v = task_metadata(task, kLeaseKey);
  if (v == nullptr || !v->IsObject()) return l;
  l.present = true;
  l.instance = std::string(str(find(*v, "instance")));
  l.host = std::string(str(find(*v, "host")));
  if (const rapidjson::Value *pid = find(*v, "pid"); pid != nullptr && pid->IsInt64()) l.pid = pid->GetInt64();
  l.expires_text = std::string(str(find(*v, "expiresAt")));
  int64_t us = 0;
  if (parse_timestamp(l.expires_text, us)) l.expires_us = us;
  return l;
}

// The text of the newest user message in history.
std::string latest_user_text(const Task &task) {
  const rapidjson::Value *h = find(task.json(), "history");
  if (h == nullptr || !h->IsArray()) return {};
  for (auto i = h->Size(); i > 0; --i) {
    const rapidjson::Value &m = (*h)[i - 1];
    if (str(find(m, "role")) == "user") return message_text(m);
  }
  return {};
}

// A copy of `message` for the Task's history, bound to the Task.
rapidjson::Value bound_message(const rapidjson::Value &message, std::string_view task_id,
                               std::string_view context_id, rapidjson::Document::AllocatorType &a) {
  rapidjson::Value m(message, a);
  set_member(m, "taskId", make_string(task_id, a), a);
  set_member(m, "contextId", make_string(context_id, a), a);
  if (find(m, "kind") == nullptr) m.AddMember("kind", "message", a);
  return m;
}

// Sets a new status with an agent message (also appended to history) and
// records the status event.
void set_status_with_message(Task &task, std::string_view state, std::string_view text) {
  auto &a = task.allocator();
  const std::string id(task.id()), ctx(task.context_id());
  rapidjson::Value msg = agent_message(text, id, ctx, a);
  rapidjson::Value copy(msg, a);
  append_history(task, std::move(copy));
  task.set_status(state, std::move(msg));
  add_status_event(task);
}

// Sets a new status without a message and records the status event.
void set_status_event(Task &task, std::string_view state) {
  task.set_status(state);
  add_status_event(task);
}

void check_generation(const Task &task, std::optional<uint64_t> expected) {
  if (!expected) return;
  const uint64_t current = task_generation(task);
  if (current == *expected) return;
  throw LifecycleError("Task " + in_quotes(task.id()) + " is at generation " + std::to_string(current) +
                           ", not " + std::to_string(*expected) + " (ifGenerationMatch); nothing was changed",
                       GenerationMismatch{*expected, current});
}

// The Task's artifacts array (created when missing).
rapidjson::Value &artifacts_of(Task &task) {
  rapidjson::Value *arts = find(task.json(), "artifacts");
  if (arts == nullptr || !arts->IsArray()) {
    set_member(task.json(), "artifacts", rapidjson::Value(rapidjson::kArrayType), task.allocator());
    arts = find(task.json(), "artifacts");
  }
  return *arts;
}

// Saves an executor's outcome into `task` (which is submitted or working).
void apply_result(Task &task, const ExecutionResult &res) {
  auto &a = task.allocator();
  if (task.state() != ts::kWorking) set_status_event(task, ts::kWorking);
  if (res.artifacts.IsArray() && !res.artifacts.Empty()) {
    for (const auto &art : res.artifacts.GetArray()) {
      rapidjson::Value copy(art, a);
      if (copy.IsObject() && find(copy, "artifactId") == nullptr)
        copy.AddMember("artifactId", make_string(new_uuid(), a), a);
      rapidjson::Value &arts = artifacts_of(task);
      const rapidjson::Value *parts = find(copy, "parts");
      const auto n_parts = parts != nullptr && parts->IsArray() ? parts->Size() : 0u;
      arts.PushBack(copy, a);
      add_artifact_event(task, arts.Size() - 1, 0, n_parts, false, true);
    }
  }
  remove_task_metadata(task, kLeaseKey);
  remove_task_metadata(task, kPendingKey);
  using O = ExecutionResult::Outcome;
  switch (res.outcome) {
    case O::completed:
      if (res.message.empty()) set_status_event(task, ts::kCompleted);
      else set_status_with_message(task, ts::kCompleted, res.message);
      break;
    case O::failed:
      set_status_with_message(task, ts::kFailed,
                              res.message.empty() ? "The agent failed without saying why." : res.message);
      break;
    case O::rejected:
      set_status_with_message(task, ts::kRejected,
                              res.message.empty() ? "The agent rejected the request." : res.message);
      break;
    case O::input_required: {
      const std::string prompt = res.message.empty() ? "Input required." : res.message;
      rapidjson::Value pending(rapidjson::kObjectType);
      pending.AddMember("prompt", make_string(prompt, a), a);
      rapidjson::Value data;
      data.CopyFrom(res.request_data, a);
      pending.AddMember("data", data, a);
      pending.AddMember("askedAt", make_string(format_timestamp(now_us()), a), a);
      set_task_metadata(task, kPendingKey, std::move(pending));
      set_status_with_message(task, ts::kInputRequired, prompt);
      break;
    }
  }
}

}  // namespace toolnexus::server_detail::lifecycle_detail

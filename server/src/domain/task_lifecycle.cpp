// Fulfilment of Tasks: worker pool, transitions through the store with
// compare-and-set, leases, settling of abandoned Tasks.
#include "domain/task_lifecycle.hpp"

#include "domain/task_timeline.hpp"
#include "toolnexus/task_store.h"
#include "common/util.hpp"

#include <unistd.h>

#include <algorithm>
#include <functional>
#include <set>

namespace toolnexus::server_detail {

namespace ts = toolnexus::task_state;

namespace {

constexpr int kMaxSaveAttempts = 1000;

struct Lease {
  bool present = false;
  std::string instance;
  std::string host;
  int64_t pid = 0;
  std::string expires_text;
  /// kNoTime when absent or unparsable.
  int64_t expires_us = kNoTime;
};

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

}  // namespace

TaskLifecycle::TaskLifecycle(std::shared_ptr<TaskStore> store, std::shared_ptr<AgentExecutor> executor,
                             LifecycleOptions options, const Logger &log, TaskWatch &watch)
    : store_(std::move(store)), executor_(std::move(executor)), options_(std::move(options)), log_(log),
      watch_(watch) {
  if (options_.instance_id.empty()) options_.instance_id = new_uuid();
  if (options_.workers == 0) options_.workers = 4;
  inline_runs_ = options_.inline_runs && executor_->runs_briefly();
  cas_ = (store_->info().capabilities & TNX_CAP_COMPARE_AND_SET) != 0;
  if (!cas_) {
    log_.warn("the store does not support compare-and-set: transitions are serialised within this "
              "process only; do not share this store between servers");
  }
}

TaskLifecycle::~TaskLifecycle() {
  try {
    stop();
  } catch (...) {
  }
}

void TaskLifecycle::start() {
  if (started_) return;
  started_ = true;
  for (unsigned i = 0; i < options_.workers; ++i)
    workers_.push_back(start_named_thread("tnx-run", [this] { worker_loop(); }));
  renewer_ = start_named_thread("tnx-renew", [this] { renewer_loop(); });
  settler_ = start_named_thread("tnx-settle", [this] { settler_loop(); });
}

void TaskLifecycle::begin_stop() {
  stopping_ = true;
  // Blocking waits return now, so requests in progress end.
  watch_.stop();
  {
    std::lock_guard<std::mutex> lock(queue_mu_);  // a worker checks stopping_ under it
  }
  slot_cv_.notify_all();
}

void TaskLifecycle::stop() {
  std::call_once(stop_once_, [this] {
    stopping_ = true;
    watch_.stop();
    std::deque<WorkItem> left;
    {
      std::unique_lock<std::mutex> lock(queue_mu_);
      left.swap(queue_);
      queued_ = 0;
      stop_workers_ = true;
      queue_sem_.release(static_cast<uint32_t>(workers_.size()));
      slot_cv_.notify_all();
      room_cv_.notify_all();
      if (!idle_cv_.wait_for(lock, std::chrono::milliseconds(options_.drain_timeout_ms),
                             [this] { return running_ == 0; })) {
        log_.warn("stopping: " + std::to_string(running_) +
                  " Task(s) still running after the drain timeout; asking them to stop");
        std::lock_guard<std::mutex> al(active_mu_);
        for (auto &kv : active_) kv.second->cancel = true;
      }
    }
    for (auto &w : workers_) w.join();
    workers_.clear();
    for (WorkItem &item : left) fail_unstarted(item, "The server stopped before running this Task.");
    {
      std::lock_guard<std::mutex> lock(maint_mu_);
      stop_maintenance_ = true;
    }
    maint_cv_.notify_all();
    if (renewer_.joinable()) renewer_.join();
    if (settler_.joinable()) settler_.join();
  });
}

std::mutex &TaskLifecycle::stripe(std::string_view id) {
  return stripes_[std::hash<std::string_view>{}(id) % stripes_.size()];
}

template <class Decide>
TaskLifecycle::UpdateResult TaskLifecycle::update(std::string_view id, Decide &&decide,
                                                  std::optional<Snapshot> known) {
  // Without compare-and-set, read-decide-save is made atomic within this
  // process by a lock per id stripe.
  std::unique_lock<std::mutex> lock;
  if (!cas_) lock = std::unique_lock<std::mutex>(stripe(id));
  for (int attempt = 1;; ++attempt) {
    UpdateResult r;
    if (known) {
      r.snap = std::move(*known);
      known.reset();
    } else {
      std::optional<TaskRecord> rec = store_->get(id);
      if (!rec) return r;
      r.snap.task = rec->a2a_task();
      r.snap.version = rec->version;
      r.snap.owner = std::move(rec->owner);
      r.snap.tenant = std::move(rec->tenant);
    }
    r.found = true;
    r.verdict = decide(r.snap);
    if (r.verdict != Verdict::save) return r;
    SaveOptions so;
    so.expected_version = cas_ ? r.snap.version : kAnyVersion;
    so.owner = r.snap.owner;
    so.tenant = r.snap.tenant;
    try {
      r.snap.version = store_->save(r.snap.task, so);
      watch_.publish(r.snap);
      return r;
    } catch (const StoreError &e) {
      // Someone else saved first: read again and decide again.
      if (e.code() != Status::conflict || attempt >= kMaxSaveAttempts) throw;
    }
  }
}

std::string TaskLifecycle::over_bytes(std::size_t size) const {
  return std::to_string(size) + " bytes, past the limit of " + std::to_string(options_.max_task_bytes) +
         " bytes per stored Task (limits.max_task_bytes)";
}

void TaskLifecycle::refuse_if_too_large(const Task &task, const std::string &subject,
                                        const std::string &consequence) const {
  const std::size_t size = serialized_size(task.json());
  if (size <= options_.max_task_bytes) return;
  throw LifecycleError(LifecycleErrc::too_large, subject + " " + over_bytes(size) + consequence,
                       LimitExceeded{"limits.max_task_bytes", options_.max_task_bytes, size});
}

void TaskLifecycle::set_lease(Task &task, int64_t expires_us) const {
  auto &a = task.allocator();
  rapidjson::Value lease(rapidjson::kObjectType);
  // Clients read the Task's metadata: no host name or pid here. The server
  // logs its instance id with its host and pid at start.
  lease.AddMember("instance", make_string(options_.instance_id, a), a);
  lease.AddMember("expiresAt", make_string(format_timestamp(expires_us), a), a);
  set_task_metadata(task, kLeaseKey, std::move(lease));
}

std::shared_ptr<TaskLifecycle::ActiveTask> TaskLifecycle::register_active(const std::string &id,
                                                                          int64_t lease_written_us) {
  auto a = std::make_shared<ActiveTask>();
  a->lease_written_us = lease_written_us;
  std::lock_guard<std::mutex> lock(active_mu_);
  active_[id] = a;
  return a;
}

void TaskLifecycle::unregister_active(const std::string &id, const std::shared_ptr<ActiveTask> &which) {
  std::lock_guard<std::mutex> lock(active_mu_);
  auto it = active_.find(id);
  if (it != active_.end() && it->second == which) active_.erase(it);
}

bool TaskLifecycle::is_active(const std::string &id) {
  std::lock_guard<std::mutex> lock(active_mu_);
  return active_.count(id) != 0;
}

void TaskLifecycle::signal_cancel(const std::string &id) {
  std::lock_guard<std::mutex> lock(active_mu_);
  auto it = active_.find(id);
  if (it != active_.end()) it->second->cancel = true;
}

// ---------------------------------------------------------------------------
// Requests
// ---------------------------------------------------------------------------

Task TaskLifecycle::create(const rapidjson::Value &message, const std::string &owner, const std::string &tenant,
                           std::unique_ptr<TaskWatch::Hold> *hold, const std::function<void(Task &)> &prepare,
                           bool defer_save) {
  if (stopping_) throw LifecycleError(LifecycleErrc::stopping, "the server is stopping");
  admit();
  const bool caller_waits = defer_save;
  defer_save = defer_save && cas_;
  Task t;
  auto &a = t.allocator();
  const std::string id = new_uuid();
  std::string ctx(str(find(message, "contextId")));
  if (ctx.empty()) ctx = new_uuid();
  t.json().AddMember("id", make_string(id, a), a);
  t.json().AddMember("contextId", make_string(ctx, a), a);
  t.set_status(ts::kSubmitted);
  rapidjson::Value history(rapidjson::kArrayType);
  history.PushBack(bound_message(message, id, ctx, a), a);
  t.json().AddMember("history", history, a);
  t.json().AddMember("kind", "task", a);
  const int64_t now = now_us();
  set_lease(t, now + int64_t{options_.lease_ms} * 1000);
  if (prepare) prepare(t);
  add_status_event(t);
  refuse_if_too_large(t, "params.message would make the new Task", "; no Task was created");

  Snapshot snap{std::move(t), 0, owner, tenant};
  if (!defer_save) {
    SaveOptions so;
    so.expected_version = cas_ ? kNoVersion : kAnyVersion;
    so.owner = owner;
    so.tenant = tenant;
    snap.version = store_->save(snap.task, so);
  }
  if (hold != nullptr) *hold = watch_.hold(id, std::make_shared<const Snapshot>(snap));
  auto active = register_active(id, now);
  if (defer_save) {
    active->stored = false;
    active->unsaved = snap;
  }
  Task result = snap.task;
  run_or_enqueue(WorkItem{id, std::move(active), std::move(snap)}, caller_waits);
  return result;
}

Task TaskLifecycle::resume(std::string_view task_id, const rapidjson::Value &message, const std::string &owner,
                           const std::string &tenant, std::unique_ptr<TaskWatch::Hold> *hold,
                           const std::function<void(Task &)> &prepare, bool caller_waits) {
  if (stopping_) throw LifecycleError(LifecycleErrc::stopping, "the server is stopping");
  admit();
  const std::string id(task_id);
  const std::string not_found = "Task " + in_quotes(id) + " not found";
  int64_t lease_time = 0;
  UpdateResult r = update(id, [&](Snapshot &s) {
    if (s.owner != owner || s.tenant != tenant) throw LifecycleError(LifecycleErrc::not_found, not_found);
    const std::string state(s.task.state());
    if (ts::is_terminal(state))
      throw LifecycleError(LifecycleErrc::terminal, "Task " + in_quotes(id) + " is " + state +
                                                        "; a terminal Task accepts no more messages");
    if (!ts::is_interrupted(state))
      throw LifecycleError(LifecycleErrc::not_interrupted,
                           "Task " + in_quotes(id) + " is " + (state.empty() ? std::string("in no state") : state) +
                               "; it accepts a message only while input-required or auth-required");
    const std::string_view msg_ctx = str(find(message, "contextId"));
    if (!msg_ctx.empty() && msg_ctx != s.task.context_id())
      throw LifecycleError(LifecycleErrc::context_mismatch,
                           "params.message.contextId '" + std::string(msg_ctx) +
                               "' does not match the contextId of Task '" + id + "'");
    // The limits: refused before anything is saved, so the Task stays as it
    // was (this is a copy of it).
    const rapidjson::Value *history = find(s.task.json(), "history");
    const std::size_t held = history != nullptr && history->IsArray() ? history->Size() : 0;
    if (held + 1 > options_.max_task_history)
      throw LifecycleError(LifecycleErrc::too_large,
                           "params.message would be message " + std::to_string(held + 1) + " in the history of Task '" +
                               id + "', past the limit of " + std::to_string(options_.max_task_history) +
                               " messages per Task (limits.max_task_history); the Task is unchanged",
                           LimitExceeded{"limits.max_task_history", options_.max_task_history, held + 1});
    auto &a = s.task.allocator();
    const std::string ctx(s.task.context_id());
    append_history(s.task, bound_message(message, id, ctx, a));
    if (prepare) prepare(s.task);
    set_status_event(s.task, ts::kWorking);
    lease_time = now_us();
    set_lease(s.task, lease_time + int64_t{options_.lease_ms} * 1000);
    refuse_if_too_large(s.task, "params.message would make Task '" + id + "'", "; the Task is unchanged");
    return Verdict::save;
  });
  if (!r.found) throw LifecycleError(LifecycleErrc::not_found, not_found);
  if (hold != nullptr) *hold = watch_.hold(id, std::make_shared<const Snapshot>(r.snap));
  auto active = register_active(id, lease_time);
  active->working_saved = true;
  Task result = r.snap.task;
  run_or_enqueue(WorkItem{id, std::move(active), std::move(r.snap)}, caller_waits);
  return result;
}

Task TaskLifecycle::cancel(std::string_view task_id, const std::string &owner, const std::string &tenant) {
  const std::string id(task_id);
  const std::string not_found = "Task " + in_quotes(id) + " not found";
  UpdateResult r = update(id, [&](Snapshot &s) {
    if (s.owner != owner || s.tenant != tenant) throw LifecycleError(LifecycleErrc::not_found, not_found);
    const std::string state(s.task.state());
    if (ts::is_terminal(state))
      throw LifecycleError(LifecycleErrc::not_cancelable,
                           "Task " + in_quotes(id) + " is already " + state + " and cannot be canceled");
    remove_task_metadata(s.task, kLeaseKey);
    remove_task_metadata(s.task, kPendingKey);
    set_status_event(s.task, ts::kCanceled);
    return Verdict::save;
  });
  if (!r.found) throw LifecycleError(LifecycleErrc::not_found, not_found);
  signal_cancel(id);
  return std::move(r.snap.task);
}

Task TaskLifecycle::wait_until_settled(TaskWatch::Hold &hold, const std::string &owner, const std::string &tenant,
                                       std::chrono::milliseconds timeout, uint64_t *version) {
  bool gone = false;
  SnapshotPtr latest = watch_.wait(
      hold,
      [](const Snapshot &s) {
        const std::string_view state = s.task.state();
        return ts::is_terminal(state) || ts::is_interrupted(state);
      },
      timeout, &gone);
  if (gone || !latest || latest->owner != owner || latest->tenant != tenant)
    throw LifecycleError(LifecycleErrc::not_found, "Task " + in_quotes(hold.id()) + " not found");
  if (version != nullptr) *version = latest->version;
  return latest->task;
}

void TaskLifecycle::mark_stored(ActiveTask &active) {
  if (active.stored.load()) return;
  std::lock_guard<std::mutex> lock(active.unsaved_mu);
  active.stored = true;
  active.unsaved.reset();
}

bool TaskLifecycle::save_unsaved(const std::string &id, const std::shared_ptr<ActiveTask> &active,
                                 const std::function<void(Task &)> &change) {
  std::lock_guard<std::mutex> lock(active->unsaved_mu);
  if (active->stored.load() || !active->unsaved) return false;
  Snapshot s = *active->unsaved;
  if (change) change(s.task);
  SaveOptions so;
  so.expected_version = kNoVersion;
  so.owner = s.owner;
  so.tenant = s.tenant;
  try {
    s.version = store_->save(s.task, so);
  } catch (const StoreError &e) {
    if (e.code() != Status::conflict) throw;
    // The run saved it first.
    active->stored = true;
    active->unsaved.reset();
    return false;
  }
  active->stored = true;
  active->unsaved.reset();
  watch_.publish(s);
  if (log_.enabled(LogLevel::debug)) log_.debug("Task " + in_quotes(id) + " saved before its outcome (it runs long)");
  return true;
}

Snapshot TaskLifecycle::persist(const std::string &task_id) {
  std::shared_ptr<ActiveTask> active;
  {
    std::lock_guard<std::mutex> lock(active_mu_);
    auto it = active_.find(task_id);
    if (it != active_.end()) active = it->second;
  }
  if (active) save_unsaved(task_id, active, {});
  std::optional<TaskRecord> rec = store_->get(task_id);
  if (!rec) throw LifecycleError(LifecycleErrc::not_found, "Task " + in_quotes(task_id) + " not found");
  Snapshot s;
  s.task = rec->a2a_task();
  s.version = rec->version;
  s.owner = std::move(rec->owner);
  s.tenant = std::move(rec->tenant);
  return s;
}

Snapshot TaskLifecycle::edit(std::string_view task_id, const std::string &owner, const std::string &tenant,
                             const std::function<bool(Task &)> &change) {
  const std::string id(task_id);
  const std::string not_found = "Task " + in_quotes(id) + " not found";
  UpdateResult r = update(id, [&](Snapshot &s) {
    if (s.owner != owner || s.tenant != tenant) throw LifecycleError(LifecycleErrc::not_found, not_found);
    return change(s.task) ? Verdict::save : Verdict::keep;
  });
  if (!r.found) throw LifecycleError(LifecycleErrc::not_found, not_found);
  return std::move(r.snap);
}

// ---------------------------------------------------------------------------
// Workers
// ---------------------------------------------------------------------------

void TaskLifecycle::admit() {
  if (queued_.load() < options_.max_queued_tasks) return;
  // Back-pressure: the client waits for the workers instead of the queue
  // growing without bound.
  std::unique_lock<std::mutex> lock(queue_mu_);
  const bool room = room_cv_.wait_for(lock, std::chrono::milliseconds(options_.queue_wait_ms), [this] {
    return stop_workers_ || queue_.size() < options_.max_queued_tasks;
  });
  if (stop_workers_ || stopping_) throw LifecycleError(LifecycleErrc::stopping, "the server is stopping");
  if (!room)
    throw LifecycleError(LifecycleErrc::overloaded, "server busy: " + std::to_string(queue_.size()) +
                                                        " Tasks are waiting to run; retry later");
}

void TaskLifecycle::enqueue(WorkItem item) {
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    if (!stop_workers_) {
      queue_.push_back(std::move(item));
      ++queued_;
      queue_sem_.release();
      return;
    }
  }
  fail_unstarted(item, "The server stopped before running this Task.");
}

void TaskLifecycle::run_or_enqueue(WorkItem item, bool caller_waits) {
  if (caller_waits && inline_runs_) {
    bool claimed = false;
    {
      std::lock_guard<std::mutex> lock(queue_mu_);
      if (!stop_workers_ && !stopping_.load() && running_ + queue_.size() < options_.workers) {
        ++running_;
        claimed = true;
      }
    }
    if (claimed) {
      run_claimed(item);
      return;
    }
  }
  enqueue(std::move(item));
}

void TaskLifecycle::worker_loop() {
  for (;;) {
    WorkItem item;
    queue_sem_.acquire();
    {
      std::unique_lock<std::mutex> queue_lock(queue_mu_);
      // Once the server begins to stop (begin_stop, before the HTTP drain),
      // no queued Task starts: stop() fails them all. Without this check a
      // worker freed during a slow drain ran queued Tasks it should fail.
      if (stop_workers_ || stopping_.load()) return;
      if (queue_.empty()) continue;  // cannot happen: one token per item
      // Inline runs (run_or_enqueue) hold slots too: at most `workers` runs
      // are in progress. The item stays queued meanwhile, so a stop fails it.
      if (running_ >= options_.workers) {
        slot_cv_.wait(queue_lock, [this] {
          return stop_workers_ || stopping_.load() || running_ < options_.workers;
        });
        if (stop_workers_ || stopping_.load()) return;
      }
      item = std::move(queue_.front());
      queue_.pop_front();
      --queued_;
      ++running_;
    }
    room_cv_.notify_all();  // notify_one can be lost (semaphore.hpp); waiters here are rare
    run_claimed(item);
  }
}

void TaskLifecycle::run_claimed(WorkItem &item) {
  try {
    run(item);
  } catch (const StoreError &e) {
    // Details (paths, backend messages) go to the log, not to the client.
    log_.error("Task " + in_quotes(item.id) + ": the task store failed during fulfilment: " + e.what());
    fail_after_error(item.id, item.active, std::string("the task store failed (") + status_name(e.code()) +
                                  "); details are in the server log");
  } catch (const std::exception &e) {
    log_.error("Task " + in_quotes(item.id) + ": fulfilment failed: " + e.what());
    fail_after_error(item.id, item.active, e.what());
  } catch (...) {
    log_.error("Task " + in_quotes(item.id) + ": fulfilment failed with an unknown exception");
    fail_after_error(item.id, item.active, "unknown error");
  }
  unregister_active(item.id, item.active);
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    --running_;
    if (running_ == 0) idle_cv_.notify_all();
  }
  // A worker holding a queued item's token may wait for this slot. Not
  // notify_one: glibc before 2.41 can lose one (sourceware bug 25847); the
  // waiters are the few workers that found every slot taken by inline runs.
  slot_cv_.notify_all();
}

// The TaskProgress of one run: progress reports are applied to a working
// copy of the Task and saved (compare-and-set) at most every
// progress_interval_ms, and in any case with the result.
class TaskLifecycle::RunProgress final : public TaskProgress {
 public:
  RunProgress(TaskLifecycle &lc, const std::string &id, const std::shared_ptr<ActiveTask> &active,
              const Snapshot &start)
      : lc_(lc), id_(id), active_(active), start_(start), last_save_(std::chrono::steady_clock::now()) {}

  void status(std::string_view text) override {
    if (active_->cancel) return;
    Update u;
    u.text = std::string(text);
    pending_.push_back(std::move(u));
    pending_bytes_ += text.size();
    if (pending_too_large()) return;
    maybe_save();
  }

  void artifact_chunk(std::string_view artifact_id, std::string_view name, const rapidjson::Value &parts,
                      bool last_chunk) override {
    if (!parts.IsArray() || parts.Empty())
      throw std::invalid_argument("TaskProgress::artifact_chunk: parts must be a non-empty array of Parts");
    for (const auto &p : parts.GetArray())
      if (!p.IsObject()) throw std::invalid_argument("TaskProgress::artifact_chunk: every part must be an object");
    if (artifact_id.empty()) throw std::invalid_argument("TaskProgress::artifact_chunk: artifact_id is empty");
    const std::string aid(artifact_id);
    if (complete_.count(aid) != 0)
      throw std::invalid_argument("TaskProgress::artifact_chunk: artifact '" + aid + "' is already complete");
    if (last_chunk) complete_.insert(aid);
    if (active_->cancel) return;
    Update u;
    u.chunk = true;
    u.artifact_id = aid;
    u.name = std::string(name);
    u.parts.CopyFrom(parts, u.parts.GetAllocator());
    u.last = last_chunk;
    pending_.push_back(std::move(u));
    pending_bytes_ += serialized_size(parts);
    if (pending_too_large()) return;
    maybe_save();
  }

  /// Applies the reports not yet saved to `task` (a fresh copy each
  /// save attempt).
  void apply(Task &task) const {
    if (pending_.empty()) return;
    auto &a = task.allocator();
    if (task.state() != ts::kWorking) set_status_event(task, ts::kWorking);
    for (const Update &u : pending_) {
      if (!u.chunk) {
        set_status_with_message(task, ts::kWorking, u.text);
        continue;
      }
      rapidjson::Value &arts = artifacts_of(task);
      rapidjson::SizeType index = arts.Size();
      for (rapidjson::SizeType i = 0; i < arts.Size(); ++i)
        if (str(find(arts[i], "artifactId")) == u.artifact_id) index = i;
      const bool existed = index < arts.Size();
      if (!existed) {
        rapidjson::Value art(rapidjson::kObjectType);
        art.AddMember("artifactId", make_string(u.artifact_id, a), a);
        if (!u.name.empty()) art.AddMember("name", make_string(u.name, a), a);
        art.AddMember("parts", rapidjson::Value(rapidjson::kArrayType), a);
        arts.PushBack(art, a);
      }
      rapidjson::Value *parts = find(arts[index], "parts");
      if (parts == nullptr || !parts->IsArray()) {
        set_member(arts[index], "parts", rapidjson::Value(rapidjson::kArrayType), a);
        parts = find(arts[index], "parts");
      }
      const rapidjson::SizeType from = parts->Size();
      for (const auto &p : u.parts.GetArray()) parts->PushBack(rapidjson::Value(p, a), a);
      add_artifact_event(task, index, from, parts->Size(), existed, u.last);
    }
  }

  bool has_pending() const noexcept { return !pending_.empty(); }
  /// The reports were saved (by the final save).
  void saved() {
    pending_.clear();
    pending_bytes_ = 0;
  }
  /// Why the run's output was dropped: it would have taken the Task past
  /// max_task_bytes ("" = it was not). The run is then asked to stop
  /// (cancel_requested) and its Task is failed with this reason.
  const std::string &too_large() const noexcept { return too_large_; }
  /// The record the last progress save made (nullopt: none was made).
  std::optional<Snapshot> take_saved() { return std::move(saved_); }

 private:
  struct Update {
    bool chunk = false;
    std::string text;
    std::string artifact_id;
    std::string name;
    rapidjson::Document parts;
    bool last = false;
  };

  // The output is dropped, and the run asked to stop: the Task would pass
  // max_task_bytes.
  void drop_output(std::string why) {
    too_large_ = std::move(why);
    active_->cancel = true;
    pending_.clear();
    pending_bytes_ = 0;
  }

  // Output not saved yet, larger than a whole Task may be: no need to wait
  // for the next save (and hold all of it in memory) to know.
  bool pending_too_large() {
    if (pending_bytes_ <= lc_.options_.max_task_bytes) return false;
    drop_output("the agent's output not yet saved is already " + lc_.over_bytes(pending_bytes_) +
                "; that output was dropped");
    return true;
  }

  void maybe_save() {
    const auto now = std::chrono::steady_clock::now();
    if (now - last_save_ < std::chrono::milliseconds(lc_.options_.progress_interval_ms)) return;
    last_save_ = now;
    // Based on the last save, else on (a copy of: the executor still reads
    // it) the Task as the run started.
    std::optional<Snapshot> known;
    if (saved_) known = std::move(saved_);
    else known = start_;
    std::size_t over = 0;
    UpdateResult r = lc_.update(
        id_,
        [&](Snapshot &s) {
          over = 0;
          const std::string_view state = s.task.state();
          if (state != ts::kWorking && state != ts::kSubmitted) return Verdict::stop;
          if (read_lease(s.task).instance != lc_.options_.instance_id) return Verdict::stop;
          apply(s.task);
          if (const std::size_t size = serialized_size(s.task.json()); size > lc_.options_.max_task_bytes) {
            over = size;
            return Verdict::stop;
          }
          return Verdict::save;
        },
        std::move(known));
    if (over != 0) {
      drop_output("the agent's output would make it " + lc_.over_bytes(over) + "; that output was dropped");
      saved_.reset();
      return;
    }
    if (r.found && r.verdict == Verdict::save) {
      saved_ = std::move(r.snap);
      active_->working_saved = true;
      mark_stored(*active_);
      pending_.clear();
      pending_bytes_ = 0;
    } else {
      // Canceled, settled or taken over meanwhile: stop reporting.
      active_->cancel = true;
      pending_.clear();
      pending_bytes_ = 0;
      saved_.reset();
    }
  }

  TaskLifecycle &lc_;
  const std::string &id_;
  const std::shared_ptr<ActiveTask> &active_;
  const Snapshot &start_;
  std::optional<Snapshot> saved_;
  std::vector<Update> pending_;
  /// About the bytes pending_ adds to the Task (its parts and texts).
  std::size_t pending_bytes_ = 0;
  std::string too_large_;
  std::set<std::string> complete_;
  std::chrono::steady_clock::time_point last_save_;
};

void TaskLifecycle::run(WorkItem &item) {
  const std::string &id = item.id;
  // 1. Still ours to run? (No save: "working" is saved only if the run
  //    lasts; see save_working().)
  UpdateResult r = update(
      id,
      [&](Snapshot &s) {
        const std::string_view state = s.task.state();
        if (ts::is_terminal(state) || ts::is_interrupted(state)) return Verdict::stop;
        if (read_lease(s.task).instance != options_.instance_id) return Verdict::stop;
        return Verdict::keep;
      },
      std::move(item.snap));
  if (!r.found || r.verdict == Verdict::stop) return;
  if (item.active->cancel) return;
  item.active->started_us = now_us();

  // 2. The executor, outside any lock; its exceptions become a failure.
  ExecutionResult result;
  RunProgress progress(*this, id, item.active, r.snap);
  {
    const std::string latest = latest_user_text(r.snap.task);
    const ExecutionContext ctx{r.snap.task, task_metadata(r.snap.task, kPendingKey), latest, item.active->cancel,
                               progress};
    try {
      result = executor_->execute(ctx);
    } catch (const std::exception &e) {
      result = ExecutionResult::failed(std::string("The agent failed: ") + e.what());
    } catch (...) {
      result = ExecutionResult::failed("The agent failed with an unknown error.");
    }
  }

  // 3. Save the outcome (with the progress not saved yet) unless the Task
  //    was canceled or settled meanwhile. A "working" saved by the renewer
  //    in between makes the save conflict; it is then made on the re-read
  //    Task.
  //    An outcome that would take the Task past max_task_bytes is not
  //    saved: the Task fails instead, with what was saved before.
  std::string too_large;
  UpdateResult done = update(
      id,
      [&](Snapshot &s) {
        too_large.clear();
        const std::string_view state = s.task.state();
        if (state != ts::kWorking && state != ts::kSubmitted) return Verdict::stop;
        if (read_lease(s.task).instance != options_.instance_id) return Verdict::stop;
        if (!progress.too_large().empty()) {
          too_large = progress.too_large();
          return Verdict::stop;
        }
        progress.apply(s.task);
        apply_result(s.task, result);
        if (const std::size_t size = serialized_size(s.task.json()); size > options_.max_task_bytes) {
          too_large = "the agent's output would make it " + over_bytes(size) + "; that output was dropped";
          return Verdict::stop;
        }
        return Verdict::save;
      },
      [&] {
        std::optional<Snapshot> base = progress.take_saved();
        if (!base) base = std::move(r.snap);
        return base;
      }());
  if (!too_large.empty()) {
    log_.warn("Task " + in_quotes(id) + " failed: " + too_large);
    fail_after_error(id, item.active, too_large);
    return;
  }
  if (done.found && done.verdict == Verdict::save) {
    mark_stored(*item.active);
    progress.saved();
    if (log_.enabled(LogLevel::debug))
      log_.debug("Task " + in_quotes(id) + " is " + std::string(done.snap.task.state()));
  }
}

void TaskLifecycle::save_working(const std::string &id, const std::shared_ptr<ActiveTask> &active) {
  active->working_saved = true;
  try {
    update(id, [&](Snapshot &s) {
      if (s.task.state() != ts::kSubmitted) return Verdict::keep;
      if (read_lease(s.task).instance != options_.instance_id) return Verdict::keep;
      set_status_event(s.task, ts::kWorking);
      return Verdict::save;
    });
  } catch (const std::exception &e) {
    log_.warn("Task " + in_quotes(id) + ": could not save that it is working: " + e.what());
  }
}

void TaskLifecycle::fail_after_error(const std::string &id, const std::shared_ptr<ActiveTask> &active,
                                     const std::string &what) {
  try {
    // A deferred Task never saved: its failure is its first save (the
    // waiting client is told).
    if (!active->stored.load() &&
        save_unsaved(id, active, [&](Task &t) {
          remove_task_metadata(t, kLeaseKey);
          remove_task_metadata(t, kPendingKey);
          set_status_with_message(t, ts::kFailed, "The server could not complete this Task: " + what);
        }))
      return;
    update(id, [&](Snapshot &s) {
      const std::string_view state = s.task.state();
      if (state != ts::kWorking && state != ts::kSubmitted) return Verdict::stop;
      if (read_lease(s.task).instance != options_.instance_id) return Verdict::stop;
      remove_task_metadata(s.task, kLeaseKey);
      remove_task_metadata(s.task, kPendingKey);
      set_status_with_message(s.task, ts::kFailed, "The server could not complete this Task: " + what);
      return Verdict::save;
    });
  } catch (const std::exception &e) {
    if (!active->stored.load()) {
      // Never saved and now unsavable: its waiter is told, nothing is left.
      const auto *se = dynamic_cast<const StoreError *>(&e);
      watch_.fail(id, se != nullptr ? se->code() : Status::internal, e.what());
      log_.error("Task " + in_quotes(id) + ": could not be saved: " + e.what());
      return;
    }
    log_.error("Task " + in_quotes(id) + ": could not record the failure either: " + e.what() +
               " (its lease will expire and another sweep will settle it)");
  }
}

void TaskLifecycle::fail_unstarted(WorkItem &item, const char *why) {
  if (!item.active->stored.load()) {
    // Never saved, never acknowledged: nothing to record.
    unregister_active(item.id, item.active);
    return;
  }
  try {
    update(
        item.id,
        [&](Snapshot &s) {
          const std::string_view state = s.task.state();
          if (state != ts::kWorking && state != ts::kSubmitted) return Verdict::stop;
          if (read_lease(s.task).instance != options_.instance_id) return Verdict::stop;
          remove_task_metadata(s.task, kLeaseKey);
          set_status_with_message(s.task, ts::kFailed, why);
          return Verdict::save;
        },
        std::move(item.snap));
  } catch (const std::exception &e) {
    log_.error("Task " + in_quotes(item.id) + ": could not record that it was not run: " + e.what());
  }
  unregister_active(item.id, item.active);
}

// ---------------------------------------------------------------------------
// Leases
// ---------------------------------------------------------------------------

void TaskLifecycle::renew_due() {
  const int64_t now = now_us();
  const int64_t due_before = now - int64_t{options_.renew_interval_ms} * 1000;
  const int64_t check_before = now - int64_t{options_.cancel_poll_ms} * 1000;
  const int64_t working_before = now - int64_t{options_.progress_interval_ms} * 1000;
  std::vector<std::pair<std::string, std::shared_ptr<ActiveTask>>> due, check, working;
  {
    std::lock_guard<std::mutex> lock(active_mu_);
    for (const auto &kv : active_) {
      if (!kv.second->stored.load()) {
        // Not in the store yet: no lease to renew, nothing to re-read.
        const int64_t started = kv.second->started_us.load();
        if (started != 0 && started <= working_before && !kv.second->working_saved.load() &&
            !kv.second->cancel.load())
          working.emplace_back(kv.first, kv.second);
        continue;
      }
      const int64_t started = kv.second->started_us.load();
      if (started != 0 && started <= working_before && !kv.second->working_saved.load() && !kv.second->cancel.load())
        working.emplace_back(kv.first, kv.second);
      if (kv.second->lease_written_us.load() <= due_before) due.emplace_back(kv.first, kv.second);
      else if (!kv.second->cancel.load() &&
               std::max(kv.second->lease_written_us.load(), kv.second->checked_us.load()) <= check_before)
        check.emplace_back(kv.first, kv.second);
    }
  }
  // A run that lasts: save that its Task is working (a deferred one is
  // saved for the first time).
  for (auto &[id, active] : working) {
    if (!active->stored.load()) {
      active->working_saved = true;
      try {
        if (save_unsaved(id, active, [](Task &t) { set_status_event(t, ts::kWorking); })) continue;
      } catch (const std::exception &e) {
        log_.warn("Task " + in_quotes(id) + ": could not save it before its outcome: " + e.what());
        continue;
      }
    }
    save_working(id, active);
  }
  // Read-only poll: has another server canceled (or settled, or taken over)
  // a Task running here?
  for (auto &[id, active] : check) {
    try {
      const int64_t t = now_us();
      std::optional<TaskRecord> rec = store_->get(id);
      active->checked_us = t;
      bool gone = !rec;
      if (rec) {
        const Task task = rec->a2a_task();
        const std::string_view state = task.state();
        gone = ts::is_terminal(state) ||
               ((state == ts::kWorking || state == ts::kSubmitted) &&
                read_lease(task).instance != options_.instance_id);
      }
      if (gone) {
        if (log_.enabled(LogLevel::debug))
          log_.debug("Task " + in_quotes(id) + " was canceled, settled or taken over elsewhere; stopping it here");
        active->cancel = true;
      }
    } catch (const std::exception &e) {
      log_.warn("Task " + in_quotes(id) + ": could not check whether it was canceled: " + e.what());
    }
  }
  for (auto &[id, active] : due) {
    try {
      int64_t t = 0;
      UpdateResult r = update(id, [&](Snapshot &s) {
        const std::string_view state = s.task.state();
        if (state != ts::kWorking && state != ts::kSubmitted) return Verdict::stop;
        if (read_lease(s.task).instance != options_.instance_id) return Verdict::stop;
        t = now_us();
        set_lease(s.task, t + int64_t{options_.lease_ms} * 1000);
        return Verdict::save;
      });
      active->checked_us = now_us();
      if (r.found && r.verdict == Verdict::save) {
        active->lease_written_us = t;
      } else if (!r.found || (r.verdict == Verdict::stop && !ts::is_interrupted(r.snap.task.state()))) {
        // Canceled, settled, removed or taken over: stop working on it.
        active->cancel = true;
      }
    } catch (const std::exception &e) {
      log_.warn("Task " + in_quotes(id) + ": could not renew its lease: " + e.what());
    }
  }
}

bool TaskLifecycle::settle_one(TaskRecord &rec) {
  // Decides from the stored Task alone whether nobody runs it any more.
  std::string where;  // host and pid of an old-style lease, for the log only
  auto abandoned = [this, &where](const Task &task, const std::string &id, int64_t now, std::string &why) {
    const Lease l = read_lease(task);
    if (l.present) {
      if (l.instance == options_.instance_id && is_active(id)) return false;
      if (l.expires_us != kNoTime && l.expires_us > now) return false;
      // Clients read this text: instance ids only. (Leases written by older
      // versions also named host and pid; the log line below keeps those.)
      where = (l.host.empty() ? std::string() : " on " + l.host) +
              (l.pid != 0 ? " (pid " + std::to_string(l.pid) + ")" : std::string());
      why = "The server that ran this Task stopped before finishing it: instance '" + l.instance + "'" +
            " did not renew its lease, which expired at " +
            (l.expires_text.empty() ? std::string("an unknown time") : l.expires_text) +
            ". Settled by instance '" + options_.instance_id + "'.";
      return true;
    }
    const int64_t since = task.status_time_us();
    if (since == kNoTime || since + int64_t{options_.lease_ms} * 1000 > now) return false;
    why = "The server that ran this Task stopped before finishing it: no server has held it since " +
          format_timestamp(since) + ". Settled by instance '" + options_.instance_id + "'.";
    return true;
  };
  Snapshot s;
  try {
    s.task = rec.a2a_task();
  } catch (const StoreError &e) {
    log_.warn(std::string("lease sweep: skipping an unreadable Task: ") + e.what());
    return false;
  }
  std::string why;
  if (!abandoned(s.task, rec.id, now_us(), why)) return false;
  s.version = rec.version;
  s.owner = std::move(rec.owner);
  s.tenant = std::move(rec.tenant);
  UpdateResult r = update(
      rec.id,
      [&](Snapshot &x) {
        const std::string_view state = x.task.state();
        if (state != ts::kWorking && state != ts::kSubmitted) return Verdict::stop;
        if (!abandoned(x.task, rec.id, now_us(), why)) return Verdict::stop;
        remove_task_metadata(x.task, kLeaseKey);
        set_status_with_message(x.task, ts::kFailed, why);
        return Verdict::save;
      },
      std::move(s));
  if (r.found && r.verdict == Verdict::save) {
    log_.warn("settled Task '" + rec.id + "': " + why + where);
    return true;
  }
  return false;
}

std::size_t TaskLifecycle::settle_expired() {
  std::size_t settled = 0;
  for (const std::string_view state : {ts::kSubmitted, ts::kWorking}) {
    ListQuery q;
    q.state = std::string(state);
    q.page_size = 200;
    // One unreadable record must not stop the sweep for every other Task:
    // the store hands it over (ABI 1.1 deliver_corrupt, version 0) and it
    // is skipped and reported.
    q.deliver_corrupt = true;
    do {
      ListPage page = store_->list(q);
      for (TaskRecord &rec : page.records) {
        if (rec.version == 0) {
          if (state == ts::kSubmitted)  // delivered to both passes: report once
            log_.warn("lease sweep: skipping an unreadable record '" + rec.id + "'" +
                      (rec.problem.empty() ? std::string() : ": " + rec.problem) +
                      " (run `toolnexus store check` on the store)");
          continue;
        }
        if (settle_one(rec)) ++settled;
      }
      q.cursor = page.next_cursor;
      std::lock_guard<std::mutex> lock(maint_mu_);
      if (stop_maintenance_) return settled;
    } while (!q.cursor.empty());
  }
  return settled;
}

void TaskLifecycle::renewer_loop() {
  const int poll = std::min({options_.renew_interval_ms, std::max(1, options_.cancel_poll_ms),
                             std::max(1, options_.progress_interval_ms)});
  const auto tick = std::chrono::milliseconds(std::max(5, poll / 4));
  std::unique_lock<std::mutex> lock(maint_mu_);
  while (!stop_maintenance_) {
    maint_cv_.wait_for(lock, tick, [this] { return stop_maintenance_; });
    if (stop_maintenance_) break;
    lock.unlock();
    try {
      renew_due();
    } catch (const std::exception &e) {
      log_.error(std::string("lease renewal failed: ") + e.what());
    }
    lock.lock();
  }
}

void TaskLifecycle::settler_loop() {
  const auto interval = std::chrono::milliseconds(std::max(5, options_.settle_interval_ms));
  std::unique_lock<std::mutex> lock(maint_mu_);
  while (!stop_maintenance_) {
    lock.unlock();
    try {
      const std::size_t n = settle_expired();
      if (n != 0) log_.info("lease sweep settled " + std::to_string(n) + " abandoned Task(s)");
    } catch (const std::exception &e) {
      log_.error(std::string("lease sweep failed: ") + e.what());
    }
    lock.lock();
    maint_cv_.wait_for(lock, interval, [this] { return stop_maintenance_; });
  }
}

}  // namespace toolnexus::server_detail

// Fulfilment of Tasks: the lifecycle itself, transitions through the store
// with compare-and-set, and the requests (create, resume, cancel, wait).
// Workers and runs: task_runs.cpp; leases and settling: task_leases.cpp.
#include "domain/task_lifecycle.hpp"
#include "domain/task_lifecycle_detail.hpp"

#include "domain/task_idempotency.hpp"
#include "domain/task_timeline.hpp"
#include "toolnexus/task_store.h"
#include "common/util.hpp"

#include <unistd.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <set>

namespace toolnexus::server_detail {

namespace ts = toolnexus::task_state;

using namespace lifecycle_detail;

TaskLifecycle::TaskLifecycle(std::shared_ptr<TaskStore> store, std::shared_ptr<AgentExecutor> executor,
                             LifecycleOptions options, const Logger &log, TaskWatch &watch)
    : store_(std::move(store)), executor_(std::move(executor)), options_(std::move(options)), log_(log),
      watch_(watch) {
  if (options_.instance_id.empty()) options_.instance_id = new_uuid();
  start_us_ = now_us();
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
  // The feed first: the renewer reads feed_ (set before it starts, reset
  // after it ends).
  try {
    feed_ = store_->watch_changes([this](const StoreChange &c) { on_store_change(c); });
  } catch (const std::exception &e) {
    log_.warn(std::string("the store's change feed did not start (checking running Tasks for cancels by polling "
                          "instead): ") + e.what());
  }
  for (unsigned i = 0; i < options_.workers; ++i)
    workers_.push_back(start_named_thread("tnx-run", [this] { worker_loop(); }));
  renewer_ = start_named_thread("tnx-renew", [this] { renewer_loop(); });
  settler_ = start_named_thread("tnx-settle", [this] { settler_loop(); });
}

void TaskLifecycle::on_store_change(const StoreChange &c) {
  bool marked = false;
  {
    std::lock_guard<std::mutex> lock(active_mu_);
    if (c.kind == StoreChange::Kind::gap) {
      for (auto &kv : active_) kv.second->recheck = marked = true;
    } else {
      auto it = active_.find(c.id);
      if (it != active_.end()) it->second->recheck = marked = true;
    }
  }
  if (!marked) return;
  {
    std::lock_guard<std::mutex> lock(maint_mu_);
    recheck_now_ = true;
  }
  maint_cv_.notify_all();
}

void TaskLifecycle::begin_stop() {
  stopping_ = true;
  // Blocking waits return now, so requests in progress end; streams go on
  // (the server's stop drains them, see TaskWatch::begin_drain).
  watch_.release_waiters();
  {
    std::lock_guard<std::mutex> lock(queue_mu_);  // a worker checks stopping_ under it
  }
  slot_cv_.notify_all();
}

bool TaskLifecycle::wait_idle(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(queue_mu_);
  return idle_cv_.wait_until(lock, deadline, [this] { return running_ == 0; });
}

bool TaskLifecycle::running_here(const std::string &id) {
  std::lock_guard<std::mutex> lock(active_mu_);
  auto it = active_.find(id);
  return it != active_.end() && it->second->started_us.load() != 0;
}

std::size_t TaskLifecycle::running() {
  std::lock_guard<std::mutex> lock(active_mu_);
  std::size_t n = 0;
  for (const auto &[id, task] : active_) n += task->started_us.load() != 0 ? 1 : 0;
  return n;
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
        for (auto &kv : active_) {
          kv.second->stopped_by_server = true;
          kv.second->cancel = true;
        }
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
    feed_.reset();  // after the renewer (it reads feed_); waits for a listener call in progress
  });
}

std::mutex &TaskLifecycle::stripe(std::string_view id) {
  return stripes_[std::hash<std::string_view>{}(id) % stripes_.size()];
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

std::shared_ptr<TaskLifecycle::ActiveTask> TaskLifecycle::adopt_if_idle(const std::string &id) {
  std::lock_guard<std::mutex> lock(active_mu_);
  if (active_.count(id) != 0) return nullptr;
  auto a = std::make_shared<ActiveTask>();
  a->lease_written_us = 0;  // renewed at the renewer's next pass
  active_[id] = a;
  return a;
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
                           bool defer_save, bool *retry) {
  if (stopping_) throw LifecycleError(LifecycleErrc::stopping, "the server is stopping");
  admit();
  const IdempotencyRules &idem = options_.idempotency;
  const bool caller_waits = defer_save;
  // Retries are recognised by the stored Task: it must be stored before it
  // runs, so a retry arriving meanwhile finds it rather than making another.
  defer_save = defer_save && cas_ && !idem.enabled;
  Task t;
  auto &a = t.allocator();
  std::string ctx(str(find(message, "contextId")));
  const std::string message_id(str(find(message, "messageId")));
  const std::string id = idem.enabled ? idempotent_task_id(tenant, owner, ctx, message_id) : new_uuid();
  const std::string digest = idem.enabled ? message_digest(message) : std::string();
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
  if (idem.enabled) remember_message(t, message_id, digest, now, idem);
  if (prepare) prepare(t);
  start_timeline(t);
  add_status_event(t);
  refuse_if_too_large(t, "params.message would make the new Task", "; no Task was created");

  Snapshot snap{std::move(t), 0, owner, tenant};
  if (!defer_save) {
    SaveOptions so;
    so.expected_version = cas_ ? kNoVersion : kAnyVersion;
    so.owner = owner;
    so.tenant = tenant;
    so.due_us = due_time(snap.task);
    // Without compare-and-set, create-only is made atomic within this
    // process by the id's stripe lock.
    std::unique_lock<std::mutex> lock;
    if (!cas_ && idem.enabled) {
      lock = std::unique_lock<std::mutex>(stripe(id));
      if (store_->get(id)) {
        lock.unlock();
        if (retry != nullptr) *retry = true;
        return created_before(id, message_id, digest, owner, tenant, hold);
      }
    }
    try {
      snap.version = store_->save(snap.task, so);
    } catch (const StoreError &e) {
      // A lost answer of a save that was made: the Task is stored, run it
      // (a retry of this message would otherwise find it never run).
      if (e.code() != Status::conflict && saved_anyway(id, snap, so.expected_version)) goto saved;
      if (e.code() != Status::conflict || !idem.enabled) throw;
      // The id is taken: the first send of this message made it.
      if (retry != nullptr) *retry = true;
      return created_before(id, message_id, digest, owner, tenant, hold);
    }
  }
saved:
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

Task TaskLifecycle::created_before(const std::string &id, const std::string &message_id, const std::string &digest,
                                   const std::string &owner, const std::string &tenant,
                                   std::unique_ptr<TaskWatch::Hold> *hold) {
  // Held before the read: no save between the read and the caller's wait
  // is missed.
  std::unique_ptr<TaskWatch::Hold> h = watch_.hold(id);
  std::optional<TaskRecord> rec = store_->get(id);
  if (!rec)  // removed since the save found it: rare; the client may send again
    throw StoreError(Status::conflict, "Task " + in_quotes(id) + " was removed while a retry of its message read it");
  if (rec->owner != owner || rec->tenant != tenant)  // the id names both: not a retry of this caller's
    throw LifecycleError(LifecycleErrc::message_reused, reused_message_text(message_id));
  auto snap = std::make_shared<Snapshot>(Snapshot{rec->a2a_task(), rec->version, rec->owner, rec->tenant});
  switch (seen_message(snap->task, message_id, digest, now_us(), options_.idempotency.window_ms)) {
    case SeenMessage::same: break;
    case SeenMessage::different: throw LifecycleError(LifecycleErrc::message_reused, reused_message_text(message_id));
    case SeenMessage::no: {
      // Past the window (or pushed out of the list): the Task's first
      // message is the one its id was made from.
      const rapidjson::Value *history = find(snap->task.json(), "history");
      const bool same = history != nullptr && history->IsArray() && !history->Empty() &&
                        str(find((*history)[0], "messageId")) == message_id &&
                        message_digest((*history)[0]) == digest;
      if (!same) throw LifecycleError(LifecycleErrc::message_reused, reused_message_text(message_id));
    }
  }
  // Saved by this server but never run: the save's answer was lost and the
  // check after it failed too, so the send that made it was answered an
  // error. It is ours (our lease) and idle here: run it now, so that this
  // retry gets its outcome instead of waiting for the lease to expire.
  if (snap->task.state() == ts::kSubmitted && read_lease(snap->task).instance == options_.instance_id) {
    if (auto active = adopt_if_idle(id)) {
      log_.warn("Task " + in_quotes(id) + ": saved by this server but never run (a lost save answer); running it");
      run_or_enqueue(WorkItem{id, std::move(active), *snap}, false);
    }
  }
  h->offer(snap);
  Task result = snap->task;
  if (hold != nullptr) *hold = std::move(h);
  return result;
}

Task TaskLifecycle::resume(std::string_view task_id, const rapidjson::Value &message, const std::string &owner,
                           const std::string &tenant, std::unique_ptr<TaskWatch::Hold> *hold,
                           const std::function<void(Task &)> &prepare, bool caller_waits,
                           std::optional<uint64_t> if_generation, bool *retry) {
  if (stopping_) throw LifecycleError(LifecycleErrc::stopping, "the server is stopping");
  admit();
  const std::string id(task_id);
  const std::string not_found = "Task " + in_quotes(id) + " not found";
  const IdempotencyRules &idem = options_.idempotency;
  const std::string message_id(str(find(message, "messageId")));
  const std::string digest = idem.enabled ? message_digest(message) : std::string();
  int64_t lease_time = 0;
  bool retried = false;
  UpdateResult r = update(id, [&](Snapshot &s) {
    retried = false;
    if (s.owner != owner || s.tenant != tenant) throw LifecycleError(LifecycleErrc::not_found, not_found);
    if (idem.enabled) {
      // Before the generation and the state: the first send of this
      // message changed both.
      switch (seen_message(s.task, message_id, digest, now_us(), idem.window_ms)) {
        case SeenMessage::same: retried = true; return Verdict::keep;
        case SeenMessage::different: throw LifecycleError(LifecycleErrc::message_reused, reused_message_text(message_id));
        case SeenMessage::no: break;
      }
    }
    check_generation(s.task, if_generation);
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
                           "params.message.contextId " + in_quotes(msg_ctx) +
                               " does not match the contextId of Task " + in_quotes(id));
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
    if (idem.enabled) remember_message(s.task, message_id, digest, lease_time, idem);
    refuse_if_too_large(s.task, "params.message would make Task '" + id + "'", "; the Task is unchanged");
    return Verdict::save;
  });
  if (!r.found) throw LifecycleError(LifecycleErrc::not_found, not_found);
  if (hold != nullptr) *hold = watch_.hold(id, std::make_shared<const Snapshot>(r.snap));
  if (retried) {
    if (retry != nullptr) *retry = true;
    return std::move(r.snap.task);
  }
  auto active = register_active(id, lease_time);
  active->working_saved = true;
  Task result = r.snap.task;
  run_or_enqueue(WorkItem{id, std::move(active), std::move(r.snap)}, caller_waits);
  return result;
}

Task TaskLifecycle::cancel(std::string_view task_id, const std::string &owner, const std::string &tenant,
                          std::optional<uint64_t> if_generation) {
  const std::string id(task_id);
  const std::string not_found = "Task " + in_quotes(id) + " not found";
  UpdateResult r = update(id, [&](Snapshot &s) {
    if (s.owner != owner || s.tenant != tenant) throw LifecycleError(LifecycleErrc::not_found, not_found);
    check_generation(s.task, if_generation);
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

Snapshot TaskLifecycle::wait_for_generation(const std::string &task_id, const std::string &owner,
                                            const std::string &tenant, uint64_t after,
                                            std::chrono::milliseconds timeout) {
  const auto not_found = [&] {
    return LifecycleError(LifecycleErrc::not_found, "Task " + in_quotes(task_id) + " not found");
  };
  // Held before the read, so a save between the read and the wait is
  // captured, not missed.
  std::unique_ptr<TaskWatch::Hold> hold = watch_.hold(task_id);
  std::optional<TaskRecord> rec = store_->get(task_id);
  if (!rec || rec->owner != owner || rec->tenant != tenant) throw not_found();
  auto snap = std::make_shared<Snapshot>(Snapshot{rec->a2a_task(), rec->version, rec->owner, rec->tenant});
  // A terminal Task's generation never moves again (A2A 1.1 draft, section
  // 3.2.7: nothing to wait for), and no timeout: both answered at once.
  if (task_generation(snap->task) > after || ts::is_terminal(snap->task.state()) || timeout.count() <= 0)
    return std::move(*snap);
  hold->offer(snap);
  bool gone = false;
  SnapshotPtr latest = watch_.wait(
      *hold, [after](const Snapshot &s) { return task_generation(s.task) > after; }, timeout, &gone);
  if (gone || !latest || latest->owner != owner || latest->tenant != tenant) throw not_found();
  return *latest;
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
  so.due_us = due_time(s.task);
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

}  // namespace toolnexus::server_detail

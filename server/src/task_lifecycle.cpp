// Fulfilment of Tasks: worker pool, transitions through the store with
// compare-and-set, leases, settling of abandoned Tasks.
#include "task_lifecycle.hpp"

#include "toolnexus/task_store.h"
#include "util.hpp"

#include <unistd.h>

#include <algorithm>
#include <functional>

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

// Sets a new status with an agent message (also appended to history).
void set_status_with_message(Task &task, std::string_view state, std::string_view text) {
  auto &a = task.allocator();
  const std::string id(task.id()), ctx(task.context_id());
  rapidjson::Value msg = agent_message(text, id, ctx, a);
  rapidjson::Value copy(msg, a);
  append_history(task, std::move(copy));
  task.set_status(state, std::move(msg));
}

// Saves an executor's outcome into `task` (which is working).
void apply_result(Task &task, const ExecutionResult &res) {
  auto &a = task.allocator();
  if (res.artifacts.IsArray() && !res.artifacts.Empty()) {
    rapidjson::Value *arts = find(task.json(), "artifacts");
    if (arts == nullptr || !arts->IsArray()) {
      set_member(task.json(), "artifacts", rapidjson::Value(rapidjson::kArrayType), a);
      arts = find(task.json(), "artifacts");
    }
    for (const auto &art : res.artifacts.GetArray()) {
      rapidjson::Value copy(art, a);
      if (copy.IsObject() && find(copy, "artifactId") == nullptr)
        copy.AddMember("artifactId", make_string(new_uuid(), a), a);
      arts->PushBack(copy, a);
    }
  }
  remove_task_metadata(task, kLeaseKey);
  remove_task_metadata(task, kPendingKey);
  using O = ExecutionResult::Outcome;
  switch (res.outcome) {
    case O::completed:
      if (res.message.empty()) task.set_status(ts::kCompleted);
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
                             LifecycleOptions options, const Logger &log)
    : store_(std::move(store)), executor_(std::move(executor)), options_(std::move(options)), log_(log) {
  if (options_.instance_id.empty()) options_.instance_id = new_uuid();
  if (options_.workers == 0) options_.workers = 4;
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
  for (unsigned i = 0; i < options_.workers; ++i) workers_.emplace_back([this] { worker_loop(); });
  renewer_ = std::thread([this] { renewer_loop(); });
  settler_ = std::thread([this] { settler_loop(); });
}

void TaskLifecycle::begin_stop() {
  stopping_ = true;
  notify_waiters();
}

void TaskLifecycle::stop() {
  std::call_once(stop_once_, [this] {
    stopping_ = true;
    notify_waiters();
    std::deque<WorkItem> left;
    {
      std::unique_lock<std::mutex> lock(queue_mu_);
      left.swap(queue_);
      queued_ = 0;
      stop_workers_ = true;
      queue_cv_.notify_all();
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
      r.snap.task = rec->task();
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
      return r;
    } catch (const StoreError &e) {
      // Someone else saved first: read again and decide again.
      if (e.code() != Status::conflict || attempt >= kMaxSaveAttempts) throw;
    }
  }
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

void TaskLifecycle::notify_waiters() {
  if (waiting_.load() == 0) return;
  {
    std::lock_guard<std::mutex> lock(wait_mu_);
    ++wait_epoch_;
  }
  wait_cv_.notify_all();
}

// ---------------------------------------------------------------------------
// Requests
// ---------------------------------------------------------------------------

Task TaskLifecycle::create(const rapidjson::Value &message, const std::string &owner, const std::string &tenant) {
  if (stopping_) throw LifecycleError(LifecycleErrc::stopping, "the server is stopping");
  admit();
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

  SaveOptions so;
  so.expected_version = cas_ ? kNoVersion : kAnyVersion;
  so.owner = owner;
  so.tenant = tenant;
  const uint64_t version = store_->save(t, so);
  auto active = register_active(id, now);
  enqueue(WorkItem{id, std::move(active), Snapshot{t, version, owner, tenant}});
  return t;
}

Task TaskLifecycle::resume(std::string_view task_id, const rapidjson::Value &message, const std::string &owner,
                           const std::string &tenant) {
  if (stopping_) throw LifecycleError(LifecycleErrc::stopping, "the server is stopping");
  admit();
  const std::string id(task_id);
  const std::string not_found = "Task '" + id + "' not found";
  int64_t lease_time = 0;
  UpdateResult r = update(id, [&](Snapshot &s) {
    if (s.owner != owner || s.tenant != tenant) throw LifecycleError(LifecycleErrc::not_found, not_found);
    const std::string state(s.task.state());
    if (ts::is_terminal(state))
      throw LifecycleError(LifecycleErrc::terminal, "Task '" + id + "' is " + state +
                                                        "; a terminal Task accepts no more messages");
    if (!ts::is_interrupted(state))
      throw LifecycleError(LifecycleErrc::not_interrupted,
                           "Task '" + id + "' is " + (state.empty() ? std::string("in no state") : state) +
                               "; it accepts a message only while input-required or auth-required");
    const std::string_view msg_ctx = str(find(message, "contextId"));
    if (!msg_ctx.empty() && msg_ctx != s.task.context_id())
      throw LifecycleError(LifecycleErrc::context_mismatch,
                           "params.message.contextId '" + std::string(msg_ctx) +
                               "' does not match the contextId of Task '" + id + "'");
    auto &a = s.task.allocator();
    const std::string ctx(s.task.context_id());
    append_history(s.task, bound_message(message, id, ctx, a));
    s.task.set_status(ts::kWorking);
    lease_time = now_us();
    set_lease(s.task, lease_time + int64_t{options_.lease_ms} * 1000);
    return Verdict::save;
  });
  if (!r.found) throw LifecycleError(LifecycleErrc::not_found, not_found);
  auto active = register_active(id, lease_time);
  Task result = r.snap.task;
  enqueue(WorkItem{id, std::move(active), std::move(r.snap)});
  return result;
}

Task TaskLifecycle::cancel(std::string_view task_id, const std::string &owner, const std::string &tenant) {
  const std::string id(task_id);
  const std::string not_found = "Task '" + id + "' not found";
  UpdateResult r = update(id, [&](Snapshot &s) {
    if (s.owner != owner || s.tenant != tenant) throw LifecycleError(LifecycleErrc::not_found, not_found);
    const std::string state(s.task.state());
    if (ts::is_terminal(state))
      throw LifecycleError(LifecycleErrc::not_cancelable,
                           "Task '" + id + "' is already " + state + " and cannot be canceled");
    remove_task_metadata(s.task, kLeaseKey);
    remove_task_metadata(s.task, kPendingKey);
    s.task.set_status(ts::kCanceled);
    return Verdict::save;
  });
  if (!r.found) throw LifecycleError(LifecycleErrc::not_found, not_found);
  signal_cancel(id);
  notify_waiters();
  return std::move(r.snap.task);
}

Task TaskLifecycle::wait_until_settled(std::string_view task_id, const std::string &owner,
                                       const std::string &tenant, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  ++waiting_;
  struct Done {
    std::atomic<int> &n;
    ~Done() { --n; }
  } done{waiting_};
  for (;;) {
    uint64_t epoch;
    {
      std::lock_guard<std::mutex> lock(wait_mu_);
      epoch = wait_epoch_;
    }
    std::optional<TaskRecord> rec = store_->get(task_id);
    if (!rec || rec->owner != owner || rec->tenant != tenant)
      throw LifecycleError(LifecycleErrc::not_found, "Task '" + std::string(task_id) + "' not found");
    Task t = rec->task();
    const auto now = std::chrono::steady_clock::now();
    if (ts::is_terminal(t.state()) || ts::is_interrupted(t.state()) || now >= deadline || stopping_)
      return t;
    // Woken by a transition made here; the poll covers other servers.
    std::unique_lock<std::mutex> lock(wait_mu_);
    wait_cv_.wait_until(lock, std::min(deadline, now + std::chrono::milliseconds(100)),
                        [&] { return wait_epoch_ != epoch || stopping_; });
  }
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
      queue_cv_.notify_one();
      return;
    }
  }
  fail_unstarted(item, "The server stopped before running this Task.");
}

void TaskLifecycle::worker_loop() {
  for (;;) {
    WorkItem item;
    {
      std::unique_lock<std::mutex> lock(queue_mu_);
      queue_cv_.wait(lock, [this] { return stop_workers_ || !queue_.empty(); });
      if (stop_workers_) return;
      item = std::move(queue_.front());
      queue_.pop_front();
      --queued_;
      ++running_;
    }
    room_cv_.notify_one();
    try {
      run(item);
    } catch (const StoreError &e) {
      // Details (paths, backend messages) go to the log, not to the client.
      log_.error("Task '" + item.id + "': the task store failed during fulfilment: " + e.what());
      fail_after_error(item.id, std::string("the task store failed (") + status_name(e.code()) +
                                    "); details are in the server log");
    } catch (const std::exception &e) {
      log_.error("Task '" + item.id + "': fulfilment failed: " + e.what());
      fail_after_error(item.id, e.what());
    } catch (...) {
      log_.error("Task '" + item.id + "': fulfilment failed with an unknown exception");
      fail_after_error(item.id, "unknown error");
    }
    unregister_active(item.id, item.active);
    {
      std::lock_guard<std::mutex> lock(queue_mu_);
      --running_;
      if (running_ == 0) idle_cv_.notify_all();
    }
  }
}

void TaskLifecycle::run(WorkItem &item) {
  const std::string &id = item.id;
  // 1. submitted -> working (a resumed Task is working already).
  int64_t lease_time = 0;
  UpdateResult r = update(
      id,
      [&](Snapshot &s) {
        const std::string_view state = s.task.state();
        if (ts::is_terminal(state) || ts::is_interrupted(state)) return Verdict::stop;
        if (read_lease(s.task).instance != options_.instance_id) return Verdict::stop;
        if (state == ts::kWorking) return Verdict::keep;
        s.task.set_status(ts::kWorking);
        lease_time = now_us();
        set_lease(s.task, lease_time + int64_t{options_.lease_ms} * 1000);
        return Verdict::save;
      },
      std::move(item.snap));
  if (!r.found || r.verdict == Verdict::stop) return;
  if (r.verdict == Verdict::save) item.active->lease_written_us = lease_time;
  if (item.active->cancel) return;

  // 2. The executor, outside any lock; its exceptions become a failure.
  ExecutionResult result;
  {
    const std::string latest = latest_user_text(r.snap.task);
    const ExecutionContext ctx{r.snap.task, task_metadata(r.snap.task, kPendingKey), latest,
                               item.active->cancel};
    try {
      result = executor_->execute(ctx);
    } catch (const std::exception &e) {
      result = ExecutionResult::failed(std::string("The agent failed: ") + e.what());
    } catch (...) {
      result = ExecutionResult::failed("The agent failed with an unknown error.");
    }
  }

  // 3. Save the outcome unless the Task was canceled or settled meanwhile.
  UpdateResult done = update(
      id,
      [&](Snapshot &s) {
        const std::string_view state = s.task.state();
        if (state != ts::kWorking && state != ts::kSubmitted) return Verdict::stop;
        if (read_lease(s.task).instance != options_.instance_id) return Verdict::stop;
        apply_result(s.task, result);
        return Verdict::save;
      },
      std::move(r.snap));
  if (done.found && done.verdict == Verdict::save) {
    notify_waiters();
    if (log_.enabled(LogLevel::debug))
      log_.debug("Task '" + id + "' is " + std::string(done.snap.task.state()));
  }
}

void TaskLifecycle::fail_after_error(const std::string &id, const std::string &what) {
  try {
    update(id, [&](Snapshot &s) {
      const std::string_view state = s.task.state();
      if (state != ts::kWorking && state != ts::kSubmitted) return Verdict::stop;
      if (read_lease(s.task).instance != options_.instance_id) return Verdict::stop;
      remove_task_metadata(s.task, kLeaseKey);
      remove_task_metadata(s.task, kPendingKey);
      set_status_with_message(s.task, ts::kFailed, "The server could not complete this Task: " + what);
      return Verdict::save;
    });
    notify_waiters();
  } catch (const std::exception &e) {
    log_.error("Task '" + id + "': could not record the failure either: " + e.what() +
               " (its lease will expire and another sweep will settle it)");
  }
}

void TaskLifecycle::fail_unstarted(WorkItem &item, const char *why) {
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
    log_.error("Task '" + item.id + "': could not record that it was not run: " + e.what());
  }
  unregister_active(item.id, item.active);
  notify_waiters();
}

// ---------------------------------------------------------------------------
// Leases
// ---------------------------------------------------------------------------

void TaskLifecycle::renew_due() {
  const int64_t now = now_us();
  const int64_t due_before = now - int64_t{options_.renew_interval_ms} * 1000;
  const int64_t check_before = now - int64_t{options_.cancel_poll_ms} * 1000;
  std::vector<std::pair<std::string, std::shared_ptr<ActiveTask>>> due, check;
  {
    std::lock_guard<std::mutex> lock(active_mu_);
    for (const auto &kv : active_) {
      if (kv.second->lease_written_us.load() <= due_before) due.emplace_back(kv.first, kv.second);
      else if (!kv.second->cancel.load() &&
               std::max(kv.second->lease_written_us.load(), kv.second->checked_us.load()) <= check_before)
        check.emplace_back(kv.first, kv.second);
    }
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
        const Task task = rec->task();
        const std::string_view state = task.state();
        gone = ts::is_terminal(state) ||
               ((state == ts::kWorking || state == ts::kSubmitted) &&
                read_lease(task).instance != options_.instance_id);
      }
      if (gone) {
        if (log_.enabled(LogLevel::debug))
          log_.debug("Task '" + id + "' was canceled, settled or taken over elsewhere; stopping it here");
        active->cancel = true;
      }
    } catch (const std::exception &e) {
      log_.warn("Task '" + id + "': could not check whether it was canceled: " + e.what());
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
      log_.warn("Task '" + id + "': could not renew its lease: " + e.what());
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
    s.task = rec.task();
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
    notify_waiters();
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
  const int poll = std::min(options_.renew_interval_ms, std::max(1, options_.cancel_poll_ms));
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

// The lifecycle's workers and runs: the queue, a run of the executor, its
// progress reports (RunProgress) saved at most every progress_interval_ms
// (see task_lifecycle.hpp).
#include "domain/task_lifecycle.hpp"
#include "domain/task_lifecycle_detail.hpp"

#include "domain/task_timeline.hpp"
#include "toolnexus/task_store.h"
#include "common/util.hpp"

#include <unistd.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <set>
#include <thread>

namespace toolnexus::server_detail {

namespace ts = toolnexus::task_state;

using namespace lifecycle_detail;

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
  // Stopping: the Task's streams were kept open while it ran here
  // (running_here); now they are looked at again.
  if (stopping_.load()) watch_.poke(item.id);
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
// progress_interval_ms, and in any case with the result. A report that
// comes sooner is held, and saved by the renewer thread (flush_if_due) once
// progress_interval_ms have passed since the last save, whether or not
// another report follows: every report reaches the store, and so the
// streams, within progress_interval_ms (plus one renewer wake-up and one
// save) of being made.
//
// Thread-safety: the executor's thread makes the reports, the renewer
// thread flushes; mu_ serialises them. Once close() has returned (the run's
// executor returned) nothing but the run's own thread touches it, and the
// references it was built with are never used again, so the renewer may
// hold it longer.
class TaskLifecycle::RunProgress final : public TaskProgress {
 public:
  RunProgress(TaskLifecycle &lc, const std::string &id, const std::shared_ptr<ActiveTask> &active,
              const Snapshot &start)
      : lc_(lc), id_(id), active_(active), start_(start), last_save_(std::chrono::steady_clock::now()) {}

  void status(std::string_view text) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_ || active_->cancel) return;
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
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_ || active_->cancel) return;
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

  /// Saves the held reports when progress_interval_ms have passed since
  /// the last save (else asks the renewer to come back then). Called by the
  /// renewer thread; does nothing once closed.
  void flush_if_due(std::chrono::steady_clock::time_point now) {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_ || pending_.empty() || active_->cancel) return;
    const auto due = last_save_ + std::chrono::milliseconds(lc_.options_.progress_interval_ms);
    if (now < due) {
      lc_.flush_at(due);
      return;
    }
    save(now);
  }

  /// The executor returned: no more reports, no more flushes (waits for a
  /// flush in progress). The outcome's save takes what is still held.
  /// Idempotent.
  void close() {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
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

  // mu_ held.
  void maybe_save() {
    const auto now = std::chrono::steady_clock::now();
    const auto due = last_save_ + std::chrono::milliseconds(lc_.options_.progress_interval_ms);
    if (now < due) {
      // Held: the renewer saves it at `due` unless a later report does.
      lc_.flush_at(due);
      return;
    }
    save(now);
  }

  // mu_ held.
  void save(std::chrono::steady_clock::time_point now) {
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
  std::mutex mu_;
  bool closed_ = false;
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
  auto progress_ptr = std::make_shared<RunProgress>(*this, id, item.active, r.snap);
  RunProgress &progress = *progress_ptr;
  // Held reports are flushed by the renewer (flush_progress) until the
  // executor returns; detached and closed however run() ends.
  {
    std::lock_guard<std::mutex> lock(active_mu_);
    item.active->progress = progress_ptr;
  }
  struct Detach {
    TaskLifecycle &lc;
    ActiveTask &active;
    RunProgress &progress;
    ~Detach() {
      progress.close();
      std::lock_guard<std::mutex> lock(lc.active_mu_);
      active.progress.reset();
    }
  } detach{*this, *item.active, progress};
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
  progress.close();
  if (item.active->stopped_by_server.load()) {
    // What an agent returns when asked to stop says nothing true about the
    // Task (the echo agent says "canceled"; nobody canceled it).
    result = ExecutionResult::failed("The server stopped before this Task finished: its agent was still running when "
                                     "the drain timeout (" +
                                     std::to_string(options_.drain_timeout_ms) +
                                     " ms) passed, and was asked to stop; send the message again to run it anew.");
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

bool TaskLifecycle::saved_anyway(std::string_view id, Snapshot &snap, uint64_t expected) noexcept {
  try {
    std::optional<TaskRecord> rec;
    for (int attempt = 0;; ++attempt) {  // the read may fail as the save did: a few tries, bounded
      try {
        rec = store_->get(id);
        break;
      } catch (const StoreError &) {
        if (attempt == 2) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(10 << (2 * attempt)));  // 10, 40 ms
      }
    }
    if (!rec || (expected != kAnyVersion && rec->version != expected + 1)) return false;
    if (rec->json != snap.task.to_json()) return false;
    snap.version = rec->version;
    log_.warn("Task " + in_quotes(std::string(id)) + ": a save the store reported failed was applied (version " +
              std::to_string(rec->version) + "); going on");
    return true;
  } catch (...) {
    return false;
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
    // The store just failed; it may fail again at once (a connection
    // being re-made, a busy disk): a few tries, bounded (about 0.5 s), then
    // the lease is left to settle it.
    for (int attempt = 0;; ++attempt) {
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
        return;
      } catch (const StoreError &) {
        if (attempt == 3) throw;
        std::this_thread::sleep_for(std::chrono::milliseconds(20 << (2 * attempt)));  // 20, 80, 320 ms
      }
    }
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
    // A blocking client waiting for it is told now that the store failed,
    // not when the lease expires: it may retry (the same messageId finds
    // this Task, idempotency.hpp) or read the Task later.
    const auto *se = dynamic_cast<const StoreError *>(&e);
    watch_.fail(id, se != nullptr ? se->code() : Status::internal, e.what());
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


void TaskLifecycle::flush_at(std::chrono::steady_clock::time_point when) {
  const int64_t t = when.time_since_epoch().count();
  int64_t cur = next_flush_.load();
  while (t < cur) {
    if (next_flush_.compare_exchange_weak(cur, t)) {
      // Under the lock: the renewer is either waiting (and is woken) or
      // about to compute its wake-up time (and sees the new one).
      { std::lock_guard<std::mutex> lock(maint_mu_); }
      maint_cv_.notify_all();
      return;
    }
  }
}

void TaskLifecycle::flush_progress() {
  next_flush_ = std::numeric_limits<int64_t>::max();
  std::vector<std::shared_ptr<RunProgress>> runs;
  {
    std::lock_guard<std::mutex> lock(active_mu_);
    for (const auto &kv : active_)
      if (kv.second->progress) runs.push_back(kv.second->progress);
  }
  const auto now = std::chrono::steady_clock::now();
  for (const auto &p : runs) {
    try {
      p->flush_if_due(now);
    } catch (const std::exception &e) {
      log_.warn(std::string("saving a run's progress failed: ") + e.what());
    }
  }
}

}  // namespace toolnexus::server_detail

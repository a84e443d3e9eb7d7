// server/src/domain/task_lifecycle_detail.hpp: helpers the parts of the
// lifecycle share (task_lifecycle.cpp: requests; task_runs.cpp: workers and
// runs; task_leases.cpp: leases and settling). Internal to domain/.
#ifndef TOOLNEXUS_SERVER_DOMAIN_TASK_LIFECYCLE_DETAIL_HPP
#define TOOLNEXUS_SERVER_DOMAIN_TASK_LIFECYCLE_DETAIL_HPP

#include "domain/task_lifecycle.hpp"

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

namespace toolnexus::server_detail::lifecycle_detail {

/// How often a save is tried again after compare-and-set conflicts.
inline constexpr int kMaxSaveAttempts = 1000;

/// A Task's lease (metadata kLeaseKey), as read.
struct Lease {
  bool present = false;
  std::string instance;
  std::string host;
  int64_t pid = 0;
  std::string expires_text;
  /// kNoTime when absent or unparsable.
  int64_t expires_us = kNoTime;
};

/// The Task's lease (present = false when it has none).
Lease read_lease(const Task &task);

/// The text of the newest user message in history ("" = none).
std::string latest_user_text(const Task &task);

/// A copy of `message` for the Task's history, bound to the Task (taskId,
/// contextId, kind), allocated in `a`.
rapidjson::Value bound_message(const rapidjson::Value &message, std::string_view task_id,
                               std::string_view context_id, rapidjson::Document::AllocatorType &a);

/// Sets a new status with an agent message (also appended to history) and
/// records the status event.
void set_status_with_message(Task &task, std::string_view state, std::string_view text);

/// Sets a new status without a message and records the status event.
void set_status_event(Task &task, std::string_view state);

/// The ifGenerationMatch precondition (A2A 1.1 section 3.2.2): throws
/// LifecycleError(generation_mismatch), naming both generations, when
/// `expected` is set and differs from task_generation(task).
void check_generation(const Task &task, std::optional<uint64_t> expected);

/// The Task's artifacts array (created when missing).
rapidjson::Value &artifacts_of(Task &task);

/// Saves an executor's outcome into `task` (which is submitted or working):
/// artifacts with their events, the final or interrupted status, the
/// pending request of input-required; the lease is removed.
void apply_result(Task &task, const ExecutionResult &res);

}  // namespace toolnexus::server_detail::lifecycle_detail

namespace toolnexus::server_detail {

// TaskLifecycle::update, used by every part of the lifecycle.
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
    so.due_us = due_time(r.snap.task);
    try {
      r.snap.version = store_->save(r.snap.task, so);
      watch_.publish(r.snap);
      return r;
    } catch (const StoreError &e) {
      if (e.code() != Status::conflict) {
        // An ambiguous failure (a connection lost after the write was
        // made?): when the record holds exactly what this save wrote, it
        // was applied; go on as if the store had said so.
        if (!saved_anyway(id, r.snap, so.expected_version)) throw;
        watch_.publish(r.snap);
        return r;
      }
      // Someone else saved first: read again and decide again.
      if (attempt >= lifecycle_detail::kMaxSaveAttempts) throw;
    }
  }
}

}  // namespace toolnexus::server_detail

#endif  // TOOLNEXUS_SERVER_DOMAIN_TASK_LIFECYCLE_DETAIL_HPP

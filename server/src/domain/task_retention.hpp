// server/src/domain/task_retention.hpp: the retention sweep (issue 22.3;
// policy in toolnexus/retention.hpp). One step reads, per state that has a
// rule, either the Tasks whose due time passed (a store with a due index:
// the cost is what is due) or those whose status time is older than the
// rule (a full pass: a store without the index, the server's first and
// hourly sweeps, `toolnexus store gc`), and for each record:
//   - a terminal Task past its keep time is deleted with a compare-and-set
//     delete of the version read (its push configs live in its record and
//     go with it); a conflict means it changed (or another replica got
//     there first): left for the next sweep;
//   - a waiting Task past its wait is ended (WaitExpiry::to) with a status
//     message "expired: waited longer than 2h in input-required", saved
//     with compare-and-set on the version read: a replica that resumed it
//     meanwhile wins, and the expiry does nothing.
// Each Task is handled by one replica: the versioned delete/save succeeds
// for one of them.
#ifndef TOOLNEXUS_SERVER_DOMAIN_TASK_RETENTION_HPP
#define TOOLNEXUS_SERVER_DOMAIN_TASK_RETENTION_HPP

#include "domain/task_watch.hpp"
#include "toolnexus/retention.hpp"
#include "toolnexus/task_store.hpp"

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace toolnexus::server_detail {

/// What one sweep step is to do besides reading and deciding. Every
/// callback may be empty.
struct RetentionHooks {
  /// Count and report, but change nothing (`store gc --dry-run`).
  bool dry_run = false;
  /// Ends the waiting Task of `rec` per `rule` when it is still due at
  /// `now_us`; true when this call ended it. Empty: expire_record() (the
  /// compare-and-set save of a tool without a server).
  std::function<bool(const TaskRecord &rec, const WaitExpiry &rule, int64_t now_us)> expire;
  /// The due time a Task saved by expire_record() records (empty: none).
  std::function<int64_t(const Task &)> due_of;
  /// Task `id` was deleted by this sweep (the server ends its streams).
  std::function<void(const std::string &id)> removed;
  /// A record a due list delivered that the policy does not make due yet
  /// (its deadline was recorded under a shorter policy, or it is due for
  /// something else): the server records its current due time, so that
  /// later due sweeps do not read it again (empty: nothing).
  std::function<void(const TaskRecord &rec, int64_t now_us)> not_due;
  /// Called every 1000 records read, and at the end, with the counts so far.
  std::function<void(const GcCounts &)> progress;
  /// A Task's delete or save failed (the text names it and why); the
  /// sweep went on.
  std::function<void(const std::string &text)> warn;
  /// A record the list delivered that cannot be read (corrupt, or sealed
  /// with a key not held: TaskRecord::problem says why); it is left as it
  /// is and counted in GcCounts::unreadable (empty: counted only; the
  /// server's sweeps, which would meet it again every time, leave it to
  /// `toolnexus store check`).
  std::function<void(const TaskRecord &rec)> unreadable;
  /// Polled between pages: true stops the sweep (the server stopping).
  std::function<bool()> stop;
};

/// One sweep step over `store` under `policy` at `now_us` (µs since the
/// epoch). `due_only`: list by the due index (the store must have
/// TNX_CAP_DUE_INDEX), else by status time. Throws StoreError from the
/// lists; a failed delete or save of one Task goes to hooks.warn, is
/// counted in GcCounts::skipped, and the sweep goes on.
GcCounts sweep_retention(TaskStore &store, const RetentionOptions &policy, bool due_only, int64_t now_us,
                         const RetentionHooks &hooks);

/// The decision of a wait expiry on `task`, applied to it: when it is in
/// `state` (a waiting state) and its status time + rule.after_ms is at or
/// before `now_us`, sets status rule.to with the agent message
/// "expired: waited longer than <after> in <state>", drops its lease and
/// pending request, and returns true; else false and `task` is unchanged.
bool apply_wait_expiry(Task &task, std::string_view state, const WaitExpiry &rule, int64_t now_us);

/// Ends the waiting Task `rec` (as apply_wait_expiry) with a
/// compare-and-set save on rec.version, the due time from `due_of` (may
/// be empty). Returns false when it is not due or the save conflicts
/// (someone else changed it). Throws StoreError otherwise.
bool expire_record(TaskStore &store, const TaskRecord &rec, const WaitExpiry &rule, int64_t now_us,
                   const std::function<int64_t(const Task &)> &due_of);

}  // namespace toolnexus::server_detail

#endif  // TOOLNEXUS_SERVER_DOMAIN_TASK_RETENTION_HPP

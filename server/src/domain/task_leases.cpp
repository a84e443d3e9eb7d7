// The lifecycle's leases: renewing the leases of the Tasks running here,
// settling Tasks whose lease expired, and the maintenance threads (see
// task_lifecycle.hpp).
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

namespace toolnexus::server_detail {

namespace ts = toolnexus::task_state;

using namespace lifecycle_detail;

// ---------------------------------------------------------------------------
// Leases
// ---------------------------------------------------------------------------

void TaskLifecycle::renew_due() {
  const int64_t now = now_us();
  const int64_t due_before = now - int64_t{options_.renew_interval_ms} * 1000;
  // With a change feed a running Task is re-read when the feed says it
  // changed (ActiveTask::recheck); without one, every cancel_poll_ms.
  const int64_t check_before =
      feed_ ? std::numeric_limits<int64_t>::min() : now - int64_t{options_.cancel_poll_ms} * 1000;
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
               (kv.second->recheck.exchange(false) ||
                std::max(kv.second->lease_written_us.load(), kv.second->checked_us.load()) <= check_before))
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
    if (l.present && l.instance == options_.instance_id && !is_active(id) && l.expires_us != kNoTime &&
        l.expires_us < start_us_ + int64_t{options_.lease_ms} * 1000 && l.expires_us > now) {
      // This instance's lease, written before this process started (every
      // lease written since expires later): the process that held it ended
      // with the Task running. Its own restart settles it now, rather than
      // after the lease.
      why = "The server that ran this Task stopped before finishing it: instance '" + l.instance +
            "' restarted while the Task was running (its lease was to expire at " + l.expires_text +
            "). Settled by the same instance at its restart.";
      return true;
    }
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
    if (options_.metrics != nullptr) options_.metrics->leases_settled.add();
    return true;
  }
  return false;
}

int64_t TaskLifecycle::due_time(const Task &task) const {
  int64_t due = kNoTime;
  const std::string_view state = task.state();
  if (state == ts::kSubmitted || state == ts::kWorking) {
    const Lease l = read_lease(task);
    if (l.present) due = l.expires_us;  // kNoTime for an unreadable expiry: the full sweep's
    else if (task.status_time_us() != kNoTime) due = task.status_time_us() + int64_t{options_.lease_ms} * 1000;
  }
  if (options_.due_of) {
    const int64_t other = options_.due_of(task);
    if (other != kNoTime && (due == kNoTime || other < due)) due = other;
  }
  const int64_t kept = retention_due_us(task, options_.retention);
  if (kept != kNoTime && (due == kNoTime || kept < due)) due = kept;
  return due;
}

std::size_t TaskLifecycle::settle_due() {
  if ((store_->info().capabilities & TNX_CAP_DUE_INDEX) == 0) return settle_expired();
  // Only running Tasks: with the state filter a due list walks the due
  // index in due order (earliest first) and delivers only the running ones
  // (a backlog of push deliveries due is stepped over, not sorted).
  std::size_t settled = 0;
  const int64_t now = now_us();
  for (const std::string_view state : {ts::kSubmitted, ts::kWorking}) {
    ListQuery q;
    q.due_before_us = now + 1;
    q.state = std::string(state);
    settled += settle_pages(q, false);  // the full sweeps report unreadable records
  }
  std::vector<std::string> ids;
  {
    std::lock_guard<std::mutex> lock(undated_mu_);
    ids.assign(undated_.begin(), undated_.end());
  }
  for (const std::string &id : ids) {
    std::optional<TaskRecord> rec = store_->get(id);
    // Still running and still undated: settle it when abandoned, else keep
    // looking. Anything else (gone, ended, saved with a due time) leaves.
    bool keep = false;
    if (rec && (rec->state == ts::kSubmitted || rec->state == ts::kWorking) && rec->due_us == kNoTime) {
      if (settle_one(*rec)) ++settled;
      else keep = true;
    }
    if (!keep) {
      std::lock_guard<std::mutex> lock(undated_mu_);
      undated_.erase(id);
    }
  }
  return settled;
}

std::size_t TaskLifecycle::settle_expired() {
  std::size_t settled = 0;
  for (const std::string_view state : {ts::kSubmitted, ts::kWorking}) {
    ListQuery q;
    q.state = std::string(state);
    settled += settle_pages(q, state == ts::kSubmitted);
    std::lock_guard<std::mutex> lock(maint_mu_);
    if (stop_maintenance_) break;
  }
  return settled;
}

std::size_t TaskLifecycle::settle_pages(ListQuery q, bool report_unreadable) {
  std::size_t settled = 0;
  const bool due_indexed = (store_->info().capabilities & TNX_CAP_DUE_INDEX) != 0;
  {
    q.page_size = 200;
    // One unreadable record must not stop the sweep for every other Task:
    // the store hands it over (ABI 1.1 deliver_corrupt, version 0) and it
    // is skipped and reported.
    q.deliver_corrupt = true;
    do {
      ListPage page = store_->list(q);
      // Replicas sweeping at the same time each start at their own place in
      // the page (a rotation by their instance id), so that they mostly
      // settle different Tasks; a Task two reach anyway is settled once
      // (compare-and-set: the later one re-reads it and finds it failed).
      auto &recs = page.records;
      if (recs.size() > 1)
        std::rotate(recs.begin(),
                    recs.begin() + static_cast<std::ptrdiff_t>(std::hash<std::string>{}(options_.instance_id) %
                                                               recs.size()),
                    recs.end());
      for (TaskRecord &rec : recs) {
        if (rec.version == 0) {
          if (report_unreadable)  // delivered to both passes of a full sweep: report once
            log_.warn("lease sweep: skipping an unreadable record '" + rec.id + "'" +
                      (rec.problem.empty() ? std::string() : ": " + rec.problem) +
                      " (run `toolnexus store check` on the store)");
          continue;
        }
        if (due_indexed && rec.due_us == kNoTime && (rec.state == ts::kSubmitted || rec.state == ts::kWorking)) {
          // Saved without a due time: no due list will name it.
          const std::string id = rec.id;
          if (settle_one(rec)) {
            ++settled;
          } else {
            std::lock_guard<std::mutex> lock(undated_mu_);
            undated_.insert(id);
          }
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
  using Clock = std::chrono::steady_clock;
  const int poll = std::min({options_.renew_interval_ms, std::max(1, options_.cancel_poll_ms),
                             std::max(1, options_.progress_interval_ms)});
  const auto tick = std::chrono::milliseconds(std::max(5, poll / 4));
  auto next_tick = Clock::now() + tick;
  std::unique_lock<std::mutex> lock(maint_mu_);
  while (!stop_maintenance_) {
    // Wakes every tick, and when a held progress report falls due.
    const Clock::time_point flush = Clock::time_point(Clock::duration(next_flush_.load()));
    const Clock::time_point wake = std::min(next_tick, flush);
    if (Clock::now() < wake && !recheck_now_) {
      maint_cv_.wait_until(lock, wake);
      continue;  // woken early (a sooner report, a feed's news, a stop) or on time: look again
    }
    const bool recheck = recheck_now_;
    recheck_now_ = false;
    const bool renew = Clock::now() >= next_tick || recheck;
    const bool flush_due = flush <= Clock::now();
    lock.unlock();
    try {
      if (renew) renew_due();
      if (flush_due) flush_progress();
    } catch (const std::exception &e) {
      log_.error(std::string("lease renewal failed: ") + e.what());
    }
    if (renew) next_tick = Clock::now() + tick;
    lock.lock();
  }
}

void TaskLifecycle::settler_loop() {
  using Clock = std::chrono::steady_clock;
  const auto interval = std::chrono::milliseconds(std::max(5, options_.settle_interval_ms));
  // The first sweep is full; later ones read what is due (on a store with
  // a due index), with a full one every full_settle_interval_ms.
  Clock::time_point next_full = Clock::now();
  std::unique_lock<std::mutex> lock(maint_mu_);
  while (!stop_maintenance_) {
    lock.unlock();
    bool full = false;
    try {
      full = Clock::now() >= next_full;
      if (full)
        next_full = options_.full_settle_interval_ms > 0
                        ? Clock::now() + std::chrono::milliseconds(options_.full_settle_interval_ms)
                        : Clock::time_point::max();
      const std::size_t n = full ? settle_expired() : settle_due();
      if (n != 0) log_.info("lease sweep settled " + std::to_string(n) + " abandoned Task(s)");
    } catch (const std::exception &e) {
      log_.error(std::string("lease sweep failed: ") + e.what());
    }
    try {
      sweep_retention(full);
    } catch (const std::exception &e) {
      log_.error(std::string("retention sweep failed: ") + e.what());
    }
    lock.lock();
    maint_cv_.wait_for(lock, interval, [this] { return stop_maintenance_; });
  }
}

}  // namespace toolnexus::server_detail

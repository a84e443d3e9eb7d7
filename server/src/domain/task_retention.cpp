// The retention policy (toolnexus/retention.hpp) and its sweep step
// (task_retention.hpp).
#include "domain/task_retention.hpp"

#include "common/util.hpp"
#include "domain/task_lifecycle.hpp"
#include "domain/task_lifecycle_detail.hpp"
#include "toolnexus/task_store.h"

#include <cctype>
#include <limits>
#include <set>
#include <stdexcept>
#include <vector>

namespace toolnexus {

namespace ts = task_state;

namespace {
constexpr int64_t kMaxRetentionMs = int64_t{100} * 366 * 24 * 3600 * 1000;  // 100 years

bool is_waiting(std::string_view s) { return s == ts::kInputRequired || s == ts::kAuthRequired; }
}  // namespace

int64_t parse_duration_ms(std::string_view text, const std::string &where) {
  const auto bad = [&](const std::string &why) {
    return std::invalid_argument(where + ": '" + std::string(text) + "' " + why +
                                 " (a whole number with a unit: ms, s, m, h or d, e.g. 30d, 2h, 250ms)");
  };
  std::size_t i = 0;
  int64_t n = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])) != 0) {
    if (n > (std::numeric_limits<int64_t>::max() - 9) / 10) throw bad("is too long");
    n = n * 10 + (text[i] - '0');
    ++i;
  }
  if (i == 0) throw bad("is not a duration");
  const std::string_view unit = text.substr(i);
  int64_t scale = 0;
  if (unit == "ms") scale = 1;
  else if (unit == "s") scale = 1000;
  else if (unit == "m") scale = 60 * 1000;
  else if (unit == "h") scale = 3600 * 1000;
  else if (unit == "d") scale = 24 * 3600 * 1000;
  else throw bad(unit.empty() ? "has no unit" : "has an unknown unit");
  if (n == 0) throw bad("is not positive");
  if (n > kMaxRetentionMs / scale) throw bad("is longer than 100 years");
  return n * scale;
}

std::string format_duration(int64_t ms) {
  struct Unit {
    int64_t scale;
    const char *name;
  };
  for (const Unit u : {Unit{24 * 3600 * 1000, "d"}, Unit{3600 * 1000, "h"}, Unit{60 * 1000, "m"}, Unit{1000, "s"}})
    if (ms != 0 && ms % u.scale == 0) return std::to_string(ms / u.scale) + u.name;
  return std::to_string(ms) + "ms";
}

std::string describe_retention(const RetentionOptions &r) {
  if (r.empty()) return "nothing expires";
  std::string out;
  const auto add = [&out](const std::string &text) { out += (out.empty() ? "" : ", ") + text; };
  for (const auto &[state, ms] : r.keep_ms) add(state + " kept " + format_duration(ms));
  for (const auto &[state, w] : r.wait) add(state + " waits " + format_duration(w.after_ms) + " then " + w.to);
  return out;
}

void add_retention_rule(RetentionOptions &r, std::string_view state, std::string_view duration,
                        std::string_view to, const std::string &where) {
  if (ts::is_terminal(state)) {
    if (!to.empty())
      throw std::invalid_argument(where + ": a " + std::string(state) + " Task is deleted when its time is up; '" +
                                  std::string(to) + "' applies to input-required and auth-required only");
    r.keep_ms[std::string(state)] = parse_duration_ms(duration, where);
    return;
  }
  if (is_waiting(state)) {
    WaitExpiry w;
    w.after_ms = parse_duration_ms(duration, where);
    if (!to.empty()) {
      if (to != ts::kCanceled && to != ts::kFailed)
        throw std::invalid_argument(where + ": an expired " + std::string(state) + " Task becomes canceled or failed, not '" +
                                    std::string(to) + "'");
      w.to = std::string(to);
    }
    r.wait[std::string(state)] = std::move(w);
    return;
  }
  throw std::invalid_argument(where + ": unknown state '" + std::string(state) +
                              "' (completed, failed, canceled, rejected, input-required, auth-required)");
}

void add_retention_flag(RetentionOptions &r, std::string_view text, const std::string &where) {
  const std::size_t eq = text.find('=');
  if (eq == std::string_view::npos)
    throw std::invalid_argument(where + ": '" + std::string(text) + "' is not STATE=DURATION[:canceled|failed]");
  const std::string_view state = text.substr(0, eq);
  std::string_view rest = text.substr(eq + 1);
  std::string_view to;
  if (const std::size_t colon = rest.find(':'); colon != std::string_view::npos) {
    to = rest.substr(colon + 1);
    rest = rest.substr(0, colon);
    if (to.empty())
      throw std::invalid_argument(where + ": '" + std::string(text) + "' names no state after ':' (canceled or failed)");
  }
  add_retention_rule(r, state, rest, to, where + " " + std::string(state));
}

void check_retention(const RetentionOptions &r) {
  for (const auto &[state, ms] : r.keep_ms) {
    if (!ts::is_terminal(state))
      throw std::invalid_argument("retention." + state + ": not a terminal state (completed, failed, canceled, "
                                  "rejected); waiting states go in RetentionOptions::wait");
    if (ms <= 0 || ms > kMaxRetentionMs)
      throw std::invalid_argument("retention." + state + ": " + std::to_string(ms) +
                                  " ms is not a positive duration of at most 100 years");
  }
  for (const auto &[state, w] : r.wait) {
    if (!is_waiting(state))
      throw std::invalid_argument("retention." + state + ": not a waiting state (input-required, auth-required)");
    if (w.after_ms <= 0 || w.after_ms > kMaxRetentionMs)
      throw std::invalid_argument("retention." + state + ".after: " + std::to_string(w.after_ms) +
                                  " ms is not a positive duration of at most 100 years");
    if (w.to != ts::kCanceled && w.to != ts::kFailed)
      throw std::invalid_argument("retention." + state + ".to: '" + w.to + "' is not canceled or failed");
  }
}

int64_t retention_due_us(const Task &task, const RetentionOptions &r) {
  if (r.empty()) return kNoTime;
  const int64_t since = task.status_time_us();
  if (since == kNoTime) return kNoTime;
  const std::string state(task.state());
  if (auto it = r.keep_ms.find(state); it != r.keep_ms.end()) return since + it->second * 1000;
  if (auto it = r.wait.find(state); it != r.wait.end()) return since + it->second.after_ms * 1000;
  return kNoTime;
}

}  // namespace toolnexus

namespace toolnexus::server_detail {

namespace ts = task_state;

bool apply_wait_expiry(Task &task, std::string_view state, const WaitExpiry &rule, int64_t now_us) {
  if (task.state() != state) return false;
  const int64_t since = task.status_time_us();
  if (since == kNoTime || since + rule.after_ms * 1000 > now_us) return false;
  remove_task_metadata(task, kLeaseKey);
  remove_task_metadata(task, kPendingKey);
  lifecycle_detail::set_status_with_message(
      task, rule.to, "expired: waited longer than " + format_duration(rule.after_ms) + " in " + std::string(state));
  return true;
}

bool expire_record(TaskStore &store, const TaskRecord &rec, const WaitExpiry &rule, int64_t now_us,
                   const std::function<int64_t(const Task &)> &due_of) {
  Task task = rec.a2a_task();
  if (!apply_wait_expiry(task, rec.state, rule, now_us)) return false;
  SaveOptions so;
  so.expected_version = rec.version;
  so.owner = rec.owner;
  so.tenant = rec.tenant;
  if (due_of) so.due_us = due_of(task);
  try {
    store.save(task, so);
  } catch (const StoreError &e) {
    if (e.code() == Status::conflict || e.code() == Status::not_found) return false;
    throw;
  }
  return true;
}

namespace {

// Handles one record a retention list delivered; counts into `c`.
// Whether a record's bytes are a Task: a store may deliver sound index
// fields (state, time, version) over a damaged JSON (sqlite keeps them in
// columns of their own), and what cannot be read is left for `store check`
// and a person, never deleted or rewritten on the index's word.
bool readable(const TaskRecord &rec) {
  if (rec.version == 0 || rec.status_time_us == kNoTime || !rec.problem.empty()) return false;
  try {
    (void)rec.task();
  } catch (const StoreError &) {
    return false;
  }
  return true;
}

void handle(TaskStore &store, const RetentionOptions &policy, TaskRecord &rec, int64_t now,
            const RetentionHooks &hooks, GcCounts &c, std::set<std::string> &unreadable_seen) {
  if (!readable(rec)) {  // `store check` reports it; counted and named once per sweep
    ++c.skipped;
    if (!unreadable_seen.insert(rec.id).second) return;
    ++c.unreadable;
    if (hooks.unreadable) hooks.unreadable(rec);
    return;
  }
  if (auto keep = policy.keep_ms.find(rec.state); keep != policy.keep_ms.end()) {
    if (rec.status_time_us + keep->second * 1000 > now) {
      ++c.skipped;
      if (hooks.not_due && !hooks.dry_run) hooks.not_due(rec, now);
      return;
    }
    if (hooks.dry_run) {
      ++c.deleted;
      return;
    }
    try {
      store.remove(rec.id, rec.version);
    } catch (const StoreError &e) {
      // Changed since read, or deleted by another replica: not ours.
      if (e.code() != Status::conflict && e.code() != Status::not_found) throw;
      ++c.skipped;
      return;
    }
    ++c.deleted;
    if (hooks.removed) hooks.removed(rec.id);
    return;
  }
  if (auto wait = policy.wait.find(rec.state); wait != policy.wait.end()) {
    if (rec.status_time_us + wait->second.after_ms * 1000 > now) {
      ++c.skipped;
      if (hooks.not_due && !hooks.dry_run) hooks.not_due(rec, now);
      return;
    }
    if (hooks.dry_run) {
      ++c.expired;
      return;
    }
    const bool done = hooks.expire ? hooks.expire(rec, wait->second, now)
                                   : expire_record(store, rec, wait->second, now, hooks.due_of);
    ++(done ? c.expired : c.skipped);
    return;
  }
  ++c.skipped;
}

}  // namespace

GcCounts sweep_retention(TaskStore &store, const RetentionOptions &policy, bool due_only, int64_t now,
                         const RetentionHooks &hooks) {
  GcCounts c;
  uint64_t reported = 0;
  // A store that cannot tell a damaged record's state lists it under every
  // state asked for (file:): it is still one record.
  std::set<std::string> unreadable_seen;
  std::vector<std::pair<std::string, int64_t>> rules;
  for (const auto &[state, ms] : policy.keep_ms) rules.emplace_back(state, ms);
  for (const auto &[state, w] : policy.wait) rules.emplace_back(state, w.after_ms);
  for (const auto &[state, ms] : rules) {
    ListQuery q;
    q.state = state;
    if (due_only) q.due_before_us = now + 1;
    else q.before_us = now - ms * 1000 + 1;  // status time + ms <= now
    q.page_size = 500;
    q.deliver_corrupt = true;
    do {
      ListPage page = store.list(q);
      for (TaskRecord &rec : page.records) {
        ++c.read;
        try {
          handle(store, policy, rec, now, hooks, c, unreadable_seen);
        } catch (const StoreError &e) {
          // One Task's failed delete or save must not stop the sweep for
          // the others; the next sweep tries it again.
          ++c.skipped;
          if (hooks.warn) hooks.warn("Task " + in_quotes(rec.id) + ": " + e.what());
        }
        if (hooks.progress && c.read - reported >= 1000) {
          reported = c.read;
          hooks.progress(c);
        }
      }
      q.cursor = page.next_cursor;
      if (hooks.stop && hooks.stop()) return c;
    } while (!q.cursor.empty());
  }
  if (hooks.progress) hooks.progress(c);
  return c;
}

// ---------------------------------------------------------------------------
// The server's sweep (TaskLifecycle)
// ---------------------------------------------------------------------------

bool TaskLifecycle::expire_waiting(const TaskRecord &rec, const WaitExpiry &rule, int64_t now_us) {
  Snapshot known;
  known.task = rec.a2a_task();
  known.version = rec.version;
  known.owner = rec.owner;
  known.tenant = rec.tenant;
  const std::string state = rec.state;
  UpdateResult r = update(
      rec.id,
      [&](Snapshot &s) { return apply_wait_expiry(s.task, state, rule, now_us) ? Verdict::save : Verdict::stop; },
      std::move(known));
  if (!r.found || r.verdict != Verdict::save) return false;
  log_.info("Task " + in_quotes(rec.id) + " expired to " + rule.to + ": it waited longer than " +
            format_duration(rule.after_ms) + " in " + state + " (retention)");
  return true;
}

GcCounts TaskLifecycle::sweep_retention(bool full) {
  if (options_.retention.empty()) return {};
  const bool due_only = !full && (store_->info().capabilities & TNX_CAP_DUE_INDEX) != 0;
  RetentionHooks hooks;
  hooks.expire = [this](const TaskRecord &rec, const WaitExpiry &rule, int64_t now) {
    return expire_waiting(rec, rule, now);
  };
  hooks.removed = [this](const std::string &id) { watch_.removed(id); };
  if (due_only)
    hooks.not_due = [this](const TaskRecord &rec, int64_t now) {
      // Listed as due, not due under this policy: record the due time this
      // server would save now, unless something else is due (a push
      // delivery, whose sweep re-saves it), so that the next due sweeps do
      // not read it again. Compare-and-set: a conflict leaves it to the
      // save that won (it recorded a due time of its own).
      Snapshot known;
      known.task = rec.a2a_task();
      if (const int64_t d = due_time(known.task); d == rec.due_us || (d != kNoTime && d <= now)) return;
      known.version = rec.version;
      known.owner = rec.owner;
      known.tenant = rec.tenant;
      const uint64_t version = rec.version;
      update(
          rec.id, [version](Snapshot &x) { return x.version == version ? Verdict::save : Verdict::stop; },
          std::move(known));
    };
  hooks.warn = [this](const std::string &text) { log_.warn("retention sweep: " + text); };
  hooks.stop = [this] {
    std::lock_guard<std::mutex> lock(maint_mu_);
    return stop_maintenance_;
  };
  const GcCounts c = server_detail::sweep_retention(*store_, options_.retention, due_only, now_us(), hooks);
  if (options_.metrics != nullptr) {
    options_.metrics->retention_read.add(c.read);
    options_.metrics->retention_deleted.add(c.deleted);
    options_.metrics->retention_expired.add(c.expired);
  }
  if (c.deleted != 0 || c.expired != 0)
    log_.info("retention sweep deleted " + std::to_string(c.deleted) + " Task(s) past their keep time and expired " +
              std::to_string(c.expired) + " waiting Task(s) (" + std::to_string(c.read) + " record(s) read)");
  return c;
}

}  // namespace toolnexus::server_detail

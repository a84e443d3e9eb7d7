// toolnexus/retention.hpp: how long Tasks are kept (issue 22, item 3).
//
// A Task in a terminal state (completed, failed, canceled, rejected) is
// deleted from the store once its status timestamp is older than the
// duration configured for that state; a Task waiting in input-required or
// auth-required longer than its configured wait is ended (canceled or
// failed, with an agent status message saying it waited too long). States
// without a rule are kept forever: an empty RetentionOptions is today's
// behaviour. The server records each Task's retention deadline in its due
// time (SaveOptions::due_us, ABI 1.5), so its sweep reads only what is due
// (see docs/operations.md, "Retention").
#ifndef TOOLNEXUS_RETENTION_HPP
#define TOOLNEXUS_RETENTION_HPP

#include "toolnexus/task.hpp"

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>

namespace toolnexus {

/// What a Task waiting too long becomes, and after how long.
struct WaitExpiry {
  /// How long the Task may stay in the waiting state, in ms since its
  /// status timestamp. Positive.
  int64_t after_ms = 0;
  /// "canceled" or "failed".
  std::string to = "canceled";
};

/// The retention policy. Plain value type; thread-safe to read.
struct RetentionOptions {
  /// Terminal state ("completed", "failed", "canceled", "rejected") -> how
  /// long a Task in it is kept, in ms since its status timestamp
  /// (positive). A state not named is kept forever.
  std::map<std::string, int64_t> keep_ms;
  /// Waiting state ("input-required", "auth-required") -> when it expires.
  /// A state not named waits forever.
  std::map<std::string, WaitExpiry> wait;
  /// No rule at all: nothing expires.
  bool empty() const noexcept { return keep_ms.empty() && wait.empty(); }
};

/// Parses a duration with a unit: an integer followed by ms, s, m, h or d
/// ("250ms", "30s", "2h", "30d"). Returns ms. Throws std::invalid_argument
/// naming `where` (e.g. "retention.completed") and the text when it is not
/// such a duration, not positive, or longer than 100 years.
int64_t parse_duration_ms(std::string_view text, const std::string &where);

/// The shortest exact text of a duration in ms: "2h", "90s", "250ms".
std::string format_duration(int64_t ms);

/// The policy in one line for a log or a listing, its rules in state
/// order: "completed kept 30d, input-required waits 2h then canceled";
/// "nothing expires" when empty. Pure; thread-safe.
std::string describe_retention(const RetentionOptions &r);

/// Adds one rule to `r`: `state` is a terminal state (then `to` must be
/// empty) or a waiting state (`to` "" = "canceled", else "canceled" or
/// "failed"); `duration` as parse_duration_ms. Throws std::invalid_argument
/// naming `where` and the bad value (unknown state, bad duration, bad
/// target). A later rule of the same state replaces the earlier one.
void add_retention_rule(RetentionOptions &r, std::string_view state, std::string_view duration,
                        std::string_view to, const std::string &where);

/// Adds a rule written "STATE=DURATION[:canceled|failed]" (the form of
/// `toolnexus serve --retention` and `store gc --retention`). Throws
/// std::invalid_argument as add_retention_rule, naming `where`.
void add_retention_flag(RetentionOptions &r, std::string_view text, const std::string &where);

/// Checks a policy built in code: every state a rule names is one of the
/// six, every duration is positive and at most 100 years, every wait's
/// target is "canceled" or "failed". Throws std::invalid_argument naming
/// "retention.<state>" and the bad value. serve() calls it.
void check_retention(const RetentionOptions &r);

/// When `task` falls due under `r`, in µs since the epoch: its status
/// timestamp plus its state's duration (keep or wait); kNoTime when its
/// state has no rule or it has no status timestamp. Pure; thread-safe.
int64_t retention_due_us(const Task &task, const RetentionOptions &r);

class TaskStore;

/// What a retention pass did (with a dry run: would do).
struct GcCounts {
  /// Records the pass's lists delivered: its cost.
  uint64_t read = 0;
  /// Terminal Tasks deleted.
  uint64_t deleted = 0;
  /// Waiting Tasks ended (canceled or failed).
  uint64_t expired = 0;
  /// Records read and left: not due under the policy after all (e.g. a due
  /// time recorded for a push delivery), or changed meanwhile (the
  /// compare-and-set delete or save lost: someone else resumed, expired or
  /// deleted it), or a delete or save that failed.
  uint64_t skipped = 0;
  /// Of those skipped: records that cannot be read (corrupt, or sealed with
  /// a key not held), left as they are.
  uint64_t unreadable = 0;
};

/// `toolnexus store gc`: one pass over `store` by status time (no due
/// index needed: Tasks saved before the policy existed are found too) that
/// deletes the terminal Tasks past their keep time and ends the waiting
/// ones past their wait, as a server's sweep does (compare-and-set on the
/// version read: safe while servers run on the store). `dry_run`: counts
/// only. `progress` (may be empty) is called every 1000 records read and at
/// the end. `warn` (may be empty) gets a line naming a Task whose delete or
/// save failed, or whose record cannot be read (left as it is; counted in
/// GcCounts::unreadable); the pass goes on. Throws
/// StoreError when a list fails (what was done stays done).
GcCounts collect_expired(TaskStore &store, const RetentionOptions &policy, bool dry_run,
                         const std::function<void(const GcCounts &)> &progress,
                         const std::function<void(const std::string &)> &warn = {});

}  // namespace toolnexus

#endif  // TOOLNEXUS_RETENTION_HPP

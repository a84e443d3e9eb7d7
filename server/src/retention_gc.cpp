// collect_expired(): `toolnexus store gc`, the retention sweep without a
// server (toolnexus/retention.hpp; the step is domain/task_retention.hpp).
#include "toolnexus/retention.hpp"
#include "toolnexus/server.hpp"

#include "domain/task_retention.hpp"

namespace toolnexus {

GcCounts collect_expired(TaskStore &store, const RetentionOptions &policy, bool dry_run,
                         const std::function<void(const GcCounts &)> &progress,
                         const std::function<void(const std::string &)> &warn) {
  server_detail::RetentionHooks hooks;
  hooks.dry_run = dry_run;
  hooks.progress = progress;
  hooks.warn = warn;
  if (warn)
    hooks.unreadable = [&warn](const TaskRecord &rec) {
      warn("Task '" + rec.id + "' cannot be read, left as it is" +
           (rec.problem.empty() ? std::string() : ": " + rec.problem));
    };
  // An expired Task is saved with the due time a server with this policy
  // would record (its push deliveries, its next retention deadline).
  hooks.due_of = [&policy](const Task &t) { return task_due_us(t, policy); };
  return server_detail::sweep_retention(store, policy, /*due_only=*/false, now_us(), hooks);
}

}  // namespace toolnexus

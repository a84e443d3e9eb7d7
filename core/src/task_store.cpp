// TaskStore's non-virtual part: validation and index derivation before any
// backend sees a Task.
#include "toolnexus/task_store.hpp"

namespace toolnexus {

const char *status_name(Status s) noexcept {
  switch (s) {
    case Status::ok: return "ok";
    case Status::not_found: return "not_found";
    case Status::conflict: return "conflict";
    case Status::invalid_argument: return "invalid_argument";
    case Status::io: return "io";
    case Status::corrupt: return "corrupt";
    case Status::unsupported: return "unsupported";
    case Status::internal: return "internal";
  }
  return "unknown";
}

TaskStore::~TaskStore() = default;

uint64_t TaskStore::save(const Task &task, const SaveOptions &opts) {
  task.validate();
  TaskRecord rec;
  rec.json = task.to_json();  // throws InvalidTask on invalid UTF-8
  rec.id.assign(task.id());
  rec.context_id.assign(task.context_id());
  rec.state.assign(task.state());
  rec.status_time_us = task.status_time_us();
  rec.owner = opts.owner;
  rec.tenant = opts.tenant;
  if (!is_valid_utf8(rec.owner) || !is_valid_utf8(rec.tenant))
    throw InvalidTask("owner and tenant must be valid UTF-8");
  return do_save(rec, opts.expected_version);
}

}  // namespace toolnexus

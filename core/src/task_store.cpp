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

uint64_t TaskStore::count(const ListQuery &query) {
  ListQuery q = query;
  q.cursor.clear();
  q.omit_json = true;
  q.deliver_corrupt = true;
  q.page_size = 1000;
  uint64_t n = 0;
  for (;;) {
    ListPage p = list(q);
    // A record delivered as undecodable has version 0; a sound one never.
    for (const TaskRecord &r : p.records) n += r.version != 0 ? 1 : 0;
    if (p.next_cursor.empty()) return n;
    q.cursor = std::move(p.next_cursor);
  }
}

namespace {
// The record of `task` with its index fields derived (throws InvalidTask).
TaskRecord record_of(const Task &task, const SaveOptions &opts) {
  task.validate();
  TaskRecord rec;
  rec.json = task.to_json();  // throws InvalidTask on invalid UTF-8
  rec.id.assign(task.id());
  rec.context_id.assign(task.context_id());
  rec.state.assign(task.state());
  rec.status_time_us = task.status_time_us();
  rec.owner = opts.owner;
  rec.tenant = opts.tenant;
  rec.due_us = opts.due_us;
  if (!is_valid_utf8(rec.owner) || !is_valid_utf8(rec.tenant))
    throw InvalidTask("owner and tenant must be valid UTF-8");
  return rec;
}
}  // namespace

std::vector<uint64_t> TaskStore::save_batch(const std::vector<BatchItem> &items) {
  std::vector<TaskRecord> recs;
  std::vector<uint64_t> expected;
  recs.reserve(items.size());
  expected.reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    if (items[i].task == nullptr) throw BatchError(Status::invalid_argument, "batch item has no Task", i);
    try {
      recs.push_back(record_of(*items[i].task, items[i].options));
    } catch (const InvalidTask &e) {
      throw BatchError(Status::invalid_argument, e.what(), i);
    }
    expected.push_back(items[i].options.expected_version);
  }
  if (items.empty()) return {};
  return do_save_batch(recs, expected);
}

std::vector<uint64_t> TaskStore::do_save_batch(const std::vector<TaskRecord> &, const std::vector<uint64_t> &) {
  throw StoreError(Status::unsupported, "this store saves no batches (save one by one)");
}

uint64_t TaskStore::save_stream(const BatchSource &source, bool one_transaction) {
  TaskRecord rec;
  uint64_t index = 0;
  return do_save_stream(
      [&](uint64_t &expected) -> const TaskRecord * {
        const BatchItem *item = source();
        if (item == nullptr) return nullptr;
        const uint64_t i = index++;
        if (item->task == nullptr) throw BatchError(Status::invalid_argument, "stream item has no Task", i);
        try {
          rec = record_of(*item->task, item->options);
        } catch (const InvalidTask &e) {
          throw BatchError(Status::invalid_argument, e.what(), i);
        }
        expected = item->options.expected_version;
        return &rec;
      },
      one_transaction);
}

uint64_t TaskStore::do_save_stream(const RecordSource &source, bool one_transaction) {
  if (one_transaction) throw StoreError(Status::unsupported, "this store saves no streams in one transaction");
  uint64_t n = 0, expected = kAnyVersion;
  while (const TaskRecord *rec = source(expected)) {
    try {
      do_save(*rec, expected);
    } catch (const StoreError &e) {
      throw BatchError(e.code(), e.what(), n);
    }
    ++n;
  }
  return n;
}

std::unique_ptr<ChangeSubscription> TaskStore::watch_changes(ChangeListener) { return nullptr; }

uint64_t TaskStore::save(const Task &task, const SaveOptions &opts) {
  return do_save(record_of(task, opts), opts.expected_version);
}

}  // namespace toolnexus

// toolnexus/task_store.hpp: the C++ TaskStore interface the server and any
// embedding program use. Every Task read and write goes through it.
//
// A TaskStore is usually a plugin store (core/src/plugin_store.cpp adapts a
// plugin's C vtable to this interface), but any C++ class that derives from
// TaskStore can be passed to resolve_store() and the server as-is (the seed's
// "a struct is used as-is").
#ifndef TOOLNEXUS_TASK_STORE_HPP
#define TOOLNEXUS_TASK_STORE_HPP

#include "toolnexus/task.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace toolnexus {

/// Status of a store operation; the values are the C ABI's TNX_* codes.
enum class Status : int32_t {
  ok = 0,
  not_found = -1,
  conflict = -2,
  invalid_argument = -3,
  io = -4,
  corrupt = -5,
  unsupported = -6,
  internal = -7,
};

/// "not_found", "conflict", ...: stable lower-case name of a status.
const char *status_name(Status s) noexcept;

/// Thrown by TaskStore operations. what() says what failed and where (store,
/// Task id, file path); code() is the status. A failed operation changed
/// nothing (the previous version of the Task is intact).
class StoreError : public std::runtime_error {
 public:
  StoreError(Status code, const std::string &message)
      : std::runtime_error(message), code_(code) {}
  Status code() const noexcept { return code_; }

 private:
  Status code_;
};

/// Thrown by TaskStore::save_batch: the batch wrote nothing; index() is the
/// position of the Task that failed, or the batch's size when the failure
/// is not one Task's (e.g. the commit's I/O).
class BatchError : public StoreError {
 public:
  BatchError(Status code, const std::string &message, size_t index)
      : StoreError(code, message), index_(index) {}
  size_t index() const noexcept { return index_; }

 private:
  size_t index_;
};

/// expected_version value: no compare-and-set (TNX_VERSION_ANY).
inline constexpr uint64_t kAnyVersion = UINT64_MAX;
/// expected_version value: the Task must not exist yet (TNX_VERSION_NONE).
inline constexpr uint64_t kNoVersion = 0;

/// Options of TaskStore::save.
struct SaveOptions {
  /// kAnyVersion, kNoVersion, or the version that must be stored now.
  uint64_t expected_version = kAnyVersion;
  /// Owner principal recorded with the Task ("" = none).
  std::string owner;
  /// Tenant recorded with the Task ("" = none).
  std::string tenant;
  /// When the caller wants the Task back from a ListQuery::due_before_us
  /// list (µs since the epoch), or kNoTime: nothing due (ABI 1.5
  /// tnx_task_record.due_us). Kept only by a store with TNX_CAP_DUE_INDEX;
  /// others drop it. A server sets it to the earliest of a running Task's
  /// lease expiry and a push delivery's next attempt.
  int64_t due_us = kNoTime;
};

/// One Task of TaskStore::save_batch: the Task (borrowed for the call) and
/// how to save it.
struct BatchItem {
  const Task *task = nullptr;
  SaveOptions options;
};

/// The Tasks of TaskStore::save_stream, one at a time: returns the next
/// item (its Task borrowed until the source is called again or save_stream
/// returns), or nullptr at the end. It may throw to stop the save: the
/// store undoes (one transaction) or finishes (without) what it holds, and
/// the exception reaches the caller of save_stream as thrown. It runs on
/// the caller's thread or on a store thread while the caller waits, never
/// concurrently with itself, and must not call the same store.
using BatchSource = std::function<const BatchItem *()>;

/// The records of TaskStore::do_save_stream: the next record (index fields
/// agreeing with its json; borrowed like BatchSource's Task) with its
/// expected version, or nullptr at the end. May throw, as BatchSource.
using RecordSource = std::function<const TaskRecord *(uint64_t &expected_version)>;

/// A list request. Unset optionals are not filtered on. Order: newest
/// status timestamp first, ties by id ascending (A2A ListTasks rule).
struct ListQuery {
  std::optional<std::string> context_id;
  std::optional<std::string> state;
  std::optional<std::string> owner;
  std::optional<std::string> tenant;
  /// Only Tasks whose status time is strictly after this (µs since epoch).
  std::optional<int64_t> after_us;
  /// Only Tasks whose status time is strictly before this (µs since epoch).
  std::optional<int64_t> before_us;
  /// "" for the first page, else a ListPage::next_cursor.
  std::string cursor;
  /// Only Tasks whose due time (SaveOptions::due_us) is set and strictly
  /// before this (µs since the epoch). Only for a store whose
  /// StoreInfo::capabilities has TNX_CAP_DUE_INDEX; any other store throws
  /// StoreError(unsupported) (the caller then lists what it must scan).
  std::optional<int64_t> due_before_us;
  /// Records per page, 1..1000.
  uint32_t page_size = 50;
  /// Records may come back with empty json (index fields only).
  bool omit_json = false;
  /// Deliver records whose stored bytes cannot be decoded instead of failing
  /// (their json is the raw bytes; TaskRecord::task() then throws corrupt).
  /// For tools that copy or check a whole store. ABI 1.1; a store built for
  /// 1.0 fails the list with StoreError(corrupt) as without it.
  bool deliver_corrupt = false;
};

/// One page of a list.
struct ListPage {
  std::vector<TaskRecord> records;
  /// Cursor of the next page, "" when this is the last one.
  std::string next_cursor;
};

/// Describes a store: where it came from and what it can do.
struct StoreInfo {
  /// Scheme it was opened with ("memory", "file", ...) or "custom".
  std::string scheme;
  /// Plugin name and version ("" for a C++ store).
  std::string plugin_name;
  std::string plugin_version;
  /// Path of the plugin library ("" for a C++ store).
  std::string plugin_path;
  /// TNX_CAP_* bits (see sdk task_store.h) that hold for this store: the
  /// plugin's, narrowed by the plugin for this location (ABI 1.2; e.g.
  /// sqlite with synchronous=off is not durable).
  uint64_t capabilities = 0;
  /// Opened with OpenOptions::read_only: save and remove throw
  /// StoreError(unsupported).
  bool read_only = false;
};

/// One change of a store, as its change feed reports it (ABI 1.4,
/// tnx_change; sdk task_store.h tnx_store_vtable.watch).
struct StoreChange {
  enum class Kind {
    /// Task `id` was saved and now has `version`.
    saved,
    /// Task `id` was deleted; `version` is the one it had (0 = unknown).
    deleted,
    /// Changes may have been missed (a lost connection, an overflow): re-read
    /// what you care about. `id` is empty, `version` 0.
    gap,
  };
  Kind kind = Kind::saved;
  std::string id;
  uint64_t version = 0;
};

/// Receives a store's changes. Called on the thread of a save made in this
/// process or on a thread the store owns, possibly on several at once: it
/// must return quickly, never block, and never call the store (queue the
/// news and read elsewhere). `change` is borrowed for the call.
using ChangeListener = std::function<void(const StoreChange &change)>;

/// One listener's registration with a store's change feed (see
/// TaskStore::watch_changes). Destroying it stops the delivery: once the
/// destructor returns, the listener is not running and is never called
/// again. Never destroy it from inside its own listener.
class ChangeSubscription {
 public:
  virtual ~ChangeSubscription() = default;
};

/// The store interface. Implementations are thread-safe: every method may be
/// called from several threads at once. Methods throw StoreError on failure.
class TaskStore {
 public:
  virtual ~TaskStore();

  /// Validates `task` (Task::validate), derives the index fields from it
  /// (id, contextId, status.state, status.timestamp) and saves it under the
  /// compare-and-set rule of opts.expected_version.
  /// Returns the new version. Throws InvalidTask before anything reaches the
  /// backend when the Task is not valid; StoreError(conflict) when the
  /// stored version differs from the expected one; StoreError(io, ...) etc.
  uint64_t save(const Task &task, const SaveOptions &opts = {});

  /// Saves every item in one transaction (ABI 1.3 save_batch): all are
  /// stored or none is. Items are checked in order; a later item of the same
  /// id sees the earlier one. Returns the new versions, one per item.
  /// Throws BatchError naming the failing item (invalid_argument for an
  /// invalid Task, before anything reaches the store; conflict; io ...), or
  /// StoreError(unsupported) when the store has no batches (a plugin
  /// without save_batch, a C++ store that does not override
  /// do_save_batch): the caller then saves one by one.
  std::vector<uint64_t> save_batch(const std::vector<BatchItem> &items);

  /// Saves the Tasks `source` hands over, in order, however many, holding
  /// a bounded number of them at once (ABI 1.5 save_stream; an import of
  /// JSON lines). `one_transaction`: all or none, as save_batch, else each
  /// Task atomically and the whole not, durability work grouped (a Task
  /// reported saved is durable on a durable store). Returns how many were
  /// saved. Throws BatchError naming the item that failed (its position
  /// from 0; invalid_argument for an invalid Task, conflict, io ...): with
  /// `one_transaction` nothing was saved, without it exactly the items
  /// before index() were (io: the message says when some outcome is
  /// unknown). An exception of `source` passes through, after the same
  /// undoing or finishing. StoreError(unsupported) when `one_transaction`
  /// is asked of a store without transactions, before `source` is called
  /// (then ask again without it).
  /// A plugin without save_stream is served by save_batch of everything at
  /// once (one transaction; memory then grows with the input) or save one
  /// by one; a C++ store by do_save_stream (default: do_save one by one).
  uint64_t save_stream(const BatchSource &source, bool one_transaction);

  /// Reads a Task's record, or std::nullopt when there is none.
  /// Throws StoreError(corrupt) when it exists but cannot be read.
  virtual std::optional<TaskRecord> get(std::string_view id) = 0;

  /// Deletes a Task. Throws StoreError(not_found) when absent,
  /// StoreError(conflict) when expected_version does not match.
  virtual void remove(std::string_view id, uint64_t expected_version = kAnyVersion) = 0;

  /// One page of matching records (see ListQuery). Throws
  /// StoreError(invalid_argument) on a malformed cursor, StoreError(corrupt)
  /// when a matching record cannot be read (never skipped silently).
  virtual ListPage list(const ListQuery &query) = 0;

  /// How many records list(query) would deliver over all of its pages: the
  /// records matching every filter of `query` (cursor, page_size, omit_json
  /// and deliver_corrupt are ignored). This is the A2A ListTasksResponse
  /// totalSize ("total number of tasks available (before pagination)", A2A
  /// v1.0 a2a.proto ListTasksResponse.total_size, REQUIRED), so exact. A
  /// record known to be undecodable is not counted.
  /// The default implementation pages through list() with omit_json and
  /// deliver_corrupt (O(matches)); plugin stores use the plugin's count
  /// (ABI 1.3) when it offers one, which answers from counters or an index.
  /// Throws StoreError like list() (invalid_argument, unsupported for an
  /// unknown filter, io, corrupt, internal).
  virtual uint64_t count(const ListQuery &query);

  /// Where the store came from and its capabilities.
  virtual StoreInfo info() const = 0;

  /// Starts telling `listener` of every change of the store (ABI 1.4 change
  /// feed; capability TNX_CAP_CHANGE_FEED): each save and delete committed by
  /// this process or, for a multi-process store, another one. Never early (a
  /// get after "id has version V" returns V or later); nothing lost silently
  /// (StoreChange::Kind::gap, then re-read); the same change may come twice.
  /// Any number of listeners; the store's own feed runs while one is
  /// registered. Returns nullptr when the store has no change feed (the
  /// caller polls instead); the default does. Throws StoreError(io, ...)
  /// when the feed could not be started (e.g. no listening connection).
  virtual std::unique_ptr<ChangeSubscription> watch_changes(ChangeListener listener);

  /// Flushes and releases the backend. Idempotent; after it every other
  /// method throws StoreError(invalid_argument). Throws StoreError(io) when a
  /// final flush failed. The destructor closes too, swallowing errors.
  virtual void close() {}

 protected:
  /// Saves a record whose index fields agree with its json (save() ensures
  /// it). Same contract as save().
  virtual uint64_t do_save(const TaskRecord &record, uint64_t expected_version) = 0;

  /// Saves records whose index fields agree with their json, all or none
  /// (save_batch() ensures the agreement). The default throws
  /// StoreError(unsupported).
  virtual std::vector<uint64_t> do_save_batch(const std::vector<TaskRecord> &records,
                                              const std::vector<uint64_t> &expected_versions);

  /// Saves the records of `source` as save_stream() (which derives and
  /// checks each record) says. The default: StoreError(unsupported) for
  /// `one_transaction` before calling `source`, else do_save one by one,
  /// a failure thrown as BatchError(index).
  virtual uint64_t do_save_stream(const RecordSource &source, bool one_transaction);
};

}  // namespace toolnexus

#endif  // TOOLNEXUS_TASK_STORE_HPP

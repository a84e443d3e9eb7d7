// server/src/domain/task_lifecycle.hpp: fulfilment of Tasks. Every state
// transition is a read-decide-save through the TaskStore with
// compare-and-set (SaveOptions.expected_version); on a conflict the Task is
// re-read and the decision made again, so a terminal state is never
// overwritten (A2A v0.3 section 6.3: completed, canceled, failed and rejected
// are final) and several servers may share one store.
//
// Leases: a Task in submitted/working carries
// metadata["toolnexus/lease"] = {"instance", "expiresAt"} (no host or pid:
// clients see metadata; the server logs its instance with host and pid).
// The instance that runs it renews the lease every renew_interval_ms; every
// server sweeps the store (at start and every settle_interval_ms) for Tasks
// in submitted/working whose lease expired and fails them with a status
// message saying the server that ran them stopped. A live server renews well
// before expiry, so its Tasks are never settled by another. A cancel made by
// another server reaches the executor here through the store's change feed
// (ABI 1.4): a change of a Task running here makes the renewer re-read it at
// once (a feed gap: every running Task). Without a feed the renewer re-reads
// every running Task at least every cancel_poll_ms instead.
//
// Pending requests: when an executor parks a Task in input-required, the
// prompt and its request data are saved in metadata["toolnexus/pending"];
// resuming needs nothing but the stored Task.
//
// Events: every client-visible change appends an event to the Task's stored
// timeline (task_events.hpp), and every save is published to the TaskWatch,
// which wakes the waiters and subscribers of that Task only.
//
// Size limits (max_task_history, max_task_bytes): a client's message that
// would pass one is refused (LifecycleErrc::too_large) before anything is
// saved; an agent's output that would pass max_task_bytes is not saved: the
// run is asked to stop and the Task fails, naming the sizes. The records
// that end a Task (cancel, failure, settle) are never refused.
//
// Saves per Task: a new Task is saved once when it is created (submitted)
// and once with its outcome. "working" is saved only when the run lasts
// longer than progress_interval_ms or reports progress (the Task is leased
// and cancelable either way), so a quick Task costs two durable writes.
#ifndef TOOLNEXUS_SERVER_TASK_LIFECYCLE_HPP
#define TOOLNEXUS_SERVER_TASK_LIFECYCLE_HPP

#include "common/log.hpp"
#include "common/semaphore.hpp"
#include "common/server_metrics.hpp"
#include "domain/task_idempotency.hpp"
#include "domain/task_watch.hpp"
#include "toolnexus/agent_executor.hpp"
#include "toolnexus/retention.hpp"
#include "toolnexus/task_store.hpp"

#include <rapidjson/document.h>

#include <array>
#include <set>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace toolnexus::server_detail {

/// Why a lifecycle request was refused. Mapped to JSON-RPC codes by
/// a2a_methods (A2A v0.3 section 8.2).
enum class LifecycleErrc {
  not_found,         ///< -32001: no such Task, or another principal's
  not_cancelable,    ///< -32002: cancel of a terminal Task
  terminal,          ///< -32004: a message to a terminal Task
  not_interrupted,   ///< -32004: a message to a Task that is not waiting for one
  context_mismatch,  ///< -32602: message.contextId differs from the Task's
  overloaded,        ///< -32603: too many Tasks queued
  stopping,          ///< -32603: the server is stopping
  too_large,         ///< -32602: the Task would pass a size limit (see limit())
  generation_mismatch,  ///< -32010 TaskGenerationMismatchError (A2A 1.1): see generation()
  message_reused,    ///< -32602: a messageId already used with a different message (task_idempotency.hpp)
};

/// The precondition a request named and what the Task was at
/// (LifecycleErrc::generation_mismatch).
struct GenerationMismatch {
  /// The generation the request required (ifGenerationMatch).
  uint64_t expected = 0;
  /// The Task's generation when the request was refused.
  uint64_t current = 0;
};

/// A size limit a request would pass (LifecycleErrc::too_large).
struct LimitExceeded {
  /// The limit's configuration key ("limits.max_task_bytes").
  std::string limit;
  /// Its value.
  uint64_t max = 0;
  /// What the request would have made (bytes, messages).
  uint64_t size = 0;
};

/// Thrown by TaskLifecycle's request methods; what() is the client-facing
/// message.
class LifecycleError : public std::runtime_error {
 public:
  LifecycleError(LifecycleErrc code, const std::string &message, std::optional<LimitExceeded> limit = std::nullopt)
      : std::runtime_error(message), code_(code), limit_(std::move(limit)) {}
  /// A generation_mismatch.
  LifecycleError(const std::string &message, GenerationMismatch g)
      : std::runtime_error(message), code_(LifecycleErrc::generation_mismatch), generation_(g) {}
  LifecycleErrc code() const noexcept { return code_; }
  /// Set for too_large: which limit, its value and the size met.
  const std::optional<LimitExceeded> &limit() const noexcept { return limit_; }
  /// Set for generation_mismatch.
  const std::optional<GenerationMismatch> &generation() const noexcept { return generation_; }

 private:
  LifecycleErrc code_;
  std::optional<LimitExceeded> limit_;
  std::optional<GenerationMismatch> generation_;
};

/// Settings of a TaskLifecycle.
struct LifecycleOptions {
  unsigned workers = 4;
  /// A waiting caller's Task may run on the caller's thread when the
  /// executor runs_briefly() (see TaskLifecycle::create, defer_save). Off:
  /// every run goes through the worker queue.
  bool inline_runs = true;
  std::size_t max_queued_tasks = 4096;
  int queue_wait_ms = 10000;
  int lease_ms = 30000;
  int renew_interval_ms = 10000;
  int settle_interval_ms = 10000;
  /// How often a Task running here is re-read to notice a cancel made by
  /// another server (at most renew_interval_ms; see renew_due()).
  int cancel_poll_ms = 10000;
  int drain_timeout_ms = 10000;
  /// Progress reports (TaskProgress) are saved at most this often; a run
  /// still going after this long has its "working" state saved.
  int progress_interval_ms = 100;
  /// Unique among servers sharing the store.
  std::string instance_id;
  /// When a Task is due for something besides its lease (µs since the
  /// epoch, kNoTime = nothing), e.g. push_due_us; the earlier of it and the
  /// lease's expiry is saved as the Task's due time (SaveOptions::due_us),
  /// which a store with TNX_CAP_DUE_INDEX lists by. Empty = leases only.
  /// Called on any thread, under no lock of the lifecycle; must be pure.
  std::function<int64_t(const Task &)> due_of;
  /// With a due index, the lease sweep lists only the Tasks due; a full
  /// sweep (every submitted and working Task, as on a store without the
  /// index) runs at start and then this often, for Tasks saved without a
  /// due time (by an older server, or by hand). 0 = only at start.
  int full_settle_interval_ms = 3600000;
  /// How long Tasks are kept and may wait (ServerOptions::retention;
  /// empty = forever). Its deadline is part of every saved due time
  /// (due_time()), and the settler runs sweep_retention() after each lease
  /// sweep.
  RetentionOptions retention;
  /// History a client's message may grow a Task to (ServerLimits::max_task_history).
  std::size_t max_task_history = 1000;
  /// Largest stored Task, serialized (ServerLimits::max_task_bytes).
  std::size_t max_task_bytes = std::size_t{8} << 20;
  /// Idempotent SendMessage retries (task_idempotency.hpp): ids of new
  /// Tasks, recentMessages of every Task a client message reaches.
  IdempotencyRules idempotency;
  /// Where settled leases are counted (and push outcomes, by the push
  /// deliverer through metrics()); null = nowhere. Outlives the lifecycle.
  ServerMetrics *metrics = nullptr;
};

/// Runs Tasks on a worker pool and performs every transition through the
/// store. Thread-safe: the request methods may be called from any number of
/// threads. Owns its threads (workers, lease renewer, settler); the store
/// and executor are shared.
class TaskLifecycle {
 public:
  /// `watch` (borrowed; must outlive this) receives every save.
  TaskLifecycle(std::shared_ptr<TaskStore> store, std::shared_ptr<AgentExecutor> executor,
                LifecycleOptions options, const Logger &log, TaskWatch &watch);
  ~TaskLifecycle();
  TaskLifecycle(const TaskLifecycle &) = delete;
  TaskLifecycle &operator=(const TaskLifecycle &) = delete;

  /// Starts the workers, the lease renewer and the settler (whose first
  /// sweep runs at once).
  void start();

  /// First step of stopping: refuses new Tasks, starts no queued one, and
  /// makes blocking waits return at once (TaskWatch::release_waiters;
  /// streams go on). Idempotent.
  void begin_stop();

  /// After begin_stop(): waits until no run is in progress (the runs
  /// started here have ended) or `deadline` passes; true when none is.
  bool wait_idle(std::chrono::steady_clock::time_point deadline);

  /// Whether Task `id` is being run by an executor of this server now
  /// (started, not yet ended). Thread-safe, cheap.
  bool running_here(const std::string &id);

  /// Stops: no new Tasks; running executors get drain_timeout_ms (then
  /// cancel_requested is set); Tasks still queued are failed ("the server
  /// stopped before running it"); threads joined. Idempotent.
  void stop();

  /// SendMessage without taskId (A2A v0.3 section 7.1): a new Task (UUID id,
  /// the message's contextId or a new one, status submitted, the message in
  /// history, a lease of this instance), saved with owner `owner` and
  /// tenant `tenant` (A2A v1.0 section 3.2.1; "" = none), queued.
  /// `message` is a validated Message object (copied). Waits (up to
  /// queue_wait_ms) while max_queued_tasks Tasks are queued. Returns the
  /// saved Task. When `hold` is not null it receives a TaskWatch hold of the
  /// new Task taken before it is queued (so the caller misses none of its
  /// changes). `prepare` (may be empty) edits the new Task before its
  /// first save (e.g. adds push notification configs).
  /// Throws LifecycleError(overloaded|stopping; too_large when the new Task
  /// would be larger than max_task_bytes: nothing is created;
  /// message_reused, see below), StoreError, InvalidTask.
  ///
  /// With idempotency.enabled the id is idempotent_task_id(tenant, owner,
  /// message.contextId or "", message.messageId), the message is recorded in
  /// the Task's recentMessages, and the Task is saved create-only before it
  /// runs (defer_save is ignored). When that id is already stored, this is
  /// a retry: the stored Task is returned as it is now (with `hold` taken
  /// before it was read), nothing is saved or run, and `*retry` (may be
  /// null) is set; a recorded messageId with another message digest (or,
  /// past the window, a first message that differs) throws
  /// LifecycleError(message_reused).
  ///
  /// `defer_save` (a blocking SendMessage, whose caller answers only once
  /// the Task settles): the Task is not saved before it runs; it is saved
  /// once, with its outcome (or when its run lasts longer than
  /// progress_interval_ms, or reports progress, or the caller asks with
  /// persist()). Nothing about it is acknowledged before it is saved, so a
  /// crash meanwhile loses nothing a client was told. The deferred save is
  /// skipped on a store without compare-and-set (the Task is saved first).
  /// On any store it also means the caller waits for the outcome: when the
  /// executor runs_briefly() and fewer than `workers` runs are in progress,
  /// the Task runs on the calling thread before create() returns (see
  /// run_or_enqueue()).
  Task create(const rapidjson::Value &message, const std::string &owner, const std::string &tenant = {},
              std::unique_ptr<TaskWatch::Hold> *hold = nullptr, const std::function<void(Task &)> &prepare = {},
              bool defer_save = false, bool *retry = nullptr);

  /// SendMessage with the taskId of an interrupted Task: appends the message
  /// to history, moves the Task to working with a lease of this instance,
  /// queues it; the executor continues from the stored Task alone. Throws
  /// LifecycleError(not_found: missing, or another owner's or tenant's; terminal;
  /// not_interrupted; context_mismatch; overloaded; stopping; too_large: the
  /// history would hold more than max_task_history messages or the Task
  /// would be larger than max_task_bytes, and nothing was saved),
  /// StoreError.
  /// `hold` as for create(); `prepare` edits the Task in the same save as
  /// the message. `caller_waits`: the caller waits for the outcome (a
  /// blocking SendMessage): the run may happen on the calling thread, as
  /// for create()'s defer_save. `if_generation` (ifGenerationMatch, A2A
  /// 1.1 section 3.2.2): when set and the Task's generation (after the
  /// owner check, before any other) differs, throws
  /// LifecycleError(generation_mismatch) and nothing is saved; checked
  /// against the record the compare-and-set save replaces.
  /// With idempotency.enabled, a message whose messageId the Task's
  /// recentMessages hold (checked after the owner, before the generation and
  /// the state) is a retry: with the same digest the Task is returned as it
  /// is, nothing saved or run, `*retry` (may be null) set; with another,
  /// LifecycleError(message_reused). Otherwise the message is recorded in
  /// the same save.
  Task resume(std::string_view task_id, const rapidjson::Value &message, const std::string &owner,
              const std::string &tenant = {}, std::unique_ptr<TaskWatch::Hold> *hold = nullptr,
              const std::function<void(Task &)> &prepare = {}, bool caller_waits = false,
              std::optional<uint64_t> if_generation = std::nullopt, bool *retry = nullptr);

  /// CancelTask (A2A v0.3 section 7.4): moves a non-terminal Task to canceled
  /// and stops its fulfilment (here, or on another server at its next
  /// save). A Task of another owner or tenant is not found. Throws
  /// LifecycleError(not_found|not_cancelable|generation_mismatch: as for
  /// resume()'s `if_generation`), StoreError.
  Task cancel(std::string_view task_id, const std::string &owner, const std::string &tenant = {},
              std::optional<uint64_t> if_generation = std::nullopt);

  /// Waits (on the TaskWatch, without reading the store) until the held
  /// Task is terminal or interrupted, or `timeout` passes or the server
  /// stops (then returns it as it is). Throws LifecycleError(not_found) when
  /// it left the store or is not of this owner and tenant.
  /// `*version` (may be null) receives the version of the record returned:
  /// 0 when a deferred Task has not been saved yet (see persist()).
  Task wait_until_settled(TaskWatch::Hold &hold, const std::string &owner, const std::string &tenant,
                          std::chrono::milliseconds timeout, uint64_t *version = nullptr);

  /// GetTask with currentGeneration (A2A 1.1 draft, section 3.2.7): the
  /// stored Task `task_id` of this owner and tenant once its generation
  /// (task_generation()) is past `after`: at once when it already is, when
  /// the Task is terminal (its generation never moves again) or when
  /// `timeout` is 0, else
  /// when a save (here, or on another server: the TaskWatch hears it
  /// through the store's change feed, or polls) makes it so, or when
  /// `timeout` passes or the server stops (then as it is). Throws
  /// LifecycleError(not_found: missing, another's, or deleted meanwhile),
  /// StoreError.
  Snapshot wait_for_generation(const std::string &task_id, const std::string &owner, const std::string &tenant,
                               uint64_t after, std::chrono::milliseconds timeout);

  /// Saves a Task created with defer_save that has not been saved yet, as it
  /// is now, and returns the stored record (also when it was saved by its
  /// run meanwhile). Throws LifecycleError(not_found) when it is in neither
  /// place, StoreError.
  Snapshot persist(const std::string &task_id);

  /// Applies `edit` to the stored Task `task_id` of this owner and tenant
  /// (read, edit, compare-and-set save, again on a conflict) and returns it
  /// as saved. `edit` may throw LifecycleError; returning false saves
  /// nothing. Throws LifecycleError(not_found), StoreError.
  Snapshot edit(std::string_view task_id, const std::string &owner, const std::string &tenant,
                const std::function<bool(Task &)> &edit);

  /// One sweep: fails every submitted/working Task whose lease expired
  /// (and that is not running here), and every one leased by this instance
  /// id before this lifecycle was made (an earlier process of the same
  /// instance, since ended; see ServerOptions::instance_file), at once.
  /// Returns how many were settled.
  std::size_t settle_expired();

  /// One sweep of the Tasks due now (a store with TNX_CAP_DUE_INDEX; on
  /// any other, settle_expired()): settles those whose lease expired, as
  /// settle_expired() does. Returns how many were settled.
  std::size_t settle_due();

  /// One retention step (LifecycleOptions::retention; nothing without a
  /// rule): deletes the terminal Tasks past their keep time (their
  /// streams end: TaskWatch::removed) and ends the waiting ones past their
  /// wait (expire_waiting()). `full`, or a store without TNX_CAP_DUE_INDEX:
  /// reads by status time every Task a rule matches (for Tasks saved
  /// before the policy was set); else only the Tasks due. One replica per
  /// Task (compare-and-set). Logs what it did; returns the counts.
  /// Throws StoreError when a list fails.
  GcCounts sweep_retention(bool full);

  /// Ends the waiting Task of `rec` (input-required or auth-required) when
  /// it is still in rec.state and has waited rule.after_ms at `now_us`:
  /// status rule.to with an agent message "expired: waited longer than 2h
  /// in input-required", lease and pending request dropped, saved with
  /// compare-and-set and published (its subscribers get the final status
  /// event and their streams end). A conflict re-reads and decides again:
  /// when another replica resumed or expired it meanwhile, nothing is done.
  /// True when this call ended it. Throws StoreError.
  bool expire_waiting(const TaskRecord &rec, const WaitExpiry &rule, int64_t now_us);

  /// The due time a save of `task` records (SaveOptions::due_us): for a
  /// submitted or working Task its lease's expiry (without a lease, its
  /// status time + lease_ms), the earlier of that, LifecycleOptions::due_of
  /// and the retention deadline (retention_due_us); kNoTime when nothing is
  /// due. Thread-safe.
  int64_t due_time(const Task &task) const;

  /// Renews the leases of this instance's Tasks that are due, and re-reads
  /// the other running Tasks not checked for cancel_poll_ms. A Task found
  /// canceled, terminal, removed or leased by another instance gets its
  /// cancel_requested set (the executor should stop; its result is dropped
  /// by the compare-and-set save anyway). The renewer runs this every
  /// max(5, min(renew_interval_ms, cancel_poll_ms, progress_interval_ms) / 4)
  /// ms. It also saves "working" for runs that started more than
  /// progress_interval_ms ago and have not saved it yet.
  void renew_due();

  /// Throws LifecycleError(too_large) when `task` serialized is larger than
  /// max_task_bytes; the message is "<subject> N bytes, past the limit of M
  /// bytes per stored Task (limits.max_task_bytes)<consequence>", e.g.
  /// subject "params.message would make Task 'x'", consequence "; the Task
  /// is unchanged". For a request that grows a Task (a message, a push
  /// config); the server's own bookkeeping (leases, cancels, failures,
  /// delivery records) is never refused.
  void refuse_if_too_large(const Task &task, const std::string &subject, const std::string &consequence) const;

  /// This instance's lease id.
  const std::string &instance_id() const noexcept { return options_.instance_id; }
  /// The store.
  const std::shared_ptr<TaskStore> &store() const noexcept { return store_; }
  /// The watch every save is published to.
  TaskWatch &watch() noexcept { return watch_; }
  /// Tasks queued and not yet started.
  std::size_t queued() const noexcept { return queued_.load(); }
  /// Tasks whose executor runs here now (registered, not yet ended).
  /// Thread-safe; takes the registry's lock (for /metrics, not hot paths).
  std::size_t running();
  /// LifecycleOptions::metrics (null = none).
  ServerMetrics *metrics() const noexcept { return options_.metrics; }
  /// begin_stop() or stop() was called.
  bool stopping() const noexcept { return stopping_.load(); }

 private:
  class RunProgress;
  struct ActiveTask {
    std::atomic<bool> cancel{false};
    /// Set with `cancel` when the server's stop asked the run to stop (the
    /// drain timeout passed): the Task then fails saying so, whatever the
    /// executor returns.
    std::atomic<bool> stopped_by_server{false};
    std::atomic<int64_t> lease_written_us{0};
    /// When the stored Task was last read by the renewer (0 = never).
    std::atomic<int64_t> checked_us{0};
    /// The change feed said the stored Task changed: the renewer re-reads
    /// it at its next pass (woken at once).
    std::atomic<bool> recheck{false};
    /// When the executor started (0 = not yet).
    std::atomic<int64_t> started_us{0};
    /// "working" is in the store (saved by a progress save, the renewer,
    /// or resume()).
    std::atomic<bool> working_saved{false};
    /// The Task is in the store (false: created with defer_save and not
    /// saved yet; then `unsaved` holds it).
    std::atomic<bool> stored{true};
    std::mutex unsaved_mu;
    std::optional<Snapshot> unsaved;
    /// The run's progress while its executor runs (under active_mu_), for
    /// flush_progress().
    std::shared_ptr<RunProgress> progress;
  };
  struct WorkItem {
    std::string id;
    std::shared_ptr<ActiveTask> active;
    std::optional<Snapshot> snap;
  };
  enum class Verdict { save, keep, stop };
  struct UpdateResult {
    bool found = false;
    Verdict verdict = Verdict::keep;
    Snapshot snap;
  };

  template <class Decide>
  UpdateResult update(std::string_view id, Decide &&decide, std::optional<Snapshot> known = std::nullopt);
  /// After a save of `snap` (compare-and-set on `expected`, or kAnyVersion)
  /// failed with an error that does not say whether it was applied (I/O, a
  /// lost connection): reads the record, and when it holds exactly
  /// snap.task's JSON at version expected + 1 (any version for kAnyVersion),
  /// sets snap.version and returns true: the save was applied. False when
  /// it was not, or the read fails too. Never throws.
  bool saved_anyway(std::string_view id, Snapshot &snap, uint64_t expected) noexcept;

  std::shared_ptr<ActiveTask> register_active(const std::string &id, int64_t lease_written_us);
  void unregister_active(const std::string &id, const std::shared_ptr<ActiveTask> &which);
  bool is_active(const std::string &id);
  /// Registers `id` as running here unless it already is (atomically);
  /// null when it was. For a Task of ours found idle (created_before).
  std::shared_ptr<ActiveTask> adopt_if_idle(const std::string &id);
  void signal_cancel(const std::string &id);
  void admit();
  void enqueue(WorkItem item);
  /// Runs `item` on this thread when `caller_waits`, the executor
  /// runs_briefly() and a worker slot is free (running + queued < workers):
  /// the thread that would wait for a worker to run it and hand the outcome
  /// back does the run itself. Otherwise enqueue().
  void run_or_enqueue(WorkItem item, bool caller_waits);
  void worker_loop();
  /// A dequeued (or inline) item: run() with its errors turned into a failed
  /// Task; then unregisters it and gives back its running_ slot.
  void run_claimed(WorkItem &item);
  void run(WorkItem &item);
  void fail_after_error(const std::string &id, const std::shared_ptr<ActiveTask> &active, const std::string &what);
  /// Saves a deferred Task not yet saved, after `change`; true when this
  /// call saved it.
  bool save_unsaved(const std::string &id, const std::shared_ptr<ActiveTask> &active,
                    const std::function<void(Task &)> &change);
  /// A save of the Task by its run succeeded: it is stored.
  static void mark_stored(ActiveTask &active);
  void fail_unstarted(WorkItem &item, const char *why);
  bool settle_one(TaskRecord &rec);
  /// Settles what the pages of `q` hold (deliver_corrupt set here);
  /// `report_unreadable` logs records the store cannot decode.
  std::size_t settle_pages(ListQuery q, bool report_unreadable);
  /// A progress report is held until `when`: the renewer wakes then
  /// (flush_progress) unless it is due to wake sooner. Thread-safe.
  void flush_at(std::chrono::steady_clock::time_point when);
  /// Saves the held progress reports that are due (the renewer's thread).
  void flush_progress();
  void renewer_loop();
  void settler_loop();
  void set_lease(Task &task, int64_t expires_us) const;
  /// "N bytes, past the limit of M bytes per stored Task (limits.max_task_bytes)".
  std::string over_bytes(std::size_t size) const;
  void save_working(const std::string &id, const std::shared_ptr<ActiveTask> &active);
  std::mutex &stripe(std::string_view id);
  /// create() found Task `id` stored: the retry's answer (see create()).
  Task created_before(const std::string &id, const std::string &message_id, const std::string &digest,
                      const std::string &owner, const std::string &tenant, std::unique_ptr<TaskWatch::Hold> *hold);

  std::shared_ptr<TaskStore> store_;
  std::shared_ptr<AgentExecutor> executor_;
  LifecycleOptions options_;
  const Logger &log_;
  TaskWatch &watch_;
  bool cas_ = true;
  std::array<std::mutex, 64> stripes_;

  std::mutex active_mu_;
  std::unordered_map<std::string, std::shared_ptr<ActiveTask>> active_;

  std::mutex queue_mu_;
  Semaphore queue_sem_;  // one token per queued WorkItem, plus one per worker at stop (see semaphore.hpp)
  std::condition_variable idle_cv_;
  std::condition_variable room_cv_;
  std::deque<WorkItem> queue_;
  std::atomic<std::size_t> queued_{0};
  unsigned running_ = 0;  // runs in progress: on workers and inline (run_or_enqueue)
  /// Signalled when running_ drops: a worker with a queued item waits on it
  /// while inline runs hold every slot.
  std::condition_variable slot_cv_;
  /// options_.inline_runs and the executor runs_briefly(); set at construction.
  bool inline_runs_ = false;
  bool stop_workers_ = false;
  std::vector<std::thread> workers_;

  std::mutex maint_mu_;
  std::condition_variable maint_cv_;
  bool stop_maintenance_ = false;
  /// A Task running here has changed in the store (guarded by maint_mu_):
  /// the renewer runs a pass now.
  bool recheck_now_ = false;
  /// The store's change feed, set in start() before the renewer starts and
  /// reset in stop() after it ended (so the renewer reads it unlocked); null
  /// when the store has none (the renewer then polls every cancel_poll_ms).
  std::unique_ptr<ChangeSubscription> feed_;
  /// A feed's news (any thread, must not block): marks a running Task, or
  /// all of them on a gap, for re-reading and wakes the renewer.
  void on_store_change(const StoreChange &c);
  /// When the renewer next flushes held progress (steady_clock ticks;
  /// max = nothing held).
  std::atomic<int64_t> next_flush_{std::numeric_limits<int64_t>::max()};
  std::thread renewer_;
  std::thread settler_;
  /// Submitted and working Tasks a full sweep found without a due time
  /// (saved by an older server or by hand) on a store with a due index:
  /// settle_due() re-reads each, until it is settled, ends, or is saved
  /// with a due time. Guarded by undated_mu_.
  std::mutex undated_mu_;
  std::set<std::string> undated_;

  std::atomic<bool> stopping_{false};
  /// When this lifecycle was made (now_us()): a lease of this instance that
  /// expires before start_us_ + lease_ms was written by an earlier process
  /// of the same instance (see settle_one).
  int64_t start_us_ = 0;
  std::once_flag stop_once_;
  bool started_ = false;
};

}  // namespace toolnexus::server_detail

#endif  // TOOLNEXUS_SERVER_TASK_LIFECYCLE_HPP

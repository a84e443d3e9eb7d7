// server/src/domain/task_watch.hpp: who is waiting for which Task, and telling
// them when it changes.
//
// The store is the truth; TaskWatch only carries news of it. Two sources:
//  - this process's own saves: TaskLifecycle calls publish() after every
//    successful save, with the Task as saved (no store read);
//  - everybody else's (other servers sharing the store, `toolnexus store
//    put`): when the store has a change feed (ABI 1.4,
//    TaskStore::watch_changes), each change of a watched Task that is newer
//    than what is known here is re-read at once by the reader thread, and a
//    gap in the feed re-reads every watched Task; nothing is polled. Without
//    a feed, the reader thread re-reads each watched Task that has not
//    changed here for poll_ms, so a change made elsewhere is seen within
//    poll_ms plus one store read.
// Two kinds of watchers:
//  - waiters (a blocking SendMessage): wait() sleeps on the Task's own
//    condition variable; a change of one Task wakes only its waiters;
//  - subscribers (SSE streams, push delivery): called on the watch's own
//    thread with the newest record, so a slow subscriber never delays the
//    thread that saved the Task.
// Publishing a Task nobody watches costs one hash lookup.
#ifndef TOOLNEXUS_SERVER_TASK_WATCH_HPP
#define TOOLNEXUS_SERVER_TASK_WATCH_HPP

#include "common/log.hpp"
#include "domain/task_timeline.hpp"
#include "toolnexus/task_store.hpp"

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace toolnexus::server_detail {

/// A Task as read from (or just saved to) the store, with the record fields a
/// later compare-and-set save needs.
struct Snapshot {
  Task task;
  uint64_t version = 0;
  std::string owner;
  std::string tenant;
};

using SnapshotPtr = std::shared_ptr<const Snapshot>;

/// Settings of a TaskWatch.
struct WatchOptions {
  /// How often a watched Task that did not change here is re-read.
  int poll_ms = 200;
  /// How often subscribers get on_idle() (keep-alive comments).
  int idle_tick_ms = 1000;
  /// Subscribers at most; subscribe() refuses more.
  std::size_t max_subscribers = 10000;
};

/// What the subscribers of one Task derive from its records once for all
/// of them (the SSE streams keep the frames they rendered:
/// wire/sse.hpp EventRenderCache). The watch keeps one per watched Task
/// and hands it to every subscriber's on_update; it is created by the
/// first subscriber that needs it, used only on the delivery thread, and
/// destroyed with the Task's entry. The watch never looks inside.
class SharedRenderState {
 public:
  virtual ~SharedRenderState() = default;
};

/// A subscriber of one Task. Its callbacks run on the watch's thread, one
/// at a time; they must not block (no store I/O).
class TaskSubscriber {
 public:
  explicit TaskSubscriber(std::string task_id) : task_id_(std::move(task_id)) {}
  virtual ~TaskSubscriber() = default;
  /// The newest record of the Task known here (never null), and the state
  /// every subscriber of the Task shares (empty until a subscriber sets it).
  /// Returns false when the subscriber is finished (it is then dropped).
  virtual bool on_update(const SnapshotPtr &latest, std::unique_ptr<SharedRenderState> &shared) = 0;
  /// The Task is no longer in the store. The subscriber is dropped after.
  virtual void on_gone() = 0;
  /// Called every idle_tick_ms. Returns false when finished.
  virtual bool on_idle(std::chrono::steady_clock::time_point now) = 0;
  /// The server is stopping and this subscriber's Task goes on without it
  /// (it runs elsewhere, is parked, or outlived the drain; see
  /// TaskWatch::begin_drain): the subscriber tells its client to go on
  /// elsewhere and ends. Called at most once, after the Task's newest record
  /// was delivered; the subscriber is dropped after.
  virtual void on_server_stop() = 0;
  const std::string &task_id() const noexcept { return task_id_; }

 private:
  friend class TaskWatch;
  std::string task_id_;
  /// Holds a place under max_subscribers: set by TaskWatch::subscribe,
  /// cleared by the first of TaskWatch::release and the removal.
  std::atomic<bool> counted_{false};
};

/// See the file comment. Thread-safe.
class TaskWatch {
  struct Entry;

 public:
  TaskWatch(std::shared_ptr<TaskStore> store, WatchOptions options, const Logger &log);
  ~TaskWatch();
  TaskWatch(const TaskWatch &) = delete;
  TaskWatch &operator=(const TaskWatch &) = delete;

  /// Starts the delivery thread and the poller.
  void start();
  /// Stops both; subscribers still registered are dropped (their streams
  /// are ended by whoever owns them). Waiters return at once. Idempotent.
  void stop();

  /// Stopping, step 1: every wait() returns now and no later one waits
  /// (blocking requests end), while subscribers go on being delivered to.
  /// Idempotent.
  void release_waiters();
  /// Stopping, step 2 (the drain): from now on, each time a subscriber has
  /// been delivered the newest record of its Task and goes on, it gets
  /// on_server_stop() and is dropped unless `running_here(task id)` says
  /// that the Task runs on this server (then it goes on, and ends as usual
  /// when its Task does). Every subscriber is looked at once at the start.
  /// `running_here` is called on the delivery thread; it must be cheap and
  /// thread-safe. Call once.
  void begin_drain(std::function<bool(const std::string &)> running_here);
  /// Stopping, step 3 (the drain is over): every subscriber left gets its
  /// newest record, then on_server_stop(), and is dropped. Call after
  /// begin_drain().
  void end_drain();

  /// News of a save made here: `snap` is the Task as saved. Copies it only
  /// when someone watches the Task. Never blocks on I/O.
  void publish(const Snapshot &snap);

  /// News of a delete made here (retention): Task `id` left the store. Its
  /// waiters return (gone) and its subscribers get on_gone() (a stream's
  /// final frame is TaskNotFound), without waiting for a re-read. Never
  /// blocks on I/O.
  void removed(const std::string &id);

  /// `fn` is called (on the saving thread, before waiters are woken) with
  /// every Task published, watched or not; it must be cheap and must not
  /// block. Set before start(); not changed after.
  void set_listener(std::function<void(const Snapshot &)> fn) { listener_ = std::move(fn); }

  /// Keeps a Task watched while alive: every publish of it from the moment
  /// hold() returns is captured, so a caller that holds a Task before it can
  /// change (a new Task before it is queued, an existing one before it is
  /// read) misses nothing, without re-reading the store. Move-only; release
  /// by destroying it. Use it from one thread at a time.
  class Hold {
   public:
    Hold(TaskWatch &watch, std::string id, std::shared_ptr<Entry> entry);
    ~Hold();
    Hold(const Hold &) = delete;
    Hold &operator=(const Hold &) = delete;
    const std::string &id() const noexcept { return id_; }
    /// The newest record captured (may be null before the first one).
    SnapshotPtr latest() const;
    /// Takes `snap` as the newest record when it is newer.
    void offer(SnapshotPtr snap);

   private:
    friend class TaskWatch;
    TaskWatch &watch_;
    std::string id_;
    std::shared_ptr<Entry> entry_;
  };

  /// Starts watching `id`, with `initial` (may be null) as the newest record.
  std::unique_ptr<Hold> hold(const std::string &id, SnapshotPtr initial = nullptr);

  /// Waits until done(latest) holds, `timeout` passes, the watch stops or
  /// the Task fails to be saved (fail()). Returns the newest record (null
  /// when none was ever known), sets `*gone` when the Task left the store,
  /// and throws StoreError(fail()'s code and message) after a fail().
  SnapshotPtr wait(Hold &hold, const std::function<bool(const Snapshot &)> &done,
                   std::chrono::milliseconds timeout, bool *gone = nullptr);

  /// A Task that was never saved could not be saved at all (its store
  /// failed): its waiters stop waiting and throw StoreError(code, message).
  void fail(const std::string &id, Status code, const std::string &message);

  /// Registers `sub` for the held Task and delivers the newest record to it
  /// at once. Returns false (registering nothing) when max_subscribers are
  /// registered. The subscription outlives the hold.
  bool subscribe(Hold &hold, std::shared_ptr<TaskSubscriber> sub);

  /// Delivers the newest record of `id` to its subscribers again (e.g. a
  /// stream that had fallen behind has room again). Non-blocking.
  void poke(const std::string &id);

  /// Subscribers registered.
  std::size_t subscribers() const noexcept { return n_subs_.load(); }
  /// True when the store's change feed carries others' changes (no polling).
  bool has_feed() const noexcept { return has_feed_.load(); }
  /// Store reads made to learn of others' changes (polls and feed re-reads).
  uint64_t rereads() const noexcept { return rereads_.load(); }
  /// Gaps the change feed reported.
  uint64_t feed_gaps() const noexcept { return feed_gaps_.load(); }
  /// Gives back `sub`'s place under max_subscribers now, before it is
  /// dropped: a subscriber calls it just before it ends its stream, so that
  /// a client opening its next stream as soon as it reads the end is not
  /// refused as over the cap (the drop itself happens a moment later, on
  /// the delivery thread). Idempotent; the drop does it otherwise.
  /// Thread-safe.
  void release_place(TaskSubscriber &sub) noexcept {
    if (sub.counted_.exchange(false)) --n_subs_;
  }

 private:
  friend class Hold;
  /// Removes the `finished` subscribers from `subs` (the shard's lock held)
  /// and gives back their places.
  void drop_finished(std::vector<std::shared_ptr<TaskSubscriber>> &subs,
                     const std::vector<TaskSubscriber *> &finished) noexcept;
  struct Entry {
    SnapshotPtr latest;
    std::vector<std::shared_ptr<TaskSubscriber>> subs;
    /// Used by the delivery thread only.
    std::unique_ptr<SharedRenderState> shared;
    /// Holds (each wait() has one).
    int holds = 0;
    bool gone = false;
    /// Set by fail().
    std::optional<StoreError> error;
    std::condition_variable cv;
    std::chrono::steady_clock::time_point last_news{};
    std::chrono::steady_clock::time_point last_poll{};
  };
  struct Shard {
    std::mutex mu;
    std::unordered_map<std::string, std::shared_ptr<Entry>> entries;
  };

  Shard &shard(std::string_view id);
  /// Under the shard lock: takes `snap` as the newest record when it is,
  /// wakes the waiters and queues delivery to the subscribers.
  void take_newer(const std::string &id, Entry &e, const SnapshotPtr &snap);
  void mark_dirty(const std::string &id);
  /// Under the shard lock: forgets the entry when nobody uses it.
  void release(Shard &s, const std::string &id, const std::shared_ptr<Entry> &e);
  void unhold(Hold &h);
  /// Queues delivery to every Task that has subscribers.
  void mark_all_dirty();
  void deliver_loop();
  void poll_loop();
  /// The change feed's listener: queues a re-read of a watched Task whose
  /// change is newer than what is known (all of them on a gap). Never blocks
  /// on I/O (runs on the store's threads).
  void on_change(const StoreChange &change);
  /// Re-reads `id` for its watchers (the reader thread).
  void reread(const std::string &id);
  void deliver(const std::string &id);

  std::shared_ptr<TaskStore> store_;
  std::function<void(const Snapshot &)> listener_;
  WatchOptions options_;
  const Logger &log_;
  std::array<Shard, 32> shards_;
  std::atomic<std::size_t> n_subs_{0};

  std::mutex dirty_mu_;
  std::condition_variable dirty_cv_;
  std::deque<std::string> dirty_;
  std::unordered_set<std::string> dirty_set_;

  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  std::atomic<bool> stopping_{false};
  /// release_waiters() was called.
  std::atomic<bool> waits_released_{false};
  /// begin_drain() / end_drain() were called; running_here_ is set before
  /// draining_ and not changed after.
  std::atomic<bool> draining_{false};
  std::atomic<bool> drain_over_{false};
  std::function<bool(const std::string &)> running_here_;
  std::thread deliverer_;
  std::thread poller_;
  bool started_ = false;
  /// The store's change feed (null: none, poll).
  std::unique_ptr<ChangeSubscription> feed_;
  /// Re-reads the feed asked for: id -> the version it announced
  /// (UINT64_MAX: read whatever; a delete or a gap). Under stale_mu_.
  std::mutex stale_mu_;
  std::condition_variable stale_cv_;
  std::unordered_map<std::string, uint64_t> stale_;
  std::atomic<uint64_t> rereads_{0};
  std::atomic<uint64_t> feed_gaps_{0};
  /// feed_gaps_ as last logged (poll_loop's thread only).
  uint64_t gaps_logged_ = 0;
  std::atomic<bool> has_feed_{false};
};

}  // namespace toolnexus::server_detail

#endif  // TOOLNEXUS_SERVER_TASK_WATCH_HPP

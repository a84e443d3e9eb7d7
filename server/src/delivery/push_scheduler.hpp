// server/src/delivery/push_scheduler.hpp: when push deliveries run, so that
// deliveries to one target never wait behind another target's timeouts
// (issue 19 item 5).
//
// A job is one Task's deliveries to one target (a webhook's origin,
// scheme://host:port). Every target has its own queue of ready jobs; the
// threads take them round robin over targets, at most
// `max_in_flight_per_target` at a time from one target and
// `max_in_flight` in all. A thread is started whenever every thread is busy
// (up to `max_in_flight`); threads beyond `min_threads` end after
// `idle_exit` without work. A target whose last job failed is "failing":
// it gets one job in flight at a time, and failing targets together get at
// most max_in_flight - max(1, max_in_flight / 4), so the targets that
// answer always have threads. One job (a Task and a target) is never in
// flight twice: a job that comes due while it runs runs again after.
#ifndef TOOLNEXUS_SERVER_PUSH_SCHEDULER_HPP
#define TOOLNEXUS_SERVER_PUSH_SCHEDULER_HPP

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace toolnexus::server_detail {

/// Runs push delivery jobs per target, fairly (see the file comment).
/// Thread-safe.
class PushScheduler {
 public:
  using Clock = std::chrono::steady_clock;
  /// Delivers Task `task_id`'s due events to target `target`; returns
  /// whether every POST succeeded (false, or an exception, marks the target
  /// failing until a job to it succeeds). Called on a scheduler thread,
  /// without the scheduler's lock.
  using Run = std::function<bool(const std::string &target, const std::string &task_id)>;

  /// The bounds (each at least 1; max_in_flight at least min_threads).
  struct Limits {
    /// Threads kept running when idle.
    unsigned min_threads = 2;
    /// Jobs in flight at once, in all (= the most threads).
    unsigned max_in_flight = 64;
    /// Jobs in flight at once to one target.
    unsigned max_in_flight_per_target = 2;
    /// An idle thread beyond min_threads ends after this.
    std::chrono::milliseconds idle_exit{10000};
  };

  PushScheduler(Limits limits, Run run);
  ~PushScheduler();
  PushScheduler(const PushScheduler &) = delete;
  PushScheduler &operator=(const PushScheduler &) = delete;

  /// Starts min_threads threads. Call once.
  void start();
  /// Stops taking jobs and joins every thread (a job in flight runs to its
  /// end). Idempotent.
  void stop();

  /// Job (`target`, `task_id`) is due at `when` (an earlier time replaces a
  /// later one; a job already ready stays as it is). Cheap; never blocks on
  /// I/O.
  void schedule(const std::string &target, const std::string &task_id, Clock::time_point when);

 private:
  using Key = std::pair<std::string, std::string>;  // target, Task id
  struct Target {
    std::deque<std::string> ready;  // Task ids, in the order they came due
    std::set<std::string> queued;   // the same, to look up
    unsigned in_flight = 0;
    bool in_rotation = false;  // in rotation_
  };

  void thread_loop();
  void spawn();              // mu_ held
  void promote();            // due jobs to their targets' queues; mu_ held
  void make_ready(const Key &k);  // mu_ held
  bool pick(Key &k);         // the next job, round robin; mu_ held
  bool can_run(const std::string &name, const Target &t) const;  // mu_ held
  void forget_if_idle(const std::string &name);  // mu_ held

  const Limits limits_;
  const Run run_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::multimap<Clock::time_point, Key> due_;
  std::map<Key, Clock::time_point> scheduled_;
  std::map<std::string, Target> targets_;
  std::deque<std::string> rotation_;  // targets with ready jobs
  std::set<Key> in_flight_;
  std::set<Key> rerun_;               // came due while in flight
  std::set<std::string> failing_;
  unsigned failing_in_flight_ = 0;
  unsigned threads_ = 0;
  unsigned idle_ = 0;
  std::list<std::thread> pool_;
  std::vector<std::thread::id> finished_;  // ended, to be joined
  bool stopping_ = false;
};

}  // namespace toolnexus::server_detail

#endif  // TOOLNEXUS_SERVER_PUSH_SCHEDULER_HPP

// Push delivery jobs: a queue per target, round robin, bounded in flight
// (see push_scheduler.hpp).
#include "delivery/push_scheduler.hpp"

#include "common/util.hpp"

#include <algorithm>

namespace toolnexus::server_detail {

namespace {

// Failing targets remembered at most (a bound on memory; forgetting one
// only lets it hold more threads until it fails again).
constexpr std::size_t kMaxFailing = 10000;

}  // namespace

PushScheduler::PushScheduler(Limits limits, Run run) : limits_([&] {
  limits.min_threads = std::max(1u, limits.min_threads);
  limits.max_in_flight = std::max(limits.min_threads, limits.max_in_flight);
  limits.max_in_flight_per_target = std::max(1u, limits.max_in_flight_per_target);
  return limits;
}()), run_(std::move(run)) {}

PushScheduler::~PushScheduler() { stop(); }

void PushScheduler::start() {
  std::lock_guard<std::mutex> lock(mu_);
  while (threads_ < limits_.min_threads) spawn();
}

void PushScheduler::stop() {
  std::list<std::thread> pool;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    pool.swap(pool_);
  }
  cv_.notify_all();
  for (std::thread &t : pool)
    if (t.joinable()) t.join();
}

void PushScheduler::schedule(const std::string &target, const std::string &task_id, Clock::time_point when) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    if (auto t = targets_.find(target); t != targets_.end() && t->second.queued.count(task_id) != 0) return;
    Key k{target, task_id};
    if (auto it = scheduled_.find(k); it != scheduled_.end()) {
      if (it->second <= when) return;
      for (auto d = due_.equal_range(it->second); d.first != d.second; ++d.first) {
        if (d.first->second == k) {
          due_.erase(d.first);
          break;
        }
      }
    }
    scheduled_[k] = when;
    due_.emplace(when, std::move(k));
  }
  // One idle thread is enough: any of them can take it.
  cv_.notify_one();
}

void PushScheduler::spawn() {
  if (stopping_) return;
  // Join the threads that ended (they left mu_ before ending).
  for (const std::thread::id &id : finished_) {
    auto it = std::find_if(pool_.begin(), pool_.end(), [&](const std::thread &t) { return t.get_id() == id; });
    if (it != pool_.end()) {
      it->join();
      pool_.erase(it);
    }
  }
  finished_.clear();
  ++threads_;
  ++idle_;
  pool_.push_back(start_named_thread("tnx-push", [this] { thread_loop(); }));
}

void PushScheduler::make_ready(const Key &k) {
  Target &t = targets_[k.first];
  if (!t.queued.insert(k.second).second) return;
  t.ready.push_back(k.second);
  if (!t.in_rotation) {
    t.in_rotation = true;
    rotation_.push_back(k.first);
  }
}

void PushScheduler::promote() {
  const Clock::time_point now = Clock::now();
  while (!due_.empty() && due_.begin()->first <= now) {
    Key k = std::move(due_.begin()->second);
    due_.erase(due_.begin());
    scheduled_.erase(k);
    if (in_flight_.count(k) != 0) rerun_.insert(std::move(k));
    else make_ready(k);
  }
}

bool PushScheduler::can_run(const std::string &name, const Target &t) const {
  if (in_flight_.size() >= limits_.max_in_flight || t.in_flight >= limits_.max_in_flight_per_target) return false;
  if (failing_.count(name) == 0) return true;
  const unsigned reserve = limits_.max_in_flight > 1 ? std::max(1u, limits_.max_in_flight / 4) : 0;
  return t.in_flight == 0 && failing_in_flight_ < limits_.max_in_flight - reserve;
}

bool PushScheduler::pick(Key &k) {
  for (std::size_t n = rotation_.size(); n > 0; --n) {
    std::string name = std::move(rotation_.front());
    rotation_.pop_front();
    Target &t = targets_[name];
    if (t.ready.empty()) {
      t.in_rotation = false;
      forget_if_idle(name);
      continue;
    }
    if (!can_run(name, t)) {
      rotation_.push_back(std::move(name));
      continue;
    }
    k = {name, t.ready.front()};
    t.ready.pop_front();
    t.queued.erase(k.second);
    if (t.ready.empty()) t.in_rotation = false;
    else rotation_.push_back(std::move(name));
    return true;
  }
  return false;
}

void PushScheduler::forget_if_idle(const std::string &name) {
  auto it = targets_.find(name);
  if (it != targets_.end() && it->second.ready.empty() && it->second.in_flight == 0 && !it->second.in_rotation)
    targets_.erase(it);
}

void PushScheduler::thread_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  Clock::time_point idle_since = Clock::now();
  while (!stopping_) {
    promote();
    Key k;
    if (pick(k)) {
      in_flight_.insert(k);
      ++targets_[k.first].in_flight;
      const bool counted = failing_.count(k.first) != 0;
      if (counted) ++failing_in_flight_;
      --idle_;
      // Always one thread to spare (up to the bound): it keeps the timers
      // and takes the next target while this one may hang.
      if (idle_ == 0 && threads_ < limits_.max_in_flight) spawn();
      lock.unlock();
      bool ok = false;
      try {
        ok = run_(k.first, k.second);
      } catch (...) {
        ok = false;
      }
      lock.lock();
      ++idle_;
      in_flight_.erase(k);
      --targets_[k.first].in_flight;
      if (counted) --failing_in_flight_;
      if (ok) {
        failing_.erase(k.first);
      } else {
        if (failing_.size() >= kMaxFailing) failing_.clear();
        failing_.insert(k.first);
      }
      if (rerun_.erase(k) != 0) make_ready(k);
      forget_if_idle(k.first);
      idle_since = Clock::now();
      continue;
    }
    // A thread beyond min_threads ends after idle_exit without work, but
    // one idle thread always stays.
    const bool may_end = threads_ > limits_.min_threads && idle_ > 1;
    if (may_end && Clock::now() - idle_since >= limits_.idle_exit) {
      --threads_;
      --idle_;
      finished_.push_back(std::this_thread::get_id());
      return;
    }
    Clock::time_point until = Clock::time_point::max();
    if (!due_.empty()) until = due_.begin()->first;
    if (may_end) until = std::min(until, idle_since + limits_.idle_exit);
    if (until == Clock::time_point::max()) cv_.wait(lock);
    else cv_.wait_until(lock, until);
  }
}

}  // namespace toolnexus::server_detail

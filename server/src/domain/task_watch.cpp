// TaskWatch: news of Task changes for waiters and subscribers (see
// task_watch.hpp).
#include "domain/task_watch.hpp"

#include "common/util.hpp"

#include <algorithm>
#include <cstdint>

namespace toolnexus::server_detail {

using Clock = std::chrono::steady_clock;

TaskWatch::Hold::Hold(TaskWatch &watch, std::string id, std::shared_ptr<Entry> entry)
    : watch_(watch), id_(std::move(id)), entry_(std::move(entry)) {}

TaskWatch::Hold::~Hold() { watch_.unhold(*this); }

SnapshotPtr TaskWatch::Hold::latest() const {
  Shard &s = watch_.shard(id_);
  std::lock_guard<std::mutex> lock(s.mu);
  return entry_->latest;
}

void TaskWatch::Hold::offer(SnapshotPtr snap) {
  if (!snap) return;
  Shard &s = watch_.shard(id_);
  std::lock_guard<std::mutex> lock(s.mu);
  watch_.take_newer(id_, *entry_, snap);
}

TaskWatch::TaskWatch(std::shared_ptr<TaskStore> store, WatchOptions options, const Logger &log)
    : store_(std::move(store)), options_(options), log_(log) {}

TaskWatch::~TaskWatch() { stop(); }

void TaskWatch::start() {
  if (started_) return;
  started_ = true;
  try {
    feed_ = store_->watch_changes([this](const StoreChange &c) { on_change(c); });
    has_feed_ = feed_ != nullptr;
    if (!has_feed_)
      log_.info("the store has no change feed (TNX_CAP_CHANGE_FEED): Tasks watched by streams and waiters are read "
                "again every " + std::to_string(options_.poll_ms) + " ms to learn of other servers' changes");
  } catch (const std::exception &e) {
    log_.warn(std::string("the store's change feed did not start (watching Tasks by polling instead): ") + e.what());
  }
  deliverer_ = start_named_thread("tnx-watch", [this] { deliver_loop(); });
  poller_ = start_named_thread("tnx-watch-poll", [this] { poll_loop(); });
}

void TaskWatch::stop() {
  if (stopping_.exchange(true)) return;
  {
    std::lock_guard<std::mutex> lock(stop_mu_);
  }
  stop_cv_.notify_all();
  {
    std::lock_guard<std::mutex> lock(dirty_mu_);
  }
  dirty_cv_.notify_all();
  {
    std::lock_guard<std::mutex> lock(stale_mu_);
  }
  stale_cv_.notify_all();
  for (Shard &s : shards_) {
    std::lock_guard<std::mutex> lock(s.mu);
    for (auto &kv : s.entries) kv.second->cv.notify_all();
  }
  if (deliverer_.joinable()) deliverer_.join();
  if (poller_.joinable()) poller_.join();
  feed_.reset();  // waits for a listener call in progress
  // Subscribers still registered are dropped.
  for (Shard &s : shards_) {
    std::lock_guard<std::mutex> lock(s.mu);
    for (auto &kv : s.entries) {
      for (const auto &sub : kv.second->subs) release_place(*sub);
      kv.second->subs.clear();
    }
  }
}

void TaskWatch::release_waiters() {
  waits_released_ = true;
  for (Shard &s : shards_) {
    std::lock_guard<std::mutex> lock(s.mu);
    for (auto &kv : s.entries) kv.second->cv.notify_all();
  }
}

void TaskWatch::mark_all_dirty() {
  std::vector<std::string> ids;
  for (Shard &s : shards_) {
    std::lock_guard<std::mutex> lock(s.mu);
    for (auto &kv : s.entries)
      if (!kv.second->subs.empty()) ids.push_back(kv.first);
  }
  for (const std::string &id : ids) mark_dirty(id);
}

void TaskWatch::begin_drain(std::function<bool(const std::string &)> running_here) {
  if (draining_.load()) return;
  running_here_ = std::move(running_here);
  draining_ = true;
  mark_all_dirty();
}

void TaskWatch::end_drain() {
  drain_over_ = true;
  mark_all_dirty();
}

TaskWatch::Shard &TaskWatch::shard(std::string_view id) {
  return shards_[std::hash<std::string_view>{}(id) % shards_.size()];
}

void TaskWatch::take_newer(const std::string &id, Entry &e, const SnapshotPtr &snap) {
  if (!snap) return;
  if (e.latest && snap->version <= e.latest->version) return;
  e.latest = snap;
  e.gone = false;
  e.cv.notify_all();
  if (!e.subs.empty()) mark_dirty(id);
}

void TaskWatch::mark_dirty(const std::string &id) {
  {
    std::lock_guard<std::mutex> lock(dirty_mu_);
    if (!dirty_set_.insert(id).second) return;
    dirty_.push_back(id);
  }
  dirty_cv_.notify_one();
}

void TaskWatch::release(Shard &s, const std::string &id, const std::shared_ptr<Entry> &e) {
  if (e->holds != 0 || !e->subs.empty()) return;
  auto it = s.entries.find(id);
  if (it != s.entries.end() && it->second == e) s.entries.erase(it);
}

void TaskWatch::publish(const Snapshot &snap) {
  if (listener_) listener_(snap);
  const std::string id(snap.task.id());
  Shard &s = shard(id);
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.entries.find(id);
  if (it == s.entries.end()) return;
  Entry &e = *it->second;
  e.last_news = Clock::now();
  if (e.latest && snap.version <= e.latest->version) return;
  take_newer(id, e, std::make_shared<const Snapshot>(snap));
}

std::unique_ptr<TaskWatch::Hold> TaskWatch::hold(const std::string &id, SnapshotPtr initial) {
  Shard &s = shard(id);
  std::lock_guard<std::mutex> lock(s.mu);
  auto &slot = s.entries[id];
  if (!slot) {
    slot = std::make_shared<Entry>();
    // The holder's record is news: no re-read before poll_ms.
    slot->last_news = Clock::now();
  }
  ++slot->holds;
  take_newer(id, *slot, initial);
  return std::make_unique<Hold>(*this, id, slot);
}

void TaskWatch::unhold(Hold &h) {
  Shard &s = shard(h.id_);
  std::lock_guard<std::mutex> lock(s.mu);
  --h.entry_->holds;
  release(s, h.id_, h.entry_);
}

SnapshotPtr TaskWatch::wait(Hold &h, const std::function<bool(const Snapshot &)> &done,
                            std::chrono::milliseconds timeout, bool *gone) {
  const auto deadline = Clock::now() + timeout;
  Shard &s = shard(h.id_);
  std::unique_lock<std::mutex> lock(s.mu);
  Entry &e = *h.entry_;
  for (;;) {
    if (e.gone || e.error || stopping_.load() || waits_released_.load() || (e.latest && done(*e.latest))) break;
    if (e.cv.wait_until(lock, deadline) == std::cv_status::timeout) break;
  }
  if (e.error) throw *e.error;
  if (gone != nullptr) *gone = e.gone;
  return e.latest;
}

void TaskWatch::fail(const std::string &id, Status code, const std::string &message) {
  Shard &s = shard(id);
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.entries.find(id);
  if (it == s.entries.end()) return;
  it->second->error.emplace(code, message);
  it->second->cv.notify_all();
}

bool TaskWatch::subscribe(Hold &h, std::shared_ptr<TaskSubscriber> sub) {
  if (stopping_.load()) return false;
  if (n_subs_.fetch_add(1) >= options_.max_subscribers) {
    --n_subs_;
    return false;
  }
  sub->counted_ = true;
  {
    Shard &s = shard(h.id_);
    std::lock_guard<std::mutex> lock(s.mu);
    h.entry_->subs.push_back(std::move(sub));
  }
  mark_dirty(h.id_);
  return true;
}

void TaskWatch::poke(const std::string &id) { mark_dirty(id); }

void TaskWatch::deliver(const std::string &id) {
  // Asked before the newest record is read: a run that has ended here
  // published its last record before it stopped counting as running, so a
  // subscriber let go below has been delivered everything the run saved.
  const bool draining = draining_.load();
  const bool stays = draining && !drain_over_.load() && running_here_ && running_here_(id);
  Shard &s = shard(id);
  std::vector<std::shared_ptr<TaskSubscriber>> subs;
  SnapshotPtr latest;
  bool gone = false;
  std::shared_ptr<Entry> e;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    auto it = s.entries.find(id);
    if (it == s.entries.end()) return;
    e = it->second;
    subs = e->subs;
    latest = e->latest;
    gone = e->gone;
  }
  if (subs.empty()) return;
  std::vector<TaskSubscriber *> finished;
  for (const auto &sub : subs) {
    bool keep = true;
    try {
      if (gone) {
        sub->on_gone();
        keep = false;
      } else if (latest) {
        keep = sub->on_update(latest, e->shared);
      }
      if (keep && draining && !stays) {
        sub->on_server_stop();
        keep = false;
      }
    } catch (const std::exception &ex) {
      log_.error("Task " + in_quotes(id) + ": a subscriber failed: " + ex.what());
      keep = false;
    }
    if (!keep) finished.push_back(sub.get());
  }
  if (finished.empty()) return;
  std::lock_guard<std::mutex> lock(s.mu);
  drop_finished(e->subs, finished);
  release(s, id, e);
}

void TaskWatch::drop_finished(std::vector<std::shared_ptr<TaskSubscriber>> &subs,
                              const std::vector<TaskSubscriber *> &finished) noexcept {
  subs.erase(std::remove_if(subs.begin(), subs.end(),
                            [&](const std::shared_ptr<TaskSubscriber> &p) {
                              if (std::find(finished.begin(), finished.end(), p.get()) == finished.end()) return false;
                              release_place(*p);
                              return true;
                            }),
             subs.end());
}

void TaskWatch::deliver_loop() {
  auto next_idle = Clock::now() + std::chrono::milliseconds(options_.idle_tick_ms);
  while (!stopping_.load()) {
    std::deque<std::string> batch;
    {
      std::unique_lock<std::mutex> lock(dirty_mu_);
      dirty_cv_.wait_until(lock, next_idle, [this] { return stopping_.load() || !dirty_.empty(); });
      batch.swap(dirty_);
      dirty_set_.clear();
    }
    for (const std::string &id : batch) {
      if (stopping_.load()) return;
      deliver(id);
    }
    const auto now = Clock::now();
    if (now < next_idle) continue;
    next_idle = now + std::chrono::milliseconds(options_.idle_tick_ms);
    // Idle ticks (keep-alives), one shard at a time.
    for (Shard &s : shards_) {
      std::vector<std::pair<std::string, std::vector<std::shared_ptr<TaskSubscriber>>>> work;
      {
        std::lock_guard<std::mutex> lock(s.mu);
        for (auto &kv : s.entries)
          if (!kv.second->subs.empty()) work.emplace_back(kv.first, kv.second->subs);
      }
      for (auto &[id, subs] : work) {
        std::vector<TaskSubscriber *> finished;
        for (auto &sub : subs)
          if (!sub->on_idle(now)) finished.push_back(sub.get());
        if (finished.empty()) continue;
        std::lock_guard<std::mutex> lock(s.mu);
        auto it = s.entries.find(id);
        if (it == s.entries.end()) continue;
        drop_finished(it->second->subs, finished);
        release(s, id, it->second);
      }
    }
  }
}

void TaskWatch::on_change(const StoreChange &c) {
  std::vector<std::string> ids;
  uint64_t wanted = UINT64_MAX;
  if (c.kind == StoreChange::Kind::gap) {
    ++feed_gaps_;
    for (Shard &s : shards_) {
      std::lock_guard<std::mutex> lock(s.mu);
      for (auto &kv : s.entries) ids.push_back(kv.first);
    }
  } else {
    Shard &s = shard(c.id);
    std::lock_guard<std::mutex> lock(s.mu);
    auto it = s.entries.find(c.id);
    if (it == s.entries.end()) return;  // nobody watches it
    const Entry &e = *it->second;
    if (c.kind == StoreChange::Kind::saved) {
      if (e.latest && e.latest->version >= c.version) return;  // known (a save made here)
      wanted = c.version;
    }
    ids.push_back(c.id);
  }
  if (ids.empty()) return;
  {
    std::lock_guard<std::mutex> lock(stale_mu_);
    for (std::string &id : ids) {
      auto [it, fresh] = stale_.emplace(std::move(id), wanted);
      if (!fresh) it->second = std::max(it->second, wanted);
    }
  }
  stale_cv_.notify_one();
}

void TaskWatch::poll_loop() {
  if (feed_) {
    // The feed says what changed: read only that, when it is news.
    while (!stopping_.load()) {
      std::unordered_map<std::string, uint64_t> work;
      {
        std::unique_lock<std::mutex> lock(stale_mu_);
        stale_cv_.wait(lock, [this] { return stopping_.load() || !stale_.empty(); });
        if (stopping_.load()) return;
        work.swap(stale_);
      }
      // Said here, not in on_change (a feed's sink must not do I/O).
      const uint64_t gaps = feed_gaps_.load();
      if (gaps != gaps_logged_) {
        log_.warn("the store's change feed reported " + std::to_string(gaps - gaps_logged_) +
                  " gap(s) (its connection or log lost track, e.g. a reconnect): every watched Task (" +
                  std::to_string(work.size()) + ") is read again");
        gaps_logged_ = gaps;
      }
      for (const auto &[id, wanted] : work) {
        if (stopping_.load()) return;
        if (wanted != UINT64_MAX) {
          // A save made here usually reached publish() meanwhile.
          Shard &s = shard(id);
          std::lock_guard<std::mutex> lock(s.mu);
          auto it = s.entries.find(id);
          if (it == s.entries.end() || (it->second->latest && it->second->latest->version >= wanted)) continue;
        }
        reread(id);
      }
    }
    return;
  }
  const auto period = std::chrono::milliseconds(std::max(1, options_.poll_ms));
  const auto tick = std::chrono::milliseconds(std::max(1, options_.poll_ms / 4));
  while (!stopping_.load()) {
    {
      std::unique_lock<std::mutex> lock(stop_mu_);
      stop_cv_.wait_for(lock, tick, [this] { return stopping_.load(); });
    }
    if (stopping_.load()) return;
    const auto now = Clock::now();
    std::vector<std::string> due;
    for (Shard &s : shards_) {
      std::lock_guard<std::mutex> lock(s.mu);
      for (auto &kv : s.entries) {
        Entry &e = *kv.second;
        if (e.gone) continue;
        if (now - e.last_news < period || now - e.last_poll < period) continue;
        e.last_poll = now;
        due.push_back(kv.first);
      }
    }
    for (const std::string &id : due) {
      if (stopping_.load()) return;
      reread(id);
    }
  }
}

void TaskWatch::removed(const std::string &id) {
  Shard &s = shard(id);
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.entries.find(id);
  if (it == s.entries.end()) return;
  Entry &e = *it->second;
  e.gone = true;
  e.cv.notify_all();
  if (!e.subs.empty()) mark_dirty(id);
}

void TaskWatch::reread(const std::string &id) {
  std::optional<TaskRecord> rec;
  SnapshotPtr snap;
  ++rereads_;
  try {
    rec = store_->get(id);
    if (rec) {
      auto p = std::make_shared<Snapshot>();
      p->task = rec->a2a_task();
      p->version = rec->version;
      p->owner = std::move(rec->owner);
      p->tenant = std::move(rec->tenant);
      snap = std::move(p);
    }
  } catch (const std::exception &ex) {
    log_.warn("Task " + in_quotes(id) + ": could not re-read it for its watchers: " + ex.what());
    return;
  }
  Shard &s = shard(id);
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.entries.find(id);
  if (it == s.entries.end()) return;
  Entry &e = *it->second;
  if (!rec) {
    // Missing from the store: gone, unless it was never saved (a
    // deferred Task, version 0, is saved with its outcome).
    if (e.latest && e.latest->version == 0) return;
    e.gone = true;
    e.cv.notify_all();
    if (!e.subs.empty()) mark_dirty(id);
  } else {
    take_newer(id, e, snap);
  }
}

}  // namespace toolnexus::server_detail

// plugins/file/store_feed.cpp: the file store's change feed (ABI 1.4,
// tnx_store_vtable.watch; see file_store.hpp).
//
// Every save and delete appends a record to .tnx-index; Index::apply calls
// on_change for each one applied, whether this process wrote it
// (append_raw_locked: reported before save returns) or another process did
// (read when catch_up() finds the file grown: by any call of this store, and
// by the feed's thread every kFeedPollMs). Records arrive in file order, so
// the versions of an id only grow. Reading a whole index again (another
// process compacted it: "moved") and a rebuild from the directory change the
// index without a record per Task: the feed reports a gap and the host
// re-reads.
#include "file_store.hpp"

#include <chrono>

namespace toolnexus::file_plugin {

void FileStore::watch(tnx_change_sink sink, void *ctx) {
  if (ro_) throw Error(TNX_EUNSUPPORTED, "file: watch: '" + path_ + "' is open read-only: it has no change feed");
  std::lock_guard<std::mutex> once(feed_start_mu_);
  feed_.start(sink, ctx);
  {
    std::unique_lock<std::shared_mutex> l(imu_);
    hook_index_locked();
  }
  {
    std::lock_guard<std::mutex> lk(feed_mu_);
    feed_stop_ = false;
  }
  try {
    feed_thread_ = std::thread([this] { feed_loop(); });
  } catch (...) {
    stop_feed();
    throw;
  }
}

void FileStore::unwatch() {
  std::lock_guard<std::mutex> once(feed_start_mu_);
  if (!feed_.running()) throw Error(TNX_EINVAL, "unwatch: no change feed runs");
  stop_feed();
}

void FileStore::feed_loop() noexcept {
  std::unique_lock<std::mutex> lk(feed_mu_);
  while (!feed_stop_) {
    feed_cv_.wait_for(lk, std::chrono::milliseconds(kFeedPollMs), [this] { return feed_stop_; });
    if (feed_stop_) break;
    lk.unlock();
    try {
      catch_up();
    } catch (...) {
      // An unreadable index now: the next look (or call) tries again from
      // the same offset, so nothing is skipped.
    }
    lk.lock();
  }
}

void FileStore::stop_feed() noexcept {
  {
    std::lock_guard<std::mutex> lk(feed_mu_);
    feed_stop_ = true;
  }
  feed_cv_.notify_all();
  if (feed_thread_.joinable()) feed_thread_.join();
  {
    std::unique_lock<std::shared_mutex> l(imu_);
    index_->on_change = nullptr;
  }
  feed_.stop();
}

void FileStore::hook_index_locked() {
  index_->on_change = [this](std::string_view id, uint64_t version, bool deleted) {
    if (deleted) feed_.deleted(id, version);
    else feed_.saved(id, version);
  };
}

void FileStore::index_reloaded_locked() {
  if (!feed_.running()) return;
  hook_index_locked();
  feed_.gap();
}

}  // namespace toolnexus::file_plugin

// plugins/file/dir_sync.hpp: the directory fsync with group commit that
// makes the file plugin's renames and unlinks durable.
#ifndef TOOLNEXUS_FILE_DIR_SYNC_HPP
#define TOOLNEXUS_FILE_DIR_SYNC_HPP

#include "../common/wakeup.hpp"

#include <cstdint>
#include <mutex>

namespace toolnexus::file_plugin {

/// Makes renames/unlinks in one directory durable. A caller takes a ticket
/// after its change and waits; one fsync of the directory that started after
/// a change covers it, so concurrent savers share fsyncs. A failed fsync is
/// reported to every caller it was meant to cover (the kernel reports a
/// writeback error only once per open file).
///
/// One caller at a time runs the fsync (the leader). When it ends, the
/// leader wakes each caller it covered and hands the lead to the first
/// caller not covered (who arrived during it); the others sleep on. Each
/// caller is woken once, by its own Wakeup: a shared condition variable
/// woke every waiter after every fsync.
///
/// Thread-safe: any number of threads call changed() and wait(). The
/// directory descriptor is borrowed (it must outlive the DirSync).
/// Errors: none thrown; wait() returns the fsync's errno.
class DirSync {
 public:
  /// Syncs the directory open as `fd` (borrowed).
  explicit DirSync(int fd) noexcept : fd_(fd) {}

  /// Counts a change just made in the directory; returns its ticket.
  uint64_t changed() {
    std::lock_guard<std::mutex> l(m_);
    return ++changes_;
  }

  /// Blocks until an fsync that started after change `ticket` ended (run by
  /// this caller or a concurrent one). Returns 0 or the errno of the fsync
  /// covering `ticket`.
  int wait(uint64_t ticket);

 private:
  // A caller waiting for an fsync (on its stack).
  struct Waiter {
    uint64_t ticket = 0;
    int err = 0;        // set before `wake` when covered
    bool lead = false;  // set before `wake` when it is to run the next fsync
    Waiter *next = nullptr;
    toolnexus::plugins::Wakeup wake;
  };
  int fd_;
  std::mutex m_;
  uint64_t changes_ = 0;
  uint64_t synced_ = 0;
  bool syncing_ = false;                          // a leader is running (or about to run) an fsync
  Waiter *head_ = nullptr, *tail_ = nullptr;      // waiting callers, in arrival order
};

}  // namespace toolnexus::file_plugin

#endif  // TOOLNEXUS_FILE_DIR_SYNC_HPP

// plugins/common/wakeup.hpp: wakes one particular waiting thread, for the
// group commits of the file and sqlite plugins.
//
// Why not a shared std::condition_variable: a group commit that ends with
// notify_all wakes every waiting caller, including the ones whose writes are
// still queued; each of them takes the mutex, finds nothing for it and sleeps
// again. With 64 callers that was most of the sqlite plugin's lock waits. A
// Wakeup per waiter wakes exactly the callers whose writes are done, and the
// one chosen to commit next.
//
// Internal to the built-in plugins (not part of the SDK); header-only.
#ifndef TOOLNEXUS_PLUGINS_WAKEUP_HPP
#define TOOLNEXUS_PLUGINS_WAKEUP_HPP

#include <semaphore.h>

#include <cerrno>

namespace toolnexus::plugins {

/// A binary wake-up signal owned by one waiting thread (usually on its
/// stack): the waiter calls wait(), another thread post() once.
///
/// Lifetime: a POSIX semaphore may be destroyed as soon as sem_wait returned,
/// even while the sem_post that woke it is still returning (POSIX sem_destroy;
/// glibc since 2.21, bug 12674), so the waiter may return and free the Wakeup
/// right after wait(). Everything the poster wrote before post() is visible
/// to the waiter after wait() (sem_post/sem_wait synchronise memory).
/// Thread-safety: post() from any one thread, wait() from the owner.
/// Errors: none (sem_init with these arguments cannot fail; EINTR is retried).
class Wakeup {
 public:
  Wakeup() noexcept { ::sem_init(&sem_, 0, 0); }
  ~Wakeup() { ::sem_destroy(&sem_); }
  Wakeup(const Wakeup &) = delete;
  Wakeup &operator=(const Wakeup &) = delete;

  /// Wakes the waiter (or lets its next wait() return at once).
  void post() noexcept { ::sem_post(&sem_); }

  /// Blocks until post().
  void wait() noexcept {
    while (::sem_wait(&sem_) != 0 && errno == EINTR) {
    }
  }

 private:
  sem_t sem_;
};

}  // namespace toolnexus::plugins

#endif  // TOOLNEXUS_PLUGINS_WAKEUP_HPP

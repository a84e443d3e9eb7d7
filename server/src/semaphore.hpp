// server/src/semaphore.hpp: a counting semaphore on a Linux eventfd, for the
// server's work queues (HTTP request workers, Task executors).
//
// Why not std::condition_variable::notify_one: glibc's pthread_cond_signal
// before 2.41 can lose a wake-up (sourceware bug 25847; Debian 12 ships
// 2.36). Seen here: under 64 clients on a durable store every request
// worker slept on the condition variable while requests sat in the queue,
// and the server answered nothing more. The kernel's eventfd counter has no
// such window: every release() is one token that exactly one acquire()
// takes.
#ifndef TOOLNEXUS_SERVER_SEMAPHORE_HPP
#define TOOLNEXUS_SERVER_SEMAPHORE_HPP

#include <cstdint>

namespace toolnexus::server_detail {

/// Counting semaphore (eventfd in EFD_SEMAPHORE mode, blocking reads).
/// Thread-safe: any thread may release, any number may acquire at once.
/// Not copyable or movable (the fd is owned for the object's lifetime).
class Semaphore {
 public:
  /// Starts with `initial` tokens. Throws std::system_error when no eventfd
  /// can be created (EMFILE, ENFILE, ENOMEM).
  explicit Semaphore(unsigned initial = 0);
  ~Semaphore();
  Semaphore(const Semaphore &) = delete;
  Semaphore &operator=(const Semaphore &) = delete;

  /// Adds `n` tokens (n >= 1), waking up to `n` waiters. Never blocks
  /// (the counter holds up to 2^64 - 2 tokens).
  void release(uint64_t n = 1) noexcept;
  /// Takes one token, blocking until there is one. Retries EINTR.
  void acquire() noexcept;

 private:
  int fd_;
};

}  // namespace toolnexus::server_detail

#endif

// server/src/common/semaphore.hpp: a counting semaphore on a Linux futex, for the
// server's work queues (HTTP request workers, Task executors).
//
// Why not std::condition_variable::notify_one: glibc's pthread_cond_signal
// before 2.41 can lose a wake-up (sourceware bug 25847; Debian 12 ships
// 2.36). Seen here: under 64 clients on a durable store every request
// worker slept on the condition variable while requests sat in the queue,
// and the server answered nothing more. Why not an eventfd: a blocking read
// wakes every reader for each token (128 request workers woken per request:
// GetTask fell from ~25k to ~5k req/s). A futex wakes exactly as many
// waiters as tokens were added, and only when someone waits.
#ifndef TOOLNEXUS_SERVER_SEMAPHORE_HPP
#define TOOLNEXUS_SERVER_SEMAPHORE_HPP

#include <atomic>
#include <cstdint>

namespace toolnexus::server_detail {

/// Counting semaphore. Thread-safe: any thread may release, any number may
/// acquire at once. Not copyable or movable (waiters sleep on its address).
class Semaphore {
 public:
  /// Starts with `initial` tokens.
  explicit Semaphore(uint32_t initial = 0) noexcept : count_(initial) {}
  Semaphore(const Semaphore &) = delete;
  Semaphore &operator=(const Semaphore &) = delete;

  /// Adds `n` tokens (1 <= n; the count stays below 2^32), waking up to `n`
  /// waiters. Never blocks; no system call when nobody waits.
  void release(uint32_t n = 1) noexcept;
  /// Takes one token, sleeping until there is one.
  void acquire() noexcept;

 private:
  std::atomic<uint32_t> count_;
  std::atomic<uint32_t> waiters_{0};
};

}  // namespace toolnexus::server_detail

#endif

// server/src/common/semaphore.cpp: see semaphore.hpp.
//
// Correctness: release() adds its tokens before it looks for waiters; a
// waiter announces itself before FUTEX_WAIT, which sleeps only while the
// count is still 0 (the kernel compares atomically). Both orders are
// sequentially consistent, so either release() sees the waiter and wakes
// it, or the waiter's FUTEX_WAIT sees the new tokens and returns at once.
#include "common/semaphore.hpp"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>

static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t) && std::atomic<uint32_t>::is_always_lock_free,
              "a futex word must be a plain 32-bit integer");

namespace toolnexus::server_detail {

namespace {
long futex(std::atomic<uint32_t> *word, int op, uint32_t val) noexcept {
  return ::syscall(SYS_futex, reinterpret_cast<uint32_t *>(word), op, val, nullptr, nullptr, 0);
}
}  // namespace

void Semaphore::release(uint32_t n) noexcept {
  count_.fetch_add(n, std::memory_order_seq_cst);
  if (waiters_.load(std::memory_order_seq_cst) != 0)
    futex(&count_, FUTEX_WAKE_PRIVATE, n > INT_MAX ? INT_MAX : n);
}

void Semaphore::acquire() noexcept {
  for (;;) {
    uint32_t v = count_.load(std::memory_order_acquire);
    while (v != 0) {
      if (count_.compare_exchange_weak(v, v - 1, std::memory_order_acquire, std::memory_order_relaxed)) return;
    }
    waiters_.fetch_add(1, std::memory_order_seq_cst);
    futex(&count_, FUTEX_WAIT_PRIVATE, 0);  // EAGAIN at once when tokens arrived meanwhile; EINTR: look again
    waiters_.fetch_sub(1, std::memory_order_relaxed);
  }
}

}  // namespace toolnexus::server_detail

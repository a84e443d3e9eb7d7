// plugins/file/dir_sync.cpp: the directory fsync group commit (see
// dir_sync.hpp).
#include "dir_sync.hpp"

#include <unistd.h>

#include <cerrno>

namespace toolnexus::file_plugin {

int DirSync::wait(uint64_t ticket) {
  Waiter me;
  me.ticket = ticket;
  bool leader = false;  // read outside the lock: a leader may set me.lead meanwhile (a TSan-found race)
  {
    std::lock_guard<std::mutex> l(m_);
    if (synced_ >= ticket) return 0;
    if (!syncing_) {
      syncing_ = true;
      me.lead = leader = true;
    } else {
      (tail_ != nullptr ? tail_->next : head_) = &me;
      tail_ = &me;
    }
  }
  if (!leader) {
    me.wake.wait();
    if (!me.lead) return me.err;
  }
  // The leader: its ticket is at most changes_ now, so this fsync covers it.
  uint64_t target = 0;
  {
    std::lock_guard<std::mutex> l(m_);
    target = changes_;
  }
  int err = 0;
  while (::fsync(fd_) != 0) {
    if (errno != EINTR) {
      err = errno;
      break;
    }
  }
  Waiter *covered = nullptr, *next_leader = nullptr;
  {
    std::lock_guard<std::mutex> l(m_);
    if (err == 0 && target > synced_) synced_ = target;
    // Split the queue: covered callers leave it; the rest keep their order.
    Waiter *keep_head = nullptr, *keep_tail = nullptr, **cov_end = &covered;
    for (Waiter *w = head_; w != nullptr;) {
      Waiter *next = w->next;
      w->next = nullptr;
      if (w->ticket <= target) {
        *cov_end = w;
        cov_end = &w->next;
      } else {
        (keep_tail != nullptr ? keep_tail->next : keep_head) = w;
        keep_tail = w;
      }
      w = next;
    }
    next_leader = keep_head;
    if (next_leader != nullptr) {
      head_ = next_leader->next;
      tail_ = head_ != nullptr ? keep_tail : nullptr;
      next_leader->next = nullptr;
      next_leader->lead = true;
    } else {
      head_ = tail_ = nullptr;
      syncing_ = false;
    }
  }
  for (Waiter *w = covered; w != nullptr;) {
    Waiter *next = w->next;  // read before the wake lets its owner return
    w->err = err;
    w->wake.post();
    w = next;
  }
  if (next_leader != nullptr) next_leader->wake.post();
  return err;
}

}  // namespace toolnexus::file_plugin

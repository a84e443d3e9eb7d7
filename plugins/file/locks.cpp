// plugins/file/locks.cpp: OFD record locks on .tnx-lock (see locks.hpp).
#include "locks.hpp"

#include "basics.hpp"

#include <cerrno>
#include <cstdint>
#include <utility>

namespace toolnexus::file_plugin {
namespace {

uint64_t fnv1a(std::string_view s) noexcept {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace

bool ofd_lock(int fd, short type, off_t byte, bool wait, const std::string &what) {
  struct flock fl {};
  fl.l_type = type;
  fl.l_whence = SEEK_SET;
  fl.l_start = byte;
  fl.l_len = 1;
  while (::fcntl(fd, wait ? F_OFD_SETLKW : F_OFD_SETLK, &fl) != 0) {
    if (errno == EINTR) continue;
    if (!wait && (errno == EAGAIN || errno == EACCES)) return false;
    throw Error(TNX_EIO, "cannot lock '" + what + "': " + errtext(errno));
  }
  return true;
}

bool ofd_held(int fd, off_t byte) {
  struct flock fl {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  fl.l_start = byte;
  fl.l_len = 1;
  if (::fcntl(fd, F_OFD_GETLK, &fl) != 0) return false;
  return fl.l_type != F_UNLCK;
}

IndexLock::IndexLock(int lock_fd, std::string lock_path, short type) : fd_(lock_fd), what_(std::move(lock_path)) {
  ofd_lock(fd_, type, kIndexLockByte, true, what_);
}

IndexLock::~IndexLock() {
  try {
    ofd_lock(fd_, F_UNLCK, kIndexLockByte, true, what_);
  } catch (...) {
  }
}

SlotGuard::SlotGuard(std::mutex *id_mutexes, int lock_fd, std::string lock_path, std::string_view id)
    : fd_(lock_fd), what_(std::move(lock_path)), slot_(fnv1a(id) % kIdSlots), lock_(id_mutexes[slot_]) {
  ofd_lock(fd_, F_WRLCK, kIdLockBase + static_cast<off_t>(slot_), true, what_);
}

SlotGuard::~SlotGuard() {
  try {
    ofd_lock(fd_, F_UNLCK, kIdLockBase + static_cast<off_t>(slot_), true, what_);
  } catch (...) {
  }
}

}  // namespace toolnexus::file_plugin

// server/src/semaphore.cpp: see semaphore.hpp.
#include "semaphore.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

namespace toolnexus::server_detail {

Semaphore::Semaphore(unsigned initial) : fd_(::eventfd(initial, EFD_SEMAPHORE | EFD_CLOEXEC)) {
  if (fd_ < 0) throw std::system_error(errno, std::generic_category(), "eventfd (work queue semaphore)");
}

Semaphore::~Semaphore() { ::close(fd_); }

void Semaphore::release(uint64_t n) noexcept {
  while (::write(fd_, &n, sizeof n) < 0 && errno == EINTR) {
  }
}

void Semaphore::acquire() noexcept {
  uint64_t v = 0;
  while (::read(fd_, &v, sizeof v) < 0 && errno == EINTR) {
  }
}

}  // namespace toolnexus::server_detail

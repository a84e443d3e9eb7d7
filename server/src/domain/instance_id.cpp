// A server instance identity kept on disk (see instance_id.hpp).
#include "domain/instance_id.hpp"

#include "common/util.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace toolnexus::server_detail {

namespace {

constexpr int kMaxSlots = 1024;
constexpr std::size_t kMaxIdBytes = 128;

// An id as a file may hold it: 1..128 printable ASCII bytes, no spaces.
bool valid_id(const std::string &s) {
  if (s.empty() || s.size() > kMaxIdBytes) return false;
  for (char c : s)
    if (c <= ' ' || c > '~') return false;
  return true;
}

std::runtime_error failure(const std::string &what, const std::string &path, int err) {
  return std::runtime_error("instance identity: cannot " + what + " '" + path + "': " + std::strerror(err));
}

}  // namespace

std::string default_instance_base(const std::string &selector) {
  if (selector.rfind("file:", 0) == 0 && selector.size() > 5) return selector.substr(5) + "/.toolnexus-instance";
  if (selector.rfind("sqlite:", 0) == 0 && selector.size() > 7) {
    std::string path = selector.substr(7, selector.find('?') == std::string::npos ? std::string::npos
                                                                                   : selector.find('?') - 7);
    if (!path.empty() && path != ":memory:") return path + ".toolnexus-instance";
  }
  return {};
}

InstanceClaim::InstanceClaim(const std::string &base) {
  for (int n = 0; n < kMaxSlots; ++n) {
    const std::string path = base + "-" + std::to_string(n);
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) throw failure("open", path, errno);
    struct flock fl {};
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    if (::fcntl(fd, F_OFD_SETLK, &fl) != 0) {
      const int err = errno;
      ::close(fd);
      if (err == EAGAIN || err == EACCES) continue;  // a live server's
      throw failure("lock", path, err);
    }
    char buf[kMaxIdBytes + 2];
    const ssize_t got = ::pread(fd, buf, sizeof buf, 0);
    if (got < 0) {
      const int err = errno;
      ::close(fd);
      throw failure("read", path, err);
    }
    std::string id(buf, static_cast<std::size_t>(got));
    while (!id.empty() && (id.back() == '\n' || id.back() == '\r')) id.pop_back();
    if (!valid_id(id)) {
      // New (or damaged): a new id, written whole and made durable before
      // any lease names it.
      id = new_uuid();
      const std::string line = id + "\n";
      if (::ftruncate(fd, 0) != 0 ||
          ::pwrite(fd, line.data(), line.size(), 0) != static_cast<ssize_t>(line.size()) || ::fsync(fd) != 0) {
        const int err = errno;
        ::close(fd);
        throw failure("write", path, err);
      }
    }
    fd_ = fd;
    id_ = std::move(id);
    path_ = path;
    return;
  }
  throw std::runtime_error("instance identity: all " + std::to_string(kMaxSlots) + " files " + base + "-N are held by "
                           "running servers");
}

InstanceClaim::~InstanceClaim() {
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace toolnexus::server_detail

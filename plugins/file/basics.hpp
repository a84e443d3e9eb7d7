// plugins/file/basics.hpp: the small helpers every layer of the file plugin
// uses: an owned file descriptor, errno texts, prefix/suffix tests, SHA-256,
// a complete write(), an empty tnx_task_record, and the identities of a
// task file (FileId) and of the directory (Stamp) that the index keeps.
//
// Internal to the file plugin (built with hidden visibility; the plugin
// exports only toolnexus_plugin_entry). Everything here is thread-safe in
// the sense of the standard library: no shared state.
#ifndef TOOLNEXUS_FILE_BASICS_HPP
#define TOOLNEXUS_FILE_BASICS_HPP

#include "toolnexus/plugin.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <string_view>
#include <utility>

/// The file plugin's internals (see file_plugin.cpp for the on-disk layout).
namespace toolnexus::file_plugin {

using toolnexus::sdk::DueKey;
using toolnexus::sdk::Error;
using toolnexus::sdk::ListKey;
using toolnexus::sdk::view;
using toolnexus::sdk::quote;

/// A zeroed record with its header filled in.
inline tnx_task_record empty_record() noexcept {
  tnx_task_record r{};
  r.header.struct_size = static_cast<uint32_t>(sizeof(tnx_task_record));
  r.header.abi_major = TNX_ABI_MAJOR;
  r.header.abi_minor = TNX_ABI_MINOR;
  return r;
}

/// The message of errno value `e` ("No such file or directory").
std::string errtext(int e);

/// True when `s` begins with `p`.
inline bool starts_with(std::string_view s, std::string_view p) noexcept {
  return s.size() >= p.size() && s.compare(0, p.size(), p) == 0;
}
/// True when `s` ends with `p`.
inline bool ends_with(std::string_view s, std::string_view p) noexcept {
  return s.size() >= p.size() && s.compare(s.size() - p.size(), p.size(), p) == 0;
}

/// The lower-case hex SHA-256 (64 characters) of `data`.
std::string sha256_hex(std::string_view data);

/// Writes all of `data` to `fd`, retrying short writes and EINTR. Throws
/// Error(TNX_EIO) naming `what` (a path) and the system error.
void write_all_fd(int fd, std::string_view data, const std::string &what);


/// Owns a file descriptor (-1: none) and closes it when destroyed or
/// reset. Movable, not copyable; not thread-safe (one owner).
class Fd {
 public:
  /// Takes ownership of `fd` (-1: none).
  explicit Fd(int fd = -1) noexcept : fd_(fd) {}
  Fd(Fd &&o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd &operator=(Fd &&o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  Fd(const Fd &) = delete;
  Fd &operator=(const Fd &) = delete;
  ~Fd() { reset(); }
  /// The descriptor (-1: none), still owned.
  int get() const noexcept { return fd_; }
  /// Gives up ownership: returns the descriptor, which the caller closes.
  int release() noexcept { return std::exchange(fd_, -1); }
  /// Closes the descriptor (if any); the Fd then owns none.
  void reset() noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
};

/// What identifies the bytes of a task file: a save renames a new inode in,
/// an edit in place changes size or mtime.
struct FileId {
  uint64_t ino = 0, size = 0;
  int64_t mtime_ns = 0;
  /// Same inode, size and mtime.
  bool operator==(const FileId &o) const noexcept {
    return ino == o.ino && size == o.size && mtime_ns == o.mtime_ns;
  }
  bool operator!=(const FileId &o) const noexcept { return !(*this == o); }
  /// The identity of the file `st` describes.
  static FileId of(const struct stat &st) noexcept {
    return FileId{static_cast<uint64_t>(st.st_ino), static_cast<uint64_t>(st.st_size),
                  static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec};
  }
};

/// What the directory looked like when the last process closed the store.
struct Stamp {
  int64_t mtime_ns = 0, ctime_ns = 0;
  uint64_t ino = 0;
  /// Same mtime, ctime and inode.
  bool operator==(const Stamp &o) const noexcept {
    return mtime_ns == o.mtime_ns && ctime_ns == o.ctime_ns && ino == o.ino;
  }
};

}  // namespace toolnexus::file_plugin

#endif  // TOOLNEXUS_FILE_BASICS_HPP

// plugins/file/locks.hpp: the locks of the file plugin, all on .tnx-lock
// (layout comment of file_plugin.cpp): OFD record locks (fcntl
// F_OFD_SETLK, so they work between the threads of one process too) on
// single bytes of that file:
//   byte 0            the index lock (appending to or rewriting .tnx-index),
//   bytes 16..271     one process slot per open read-write store,
//   bytes 1024..5119  the write lock of the ids hashing to that slot.
// Errors: a lock that cannot be taken for another reason than a holder
// (EBADF, ENOLCK, ...) is Error(TNX_EIO) naming .tnx-lock.
#ifndef TOOLNEXUS_FILE_LOCKS_HPP
#define TOOLNEXUS_FILE_LOCKS_HPP

#include <fcntl.h>
#include <sys/types.h>

#include <cstddef>
#include <mutex>
#include <string>
#include <string_view>

namespace toolnexus::file_plugin {

/// The lock file in <dir>.
inline constexpr const char *kLockName = ".tnx-lock";
/// Lock byte of the index lock.
inline constexpr off_t kIndexLockByte = 0;
/// First lock byte of the process slots.
inline constexpr off_t kProcessSlotBase = 16;
/// Number of process slots: at most this many processes open a store read-write.
inline constexpr int kProcessSlots = 256;
/// First lock byte of the id locks.
inline constexpr off_t kIdLockBase = 1024;
/// Number of id lock slots (ids share a slot by hash).
inline constexpr size_t kIdSlots = 4096;

/// Takes or drops an OFD record lock on one byte of `fd`. Returns false when
/// `wait` is false and another holder has it.
/// `type`: F_WRLCK, F_RDLCK or F_UNLCK; `what` names the file for errors.
bool ofd_lock(int fd, short type, off_t byte, bool wait, const std::string &what);

/// True when another open file description holds a lock on `byte`.
bool ofd_held(int fd, off_t byte);

/// The index lock (.tnx-lock byte 0) of this store, for appending to,
/// compacting or rebuilding the index. The caller holds append_mu_ (OFD
/// locks of one open file do not exclude its own threads).
/// Held from construction to destruction (an RAII guard; not copyable).
/// Errors: the constructor throws (see the file comment); the destructor
/// ignores a failed unlock (the lock goes with the descriptor's close).
class IndexLock {
 public:
  /// Takes the index lock of the .tnx-lock open as `lock_fd` (borrowed; it
  /// must stay open while the guard lives), waiting for other holders.
  /// `lock_path` names it in errors. `type`: F_WRLCK to append or rewrite;
  /// F_RDLCK (a read-only open) to read the index and the directory's stamp
  /// while no one appends.
  IndexLock(int lock_fd, std::string lock_path, short type = F_WRLCK);
  ~IndexLock();
  IndexLock(const IndexLock &) = delete;
  IndexLock &operator=(const IndexLock &) = delete;

 private:
  int fd_;
  std::string what_;
};

/// Serialises saves and deletes of one id between threads (a mutex per
/// slot of the id's hash) and between processes (an OFD lock on byte
/// 1024 + slot of .tnx-lock): compare-and-set then holds across processes.
/// Held from construction to destruction (an RAII guard; not copyable);
/// errors as IndexLock's.
class SlotGuard {
 public:
  /// Takes the lock of `id`: first the mutex of its slot in `id_mutexes`
  /// (kIdSlots of them, borrowed), then the OFD lock of that slot in the
  /// .tnx-lock open as `lock_fd` (borrowed), waiting for both. `lock_path`
  /// names it in errors.
  SlotGuard(std::mutex *id_mutexes, int lock_fd, std::string lock_path, std::string_view id);
  ~SlotGuard();
  SlotGuard(const SlotGuard &) = delete;
  SlotGuard &operator=(const SlotGuard &) = delete;

 private:
  int fd_;
  std::string what_;
  size_t slot_;
  std::lock_guard<std::mutex> lock_;
};

}  // namespace toolnexus::file_plugin

#endif  // TOOLNEXUS_FILE_LOCKS_HPP

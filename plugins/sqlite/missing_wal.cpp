// plugins/sqlite: see missing_wal.hpp.
#include "missing_wal.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

namespace tnx_sqlite {

bool wal_file_exists(const std::string &path) {
  struct stat st {};
  return ::lstat((path + "-wal").c_str(), &st) == 0;
}

std::string missing_wal_message(const std::string &path) {
  return "sqlite: database '" + path + "' was not closed cleanly by its last writer, and its write-ahead log '" +
         path + "-wal' is missing: Tasks saved since the last checkpoint were in that file, so acknowledged " +
         "Tasks may be missing here (was the database copied without its -wal while a server ran?). Put the " +
         "-wal file back beside it, or open with '?missing_wal=accept' to use the database as it is (a copy " +
         "made with `toolnexus store copy` or sqlite3's .backup is complete on its own)";
}

WriterLock::~WriterLock() { release(); }

bool WriterLock::open_and_try_alone(const std::string &path, bool read_only) {
  release();
  const std::string lock = path + "-tnxlock";
  fd_ = read_only ? ::open(lock.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW)
                  : ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd_ < 0) {
    // Read-only and no lock file: no writer of this version has it open.
    return read_only && errno == ENOENT;
  }
  int rc;
  do {
    rc = ::flock(fd_, LOCK_EX | LOCK_NB);
  } while (rc != 0 && errno == EINTR);
  return rc == 0;
}

void WriterLock::share() {
  if (fd_ < 0) return;
  int rc;
  do {
    rc = ::flock(fd_, LOCK_SH);
  } while (rc != 0 && errno == EINTR);
}

bool WriterLock::try_last() {
  if (fd_ < 0) return false;
  int rc;
  do {
    rc = ::flock(fd_, LOCK_EX | LOCK_NB);
  } while (rc != 0 && errno == EINTR);
  return rc == 0;
}

void WriterLock::release() {
  if (fd_ < 0) return;
  ::close(fd_);  // releases the flock
  fd_ = -1;
}

}  // namespace tnx_sqlite

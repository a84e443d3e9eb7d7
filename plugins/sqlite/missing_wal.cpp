// plugins/sqlite: see missing_wal.hpp.
#include "missing_wal.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace tnx_sqlite {

bool header_says_wal(const std::string &path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) return false;
  unsigned char header[100];
  ssize_t got;
  do {
    got = ::pread(fd, header, sizeof header, 0);
  } while (got < 0 && errno == EINTR);
  ::close(fd);
  static const char kMagic[] = "SQLite format 3";  // with its NUL: 16 bytes
  return got == static_cast<ssize_t>(sizeof header) && std::memcmp(header, kMagic, sizeof kMagic) == 0 &&
         header[18] == 2 && header[19] == 2;
}

bool wal_file_exists(const std::string &path) {
  struct stat st {};
  return ::lstat((path + "-wal").c_str(), &st) == 0;
}

std::string missing_wal_message(const std::string &path) {
  return "sqlite: database '" + path + "' was left in WAL mode by a connection that never closed it, and its " +
         "write-ahead log '" + path + "-wal' is missing: Tasks saved since the last checkpoint were in that " +
         "file, so acknowledged Tasks may be missing here (was the database copied without its -wal while a " +
         "server ran?). Put the -wal file back beside it, or open with '?missing_wal=accept' to use the " +
         "database as it is (a copy made with `toolnexus store copy` or sqlite3's .backup is complete on " +
         "its own)";
}

}  // namespace tnx_sqlite

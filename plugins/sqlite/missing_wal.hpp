// plugins/sqlite: telling a database whose write-ahead log is missing from
// one that was closed cleanly (issue 19 item 8).
//
// A database in WAL mode keeps its latest saves in "<path>-wal" until a
// checkpoint copies them into "<path>". A copy of "<path>" alone, taken while
// a server runs, therefore lacks every Task saved since the last checkpoint,
// and SQLite opens it without complaint. What makes the loss detectable:
//  - the marker row tnx_meta('clean_close'): every writer sets it to 0 when
//    it opens and checkpoints it into the file itself, and the last writer
//    to close sets it back to 1 and checkpoints again (so the file alone is
//    complete and says so);
//  - "last" and "first" are known from an advisory lock (flock) on the file
//    "<path>-tnxlock", held shared by every open writer: whoever gets it
//    exclusively is alone. (SQLite's own journal-mode switch is no such
//    test: it was granted while another process had the database open, and
//    a save was lost; the first attempt at this check did that.)
// A database that says clean_close = 0 with no "<path>-wal" beside it, opened
// by nobody else, lost its -wal: copied without it, or deleted. (After a
// crash the -wal is still there: SQLite deletes it only on a clean close.)
// Only normal transactions and checkpoints are used: nothing here can lose a
// save.
#pragma once

#include <string>

namespace tnx_sqlite {

/// True when "<path>-wal" exists (any kind of file; lstat). Thread-safe.
bool wal_file_exists(const std::string &path);

/// The TNX_ECORRUPT message for database `path` whose -wal is missing.
std::string missing_wal_message(const std::string &path);

/// The advisory lock "<path>-tnxlock" (see the file comment). Movable;
/// unlocks and closes in the destructor. Not thread-safe (one per store).
class WriterLock {
 public:
  WriterLock() = default;
  ~WriterLock();
  WriterLock(const WriterLock &) = delete;
  WriterLock &operator=(const WriterLock &) = delete;

  /// Opens "<path>-tnxlock" (creating it, mode 0644 & ~umask, unless
  /// `read_only`; then a missing file means no writer holds it) and tries
  /// to take it exclusively without waiting. Returns true when this opener
  /// is alone (no toolnexus writer has the database open). Never throws; a
  /// lock file that cannot be made or locked counts as "not alone" (no check
  /// is made, nothing is refused).
  bool open_and_try_alone(const std::string &path, bool read_only);
  /// Holds the lock shared from now on (waits for a closing writer that
  /// holds it exclusively). No-op without a lock file.
  void share();
  /// Tries to take it exclusively without waiting: true when this writer
  /// is the last one. No-op (false) without a lock file.
  bool try_last();
  /// Releases and closes.
  void release();

 private:
  int fd_ = -1;
};

}  // namespace tnx_sqlite

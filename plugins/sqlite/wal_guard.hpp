// plugins/sqlite/wal_guard.hpp: knows when a WAL database file is missing
// the -wal that holds its latest saves.
//
// The problem (issue 19 item 8): in WAL mode a save is committed when it is
// in '<db>-wal'; it reaches '<db>' itself only at the next checkpoint. A copy
// of '<db>' alone made while a store has it open (cp, rsync, a volume
// snapshot of one file), or a '<db>-wal' deleted by hand, loses every save
// since that checkpoint, and SQLite opens what is left without a word.
//
// The mechanism: one row, tnx_wal_state (wal_required, epoch), that says
// what the main file's copy of it means.
// - A writer checkpoints itself (its connection's automatic checkpoint is
//   off: the WAL hook below replaces it) in three steps:
//     1. commit wal_required = 1 with a new epoch (this row goes to the WAL),
//     2. checkpoint (the row, and every save before it, go to the main file),
//     3. if the checkpoint copied the whole WAL and the epoch is still its
//        own, commit wal_required = 0 (into the WAL only).
//   So, while stores are open, the main file says 1 and the latest committed
//   state, which every reader and every copy made through SQLite sees
//   (sqlite3 .backup, VACUUM INTO), says 0.
// - The last writer to close commits 0 first; SQLite's checkpoint at the last
//   close then leaves 0 in a file without -wal: a clean file.
// - At open, a database whose latest state says 1 while no -wal with frames
//   is beside it was copied or left without its -wal: refused (the plugin's
//   missing_wal option can accept it once).
//
// What it cannot see: a copy made in the few milliseconds between steps 1
// and 3 by SQLite's backup (it says 1: refused, although complete; accept it
// or copy again); a -wal that belongs to another database put beside the
// file; a main file copied while the first checkpoint of an open could not
// finish (a reader held an older snapshot: retried every 100 ms, also while
// no save comes, by the store's guard thread, until the reader lets go);
// stores written by a plugin older than this guard, or by other programs
// that checkpoint (sqlite3's automatic checkpoint folds 0 into the file until
// the next guarded checkpoint). journal modes other than wal need no guard
// (their main file is complete after every commit) and clear the row.
//
// Thread-safety: a WalGuard belongs to one write connection and is used by
// the thread that holds that connection (the group commit's leader), never
// by two threads at once. check_missing_wal works on any connection.
#pragma once

#include <sqlite3.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>

namespace toolnexus_sqlite {

/// Creates tnx_wal_state with its one row (wal_required 0) when missing.
/// No user_version change: older plugins ignore the table.
inline constexpr const char *kWalStateSql =
    "CREATE TABLE IF NOT EXISTS tnx_wal_state (only INTEGER PRIMARY KEY CHECK (only = 1),"
    " epoch INTEGER NOT NULL, wal_required INTEGER NOT NULL);\n"
    "INSERT OR IGNORE INTO tnx_wal_state (only, epoch, wal_required) VALUES (1, 0, 0);\n";

/// What check_missing_wal found.
enum class WalCheck {
  /// Not in WAL mode, no tnx_wal_state table (a file from before the guard),
  /// or the file is complete.
  Complete,
  /// The latest state says wal_required = 1 and '<path>-wal' is absent or
  /// holds no frame: saves after the file's last checkpoint are missing.
  MissingWal,
};

/// Looks at `db` (opened on `path`, in any role) in one read transaction:
/// whether it is in WAL mode, the table exists, its row says 1, and
/// '<path>-wal' holds at least one frame. Inside the read transaction no
/// other process can delete the -wal, so a live store's -wal is always seen.
/// Returns the verdict; throws nothing. `*sqlite_rc` receives the SQLite
/// code of a failed read (SQLITE_OK otherwise; the verdict is then Complete:
/// the open's own statements report the failure).
WalCheck check_missing_wal(sqlite3 *db, const std::string &path, int *sqlite_rc) noexcept;

/// The checkpoints of one write connection, done as the header describes.
class WalGuard {
 public:
  /// WAL frames after which a checkpoint is due (SQLite's default
  /// wal_autocheckpoint).
  static constexpr int kCheckpointFrames = 1000;
  /// Shortest pause between two tries while a checkpoint could not finish.
  static constexpr std::chrono::milliseconds kRetry{100};

  /// Takes over `db`'s checkpoints (installs the WAL hook, which turns off
  /// SQLite's automatic checkpoint for this connection). `db` must be in WAL
  /// mode with tnx_wal_state present and outlive the guard.
  explicit WalGuard(sqlite3 *db) noexcept;
  WalGuard(const WalGuard &) = delete;
  WalGuard &operator=(const WalGuard &) = delete;

  /// Runs the three steps now: at open, so the main file says 1 from the
  /// first save on. Failures (locked, disk full) leave a retry pending.
  void checkpoint_now() noexcept;
  /// After a commit on the connection (no transaction open): checkpoints
  /// when kCheckpointFrames are in the WAL or a retry is due.
  void after_commit() noexcept;
  /// True while a checkpoint could not finish (a reader held an older
  /// snapshot, a lock, an I/O error) and is to be tried again. Any thread.
  bool pending() const noexcept { return pending_.load(); }
  /// Before the connection closes: commits wal_required = 0 if the latest
  /// state says 1, so that SQLite's checkpoint at the last close leaves a
  /// clean file. Best effort.
  void before_close() noexcept;

 private:
  static int on_wal(void *self, sqlite3 *db, const char *name, int frames) noexcept;
  bool exec(const char *sql) noexcept;

  sqlite3 *db_;
  int frames_ = 0;
  std::atomic<bool> pending_{false};
  std::chrono::steady_clock::time_point last_try_{};
};

}  // namespace toolnexus_sqlite

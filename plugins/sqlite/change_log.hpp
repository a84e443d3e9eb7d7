// plugins/sqlite/change_log.hpp: the sqlite store's change feed (ABI 1.4,
// tnx_store_vtable.watch): who changed which Task, from every process.
//
// The mechanism:
// - tnx_changes (seq, id, version, deleted) gets one row per insert, update
//   and delete of tnx_tasks, written by triggers in the same transaction as
//   the change. The triggers live in the database, so they also log the
//   saves of other processes, of older plugins and of hand-written SQL. seq
//   is an AUTOINCREMENT rowid (never reused, also after the rows were
//   deleted by hand); commits are serialised by SQLite's write lock, so
//   every snapshot holds a gap-free run of seq.
// - A store with a running feed has one ChangeLogWatcher: one thread with a
//   read connection of its own. It wakes when this process commits (poke())
//   or every poll interval, asks SQLite's `PRAGMA data_version` whether any
//   connection committed since, and only then reads the rows after the last
//   seq it delivered, in seq order (so per id versions only grow), to the
//   sink. Cost while nothing changes: one data_version per interval (a look
//   at the WAL index in shared memory), whatever the number of streams.
// - Delay: this process's saves at once (the writer pokes after its commit);
//   other processes' within one poll interval (feed_poll_ms, default 20).
// - Rows are pruned by the writer: past kKeep rows, the oldest go. A watcher
//   that finds the next seq pruned (it fell behind by more than kKeep
//   changes), or the table rebuilt by hand (seq below its position),
//   reports TNX_CHANGE_GAP and goes on from the newest row: the host
//   re-reads.
//
// Thread-safety: ChangeLogWatcher's constructor, destructor and poke() may be
// called from any thread (poke concurrently with everything); the sink is
// called from the watcher's thread only, never after the destructor returns.
#pragma once

#include "toolnexus/plugin.hpp"

#include <sqlite3.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

namespace toolnexus_sqlite {

/// tnx_changes and the three triggers that fill it, created when missing
/// (no user_version change: older plugins ignore the table, and their saves
/// are logged all the same by the triggers).
inline constexpr const char *kChangeLogSql =
    "CREATE TABLE IF NOT EXISTS tnx_changes (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL,"
    " version INTEGER NOT NULL, deleted INTEGER NOT NULL);\n"
    "CREATE TRIGGER IF NOT EXISTS tnx_tasks_change_insert AFTER INSERT ON tnx_tasks BEGIN\n"
    "  INSERT INTO tnx_changes (id, version, deleted) VALUES (NEW.id, NEW.version, 0);\n"
    "END;\n"
    "CREATE TRIGGER IF NOT EXISTS tnx_tasks_change_update AFTER UPDATE ON tnx_tasks BEGIN\n"
    "  INSERT INTO tnx_changes (id, version, deleted) VALUES (NEW.id, NEW.version, 0);\n"
    "END;\n"
    "CREATE TRIGGER IF NOT EXISTS tnx_tasks_change_delete AFTER DELETE ON tnx_tasks BEGIN\n"
    "  INSERT INTO tnx_changes (id, version, deleted) VALUES (OLD.id, OLD.version, 1);\n"
    "END;\n";

/// Rows of tnx_changes kept by prune_change_log.
inline constexpr int64_t kChangeLogKeep = 10000;
/// Commits of one writer between two prunes.
inline constexpr int kChangeLogPruneEvery = 1000;

/// Deletes all but the newest kChangeLogKeep rows, on the write connection
/// `db` (no transaction open). Best effort: returns the SQLite code.
int prune_change_log(sqlite3 *db) noexcept;

/// The feed's thread and connection (see the header comment).
class ChangeLogWatcher {
 public:
  /// Opens a read connection on `path` (existing file; SQLITE_OPEN_READWRITE
  /// without create, query_only, `busy_timeout_ms`), reads the newest seq
  /// (changes before it are not reported: the host reads after watch), and
  /// starts the thread that reports to `feed`, which must outlive this.
  /// Throws sdk::Error(TNX_EIO) naming the file when the connection fails.
  ChangeLogWatcher(const std::string &path, int busy_timeout_ms, std::chrono::milliseconds poll,
                   const toolnexus::sdk::ChangeFeed &feed);
  /// Stops the thread (when it returns, the sink is not running and will
  /// not be called again by this watcher) and closes the connection.
  ~ChangeLogWatcher();
  ChangeLogWatcher(const ChangeLogWatcher &) = delete;
  ChangeLogWatcher &operator=(const ChangeLogWatcher &) = delete;

  /// A commit of this process: read the log now instead of at the next
  /// interval. Never blocks beyond a mutex held for a few instructions.
  void poke() noexcept;

 private:
  void run() noexcept;
  /// Delivers the rows after last_seq_; false when a read failed.
  bool deliver_new() noexcept;
  int64_t data_version() noexcept;

  const toolnexus::sdk::ChangeFeed &feed_;
  const std::chrono::milliseconds poll_;
  sqlite3 *db_ = nullptr;
  sqlite3_stmt *version_ = nullptr, *after_ = nullptr, *newest_ = nullptr;
  int64_t last_seq_ = 0;
  int64_t last_data_version_ = -1;

  std::mutex mu_;
  std::condition_variable cv_;
  bool poked_ = false;   // guarded by mu_
  bool stop_ = false;    // guarded by mu_
  std::thread thread_;   // last: started when everything above is ready
};

}  // namespace toolnexus_sqlite

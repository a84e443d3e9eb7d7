// plugins/sqlite/wal_guard.cpp: see wal_guard.hpp for the mechanism.
#include "wal_guard.hpp"

#include <sys/stat.h>

#include <cstring>

namespace toolnexus_sqlite {
namespace {

/// WAL file header size (https://sqlite.org/fileformat2.html#walformat): a
/// -wal of this size or less holds no frame.
constexpr off_t kWalHeaderBytes = 32;

/// One prepared statement, finalized on scope exit.
struct Stmt {
  sqlite3_stmt *s = nullptr;
  Stmt(sqlite3 *db, const char *sql) noexcept { sqlite3_prepare_v2(db, sql, -1, &s, nullptr); }
  ~Stmt() { sqlite3_finalize(s); }
  Stmt(const Stmt &) = delete;
  Stmt &operator=(const Stmt &) = delete;
};

/// The single integer a query returns, or `fallback` (and *rc set) when it
/// fails or returns no row.
int64_t query_int(sqlite3 *db, const char *sql, int64_t fallback, int *rc) noexcept {
  Stmt st(db, sql);
  if (st.s == nullptr) {
    *rc = sqlite3_errcode(db);
    return fallback;
  }
  const int step = sqlite3_step(st.s);
  if (step == SQLITE_ROW) return sqlite3_column_int64(st.s, 0);
  if (step != SQLITE_DONE) *rc = step;
  return fallback;
}

bool in_wal_mode(sqlite3 *db) noexcept {
  Stmt st(db, "PRAGMA journal_mode");
  if (st.s == nullptr || sqlite3_step(st.s) != SQLITE_ROW) return false;
  const unsigned char *mode = sqlite3_column_text(st.s, 0);
  return mode != nullptr && std::strcmp(reinterpret_cast<const char *>(mode), "wal") == 0;
}

}  // namespace

WalCheck check_missing_wal(sqlite3 *db, const std::string &path, int *sqlite_rc) noexcept {
  *sqlite_rc = SQLITE_OK;
  if (!in_wal_mode(db)) return WalCheck::Complete;
  if (sqlite3_exec(db, "BEGIN", nullptr, nullptr, nullptr) != SQLITE_OK) {
    *sqlite_rc = sqlite3_errcode(db);
    return WalCheck::Complete;
  }
  WalCheck verdict = WalCheck::Complete;
  int rc = SQLITE_OK;
  // The first read starts the read transaction: from here until COMMIT this
  // connection holds the WAL open, so a live store's -wal cannot go away.
  const bool tracked = query_int(db,
                                 "SELECT count(*) FROM sqlite_master WHERE type = 'table'"
                                 " AND name = 'tnx_wal_state'",
                                 0, &rc) == 1;
  if (tracked && rc == SQLITE_OK &&
      query_int(db, "SELECT wal_required FROM tnx_wal_state WHERE only = 1", 0, &rc) != 0 &&
      rc == SQLITE_OK) {
    struct stat ws {};
    const std::string wal = path + "-wal";
    if (::stat(wal.c_str(), &ws) != 0 || ws.st_size <= kWalHeaderBytes) verdict = WalCheck::MissingWal;
  }
  sqlite3_exec(db, "COMMIT", nullptr, nullptr, nullptr);
  *sqlite_rc = rc;
  return rc == SQLITE_OK ? verdict : WalCheck::Complete;
}

WalGuard::WalGuard(sqlite3 *db) noexcept : db_(db) { sqlite3_wal_hook(db_, &WalGuard::on_wal, this); }

int WalGuard::on_wal(void *self, sqlite3 *, const char *name, int frames) noexcept {
  if (std::strcmp(name, "main") == 0) static_cast<WalGuard *>(self)->frames_ = frames;
  return SQLITE_OK;
}

bool WalGuard::exec(const char *sql) noexcept {
  if (sqlite3_exec(db_, sql, nullptr, nullptr, nullptr) == SQLITE_OK) return true;
  if (sqlite3_get_autocommit(db_) == 0) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
  return false;
}

void WalGuard::checkpoint_now() noexcept {
  last_try_ = std::chrono::steady_clock::now();
  pending_ = true;
  // 1. The main file is about to receive this row: say there 1, with an
  //    epoch of our own so that step 3 does not undo another writer's step 1.
  if (!exec("BEGIN IMMEDIATE")) return;
  int rc = SQLITE_OK;
  const int64_t epoch =
      query_int(db_, "SELECT epoch FROM tnx_wal_state WHERE only = 1", -1, &rc) + 1;
  if (rc != SQLITE_OK || epoch <= 0) {
    exec("ROLLBACK");
    return;
  }
  Stmt mark(db_, "UPDATE tnx_wal_state SET epoch = ?1, wal_required = 1 WHERE only = 1");
  if (mark.s == nullptr || sqlite3_bind_int64(mark.s, 1, epoch) != SQLITE_OK ||
      sqlite3_step(mark.s) != SQLITE_DONE || !exec("COMMIT")) {
    exec("ROLLBACK");
    return;
  }
  // 2. Copy the WAL into the main file; done only if all of it went.
  int log = -1, copied = -1;
  rc = sqlite3_wal_checkpoint_v2(db_, "main", SQLITE_CHECKPOINT_PASSIVE, &log, &copied);
  if (rc != SQLITE_OK || log < 0 || copied != log) return;
  // 3. The latest state, which every reader and SQLite-made copy sees, is
  //    complete again: say 0 there (the WAL), unless another writer began
  //    its own step 1 meanwhile (its step 3 will).
  Stmt clear(db_, "UPDATE tnx_wal_state SET wal_required = 0 WHERE only = 1 AND epoch = ?1");
  if (clear.s == nullptr || sqlite3_bind_int64(clear.s, 1, epoch) != SQLITE_OK ||
      sqlite3_step(clear.s) != SQLITE_DONE)
    return;
  pending_ = false;
}

void WalGuard::after_commit() noexcept {
  if (frames_ < kCheckpointFrames && !pending_) return;
  if (pending_ && std::chrono::steady_clock::now() - last_try_ < kRetry) return;
  checkpoint_now();
}

void WalGuard::before_close() noexcept {
  exec("UPDATE tnx_wal_state SET wal_required = 0 WHERE only = 1 AND wal_required <> 0");
}

}  // namespace toolnexus_sqlite

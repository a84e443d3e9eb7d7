// plugins/sqlite/change_log.cpp: see change_log.hpp for the mechanism.
#include "change_log.hpp"

#include <string_view>

namespace toolnexus_sqlite {

int prune_change_log(sqlite3 *db) noexcept {
  const std::string sql = "DELETE FROM tnx_changes WHERE seq <= (SELECT max(seq) FROM tnx_changes) - " +
                          std::to_string(kChangeLogKeep);
  return sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr);
}

ChangeLogWatcher::ChangeLogWatcher(const std::string &path, int busy_timeout_ms, std::chrono::milliseconds poll,
                                   const toolnexus::sdk::ChangeFeed &feed)
    : feed_(feed), poll_(poll) {
  auto fail = [&](const std::string &what) {
    std::string msg = "sqlite: watch: " + what + " of '" + path + "' for the change feed: " +
                      (db_ != nullptr ? sqlite3_errmsg(db_) : "out of memory");
    sqlite3_finalize(version_);
    sqlite3_finalize(after_);
    sqlite3_finalize(newest_);
    sqlite3_close(db_);
    db_ = nullptr;
    throw toolnexus::sdk::Error(TNX_EIO, msg);
  };
  if (sqlite3_open_v2(path.c_str(), &db_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_PRIVATECACHE,
                      nullptr) != SQLITE_OK)
    fail("cannot open a connection");
  sqlite3_busy_timeout(db_, busy_timeout_ms);
  sqlite3_db_config(db_, SQLITE_DBCONFIG_DEFENSIVE, 1, nullptr);
  sqlite3_db_config(db_, SQLITE_DBCONFIG_TRUSTED_SCHEMA, 0, nullptr);
  if (sqlite3_exec(db_, "PRAGMA query_only = 1", nullptr, nullptr, nullptr) != SQLITE_OK) fail("cannot set up");
  if (sqlite3_prepare_v3(db_, "PRAGMA data_version", -1, SQLITE_PREPARE_PERSISTENT, &version_, nullptr) !=
          SQLITE_OK ||
      sqlite3_prepare_v3(db_,
                         "SELECT seq, id, version, deleted FROM tnx_changes WHERE seq > ?1 ORDER BY seq LIMIT 512",
                         -1, SQLITE_PREPARE_PERSISTENT, &after_, nullptr) != SQLITE_OK ||
      sqlite3_prepare_v3(db_, "SELECT coalesce(max(seq), 0) FROM tnx_changes", -1, SQLITE_PREPARE_PERSISTENT,
                         &newest_, nullptr) != SQLITE_OK)
    fail("cannot read the change log (table tnx_changes)");
  // Newest first, then data_version: a commit between the two is read at
  // the first wake-up (its data_version differs from none seen yet).
  if (sqlite3_step(newest_) != SQLITE_ROW) fail("cannot read the change log");
  last_seq_ = sqlite3_column_int64(newest_, 0);
  sqlite3_reset(newest_);
  thread_ = std::thread([this] { run(); });
}

ChangeLogWatcher::~ChangeLogWatcher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
  sqlite3_finalize(version_);
  sqlite3_finalize(after_);
  sqlite3_finalize(newest_);
  sqlite3_close(db_);
}

void ChangeLogWatcher::poke() noexcept {
  {
    std::lock_guard<std::mutex> lock(mu_);
    poked_ = true;
  }
  cv_.notify_one();
}

int64_t ChangeLogWatcher::data_version() noexcept {
  int64_t v = -1;
  if (sqlite3_step(version_) == SQLITE_ROW) v = sqlite3_column_int64(version_, 0);
  sqlite3_reset(version_);
  return v;
}

bool ChangeLogWatcher::deliver_new() noexcept {
  // One read transaction for the whole catch-up, so pruning by a writer
  // cannot remove rows between two pages.
  if (sqlite3_exec(db_, "BEGIN", nullptr, nullptr, nullptr) != SQLITE_OK) return false;
  bool ok = true;
  for (bool more = true; more && ok;) {
    more = false;
    sqlite3_bind_int64(after_, 1, last_seq_);
    int rows = 0, rc;
    while ((rc = sqlite3_step(after_)) == SQLITE_ROW) {
      const int64_t seq = sqlite3_column_int64(after_, 0);
      // seq has no holes in a snapshot: a jump means rows were pruned
      // before this watcher read them.
      if (seq != last_seq_ + 1) feed_.gap();
      const auto *id = static_cast<const char *>(sqlite3_column_blob(after_, 1));
      const std::string_view id_view(id != nullptr ? id : "", static_cast<size_t>(sqlite3_column_bytes(after_, 1)));
      const int64_t version = sqlite3_column_int64(after_, 2);
      const uint64_t v = version > 0 ? static_cast<uint64_t>(version) : 0;
      if (sqlite3_column_int64(after_, 3) != 0) feed_.deleted(id_view, v);
      else feed_.saved(id_view, v);
      last_seq_ = seq;
      ++rows;
    }
    sqlite3_reset(after_);
    if (rc != SQLITE_DONE) ok = false;
    more = rows == 512;
    if (ok && rows == 0) {
      // Nothing after last_seq_: fine, unless the table was emptied or
      // rebuilt by hand (its seq started again below ours).
      if (sqlite3_step(newest_) == SQLITE_ROW) {
        const int64_t newest = sqlite3_column_int64(newest_, 0);
        if (newest < last_seq_) {
          feed_.gap();
          last_seq_ = newest;
        }
      }
      sqlite3_reset(newest_);
    }
  }
  sqlite3_exec(db_, "COMMIT", nullptr, nullptr, nullptr);
  return ok;
}

void ChangeLogWatcher::run() noexcept {
  bool failed = false;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, poll_, [&] { return poked_ || stop_; });
      if (stop_) return;
      poked_ = false;
    }
    const int64_t v = data_version();
    if (v == last_data_version_ && v != -1 && !failed) continue;
    last_data_version_ = v;
    const bool ok = deliver_new();
    // A failed read (locked past busy_timeout_ms, I/O error) is retried at
    // the next interval from the same seq: nothing is skipped, so no gap.
    failed = !ok;
  }
}

}  // namespace toolnexus_sqlite

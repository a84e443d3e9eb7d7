// plugins/sqlite: telling a database whose write-ahead log is missing from
// one that was closed cleanly.
//
// A database in WAL mode keeps its latest saves in "<path>-wal" until a
// checkpoint copies them into "<path>". A copy of "<path>" alone, taken while
// a server runs, therefore lacks every Task saved since the last checkpoint,
// and SQLite opens it without complaint (issue 19 item 8). What makes the
// loss detectable: this plugin's writer switches the database back to
// rollback mode (PRAGMA journal_mode = DELETE) when it is the last connection
// to close it, which SQLite only allows to the last one and which folds the
// -wal into the file first. So a database this plugin uses is in WAL mode
// (bytes 18 and 19 of its header are 2) only while a connection has it open,
// and then "<path>-wal" exists; or after a crash, when "<path>-wal" exists
// too (SQLite deletes it only on a clean close). WAL mode with no -wal beside
// it means the -wal was lost: copied without it, or deleted.
//
// Files written by versions before this rule (closed in WAL mode) carry no
// table tnx_wal_guard: the check is made only for files that do, which the
// writer creates at its first open.
#pragma once

#include <string>

namespace tnx_sqlite {

/// Name of the marker table ("this database is closed in rollback mode").
inline constexpr const char *kWalGuardTable = "tnx_wal_guard";

/// True when the file at `path` starts with a SQLite header whose write and
/// read versions (bytes 18, 19; https://sqlite.org/fileformat2.html section
/// 1.3) both say WAL (2). False for a missing, short, unreadable or non-SQLite
/// file (SQLite itself reports those). Reads 100 bytes; thread-safe.
bool header_says_wal(const std::string &path);

/// True when "<path>-wal" exists (any kind of file; lstat). Thread-safe.
bool wal_file_exists(const std::string &path);

/// The TNX_ECORRUPT message for a database `path` in WAL mode without its
/// -wal: what is wrong, what may be lost, and the two ways on.
std::string missing_wal_message(const std::string &path);

}  // namespace tnx_sqlite

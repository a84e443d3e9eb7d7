// plugins/sqlite: the "sqlite" scheme. Tasks in one SQLite database file,
// shared safely by the threads of a process and by several processes.
//
// Built against the SDK header (toolnexus/plugin.hpp) and libsqlite3's C API
// only (SQLite >= 3.31, for the trusted_schema hardening; checked at open).
// Exports nothing but toolnexus_plugin_entry.
//
// ===========================================================================
// Selector
// ===========================================================================
//   sqlite:<path>[?<option>=<value>[&<option>=<value>...]]
//
//   sqlite:/var/lib/tnx/tasks.db
//   sqlite:./t.db?synchronous=normal&busy_timeout_ms=250
//
// <path> is a file path, used as written (no URI syntax, no %-decoding, no ~
// expansion). A relative path is resolved against the working directory at
// open time. The first '?' starts the options, so <path> cannot contain '?'.
// With mode=rw the file and any missing parent directories are created (the
// directories with mode 0777 & ~umask, like mkdir -p). An empty <path> is
// TNX_EINVAL.
//
// ===========================================================================
// Options (each at most once; an unknown option, a missing "=value" or a bad
// value fails open() with TNX_EINVAL naming the option)
// ===========================================================================
//   synchronous=full|extra|normal|off            default full
//       PRAGMA synchronous of the writing connection. full (and extra): every
//       save is fsync'ed before it is reported done, so it survives a power
//       loss (TNX_CAP_DURABLE). normal/off trade that away for speed: with
//       journal=wal, normal can lose the last saves on power loss (never
//       corrupts); off can corrupt the file on power loss. Choosing them clears
//       TNX_CAP_DURABLE for that store (ABI 1.2 per-store capabilities; a 1.0
//       or 1.1 host sees only the descriptor's).
//   busy_timeout_ms=0..3600000                   default 5000
//       How long a call waits for a lock held by another connection or process
//       before failing with TNX_EIO "database ... is locked".
//   journal=wal|delete|truncate|persist          default wal
//       PRAGMA journal_mode. wal lets reads run while a save commits and is
//       what the performance figures assume; the rollback-journal modes are
//       for file systems without shared memory (readers then block writers and
//       the other way round, bounded by busy_timeout_ms). "memory" and "off"
//       are refused: they break atomic saves.
//   pool_size=1..64                              default 64
//       Idle read connections kept open for get/list. A reader is opened only
//       when a call finds none idle, so the pool grows to the number of
//       threads that have read at once and stays there, up to pool_size;
//       readers beyond it are closed after their call. The default is sized
//       for the A2A server, which may read from up to --max-connections
//       (128) HTTP threads at once: 64 keeps the readers of a busy server
//       open (GetTask at 64 clients: 23.6k req/s with 4, 31.6k with 64)
//       and costs nothing for a quiet one (readers are never opened ahead).
//   max_batch=1..1000                            default 64
//       Most saves/deletes committed in one group-commit transaction (below);
//       1 turns group commit off (one transaction per save).
//   mode=rw|ro                                   default rw
//       ro opens the existing file read-only: nothing is created or migrated;
//       a missing file, or one without the task schema, is TNX_ENOTFOUND;
//       save and del fail with TNX_EUNSUPPORTED naming the path. The host's
//       TNX_OPEN_READ_ONLY (ABI 1.2) means the same. A file the process may
//       not write to opens under mode=rw too, but save and del then fail with
//       TNX_EIO (a permission problem, not a choice). mode=ro opens with
//       SQLITE_OPEN_READONLY (for read-only media), so SQLite may leave the
//       -wal and -shm files it needed; TNX_OPEN_READ_ONLY does not. Neither
//       changes the database or an existing -wal: with a -wal beside the
//       file at open, no connection checkpoints on close (Options::keep_wal).
//   feed_poll_ms=1..60000                        default 20
//       How often the change feed (ABI 1.4, change_log.hpp) asks SQLite
//       whether another process committed (PRAGMA data_version, a look at
//       shared memory). Only while the host watches; this process's own
//       saves are reported at once.
//   missing_wal=refuse|accept                    default refuse
//       A database in WAL mode whose file says saves were made after its last
//       checkpoint, with no -wal holding them beside it (copied with cp, or its
//       -wal removed, while a store had it open: wal_guard.hpp), fails open()
//       with TNX_ECORRUPT naming both files: those saves are not in it. accept
//       opens it as it is (the loss accepted); a read-write open then marks
//       the file complete, so later opens need no option.
//
// ===========================================================================
// Schema (PRAGMA user_version = 3, PRAGMA application_id = 0x544E5853 "TNXS")
// ===========================================================================
//   CREATE TABLE tnx_tasks (
//     id             TEXT PRIMARY KEY NOT NULL,  -- bytes as given
//     context_id     TEXT NOT NULL DEFAULT '',
//     state          TEXT NOT NULL DEFAULT '',
//     status_time_us INTEGER NOT NULL,           -- TNX_TIME_NONE = INT64_MIN
//     owner          TEXT NOT NULL DEFAULT '',
//     tenant         TEXT NOT NULL DEFAULT '',
//     version        INTEGER NOT NULL CHECK (version >= 1),
//     task_json      TEXT NOT NULL,              -- exactly the saved bytes
//     due_us         INTEGER);                   -- ABI 1.5, NULL = nothing due
//   Indexes, each ending in the list order (status_time_us DESC, id):
//     tnx_tasks_by_time    (status_time_us DESC, id)
//     tnx_tasks_by_context (context_id, status_time_us DESC, id)
//     tnx_tasks_by_state   (state, ...), tnx_tasks_by_owner (owner, ...),
//     tnx_tasks_by_tenant  (tenant, ...)
//   and the due index (ABI 1.5): tnx_tasks_by_due_id (due_us, id) WHERE
//     due_us IS NOT NULL: the rows with a due time only, in the due list's
//     order, so a TNX_FILTER_DUE_BEFORE page is an index range from its
//     cursor, read in order with LIMIT (no sort; cost grows with the page),
//     and a count the range of what is due.
//     Column and index are added (ALTER TABLE ADD COLUMN, which rewrites no
//     row, and CREATE INDEX) in one transaction by any read-write open that
//     finds them missing, without a user_version change; the same
//     transaction drops tnx_tasks_by_due (due_us), the index of development
//     builds of 1.5 before the due order (a plugin of such a build refuses
//     to open the file afterwards: it finds its index missing and fails to
//     add the column again). An older plugin
//     names its columns in every statement, so it ignores due_us. Its
//     INSERT leaves due_us NULL (not due); its UPDATE leaves due_us as it
//     was, so a Task it re-saves may be listed as due when it is not (the
//     host re-reads it and finds nothing to do; never the other way round:
//     a host that sets due times re-saves through a plugin that keeps
//     them). A database opened read-only without them is read as it is,
//     without TNX_CAP_DUE_INDEX (a due list is refused as unsupported).
//   CREATE TABLE tnx_tombstones (id TEXT PRIMARY KEY, version INTEGER) WITHOUT ROWID
//     filled by trigger tnx_tasks_tombstone AFTER DELETE ON tnx_tasks: the
//     last version of a deleted id, so that a re-created id continues its
//     numbering (a version is never reused for an id: no ABA for CAS users).
//   CREATE TABLE tnx_wal_state (only = 1, epoch, wal_required)
//     one row saying whether the main file alone lacks saves that are in the
//     -wal (wal_guard.hpp). Created by any read-write open that finds it
//     missing, without a user_version change (older plugins ignore it).
//   CREATE TABLE tnx_changes (seq INTEGER PRIMARY KEY AUTOINCREMENT, id, version, deleted)
//     one row per insert, update and delete of tnx_tasks, written by the
//     triggers tnx_tasks_change_insert/_update/_delete in the same
//     transaction; read by the change feed (change_log.hpp), pruned to the
//     newest 10,000 rows. Created like tnx_wal_state.
//   CREATE TABLE tnx_counts (owner, tenant, state, n,
//                            PRIMARY KEY (owner, tenant, state)) WITHOUT ROWID
//     how many Tasks each (owner, tenant, state) has, kept by the triggers
//     tnx_tasks_count_insert/_update/_delete in the same transaction as the
//     change (so also for writes by other processes or by hand); count (ABI
//     1.3) sums a few of its rows instead of scanning tnx_tasks.
//
//   Schema history: 0 = empty file (the schema is created); 1 = the first
//   layout (tnx_tasks without tenant and version, index tnx_tasks_by_time
//   only), migrated to 2 by copying into the new table (tenant '', version 1);
//   2 = schema 3 without tnx_counts, migrated by creating it from one
//   GROUP BY over tnx_tasks (opened read-only, a schema 2 file is read as it
//   is and count scans instead); 3 = current. A larger user_version is
//   refused with TNX_EUNSUPPORTED. The
//   schema is created/migrated in one BEGIN IMMEDIATE transaction, so
//   processes opening a file at the same time do it exactly once.
//
// ===========================================================================
// Concurrency and durability
// ===========================================================================
// - Reads (get, list) use a pool of read connections: in WAL mode they never
//   wait for a writer and always see the last committed save.
// - Writes (save, del) go through one write connection per store with group
//   commit: a caller enqueues its request; if no thread is committing, it
//   becomes the leader, takes every queued request (up to max_batch), runs
//   them in one BEGIN IMMEDIATE ... COMMIT (each with its own compare-and-set
//   check and result, in queue order), hands the results back, and passes
//   the lead to the first caller queued meanwhile. Callers that arrive
//   meanwhile queue up for the next batch, so N threads share one fsync
//   instead of queueing for N. Each caller is woken once (its own Wakeup):
//   when its request is done, or when it is to lead. If a statement of a
//   batch fails (not a CAS conflict: an I/O error, a too-big record), the
//   batch is rolled back and each request is retried in its own
//   transaction, so every caller gets the outcome of its own request only.
// - Compare-and-set: inside the write transaction (BEGIN IMMEDIATE holds the
//   database's write lock against every other connection and process), the
//   stored version is read, compared with the expected one, and the row
//   written with the next version. So it holds between threads, stores and
//   processes; a mismatch writes nothing.
// - Other processes: SQLite file locks; BEGIN IMMEDIATE waits up to
//   busy_timeout_ms (polling with short sleeps) and then fails with TNX_EIO.
//
// ===========================================================================
// list
// ===========================================================================
// One statement per page, an index range scan in list order with LIMIT
// page_size + 1 (the extra row only says whether a next page exists); no
// OFFSET. The cursor is the last delivered (status_time_us, id) as
// sdk::ListKey "<time>.<hex id>", continued with "time <= t AND (time < t OR
// id > i)". TNX_TIME_NONE is INT64_MIN, so it sorts last with no special
// case. A row that cannot be decoded stops the list with TNX_ECORRUPT naming
// it, or, with deliver_corrupt (ABI 1.1), is delivered raw and paging goes on.
//
// Limits: a task_json of more than 1e9 bytes is TNX_EINVAL (SQLite's limit);
// an empty task_json is TNX_EINVAL; tombstones are never pruned (one small
// row per deleted id).
#include "toolnexus/plugin.hpp"

#include "../common/wakeup.hpp"
#include "change_log.hpp"
#include "wal_guard.hpp"

#include <sqlite3.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstddef>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

namespace {

using toolnexus::sdk::Error;
using toolnexus::sdk::DueKey;
using toolnexus::sdk::ListKey;
using toolnexus::sdk::RecordOut;
using toolnexus::sdk::view;
using toolnexus_sqlite::ChangeLogWatcher;
using toolnexus_sqlite::WalCheck;
using toolnexus_sqlite::WalGuard;

/// Current schema version (PRAGMA user_version).
constexpr int64_t kSchemaVersion = 3;
/// PRAGMA application_id of a toolnexus database ("TNXS").
constexpr int64_t kApplicationId = 0x544E5853;
/// Oldest SQLite with everything used here (SQLITE_DBCONFIG_TRUSTED_SCHEMA: 3.31.0).
constexpr int kMinSqlite = 3031000;
using toolnexus::sdk::quote;

/// Thread-safe strerror().
std::string errno_text(int e) { return std::error_code(e, std::generic_category()).message(); }

// ===========================================================================
// Options
// ===========================================================================

/// PRAGMA synchronous values offered by the synchronous= option.
enum class Sync { Off, Normal, Full, Extra };
/// PRAGMA journal_mode values offered by the journal= option.
enum class Journal { Wal, Delete, Truncate, Persist };

/// A parsed location: absolute path plus every option (defaults applied).
struct Options {
  std::string path;
  Sync sync = Sync::Full;
  int busy_timeout_ms = 5000;
  Journal journal = Journal::Wal;
  size_t pool_size = 64;
  size_t max_batch = 64;
  /// mode=ro, or the host's TNX_OPEN_READ_ONLY.
  bool read_only = false;
  /// True when read_only came from TNX_OPEN_READ_ONLY and not mode=ro. The
  /// connections are then opened read-write without create, but
  /// query_only: SQLite can then remove the -wal and -shm files it makes
  /// when the last connection closes, so an inspection leaves the directory
  /// as it found it. (A SQLITE_OPEN_READONLY connection cannot, and would
  /// leave them behind.) mode=ro keeps SQLITE_OPEN_READONLY, for read-only
  /// media.
  bool host_read_only = false;
  /// Read-only opens only: a -wal file was beside the database when the
  /// store opened (a crashed writer's, or a running one's). Every
  /// connection then sets SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE: the last one to
  /// close would otherwise checkpoint the -wal into the database and delete
  /// it, changing both files for a command that only reads. Without a -wal
  /// at open the close may checkpoint: it removes the empty -wal (and -shm)
  /// the open made, and folds only what a writer saved during the read.
  bool keep_wal = false;
  /// missing_wal=accept: open a WAL database that lacks its -wal's saves.
  bool accept_missing_wal = false;
  /// feed_poll_ms: the change feed's interval for other processes' commits.
  int feed_poll_ms = 20;
};

const char *sync_name(Sync s) {
  switch (s) {
    case Sync::Off: return "OFF";
    case Sync::Normal: return "NORMAL";
    case Sync::Full: return "FULL";
    case Sync::Extra: return "EXTRA";
  }
  return "FULL";
}

const char *journal_name(Journal j) {
  switch (j) {
    case Journal::Wal: return "wal";
    case Journal::Delete: return "delete";
    case Journal::Truncate: return "truncate";
    case Journal::Persist: return "persist";
  }
  return "wal";
}

/// ASCII lower-case copy (option values are case-insensitive).
std::string lower(std::string_view s) {
  std::string out(s);
  for (char &c : out)
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  return out;
}

[[noreturn]] void bad_value(std::string_view name, std::string_view value, const char *expected) {
  throw Error(TNX_EINVAL, "sqlite: option " + std::string(name) + ": bad value " + quote(value) +
                              " (expected " + expected + ")");
}

/// Parses a decimal integer in [lo, hi] (digits only) or throws TNX_EINVAL.
int64_t parse_int(std::string_view name, std::string_view value, int64_t lo, int64_t hi,
                  const char *expected) {
  if (value.empty() || value.size() > 12) bad_value(name, value, expected);
  int64_t v = 0;
  for (char c : value) {
    if (c < '0' || c > '9') bad_value(name, value, expected);
    v = v * 10 + (c - '0');
  }
  if (v < lo || v > hi) bad_value(name, value, expected);
  return v;
}

/// The working directory, or throws TNX_EIO.
std::string working_directory() {
  std::vector<char> buf(256);
  for (;;) {
    if (::getcwd(buf.data(), buf.size()) != nullptr) return std::string(buf.data());
    if (errno != ERANGE)
      throw Error(TNX_EIO, "sqlite: cannot resolve relative database path: working directory: " +
                               errno_text(errno));
    buf.resize(buf.size() * 2);
  }
}

/// Parses everything after "sqlite:" (see the top of this file).
Options parse_location(std::string_view location) {
  Options o;
  const size_t q = location.find('?');
  std::string_view path = location.substr(0, q);
  std::string_view rest = q == std::string_view::npos ? std::string_view() : location.substr(q + 1);
  if (path.empty())
    throw Error(TNX_EINVAL,
                "sqlite: empty database path; expected sqlite:<path>[?option=value&...], "
                "e.g. sqlite:/var/lib/tnx/tasks.db");
  if (path.find('\0') != std::string_view::npos)
    throw Error(TNX_EINVAL, "sqlite: database path contains a NUL byte");
  if (path.back() == '/')
    throw Error(TNX_EINVAL, "sqlite: database path " + quote(path) +
                                " names a directory; expected a file path such as " +
                                std::string(path) + "tasks.db");

  unsigned seen = 0;
  static const char *const kNames[] = {"synchronous", "busy_timeout_ms", "journal",
                                       "pool_size",   "max_batch",       "mode",
                                       "missing_wal", "feed_poll_ms"};
  // "path?" alone has no options; otherwise every '&'-separated item must be
  // name=value (so "a=1&" and "&a=1" are errors, not silently accepted).
  bool more = q != std::string_view::npos && !rest.empty();
  while (more) {
    const size_t amp = rest.find('&');
    std::string_view item = rest.substr(0, amp);
    more = amp != std::string_view::npos;
    rest = more ? rest.substr(amp + 1) : std::string_view();
    if (item.empty())
      throw Error(TNX_EINVAL, "sqlite: empty option (stray '&'); expected option=value");
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos)
      throw Error(TNX_EINVAL, "sqlite: option " + quote(item) + " has no value (expected " +
                                  std::string(item.substr(0, 128)) + "=<value>)");
    std::string_view name = item.substr(0, eq), value = item.substr(eq + 1);
    unsigned index = 0;
    while (index < 8 && name != kNames[index]) ++index;
    if (index == 8)
      throw Error(TNX_EINVAL, "sqlite: unknown option " + quote(name) +
                                  " (known: synchronous, busy_timeout_ms, journal, pool_size, "
                                  "max_batch, mode, missing_wal, feed_poll_ms)");
    if (seen & (1u << index))
      throw Error(TNX_EINVAL, "sqlite: option " + std::string(name) + " given twice");
    seen |= 1u << index;
    const std::string v = lower(value);
    switch (index) {
      case 0:
        if (v == "full") o.sync = Sync::Full;
        else if (v == "extra") o.sync = Sync::Extra;
        else if (v == "normal") o.sync = Sync::Normal;
        else if (v == "off") o.sync = Sync::Off;
        else bad_value(name, value, "full, extra, normal or off");
        break;
      case 1:
        o.busy_timeout_ms = static_cast<int>(
            parse_int(name, value, 0, 3600000, "milliseconds, 0..3600000"));
        break;
      case 2:
        if (v == "wal") o.journal = Journal::Wal;
        else if (v == "delete") o.journal = Journal::Delete;
        else if (v == "truncate") o.journal = Journal::Truncate;
        else if (v == "persist") o.journal = Journal::Persist;
        else bad_value(name, value, "wal, delete, truncate or persist");
        break;
      case 3:
        o.pool_size = static_cast<size_t>(parse_int(name, value, 1, 64, "an integer 1..64"));
        break;
      case 4:
        o.max_batch = static_cast<size_t>(parse_int(name, value, 1, 1000, "an integer 1..1000"));
        break;
      case 5:
        if (v == "rw") o.read_only = false;
        else if (v == "ro") o.read_only = true;
        else bad_value(name, value, "rw or ro");
        break;
      case 7:
        o.feed_poll_ms = static_cast<int>(parse_int(name, value, 1, 60000, "milliseconds, 1..60000"));
        break;
      default:
        if (v == "refuse") o.accept_missing_wal = false;
        else if (v == "accept") o.accept_missing_wal = true;
        else bad_value(name, value, "refuse or accept");
        break;
    }
  }

  if (path.front() == '/') {
    o.path.assign(path);
  } else {
    while (path.size() > 2 && path.substr(0, 2) == "./") path.remove_prefix(2);
    o.path = working_directory();
    if (o.path.back() != '/') o.path.push_back('/');
    o.path.append(path);
  }
  return o;
}

/// fsync()s directory `dir` so that an entry just created in it survives a
/// power loss. Best effort: a file system that cannot sync directories is
/// not an error.
void sync_directory(const std::string &dir) {
  int fd = ::open(dir.empty() ? "/" : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  (void)::fsync(fd);
  ::close(fd);
}

/// Creates the missing parent directories of `file` (mkdir -p), syncing the
/// parent of each one created. Throws TNX_EIO naming the directory.
void make_parent_directories(const std::string &file) {
  const size_t last = file.rfind('/');
  if (last == 0 || last == std::string::npos) return;
  const std::string dir = file.substr(0, last);
  struct stat st {};
  if (::stat(dir.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode))
      throw Error(TNX_EIO, "sqlite: cannot create database '" + file + "': '" + dir +
                               "' is not a directory");
    return;
  }
  for (size_t pos = 1; pos <= dir.size();) {
    size_t next = dir.find('/', pos);
    if (next == std::string::npos) next = dir.size();
    const std::string prefix = dir.substr(0, next);
    if (::mkdir(prefix.c_str(), 0777) == 0) {
      sync_directory(prefix.substr(0, prefix.rfind('/')));
    } else if (errno != EEXIST) {
      throw Error(TNX_EIO, "sqlite: cannot create directory '" + prefix + "' for database '" +
                               file + "': " + errno_text(errno));
    }
    pos = next + 1;
  }
}

// ===========================================================================
// SQL
// ===========================================================================

/// The current (schema 2) Task table, created under the name given.
std::string tasks_table_sql(const char *name) {
  return std::string("CREATE TABLE ") + name +
         " (\n"
         "  id             TEXT PRIMARY KEY NOT NULL,\n"
         "  context_id     TEXT NOT NULL DEFAULT '',\n"
         "  state          TEXT NOT NULL DEFAULT '',\n"
         "  status_time_us INTEGER NOT NULL,\n"
         "  owner          TEXT NOT NULL DEFAULT '',\n"
         "  tenant         TEXT NOT NULL DEFAULT '',\n"
         "  version        INTEGER NOT NULL CHECK (version >= 1),\n"
         "  task_json      TEXT NOT NULL);\n";
}

/// Everything of schema 2 besides the table: list indexes, tombstones, and
/// the trigger that fills them.
constexpr const char *kSchemaExtrasSql =
    "CREATE INDEX tnx_tasks_by_time ON tnx_tasks (status_time_us DESC, id);\n"
    "CREATE INDEX tnx_tasks_by_context ON tnx_tasks (context_id, status_time_us DESC, id);\n"
    "CREATE INDEX tnx_tasks_by_state ON tnx_tasks (state, status_time_us DESC, id);\n"
    "CREATE INDEX tnx_tasks_by_owner ON tnx_tasks (owner, status_time_us DESC, id);\n"
    "CREATE INDEX tnx_tasks_by_tenant ON tnx_tasks (tenant, status_time_us DESC, id);\n"
    "CREATE TABLE tnx_tombstones (id TEXT PRIMARY KEY NOT NULL, version INTEGER NOT NULL)"
    " WITHOUT ROWID;\n"
    "CREATE TRIGGER tnx_tasks_tombstone AFTER DELETE ON tnx_tasks BEGIN\n"
    "  INSERT OR REPLACE INTO tnx_tombstones (id, version) VALUES (OLD.id, OLD.version);\n"
    "END;\n";

/// Schema 3's counters of Tasks by (owner, tenant, state) and the triggers
/// that keep them (see the schema comment at the top).
constexpr const char *kCountsSql =
    "CREATE TABLE tnx_counts (owner TEXT NOT NULL, tenant TEXT NOT NULL, state TEXT NOT NULL,"
    " n INTEGER NOT NULL, PRIMARY KEY (owner, tenant, state)) WITHOUT ROWID;\n"
    "CREATE TRIGGER tnx_tasks_count_insert AFTER INSERT ON tnx_tasks BEGIN\n"
    "  INSERT INTO tnx_counts (owner, tenant, state, n) VALUES (NEW.owner, NEW.tenant, NEW.state, 1)"
    " ON CONFLICT (owner, tenant, state) DO UPDATE SET n = n + 1;\n"
    "END;\n"
    "CREATE TRIGGER tnx_tasks_count_update AFTER UPDATE OF owner, tenant, state ON tnx_tasks"
    " WHEN OLD.owner IS NOT NEW.owner OR OLD.tenant IS NOT NEW.tenant OR OLD.state IS NOT NEW.state"
    " BEGIN\n"
    "  UPDATE tnx_counts SET n = n - 1 WHERE owner = OLD.owner AND tenant = OLD.tenant"
    " AND state = OLD.state;\n"
    "  INSERT INTO tnx_counts (owner, tenant, state, n) VALUES (NEW.owner, NEW.tenant, NEW.state, 1)"
    " ON CONFLICT (owner, tenant, state) DO UPDATE SET n = n + 1;\n"
    "END;\n"
    "CREATE TRIGGER tnx_tasks_count_delete AFTER DELETE ON tnx_tasks BEGIN\n"
    "  UPDATE tnx_counts SET n = n - 1 WHERE owner = OLD.owner AND tenant = OLD.tenant"
    " AND state = OLD.state;\n"
    "END;\n";

/// Schema 2 -> 3: the counters, filled from the Tasks stored now.
constexpr const char *kMigrate2To3Sql =
    "INSERT INTO tnx_counts (owner, tenant, state, n)"
    " SELECT owner, tenant, state, count(*) FROM tnx_tasks GROUP BY owner, tenant, state;\n";

/// Schema 1 -> 2: copy into the new layout (tenant '', version 1), replace.
constexpr const char *kMigrate1To2Sql =
    "INSERT INTO tnx_tasks_v2 (id, context_id, state, status_time_us, owner, tenant, version,"
    " task_json)\n"
    "  SELECT id, context_id, state, status_time_us, owner, '', 1, task_json FROM tnx_tasks;\n"
    "DROP TABLE tnx_tasks;\n"
    "ALTER TABLE tnx_tasks_v2 RENAME TO tnx_tasks;\n";

/// The due column (ABI 1.5; see the schema comment): added to a database
/// that lacks it by a read-write open, in the transaction of kDueIndexSql.
constexpr const char *kDueColumnSql = "ALTER TABLE tnx_tasks ADD COLUMN due_us INTEGER";

/// The due index in the due list's order, replacing the (due_us) index of
/// development builds of 1.5; run by a read-write open that finds the
/// database not as kDueReadySql wants it, in one transaction.
constexpr const char *kDueIndexSql =
    "CREATE INDEX IF NOT EXISTS tnx_tasks_by_due_id ON tnx_tasks (due_us, id) WHERE due_us IS NOT NULL;\n"
    "DROP INDEX IF EXISTS tnx_tasks_by_due;\n";

/// 1 when the database has the due column, else 0.
constexpr const char *kDueColumnProbeSql =
    "SELECT count(*) FROM pragma_table_info('tnx_tasks') WHERE name = 'due_us'";

/// 2 when the database has the due column and its index (it keeps due
/// times, keeps_due()), else less.
constexpr const char *kDueProbeSql =
    "SELECT (SELECT count(*) FROM pragma_table_info('tnx_tasks') WHERE name = 'due_us')"
    " + (SELECT count(*) FROM sqlite_master WHERE type = 'index' AND name = 'tnx_tasks_by_due_id')";

/// 2 when the database is as a read-write open leaves it: kDueProbeSql's
/// 2 and no index of an earlier build (tnx_tasks_by_due) left to drop.
constexpr const char *kDueReadySql =
    "SELECT (SELECT count(*) FROM pragma_table_info('tnx_tasks') WHERE name = 'due_us')"
    " + (SELECT count(*) FROM sqlite_master WHERE type = 'index' AND name = 'tnx_tasks_by_due_id')"
    " - (SELECT count(*) FROM sqlite_master WHERE type = 'index' AND name = 'tnx_tasks_by_due')";

/// Columns every read delivers, in tnx_task_record order.
#define TNX_SQLITE_COLUMNS "id, context_id, state, status_time_us, owner, tenant, version"

/// The due column of a read (column 9: after task_json and rowid), or NULL
/// for a database without it (opened read-only).
const char *due_column(bool due) { return due ? "due_us" : "NULL"; }

/// The get statement: columns as list_sql's (rowid unused).
std::string get_sql(bool due) {
  return std::string("SELECT " TNX_SQLITE_COLUMNS ", task_json, rowid, ") + due_column(due) +
         " FROM tnx_tasks WHERE id = ?1";
}

// The write path deliberately avoids RETURNING: SQLite runs it through an
// ephemeral table, which cost ~30% more CPU per save than the statement
// itself. Inside BEGIN IMMEDIATE (the database's write lock, across
// processes) reading the version and then writing is just as atomic.

/// The stored version of an id and the last version of a deleted one
/// (tombstone); NULL when there is none.
constexpr const char *kLookupSql =
    "SELECT (SELECT version FROM tnx_tasks WHERE id = ?1),"
    " (SELECT version FROM tnx_tombstones WHERE id = ?1)";

/// A new id, with the version the caller computed (?8) and the due time
/// (?9, NULL for none).
constexpr const char *kInsertSql =
    "INSERT INTO tnx_tasks (id, context_id, state, status_time_us, owner, tenant, version,"
    " task_json, due_us) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?8, ?7, ?9)";

/// A stored id, with the version the caller computed (?8) and the due time
/// (?9, NULL for none).
constexpr const char *kUpdateSql =
    "UPDATE tnx_tasks SET context_id = ?2, state = ?3, status_time_us = ?4, owner = ?5,"
    " tenant = ?6, version = ?8, task_json = ?7, due_us = ?9 WHERE id = ?1";

/// Removes an id; trigger tnx_tasks_tombstone records its last version.
constexpr const char *kDeleteSql = "DELETE FROM tnx_tasks WHERE id = ?1";

/// The list statement for one combination of filters (TNX_FILTER_* bits),
/// cursor presence and omit_json. Columns as get_sql(): TNX_SQLITE_COLUMNS,
/// task_json, rowid (to name a row whose id is unreadable), due_us (`due`:
/// the database has it). Parameters: ?1 context_id, ?2 state, ?3 owner,
/// ?4 tenant, ?5 after, ?6 before, ?7/?8 cursor time/id (a due list's:
/// cursor due time/id), ?9 limit, ?10 due before.
/// A due list (ABI 1.5) is in (due_us, id) order, continued with "due >= d
/// AND (due > d OR id > i)": a range of tnx_tasks_by_due_id read in order.
/// Its rows have an integer due_us (typeof): a value edited by hand into
/// another type is no due time (due_of_row), so it is never listed as due
/// (nor could a cursor hold its place).
/// The keyset condition "time < t OR (time = t AND id > i)" is written as
/// "time <= t AND (time < t OR id > i)" so that it is an index range.
/// The index a list or count with these filters walks: the first of
/// contextId, state, owner, tenant (in that order: a context holds few
/// Tasks; the A2A server always filters owner and tenant, which often hold
/// all of them), else the time index. Named with INDEXED BY, because
/// without statistics SQLite may pick the owner index for a contextId
/// query and read every row of the owner. A due list (ABI 1.5) always walks
/// the due index: what is due is few, whatever else is asked.
const char *list_index(uint32_t flags) {
  if (flags & TNX_FILTER_DUE_BEFORE) return "tnx_tasks_by_due_id";
  if (flags & TNX_FILTER_CONTEXT_ID) return "tnx_tasks_by_context";
  if (flags & TNX_FILTER_STATE) return "tnx_tasks_by_state";
  if (flags & TNX_FILTER_OWNER) return "tnx_tasks_by_owner";
  if (flags & TNX_FILTER_TENANT) return "tnx_tasks_by_tenant";
  return "tnx_tasks_by_time";
}

std::string list_sql(uint32_t flags, bool cursor, bool omit_json, bool due) {
  std::string s = "SELECT " TNX_SQLITE_COLUMNS ", ";
  s += omit_json ? "NULL" : "task_json";
  s += ", rowid, ";
  s += due_column(due);
  s += " FROM tnx_tasks INDEXED BY ";
  s += list_index(flags);
  s += " WHERE 1";
  if (flags & TNX_FILTER_CONTEXT_ID) s += " AND context_id = ?1";
  if (flags & TNX_FILTER_STATE) s += " AND state = ?2";
  if (flags & TNX_FILTER_OWNER) s += " AND owner = ?3";
  if (flags & TNX_FILTER_TENANT) s += " AND tenant = ?4";
  if (flags & TNX_FILTER_AFTER) s += " AND status_time_us > ?5";
  if (flags & TNX_FILTER_BEFORE) s += " AND status_time_us < ?6";
  if (flags & TNX_FILTER_DUE_BEFORE) {
    s += " AND due_us IS NOT NULL AND due_us < ?10 AND typeof(due_us) = 'integer'";
    if (cursor) s += " AND due_us >= ?7 AND (due_us > ?7 OR id > ?8)";
    s += " ORDER BY due_us, id LIMIT ?9";
    return s;
  }
  if (cursor) s += " AND status_time_us <= ?7 AND (status_time_us < ?7 OR id > ?8)";
  s += " ORDER BY status_time_us DESC, id LIMIT ?9";
  return s;
}

/// The count statement (ABI 1.3) for one combination of filters, with the
/// list statement's parameter numbers. Only equality filters on owner,
/// tenant and state (what the A2A server asks: owner and tenant always):
/// a sum over the few matching rows of tnx_counts (`counters`). Otherwise
/// (a contextId, a time window or a due time, or a schema 2 file opened
/// read-only) a count(*) over the rows of the most selective index, which
/// costs O(matches).
std::string count_sql(uint32_t flags, bool counters) {
  const bool by_counters =
      counters &&
      (flags & (TNX_FILTER_CONTEXT_ID | TNX_FILTER_AFTER | TNX_FILTER_BEFORE | TNX_FILTER_DUE_BEFORE)) == 0;
  std::string s = by_counters ? "SELECT coalesce(sum(n), 0) FROM tnx_counts WHERE 1"
                              : std::string("SELECT count(*) FROM tnx_tasks INDEXED BY ") + list_index(flags) +
                                    " WHERE 1";
  if (flags & TNX_FILTER_CONTEXT_ID) s += " AND context_id = ?1";
  if (flags & TNX_FILTER_STATE) s += " AND state = ?2";
  if (flags & TNX_FILTER_OWNER) s += " AND owner = ?3";
  if (flags & TNX_FILTER_TENANT) s += " AND tenant = ?4";
  if (flags & TNX_FILTER_AFTER) s += " AND status_time_us > ?5";
  if (flags & TNX_FILTER_BEFORE) s += " AND status_time_us < ?6";
  if (flags & TNX_FILTER_DUE_BEFORE) s += " AND due_us IS NOT NULL AND due_us < ?10 AND typeof(due_us) = 'integer'";
  return s;
}

/// Every TNX_FILTER_* bit this plugin knows (ABI 1.0, and 1.5's due filter).
constexpr uint32_t kKnownFilters = TNX_FILTER_CONTEXT_ID | TNX_FILTER_STATE | TNX_FILTER_OWNER |
                                   TNX_FILTER_TENANT | TNX_FILTER_AFTER | TNX_FILTER_BEFORE |
                                   TNX_FILTER_DUE_BEFORE;

// ===========================================================================
// Connections
// ===========================================================================

/// An sdk::Error that also remembers the SQLite result code behind it.
struct SqlError : Error {
  SqlError(tnx_status c, std::string m, int r) : Error(c, std::move(m)), rc(r) {}
  int rc;
};

/// One SQLite connection with its prepared statements. Used by one thread at
/// a time (the store hands it over under a mutex), so it is opened
/// SQLITE_OPEN_NOMUTEX.
class Conn {
 public:
  enum class Role { Writer, Reader };

  /// Opens `o.path` as writer (read-write, created if missing, unless
  /// o.read_only) or reader (never creates, query_only). `due`: the
  /// database has the due column (its reads select it). Throws Error.
  Conn(const Options &o, Role role, bool due = false) : opt_(o), due_(due) {
    int flags = SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_PRIVATECACHE;
    if (o.read_only && !o.host_read_only) flags |= SQLITE_OPEN_READONLY;
    else if (role == Role::Writer && !o.read_only) flags |= SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE;
    else flags |= SQLITE_OPEN_READWRITE;
    const int rc = sqlite3_open_v2(o.path.c_str(), &db_, flags, nullptr);
    if (rc != SQLITE_OK) {
      const int sys = db_ != nullptr ? sqlite3_system_errno(db_) : 0;
      std::string msg = "sqlite: cannot open database '" + o.path + "'" +
                        (o.read_only ? (o.host_read_only ? " (read-only)" : " (mode=ro)") : "") + ": " +
                        (db_ != nullptr ? sqlite3_errmsg(db_) : sqlite3_errstr(rc));
      if (sys != 0) msg += " (" + errno_text(sys) + ")";
      // SQLite reports a new file that cannot be created as "No such file
      // or directory"; name the directory and the real reason instead.
      struct stat st {};
      const size_t slash = o.path.rfind('/');
      if ((rc & 0xff) == SQLITE_CANTOPEN && !o.read_only && ::stat(o.path.c_str(), &st) != 0 && errno == ENOENT &&
          slash != std::string::npos) {
        const std::string dir = slash == 0 ? std::string("/") : o.path.substr(0, slash);
        if (::access(dir.c_str(), W_OK | X_OK) != 0)
          msg += "; cannot create it in '" + dir + "': " + errno_text(errno);
      }
      sqlite3_close(db_);
      db_ = nullptr;
      throw Error(rc == SQLITE_NOMEM ? TNX_EINTERNAL : TNX_EIO, msg);
    }
    sqlite3_extended_result_codes(db_, 1);
    sqlite3_busy_handler(db_, &Conn::busy_handler, this);
    // Hardening: the file may come from elsewhere; no schema-borne surprises.
    sqlite3_db_config(db_, SQLITE_DBCONFIG_DEFENSIVE, 1, nullptr);
    sqlite3_db_config(db_, SQLITE_DBCONFIG_TRUSTED_SCHEMA, 0, nullptr);
    if (role == Role::Reader || o.read_only) exec("PRAGMA query_only = 1");
    if (o.keep_wal) sqlite3_db_config(db_, SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1, nullptr);
  }

  Conn(const Conn &) = delete;
  Conn &operator=(const Conn &) = delete;
  ~Conn() { (void)close(); }

  /// Finalizes every statement and closes; returns the sqlite3_close code.
  int close() noexcept {
    if (db_ == nullptr) return SQLITE_OK;
    for (sqlite3_stmt *s : owned_) sqlite3_finalize(s);
    owned_.clear();
    list_.fill(nullptr);
    count_.fill(nullptr);
    get_ = nullptr;
    const int rc = sqlite3_close(db_);
    if (rc == SQLITE_OK) db_ = nullptr;
    return rc;
  }

  sqlite3 *db() const noexcept { return db_; }

  /// Why SQLite may want to write even to read something: said with
  /// SQLITE_READONLY errors, which otherwise look absurd for a read.
  std::string read_only_hint() const {
    return "; to read a WAL database SQLite must create '" + opt_.path +
           "-shm' (and -wal) unless they exist, and a crashed writer's hot journal must be rolled "
           "back: both need write access to the file and its directory (or a running process "
           "that has it open)";
  }
  const Options &options() const noexcept { return opt_; }

  /// An Error describing failure `rc` of this connection: the TNX code and a
  /// message naming the database path. `what` says what was being done.
  SqlError error(int rc, std::string_view what) const {
    const std::string &p = opt_.path;
    const std::string detail = db_ != nullptr ? sqlite3_errmsg(db_) : sqlite3_errstr(rc);
    const int sys = db_ != nullptr ? sqlite3_system_errno(db_) : 0;
    const std::string os = sys != 0 ? " (" + errno_text(sys) + ")" : std::string();
    std::string pre = what.empty() ? std::string("sqlite: ") : std::string(what) + ": ";
    switch (rc & 0xff) {
      case SQLITE_BUSY:
      case SQLITE_LOCKED:
        return SqlError(TNX_EIO,
                        pre + "database '" + p +
                            "' is locked: another connection or process held it for more "
                            "than busy_timeout_ms=" +
                            std::to_string(opt_.busy_timeout_ms),
                        rc);
      case SQLITE_FULL:
        return SqlError(TNX_EIO,
                        pre + "database '" + p +
                            "': disk full or file size limit reached; nothing was written" + os,
                        rc);
      case SQLITE_IOERR:
        if (sys == ENOSPC || sys == EFBIG || sys == EDQUOT)
          return SqlError(TNX_EIO,
                          pre + "database '" + p +
                              "': disk full or file size limit reached; nothing was written" +
                              os,
                          rc);
        if (sys == ENOENT)
          return SqlError(TNX_EIO,
                          pre + "I/O error on database '" + p + "': " + detail + os +
                              "; a file SQLite needs beside it is gone: was '" + p + "-wal' or '" + p +
                              "-shm' removed while a process had the database open?",
                          rc);
        return SqlError(TNX_EIO, pre + "I/O error on database '" + p + "': " + detail + os, rc);
      case SQLITE_READONLY:
        return SqlError(TNX_EIO,
                        pre + "database '" + p + "' is read-only" +
                            (opt_.read_only ? (opt_.host_read_only ? " (opened read-only)" : " (opened with mode=ro)")
                                            : "") +
                            ": " + detail + read_only_hint(),
                        rc);
      case SQLITE_CANTOPEN:
        return SqlError(TNX_EIO, pre + "cannot open database '" + p + "': " + detail + os, rc);
      case SQLITE_PERM:
      case SQLITE_AUTH:
        return SqlError(TNX_EIO, pre + "access to database '" + p + "' denied: " + detail, rc);
      case SQLITE_PROTOCOL:
        return SqlError(TNX_EIO, pre + "locking protocol error on database '" + p + "'", rc);
      case SQLITE_NOTADB:
        return SqlError(TNX_ECORRUPT, pre + "'" + p + "' is not an SQLite database", rc);
      case SQLITE_CORRUPT:
        return SqlError(TNX_ECORRUPT,
                        pre + "database '" + p + "' is corrupt: " + detail, rc);
      case SQLITE_TOOBIG:
        return SqlError(TNX_EINVAL,
                        pre + "record too big for SQLite (at most " +
                            std::to_string(sqlite3_limit(db_, SQLITE_LIMIT_LENGTH, -1)) +
                            " bytes per field)",
                        rc);
      case SQLITE_NOMEM:
        return SqlError(TNX_EINTERNAL, pre + "out of memory in SQLite", rc);
      default:
        return SqlError(TNX_EINTERNAL,
                        pre + "SQLite error on database '" + p + "': " + detail + " (code " +
                            std::to_string(rc) + ")",
                        rc);
    }
  }

  /// Runs SQL text (DDL, PRAGMA) without results; throws error() on failure.
  void exec(const char *sql, std::string_view what = {}) {
    const int rc = sqlite3_exec(db_, sql, nullptr, nullptr, nullptr);
    if (rc != SQLITE_OK) throw error(rc, what);
  }

  /// Runs a one-value query (e.g. "PRAGMA user_version") and returns the
  /// first column of its first row as text ("" without rows).
  std::string query_text(const char *sql, std::string_view what = {}) {
    sqlite3_stmt *s = nullptr;
    int rc = sqlite3_prepare_v2(db_, sql, -1, &s, nullptr);
    if (rc != SQLITE_OK) throw error(rc, what);
    std::string out;
    rc = sqlite3_step(s);
    if (rc == SQLITE_ROW) {
      const unsigned char *t = sqlite3_column_text(s, 0);
      if (t != nullptr) out.assign(reinterpret_cast<const char *>(t),
                                   static_cast<size_t>(sqlite3_column_bytes(s, 0)));
      rc = sqlite3_step(s);
    }
    if (rc != SQLITE_DONE) {
      SqlError e = error(rc, what);
      sqlite3_finalize(s);
      throw e;
    }
    sqlite3_finalize(s);
    return out;
  }

  /// query_text() as an integer.
  int64_t query_int(const char *sql, std::string_view what = {}) {
    return std::strtoll(query_text(sql, what).c_str(), nullptr, 10);
  }

  /// Prepares a statement kept until close() (SQLITE_PREPARE_PERSISTENT).
  /// A prepare failure at this point means the schema is not what this
  /// plugin made: TNX_ECORRUPT naming the file.
  sqlite3_stmt *prepare(const char *sql, size_t len = static_cast<size_t>(-1)) {
    sqlite3_stmt *s = nullptr;
    const int n = len == static_cast<size_t>(-1) ? -1 : static_cast<int>(len);
    const int rc = sqlite3_prepare_v3(db_, sql, n, SQLITE_PREPARE_PERSISTENT, &s, nullptr);
    if (rc != SQLITE_OK) {
      SqlError e = error(rc, {});
      if ((rc & 0xff) == SQLITE_ERROR)
        throw SqlError(TNX_ECORRUPT,
                       "sqlite: database '" + opt_.path +
                           "' does not have the expected toolnexus schema: " +
                           sqlite3_errmsg(db_),
                       rc);
      throw e;
    }
    owned_.push_back(s);
    return s;
  }

  /// The cached get statement.
  sqlite3_stmt *get_stmt() {
    if (get_ == nullptr) get_ = prepare(get_sql(due_).c_str());
    return get_;
  }

  /// The cached count statement for these filters (see count_sql()).
  sqlite3_stmt *count_stmt(uint32_t flags, bool counters) {
    const size_t key = flags & kKnownFilters;
    if (count_[key] == nullptr) {
      const std::string sql = count_sql(flags, counters);
      count_[key] = prepare(sql.c_str(), sql.size());
    }
    return count_[key];
  }

  /// The cached list statement for this filter/cursor/omit combination.
  sqlite3_stmt *list_stmt(uint32_t flags, bool cursor, bool omit_json) {
    const size_t key = (flags & kKnownFilters) | (cursor ? 128u : 0u) | (omit_json ? 256u : 0u);
    if (list_[key] == nullptr) {
      const std::string sql = list_sql(flags, cursor, omit_json, due_);
      list_[key] = prepare(sql.c_str(), sql.size());
    }
    return list_[key];
  }

 private:
  /// Busy handler: polls with sleeps growing from 50 us to 2 ms (short, so a
  /// lock freed between two commits of another process is noticed quickly)
  /// until busy_timeout_ms have passed since the first attempt.
  static int busy_handler(void *arg, int count) noexcept {
    auto *c = static_cast<Conn *>(arg);
    const auto now = std::chrono::steady_clock::now();
    if (count == 0) c->busy_start_ = now;
    const auto limit = std::chrono::milliseconds(c->opt_.busy_timeout_ms);
    const auto waited = now - c->busy_start_;
    if (waited >= limit) return 0;
    const int shift = count < 6 ? count : 6;
    auto nap = std::chrono::microseconds(50 << shift);
    if (nap > std::chrono::microseconds(2000)) nap = std::chrono::microseconds(2000);
    const auto left = std::chrono::duration_cast<std::chrono::microseconds>(limit - waited);
    std::this_thread::sleep_for(nap < left ? nap : left);
    return 1;
  }

  const Options &opt_;
  const bool due_;
  sqlite3 *db_ = nullptr;
  std::chrono::steady_clock::time_point busy_start_{};
  std::vector<sqlite3_stmt *> owned_;
  sqlite3_stmt *get_ = nullptr;
  std::array<sqlite3_stmt *, 512> list_{};
  std::array<sqlite3_stmt *, 128> count_{};
};

/// Scoped use of a prepared statement: binds, steps, and on scope exit always
/// resets it and clears its bindings (so no borrowed pointer outlives a call).
class Stmt {
 public:
  Stmt(Conn &c, sqlite3_stmt *s) noexcept : c_(c), s_(s) {}
  Stmt(const Stmt &) = delete;
  Stmt &operator=(const Stmt &) = delete;
  ~Stmt() {
    sqlite3_reset(s_);
    sqlite3_clear_bindings(s_);
  }

  /// Binds borrowed bytes as TEXT (an empty string stays '' rather than NULL).
  void text(int i, std::string_view v) {
    const char *data = v.empty() ? "" : v.data();
    check(sqlite3_bind_text64(s_, i, data, v.size(), SQLITE_STATIC, SQLITE_UTF8));
  }
  void text(int i, tnx_str v) { text(i, view(v)); }
  void i64(int i, int64_t v) { check(sqlite3_bind_int64(s_, i, v)); }
  int step() noexcept { return sqlite3_step(s_); }
  sqlite3_stmt *get() const noexcept { return s_; }

 private:
  void check(int rc) {
    if (rc != SQLITE_OK) throw c_.error(rc, {});
  }
  Conn &c_;
  sqlite3_stmt *s_;
};

/// Reads a TEXT column, or throws TNX_ECORRUPT naming the task and column.
tnx_str text_column(const Conn &c, sqlite3_stmt *s, int i, const char *col, std::string_view id) {
  const int type = sqlite3_column_type(s, i);
  if (type != SQLITE_TEXT) {
    static const char *const kTypes[] = {"?", "an integer", "a real", "text", "a blob", "NULL"};
    throw Error(TNX_ECORRUPT, "sqlite: corrupt row in '" + c.options().path + "' for task " +
                                  quote(id) + ": column " + col + " holds " +
                                  kTypes[type >= 1 && type <= 5 ? type : 0] + ", expected text");
  }
  const unsigned char *t = sqlite3_column_text(s, i);
  const int n = sqlite3_column_bytes(s, i);
  if (t == nullptr) throw std::bad_alloc();
  return tnx_str{reinterpret_cast<const char *>(t), static_cast<uint64_t>(n)};
}

/// The due time (column 9) of the current row of a get/list statement:
/// TNX_TIME_NONE for NULL (and for anything but an integer).
int64_t due_of_row(sqlite3_stmt *s) {
  return sqlite3_column_type(s, 9) == SQLITE_INTEGER ? sqlite3_column_int64(s, 9) : TNX_TIME_NONE;
}

/// Decodes the current row of a get/list statement (columns as in get_sql())
/// into a record borrowing the statement's memory. Throws TNX_ECORRUPT for a
/// row this plugin could not have written.
tnx_task_record decode_row(const Conn &c, sqlite3_stmt *s, bool omit_json) {
  tnx_task_record r{};
  r.header = tnx_header(sizeof r);
  r.id = text_column(c, s, 0, "id", "?");
  const std::string_view id = view(r.id);
  r.context_id = text_column(c, s, 1, "context_id", id);
  r.state = text_column(c, s, 2, "state", id);
  auto corrupt = [&](const char *what) {
    return Error(TNX_ECORRUPT, "sqlite: corrupt row in '" + c.options().path + "' for task " +
                                   quote(id) + ": " + what);
  };
  if (sqlite3_column_type(s, 3) != SQLITE_INTEGER)
    throw corrupt("column status_time_us is not an integer");
  r.status_time_us = sqlite3_column_int64(s, 3);
  r.owner = text_column(c, s, 4, "owner", id);
  r.tenant = text_column(c, s, 5, "tenant", id);
  if (sqlite3_column_type(s, 6) != SQLITE_INTEGER || sqlite3_column_int64(s, 6) < 1)
    throw corrupt("column version is not a positive integer");
  r.version = static_cast<uint64_t>(sqlite3_column_int64(s, 6));
  if (!omit_json) r.task_json = text_column(c, s, 7, "task_json", id);
  // A due time that is not an integer (edited by hand) is read as none: it
  // is the host's scheduling hint, not the Task, and the host's full sweeps
  // find a Task that lost it; the next save writes a sound one.
  r.due_us = due_of_row(s);
  return r;
}

/// Lower-case hex of `s`.
std::string hex(std::string_view s) {
  static const char *digits = "0123456789abcdef";
  std::string out;
  out.reserve(s.size() * 2);
  for (unsigned char c : s) {
    out.push_back(digits[c >> 4]);
    out.push_back(digits[c & 15]);
  }
  return out;
}

/// A list position: the (status_time_us, id) of the last record of a page,
/// with the SQLite types they are stored with. Always integer and text for a
/// row this plugin wrote, encoded as sdk::ListKey "<time>.<hex id>". A
/// tampered row delivered by deliver_corrupt may hold other types; the
/// cursor then keeps them ("~<t><hex>.<t><hex>", t in i/r/t/b), so binding
/// them back gives exactly SQLite's order and paging past the row stays
/// exact.
struct Position {
  char time_type = 'i', id_type = 't';  // i integer, r real, t text, b blob
  int64_t time_i = TNX_TIME_NONE;
  std::string time_bytes, id;  // time_bytes: r as "%.17g", t/b raw bytes

  /// The position of the current row of a list statement (columns 3, 0).
  static Position of_row(sqlite3_stmt *s) {
    Position p;
    auto type_of = [&](int col) {
      switch (sqlite3_column_type(s, col)) {
        case SQLITE_INTEGER: return 'i';
        case SQLITE_FLOAT: return 'r';
        case SQLITE_TEXT: return 't';
        default: return 'b';  // BLOB (NULL cannot be: both columns are NOT NULL)
      }
    };
    auto bytes = [&](int col) {
      const void *b = sqlite3_column_blob(s, col);
      const int n = sqlite3_column_bytes(s, col);
      return b == nullptr ? std::string() : std::string(static_cast<const char *>(b), size_t(n));
    };
    p.time_type = type_of(3);
    p.id_type = type_of(0);
    if (p.time_type == 'i') {
      p.time_i = sqlite3_column_int64(s, 3);
    } else if (p.time_type == 'r') {
      char buf[40];
      std::snprintf(buf, sizeof buf, "%.17g", sqlite3_column_double(s, 3));
      p.time_bytes = buf;
    } else {
      p.time_bytes = bytes(3);
    }
    p.id = bytes(0);
    return p;
  }

  std::string encode() const {
    if (time_type == 'i' && id_type == 't') return ListKey{time_i, id}.encode();
    const std::string t = time_type == 'i' ? std::to_string(time_i) : time_bytes;
    return std::string("~") + time_type + hex(t) + "." + id_type + hex(id);
  }

  /// Parses encode()'s output; throws TNX_EINVAL on anything else.
  static Position decode(std::string_view c) {
    Position p;
    if (c.empty() || c.front() != '~') {
      ListKey k = ListKey::decode(c);
      p.time_i = k.time_us;
      p.id = std::move(k.id);
      return p;
    }
    auto bad = [&] {
      return Error(TNX_EINVAL, "sqlite: list: malformed cursor " + quote(c.substr(0, 64)));
    };
    auto unhex = [&](std::string_view h) {
      if (h.size() % 2 != 0) throw bad();
      std::string out;
      for (size_t i = 0; i < h.size(); i += 2) {
        int v = 0;
        for (char ch : h.substr(i, 2)) {
          v <<= 4;
          if (ch >= '0' && ch <= '9') v |= ch - '0';
          else if (ch >= 'a' && ch <= 'f') v |= ch - 'a' + 10;
          else throw bad();
        }
        out.push_back(static_cast<char>(v));
      }
      return out;
    };
    const size_t dot = c.find('.');
    if (dot == std::string_view::npos || dot < 2 || dot + 1 >= c.size()) throw bad();
    p.time_type = c[1];
    p.id_type = c[dot + 1];
    const std::string_view types = "irtb";
    if (types.find(p.time_type) == std::string_view::npos ||
        types.find(p.id_type) == std::string_view::npos)
      throw bad();
    const std::string t = unhex(c.substr(2, dot - 2));
    p.id = unhex(c.substr(dot + 2));
    char *end = nullptr;
    errno = 0;
    if (p.time_type == 'i') {
      const long long v = std::strtoll(t.c_str(), &end, 10);
      if (t.empty() || errno != 0 || *end != '\0') throw bad();
      p.time_i = static_cast<int64_t>(v);
    } else if (p.time_type == 'r') {
      (void)std::strtod(t.c_str(), &end);
      if (t.empty() || *end != '\0') throw bad();
      p.time_bytes = t;
    } else {
      p.time_bytes = t;
    }
    return p;
  }

  /// Binds the position as ?7 (time) and ?8 (id) with their stored types;
  /// returns the first failing SQLite code or SQLITE_OK.
  int bind(sqlite3_stmt *s) const {
    int rc = SQLITE_OK;
    switch (time_type) {
      case 'i': rc = sqlite3_bind_int64(s, 7, time_i); break;
      case 'r': rc = sqlite3_bind_double(s, 7, std::strtod(time_bytes.c_str(), nullptr)); break;
      case 't':
        rc = sqlite3_bind_text64(s, 7, time_bytes.data(), time_bytes.size(), SQLITE_STATIC,
                                 SQLITE_UTF8);
        break;
      default:
        rc = sqlite3_bind_blob64(s, 7, time_bytes.data(), time_bytes.size(), SQLITE_STATIC);
        break;
    }
    if (rc != SQLITE_OK) return rc;
    const char *data = id.empty() ? "" : id.data();
    switch (id_type) {
      case 't': return sqlite3_bind_text64(s, 8, data, id.size(), SQLITE_STATIC, SQLITE_UTF8);
      case 'b': return sqlite3_bind_blob64(s, 8, data, id.size(), SQLITE_STATIC);
      case 'i': return sqlite3_bind_int64(s, 8, std::strtoll(id.c_str(), nullptr, 10));
      default: return sqlite3_bind_double(s, 8, std::strtod(id.c_str(), nullptr));
    }
  }
};

/// The record list delivers for an undecodable row under deliver_corrupt
/// (task_store.h): its id (or "rowid <n>" when the id itself is not text),
/// everything else empty, time TNX_TIME_NONE, version 0, task_json the raw
/// stored bytes, and its due time (the filter already passed it). Borrows
/// from the statement and from `name`.
tnx_task_record corrupt_record(sqlite3_stmt *s, bool omit_json, std::string &name) {
  tnx_task_record r{};
  r.header = tnx_header(sizeof r);
  if (sqlite3_column_type(s, 0) == SQLITE_TEXT) {
    const unsigned char *t = sqlite3_column_text(s, 0);
    name.assign(t != nullptr ? reinterpret_cast<const char *>(t) : "",
                size_t(sqlite3_column_bytes(s, 0)));
  } else {
    name = "rowid " + std::to_string(sqlite3_column_int64(s, 8));
  }
  r.id = toolnexus::sdk::str(name);
  r.status_time_us = TNX_TIME_NONE;
  r.due_us = due_of_row(s);
  if (!omit_json) {
    const void *b = sqlite3_column_blob(s, 7);
    const int n = sqlite3_column_bytes(s, 7);
    if (b != nullptr) r.task_json = tnx_str{static_cast<const char *>(b), uint64_t(n)};
  }
  return r;
}

// ===========================================================================
// The store
// ===========================================================================

/// One save or delete waiting for (or inside) a group commit. Lives on the
/// stack of the calling thread, which blocks until it is woken; its borrowed
/// inputs stay valid for that long.
struct WriteReq {
  bool is_delete = false;
  const tnx_task_record *rec = nullptr;  // save
  std::string_view id;                   // both
  uint64_t expected = TNX_VERSION_ANY;
  // save_batch (ABI 1.3): batch_n records run alone in one transaction;
  // versions go to batch_out; on failure `failed` is the record's index.
  const tnx_task_record *const *batch = nullptr;
  const uint64_t *batch_expected = nullptr;
  uint64_t batch_n = 0;
  uint64_t *batch_out = nullptr;
  uint64_t failed = 0;
  // save_stream (ABI 1.5): the records of `stream` run alone in one
  // transaction; `failed` is the index of the record (or of the source's
  // stop) that failed; `stream_saved` counts what went in. Without
  // `stream_atomic`, a record that fails ends the stream and the records
  // before it are committed.
  toolnexus::sdk::RecordSource *stream = nullptr;
  bool stream_atomic = true;
  uint64_t stream_saved = 0;
  // Results, written by the leader, read by the caller once woken.
  tnx_status status = TNX_EINTERNAL;
  std::string message;
  uint64_t version = 0;
  /// Set (before `wake`) when this request's thread is to lead the next
  /// batch, which starts with this request.
  bool lead = false;
  /// Posted once: when the request was run (results set), or when it is to
  /// lead; the last access of any other thread.
  toolnexus::plugins::Wakeup wake;
  /// Next request in the queue or batch (intrusive list: queueing and taking
  /// a batch never allocate, so they cannot fail half-way).
  WriteReq *next = nullptr;
  /// True for a request that is a transaction of its own (save_batch,
  /// save_stream): never grouped with others.
  bool alone() const noexcept { return batch != nullptr || stream != nullptr; }
};

/// "save of task 'x'" / "delete of task 'x'", the prefix of a request's
/// error messages.
std::string describe(const WriteReq &r) {
  if (r.batch != nullptr) return "sqlite: save of a batch of " + std::to_string(r.batch_n) + " task(s)";
  if (r.stream != nullptr) return "sqlite: save of a stream of tasks";
  return std::string(r.is_delete ? "sqlite: delete of task " : "sqlite: save of task ") +
         quote(r.id);
}

/// Page cache of the write connection while it runs a save_stream, in
/// KiB (SQLite's default is 2000): what a long import's pages may take in
/// memory before they spill to the WAL mid-transaction and are read back.
constexpr int kStreamCacheKiB = 64 * 1024;

/// Text of a version for conflict messages.
std::string version_text(uint64_t v) {
  if (v == TNX_VERSION_NONE) return "no task";
  return "version " + std::to_string(v);
}

class SqliteStore final : public toolnexus::sdk::Store {
 public:
  /// Opens (creating / migrating as needed) the database of `o`.
  explicit SqliteStore(Options o) : opt_(with_keep_wal(std::move(o))) {
    if (sqlite3_libversion_number() < kMinSqlite)
      throw Error(TNX_EUNSUPPORTED, std::string("sqlite: libsqlite3 ") + sqlite3_libversion() +
                                        " is too old; toolnexus-sqlite needs 3.31.0 or newer");
    if (!opt_.read_only) make_parent_directories(opt_.path);
    struct stat st {};
    if (::stat(opt_.path.c_str(), &st) != 0) {
      if (errno == ENOENT && opt_.read_only)
        throw Error(TNX_ENOTFOUND, "sqlite: no database at '" + opt_.path + "' (opened read-only, " +
                                       "so it was not created)");
    } else if (!S_ISREG(st.st_mode)) {
      // A FIFO would block the open forever; a directory or device is no
      // database either.
      throw Error(TNX_EINVAL, "sqlite: '" + opt_.path + "' is not a regular file (" +
                                  (S_ISDIR(st.st_mode) ? "a directory" : S_ISFIFO(st.st_mode) ? "a FIFO"
                                                                                              : "a special file") +
                                  "); give the path of a database file");
    }
    writer_ = std::make_unique<Conn>(opt_, Conn::Role::Writer);
    Conn &w = *writer_;
    // A file the process cannot write to opens read-only: behave as mode=ro.
    if (!opt_.read_only && sqlite3_db_readonly(w.db(), "main") == 1) {
      read_only_ = true;
      read_only_why_ = "the file is not writable by this process";
    }
    if (opt_.read_only) {
      read_only_ = true;
      read_only_why_ = opt_.host_read_only ? "opened read-only for inspection" : "opened with mode=ro";
    }
    set_up(w);
    if (!read_only_) {
      if (opt_.journal == Journal::Wal) {
        guard_ = std::make_unique<WalGuard>(w.db());
        guard_->checkpoint_now();
      } else {
        // A rollback journal keeps the main file complete: nothing to warn
        // of if the file goes back to WAL mode later.
        w.exec("UPDATE tnx_wal_state SET wal_required = 0 WHERE wal_required <> 0", "sqlite: open");
      }
    }
    ws_.begin = w.prepare("BEGIN IMMEDIATE");
    ws_.commit = w.prepare("COMMIT");
    ws_.rollback = w.prepare("ROLLBACK");
    ws_.lookup = w.prepare(kLookupSql);
    // A store that refuses writes never runs them (submit() throws first),
    // and a read-only database may lack the due column they name.
    if (!read_only_) {
      ws_.insert = w.prepare(kInsertSql);
      ws_.update = w.prepare(kUpdateSql);
    }
    ws_.remove = w.prepare(kDeleteSql);
    // Validate the read statements once (also warms one reader up).
    {
      Reader r(*this);
      r->get_stmt();
    }
    // Last: nothing after it may throw (a joinable thread must be joined).
    if (guard_) guard_thread_ = std::thread([this] { guard_loop(); });
  }

  ~SqliteStore() override { stop_guard_thread(); }

  /// `o` with keep_wal set for a read-only open of a database that has a
  /// -wal beside it (looked at before any connection could make one).
  static Options with_keep_wal(Options o) {
    struct stat ws {};
    o.keep_wal = o.read_only && ::lstat((o.path + "-wal").c_str(), &ws) == 0;
    return o;
  }

  bool get(std::string_view id, const RecordOut &out) override {
    Reader r(*this);
    Conn &c = *r;
    Stmt st(c, c.get_stmt());
    st.text(1, id);
    const int rc = st.step();
    if (rc == SQLITE_DONE) return false;
    if (rc != SQLITE_ROW) throw c.error(rc, "sqlite: get of task " + quote(id));
    out(decode_row(c, st.get(), false));
    return true;
  }

  uint64_t save(const tnx_task_record &rec, uint64_t expected) override {
    WriteReq r;
    r.rec = &rec;
    r.id = view(rec.id);
    r.expected = expected;
    const tnx_str fields[] = {rec.id, rec.context_id, rec.state, rec.owner, rec.tenant,
                              rec.task_json};
    for (const tnx_str &f : fields)
      if (f.data == nullptr && f.len != 0)
        throw Error(TNX_EINVAL, describe(r) + ": a field has a NULL pointer and a length");
    if (rec.task_json.len == 0) throw Error(TNX_EINVAL, describe(r) + ": empty task_json");
    submit(r);
    return r.version;
  }

  void save_batch(const tnx_task_record *const *recs, const uint64_t *expected, uint64_t n,
                  uint64_t *out) override {
    if (n == 0) return;
    WriteReq r;
    r.batch = recs;
    r.batch_expected = expected;
    r.batch_n = n;
    r.batch_out = out;
    r.failed = n;
    try {
      submit(r);
    } catch (const Error &e) {
      throw toolnexus::sdk::BatchError(r.failed, e.code, e.message);
    }
  }

  uint64_t save_stream(toolnexus::sdk::RecordSource &source, uint32_t flags) override {
    WriteReq r;
    r.stream = &source;
    r.stream_atomic = (flags & TNX_SAVE_STREAM_ONE_TRANSACTION) != 0;
    try {
      submit(r);
    } catch (const toolnexus::sdk::SourceStopped &) {
      throw;
    } catch (const Error &e) {
      throw toolnexus::sdk::BatchError(r.failed, e.code, e.message);
    }
    return r.stream_saved;
  }

  void del(std::string_view id, uint64_t expected) override {
    WriteReq r;
    r.is_delete = true;
    r.id = id;
    r.expected = expected;
    submit(r);
  }

  std::string list(const tnx_list_query &q, const RecordOut &out) override {
    if ((q.filter_flags & ~kKnownFilters) != 0)
      throw Error(TNX_EUNSUPPORTED, "sqlite: list: unknown filter bits 0x" + [&] {
        char buf[16];
        std::snprintf(buf, sizeof buf, "%x", q.filter_flags & ~kKnownFilters);
        return std::string(buf);
      }());
    const tnx_str strs[] = {q.context_id, q.state, q.owner, q.tenant, q.cursor};
    for (const tnx_str &f : strs)
      if (f.data == nullptr && f.len != 0)
        throw Error(TNX_EINVAL, "sqlite: list: a query field has a NULL pointer and a length");
    const uint32_t limit = toolnexus::sdk::page_size(q);
    const bool has_cursor = q.cursor.len != 0;
    // A due list's place is a sdk::DueKey (see list_sql), any other's a
    // Position.
    const bool due_list = (q.filter_flags & TNX_FILTER_DUE_BEFORE) != 0;
    Position from;
    DueKey due_from;
    if (has_cursor && due_list) due_from = DueKey::decode(view(q.cursor));
    else if (has_cursor) from = Position::decode(view(q.cursor));
    const bool omit = q.omit_json != 0;
    const bool deliver_corrupt =
        TNX_HAS_FIELD(&q, tnx_list_query, deliver_corrupt) && q.deliver_corrupt != 0;

    Reader r(*this);
    Conn &c = *r;
    Stmt st(c, c.list_stmt(q.filter_flags, has_cursor, omit));
    const uint32_t f = q.filter_flags;
    if (f & TNX_FILTER_CONTEXT_ID) st.text(1, q.context_id);
    if (f & TNX_FILTER_STATE) st.text(2, q.state);
    if (f & TNX_FILTER_OWNER) st.text(3, q.owner);
    if (f & TNX_FILTER_TENANT) st.text(4, q.tenant);
    if (f & TNX_FILTER_AFTER) st.i64(5, q.after_us);
    if (f & TNX_FILTER_BEFORE) st.i64(6, q.before_us);
    if (f & TNX_FILTER_DUE_BEFORE) st.i64(10, q.due_before_us);
    if (has_cursor && due_list) {
      st.i64(7, due_from.due_us);
      st.text(8, due_from.id);
    } else if (has_cursor) {
      const int rc = from.bind(st.get());
      if (rc != SQLITE_OK) throw c.error(rc, "sqlite: list");
    }
    st.i64(9, static_cast<int64_t>(limit) + 1);  // one more: is there a next page?

    Position last;
    DueKey due_last;
    std::string corrupt_name, problem;
    for (uint32_t n = 0;; ++n) {
      const int rc = st.step();
      if (rc == SQLITE_DONE) return std::string();
      if (rc != SQLITE_ROW) throw c.error(rc, "sqlite: list");
      if (n == limit) return due_list ? due_last.encode() : last.encode();
      if (n + 1 == limit && due_list) due_last = DueKey{due_of_row(st.get()), Position::of_row(st.get()).id};
      else if (n + 1 == limit) last = Position::of_row(st.get());
      tnx_task_record rec;
      try {
        rec = decode_row(c, st.get(), omit);
      } catch (const Error &e) {
        if (e.code != TNX_ECORRUPT || !deliver_corrupt) throw;
        rec = corrupt_record(st.get(), omit, corrupt_name);
        problem = e.message;
        rec.problem = toolnexus::sdk::str(problem);
      }
      if (!out(rec)) return std::string();
    }
  }

  uint64_t count(const tnx_list_query &q) override {
    if ((q.filter_flags & ~kKnownFilters) != 0)
      throw Error(TNX_EUNSUPPORTED, "sqlite: count: unknown filter bits");
    Reader r(*this);
    Conn &c = *r;
    Stmt st(c, c.count_stmt(q.filter_flags, have_counts_));
    const uint32_t f = q.filter_flags;
    if (f & TNX_FILTER_CONTEXT_ID) st.text(1, q.context_id);
    if (f & TNX_FILTER_STATE) st.text(2, q.state);
    if (f & TNX_FILTER_OWNER) st.text(3, q.owner);
    if (f & TNX_FILTER_TENANT) st.text(4, q.tenant);
    if (f & TNX_FILTER_AFTER) st.i64(5, q.after_us);
    if (f & TNX_FILTER_BEFORE) st.i64(6, q.before_us);
    if (f & TNX_FILTER_DUE_BEFORE) st.i64(10, q.due_before_us);
    const int rc = st.step();
    if (rc != SQLITE_ROW) throw c.error(rc, "sqlite: count");
    const int64_t n = sqlite3_column_int64(st.get(), 0);
    if (n < 0)
      throw Error(TNX_ECORRUPT, "sqlite: count: table tnx_counts of '" + opt_.path +
                                    "' holds a negative count (altered by hand?)");
    return static_cast<uint64_t>(n);
  }

  void watch(tnx_change_sink sink, void *ctx) override {
    if (read_only_)
      throw Error(TNX_EUNSUPPORTED, "sqlite: watch: database '" + opt_.path + "' is read-only (" + read_only_why_ +
                                        "): it has no change feed (the host polls)");
    std::lock_guard<std::mutex> lk(feed_mu_);
    feed_.start(sink, ctx);
    try {
      watcher_ = std::make_unique<ChangeLogWatcher>(opt_.path, opt_.busy_timeout_ms,
                                                    std::chrono::milliseconds(opt_.feed_poll_ms), feed_);
    } catch (...) {
      feed_.stop();
      throw;
    }
  }

  void unwatch() override {
    std::lock_guard<std::mutex> lk(feed_mu_);
    if (!watcher_) throw Error(TNX_EINVAL, "unwatch: no change feed runs");
    watcher_.reset();  // joins its thread: the sink is not called any more
    feed_.stop();
  }

  /// ABI 1.5: the database has the due column and its index (every
  /// read-write open adds them; a read-only open of an older file may lack
  /// them: open_sqlite then clears TNX_CAP_DUE_INDEX).
  bool keeps_due() const noexcept override { return has_due_; }

  /// True when saves are refused (mode=ro, the host's read-only open, or a
  /// file this process may not write to).
  bool refuses_writes() const noexcept { return read_only_; }

  void close() override {
    {
      std::lock_guard<std::mutex> lk(feed_mu_);
      watcher_.reset();
      feed_.stop();
    }
    std::vector<std::unique_ptr<Conn>> readers;
    {
      std::lock_guard<std::mutex> lk(rmu_);
      readers.swap(idle_);
    }
    readers.clear();
    stop_guard_thread();
    if (guard_) guard_->before_close();
    if (writer_) {
      const int rc = writer_->close();
      if (rc != SQLITE_OK) {
        SqlError e = writer_->error(rc, "sqlite: close");
        writer_.reset();
        throw Error(TNX_EIO, e.message + " (saves reported done are committed)");
      }
      writer_.reset();
    }
  }

 private:
  /// The write connection's prepared statements.
  struct WriterStmts {
    sqlite3_stmt *begin = nullptr, *commit = nullptr, *rollback = nullptr;
    sqlite3_stmt *lookup = nullptr, *insert = nullptr, *update = nullptr, *remove = nullptr;
  };

  /// A read connection on loan from the pool for one call.
  class Reader {
   public:
    explicit Reader(SqliteStore &s) : s_(s) {
      {
        std::lock_guard<std::mutex> lk(s_.rmu_);
        if (!s_.idle_.empty()) {
          c_ = std::move(s_.idle_.back());
          s_.idle_.pop_back();
        }
      }
      if (!c_) c_ = std::make_unique<Conn>(s_.opt_, Conn::Role::Reader, s_.has_due_);
    }
    Reader(const Reader &) = delete;
    Reader &operator=(const Reader &) = delete;
    ~Reader() {
      std::unique_lock<std::mutex> lk(s_.rmu_);
      if (s_.idle_.size() < s_.opt_.pool_size) {
        try {
          s_.idle_.push_back(std::move(c_));
        } catch (...) {
          // Out of memory: drop the connection instead of keeping it.
        }
      }
      lk.unlock();
      c_.reset();
    }
    Conn &operator*() const noexcept { return *c_; }
    Conn *operator->() const noexcept { return c_.get(); }

   private:
    SqliteStore &s_;
    std::unique_ptr<Conn> c_;
  };

  /// configure_writer + ensure_schema, retried from the start while SQLite
  /// says the database is busy, until busy_timeout_ms have passed.
  ///
  /// Needed because SQLite does not always call the busy handler at open:
  /// two processes that open a new database at once both run
  /// "PRAGMA journal_mode = wal", each holding a shared lock and wanting the
  /// exclusive one; SQLite sees the deadlock and returns SQLITE_BUSY to one
  /// of them at once (https://sqlite.org/c3ref/busy_handler.html). Both
  /// steps are idempotent and ensure_schema rolls back on failure, so
  /// starting over is safe.
  void set_up(Conn &w) {
    const auto start = std::chrono::steady_clock::now();
    const auto limit = std::chrono::milliseconds(opt_.busy_timeout_ms);
    for (int attempt = 0;; ++attempt) {
      try {
        refuse_missing_wal(w);
        if (!read_only_) configure_writer(w);
        ensure_schema(w);
        if (!read_only_) ensure_side_tables(w);
        if (!read_only_) ensure_due_index(w);
        has_due_ = w.query_int(kDueProbeSql, "sqlite: open") == 2;
        return;
      } catch (const SqlError &e) {
        const int primary = e.rc & 0xff;
        if (primary != SQLITE_BUSY && primary != SQLITE_LOCKED) throw;
        const auto waited = std::chrono::steady_clock::now() - start;
        if (waited >= limit) throw;
        // 1, 2, 4 .. 16 ms: the other opener finishes in well under that.
        auto nap = std::chrono::milliseconds(1 << (attempt < 4 ? attempt : 4));
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(limit - waited);
        std::this_thread::sleep_for(nap < left ? nap : left);
      }
    }
  }

  /// Throws TNX_ECORRUPT for a WAL database whose saves since its last
  /// checkpoint are missing (wal_guard.hpp), unless missing_wal=accept; a
  /// busy read throws SqlError for set_up to retry.
  void refuse_missing_wal(Conn &w) {
    int rc = SQLITE_OK;
    const WalCheck c = toolnexus_sqlite::check_missing_wal(w.db(), opt_.path, &rc);
    if ((rc & 0xff) == SQLITE_BUSY || (rc & 0xff) == SQLITE_LOCKED) throw w.error(rc, "sqlite: open");
    if (c != WalCheck::MissingWal || opt_.accept_missing_wal) return;
    throw Error(TNX_ECORRUPT,
                "sqlite: database '" + opt_.path + "' is missing its write-ahead log: the file says " +
                    "Tasks were saved after its last checkpoint, and no '" + opt_.path +
                    "-wal' holding them is beside it (the file was copied, or its -wal removed, while a "
                    "store had it open), so those Tasks are not in it. Put the -wal that belongs to it "
                    "back beside it (copy both files while no process has the store open, or copy with "
                    "sqlite3's .backup or VACUUM INTO, which need no -wal); to open the file as it is "
                    "and accept the loss, add ?missing_wal=accept to the selector once");
  }

  /// Creates tnx_wal_state (wal_guard.hpp) and the change log with its
  /// triggers (change_log.hpp) when a read-write open finds them missing.
  void ensure_side_tables(Conn &w) {
    const char *probe =
        "SELECT count(*) FROM sqlite_master WHERE (type = 'table' AND name IN ('tnx_wal_state', 'tnx_changes'))"
        " OR (type = 'trigger' AND name IN ('tnx_tasks_change_insert', 'tnx_tasks_change_update',"
        " 'tnx_tasks_change_delete'))";
    if (w.query_int(probe, "sqlite: open") == 5) return;
    w.exec("BEGIN IMMEDIATE", "sqlite: open");
    try {
      w.exec(toolnexus_sqlite::kWalStateSql, "sqlite: creating tnx_wal_state");
      w.exec(toolnexus_sqlite::kChangeLogSql, "sqlite: creating the change log tnx_changes");
      w.exec("COMMIT", "sqlite: open");
    } catch (...) {
      if (sqlite3_get_autocommit(w.db()) == 0)
        sqlite3_exec(w.db(), "ROLLBACK", nullptr, nullptr, nullptr);
      throw;
    }
  }

  /// Adds the due column and its index (kDueIndexSql) when a read-write open
  /// finds them missing; decided again inside BEGIN IMMEDIATE, so processes
  /// opening at once add them exactly once.
  void ensure_due_index(Conn &w) {
    if (w.query_int(kDueReadySql, "sqlite: open") == 2) return;
    w.exec("BEGIN IMMEDIATE", "sqlite: open");
    try {
      if (w.query_int(kDueReadySql, "sqlite: open") != 2) {
        if (w.query_int(kDueColumnProbeSql, "sqlite: open") == 0)
          w.exec(kDueColumnSql, "sqlite: adding the due column (due_us of tnx_tasks)");
        w.exec(kDueIndexSql, "sqlite: adding the due index tnx_tasks_by_due_id (due_us, id)");
      }
      w.exec("COMMIT", "sqlite: open");
    } catch (...) {
      if (sqlite3_get_autocommit(w.db()) == 0)
        sqlite3_exec(w.db(), "ROLLBACK", nullptr, nullptr, nullptr);
      throw;
    }
  }

  /// Per-connection settings of the writer: journal mode, synchronous.
  /// The journal mode is only changed when it differs (it is stored in the
  /// file for wal), so a second opener of a wal database needs no lock.
  void configure_writer(Conn &w) {
    const std::string want = journal_name(opt_.journal);
    std::string got = lower(w.query_text("PRAGMA journal_mode", "sqlite: open"));
    if (got != want)
      got = lower(w.query_text(("PRAGMA journal_mode = " + want).c_str(), "sqlite: open"));
    if (got != want)
      throw Error(TNX_EIO, "sqlite: database '" + opt_.path + "': cannot use journal=" + want +
                               " (SQLite kept journal mode '" + got + "')");
    w.exec((std::string("PRAGMA synchronous = ") + sync_name(opt_.sync)).c_str(), "sqlite: open");
    // Keep a WAL that grew during a burst from staying large forever.
    w.exec("PRAGMA journal_size_limit = 67108864", "sqlite: open");
    // A group commit runs many INSERTs in one transaction; each needs a
    // statement journal (the pages it changes, so that it alone can be
    // undone), which spilled to temp files past 64 KiB: 2 of every 3 write
    // syscalls of a busy server went there. In memory they cost no syscall.
    w.exec("PRAGMA temp_store = memory", "sqlite: open");
  }

  /// Creates the schema in an empty database, migrates an older one, refuses
  /// a newer one or someone else's. Race-free between processes: the
  /// decision is re-made inside BEGIN IMMEDIATE.
  void ensure_schema(Conn &w) {
    auto check = [&](int64_t app, int64_t ver) {
      if (app != 0 && app != kApplicationId)
        throw Error(TNX_EUNSUPPORTED, "sqlite: database '" + opt_.path +
                                          "' belongs to another application (application_id " +
                                          std::to_string(app) + ")");
      if (ver > kSchemaVersion)
        throw Error(TNX_EUNSUPPORTED,
                    "sqlite: database '" + opt_.path + "' has task schema version " +
                        std::to_string(ver) + ", newer than version " +
                        std::to_string(kSchemaVersion) +
                        " that this toolnexus-sqlite understands; upgrade the plugin");
      if (ver < 0)
        throw Error(TNX_ECORRUPT, "sqlite: database '" + opt_.path +
                                      "' has an invalid schema version " + std::to_string(ver));
    };
    int64_t app = w.query_int("PRAGMA application_id", "sqlite: open");
    int64_t ver = w.query_int("PRAGMA user_version", "sqlite: open");
    check(app, ver);
    if (ver == kSchemaVersion) return;
    // Schema 2 differs from 3 only by the counters: readable as it is.
    if (read_only_ && ver == 2) {
      have_counts_ = false;
      return;
    }
    if (read_only_ && ver == 0)
      throw Error(TNX_ENOTFOUND, "sqlite: database '" + opt_.path +
                                     "' holds no toolnexus Tasks (no task schema; " + read_only_why_ +
                                     ", so none was created)");
    if (read_only_)
      throw Error(TNX_EUNSUPPORTED,
                  "sqlite: database '" + opt_.path + "' " +
                      (ver == 0 ? std::string("has no toolnexus schema yet")
                                : "needs migration from schema " + std::to_string(ver) + " to " +
                                      std::to_string(kSchemaVersion)) +
                      ", which cannot be done read-only (" + read_only_why_ +
                      "); open it read-write once to migrate it, e.g. by starting toolnexus serve on it");
    w.exec("BEGIN IMMEDIATE", "sqlite: open");
    try {
      app = w.query_int("PRAGMA application_id", "sqlite: open");
      ver = w.query_int("PRAGMA user_version", "sqlite: open");
      check(app, ver);
      if (ver == 0) {
        if (w.query_int("SELECT count(*) FROM sqlite_master WHERE name = 'tnx_tasks'",
                        "sqlite: open") != 0)
          throw Error(TNX_ECORRUPT, "sqlite: database '" + opt_.path +
                                        "' has a tnx_tasks table but no schema version");
        w.exec((tasks_table_sql("tnx_tasks") + kSchemaExtrasSql + kCountsSql).c_str(),
               "sqlite: creating the schema");
      } else if (ver == 1) {
        w.exec((tasks_table_sql("tnx_tasks_v2") + kMigrate1To2Sql + kSchemaExtrasSql).c_str(),
               "sqlite: migrating schema 1 to 2");
      }
      if (ver == 1 || ver == 2)
        w.exec((std::string(kCountsSql) + kMigrate2To3Sql).c_str(), "sqlite: migrating schema 2 to 3");
      if (ver < kSchemaVersion) {
        w.exec(("PRAGMA application_id = " + std::to_string(kApplicationId)).c_str());
        w.exec(("PRAGMA user_version = " + std::to_string(kSchemaVersion)).c_str());
      }
      w.exec("COMMIT", "sqlite: open");
    } catch (...) {
      if (sqlite3_get_autocommit(w.db()) == 0)
        sqlite3_exec(w.db(), "ROLLBACK", nullptr, nullptr, nullptr);
      throw;
    }
  }

  // -------------------------------------------------------------------------
  // Group commit
  // -------------------------------------------------------------------------

  /// Runs `r` (blocking) through the group commit and throws its error.
  void submit(WriteReq &r) {
    if (read_only_)
      throw Error(opt_.read_only ? TNX_EUNSUPPORTED : TNX_EIO,
                  describe(r) + ": database '" + opt_.path + "' is read-only (" + read_only_why_ +
                      ")");
    // The queue's first request leads: it runs a batch (itself and up to
    // max_batch - 1 requests queued behind it), wakes each request of the
    // batch, and hands the lead to the request now first in the queue, if
    // any, so that one thread never leads for ever. Each waiting thread is
    // woken once, when its request is done or when it is to lead; none is
    // woken for another's batch.
    bool lead = false;
    {
      std::lock_guard<std::mutex> lk(wmu_);
      r.next = nullptr;
      (tail_ != nullptr ? tail_->next : head_) = &r;
      tail_ = &r;
      if (!leader_) leader_ = lead = true;
    }
    if (!lead) {
      r.wake.wait();
      lead = r.lead;
    }
    if (lead) {
      WriteReq *first = nullptr, *next_leader = nullptr;
      {
        std::lock_guard<std::mutex> lk(wmu_);
        // head_ is r. A save_batch or save_stream request runs alone (its
        // own transaction is the unit).
        first = head_;
        WriteReq *last = head_;
        for (size_t n = 1; n < opt_.max_batch && last->next != nullptr && !first->alone() &&
                           !last->next->alone();
             ++n)
          last = last->next;
        head_ = last->next;
        if (head_ == nullptr) tail_ = nullptr;
        last->next = nullptr;
      }
      run_batch(first);
      for (WriteReq *q = first; q != nullptr;) {
        WriteReq *next = q->next;  // read before the wake lets the owner return
        if (q != &r) q->wake.post();
        q = next;
      }
      // The batch's callers have their answers; the connection is still
      // ours alone for a checkpoint, if one is due.
      if (guard_) guard_->after_commit();
      after_batch();
      {
        std::lock_guard<std::mutex> lk(wmu_);
        next_leader = head_;
        if (next_leader != nullptr) next_leader->lead = true;
        else leader_ = false;
      }
      if (next_leader != nullptr) next_leader->wake.post();
    }
    if (r.status != TNX_OK) throw Error(r.status, r.message);
  }

  /// The guard thread: while the WAL guard has a checkpoint pending, retries
  /// it every WalGuard::kRetry on the write connection when no batch holds
  /// it (a busy writer retries after its own batches), so that an idle
  /// store does not keep a main file without the mark (wal_guard.hpp).
  void guard_loop() noexcept {
    std::unique_lock<std::mutex> lk(guard_mu_);
    while (!guard_stop_) {
      guard_cv_.wait_for(lk, guard_->pending() ? WalGuard::kRetry : std::chrono::milliseconds(1000));
      if (guard_stop_ || !guard_->pending()) continue;
      lk.unlock();
      bool lead = false;
      {
        std::lock_guard<std::mutex> wl(wmu_);
        if (!leader_) leader_ = lead = true;
      }
      if (lead) {
        guard_->after_commit();
        WriteReq *next_leader = nullptr;
        {
          std::lock_guard<std::mutex> wl(wmu_);
          next_leader = head_;
          if (next_leader != nullptr) next_leader->lead = true;
          else leader_ = false;
        }
        if (next_leader != nullptr) next_leader->wake.post();
      }
      lk.lock();
    }
  }

  void stop_guard_thread() noexcept {
    {
      std::lock_guard<std::mutex> lk(guard_mu_);
      guard_stop_ = true;
    }
    guard_cv_.notify_all();
    if (guard_thread_.joinable()) guard_thread_.join();
  }

  /// After a batch (leader only): tells the change feed's watcher to read
  /// now, and prunes the change log every kChangeLogPruneEvery batches.
  void after_batch() noexcept {
    if (++since_prune_ >= toolnexus_sqlite::kChangeLogPruneEvery) {
      since_prune_ = 0;
      (void)toolnexus_sqlite::prune_change_log(writer_->db());
    }
    std::lock_guard<std::mutex> lk(feed_mu_);
    if (watcher_) watcher_->poke();
  }

  /// Executes one batch on the write connection (leader only). Every request
  /// gets its own status; never throws.
  void run_batch(WriteReq *first) noexcept {
    if (first->next == nullptr) {
      run_alone(*first);
      return;
    }
    try {
      step_control(ws_.begin, "begin");
    } catch (const Error &e) {
      for (WriteReq *r = first; r != nullptr; r = r->next) fail(*r, e);  // e.g. locked
      return;
    } catch (...) {
      for (WriteReq *r = first; r != nullptr; r = r->next) fail_internal(*r);
      return;
    }
    try {
      for (WriteReq *r = first; r != nullptr; r = r->next) execute(*r);
    } catch (...) {
      // A statement failed for one request: undo the batch and give every
      // request its own transaction, so only the culprit sees the error.
      rollback_quietly();
      for (WriteReq *r = first; r != nullptr; r = r->next) run_alone(*r);
      return;
    }
    try {
      step_control(ws_.commit, "commit");
    } catch (const SqlError &e) {
      rollback_quietly();
      // Locked (rollback-journal modes): retrying one by one would only wait
      // busy_timeout_ms again per request.
      const bool busy = (e.rc & 0xff) == SQLITE_BUSY;
      for (WriteReq *r = first; r != nullptr; r = r->next) {
        if (busy) fail(*r, e);
        else run_alone(*r);
      }
    } catch (...) {
      rollback_quietly();
      for (WriteReq *r = first; r != nullptr; r = r->next) run_alone(*r);
    }
  }

  /// Executes one request in a transaction of its own. Never throws.
  void run_alone(WriteReq &r) noexcept {
    try {
      step_control(ws_.begin, "begin");
      try {
        execute(r);
        step_control(ws_.commit, "commit");
      } catch (...) {
        rollback_quietly();
        throw;
      }
    } catch (const Error &e) {
      fail(r, e);
    } catch (...) {
      fail_internal(r);
    }
  }

  static void fail(WriteReq &r, const Error &e) noexcept {
    r.status = e.code;
    r.version = 0;
    try {
      std::string_view cause = e.message;
      if (cause.substr(0, 8) == "sqlite: ") cause.remove_prefix(8);
      r.message = describe(r) + ": " + std::string(cause);
    } catch (...) {
      r.message.clear();
    }
  }

  static void fail_internal(WriteReq &r) noexcept {
    r.status = TNX_EINTERNAL;
    r.version = 0;
    r.message.clear();
  }

  /// Steps BEGIN/COMMIT/ROLLBACK; throws the mapped error.
  void step_control(sqlite3_stmt *s, const char *what) {
    Stmt st(*writer_, s);
    const int rc = st.step();
    if (rc != SQLITE_DONE) throw writer_->error(rc, what);
  }

  /// Ends an open write transaction, ignoring errors (SQLite may already
  /// have rolled it back after an I/O error).
  void rollback_quietly() noexcept {
    if (sqlite3_get_autocommit(writer_->db()) != 0) return;
    sqlite3_step(ws_.rollback);
    sqlite3_reset(ws_.rollback);
  }

  /// Reads version `col` of the lookup row: 0 for NULL (none), else a
  /// positive integer or TNX_ECORRUPT.
  uint64_t lookup_column(sqlite3_stmt *s, int col, std::string_view id) const {
    const int type = sqlite3_column_type(s, col);
    if (type == SQLITE_NULL) return 0;
    const int64_t v = sqlite3_column_int64(s, col);
    if (type != SQLITE_INTEGER || v < 1)
      throw Error(TNX_ECORRUPT, "sqlite: corrupt row in '" + opt_.path + "' for task " +
                                    quote(id) + ": " + (col == 0 ? "" : "tombstone ") +
                                    "version is not a positive integer");
    return static_cast<uint64_t>(v);
  }

  /// Steps a write statement that returns no rows; throws on failure.
  void step_done(Stmt &st) {
    const int rc = st.step();
    if (rc != SQLITE_DONE) throw writer_->error(rc, {});
  }

  /// Executes one request inside the open write transaction: sets status
  /// OK, ECONFLICT or ENOTFOUND (the latter two write nothing); throws on
  /// any other failure. The compare-and-set: read the stored version, compare
  /// it with the expected one, write the next version; atomic because the
  /// transaction holds the write lock from BEGIN IMMEDIATE on.
  void execute(WriteReq &r) {
    if (r.batch != nullptr) {
      // All records in this transaction, in order; the first that does not
      // go through undoes the whole (the caller rolls back on the throw).
      for (uint64_t i = 0; i < r.batch_n; ++i) {
        WriteReq one;
        one.rec = r.batch[i];
        one.id = view(one.rec->id);
        one.expected = r.batch_expected[i];
        r.failed = i;
        execute(one);
        if (one.status != TNX_OK)
          throw Error(one.status, one.message + " (record " + std::to_string(i) + " of the batch; nothing written)");
        r.batch_out[i] = one.version;
      }
      r.failed = r.batch_n;
      r.status = TNX_OK;
      r.message.clear();
      return;
    }
    if (r.stream != nullptr) {
      // Record after record in this transaction; the first that does not go
      // through undoes the whole (atomic: the caller rolls back on the
      // throw) or ends the stream with what came before committed.
      // A bigger page cache meanwhile (kStreamCacheKiB), so that the pages
      // of a long transaction are not spilled to the WAL and read back.
      struct BigCache {
        Conn &c;
        explicit BigCache(Conn &conn) : c(conn) {
          c.exec(("PRAGMA cache_size = -" + std::to_string(kStreamCacheKiB)).c_str());
        }
        ~BigCache() { sqlite3_exec(c.db(), "PRAGMA cache_size = -2000", nullptr, nullptr, nullptr); }
      } big(*writer_);
      for (;;) {
        r.failed = r.stream->delivered();
        uint64_t exp = TNX_VERSION_ANY;
        const tnx_task_record *rec = nullptr;
        try {
          rec = r.stream->next(exp);
        } catch (const Error &e) {  // SourceStopped, or a record save would refuse
          if (r.stream_atomic) throw;
          r.status = e.code;
          r.message = e.message;
          return;
        }
        if (rec == nullptr) break;
        r.failed = r.stream->delivered() - 1;
        WriteReq one;
        one.rec = rec;
        one.id = view(rec->id);
        one.expected = exp;
        execute(one);
        if (one.status != TNX_OK) {
          if (r.stream_atomic)
            throw Error(one.status, one.message + " (record " + std::to_string(r.failed) +
                                        " of the stream; nothing written)");
          r.status = one.status;
          r.message = one.message + " (record " + std::to_string(r.failed) + " of the stream; the " +
                      std::to_string(r.stream_saved) + " before it are saved)";
          return;
        }
        ++r.stream_saved;
      }
      r.failed = r.stream_saved;
      r.status = TNX_OK;
      r.message.clear();
      return;
    }
    uint64_t stored = 0, tombstone = 0;
    {
      Stmt st(*writer_, ws_.lookup);
      st.text(1, r.id);
      const int rc = st.step();
      if (rc != SQLITE_ROW) throw writer_->error(rc, {});
      stored = lookup_column(st.get(), 0, r.id);
      tombstone = lookup_column(st.get(), 1, r.id);
    }
    const uint64_t exp = r.expected;
    r.version = 0;
    if (r.is_delete && stored == 0) {
      r.status = TNX_ENOTFOUND;
      r.message = "sqlite: no task with id " + quote(r.id) + " in '" + opt_.path + "'";
      return;
    }
    // TNX_VERSION_NONE is 0, "nothing stored": the same comparison covers it.
    if (exp != TNX_VERSION_ANY && exp != stored) {
      r.status = TNX_ECONFLICT;
      r.message = describe(r) + ": expected " + version_text(exp) + ", stored " +
                  version_text(stored) + "; nothing written";
      return;
    }
    if (r.is_delete) {
      Stmt st(*writer_, ws_.remove);
      st.text(1, r.id);
      step_done(st);
      r.version = stored;
    } else {
      // A re-created id continues after its tombstone: versions never repeat.
      const uint64_t next = (stored != 0 ? stored : tombstone) + 1;
      if (next > static_cast<uint64_t>(INT64_MAX))
        throw Error(TNX_EINTERNAL, describe(r) + ": version counter exhausted");
      const tnx_task_record &rec = *r.rec;
      Stmt st(*writer_, stored != 0 ? ws_.update : ws_.insert);
      st.text(1, rec.id);
      st.text(2, rec.context_id);
      st.text(3, rec.state);
      st.i64(4, rec.status_time_us);
      st.text(5, rec.owner);
      st.text(6, rec.tenant);
      st.text(7, rec.task_json);
      st.i64(8, static_cast<int64_t>(next));
      const int64_t due = toolnexus::sdk::due_of(rec);
      if (due != TNX_TIME_NONE) st.i64(9, due);  // else NULL: nothing due
      step_done(st);
      if (sqlite3_changes(writer_->db()) != 1)
        throw Error(TNX_EINTERNAL, describe(r) + ": the row changed inside the transaction");
      r.version = next;
    }
    r.status = TNX_OK;
    r.message.clear();
  }

  const Options opt_;
  bool read_only_ = false;
  std::string read_only_why_;
  /// The file has tnx_counts (schema 3); false for a schema 2 file opened
  /// read-only. Set at open, then read only.
  bool have_counts_ = true;
  /// The file has the due column and index (keeps_due()). Set at open,
  /// then read only.
  bool has_due_ = false;

  // Writer side: wmu_ guards the queue (head_..tail_), leader_ and
  // WriteReq::next/lead of queued requests; ws_, writer_ and the requests of
  // the batch being run are used by the current leader only (see submit()).
  std::unique_ptr<Conn> writer_;
  /// The writer's checkpoints (journal=wal, read-write only), else null.
  std::unique_ptr<WalGuard> guard_;
  /// guard_loop's thread (read-write journal=wal stores only) and its stop.
  std::thread guard_thread_;
  std::mutex guard_mu_;
  std::condition_variable guard_cv_;
  bool guard_stop_ = false;
  /// Batches since the change log was last pruned (leader only).
  int since_prune_ = 0;

  // Change feed: feed_mu_ guards watcher_ (set by watch, reset by unwatch
  // and close, poked after every batch). feed_ is thread-safe itself.
  std::mutex feed_mu_;
  toolnexus::sdk::ChangeFeed feed_;
  std::unique_ptr<ChangeLogWatcher> watcher_;
  WriterStmts ws_;
  std::mutex wmu_;
  WriteReq *head_ = nullptr, *tail_ = nullptr;
  bool leader_ = false;

  // Reader pool: idle connections, guarded by rmu_.
  std::mutex rmu_;
  std::vector<std::unique_ptr<Conn>> idle_;
};

toolnexus::sdk::Store *open_sqlite(const tnx_open_args &args) {
  Options o = parse_location(view(args.location));
  if (toolnexus::sdk::open_read_only(args)) {
    o.host_read_only = !o.read_only;  // an explicit mode=ro keeps SQLITE_OPEN_READONLY
    o.read_only = true;
  }
  // Only synchronous=full|extra make a commit survive a power loss.
  if (o.sync == Sync::Normal || o.sync == Sync::Off)
    toolnexus::sdk::clear_capabilities(args, TNX_CAP_DURABLE);
  auto store = std::make_unique<SqliteStore>(std::move(o));
  // A store that cannot write has no change log to watch.
  if (store->refuses_writes()) toolnexus::sdk::clear_capabilities(args, TNX_CAP_CHANGE_FEED);
  // A file opened read-only that no read-write open gave the due index yet.
  if (!store->keeps_due()) toolnexus::sdk::clear_capabilities(args, TNX_CAP_DUE_INDEX);
  return store.release();
}

const char *const kSchemes[] = {"sqlite", nullptr};

const tnx_plugin_descriptor kDescriptor = {
    TNX_HEADER_INIT(tnx_plugin_descriptor),
    "toolnexus-sqlite",
    "0.1.0",
    "SQLite file store, sqlite:<path>[?opt=val&...], WAL, group commit, CAS, multi-process; "
    "options: synchronous=full|extra|normal|off (default full; only full/extra are durable), "
    "busy_timeout_ms=0..3600000 (default 5000), journal=wal|delete|truncate|persist "
    "(default wal), pool_size=1..64 idle read connections (default 64), max_batch=1..1000 "
    "writes per group commit (default 64, 1 = off), mode=rw|ro (default rw), "
    "missing_wal=refuse|accept (default refuse: a file copied without the -wal holding its "
    "latest saves fails to open), feed_poll_ms=1..60000 (default 20: the change feed's look "
    "for other processes' saves)",
    kSchemes,
    TNX_CAP_THREAD_SAFE | TNX_CAP_PAGINATED_LIST | TNX_CAP_COMPARE_AND_SET | TNX_CAP_DURABLE |
        TNX_CAP_MULTI_PROCESS | TNX_CAP_PERSISTENT | TNX_CAP_CHANGE_FEED | TNX_CAP_DUE_INDEX,
    &toolnexus::sdk::open_trampoline<open_sqlite>,
    nullptr,  // vtable: set in the entry (the helper's vtable is a function-local static)
    "sqlite:<path>[?synchronous=full|extra|normal|off&busy_timeout_ms=N"
    "&journal=wal|delete|truncate|persist&pool_size=N&max_batch=N&mode=rw|ro"
    "&missing_wal=refuse|accept&feed_poll_ms=N]",
};

}  // namespace

extern "C" TNX_PLUGIN_EXPORT const tnx_plugin_descriptor *toolnexus_plugin_entry(
    const tnx_host_info *host) {
  return toolnexus::sdk::entry<kDescriptor>(host);
}

// plugins/postgres: the "postgres" and "postgresql" schemes. Tasks in one
// table of a PostgreSQL database, shared by every thread of a process and by
// every process (replica) that opens the same database and table.
//
// Built against the SDK header (toolnexus/plugin.hpp) and libpq's C API only
// (PostgreSQL server 9.5 or later; developed and tested on 15). Exports
// nothing but toolnexus_plugin_entry.
//
// ===========================================================================
// Selector
// ===========================================================================
//   postgresql://[user[:password]@]host[:port][/dbname][?param=value&...]
//   postgres://...                         (same thing)
//
//   postgresql://tnx@127.0.0.1:5432/a2a?sslmode=disable
//   postgresql://tnx@db.internal/a2a?sslmode=verify-full&tnx_pool=8&tnx_table=tasks_eu
//
// The selector is a libpq connection URI
// (https://www.postgresql.org/docs/15/libpq-connect.html#LIBPQ-CONNSTRING):
// every libpq parameter works (sslmode, connect_timeout, options,
// target_session_attrs, several hosts, ...). The password may be in the URI
// (percent-encoded), in PGPASSWORD or in a password file (PGPASSFILE,
// ~/.pgpass); it never appears in an error message: messages name user, host,
// port and database only, and every libpq/server message is scrubbed of the
// password text (raw and percent-decoded) before it reaches the host.
//
// The plugin sets these libpq defaults, each overridable in the URI:
//   connect_timeout=5, keepalives=1, keepalives_idle=10,
//   keepalives_interval=5, keepalives_count=3, tcp_user_timeout=10000,
//   fallback_application_name=toolnexus.
// It forces client_encoding=UTF8 (task bytes must reach the server as sent).
//
// ===========================================================================
// Options of the plugin: URI query parameters with the prefix "tnx_", removed
// before the URI is handed to libpq. Each at most once; an unknown tnx_
// option, a missing "=value" or a bad value fails open() with TNX_EINVAL
// naming the option. Values may be percent-encoded.
// ===========================================================================
//   tnx_pool=1..64                          default 16
//       Most connections the store keeps to the server. They are opened on
//       demand (the first at open()) and shared by the threads of the
//       process; a call waits for a free one. The default is sized for the
//       A2A server's concurrency (its HTTP threads read while its workers
//       save) without taking more than a sixth of PostgreSQL's default
//       max_connections (100) per replica; connections are server
//       processes, so unlike sqlite's readers they are not free.
//   tnx_statement_timeout_ms=0..3600000     default 5000
//       PostgreSQL statement_timeout of every connection: a statement that
//       runs longer (waiting for a row lock, a slow disk) is cancelled and
//       the call fails with TNX_EIO. The client also gives up on a silent
//       server (no reply at all) after this plus 2000 ms, closing that
//       connection. 0 = no limit (neither on the server nor in the client).
//   tnx_table=<name>                        default tnx_tasks
//       Table of the Tasks: [a-z_][a-z0-9_]{0,47}. Several stores (tenants,
//       environments, tests) can share a database with different tables;
//       each table is created and migrated on its own. The table (and the
//       version table below) live in the connection's current schema (the
//       first schema of search_path: set it with options=-csearch_path%3Dx).
//
// ===========================================================================
// Schema (version 3; every SQL text is in pg_sql.hpp)
// ===========================================================================
//   CREATE TABLE <table> (
//     id             text COLLATE "C" NOT NULL PRIMARY KEY,  -- bytewise order
//     context_id     text COLLATE "C" NOT NULL,
//     state          text COLLATE "C" NOT NULL,
//     status_time_us bigint NOT NULL,      -- TNX_TIME_NONE = INT64_MIN
//     owner          text COLLATE "C" NOT NULL,
//     tenant         text COLLATE "C" NOT NULL,
//     task_json      text NOT NULL,        -- exactly the saved bytes (not jsonb)
//     version        bigint NOT NULL,      -- 1, 2, 3, ... per id
//     deleted        boolean NOT NULL DEFAULT false);
//   Partial indexes (WHERE NOT deleted), each ending in the list order:
//     <table>_by_time    (status_time_us DESC, id)
//     <table>_by_context (context_id, status_time_us DESC, id)
//     <table>_by_state / _by_owner / _by_tenant   (likewise)
//   CREATE TABLE toolnexus_schema (table_name text PRIMARY KEY,
//     version integer NOT NULL, updated_at timestamptz NOT NULL)
//     -- one row per task table: its schema version.
//
//   A deleted Task keeps an emptied row with deleted = true and its last
//   version, so that re-creating the id continues the numbering (a version is
//   never reused for an id: compare-and-set has no ABA problem, also across
//   processes).
//
//   Creation and migration run at open() in one transaction that first takes
//   pg_advisory_xact_lock(kSchemaLockKey): replicas starting at the same
//   instant serialise there (CREATE TABLE IF NOT EXISTS alone can still fail
//   with a unique violation on pg_type), and exactly one of them creates or
//   migrates. DDL inside it runs without statement timeout (a migration of a
//   big table may take long); waiting for the lock does not (a replica that
//   waits longer than tnx_statement_timeout_ms fails open() with TNX_EIO and
//   may retry).
//   Counters (version 3): "<table>$counts" (owner, tenant, state, slot, n),
//     kept by the row trigger "<table>$count" on every change of the task
//     table, so that count (ABI 1.3) sums at most 64 rows per (owner, tenant,
//     state) instead of scanning; see pg::Sql::create_v3_counts for how
//     concurrent saves avoid waiting on one counter row and deadlocks.
//   Change feed (an addition to version 3, no version bump): the row
//     trigger "<table>$notify", created by a read-write open when missing
//     (see "Change feed" below).
//   Due index (ABI 1.5, an addition to version 3, no version bump): column
//     due_us bigint (NULL = nothing due; set by every save, NULL on delete)
//     and the partial index "<table>_by_due_id" (due_us, id) WHERE due_us IS
//     NOT NULL, added by a read-write open when missing (pg::Sql::create_due,
//     which drops "<table>_by_due", the (due_us) index of development builds
//     of 1.5), so a TNX_FILTER_DUE_BEFORE page is a range of that index read
//     in the due list's order from its cursor (sdk::DueKey), and a count
//     reads the rows due only. An older plugin names its columns in every statement:
//     its inserts leave due_us NULL (not due), its updates leave it as it
//     was (the Task may be listed as due once more than needed, never
//     missed by a host that saves due times through this plugin). A table
//     without them (opened read-only before any read-write open added
//     them, or by a role that may not alter it) is used as it is, without
//     TNX_CAP_DUE_INDEX (a due list is refused as unsupported).
//   History: 1 = first release (NULL status_time_us for "no timestamp",
//   filter columns in the database collation, one index, no soft delete),
//   migrated in place to 2 (pg_sql.hpp migrate_v1_to_v2); 2 = 3 without the
//   counters, migrated by creating and filling them (read-only, a version 2
//   table is read as it is and count scans); 3 = current. A
//   table recorded at a higher version is refused with TNX_EUNSUPPORTED; a
//   table of that name without a version row is refused with TNX_ECORRUPT
//   (it is not ours).
//   The database encoding must be UTF8 (or SQL_ASCII, which stores bytes as
//   they come); others are refused with TNX_EUNSUPPORTED.
//
// ===========================================================================
// Statements, concurrency, failures
// ===========================================================================
// - Every statement is prepared once per connection (on first use; list has
//   one prepared statement per shape: filters x cursor x omit_json) and run
//   with binary parameters and results, so any bytes go through unquoted and
//   uncopied.
// - Compare-and-set is a single statement on the version column:
//   TNX_VERSION_ANY  INSERT ... ON CONFLICT (id) DO UPDATE version+1
//   TNX_VERSION_NONE INSERT ... ON CONFLICT (id) DO UPDATE ... WHERE deleted
//                    (no row back = a live Task exists = TNX_ECONFLICT)
//   version N        UPDATE ... SET version = version + 1
//                    WHERE id = $1 AND version = N AND NOT deleted
//   PostgreSQL's row locks make it hold between connections and processes.
//   Every save commits on its own, with synchronous_commit on (turned on for
//   the session if the server default is off), so TNX_OK means the commit
//   record is flushed to disk (TNX_CAP_DURABLE, given fsync on the server).
// - list is keyset pagination on the index of the most selective filter: the
//   cursor is the (status_time_us, id) of the last record delivered
//   (sdk::ListKey), the next page starts strictly after it; no OFFSET. A page
//   asks for page_size + 1 rows to know whether a next page exists. A due
//   list's order is (due_us, id), its cursor sdk::DueKey.
// - The connection pool is thread-safe (TNX_CAP_THREAD_SAFE). A connection is
//   checked before each use (libpq status, transaction state, and any input
//   that arrived while it was idle: a server that went away sends EOF or a
//   FATAL). A call whose connection breaks fails with TNX_EIO naming the
//   cause; the connection is closed and every other idle connection opened
//   before the failure is reopened on its next use, so once the server is
//   back the next call succeeds without reopening the store. get and list on
//   a reused connection that turns out to be dead are retried once on a new
//   one (they change nothing). A save or delete whose connection breaks
//   after the statement was sent says that its outcome is unknown (the
//   commit may have happened just before). While the server is unreachable
//   each call fails after at most one connection attempt (connect_timeout).
// - A server error maps to: connection errors, statement timeout, disk full,
//   permission denied, deadlock -> TNX_EIO; bad data (encoding, too long a
//   value for an index) -> TNX_EINVAL; a missing table or column (altered
//   underneath) or a row that does not decode -> TNX_ECORRUPT. The message
//   carries the server's text and SQLSTATE.
// - Not supported: transaction-mode connection poolers that do not keep
//   prepared statements per client (PgBouncer before 1.21).
//
// ===========================================================================
// Change feed (ABI 1.4, TNX_CAP_CHANGE_FEED): PostgreSQL LISTEN/NOTIFY
// ===========================================================================
// - Sending: the row trigger "<table>$notify" (pg_sql.hpp
//   Sql::create_notify), added to schema 3 at a read-write open under the
//   schema lock, queues pg_notify(channel, "s <version> <id>" or
//   "d <version> <id>") in the transaction of every insert, update and
//   delete of the table: this plugin's saves and deletes, save_batch, an
//   older plugin on the same table, SQL by hand. PostgreSQL delivers it when
//   the transaction commits and not at all when it rolls back, in commit
//   order: a notice never precedes its commit, and an id's versions arrive
//   in order. A payload of 8000 bytes or more (NOTIFY's limit: an id that
//   long) is sent as "g", which the listener reports as a gap. The channel
//   is "tnx:<table>:<hex hash of the schema>", so stores of other tables or
//   schemas hear nothing of it. A role that may write the table but cannot
//   add the trigger (not the owner) opens it without the feed (capability
//   cleared; the host polls).
// - Listening: watch opens one connection of its own (not from the pool;
//   same URI and defaults) and runs LISTEN before it returns, so every
//   commit from then on is reported; one thread per watched store
//   (pg_listen.hpp) waits on the socket and on an eventfd with poll(),
//   so unwatch and close stop it at once, even while it reconnects. Saves,
//   gets and lists never wait for it. The listening session sets
//   idle_session_timeout to 0 (servers 14 and later).
// - Delay: a notice reaches the sink as the saving transaction's commit
//   reaches its client (measured on one machine: p50 0.4 ms, p99 2-3 ms
//   from the start of the save, the save itself included;
//   tests/postgres/postgres_feed_test.cpp prints it).
// - Lost connection (server restart, failover, pg_terminate_backend, a
//   network failure that TCP keepalives find, after about 25 s with the
//   defaults above): the thread reconnects with a backoff of 50 ms doubling
//   to 2 s, and once LISTEN runs again reports TNX_CHANGE_GAP (what was
//   committed meanwhile is not known: the host re-reads), then changes as
//   before. A connection pooler must give the listener a session of its own
//   (PgBouncer's session mode); in transaction mode LISTEN does not work.
#include "toolnexus/plugin.hpp"

#include "pg_listen.hpp"
#include "pg_sql.hpp"

#include <libpq-fe.h>
#include <poll.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

namespace {

namespace pg = toolnexus::pg;
using toolnexus::sdk::Error;
using toolnexus::sdk::DueKey;
using toolnexus::sdk::ListKey;
using toolnexus::sdk::RecordOut;
using toolnexus::sdk::view;

static_assert(TNX_FILTER_CONTEXT_ID == pg::kByContext && TNX_FILTER_STATE == pg::kByState &&
                  TNX_FILTER_OWNER == pg::kByOwner && TNX_FILTER_TENANT == pg::kByTenant &&
                  TNX_FILTER_AFTER == pg::kAfter && TNX_FILTER_BEFORE == pg::kBefore &&
                  TNX_FILTER_DUE_BEFORE == pg::kDueBefore,
              "pg_sql.hpp filter bits must equal the ABI's");

/// libpq keywords of every connection (the pool's and the change feed's
/// listener), with kConnValues: earlier keywords are defaults the URI
/// (expanded from "dbname", slot kConnUriSlot) may override;
/// client_encoding comes last so that it always wins.
const char *const kConnKeys[] = {"connect_timeout",   "keepalives",       "keepalives_idle",
                                 "keepalives_interval", "keepalives_count", "tcp_user_timeout",
                                 "fallback_application_name", "dbname", "client_encoding", nullptr};
constexpr size_t kConnUriSlot = 7;
constexpr std::array<const char *, 10> kConnValues = {"5", "1", "10", "5", "3", "10000", "toolnexus",
                                                      nullptr, "UTF8", nullptr};

/// Type OIDs of the parameters (pg_type.h).
constexpr Oid kInt8Oid = 20;
constexpr Oid kTextOid = 25;
/// Oldest server with everything used (INSERT ... ON CONFLICT).
constexpr int kMinServerVersion = 90500;
/// Size of the ABI 1.0 tnx_task_record / tnx_list_query: a host may send a
/// later, larger one, never a smaller one.
/// How much longer than the statement timeout the client waits for a reply
/// before it declares the connection dead (the server's cancel must arrive).
constexpr int kClientGraceMs = 2000;

using toolnexus::sdk::quote;

// ===========================================================================
// Secrets and messages
// ===========================================================================

/// Percent-decodes `in` into `out`; false when a '%' is not followed by two
/// hex digits.
bool pct_decode(std::string_view in, std::string &out) {
  out.clear();
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '%') {
      out.push_back(in[i]);
      continue;
    }
    if (i + 2 >= in.size()) return false;
    int h = hex(in[i + 1]), l = hex(in[i + 2]);
    if (h < 0 || l < 0) return false;
    out.push_back(static_cast<char>(h * 16 + l));
    i += 2;
  }
  return true;
}

/// The password texts a message must never contain: from the URI's user
/// info and password= parameter (raw and percent-decoded) and PGPASSWORD.
/// scrub() replaces each by "***".
class Secrets {
 public:
  /// Adds `s` and its percent-decoded form (when it decodes).
  void add(std::string_view s) {
    if (s.empty()) return;
    items_.emplace(s);
    std::string d;
    if (pct_decode(s, d) && !d.empty()) items_.insert(std::move(d));
  }

  /// `msg` with every secret replaced by "***"; longer secrets first, so that
  /// a secret containing another is masked whole.
  std::string scrub(std::string msg) const {
    for (auto it = items_.rbegin(); it != items_.rend(); ++it) {
      const std::string &s = *it;
      for (size_t p = msg.find(s); p != std::string::npos; p = msg.find(s, p + 3)) msg.replace(p, s.size(), "***");
    }
    return msg;
  }

 private:
  struct LongerFirst {
    bool operator()(const std::string &a, const std::string &b) const {
      return a.size() != b.size() ? a.size() < b.size() : a < b;
    }
  };
  std::set<std::string, LongerFirst> items_;  // iterated backwards: longest first
};

/// A libpq message on one line: "\n\t" and newlines become "; ", the double
/// space of "FATAL:  " one, trailing white space goes.
std::string one_line(const char *msg) {
  std::string out;
  for (const char *p = msg == nullptr ? "" : msg; *p != '\0'; ++p) {
    if (*p == '\n') {
      while (p[1] == '\t' || p[1] == ' ') ++p;
      if (p[1] != '\0') out += "; ";
    } else if (*p == ' ' && p[1] == ' ' && !out.empty() && out.back() == ':') {
      continue;
    } else {
      out.push_back(*p);
    }
  }
  while (!out.empty() && (out.back() == ' ' || out.back() == ';')) out.pop_back();
  return out.empty() ? "unknown error" : out;
}

// ===========================================================================
// Selector and options
// ===========================================================================

/// The plugin's own options (tnx_*), defaults applied.
struct Options {
  uint32_t pool = 16;
  uint32_t statement_timeout_ms = 5000;
  std::string table = "tnx_tasks";
};

/// A selector split into what libpq gets and what the plugin keeps.
struct Parsed {
  /// The URI without tnx_ parameters.
  std::string uri;
  Options opt;
};

/// Parses an unsigned decimal in [lo, hi] for option `key`.
uint32_t parse_uint(std::string_view key, std::string_view v, uint32_t lo, uint32_t hi) {
  auto bad = [&] {
    return Error(TNX_EINVAL, "postgres option " + std::string(key) + ": expected an integer " +
                                 std::to_string(lo) + ".." + std::to_string(hi) + ", got " + quote(v));
  };
  if (v.empty() || v.size() > 10) throw bad();
  uint64_t n = 0;
  for (char c : v) {
    if (c < '0' || c > '9') throw bad();
    n = n * 10 + static_cast<uint64_t>(c - '0');
  }
  if (n < lo || n > hi) throw bad();
  return static_cast<uint32_t>(n);
}

/// True for [a-z_][a-z0-9_]{0,kMaxTableName-1}.
bool valid_table(std::string_view t) {
  if (t.empty() || t.size() > pg::kMaxTableName) return false;
  if (!((t[0] >= 'a' && t[0] <= 'z') || t[0] == '_')) return false;
  for (char c : t)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  return true;
}

/// Applies one tnx_ option. `seen` catches repeats.
void set_option(Options &o, std::string_view key, std::string_view raw, bool has_value,
                std::set<std::string> &seen) {
  static const char *kKnown = "tnx_pool, tnx_statement_timeout_ms, tnx_table";
  if (key != "tnx_pool" && key != "tnx_statement_timeout_ms" && key != "tnx_table")
    throw Error(TNX_EINVAL, "unknown postgres option " + quote(key) + " (known: " + kKnown + ")");
  if (!seen.insert(std::string(key)).second)
    throw Error(TNX_EINVAL, "postgres option " + std::string(key) + " given twice");
  if (!has_value) throw Error(TNX_EINVAL, "postgres option " + std::string(key) + " needs =<value>");
  std::string v;
  if (!pct_decode(raw, v))
    throw Error(TNX_EINVAL, "postgres option " + std::string(key) + ": bad percent-encoding in " + quote(raw));
  if (key == "tnx_pool") {
    o.pool = parse_uint(key, v, 1, 64);
  } else if (key == "tnx_statement_timeout_ms") {
    o.statement_timeout_ms = parse_uint(key, v, 0, 3600000);
  } else {
    if (!valid_table(v))
      throw Error(TNX_EINVAL, "postgres option tnx_table: expected [a-z_][a-z0-9_]* of at most " +
                                  std::to_string(pg::kMaxTableName) + " bytes, got " + quote(v));
    o.table = v;
  }
}

/// Splits the selector into the libpq URI and the plugin options, collecting
/// the password texts into `secrets` on the way. Mirrors libpq's URI parser
/// where it matters: the user info ends at the first '@' before any '/', and
/// the query starts at the first '?' after it.
Parsed parse_selector(std::string_view sel, Secrets &secrets) {
  size_t sep = sel.find("://");
  std::string_view scheme = sep == std::string_view::npos ? std::string_view() : sel.substr(0, sep);
  if (scheme != "postgres" && scheme != "postgresql")
    throw Error(TNX_EINVAL,
                "a postgres selector is a URI: postgresql://[user@]host[:port][/dbname][?param=value&...]");
  size_t after_user = sep + 3;
  size_t at = sel.find_first_of("@/", after_user);
  if (at != std::string_view::npos && sel[at] == '@') {
    std::string_view userinfo = sel.substr(after_user, at - after_user);
    size_t colon = userinfo.find(':');
    if (colon != std::string_view::npos) secrets.add(userinfo.substr(colon + 1));
    after_user = at + 1;
  }
  Parsed out;
  size_t qm = sel.find('?', after_user);
  out.uri.assign(sel.substr(0, qm));
  if (qm == std::string_view::npos) return out;
  std::string_view query = sel.substr(qm + 1);
  std::set<std::string> seen;
  std::string kept;
  size_t start = 0;
  while (start <= query.size()) {
    size_t amp = query.find('&', start);
    if (amp == std::string_view::npos) amp = query.size();
    std::string_view param = query.substr(start, amp - start);
    size_t eq = param.find('=');
    std::string_view key = param.substr(0, eq);
    std::string_view value = eq == std::string_view::npos ? std::string_view() : param.substr(eq + 1);
    if (key.substr(0, 4) == "tnx_") {
      set_option(out.opt, key, value, eq != std::string_view::npos, seen);
    } else {
      if (key == "password") secrets.add(value);
      if (!param.empty() || amp < query.size()) {
        kept += kept.empty() ? "" : "&";
        kept.append(param);
      }
    }
    start = amp + 1;
  }
  if (!kept.empty()) out.uri += "?" + kept;
  return out;
}

// ===========================================================================
// libpq helpers
// ===========================================================================

/// Owns a PGresult.
struct ResultFree {
  void operator()(PGresult *r) const noexcept { PQclear(r); }
};
using Result = std::unique_ptr<PGresult, ResultFree>;

/// The binary parameters of one statement. Text is passed as its bytes with
/// an explicit length (format 1: no NUL terminator, no escaping, no copy),
/// bigint as 8 big-endian bytes.
class Params {
 public:
  void text(std::string_view s) {
    if (s.size() > static_cast<size_t>(INT_MAX))
      throw Error(TNX_EINVAL, "a field of " + std::to_string(s.size()) + " bytes is too large for PostgreSQL");
    values_.push_back(s.empty() ? "" : s.data());
    lengths_.push_back(static_cast<int>(s.size()));
    types_.push_back(kTextOid);
  }
  void int8(int64_t v) {
    std::array<char, 8> &b = ints_.emplace_back();
    uint64_t u = static_cast<uint64_t>(v);
    for (int i = 7; i >= 0; --i, u >>= 8) b[static_cast<size_t>(i)] = static_cast<char>(u & 0xff);
    values_.push_back(b.data());
    lengths_.push_back(8);
    types_.push_back(kInt8Oid);
  }
  /// A bigint parameter that is NULL.
  void null_int8() {
    values_.push_back(nullptr);
    lengths_.push_back(0);
    types_.push_back(kInt8Oid);
  }
  int count() const { return static_cast<int>(values_.size()); }
  const char *const *values() const { return values_.data(); }
  const int *lengths() const { return lengths_.data(); }
  /// Every parameter is binary.
  const int *formats() const {
    formats_.assign(values_.size(), 1);
    return formats_.data();
  }
  const Oid *types() const { return types_.data(); }

 private:
  std::vector<const char *> values_;
  std::vector<int> lengths_;
  std::vector<Oid> types_;
  mutable std::vector<int> formats_;
  std::deque<std::array<char, 8>> ints_;  // deque: stable addresses
};

/// A bigint (binary, 8 bytes big-endian) or integer (4 bytes) column; false
/// when NULL or not that size.
bool read_int(const PGresult *r, int row, int col, int64_t &out) {
  if (PQgetisnull(r, row, col)) return false;
  int len = PQgetlength(r, row, col);
  if (len != 8 && len != 4) return false;
  const unsigned char *p = reinterpret_cast<const unsigned char *>(PQgetvalue(r, row, col));
  uint64_t u = 0;
  for (int i = 0; i < len; ++i) u = (u << 8) | p[i];
  if (len == 4) {
    out = static_cast<int32_t>(static_cast<uint32_t>(u));
  } else {
    out = static_cast<int64_t>(u);
  }
  return true;
}

/// A text column (binary format: its bytes).
bool read_text(const PGresult *r, int row, int col, tnx_str &out) {
  if (PQgetisnull(r, row, col)) return false;
  out.data = PQgetvalue(r, row, col);
  out.len = static_cast<uint64_t>(PQgetlength(r, row, col));
  return true;
}

/// Discards server notices (CREATE ... IF NOT EXISTS "already exists, skipping")
/// instead of libpq's default of printing them to stderr.
void ignore_notice(void *, const char *) {}

/// The fixed prepared statements of every connection.
enum Stmt : uint32_t { kGet, kSaveAny, kSaveNone, kSaveCas, kDelAny, kDelCas, kStmtCount };
const char *const kStmtName[kStmtCount] = {"tnx_get", "tnx_save_any", "tnx_save_none",
                                            "tnx_save_cas", "tnx_del_any", "tnx_del_cas"};

/// One pooled connection: the libpq handle (NULL when closed) and what has
/// been prepared on it.
struct Conn {
  PGconn *pg = nullptr;
  /// The store's failure epoch when this connection was opened.
  uint64_t epoch = 0;
  /// Opened for the current call (so not a stale one).
  bool fresh = false;
  /// A save or delete has been sent and its reply not received yet: if the
  /// connection breaks now, the change may or may not have been committed.
  bool write_in_flight = false;
  /// Bit i: kStmtName[i] is prepared.
  uint32_t prepared = 0;
  /// List shapes prepared (see PgStore::list).
  std::unordered_set<uint32_t> lists;
};

/// Thrown when a call's connection broke (the connection is closed by then).
/// Read-only calls on a reused connection retry once on that signal.
struct ConnectionLost : Error {
  using Error::Error;
};

// ===========================================================================
// The store
// ===========================================================================

class PgStore final : public toolnexus::sdk::Store {
 public:
  PgStore(Options opt, std::string uri, std::string target, Secrets secrets)
      : opt_(std::move(opt)),
        uri_(std::move(uri)),
        target_(std::move(target)),
        secrets_(std::move(secrets)),
        sql_(opt_.table) {
    timeout_ms_ = opt_.statement_timeout_ms == 0 ? 0 : static_cast<int>(opt_.statement_timeout_ms) + kClientGraceMs;
    conn_values_ = kConnValues;
    conn_values_[kConnUriSlot] = uri_.c_str();
    // Never reallocated later: release() must not throw.
    conns_.reserve(opt_.pool);
    idle_.reserve(opt_.pool);
  }

  ~PgStore() override { close(); }

  /// Opens the first connection and creates or migrates the table (see the
  /// header comment). Throws Error.
  void setup_schema();

  /// For TNX_OPEN_READ_ONLY: checks, creating and migrating nothing, that
  /// the table holds Tasks at the current schema version. Throws
  /// TNX_ENOTFOUND (no such table), TNX_EUNSUPPORTED (older or newer schema),
  /// TNX_ECORRUPT (a foreign table of that name), TNX_EIO.
  void check_schema();

  /// At open, in the schema transaction on `c` (`create`) or read-only:
  /// finds whether the table has the due column and index, adding them
  /// when missing and `create` (pg::Sql::create_due); sets has_due_. A role
  /// that may not alter the table leaves the store without the due index
  /// (TNX_CAP_DUE_INDEX cleared). Other failures throw Error.
  void setup_due(Conn &c, const std::string &what, bool create);

  /// The fixed statements' SQL, for the schema found at open (has_due_).
  void build_statements() {
    stmt_sql_[kGet] = sql_.get(has_due_);
    stmt_sql_[kSaveAny] = sql_.save_any(has_due_);
    stmt_sql_[kSaveNone] = sql_.save_none(has_due_);
    stmt_sql_[kSaveCas] = sql_.save_cas(has_due_);
    stmt_sql_[kDelAny] = sql_.del_any(has_due_);
    stmt_sql_[kDelCas] = sql_.del_cas(has_due_);
  }

  /// At open, in the schema transaction on `c`: makes sure the change
  /// feed's row trigger exists (pg::Sql::create_notify) and reads the
  /// table's NOTIFY channel. A trigger that cannot be created leaves the
  /// store without a feed (feed_refused()); other failures throw Error.
  void setup_notify(Conn &c, const std::string &what);

  /// Why the store has no change feed ("" when it has one); set by
  /// setup_schema.
  const std::string &feed_refused() const { return feed_refused_; }

  /// ABI 1.5: the table has the due column and its index (pg::Sql::create_due;
  /// added by every read-write open whose role may alter the table). Set at
  /// open, then read only.
  bool keeps_due() const noexcept override { return has_due_; }

  bool get(std::string_view id, const RecordOut &out) override {
    const std::string what = "get of task " + quote(id);
    Params p;
    p.text(id);
    Result r = with_conn(true, [&](Conn &c) { return run(c, kGet, p, what); });
    if (PQntuples(r.get()) == 0) return false;
    out(row_record(r.get(), 0, what));
    return true;
  }

  uint64_t save(const tnx_task_record &rec, uint64_t expected) override {
    return save_with(rec, expected, [&](Stmt s, const Params &p, const std::string &what) {
      return with_conn(false, [&](Conn &c) { return run(c, s, p, what); });
    });
  }

  // After a committed batch of at least kAnalyzeBatch records that is
  // more than a tenth of what the planner believes the table holds (or the
  // table was never analyzed): ANALYZE now, as PostgreSQL advises after a
  // bulk load. Without statistics the planner took the tenant index and a
  // sort of every row for a ListTasks page: 27 ms instead of 0.4 ms at
  // 50,000 imported Tasks, until autovacuum came by. Best effort: the batch
  // is committed whatever happens here (a role that does not own the table
  // may not ANALYZE it; autovacuum still will).
  static constexpr uint64_t kAnalyzeBatch = 1000;
  void analyze_after_bulk(Conn &c, uint64_t n) {
    if (n < kAnalyzeBatch) return;
    try {
      const std::string quoted = pg::quote_ident(sql_.table());  // Params borrows it
      Params p;
      p.text(quoted);
      Result r = exec_sql(c, pg::Sql::row_estimate(), p, "row estimate of " + sql_.table(), timeout_ms_);
      int64_t rows = -1;
      if (PQntuples(r.get()) == 1 && !read_int(r.get(), 0, 0, rows)) return;
      if (rows >= 0 && n * 10 <= static_cast<uint64_t>(rows)) return;
      exec_sql(c, sql_.analyze(), Params(), "ANALYZE of " + sql_.table(), timeout_ms_);
    } catch (const Error &) {
    }
  }

  // Runs `body` between BEGIN and COMMIT on `c`; anything it throws (or a
  // failed COMMIT) rolls back, dropping the connection when even that
  // fails (closing it rolls back on the server). A connection lost during
  // COMMIT leaves the outcome unknown (exec's write = true says so).
  template <class Body>
  void in_transaction(Conn &c, const std::string &what, Body &&body) {
    const Params none;
    exec_sql(c, "BEGIN", none, what, timeout_ms_);
    try {
      body();
      Result r = exec(c, what, timeout_ms_, true, [&](PGconn *pg) {
        return PQsendQueryParams(pg, "COMMIT", 0, nullptr, nullptr, nullptr, nullptr, 1);
      });
      check(c, std::move(r), what);
    } catch (...) {
      if (c.pg != nullptr) {
        try {
          exec_sql(c, "ROLLBACK", none, what, timeout_ms_);
        } catch (...) {
          drop(c, false);
        }
      }
      throw;
    }
  }

  // ABI 1.3: one transaction on one connection; the first record that does
  // not go through rolls the whole back.
  void save_batch(const tnx_task_record *const *recs, const uint64_t *expected, uint64_t n,
                  uint64_t *out) override {
    if (n == 0) return;
    const std::string what = "save of a batch of " + std::to_string(n) + " task(s)";
    uint64_t at = n;
    try {
      with_conn(false, [&](Conn &c) {
        in_transaction(c, what, [&] {
          for (uint64_t i = 0; i < n; ++i) {
            at = i;
            out[i] = save_with(*recs[i], expected[i], [&](Stmt s, const Params &p, const std::string &w) {
              return run(c, s, p, w);
            });
          }
          at = n;
        });
        analyze_after_bulk(c, n);
        return Result();
      });
    } catch (const Error &e) {
      throw toolnexus::sdk::BatchError(at, e.code,
                                       at < n ? e.message + " (record " + std::to_string(at) +
                                                    " of the batch; nothing written)"
                                              : e.message);
    }
  }

  // ABI 1.5: like save_batch, one transaction on one connection, the
  // records pulled from the host one at a time (bounded memory however
  // many). Only with TNX_SAVE_STREAM_ONE_TRANSACTION: without it the host
  // saves one by one (each its own transaction), which is what a stream
  // without it could do here anyway.
  uint64_t save_stream(toolnexus::sdk::RecordSource &source, uint32_t flags) override {
    if ((flags & TNX_SAVE_STREAM_ONE_TRANSACTION) == 0)
      throw Error(TNX_EUNSUPPORTED, "save of a stream: only in one transaction (the host saves one by one)");
    const std::string what = "save of a stream of tasks";
    uint64_t at = 0, n = 0;
    try {
      with_conn(false, [&](Conn &c) {
        in_transaction(c, what, [&] {
          for (;;) {
            at = source.delivered();
            uint64_t expected = TNX_VERSION_ANY;
            const tnx_task_record *rec = source.next(expected);  // SourceStopped, BatchError
            if (rec == nullptr) break;
            at = source.delivered() - 1;
            (void)save_with(*rec, expected, [&](Stmt st, const Params &p, const std::string &w) {
              return run(c, st, p, w);
            });
            ++n;
          }
          at = n;
        });
        analyze_after_bulk(c, n);
        return Result();
      });
    } catch (const toolnexus::sdk::SourceStopped &) {
      throw;
    } catch (const toolnexus::sdk::BatchError &) {
      throw;
    } catch (const Error &e) {
      throw toolnexus::sdk::BatchError(at, e.code,
                                       at + 1 == source.delivered()
                                           ? e.message + " (record " + std::to_string(at) +
                                                 " of the stream; nothing written)"
                                           : e.message);
    }
    return n;
  }

  void del(std::string_view id, uint64_t expected) override {
    const std::string what = "delete of task " + quote(id);
    Params p;
    p.text(id);
    if (expected == TNX_VERSION_ANY) {
      Result r = with_conn(false, [&](Conn &c) { return run(c, kDelAny, p, what); });
      if (PQntuples(r.get()) == 0) throw Error(TNX_ENOTFOUND, "no task with id " + quote(id));
      return;
    }
    // An expected version no bigint can equal (or NONE: "must not exist")
    // still runs the statement, to tell not-found from conflict.
    p.int8(expected > static_cast<uint64_t>(INT64_MAX) ? 0 : static_cast<int64_t>(expected));
    Result r = with_conn(false, [&](Conn &c) { return run(c, kDelCas, p, what); });
    int64_t v = 0;
    if (PQntuples(r.get()) == 1 && read_int(r.get(), 0, 0, v)) return;
    if (PQntuples(r.get()) == 1 && PQgetisnull(r.get(), 0, 1)) throw Error(TNX_ENOTFOUND, "no task with id " + quote(id));
    throw Error(TNX_ECONFLICT,
                what + ": expected version " + std::to_string(expected) + ", " + stored(r.get(), expected));
  }

  std::string list(const tnx_list_query &q, const RecordOut &out) override {
    if ((q.filter_flags & ~pg::kAllFilters) != 0)
      throw Error(TNX_EUNSUPPORTED,
                  "list: unknown filter_flags bits " + std::to_string(q.filter_flags & ~pg::kAllFilters));
    const uint32_t limit = toolnexus::sdk::page_size(q);
    const uint32_t filters = q.filter_flags;
    const bool has_cursor = q.cursor.len != 0;
    const bool omit = q.omit_json != 0;
    const bool due_list = (filters & pg::kDueBefore) != 0;
    ListKey key;
    DueKey due_key;
    if (has_cursor && due_list) due_key = DueKey::decode(view(q.cursor));
    else if (has_cursor) key = ListKey::decode(view(q.cursor));
    Params p;
    if (filters & pg::kByContext) p.text(view(q.context_id));
    if (filters & pg::kByState) p.text(view(q.state));
    if (filters & pg::kByOwner) p.text(view(q.owner));
    if (filters & pg::kByTenant) p.text(view(q.tenant));
    if (filters & pg::kAfter) p.int8(q.after_us);
    if (filters & pg::kBefore) p.int8(q.before_us);
    if (filters & pg::kDueBefore) p.int8(q.due_before_us);
    if (has_cursor && due_list) {
      p.int8(due_key.due_us);
      p.text(due_key.id);
    } else if (has_cursor) {
      p.int8(key.time_us);
      p.text(key.id);
    }
    p.int8(static_cast<int64_t>(limit) + 1);
    // Shape of the statement: filter bits, then cursor and omit_json.
    const uint32_t shape = filters | (has_cursor ? 1u << 7 : 0u) | (omit ? 1u << 8 : 0u);
    Result r = with_conn(true, [&](Conn &c) {
      const std::string name = "tnx_list_" + std::to_string(shape);
      if (c.lists.count(shape) == 0) {
        prepare(c, name.c_str(), sql_.list(filters, has_cursor, omit, has_due_), p, "list");
        c.lists.insert(shape);
      }
      return exec_prepared(c, name.c_str(), p, "list");
    });
    // ABI 1.1: deliver rows that do not decode instead of failing the page.
    const bool deliver_corrupt =
        TNX_HAS_FIELD(&q, tnx_list_query, deliver_corrupt) && q.deliver_corrupt != 0;
    const int rows = PQntuples(r.get());
    ListKey last;
    DueKey due_last;
    std::string problem;
    for (int i = 0; i < rows; ++i) {
      // One more row: a next page exists.
      if (static_cast<uint32_t>(i) == limit) return due_list ? due_last.encode() : last.encode();
      tnx_task_record rec;
      try {
        rec = row_record(r.get(), i, "list");
      } catch (const Error &e) {
        if (!deliver_corrupt || e.code != TNX_ECORRUPT) throw;
        rec = corrupt_record(r.get(), i);
        problem = e.message;
        rec.problem = toolnexus::sdk::str(problem);
      }
      if (!out(rec)) return std::string();
      last.time_us = rec.status_time_us;
      last.id.assign(view(rec.id));
      due_last.due_us = rec.due_us;
      due_last.id.assign(view(rec.id));
    }
    return std::string();
  }

  /// count (ABI 1.3): see pg::Sql::count: a sum of counters for the
  /// owner/tenant/state filters, an index count for the others.
  uint64_t count(const tnx_list_query &q) override {
    if ((q.filter_flags & ~pg::kAllFilters) != 0)
      throw Error(TNX_EUNSUPPORTED,
                  "count: unknown filter_flags bits " + std::to_string(q.filter_flags & ~pg::kAllFilters));
    const uint32_t filters = q.filter_flags;
    const bool counters =
        have_counts_ && (filters & (pg::kByContext | pg::kAfter | pg::kBefore | pg::kDueBefore)) == 0;
    Params p;
    if (filters & pg::kByContext) p.text(view(q.context_id));
    if (filters & pg::kByState) p.text(view(q.state));
    if (filters & pg::kByOwner) p.text(view(q.owner));
    if (filters & pg::kByTenant) p.text(view(q.tenant));
    if (filters & pg::kAfter) p.int8(q.after_us);
    if (filters & pg::kBefore) p.int8(q.before_us);
    if (filters & pg::kDueBefore) p.int8(q.due_before_us);
    // Count shapes share the connection's set of prepared list shapes,
    // above the 9 bits list uses.
    const uint32_t shape = (1u << 9) | filters;
    Result r = with_conn(true, [&](Conn &c) {
      const std::string name = "tnx_count_" + std::to_string(filters);
      if (c.lists.count(shape) == 0) {
        prepare(c, name.c_str(), sql_.count(filters, counters), p, "count");
        c.lists.insert(shape);
      }
      return exec_prepared(c, name.c_str(), p, "count");
    });
    int64_t n = 0;
    if (PQntuples(r.get()) != 1 || !read_int(r.get(), 0, 0, n) || n < 0)
      throw Error(TNX_ECORRUPT, "count of table " + opt_.table + " in " + target_ +
                                    " gave no count (a counter table altered by hand?)");
    return static_cast<uint64_t>(n);
  }

  /// ABI 1.4: starts the change feed: a Listener (pg_listen.hpp) with a
  /// connection of its own LISTENs on the table's channel before this
  /// returns, so every commit from then on is heard. Throws
  /// TNX_EUNSUPPORTED when the trigger could not be created at open,
  /// TNX_EINVAL when a feed runs, TNX_EIO when the listening connection
  /// cannot be made.
  void watch(tnx_change_sink sink, void *ctx) override {
    std::lock_guard<std::mutex> l(feed_mu_);
    if (!feed_refused_.empty()) throw Error(TNX_EUNSUPPORTED, feed_refused_);
    feed_.start(sink, ctx);
    try {
      pg::Listener::Setup setup;
      setup.keys = kConnKeys;
      setup.values = conn_values_.data();
      setup.channel = channel_;
      setup.target = target_;
      setup.message = [this](const char *m) { return secrets_.scrub(one_line(m)); };
      auto listener = std::make_unique<pg::Listener>(std::move(setup), feed_);
      listener->start();
      listener_ = std::move(listener);
    } catch (...) {
      feed_.stop();
      throw;
    }
  }

  /// ABI 1.4: stops the listener's thread (at once: it waits on an eventfd
  /// too) and closes its connection; the sink is not called afterwards.
  void unwatch() override {
    std::lock_guard<std::mutex> l(feed_mu_);
    if (listener_ == nullptr) throw Error(TNX_EINVAL, "unwatch: no change feed runs");
    listener_.reset();
    feed_.stop();
  }

  /// Stops a running feed and closes every connection (idempotent; no call
  /// is running by contract).
  void close() override {
    {
      std::lock_guard<std::mutex> l(feed_mu_);
      listener_.reset();
      feed_.stop();
    }
    std::lock_guard<std::mutex> l(mu_);
    for (auto &c : conns_)
      if (c->pg != nullptr) {
        PQfinish(c->pg);
        c->pg = nullptr;
      }
  }

 private:
  /// save's statement choice and result checks; `exec(stmt, params, what)`
  /// runs a fixed statement and returns its result.
  template <class Exec>
  uint64_t save_with(const tnx_task_record &rec, uint64_t expected, Exec &&exec_stmt) {
    const std::string what = "save of task " + quote(view(rec.id));
    Params p;
    p.text(view(rec.id));
    p.text(view(rec.context_id));
    p.text(view(rec.state));
    p.int8(rec.status_time_us);
    p.text(view(rec.owner));
    p.text(view(rec.tenant));
    p.text(view(rec.task_json));
    if (has_due_) {
      const int64_t due = toolnexus::sdk::due_of(rec);
      if (due == TNX_TIME_NONE) p.null_int8();  // nothing due
      else p.int8(due);
    }
    if (expected == TNX_VERSION_ANY || expected == TNX_VERSION_NONE) {
      Stmt s = expected == TNX_VERSION_ANY ? kSaveAny : kSaveNone;
      Result r = exec_stmt(s, p, what);
      if (PQntuples(r.get()) == 0)
        throw Error(TNX_ECONFLICT, what + ": expected no stored task (create only), but one exists");
      return new_version(r.get(), 0, what);
    }
    if (expected > static_cast<uint64_t>(INT64_MAX))
      throw Error(TNX_ECONFLICT, what + ": expected version " + std::to_string(expected) + " cannot be stored");
    p.int8(static_cast<int64_t>(expected));
    Result r = exec_stmt(kSaveCas, p, what);
    int64_t v = 0;
    if (PQntuples(r.get()) == 1 && read_int(r.get(), 0, 0, v)) return checked_version(v, what);
    throw Error(TNX_ECONFLICT,
                what + ": expected version " + std::to_string(expected) + ", " + stored(r.get(), expected));
  }

  /// A connection taken from the pool; returns it on destruction.
  class Lease {
   public:
    Lease(PgStore *s, Conn *c) noexcept : s_(s), c_(c) {}
    Lease(Lease &&o) noexcept : s_(o.s_), c_(std::exchange(o.c_, nullptr)) {}
    Lease(const Lease &) = delete;
    Lease &operator=(const Lease &) = delete;
    Lease &operator=(Lease &&) = delete;
    ~Lease() {
      if (c_ != nullptr) s_->release(c_);
    }
    Conn &operator*() const noexcept { return *c_; }
    Conn *operator->() const noexcept { return c_; }

   private:
    PgStore *s_;
    Conn *c_;
  };

  /// Takes a free connection (waiting while all tnx_pool are busy) and makes
  /// sure it is open and healthy (see ready()). Throws Error(TNX_EIO) when
  /// the server cannot be reached.
  Lease acquire() {
    Conn *c = nullptr;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return !idle_.empty() || conns_.size() < opt_.pool; });
      if (!idle_.empty()) {
        c = idle_.back();  // LIFO: the most recently used is the likeliest alive
        idle_.pop_back();
      } else {
        conns_.push_back(std::make_unique<Conn>());
        c = conns_.back().get();
      }
    }
    Lease lease(this, c);
    ready(*c);
    return lease;
  }

  void release(Conn *c) noexcept {
    {
      std::lock_guard<std::mutex> l(mu_);
      idle_.push_back(c);
    }
    // notify_all: glibc < 2.41 can lose a notify_one (sourceware bug 25847);
    // waiters exist only while the pool is exhausted.
    cv_.notify_all();
  }

  /// Runs `f(conn)` on a pooled connection. A read-only call (`idempotent`)
  /// whose reused connection turns out dead is retried once on a new one.
  template <class F>
  Result with_conn(bool idempotent, F &&f) {
    for (int attempt = 0;; ++attempt) {
      Lease l = acquire();
      try {
        return f(*l);
      } catch (const ConnectionLost &) {
        if (!idempotent || attempt > 0 || l->fresh) throw;
      }
    }
  }

  /// Closes a broken or suspect connection. `failed`: it broke during a call,
  /// so every connection opened before now is suspect too (server restart)
  /// and is reopened on its next use.
  void drop(Conn &c, bool failed) noexcept {
    if (c.pg != nullptr) PQfinish(c.pg);
    c.pg = nullptr;
    c.prepared = 0;
    c.lists.clear();
    if (failed) epoch_.fetch_add(1);
  }

  /// True when an idle connection looks usable: libpq says OK, no
  /// transaction is open, and nothing but notices arrived while it was idle
  /// (a server that shut down sends a FATAL and/or EOF, which
  /// PQconsumeInput turns into CONNECTION_BAD).
  static bool healthy(PGconn *pg) {
    if (PQstatus(pg) != CONNECTION_OK || PQtransactionStatus(pg) != PQTRANS_IDLE) return false;
    for (int i = 0; i < 4; ++i) {
      pollfd p{PQsocket(pg), POLLIN, 0};
      if (p.fd < 0) return false;
      int n = ::poll(&p, 1, 0);
      if (n == 0) return true;
      if (n < 0) return errno == EINTR;
      if ((p.revents & (POLLERR | POLLNVAL)) != 0) return false;
      if (!PQconsumeInput(pg) || PQstatus(pg) != CONNECTION_OK) return false;
      if ((p.revents & POLLHUP) != 0) return false;
    }
    return PQstatus(pg) == CONNECTION_OK;
  }

  /// Makes `c` open and healthy: reopens it when it was opened before the
  /// last failure or looks broken.
  void ready(Conn &c) {
    const uint64_t e = epoch_.load();
    if (c.pg != nullptr && (c.epoch != e || !healthy(c.pg))) drop(c, false);
    c.fresh = false;
    if (c.pg != nullptr) return;
    connect(c);
    c.epoch = e;
    c.fresh = true;
  }

  /// Opens `c`: connects with the plugin's libpq defaults, checks the server,
  /// and applies the session settings (statement_timeout, durable commits).
  void connect(Conn &c) {
    const std::string timeout = std::to_string(opt_.statement_timeout_ms);
    PGconn *pg = PQconnectdbParams(kConnKeys, conn_values_.data(), 1);
    if (pg == nullptr) throw Error(TNX_EINTERNAL, "out of memory allocating a libpq connection");
    if (PQstatus(pg) != CONNECTION_OK) {
      std::string msg = secrets_.scrub(one_line(PQerrorMessage(pg)));
      PQfinish(pg);
      throw Error(TNX_EIO, "cannot connect to " + target_ + ": " + msg);
    }
    PQsetNoticeProcessor(pg, &ignore_notice, nullptr);
    c.pg = pg;
    c.prepared = 0;
    c.lists.clear();
    const int version = PQserverVersion(pg);
    const char *enc = PQparameterStatus(pg, "server_encoding");
    std::string encoding = enc == nullptr ? "" : enc;
    if (version < kMinServerVersion || (encoding != "UTF8" && encoding != "SQL_ASCII")) {
      drop(c, false);
      throw Error(TNX_EUNSUPPORTED, "server of " + target_ + " is not usable: needs PostgreSQL >= 9.5 with a UTF8 "
                                    "database, found version " + std::to_string(version) + ", encoding " +
                                    (encoding.empty() ? "unknown" : encoding));
    }
    if (PQsetnonblocking(pg, 1) != 0) {
      std::string msg = secrets_.scrub(one_line(PQerrorMessage(pg)));
      drop(c, false);
      throw Error(TNX_EIO, "cannot set up a connection to " + target_ + ": " + msg);
    }
    Params p;
    p.text(timeout);
    exec_sql(c,
             "SELECT set_config('statement_timeout', $1, false),"
             " CASE WHEN current_setting('synchronous_commit') = 'off'"
             " THEN set_config('synchronous_commit', 'on', false) END",
             p, "session setup", timeout_ms_);
  }

  /// Throws ConnectionLost(TNX_EIO) after closing `c`.
  [[noreturn]] void lost(Conn &c, const std::string &what, const std::string &why) {
    std::string msg = secrets_.scrub(why) + unknown_outcome(c);
    drop(c, true);
    throw ConnectionLost(TNX_EIO, what + " on " + target_ + ": connection lost: " + msg);
  }

  /// What a failure message must add when a write was in flight (ABI: after
  /// the point of no return the outcome is unknown).
  static std::string unknown_outcome(Conn &c) {
    if (!c.write_in_flight) return "";
    c.write_in_flight = false;
    return "; the outcome is unknown: the change may or may not have been committed (read the task to "
           "find out)";
  }

  /// Waits until the socket of `c` is ready for `events`, or fails the call
  /// (closing the connection) when `deadline` passes first.
  void wait(Conn &c, short events, std::chrono::steady_clock::time_point deadline, const std::string &what) {
    for (;;) {
      int ms = -1;
      if (deadline != std::chrono::steady_clock::time_point::max()) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
        ms = left.count() <= 0 ? 0 : static_cast<int>(left.count());
      }
      pollfd p{PQsocket(c.pg), events, 0};
      if (p.fd < 0) lost(c, what, "no socket");
      int n = ::poll(&p, 1, ms);
      if (n > 0) return;
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) lost(c, what, std::string("poll failed: ") + std::strerror(errno));
      // A silent server is not a stale connection: no retry (plain Error).
      const std::string outcome = unknown_outcome(c);
      drop(c, true);
      throw Error(TNX_EIO, what + " on " + target_ + ": no reply from the server within " +
                               std::to_string(timeout_ms_) + " ms; connection closed" + outcome);
    }
  }

  /// Sends one request with `send` (a PQsend* call) on the non-blocking
  /// connection `c` and collects its result, waiting at most `timeout_ms`
  /// (0 = no limit). Returns the first error result, else the last result.
  /// A broken connection throws ConnectionLost. `write`: the request changes
  /// data (a failure after sending it leaves the outcome unknown).
  template <class Send>
  Result exec(Conn &c, const std::string &what, int timeout_ms, bool write, Send &&send) {
    using clock = std::chrono::steady_clock;
    const clock::time_point deadline =
        timeout_ms > 0 ? clock::now() + std::chrono::milliseconds(timeout_ms) : clock::time_point::max();
    PGconn *pg = c.pg;
    c.write_in_flight = false;
    if (!send(pg)) lost(c, what, one_line(PQerrorMessage(pg)));
    c.write_in_flight = write;
    for (;;) {
      int f = PQflush(pg);
      if (f == 0) break;
      if (f < 0) lost(c, what, one_line(PQerrorMessage(pg)));
      wait(c, POLLIN | POLLOUT, deadline, what);
      if (!PQconsumeInput(pg)) lost(c, what, one_line(PQerrorMessage(pg)));
    }
    Result first;
    for (;;) {
      while (PQisBusy(pg)) {
        wait(c, POLLIN, deadline, what);
        if (!PQconsumeInput(pg)) lost(c, what, one_line(PQerrorMessage(pg)));
      }
      Result r(PQgetResult(pg));
      if (!r) break;
      const ExecStatusType st = PQresultStatus(r.get());
      const bool ok = st == PGRES_TUPLES_OK || st == PGRES_COMMAND_OK;
      if (!first || (!ok && (PQresultStatus(first.get()) == PGRES_TUPLES_OK ||
                             PQresultStatus(first.get()) == PGRES_COMMAND_OK)))
        first = std::move(r);
    }
    if (!first) lost(c, what, one_line(PQerrorMessage(pg)));
    if (PQstatus(pg) == CONNECTION_OK) c.write_in_flight = false;  // else check() reports it
    return first;
  }

  /// Returns `r` when it is a success; otherwise maps the error (see the
  /// header comment) and throws.
  Result check(Conn &c, Result r, const std::string &what) {
    const ExecStatusType st = PQresultStatus(r.get());
    if (st == PGRES_TUPLES_OK || st == PGRES_COMMAND_OK) return r;
    const char *state = PQresultErrorField(r.get(), PG_DIAG_SQLSTATE);
    const std::string code = state == nullptr ? "" : state;
    const char *primary = PQresultErrorField(r.get(), PG_DIAG_MESSAGE_PRIMARY);
    std::string msg = secrets_.scrub(one_line(primary != nullptr ? primary : PQresultErrorMessage(r.get())));
    if (PQstatus(c.pg) == CONNECTION_BAD || code.rfind("08", 0) == 0 || code == "57P01" || code == "57P02" ||
        code == "57P03")
      lost(c, what, msg + (code.empty() ? "" : " (SQLSTATE " + code + ")"));
    tnx_status s = TNX_EIO;
    if (code == "57014") {
      msg = "statement timeout of " + std::to_string(opt_.statement_timeout_ms) +
            " ms exceeded (tnx_statement_timeout_ms): " + msg;
    } else if (code.rfind("22", 0) == 0 || code.rfind("54", 0) == 0) {
      s = TNX_EINVAL;  // data exception, program limit (value too large for an index)
    } else if (code == "42P01" || code == "42703" || code == "42804" || code == "XX001" || code == "XX002") {
      s = TNX_ECORRUPT;  // table or column gone or changed underneath; data corrupted
      msg = "table " + opt_.table + " is missing or not in the expected shape: " + msg;
    } else if (code.rfind("42", 0) == 0 && code != "42501") {
      s = TNX_EINTERNAL;  // a statement of this plugin the server did not accept
    }
    throw Error(s, what + " on " + target_ + ": " + msg + (code.empty() ? "" : " (SQLSTATE " + code + ")"));
  }

  /// Runs an unprepared statement with binary parameters and results.
  Result exec_sql(Conn &c, const std::string &sql, const Params &p, const std::string &what, int timeout_ms) {
    Result r = exec(c, what, timeout_ms, false, [&](PGconn *pg) {
      return PQsendQueryParams(pg, sql.c_str(), p.count(), p.types(), p.values(), p.lengths(), p.formats(), 1);
    });
    return check(c, std::move(r), what);
  }

  /// Prepares `sql` as `name` on `c` with the parameter types of `p`.
  void prepare(Conn &c, const char *name, const std::string &sql, const Params &p, const std::string &what) {
    Result r = exec(c, what, timeout_ms_, false,
                    [&](PGconn *pg) { return PQsendPrepare(pg, name, sql.c_str(), p.count(), p.types()); });
    check(c, std::move(r), what);
  }

  /// Executes the prepared statement `name`.
  Result exec_prepared(Conn &c, const char *name, const Params &p, const std::string &what, bool write = false) {
    Result r = exec(c, what, timeout_ms_, write, [&](PGconn *pg) {
      return PQsendQueryPrepared(pg, name, p.count(), p.values(), p.lengths(), p.formats(), 1);
    });
    return check(c, std::move(r), what);
  }

  /// Runs fixed statement `s`, preparing it on `c` first if needed.
  Result run(Conn &c, Stmt s, const Params &p, const std::string &what) {
    if ((c.prepared & (1u << s)) == 0) {
      prepare(c, kStmtName[s], stmt_sql_[s], p, what);
      c.prepared |= 1u << s;
    }
    return exec_prepared(c, kStmtName[s], p, what, s != kGet);
  }

  /// Validates a version read back from the table.
  uint64_t checked_version(int64_t v, const std::string &what) const {
    if (v < 1) throw Error(TNX_ECORRUPT, what + ": table " + opt_.table + " holds version " + std::to_string(v));
    return static_cast<uint64_t>(v);
  }

  /// The version in column 0 of row `row`.
  uint64_t new_version(const PGresult *r, int row, const std::string &what) const {
    int64_t v = 0;
    if (!read_int(r, row, 0, v)) throw Error(TNX_ECORRUPT, what + ": no version returned");
    return checked_version(v, what);
  }

  /// "stored N" / "no such task" from column 1 of a CAS result that
  /// expected version `expected`. Column 1 is read in the statement's
  /// snapshot: when it still shows `expected`, a save that committed while
  /// the UPDATE waited for the row lock replaced it, and the text says so.
  static std::string stored(const PGresult *r, uint64_t expected) {
    int64_t v = 0;
    if (PQntuples(r) != 1 || !read_int(r, 0, 1, v)) return "but there is no such task";
    if (v >= 0 && static_cast<uint64_t>(v) == expected)
      return "but a concurrent save replaced version " + std::to_string(v) + " while this one waited for the row";
    return "stored " + std::to_string(v);
  }

  /// Columns of a get or list row: 8, and due_us with the due column.
  int row_fields() const noexcept { return has_due_ ? 9 : 8; }

  /// The due time of a row (column 8; NULL or no such column: none).
  int64_t row_due(const PGresult *r, int row) const {
    int64_t due = TNX_TIME_NONE;
    if (has_due_ && PQnfields(r) == 9 && !read_int(r, row, 8, due)) due = TNX_TIME_NONE;
    return due;
  }

  /// A row of (id, context_id, state, status_time_us, owner, tenant,
  /// task_json, version[, due_us]) as a record borrowing the result's memory.
  tnx_task_record row_record(const PGresult *r, int row, const std::string &what) const {
    tnx_task_record rec{};
    rec.header = tnx_header(sizeof rec);
    int64_t v = 0;
    bool ok = PQnfields(r) == row_fields() && read_text(r, row, 0, rec.id) && read_text(r, row, 1, rec.context_id) &&
              read_text(r, row, 2, rec.state) && read_int(r, row, 3, rec.status_time_us) &&
              read_text(r, row, 4, rec.owner) && read_text(r, row, 5, rec.tenant) &&
              read_text(r, row, 6, rec.task_json) && read_int(r, row, 7, v) && v >= 1 && rec.id.len != 0;
    if (!ok)
      throw Error(TNX_ECORRUPT, what + ": row " + std::to_string(row) + " of table " + opt_.table + " in " +
                                    target_ + " does not decode");
    rec.version = static_cast<uint64_t>(v);
    rec.due_us = row_due(r, row);
    return rec;
  }

  /// A row that does not decode, as ABI 1.1 deliver_corrupt wants it: its
  /// id (or "<table> row <n>" when even that is unreadable), no state or
  /// context, TNX_TIME_NONE, version 0, the raw task_json bytes if any, its
  /// due time (which the due filter already passed).
  tnx_task_record corrupt_record(const PGresult *r, int row) {
    tnx_task_record rec{};
    rec.header = tnx_header(sizeof rec);
    rec.status_time_us = TNX_TIME_NONE;
    if (PQnfields(r) != row_fields() || !read_text(r, row, 0, rec.id) || rec.id.len == 0) {
      corrupt_name_ = opt_.table + " row " + std::to_string(row);
      rec.id = toolnexus::sdk::str(corrupt_name_);
    }
    if (PQnfields(r) == row_fields()) read_text(r, row, 6, rec.task_json);
    rec.due_us = row_due(r, row);
    return rec;
  }

  const Options opt_;
  /// The table is at schema 3 (has the counters); false for a schema 2
  /// table opened read-only. Set at open, then read only.
  bool have_counts_ = true;
  /// See keeps_due(). Set at open (before build_statements), then read only.
  bool has_due_ = false;
  const std::string uri_;     // for libpq; may contain a password: never shown
  const std::string target_;  // "postgresql://user@host:port/db table t", for messages
  const Secrets secrets_;
  const pg::Sql sql_;
  std::array<std::string, kStmtCount> stmt_sql_;
  int timeout_ms_ = 0;  // client-side wait for a reply (0 = none)

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Conn>> conns_;  // every connection slot (<= opt_.pool)
  std::vector<Conn *> idle_;                  // slots not leased now
  /// Bumped whenever a connection breaks during a call: connections opened
  /// before are reopened at their next use.
  std::atomic<uint64_t> epoch_{0};
  /// libpq values of kConnKeys, the URI in kConnUriSlot (borrows uri_).
  std::array<const char *, 10> conn_values_{};

  /// The change feed (ABI 1.4). channel_ and feed_refused_ are set at open,
  /// then read only; listener_ is guarded by feed_mu_.
  std::string channel_;
  /// Why this store has no feed (the trigger could not be created), or "".
  std::string feed_refused_;
  std::mutex feed_mu_;
  toolnexus::sdk::ChangeFeed feed_;
  std::unique_ptr<pg::Listener> listener_;

  /// Backs the id of a corrupt_record() while it is delivered. Only list
  /// writes it, and only for a row that does not decode (never seen in
  /// practice: the server enforces the column types); thread_local so that
  /// concurrent lists do not share it.
  static thread_local std::string corrupt_name_;
};

thread_local std::string PgStore::corrupt_name_;

void PgStore::check_schema() {
  Lease l = acquire();
  Conn &c = *l;
  const std::string what = "schema check of table " + opt_.table;
  const std::string at = "table " + opt_.table + " in " + target_;
  auto table_exists = [&](const std::string &name) {
    Params n;
    n.text(name);
    Result r = exec_sql(c,
                        "SELECT count(*) FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n"
                        " ON n.oid = c.relnamespace WHERE n.nspname = current_schema() AND c.relname = $1",
                        n, what, timeout_ms_);
    int64_t count = 0;
    read_int(r.get(), 0, 0, count);
    return count != 0;
  };
  Params t;
  t.text(opt_.table);
  int64_t version = 0;
  if (table_exists(pg::kMetaTable)) {
    Result vr = exec_sql(c, std::string("SELECT version FROM ") + pg::kMetaTable + " WHERE table_name = $1", t,
                         what, timeout_ms_);
    if (PQntuples(vr.get()) == 1 && !read_int(vr.get(), 0, 0, version))
      throw Error(TNX_ECORRUPT, what + ": unreadable row in " + pg::kMetaTable);
  }
  const bool exists = table_exists(opt_.table);
  if (version == 0 && !exists)
    throw Error(TNX_ENOTFOUND, "no toolnexus task " + at + " (opened read-only, so it was not created)");
  if (version == 0)
    throw Error(TNX_ECORRUPT, at + " exists but is not a toolnexus task table (no row in " + pg::kMetaTable +
                                  "); choose another tnx_table");
  if (!exists || version < 0)
    throw Error(TNX_ECORRUPT, at + " is recorded at schema version " + std::to_string(version) + " in " +
                                  pg::kMetaTable + " but " + (version < 0 ? "that is invalid" : "does not exist"));
  // Schema 2 lacks only the counters: read as it is (count scans).
  if (version == 2) have_counts_ = false;
  if (version != pg::kSchemaVersion && version != 2)
    throw Error(TNX_EUNSUPPORTED,
                at + " has schema version " + std::to_string(version) + "; this plugin reads version " +
                    std::to_string(pg::kSchemaVersion) +
                    (version < pg::kSchemaVersion ? " (open it read-write once to migrate it)"
                                                  : ": upgrade the toolnexus postgres plugin"));
  setup_due(c, what, false);
  build_statements();
}

void PgStore::setup_schema() {
  Lease l = acquire();
  Conn &c = *l;
  const std::string what = "schema setup of table " + opt_.table;
  const Params none;
  auto sql = [&](const std::string &text, int timeout_ms) { return exec_sql(c, text, none, what, timeout_ms); };
  try {
    sql("BEGIN", timeout_ms_);
    sql("SELECT pg_advisory_xact_lock(" + std::to_string(pg::kSchemaLockKey) + ")", timeout_ms_);
    sql(pg::Sql::create_meta(), timeout_ms_);
    Params t;
    t.text(opt_.table);
    Result vr = exec_sql(c, std::string("SELECT version FROM ") + pg::kMetaTable + " WHERE table_name = $1", t,
                         what, timeout_ms_);
    Result er = exec_sql(c,
                         "SELECT count(*) FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n"
                         " ON n.oid = c.relnamespace WHERE n.nspname = current_schema() AND c.relname = $1",
                         t, what, timeout_ms_);
    int64_t version = 0, exists = 0;
    if (PQntuples(vr.get()) == 1 && !read_int(vr.get(), 0, 0, version))
      throw Error(TNX_ECORRUPT, what + ": unreadable row in " + pg::kMetaTable);
    read_int(er.get(), 0, 0, exists);
    const std::string at = "table " + opt_.table + " in " + target_;
    if (version > pg::kSchemaVersion)
      throw Error(TNX_EUNSUPPORTED, at + " has schema version " + std::to_string(version) +
                                        ", newer than this plugin's " + std::to_string(pg::kSchemaVersion) +
                                        ": upgrade the toolnexus postgres plugin");
    if (version == 0 && exists != 0)
      throw Error(TNX_ECORRUPT, at + " exists but is not a toolnexus task table (no row in " +
                                    pg::kMetaTable + "); choose another tnx_table");
    if (version < 0 || (version != 0 && exists == 0))
      throw Error(TNX_ECORRUPT, at + " is recorded at schema version " + std::to_string(version) + " in " +
                                    pg::kMetaTable + " but " + (version < 0 ? "that is invalid" : "does not exist"));
    if (version < pg::kSchemaVersion) {
      // DDL of a creation or migration may take long on a big table: no
      // statement timeout for the rest of this transaction.
      sql("SET LOCAL statement_timeout = 0", timeout_ms_);
      if (version < 2)
        for (const std::string &s : version == 0 ? sql_.create_v2() : sql_.migrate_v1_to_v2()) sql(s, 0);
      for (const std::string &s : sql_.create_v3_counts(version != 0)) sql(s, 0);
      Params up;
      up.text(opt_.table);
      exec_sql(c,
               std::string("INSERT INTO ") + pg::kMetaTable + " (table_name, version) VALUES ($1, " +
                   std::to_string(pg::kSchemaVersion) +
                   ") ON CONFLICT (table_name) DO UPDATE SET version = EXCLUDED.version, updated_at = now()",
               up, what, 0);
    }
    setup_due(c, what, true);
    setup_notify(c, what);
    sql("COMMIT", timeout_ms_);
  } catch (...) {
    // Closing the connection rolls the transaction back on the server.
    drop(c, false);
    throw;
  }
  build_statements();
}

void PgStore::setup_due(Conn &c, const std::string &what, bool create) {
  const std::string quoted = pg::quote_ident(opt_.table), index = pg::quote_ident(sql_.due_index()),
                    old_index = pg::quote_ident(sql_.old_due_index());
  Params p;  // borrows the strings above
  p.text(quoted);
  p.text(index);
  p.text(old_index);
  int64_t old = 0;
  auto probe = [&](int64_t &column, int64_t &has_index) {
    Result r = exec_sql(c, pg::Sql::due_probe(), p, what, timeout_ms_);
    column = has_index = old = 0;
    read_int(r.get(), 0, 0, column);
    read_int(r.get(), 0, 1, has_index);
    read_int(r.get(), 0, 2, old);
  };
  int64_t column = 0, has_index = 0;
  probe(column, has_index);
  if (create && (column == 0 || has_index == 0 || old != 0)) {
    // Like the change feed's trigger: a role that may write the table but
    // not alter it still opens it, without the due index.
    const Params none;
    exec_sql(c, "SAVEPOINT tnx_due", none, what, timeout_ms_);
    try {
      // The index reads the whole table once (a big one may take longer
      // than a statement may); ALTER TABLE waits for every running
      // statement on the table and holds off new ones meanwhile, so that
      // wait is bounded by tnx_statement_timeout_ms (past it the store
      // opens without the due index; the next open tries again).
      exec_sql(c, "SET LOCAL statement_timeout = 0", none, what, timeout_ms_);
      if (opt_.statement_timeout_ms != 0)
        exec_sql(c, "SET LOCAL lock_timeout = " + std::to_string(opt_.statement_timeout_ms), none, what, timeout_ms_);
      for (const std::string &s : sql_.create_due(column == 0)) exec_sql(c, s, none, what, 0);
      probe(column, has_index);
    } catch (const ConnectionLost &) {
      throw;
    } catch (const Error &) {
      exec_sql(c, "ROLLBACK TO SAVEPOINT tnx_due", none, what, timeout_ms_);
      probe(column, has_index);
    }
  }
  has_due_ = column != 0 && has_index != 0;
}

void PgStore::setup_notify(Conn &c, const std::string &what) {
  const std::string quoted = pg::quote_ident(opt_.table);  // Params borrow these
  const std::string name = sql_.notify_name();
  Params t;
  t.text(quoted);
  Params tn;
  tn.text(quoted);
  tn.text(name);
  int64_t has = 0;
  read_int(exec_sql(c, pg::Sql::has_notify(), tn, what, timeout_ms_).get(), 0, 0, has);
  if (has == 0) {
    // A role that may write the table but not add a trigger to it (not its
    // owner) still opens it, without a feed: the host polls.
    const Params none;
    exec_sql(c, "SAVEPOINT tnx_notify", none, what, timeout_ms_);
    try {
      for (const std::string &s : sql_.create_notify()) exec_sql(c, s, none, what, timeout_ms_);
    } catch (const ConnectionLost &) {
      throw;
    } catch (const Error &e) {
      exec_sql(c, "ROLLBACK TO SAVEPOINT tnx_notify", none, what, timeout_ms_);
      feed_refused_ = "watch: no change feed for table " + opt_.table + " (the host polls): its trigger " +
                      name + " could not be created: " + e.message;
    }
  }
  Result r = exec_sql(c, pg::Sql::channel(), t, what, timeout_ms_);
  tnx_str ch{};
  if (PQntuples(r.get()) != 1 || !read_text(r.get(), 0, 0, ch) || ch.len == 0)
    throw Error(TNX_ECORRUPT, what + ": the channel of table " + opt_.table + " cannot be found");
  channel_.assign(view(ch));
}

/// "postgresql://user@host:port/dbname table <t>" from the parsed URI: what
/// messages call the store (no password, no other parameters).
std::string describe(const std::string &uri, const std::string &table, Secrets &secrets) {
  char *err = nullptr;
  PQconninfoOption *opts = PQconninfoParse(uri.c_str(), &err);
  if (opts == nullptr) {
    std::string msg = err != nullptr ? secrets.scrub(one_line(err)) : "out of memory";
    if (err != nullptr) PQfreemem(err);
    throw Error(TNX_EINVAL, "invalid postgres URI: " + msg);
  }
  std::string user, host, port, db;
  for (PQconninfoOption *o = opts; o->keyword != nullptr; ++o) {
    if (o->val == nullptr) continue;
    std::string k = o->keyword;
    if (k == "user") user = o->val;
    else if (k == "host" && host.empty()) host = o->val;
    else if (k == "hostaddr" && host.empty()) host = o->val;
    else if (k == "port") port = o->val;
    else if (k == "dbname") db = o->val;
    else if (k == "password") secrets.add(o->val);
  }
  PQconninfoFree(opts);
  if (const char *pw = std::getenv("PGPASSWORD")) secrets.add(pw);
  std::string d = "postgresql://" + (user.empty() ? "" : user + "@") + (host.empty() ? "localhost" : host) +
                  (port.empty() ? "" : ":" + port) + "/" + db;
  return secrets.scrub(d) + " table " + table;
}

toolnexus::sdk::Store *open_postgres(const tnx_open_args &args) {
  if (PQisthreadsafe() == 0)
    throw Error(TNX_EUNSUPPORTED, "this libpq is built without thread safety; the postgres plugin needs it");
  std::string selector(view(args.selector));
  if (selector.empty()) selector = std::string(view(args.scheme)) + ":" + std::string(view(args.location));
  Secrets secrets;
  Parsed parsed = parse_selector(selector, secrets);
  std::string target = describe(parsed.uri, parsed.opt.table, secrets);
  auto store = std::make_unique<PgStore>(parsed.opt, parsed.uri, std::move(target), std::move(secrets));
  if (toolnexus::sdk::open_read_only(args)) {
    store->check_schema();
  } else {
    store->setup_schema();
    if (!store->feed_refused().empty()) toolnexus::sdk::clear_capabilities(args, TNX_CAP_CHANGE_FEED);
  }
  if (!store->keeps_due()) toolnexus::sdk::clear_capabilities(args, TNX_CAP_DUE_INDEX);
  return store.release();
}

const char *const kSchemes[] = {"postgres", "postgresql", nullptr};

const tnx_plugin_descriptor kDescriptor = {
    TNX_HEADER_INIT(tnx_plugin_descriptor),
    "toolnexus-postgres",
    "0.1.0",
    "PostgreSQL store (libpq): durable, shared by processes, compare-and-set on a version column",
    kSchemes,
    TNX_CAP_THREAD_SAFE | TNX_CAP_PAGINATED_LIST | TNX_CAP_COMPARE_AND_SET | TNX_CAP_DURABLE |
        TNX_CAP_MULTI_PROCESS | TNX_CAP_PERSISTENT | TNX_CAP_CHANGE_FEED | TNX_CAP_DUE_INDEX,
    &toolnexus::sdk::open_trampoline<open_postgres>,
    nullptr,  // vtable: set in the entry (the helper's vtable is a function-local static)
    "postgresql://[user[:password]@]host[:port]/dbname[?libpq-param=value&...]"
    "[&tnx_pool=1..64][&tnx_statement_timeout_ms=0..3600000][&tnx_table=name]",
};

}  // namespace

extern "C" TNX_PLUGIN_EXPORT const tnx_plugin_descriptor *toolnexus_plugin_entry(const tnx_host_info *host) {
  return toolnexus::sdk::entry<kDescriptor>(host);
}

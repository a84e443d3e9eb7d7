// plugins/postgres/pg_sql.hpp: every SQL text of the postgres plugin, in one
// place: the schema of each version, the migration between them and the
// statements of get/save/del/list.
//
// Header-only and free of libpq so that the plugin's tests can EXPLAIN the very
// statements the plugin prepares (tests/postgres/postgres_plugin_test.cpp
// checks that every list shape is an index scan without a sort) and build a
// genuine schema-version-1 table to migrate.
//
// The table name is a validated identifier ([a-z_][a-z0-9_]{0,47}, see
// kMaxTableName); it is still double-quoted everywhere so that names which are
// SQL keywords ("order", "user") work.
#ifndef TOOLNEXUS_PG_SQL_HPP
#define TOOLNEXUS_PG_SQL_HPP

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace toolnexus::pg {

/// Schema version this plugin writes; a table at a lower version is migrated
/// at open, a higher one refused (TNX_EUNSUPPORTED).
constexpr int kSchemaVersion = 3;

/// Table recording the schema version of every task table of the database
/// (one row per table), in the same schema as the task tables.
constexpr const char *kMetaTable = "toolnexus_schema";

/// Key of the transaction-scoped advisory lock that serialises schema creation
/// and migration between processes (ASCII "tnx_sch"). Without it two replicas
/// running CREATE TABLE IF NOT EXISTS at the same instant can still fail with
/// a unique violation on pg_type.
constexpr int64_t kSchemaLockKey = 0x746e785f736368;

/// Longest table name accepted: index names append at most "_by_context"
/// (11 bytes) and PostgreSQL truncates identifiers at 63 bytes.
constexpr size_t kMaxTableName = 48;

/// Filter bits of a list statement shape, in parameter order. Equal to the
/// TNX_FILTER_* bits of task_store.h (checked by a static_assert in the
/// plugin).
enum ListFilter : uint32_t {
  kByContext = 1u << 0,
  kByState = 1u << 1,
  kByOwner = 1u << 2,
  kByTenant = 1u << 3,
  kAfter = 1u << 4,
  kBefore = 1u << 5,
  /// ABI 1.5 TNX_FILTER_DUE_BEFORE: due_us set and before the parameter.
  kDueBefore = 1u << 6,
  kAllFilters = (1u << 7) - 1,
};

/// `name` as a double-quoted SQL identifier (doubling any '"').
inline std::string quote_ident(std::string_view name) {
  std::string out = "\"";
  for (char c : name) {
    if (c == '"') out.push_back('"');
    out.push_back(c);
  }
  out.push_back('"');
  return out;
}

/// The SQL of one task table. Parameter numbers are documented per statement;
/// text parameters are `text`, times and versions `bigint`.
class Sql {
 public:
  explicit Sql(std::string table) : table_(std::move(table)), t_(quote_ident(table_)) {}

  const std::string &table() const { return table_; }

  /// The planner's row estimate of the task table (pg_class.reltuples as
  /// bigint: -1 while it was never analyzed). $1 = the quoted table name.
  static std::string row_estimate() {
    return "SELECT reltuples::bigint FROM pg_class WHERE oid = to_regclass($1)";
  }

  /// ANALYZE of the task table (fresh planner statistics).
  std::string analyze() const { return "ANALYZE " + t_; }

  /// The due index (ABI 1.5), an addition to schema 3 made at a read-write
  /// open (no version bump: an older plugin names its columns, so it
  /// ignores the column): a nullable bigint due_us (NULL = nothing due) and
  /// a partial index on (due_us, id) of the rows that have one, in the due
  /// list's order, so that a due page is an index range read in order from
  /// its cursor. ADD COLUMN of a column without a default rewrites no row.
  /// Also drops old_due_index(), the (due_us) index of development builds
  /// of 1.5 before the due order. Run only when due_probe() says something
  /// is missing or left over, under the schema lock (plain ADD COLUMN: IF
  /// NOT EXISTS needs server 9.6).
  std::vector<std::string> create_due(bool add_column) const {
    std::vector<std::string> v;
    if (add_column) v.push_back("ALTER TABLE " + t_ + " ADD COLUMN due_us bigint");
    v.push_back("CREATE INDEX IF NOT EXISTS " + quote_ident(due_index()) + " ON " + t_ +
                " (due_us, id) WHERE due_us IS NOT NULL");
    v.push_back("DROP INDEX IF EXISTS " + quote_ident(old_due_index()));
    return v;
  }

  /// Name of the due index.
  std::string due_index() const { return table_ + "_by_due_id"; }
  /// Name of the due index of development builds of 1.5 (due_us only).
  std::string old_due_index() const { return table_ + "_by_due"; }

  /// Whether the due column, its index and the old index exist: one row,
  /// three bigints (0 or 1 each). $1 = the quoted table name, $2 = the
  /// quoted due_index(), $3 = the quoted old_due_index().
  static std::string due_probe() {
    return "SELECT (SELECT count(*) FROM pg_catalog.pg_attribute WHERE attrelid = to_regclass($1)"
           " AND attname = 'due_us' AND NOT attisdropped), (SELECT count(*) FROM pg_catalog.pg_class"
           " WHERE oid = to_regclass($2)), (SELECT count(*) FROM pg_catalog.pg_class WHERE oid = to_regclass($3))";
  }

  /// CREATE TABLE IF NOT EXISTS of the version table (idempotent).
  static std::string create_meta() {
    return std::string("CREATE TABLE IF NOT EXISTS ") + kMetaTable +
           " (table_name text COLLATE \"C\" NOT NULL PRIMARY KEY,"
           " version integer NOT NULL,"
           " updated_at timestamptz NOT NULL DEFAULT now())";
  }

  /// Schema version 2 (current), created in an empty database. $-free.
  ///   id, context_id, state, owner, tenant: text COLLATE "C" (bytewise order
  ///     and equality, whatever the database's locale);
  ///   status_time_us: bigint NOT NULL, INT64_MIN = no status timestamp (so
  ///     it sorts last in the descending list order and keyset predicates are
  ///     plain comparisons);
  ///   task_json: text, exactly the saved bytes (not jsonb: jsonb reorders
  ///     keys and drops duplicates);
  ///   version: 1, 2, 3, ... per id;
  ///   deleted: a deleted Task keeps its row (emptied, version kept) so that a
  ///     re-created id continues its numbering: a version is never reused for
  ///     an id, so a compare-and-set cannot succeed against a different
  ///     incarnation of the Task (no ABA).
  /// Every list index is partial (live rows only) and ends in the list order
  /// (status_time_us DESC, id), so each filter is an index range scan that is
  /// already sorted: no sort node, no OFFSET.
  std::vector<std::string> create_v2() const {
    std::vector<std::string> v;
    v.push_back("CREATE TABLE " + t_ +
                " (id text COLLATE \"C\" NOT NULL PRIMARY KEY,"
                " context_id text COLLATE \"C\" NOT NULL,"
                " state text COLLATE \"C\" NOT NULL,"
                " status_time_us bigint NOT NULL,"
                " owner text COLLATE \"C\" NOT NULL,"
                " tenant text COLLATE \"C\" NOT NULL,"
                " task_json text NOT NULL,"
                " version bigint NOT NULL,"
                " deleted boolean NOT NULL DEFAULT false)");
    for (auto &s : v2_indexes()) v.push_back(std::move(s));
    return v;
  }

  /// Schema version 3 = version 2 plus the counters that answer count (ABI
  /// 1.3) without scanning: table "<table>$counts" holds, for every (owner,
  /// tenant, state) and slot 0..63, how many live Tasks it has; the row
  /// trigger "<table>$count" (function of the same name) keeps it in the
  /// transaction of every insert, update and delete of the task table, also
  /// for writes by hand. A Task's changes go to slot hashtext(id) & 63, so
  /// concurrent saves of different Tasks rarely wait for the same counter
  /// row; a save that moves a Task between two counter rows updates them in
  /// key order, so two saves never deadlock. count sums the 64 slots.
  /// ('$' cannot occur in a tnx_table name, so these names never clash with
  /// another store's table.) Statements of the creation and of migration
  /// 2 -> 3, which fills the counters from the live rows under a lock that
  /// holds writers off until the trigger exists.
  std::vector<std::string> create_v3_counts(bool fill) const {
    const std::string c = quote_ident(table_ + "$counts"), f = quote_ident(table_ + "$count");
    auto bump = [&](const char *row, const char *delta) {
      return std::string("INSERT INTO ") + c + " AS k (owner, tenant, state, slot, n) VALUES (" + row +
             ".owner, " + row + ".tenant, " + row + ".state, s, " + delta +
             ") ON CONFLICT (owner, tenant, state, slot) DO UPDATE SET n = k.n + EXCLUDED.n;\n";
    };
    std::vector<std::string> v;
    if (fill) v.push_back("LOCK TABLE " + t_ + " IN SHARE ROW EXCLUSIVE MODE");
    v.push_back("CREATE TABLE " + c +
                " (owner text COLLATE \"C\" NOT NULL, tenant text COLLATE \"C\" NOT NULL,"
                " state text COLLATE \"C\" NOT NULL, slot smallint NOT NULL, n bigint NOT NULL,"
                " PRIMARY KEY (owner, tenant, state, slot))");
    v.push_back("CREATE FUNCTION " + f +
                "() RETURNS trigger LANGUAGE plpgsql AS $tnx$\n"
                "DECLARE s smallint;\n"
                "BEGIN\n"
                "  IF TG_OP = 'INSERT' THEN\n"
                "    IF NOT NEW.deleted THEN s := hashtext(NEW.id) & 63; " + bump("NEW", "1") + "    END IF;\n"
                "    RETURN NULL;\n"
                "  END IF;\n"
                "  IF TG_OP = 'DELETE' THEN\n"
                "    IF NOT OLD.deleted THEN s := hashtext(OLD.id) & 63; " + bump("OLD", "-1") + "    END IF;\n"
                "    RETURN NULL;\n"
                "  END IF;\n"
                "  IF OLD.deleted = NEW.deleted AND OLD.owner = NEW.owner AND OLD.tenant = NEW.tenant"
                " AND OLD.state = NEW.state AND OLD.id = NEW.id THEN RETURN NULL; END IF;\n"
                "  IF NOT OLD.deleted AND NOT NEW.deleted AND OLD.id = NEW.id AND"
                " (NEW.owner, NEW.tenant, NEW.state) < (OLD.owner, OLD.tenant, OLD.state) THEN\n"
                "    s := hashtext(NEW.id) & 63; " + bump("NEW", "1") + "    " + bump("OLD", "-1") +
                "  ELSE\n"
                "    IF NOT OLD.deleted THEN s := hashtext(OLD.id) & 63; " + bump("OLD", "-1") + "    END IF;\n"
                "    IF NOT NEW.deleted THEN s := hashtext(NEW.id) & 63; " + bump("NEW", "1") + "    END IF;\n"
                "  END IF;\n"
                "  RETURN NULL;\n"
                "END\n$tnx$");
    v.push_back("CREATE TRIGGER " + f + " AFTER INSERT OR UPDATE OR DELETE ON " + t_ +
                " FOR EACH ROW EXECUTE PROCEDURE " + f + "()");
    if (fill)
      v.push_back("INSERT INTO " + c + " (owner, tenant, state, slot, n) SELECT owner, tenant, state,"
                  " hashtext(id) & 63, count(*) FROM " + t_ + " WHERE NOT deleted GROUP BY 1, 2, 3, 4");
    return v;
  }

  /// The change feed (ABI 1.4): the NOTIFY channel of a table, as an SQL
  /// expression over the table's schema and name (both of type name or
  /// text): "tnx:<table>:<hex hashtext(schema)>", at most 4 + 48 + 1 + 8 =
  /// 61 bytes (a channel is an identifier: under NAMEDATALEN, 64). The
  /// schema's hash keeps stores of equal table names in different schemas
  /// apart (NOTIFY is per database). The trigger and the listener evaluate
  /// this same expression on the same server, so they always agree.
  static std::string channel_expr(const std::string &schema, const std::string &name) {
    return "'tnx:' || " + name + " || ':' || to_hex(hashtext(" + schema + "::text))";
  }

  /// The channel of the task table: one row, one text. $1 = the quoted
  /// table name (resolved through search_path as every statement's).
  static std::string channel() {
    return "SELECT " + channel_expr("n.nspname", "c.relname") +
           " FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace"
           " WHERE c.oid = to_regclass($1)";
  }

  /// Name of the change feed's trigger and its function.
  std::string notify_name() const { return table_ + "$notify"; }

  /// Whether the change feed's trigger exists: one row, one bigint (0 or
  /// 1). $1 = the quoted table name, $2 = notify_name().
  static std::string has_notify() {
    return "SELECT count(*) FROM pg_catalog.pg_trigger WHERE tgrelid = to_regclass($1) AND tgname = $2";
  }

  /// The change feed's row trigger "<table>$notify" (function of the same
  /// name), an addition to schema 3 made at open (no version bump: an older
  /// plugin ignores it, and its writes are announced too). In the
  /// transaction of every change of a row it queues pg_notify(channel,
  /// payload), which PostgreSQL delivers to the listeners only when (and
  /// if) that transaction commits, in commit order; so a listener never
  /// hears of a change before a get can read it, and the versions of one id
  /// arrive in increasing order (its writers are serialised by the row
  /// lock). The payload (text):
  ///   "s <version> <id>"  the Task was saved (created, replaced, revived)
  ///   "d <version> <id>"  the Task was deleted (emptied, or a row deleted
  ///                       by hand); <version> is the one it had
  ///   "g"                 a gap: the payload would be 8000 bytes or more
  ///                       (NOTIFY's limit; an id that long), so the
  ///                       listener is told to re-read instead of the save
  ///                       failing.
  /// An update that changes a row's id (by hand) announces the old id's
  /// deletion and the new id's save; an update of a deleted row that stays
  /// deleted, nothing. Branches by TG_OP before touching OLD (servers
  /// before 11 fail on OLD in an INSERT trigger). Each statement of the
  /// creation, in order.
  std::vector<std::string> create_notify() const {
    const std::string f = quote_ident(notify_name());
    auto send = [](const char *kind, const char *row) {
      return std::string("p := '") + kind + " ' || " + row + ".version || ' ' || " + row +
             ".id; IF octet_length(p) >= 8000 THEN p := 'g'; END IF; PERFORM pg_notify(ch, p);\n";
    };
    return {"CREATE OR REPLACE FUNCTION " + f +
                "() RETURNS trigger LANGUAGE plpgsql AS $tnx$\n"
                "DECLARE ch text := " + channel_expr("TG_TABLE_SCHEMA", "TG_TABLE_NAME") + "; p text;\n"
                "BEGIN\n"
                "  IF TG_OP = 'DELETE' THEN\n"
                "    IF NOT OLD.deleted THEN " + send("d", "OLD") + "    END IF;\n"
                "    RETURN NULL;\n"
                "  END IF;\n"
                "  IF TG_OP = 'UPDATE' THEN\n"
                "    IF OLD.deleted AND NEW.deleted THEN RETURN NULL; END IF;\n"
                "    IF NOT OLD.deleted AND OLD.id <> NEW.id THEN " + send("d", "OLD") + "    END IF;\n"
                "  END IF;\n"
                "  IF NEW.deleted THEN " + send("d", "NEW") + "  ELSE " + send("s", "NEW") + "  END IF;\n"
                "  RETURN NULL;\n"
                "END\n$tnx$",
            "CREATE TRIGGER " + f + " AFTER INSERT OR UPDATE OR DELETE ON " + t_ + " FOR EACH ROW EXECUTE PROCEDURE " +
                f + "()"};
  }

  /// count (ABI 1.3): `filters` (ListFilter bits) with their parameters in
  /// bit order as list(). Only owner/tenant/state equality (what the A2A
  /// server asks): a sum over the counters (`counters`: the table is at
  /// schema 3). Otherwise (a contextId, a time window or a due time) an
  /// index count of the live rows matching, O(matches). One row, one bigint.
  std::string count(uint32_t filters, bool counters) const {
    int n = 0;
    auto p = [&n] { return "$" + std::to_string(++n); };
    if (counters && (filters & (kByContext | kAfter | kBefore | kDueBefore)) == 0) {
      std::string s = "SELECT coalesce(sum(n), 0)::bigint FROM " + quote_ident(table_ + "$counts") + " WHERE true";
      if (filters & kByState) s += " AND state = " + p();
      if (filters & kByOwner) s += " AND owner = " + p();
      if (filters & kByTenant) s += " AND tenant = " + p();
      return s;
    }
    std::string s = "SELECT count(*) FROM " + t_ + " WHERE NOT deleted";
    if (filters & kByContext) s += " AND context_id = " + p();
    if (filters & kByState) s += " AND state = " + p();
    if (filters & kByOwner) s += " AND owner = " + p();
    if (filters & kByTenant) s += " AND tenant = " + p();
    if (filters & kAfter) s += " AND status_time_us > " + p();
    if (filters & kBefore) s += " AND status_time_us < " + p();
    if (filters & kDueBefore) s += " AND due_us IS NOT NULL AND due_us < " + p();
    return s;
  }

  /// Schema version 1, as shipped by the first toolnexus release: no soft
  /// delete, a NULL status_time_us for "no timestamp", filter columns in the
  /// database's default collation and one index for the list order. Only
  /// tests create it (to exercise the migration); the plugin never does.
  std::vector<std::string> create_v1() const {
    return {"CREATE TABLE " + t_ +
                " (id text COLLATE \"C\" NOT NULL PRIMARY KEY,"
                " context_id text NOT NULL DEFAULT '',"
                " state text NOT NULL DEFAULT '',"
                " status_time_us bigint,"
                " owner text NOT NULL DEFAULT '',"
                " tenant text NOT NULL DEFAULT '',"
                " task_json text NOT NULL,"
                " version bigint NOT NULL)",
            "CREATE INDEX " + quote_ident(table_ + "_time") + " ON " + t_ +
                " (status_time_us DESC NULLS LAST, id)"};
  }

  /// Migration 1 -> 2, run in the schema transaction (the version row is
  /// updated by the caller): adds the soft-delete column, replaces NULL
  /// times by the INT64_MIN sentinel and makes the column NOT NULL, moves the
  /// filter columns to the "C" collation, and replaces the v1 index by the
  /// v2 partial indexes.
  std::vector<std::string> migrate_v1_to_v2() const {
    std::vector<std::string> v = {
        "ALTER TABLE " + t_ + " ADD COLUMN deleted boolean NOT NULL DEFAULT false",
        "UPDATE " + t_ + " SET status_time_us = " + kTimeNone + " WHERE status_time_us IS NULL",
        "ALTER TABLE " + t_ +
            " ALTER COLUMN status_time_us SET NOT NULL,"
            " ALTER COLUMN context_id DROP DEFAULT, ALTER COLUMN context_id TYPE text COLLATE \"C\","
            " ALTER COLUMN state DROP DEFAULT, ALTER COLUMN state TYPE text COLLATE \"C\","
            " ALTER COLUMN owner DROP DEFAULT, ALTER COLUMN owner TYPE text COLLATE \"C\","
            " ALTER COLUMN tenant DROP DEFAULT, ALTER COLUMN tenant TYPE text COLLATE \"C\"",
        "DROP INDEX IF EXISTS " + quote_ident(table_ + "_time"),
    };
    for (auto &s : v2_indexes()) v.push_back(std::move(s));
    return v;
  }

  /// The statements below take `due`: the table has the due column (every
  /// read-write open adds it; see create_due). Without it they are those
  /// of ABI 1.4.

  /// get: $1 id. One row (id, context_id, state, status_time_us, owner,
  /// tenant, task_json, version, and with `due` due_us) or none.
  std::string get(bool due = true) const {
    return "SELECT " + std::string(kColumns) + (due ? ", due_us" : "") + " FROM " + t_ +
           " WHERE id = $1 AND NOT deleted";
  }

  /// Unconditional save (TNX_VERSION_ANY): $1 id, $2 context_id, $3 state,
  /// $4 status_time_us, $5 owner, $6 tenant, $7 task_json, with `due` $8
  /// due_us (NULL: nothing due). Inserts version 1 or bumps the stored
  /// (possibly deleted) row's version. Returns the new version.
  std::string save_any(bool due = true) const { return upsert(false, due); }

  /// Create-only save (TNX_VERSION_NONE): parameters as save_any. Returns the
  /// new version, or no row when a live Task with that id exists (conflict).
  /// A deleted row is revived with its version + 1.
  std::string save_none(bool due = true) const { return upsert(true, due); }

  /// Compare-and-set save: parameters as save_any plus the expected version
  /// ($9, or $8 without `due`). One row: (new version or NULL, stored
  /// version or NULL as of the statement's snapshot, for the conflict
  /// message).
  std::string save_cas(bool due = true) const {
    return "WITH u AS (UPDATE " + t_ +
           " SET context_id = $2, state = $3, status_time_us = $4, owner = $5, tenant = $6,"
           " task_json = $7, version = version + 1" +
           (due ? ", due_us = $8 WHERE id = $1 AND version = $9" : " WHERE id = $1 AND version = $8") +
           " AND NOT deleted RETURNING version)"
           " SELECT (SELECT version FROM u), (SELECT version FROM " +
           t_ + " WHERE id = $1 AND NOT deleted)";
  }

  /// Unconditional delete: $1 id. Returns the deleted version, or no row when
  /// there is no live Task (not found).
  std::string del_any(bool due = true) const {
    return "UPDATE " + t_ + " SET " + emptied(due) + " WHERE id = $1 AND NOT deleted RETURNING version";
  }

  /// Compare-and-set delete: $1 id, $2 expected version. One row: (deleted
  /// version or NULL, stored version or NULL).
  std::string del_cas(bool due = true) const {
    return "WITH d AS (UPDATE " + t_ + " SET " + emptied(due) +
           " WHERE id = $1 AND version = $2 AND NOT deleted RETURNING version)"
           " SELECT (SELECT version FROM d), (SELECT version FROM " +
           t_ + " WHERE id = $1 AND NOT deleted)";
  }

  /// One list page. `filters` (ListFilter bits) choose the predicates; their
  /// parameters come first, in bit order (context_id, state, owner, tenant
  /// text; after_us, before_us, due_before_us bigint), then with `cursor`
  /// the cursor's status_time_us (bigint) and id (text), then the row limit
  /// (bigint). Columns as get(due). Keyset pagination: "after the cursor"
  /// in the order (time DESC, id ASC) is time < t OR (time = t AND id > i),
  /// written with a leading time <= t so that the index range starts at the
  /// cursor. A due list reads the due index (the rows due only) and sorts
  /// them.
  std::string list(uint32_t filters, bool cursor, bool omit_json, bool due = true) const {
    std::string s = "SELECT id, context_id, state, status_time_us, owner, tenant, ";
    s += omit_json ? "''::text" : "task_json";
    s += due ? ", version, due_us FROM " : ", version FROM ";
    s += t_ + " WHERE NOT deleted";
    int n = 0;
    auto p = [&n] { return "$" + std::to_string(++n); };
    if (filters & kByContext) s += " AND context_id = " + p();
    if (filters & kByState) s += " AND state = " + p();
    if (filters & kByOwner) s += " AND owner = " + p();
    if (filters & kByTenant) s += " AND tenant = " + p();
    if (filters & kAfter) s += " AND status_time_us > " + p();
    if (filters & kBefore) s += " AND status_time_us < " + p();
    if (filters & kDueBefore) s += " AND due_us IS NOT NULL AND due_us < " + p();
    if (filters & kDueBefore) {
      // A due list (ABI 1.5): (due_us, id) order, a range of due_index().
      if (cursor) {
        std::string d = p(), i = p();
        s += " AND due_us >= " + d + " AND (due_us > " + d + " OR id > " + i + ")";
      }
      s += " ORDER BY due_us, id LIMIT " + p();
      return s;
    }
    if (cursor) {
      std::string t = p(), i = p();
      s += " AND status_time_us <= " + t + " AND (status_time_us < " + t + " OR id > " + i + ")";
    }
    s += " ORDER BY status_time_us DESC, id LIMIT " + p();
    return s;
  }

  /// Number of parameters of list(filters, cursor, ...).
  static int list_param_count(uint32_t filters, bool cursor) {
    int n = 1;  // limit
    for (uint32_t b = 1; b <= kDueBefore; b <<= 1)
      if (filters & b) ++n;
    return cursor ? n + 2 : n;
  }

 private:
  static constexpr const char *kColumns =
      "id, context_id, state, status_time_us, owner, tenant, task_json, version";
  static constexpr const char *kTimeNone = "'-9223372036854775808'::bigint";
  static std::string emptied(bool due) {
    return std::string("deleted = true, task_json = '', context_id = '', state = '', owner = '', tenant = '',"
                       " status_time_us = '-9223372036854775808'::bigint") +
           (due ? ", due_us = NULL" : "");
  }

  std::string upsert(bool only_if_deleted, bool due) const {
    return "INSERT INTO " + t_ + " AS x (id, context_id, state, status_time_us, owner, tenant, task_json, version" +
           (due ? ", due_us) VALUES ($1, $2, $3, $4, $5, $6, $7, 1, $8)" : ") VALUES ($1, $2, $3, $4, $5, $6, $7, 1)") +
           " ON CONFLICT (id) DO UPDATE SET"
           " context_id = EXCLUDED.context_id, state = EXCLUDED.state,"
           " status_time_us = EXCLUDED.status_time_us, owner = EXCLUDED.owner,"
           " tenant = EXCLUDED.tenant, task_json = EXCLUDED.task_json,"
           " version = x.version + 1, deleted = false" +
           (due ? ", due_us = EXCLUDED.due_us" : "") + (only_if_deleted ? " WHERE x.deleted" : "") +
           " RETURNING version";
  }

  std::vector<std::string> v2_indexes() const {
    std::vector<std::string> v;
    auto index = [&](const char *suffix, const char *lead) {
      v.push_back("CREATE INDEX " + quote_ident(table_ + suffix) + " ON " + t_ + " (" + lead +
                  "status_time_us DESC, id) WHERE NOT deleted");
    };
    index("_by_time", "");
    index("_by_context", "context_id, ");
    index("_by_state", "state, ");
    index("_by_owner", "owner, ");
    index("_by_tenant", "tenant, ");
    return v;
  }

  std::string table_;
  std::string t_;  // quoted
};

}  // namespace toolnexus::pg

#endif  // TOOLNEXUS_PG_SQL_HPP

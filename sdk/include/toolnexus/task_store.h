/*
 * toolnexus/task_store.h: the C ABI between a toolnexus host and a Task
 * storage plugin. ABI version 1.6.
 *
 * This is the only header a plugin needs. It is C11 (and compiles as C++).
 *
 * ---------------------------------------------------------------------------
 * Shape of a plugin
 * ---------------------------------------------------------------------------
 * A plugin is a shared library that exports exactly one function,
 * TNX_PLUGIN_ENTRY_NAME ("toolnexus_plugin_entry"):
 *
 *     TNX_PLUGIN_EXPORT const tnx_plugin_descriptor *
 *     toolnexus_plugin_entry(const tnx_host_info *host);
 *
 * The host loads the library, calls the entry once, and reads the returned
 * descriptor: name, version, scheme(s) served, capability flags, the function
 * that opens a store, and the store vtable (get, save, del, list, close).
 *
 * ---------------------------------------------------------------------------
 * Versioning (modelled on sqlite3_vfs: structs grow, never break)
 * ---------------------------------------------------------------------------
 * - Every struct that crosses the boundary starts with a tnx_abi_header:
 *   its own size in bytes and the ABI major/minor its author compiled with.
 * - A different major is refused by the host (and should be by the plugin).
 * - Within one major, structs are append-only. A reader never touches a field
 *   lying beyond the struct_size the writer reported: it treats such a field
 *   as absent (zero / NULL). So a plugin built against 1.0 keeps loading in a
 *   1.7 host, and a 1.7 plugin can see that a 1.0 host did not send a field.
 * - Only fixed-width integers, pointers and structs of them; no bool, enum
 *   or bitfield inside a struct.
 *
 * ---------------------------------------------------------------------------
 * Memory and errors
 * ---------------------------------------------------------------------------
 * - Nothing allocated on one side is freed on the other. Inputs are borrowed
 *   for the duration of the call. Results come back through host-provided
 *   callbacks (tnx_record_sink, tnx_cursor_sink) whose arguments are borrowed
 *   for the duration of the callback only: the host copies what it keeps.
 * - Every store function returns a tnx_status: TNX_OK (0) or a negative code
 *   from the closed set below. On failure the plugin writes a NUL-terminated
 *   UTF-8 message into the host's error buffer (truncated to fit; the buffer
 *   may be NULL when capacity is 0). Messages name what was wrong and where
 *   (file path, id, option), never secrets such as passwords.
 * - No C++ exception, longjmp or signal may leave a plugin function.
 *
 * ---------------------------------------------------------------------------
 * Threading
 * ---------------------------------------------------------------------------
 * - The entry function may be called from any thread, once per load.
 * - If the descriptor's capabilities include TNX_CAP_THREAD_SAFE, the host may
 *   call any function of one store from several threads at once. Without it,
 *   the host serialises all calls on each store (calls on two different
 *   stores may still run concurrently).
 * - close() is called exactly once per store, after every other call on it
 *   has returned, and never concurrently with any of them.
 *
 * Task states (TaskState) are the A2A v0.3 spellings: "submitted", "working",
 * "input-required", "auth-required", "completed", "canceled", "failed",
 * "rejected", "unknown" (A2A spec v0.3 section 6.3; v1.0 section 4.1.3).
 */
#ifndef TOOLNEXUS_TASK_STORE_H
#define TOOLNEXUS_TASK_STORE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/** ABI major version. A host refuses a plugin whose major differs. */
#define TNX_ABI_MAJOR 1
/** ABI minor version. Grows when a struct grows; older minors keep loading.
 *  1.0: first release. 1.1: tnx_plugin_descriptor.location_syntax,
 *  tnx_list_query.deliver_corrupt. 1.2: tnx_open_args.flags
 *  (TNX_OPEN_READ_ONLY), tnx_open_args.capabilities (per-store
 *  capabilities) and tnx_task_record.problem. 1.3: tnx_store_vtable.count
 *  and tnx_store_vtable.save_batch (both optional). 1.4: the change feed,
 *  tnx_store_vtable.watch and unwatch (optional; TNX_CAP_CHANGE_FEED).
 *  1.5: the due index: tnx_task_record.due_us, tnx_list_query.due_before_us
 *  with TNX_FILTER_DUE_BEFORE (TNX_CAP_DUE_INDEX); the streamed save:
 *  tnx_store_vtable.save_stream (optional), tnx_record_source and
 *  TNX_SAVE_STREAM_ONE_TRANSACTION. A due list's order is its own:
 *  (due_us, id) ascending, with a keyset cursor on that key (see
 *  due_before_us); development builds of 1.5 before issue 21's due order
 *  listed it in the list order, which a host that pages until the cursor
 *  ends reads correctly too.
 *  1.6: decorators: tnx_open_args.services (tnx_host_services, whose
 *  open_inner opens the store a decorator plugin wraps). */
#define TNX_ABI_MINOR 6

/** Name of the one exported entry function, for dlsym()/Boost.DLL. */
#define TNX_PLUGIN_ENTRY_NAME "toolnexus_plugin_entry"

/** Marks the entry function as exported even under -fvisibility=hidden. */
#if defined(_WIN32)
#define TNX_PLUGIN_EXPORT __declspec(dllexport)
#else
#define TNX_PLUGIN_EXPORT __attribute__((visibility("default")))
#endif

/* ======================================================================== */
/* Status codes                                                             */
/* ======================================================================== */

/** Result of every store call: 0 or one of the negative TNX_E* codes.
 *  The set is closed and stable: new codes are never added within major 1,
 *  so a host can switch on it exhaustively. */
typedef int32_t tnx_status;

/** Success. */
#define TNX_OK 0
/** No Task with that id (get, del). Not an error for list. */
#define TNX_ENOTFOUND (-1)
/** Compare-and-set failed: the stored version is not the expected one
 *  (save, del). Nothing was written. */
#define TNX_ECONFLICT (-2)
/** The caller passed something invalid: bad location text or option, empty
 *  id, bad cursor, page size 0. Nothing was written. */
#define TNX_EINVAL (-3)
/** An operating system or network call failed: disk full, permission denied,
 *  connection lost. The previous stored version is intact. */
#define TNX_EIO (-4)
/** Stored data could not be decoded (truncated file, bad row, wrong file
 *  type). The message names where. Never reported as TNX_ENOTFOUND. */
#define TNX_ECORRUPT (-5)
/** The plugin does not implement this request (for example a compare-and-set
 *  save on a store without TNX_CAP_COMPARE_AND_SET). */
#define TNX_EUNSUPPORTED (-6)
/** A bug or resource exhaustion inside the plugin (out of memory, caught
 *  exception). */
#define TNX_EINTERNAL (-7)

/** Stable upper-case name of a status ("TNX_ENOTFOUND"); "TNX_E?" for a
 *  value outside the set. Returns a static string; thread-safe. */
static inline const char *tnx_err_name(tnx_status s) {
  switch (s) {
  case TNX_OK: return "TNX_OK";
  case TNX_ENOTFOUND: return "TNX_ENOTFOUND";
  case TNX_ECONFLICT: return "TNX_ECONFLICT";
  case TNX_EINVAL: return "TNX_EINVAL";
  case TNX_EIO: return "TNX_EIO";
  case TNX_ECORRUPT: return "TNX_ECORRUPT";
  case TNX_EUNSUPPORTED: return "TNX_EUNSUPPORTED";
  case TNX_EINTERNAL: return "TNX_EINTERNAL";
  default: return "TNX_E?";
  }
}

/** Short English description of a status; static string; thread-safe. */
static inline const char *tnx_strerror(tnx_status s) {
  switch (s) {
  case TNX_OK: return "success";
  case TNX_ENOTFOUND: return "task not found";
  case TNX_ECONFLICT: return "version conflict";
  case TNX_EINVAL: return "invalid argument";
  case TNX_EIO: return "I/O error";
  case TNX_ECORRUPT: return "corrupt record";
  case TNX_EUNSUPPORTED: return "operation not supported";
  case TNX_EINTERNAL: return "internal plugin error";
  default: return "unknown status";
  }
}

/** Copies `msg` (NUL-terminated) into the host's error buffer, truncating to
 *  fit and always NUL-terminating. Safe with buf == NULL or cap == 0.
 *  For plugin authors; header-only so a plugin links nothing. */
static inline void tnx_set_error(char *buf, uint32_t cap, const char *msg) {
  size_t n;
  if (buf == NULL || cap == 0) return;
  if (msg == NULL) msg = "";
  n = strlen(msg);
  if (n >= cap) n = (size_t)cap - 1;
  memcpy(buf, msg, n);
  buf[n] = '\0';
}

/* ======================================================================== */
/* Common pieces                                                            */
/* ======================================================================== */

/** First member of every struct that crosses the ABI. */
typedef struct tnx_abi_header {
  /** sizeof the whole struct as its writer compiled it, in bytes. */
  uint32_t struct_size;
  /** TNX_ABI_MAJOR of the writer. */
  uint16_t abi_major;
  /** TNX_ABI_MINOR of the writer. */
  uint16_t abi_minor;
} tnx_abi_header;

/** Brace initializer of the header member of a struct of type T, for a
 *  full static initializer:
 *  `static const tnx_store_vtable vt = {TNX_HEADER_INIT(tnx_store_vtable), get, ...};` */
#define TNX_HEADER_INIT(T) {(uint32_t)sizeof(T), TNX_ABI_MAJOR, TNX_ABI_MINOR}

/** A header for a struct of `struct_size` bytes of this ABI version. Use
 *  with a zeroed struct: `tnx_list_query q; memset(&q, 0, sizeof q);
 *  q.header = tnx_header(sizeof q);` (C++: `tnx_list_query q{};`). */
static inline tnx_abi_header tnx_header(size_t struct_size) {
  tnx_abi_header h;
  h.struct_size = (uint32_t)struct_size;
  h.abi_major = TNX_ABI_MAJOR;
  h.abi_minor = TNX_ABI_MINOR;
  return h;
}

/** True when the struct pointed to by `p` (whose header says how big it is)
 *  contains the member `m` of type T. Use before reading any member added
 *  after 1.0. */
#define TNX_HAS_FIELD(p, T, m) \
  ((p)->header.struct_size >= offsetof(T, m) + sizeof(((T *)0)->m))

/** A borrowed byte string: `len` bytes at `data`, not NUL-terminated, UTF-8
 *  unless stated. `data` may be NULL only when len == 0 (a NULL `data` with
 *  len > 0 is TNX_EINVAL). Empty means absent. */
typedef struct tnx_str {
  const char *data;
  uint64_t len;
} tnx_str;

/* ======================================================================== */
/* The record                                                               */
/* ======================================================================== */

/** Expected version meaning "whatever is stored, or nothing": save and del
 *  without compare-and-set. */
#define TNX_VERSION_ANY UINT64_MAX
/** Expected version meaning "no Task with this id may exist yet". */
#define TNX_VERSION_NONE ((uint64_t)0)

/** Sentinel for "no status timestamp" in status_time_us. Sorts oldest. */
#define TNX_TIME_NONE INT64_MIN

/**
 * One stored Task: the Task JSON plus the fields a backend indexes without
 * parsing JSON. The host derives the indexed fields from the JSON before a
 * save (id = "id", context_id = "contextId", state = "status.state",
 * status_time_us = "status.timestamp"), so they always agree with it.
 *
 * Ownership: every tnx_str is borrowed for the duration of the call (save)
 * or the callback (get/list sinks) only.
 */
typedef struct tnx_task_record {
  tnx_abi_header header;
  /** Task id, non-empty, any UTF-8 (may contain '/', '.', NUL is refused by
   *  the host). Unique within a store. */
  tnx_str id;
  /** contextId; may be empty. */
  tnx_str context_id;
  /** TaskState, v0.3 spelling ("input-required"); may be empty. */
  tnx_str state;
  /** status.timestamp as microseconds since 1970-01-01T00:00:00Z, or
   *  TNX_TIME_NONE. */
  int64_t status_time_us;
  /** Owner principal (who may see the Task); empty = none. */
  tnx_str owner;
  /** Tenant; empty = none. */
  tnx_str tenant;
  /** The whole Task as a UTF-8 JSON object, exactly the bytes to return on
   *  get. A store returns these bytes unchanged. */
  tnx_str task_json;
  /** Stored version. Ignored on save input; on output (get, list) the current
   *  version: never 0, and every save of an id gives it a version greater
   *  than any earlier one of that id seen through the same open store
   *  (1, 2, 3, ... is the usual numbering). A store without
   *  TNX_CAP_MULTI_PROCESS may number afresh when reopened. */
  uint64_t version;

  /* ---- ABI 1.2: read only when TNX_HAS_FIELD(rec, tnx_task_record, m) ---- */

  /** Output only: on a record that list delivers because of
   *  deliver_corrupt, why it cannot be decoded, as a message naming where
   *  (e.g. "'/srv/tasks/x.json' is a directory, not a task file"); empty
   *  on every sound record. Ignored on save input. */
  tnx_str problem;

  /* ---- ABI 1.5: read only when TNX_HAS_FIELD(rec, tnx_task_record, m) ---- */

  /** When the host wants this Task back from a TNX_FILTER_DUE_BEFORE list,
   *  in microseconds since 1970-01-01T00:00:00Z, or TNX_TIME_NONE (nothing
   *  due: the usual value). The host sets it on save (a toolnexus server:
   *  the earliest of a running Task's lease expiry and a push delivery's
   *  next attempt); a store with TNX_CAP_DUE_INDEX keeps it with the record
   *  and returns it on get and list. Opaque to the store otherwise: it is
   *  not derived from the JSON. A store without the capability ignores it
   *  on save and leaves it unset on output; a host reading a record from a
   *  store built for 1.4 or older (TNX_HAS_FIELD false) takes TNX_TIME_NONE. */
  int64_t due_us;
} tnx_task_record;

/**
 * Receives one record from get or list. Called on the thread that called the
 * store function, before that function returns. `rec` and everything it
 * points to are valid only during the call. A sink must not call back into
 * the same store (the store may hold a lock while it delivers).
 * Return 0 to continue, non-zero to stop a list early (the store then returns
 * TNX_OK without producing a next cursor).
 */
typedef int32_t (*tnx_record_sink)(void *ctx, const tnx_task_record *rec);

/**
 * Receives the opaque cursor of the next page from list: printable ASCII
 * (0x21..0x7e), of any length (a keyset cursor holds an id, and ids have no
 * length limit). Called at most once per list call, only when another page
 * exists. `cursor` is valid only during the call.
 */
typedef void (*tnx_cursor_sink)(void *ctx, tnx_str cursor);

/* ======================================================================== */
/* list                                                                     */
/* ======================================================================== */

/** filter_flags bits of tnx_list_query: which filters apply. A filter whose
 *  bit is clear is ignored (so an empty owner can be filtered for). */
#define TNX_FILTER_CONTEXT_ID ((uint32_t)1u << 0)
#define TNX_FILTER_STATE ((uint32_t)1u << 1)
#define TNX_FILTER_OWNER ((uint32_t)1u << 2)
#define TNX_FILTER_TENANT ((uint32_t)1u << 3)
#define TNX_FILTER_AFTER ((uint32_t)1u << 4)
#define TNX_FILTER_BEFORE ((uint32_t)1u << 5)
/** ABI 1.5: only records whose due_us is not TNX_TIME_NONE and is
 *  strictly before due_before_us, in due order (see due_before_us: not the
 *  list order below). Sent only to a store with
 *  TNX_CAP_DUE_INDEX (which answers at a cost that grows with the records
 *  due, not with the records stored); any other store returns TNX_EINVAL or
 *  TNX_EUNSUPPORTED for an unknown bit, and the host does not ask. */
#define TNX_FILTER_DUE_BEFORE ((uint32_t)1u << 6)
/** Every filter bit of this ABI version. */
#define TNX_FILTER_ALL ((uint32_t)0x7fu)

/** Largest page_size a store must honour; larger requests are clamped. */
#define TNX_LIST_MAX_PAGE 1000u

/**
 * What list returns: the records matching every enabled filter, sorted by
 * status_time_us descending (newest first), ties by id ascending (bytewise),
 * at most page_size of them, starting after `cursor`. A due list
 * (TNX_FILTER_DUE_BEFORE) is sorted otherwise: see due_before_us.
 * Order rule: A2A ListTasks (v1.0 section 9.4.4 / a2a-notes "ListTasks").
 */
typedef struct tnx_list_query {
  tnx_abi_header header;
  /** Which of the filters below apply (TNX_FILTER_* bits). */
  uint32_t filter_flags;
  /** Maximum records to return, 1..TNX_LIST_MAX_PAGE (larger is clamped;
   *  0 is TNX_EINVAL). */
  uint32_t page_size;
  /** Exact contextId match. */
  tnx_str context_id;
  /** Exact state match. */
  tnx_str state;
  /** Exact owner match. */
  tnx_str owner;
  /** Exact tenant match. */
  tnx_str tenant;
  /** Only records with status_time_us > after_us (strictly). */
  int64_t after_us;
  /** Only records with status_time_us < before_us (strictly). */
  int64_t before_us;
  /** Opaque cursor from a previous call's tnx_cursor_sink, or empty for the
   *  first page. A cursor stays valid while Tasks are added or removed (a
   *  keyset, not an offset). A malformed cursor is TNX_EINVAL. */
  tnx_str cursor;
  /** Non-zero: records may be delivered with empty task_json (index fields
   *  only). A store may ignore this and deliver the JSON anyway. */
  uint32_t omit_json;
  /** ABI 1.1 (the same bytes were `reserved0`, always 0, in 1.0).
   *  0: a record that cannot be decoded stops the list with TNX_ECORRUPT
   *  (one whose own storage cannot be read, with TNX_EIO).
   *  Non-zero: deliver it instead, whatever the filters, and go on (for
   *  tools that copy or check a whole store). This covers a record that
   *  cannot be decoded and, where the store can tell, one whose own storage
   *  alone cannot be read (e.g. a task file without read permission); a
   *  failure of the whole store still ends the list. `id` = its id, or when
   *  the store cannot recover the id a
   *  store-specific name of its location (e.g. the file name), UTF-8 like
   *  every id; state and
   *  context_id empty; status_time_us = TNX_TIME_NONE; version 0; task_json =
   *  the raw stored bytes (may be empty or not JSON); since ABI 1.2
   *  `problem` = why (the message list would have failed with). The host
   *  recognises such a record by `problem` or, from an older store, by
   *  parsing. With TNX_TIME_NONE it sorts last and paging goes on past it.
   *  A save with TNX_VERSION_ANY replaces such a record (that is how a
   *  store is repaired); its delivered version 0 is TNX_VERSION_NONE, so a
   *  save expecting that gets TNX_ECONFLICT (the record exists).
   *  A 1.0 store ignores this field and stops as with 0. */
  uint32_t deliver_corrupt;

  /* ---- ABI 1.5: read only when TNX_HAS_FIELD(q, tnx_list_query, m) ---- */

  /** With TNX_FILTER_DUE_BEFORE: only records with due_us != TNX_TIME_NONE
   *  and due_us < due_before_us (µs since the epoch).
   *  Order: due_us ascending (the earliest due first), ties by id ascending
   *  (bytewise), unlike every other list, so that a sweep reads the most
   *  overdue first and a store answers a page by walking an index on
   *  (due_us, id) from the cursor, at a cost that grows with the page, not
   *  with what is due or stored. The cursor is a keyset on that key: the
   *  built-in stores write "d<due_us in decimal>.<lowercase hex of the id's
   *  bytes>" of the last record delivered (plugin.hpp's sdk::DueKey; the
   *  host treats it as opaque), and the next page starts strictly after it,
   *  so paging reaches every record due exactly once while others are
   *  saved in between (a record saved with a new due time moves: seen
   *  again if it moves past the cursor, not if it moves before it). A
   *  malformed cursor, or the cursor of a list without the filter, is
   *  TNX_EINVAL (and a due list's cursor in a list without it).
   *  The other filters combine with it as in every list. With deliver_corrupt, a record
   *  that cannot be decoded is delivered only when its due time (kept apart
   *  from the bytes that cannot be decoded) passes this filter: a due list
   *  stays as short as what is due. */
  int64_t due_before_us;
} tnx_list_query;

/* ======================================================================== */
/* The change feed (ABI 1.4)                                                */
/* ======================================================================== */

/** tnx_change.kind: Task `id` was saved (created or replaced) and now has
 *  `version`. */
#define TNX_CHANGE_SAVED ((uint32_t)1)
/** tnx_change.kind: Task `id` was deleted; `version` is the version it had,
 *  or 0 when the store does not know it. */
#define TNX_CHANGE_DELETED ((uint32_t)2)
/** tnx_change.kind: changes may have been missed (the store lost its
 *  connection to the database and got it back, a queue overflowed, another
 *  process's changes could not be read). `id` is empty. The host re-reads
 *  whatever it cares about. Sent once the feed works again (or at once, if
 *  the plugin keeps trying): after it, changes are reported again. */
#define TNX_CHANGE_GAP ((uint32_t)3)

/** One change, handed to a tnx_change_sink. Borrowed for the callback only
 *  (copy `id` to keep it). Filled from zero, header by tnx_header(). */
typedef struct tnx_change {
  tnx_abi_header header;
  /** TNX_CHANGE_*; a host ignores a kind it does not know. */
  uint32_t kind;
  /** Reserved, 0. */
  uint32_t reserved0;
  /** The Task's id (empty for TNX_CHANGE_GAP). */
  tnx_str id;
  /** The version the Task has now (TNX_CHANGE_SAVED) or had
   *  (TNX_CHANGE_DELETED; 0 = unknown); 0 for TNX_CHANGE_GAP. */
  uint64_t version;
} tnx_change;

/**
 * Receives the store's changes (see tnx_store_vtable.watch). Called by the
 * plugin from any thread: the thread of a save or delete made through this
 * store, or a thread the plugin owns (another process's changes); possibly
 * from several threads at once. It must return quickly: no blocking, no I/O,
 * and no call back into the store (the host queues the news and reads on
 * its own threads). `change` is borrowed for the call.
 */
typedef void (*tnx_change_sink)(void *ctx, const tnx_change *change);

/* ======================================================================== */
/* The store vtable                                                         */
/* ======================================================================== */

/** An open store: an opaque plugin-owned object, from open() until close(). */
typedef struct tnx_store tnx_store;

/**
 * ABI 1.5: hands the next record of a save_stream to the store. On TNX_OK,
 * *out_rec is the next record (borrowed until the next call of the source
 * or the return of save_stream) and *out_expected its expected version, or
 * *out_rec is NULL at the end of the stream. Any other status stops the
 * save (save_stream returns it). See tnx_store_vtable.save_stream.
 */
typedef tnx_status (*tnx_record_source)(void *ctx, const tnx_task_record **out_rec,
                                        uint64_t *out_expected);

/** save_stream flag (ABI 1.5): every record in one transaction, all or
 *  none; TNX_EUNSUPPORTED from a store without transactions. */
#define TNX_SAVE_STREAM_ONE_TRANSACTION ((uint32_t)1u << 0)
/** Every TNX_SAVE_STREAM_* bit of this ABI version. */
#define TNX_SAVE_STREAM_ALL TNX_SAVE_STREAM_ONE_TRANSACTION

/**
 * The store functions. One vtable per plugin (static storage in the plugin),
 * shared by every store it opens. The function pointers of ABI 1.0 (get,
 * save, del, list, close) are required; count and save_batch (ABI 1.3) may
 * be NULL.
 *
 * Common arguments of every function:
 *   store    an open store from this plugin's open(); never NULL.
 *   err/err_cap  host buffer for a NUL-terminated message on failure; the
 *            plugin must not write beyond err_cap bytes (tnx_set_error()).
 */
typedef struct tnx_store_vtable {
  tnx_abi_header header;

  /**
   * get: reads the Task with id `id` and delivers it to `sink` exactly once.
   * Returns TNX_OK (sink called), TNX_ENOTFOUND (sink not called),
   * TNX_ECORRUPT (the stored bytes are unreadable; message names where),
   * TNX_EIO, TNX_EINVAL (empty id), TNX_EINTERNAL.
   * Threading: see header comment. Ownership: `id` borrowed for the call.
   */
  tnx_status (*get)(tnx_store *store, tnx_str id, tnx_record_sink sink,
                    void *sink_ctx, char *err, uint32_t err_cap);

  /**
   * save: stores `rec` (all fields but `version`), replacing any previous
   * version of the same id, atomically: after a failure the previous version
   * is intact and readable, after success the new one is.
   * expected_version: TNX_VERSION_ANY (no check), TNX_VERSION_NONE (must not
   * exist) or the version that must currently be stored.
   * On TNX_OK, *out_version (never NULL) receives the new version.
   * Returns TNX_OK, TNX_ECONFLICT (nothing written), TNX_EINVAL (empty id or
   * task_json, a struct_size below ABI 1.0's, a field that disagrees with
   * task_json), TNX_EIO (nothing changed; e.g. disk full), TNX_EUNSUPPORTED
   * (CAS requested without TNX_CAP_COMPARE_AND_SET, or the store was
   * opened read-only), TNX_EINTERNAL.
   * One exception to "nothing changed" on TNX_EIO: when a step after the
   * point of no return fails (e.g. the directory fsync after a rename), the
   * message must say that the outcome is unknown.
   * A store with TNX_CAP_DURABLE reports TNX_OK only once the data survives
   * a crash of the machine.
   */
  tnx_status (*save)(tnx_store *store, const tnx_task_record *rec,
                     uint64_t expected_version, uint64_t *out_version,
                     char *err, uint32_t err_cap);

  /**
   * del: removes the Task `id`. expected_version as for save
   * (TNX_VERSION_NONE can never match an existing Task: TNX_ECONFLICT when
   * it exists, TNX_ENOTFOUND when not).
   * Returns TNX_OK, TNX_ENOTFOUND, TNX_ECONFLICT, TNX_EIO, TNX_EINVAL,
   * TNX_EINTERNAL.
   */
  tnx_status (*del)(tnx_store *store, tnx_str id, uint64_t expected_version,
                    char *err, uint32_t err_cap);

  /**
   * list: delivers the matching records of one page, in order, to
   * `record_sink`, then, only when another matching record exists after
   * them, the next cursor to `cursor_sink`. A record that cannot be decoded is not skipped: list stops
   * and returns TNX_ECORRUPT naming it.
   * Returns TNX_OK (possibly with zero records), TNX_EINVAL (bad query or
   * cursor), TNX_EUNSUPPORTED (a filter_flags bit the store does not know:
   * a store never ignores a filter), TNX_ECORRUPT, TNX_EIO, TNX_EINTERNAL.
   */
  tnx_status (*list)(tnx_store *store, const tnx_list_query *query,
                     tnx_record_sink record_sink, tnx_cursor_sink cursor_sink,
                     void *sink_ctx, char *err, uint32_t err_cap);

  /**
   * close: flushes and frees the store. Called exactly once; `store` is
   * invalid afterwards whatever the result. Returns TNX_OK or TNX_EIO (a
   * final flush failed; the message says what may be lost).
   */
  tnx_status (*close)(tnx_store *store, char *err, uint32_t err_cap);

  /* ---- ABI 1.3: read only when TNX_HAS_FIELD(vt, tnx_store_vtable, m);
   *      a vtable of ABI 1.0..1.2 ends before it ---- */

  /**
   * count: writes to *out_count (never NULL) how many records list would
   * deliver for `query` over all of its pages, without delivering them: the
   * records matching every filter enabled in query->filter_flags (the same
   * filters as list). query->cursor, page_size, omit_json and
   * deliver_corrupt are ignored. This is the A2A ListTasksResponse
   * totalSize, "total number of tasks available (before pagination)"
   * (A2A v1.0 specification/a2a.proto, ListTasksResponse.total_size, a
   * REQUIRED field), so it is exact: a store keeps counters or an index
   * that answers without reading every record where it can, and says in
   * its documentation which filters cost more (e.g. a time window).
   * A record the store knows to be undecodable is not counted; one whose
   * index entry is intact but whose bytes are damaged may be (the store
   * need not decode records to count them).
   * May be NULL, and may return TNX_EUNSUPPORTED: the host then counts by
   * listing with omit_json (O(matches) calls of list).
   * Returns TNX_OK, TNX_EINVAL (bad query), TNX_EUNSUPPORTED (an unknown
   * filter bit, or counting not offered), TNX_ECORRUPT, TNX_EIO,
   * TNX_EINTERNAL. Threading and ownership as list.
   */
  tnx_status (*count)(tnx_store *store, const tnx_list_query *query, uint64_t *out_count,
                      char *err, uint32_t err_cap);

  /**
   * save_batch: saves `n` records in one transaction: after TNX_OK all of
   * them are stored (durably with TNX_CAP_DURABLE), after any failure none
   * of them is. recs[i] and expected[i] are as rec and expected_version of
   * save, checked in order: a later record of the same id sees the earlier
   * one (its expected version may be the version the earlier one gets).
   * recs (n pointers; pointers, not an array of structs, so each record's
   * own struct_size counts) and expected are borrowed for the call.
   * On TNX_OK, out_versions[i] (an array of n, never NULL) receives the new
   * version of recs[i]. On failure, *out_failed (never NULL) receives the
   * index of the record that failed (TNX_ECONFLICT, TNX_EINVAL), or n when
   * the failure is not one record's (TNX_EIO at commit), and the message
   * says why; nothing was written. n == 0 is TNX_OK.
   * May be NULL, and may return TNX_EUNSUPPORTED: the host then saves the
   * records one by one (each atomic, the whole not; `toolnexus store put`
   * of a JSON-lines stream says which lines were saved).
   * Returns TNX_OK, TNX_ECONFLICT, TNX_EINVAL, TNX_EIO, TNX_EUNSUPPORTED,
   * TNX_EINTERNAL. Threading as save.
   */
  tnx_status (*save_batch)(tnx_store *store, const tnx_task_record *const *recs,
                           const uint64_t *expected, uint64_t n, uint64_t *out_versions,
                           uint64_t *out_failed, char *err, uint32_t err_cap);

  /* ---- ABI 1.4: read only when TNX_HAS_FIELD(vt, tnx_store_vtable, m);
   *      a vtable of ABI 1.0..1.3 ends before it ---- */

  /**
   * watch: starts the store's change feed. From the return of TNX_OK until
   * unwatch returns (or close begins), every save and delete committed to
   * the location, through this store, another store of this process or, for
   * a TNX_CAP_MULTI_PROCESS store, another process, is reported to `sink`
   * (tnx_change_sink) as a TNX_CHANGE_SAVED or TNX_CHANGE_DELETED naming the
   * id and version. The promises a host builds on:
   *  - never early: when the sink hears "id now has version V", a get of id
   *    returns version V or later (the notice follows the commit);
   *  - nothing lost silently: a change the store cannot vouch it reported
   *    is covered by a TNX_CHANGE_GAP, after which the host re-reads;
   *  - per id, versions arrive in increasing order or coalesced (a later
   *    version may stand for earlier ones); the same change may arrive twice
   *    (e.g. at once from the saving thread and again from a poll of the
   *    database): the host ignores a version it already has.
   * Changes of this process's own saves are reported before save returns to
   * its caller or soon after; other processes' within the store's documented
   * delay (the plugin's documentation names the mechanism, e.g. PostgreSQL
   * LISTEN/NOTIFY, SQLite's data_version, and the delay).
   * At most one feed per store: the host fans it out to its own listeners.
   * Returns TNX_OK, TNX_EINVAL (sink NULL, or already watching),
   * TNX_EUNSUPPORTED (the store offers no feed: e.g. opened read-only, or a
   * plugin that cannot report other processes' changes for this location),
   * TNX_EIO (e.g. the listening connection could not be opened),
   * TNX_EINTERNAL. May be NULL (no feed; so is a store whose capabilities
   * lack TNX_CAP_CHANGE_FEED: the host then polls).
   * Threading: may run concurrently with other calls of the store except
   * close; ownership: sink_ctx is the host's, used until unwatch returns.
   */
  tnx_status (*watch)(tnx_store *store, tnx_change_sink sink, void *sink_ctx, char *err,
                      uint32_t err_cap);

  /**
   * unwatch: stops the feed. When it returns, the sink is not running and
   * will not be called again, so the host may free sink_ctx. Never called
   * from the sink. close stops a feed still running the same way.
   * Returns TNX_OK, TNX_EINVAL (not watching), TNX_EINTERNAL. May be NULL
   * only when watch is.
   */
  tnx_status (*unwatch)(tnx_store *store, char *err, uint32_t err_cap);

  /* ---- ABI 1.5: read only when TNX_HAS_FIELD(vt, tnx_store_vtable, m);
   *      a vtable of ABI 1.0..1.4 ends before it ---- */

  /**
   * save_stream: saves the records `source` hands over, one after the other,
   * however many (an import of a million Tasks): a store never needs more
   * than a bounded number of them at once. The store calls `source` until
   * it says the end (or a record fails); each record and its expected
   * version are as rec and expected_version of save, checked in order (a
   * later record of an id sees the earlier one).
   * flags (TNX_SAVE_STREAM_* bits; an unknown bit is TNX_EUNSUPPORTED):
   *  - TNX_SAVE_STREAM_ONE_TRANSACTION: all records in one transaction, as
   *    save_batch: after TNX_OK all are stored (durably with
   *    TNX_CAP_DURABLE), after any failure none is. A store without
   *    transactions returns TNX_EUNSUPPORTED for it, before it calls
   *    `source` (so the host can ask again without the flag, having lost
   *    nothing of a stream it cannot rewind).
   *  - without it: each record is saved atomically as by save, the whole
   *    not; the store may defer durability work (fsyncs) and do it once per
   *    group of records, but returns only when every record it reports as
   *    saved is durable (with TNX_CAP_DURABLE). After a crash during the
   *    call, each record of it is stored whole or not at all (old version
   *    or new), in no promised order.
   * *out_done (never NULL): on TNX_OK the number of records saved; on
   * failure the index of the record that failed (counted from 0 in the
   * order `source` delivered them; the number delivered before it when
   * `source` itself stopped the save). With ONE_TRANSACTION nothing was
   * written; without it exactly the records before *out_done are saved
   * (durably), except on TNX_EIO whose message says the outcome of some
   * is unknown.
   * `source` is called on the calling thread or, while the caller waits in
   * save_stream, on a thread of the store; never concurrently with itself,
   * and never after save_stream returned. It must not call back into the
   * store. A record it hands over (and everything it points to) stays
   * valid until the next call of `source` or the return of save_stream.
   * When `source` returns a status other than TNX_OK the store stops,
   * undoes the transaction (ONE_TRANSACTION) or makes what it saved
   * durable (without), and returns that same status (the host knows why).
   * May be NULL, and may return TNX_EUNSUPPORTED without calling `source`:
   * the host then uses save_batch or save (`toolnexus store put` says what
   * that means for the import).
   * Returns TNX_OK, TNX_ECONFLICT, TNX_EINVAL, TNX_EIO, TNX_EUNSUPPORTED
   * (the flags, or the store opened read-only), TNX_EINTERNAL, or the
   * status `source` returned. Threading as save.
   */
  tnx_status (*save_stream)(tnx_store *store, tnx_record_source source, void *source_ctx,
                            uint32_t flags, uint64_t *out_done, char *err, uint32_t err_cap);
} tnx_store_vtable;

/* ======================================================================== */
/* Descriptor                                                               */
/* ======================================================================== */

/** capabilities bits of tnx_plugin_descriptor. */
/** Functions of one store may be called concurrently. Without it the host
 *  serialises calls on each store. */
#define TNX_CAP_THREAD_SAFE ((uint64_t)1u << 0)
/** list honours page_size and produces cursors (otherwise the host expects
 *  all matches in one call and pages itself). */
#define TNX_CAP_PAGINATED_LIST ((uint64_t)1u << 1)
/** save/del honour expected_version (compare-and-set). */
#define TNX_CAP_COMPARE_AND_SET ((uint64_t)1u << 2)
/** A save reported TNX_OK survives a process crash and a power loss. */
#define TNX_CAP_DURABLE ((uint64_t)1u << 3)
/** Several processes may open the same location at once, and
 *  compare-and-set holds between them. */
#define TNX_CAP_MULTI_PROCESS ((uint64_t)1u << 4)
/** Tasks outlive the process (not an in-memory store). */
#define TNX_CAP_PERSISTENT ((uint64_t)1u << 5)
/** ABI 1.4: the vtable's watch and unwatch work for this store: every
 *  change of the location, also by other processes when the store has
 *  TNX_CAP_MULTI_PROCESS, is reported (tnx_store_vtable.watch). A plugin
 *  that can offer it only for some locations clears it per store. */
#define TNX_CAP_CHANGE_FEED ((uint64_t)1u << 6)
/** ABI 1.5: the store keeps tnx_task_record.due_us with every record
 *  (durably, like the record, when persistent) and answers a list with
 *  TNX_FILTER_DUE_BEFORE from an index: its cost grows with the records
 *  due, not with the records stored. A host sweeps "what is due" with it
 *  instead of listing every Task. */
#define TNX_CAP_DUE_INDEX ((uint64_t)1u << 7)

/** What the host tells the plugin about itself, passed to the entry. */
typedef struct tnx_host_info {
  tnx_abi_header header;
  /** Host program name, NUL-terminated, e.g. "toolnexus". */
  const char *host_name;
  /** Host version, NUL-terminated, e.g. "0.1.0". */
  const char *host_version;
} tnx_host_info;

/**
 * ABI 1.6: what the host offers a plugin during open (tnx_open_args.services).
 * A decorator plugin (a store that wraps another store, like an SQLite VFS
 * shim: `encrypt:key=/etc/tnx/key;sqlite:/var/lib/tnx/tasks.db`) is built
 * against this header only: it asks the host to open the inner store.
 *
 * Lifetime: the table and host_ctx are valid during the open call only. A
 * store opened by open_inner is valid until the decorator calls close on it
 * (through the vtable open_inner returned), which it must do exactly once,
 * from its own close (or on its own failed open).
 */
typedef struct tnx_host_services {
  tnx_abi_header header;
  /** The host's, passed back to every function of this table. */
  void *host_ctx;
  /**
   * open_inner: opens the store `selector` names (any selector the host
   * accepts, itself possibly a decorator: "faults:rate=0.1;sqlite:/x.db"),
   * with the TNX_OPEN_* `flags` (pass the decorator's own: a read-only
   * decorator opens its inner store read-only).
   * On TNX_OK: *out_vtable is a vtable of the current ABI whose every
   * function pointer is set (a function the inner plugin lacks returns
   * TNX_EUNSUPPORTED; watch is TNX_EUNSUPPORTED unless the inner store's
   * capabilities include TNX_CAP_CHANGE_FEED); *out_store the store to
   * pass to it; *out_capabilities (may be NULL) the inner store's
   * TNX_CAP_* bits. The host calls that vtable's functions under the inner
   * plugin's own threading rule (it serialises them when the inner store
   * lacks TNX_CAP_THREAD_SAFE), and records of the inner plugin reach the
   * decorator's sinks as that plugin wrote them: read fields newer than
   * ABI 1.0 with TNX_HAS_FIELD.
   * Capabilities: after the decorator's open returns, the host keeps of the
   * decorator's capabilities only those every inner store it opened has
   * too (a decorated store keeps what both layers keep).
   * Failures: the inner open's status (TNX_EINVAL for a selector no plugin
   * serves or one nested too deep, ...), with a message naming the inner
   * selector (passwords masked). Nothing is to be closed then.
   * Thread-safe; may be called several times during one open (a decorator
   * over two stores).
   */
  tnx_status (*open_inner)(void *host_ctx, tnx_str selector, uint32_t flags,
                           const tnx_store_vtable **out_vtable, tnx_store **out_store,
                           uint64_t *out_capabilities, char *err, uint32_t err_cap);
} tnx_host_services;

/** Arguments of open(). */
typedef struct tnx_open_args {
  tnx_abi_header header;
  /** The scheme of the selector, as listed in the descriptor ("file"). */
  tnx_str scheme;
  /** Everything after "<scheme>:" in the selector (may be empty; may contain
   *  "?option=value&..." if the plugin documents options). For schemes that
   *  are URIs (postgresql://...) the full selector is in `selector`. */
  tnx_str location;
  /** The whole selector as the user wrote it. May contain secrets: never put
   *  it in an error message as is. */
  tnx_str selector;

  /* ---- ABI 1.2: read only when TNX_HAS_FIELD(args, tnx_open_args, m);
   *      a 1.0/1.1 host did not send them (treat as 0 / NULL) ---- */

  /** TNX_OPEN_* bits; unknown bits must be refused with TNX_EUNSUPPORTED
   *  (a plugin never ignores a request it does not understand). */
  uint32_t flags;
  /** Reserved, 0. */
  uint32_t reserved0;
  /** In/out, may be NULL. The host stores the descriptor's capabilities
   *  here before the call; on TNX_OK the plugin may clear bits that do not
   *  hold for this store (e.g. TNX_CAP_DURABLE when opened with
   *  synchronous=off). Setting a bit the descriptor lacks is an ABI error.
   *  Borrowed for the duration of the call. */
  uint64_t *capabilities;

  /* ---- ABI 1.6: read only when TNX_HAS_FIELD(args, tnx_open_args, m);
   *      a host of ABI 1.0..1.5 did not send it (treat as NULL) ---- */

  /** What the host offers during this open (see tnx_host_services), or
   *  NULL. A decorator plugin that finds it missing (an older host) fails
   *  its open with TNX_EUNSUPPORTED and a message saying it needs a host of
   *  ABI 1.6 with host services, never crashes. Borrowed for the call. */
  const tnx_host_services *services;
} tnx_open_args;

/** open flag: the host will only call get, list and close on this store
 *  (inspection: `toolnexus store get|list|check`, the source of a copy).
 *  The plugin must create, migrate and repair nothing while opening (no
 *  directory, file, table, schema change or clean-up of stray files); when
 *  no store exists at the location it returns TNX_ENOTFOUND naming the
 *  location. A location that exists but holds nothing yet, where that is
 *  how the store looks right after a normal open (e.g. an empty directory
 *  for a file-per-Task store), is an empty store, not TNX_ENOTFOUND.
 *  save and del on such a store return TNX_EUNSUPPORTED.
 *  A plugin older than ABI 1.2 never sees this flag; the host then still
 *  refuses save/del itself but cannot stop open from creating. */
#define TNX_OPEN_READ_ONLY ((uint32_t)1u << 0)
/** Every TNX_OPEN_* bit of this ABI version. */
#define TNX_OPEN_ALL TNX_OPEN_READ_ONLY

/**
 * open: creates a store for `args->location`. On TNX_OK, *out_store receives
 * a store that stays valid until close(). On failure *out_store is untouched
 * and the message says what was wrong with the location and where.
 * Returns TNX_OK, TNX_EINVAL (bad location or option), TNX_ENOTFOUND (with
 * TNX_OPEN_READ_ONLY: nothing is stored at the location), TNX_EIO,
 * TNX_ECORRUPT (existing data unreadable), TNX_EUNSUPPORTED (e.g. schema too
 * new, an unknown TNX_OPEN_* bit), TNX_EINTERNAL.
 * Thread-safe: may be called concurrently.
 */
typedef tnx_status (*tnx_open_fn)(const tnx_open_args *args,
                                  tnx_store **out_store, char *err,
                                  uint32_t err_cap);

/**
 * What the entry function returns. Static storage in the plugin: valid until
 * the library is unloaded (the host never unloads a library a live store came
 * from). All pointers non-NULL unless stated.
 */
typedef struct tnx_plugin_descriptor {
  tnx_abi_header header;
  /** Plugin name, NUL-terminated, e.g. "toolnexus-file". */
  const char *name;
  /** Plugin version, NUL-terminated, e.g. "1.2.0". */
  const char *version;
  /** One-line description, NUL-terminated; may be NULL. */
  const char *description;
  /** NULL-terminated array of schemes served (lower-case [a-z0-9+.-]+, no
   *  colon), at least one. */
  const char *const *schemes;
  /** TNX_CAP_* bits. */
  uint64_t capabilities;
  /** Opens a store. */
  tnx_open_fn open;
  /** The vtable of every store this plugin opens. */
  const tnx_store_vtable *vtable;

  /* ---- ABI 1.1: read only when TNX_HAS_FIELD(d, tnx_plugin_descriptor, m) ---- */

  /** How a selector for this plugin is written, NUL-terminated, shown in
   *  listings and error messages, e.g. "file:<dir>" or
   *  "sqlite:<path>[?synchronous=full|normal]". May be NULL. */
  const char *location_syntax;
} tnx_plugin_descriptor;

/**
 * The entry function type. `host` is valid during the call only. Returns the
 * descriptor, or NULL when the plugin cannot work with this host (for example
 * a different ABI major); never throws.
 */
typedef const tnx_plugin_descriptor *(*tnx_plugin_entry_fn)(
    const tnx_host_info *host);

#ifndef TNX_NO_ENTRY_DECLARATION
/** The entry function a plugin defines (and exports; nothing else). Declared
 *  here so the compiler checks the plugin's definition against it. */
TNX_PLUGIN_EXPORT const tnx_plugin_descriptor *toolnexus_plugin_entry(
    const tnx_host_info *host);
#endif

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* TOOLNEXUS_TASK_STORE_H */

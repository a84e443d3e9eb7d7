/*
 * kv_plugin.c: the "kv" Task store, a complete toolnexus storage plugin in
 * C11. It is the worked example of the plugin authoring guide: read it top to
 * bottom; every step that is not obvious says why it is done that way.
 *
 *   selector   kv:<dir>            read-write; <dir> is created if missing
 *              kv:<dir>?salvage    read-only, for reading a damaged log
 *   The host's TNX_OPEN_READ_ONLY (ABI 1.2, `toolnexus store get|list|check`)
 *   opens read-only too: nothing is created, a missing log is TNX_ENOTFOUND.
 *
 * The only dependency is <toolnexus/task_store.h> (the C ABI, v1.2) plus
 * POSIX. Nothing here is C++ and nothing is linked from toolnexus.
 *
 * ---------------------------------------------------------------------------
 * Design
 * ---------------------------------------------------------------------------
 * One append-only log file, <dir>/tasks.kvlog. Every save appends a "put"
 * record holding the whole Task, every delete a "delete" record; the newest
 * record of an id wins. In memory an index (a hash table from id to the
 * latest record) holds each live Task's index fields and the offset of its
 * record; the Task JSON itself stays on disk and is read back with pread()
 * on get and list. Opening a store replays the log to rebuild the index.
 *
 * Durability: a save writes its record at the end of the log and calls
 * fdatasync() before it returns TNX_OK, so the Task survives a power loss
 * (TNX_CAP_DURABLE). The index is updated only after that, so no reader ever
 * sees a Task that is not yet on disk.
 *
 * Crash recovery: a crash during a save leaves at most one incomplete record
 * at the end of the log (a "torn tail"). Open detects it (short record, bad
 * checksum, or zeros) and truncates the log just before it; that save never
 * returned TNX_OK, so nothing promised is lost. A bad record followed by
 * good ones cannot come from a crash: it is real corruption (a bad disk, a
 * stray write), and open fails with TNX_ECORRUPT naming the file and offset
 * instead of silently dropping data. "kv:<dir>?salvage" then opens the log
 * read-only: the good records read normally, each damaged stretch is
 * listed (with deliver_corrupt) under the name "tasks.kvlog@<offset>", so
 * `toolnexus store copy 'kv:<dir>?salvage' kv:<newdir>` rescues the rest.
 *
 * Versions are one counter for the whole store: every save or delete takes
 * the next number, which is written in its record. So a version never
 * repeats, not even for an id deleted and created again, and reopening the
 * store continues the numbering (TNX_CAP_PERSISTENT versions).
 *
 * Compaction: when the log is more than twice the size of its live records
 * (and at least 64 KiB of it is dead), open rewrites it with only the live
 * records, into tasks.kvlog.compact, fsynced, then renamed over the log.
 *
 * One process at a time: open takes flock(LOCK_EX) on the log, so a second
 * process (or a second store on the same directory in this process) gets
 * TNX_EIO "already open by another process". Hence no TNX_CAP_MULTI_PROCESS.
 *
 * Threads: the store is TNX_CAP_THREAD_SAFE. get and list take a read lock
 * on the index; save and delete are serialised by a writer mutex and take
 * the index lock for writing only for the moment they change the index, not
 * during the fsync, so reads never wait for the disk.
 *
 * ---------------------------------------------------------------------------
 * Log format (all integers little-endian, whatever the machine)
 * ---------------------------------------------------------------------------
 * File header, 32 bytes:
 *    0  8  magic "TNXKVLOG"
 *    8  4  format version, 1
 *   12  4  flags, 0
 *   16  8  base version: the version counter starts above it (set by
 *          compaction, which may drop the records that held the highest)
 *   24  4  CRC-32 of bytes 0..23
 *   28  4  zero
 * Then records, back to back. Record header, 56 bytes:
 *    0  4  magic "KVR1"
 *    4  1  op: 1 put, 2 delete
 *    5  3  zero
 *    8 24  six uint32 lengths: id, contextId, state, owner, tenant, Task JSON
 *          (a delete has only the id)
 *   32  8  status time, microseconds since 1970 (int64; INT64_MIN = none)
 *   40  8  version
 *   48  4  CRC-32 of the payload
 *   52  4  CRC-32 of header bytes 0..51
 * then the payload: the six fields' bytes back to back, in that order.
 * CRC-32 is the IEEE/zlib one (zlib's crc32() gives the same values); it is
 * computed here with a 16-entry table so the plugin links nothing.
 * The header has its own checksum so that its lengths can be trusted before
 * the payload is read: a record with a good header and a bad payload is
 * skipped exactly, and a scan for the next good record knows where to look.
 *
 * Limits: a record (header and all fields) is at most 1 GiB; a save of a
 * bigger Task is TNX_EINVAL.
 */

/* pread/pwrite, fdatasync, mmap, XSI strerror_r, pthread rwlocks are POSIX;
 * flock is BSD. With -std=c11 (no GNU extensions) they must be asked for. */
#define _DEFAULT_SOURCE
#define _POSIX_C_SOURCE 200809L

#include "toolnexus/task_store.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

/* ======================================================================== */
/* Constants                                                                */
/* ======================================================================== */

#define KV_LOG_NAME "tasks.kvlog"
#define KV_COMPACT_SUFFIX ".compact"

#define KV_FILE_MAGIC "TNXKVLOG"
#define KV_FORMAT 1u
#define KV_FILE_HDR 32u

#define KV_REC_MAGIC "KVR1"
#define KV_REC_HDR 56u
#define KV_OP_PUT 1u
#define KV_OP_DEL 2u
#define KV_MAX_RECORD ((uint64_t)1 << 30) /* 1 GiB, header included */

/* Compact on open when the log exceeds twice its live bytes and at least
 * this much of it is dead (so a small store is not rewritten every time). */
#define KV_COMPACT_MIN_DEAD ((uint64_t)64 * 1024)

/* Cursor: "<time>.<hex of id>", at most 1024 bytes (the ABI's limit). Ids
 * longer than KV_CURSOR_PREFIX bytes are written as the hex of their first
 * KV_CURSOR_PREFIX bytes plus ".<FNV-1a 64 of the whole id>":
 * 20 + 1 + 960 + 1 + 16 = 998 bytes at most. */
#define KV_CURSOR_MAX 1024u
#define KV_CURSOR_PREFIX 480u

/* The fields of a record, in log order. */
enum { KV_ID, KV_CONTEXT, KV_STATE, KV_OWNER, KV_TENANT, KV_JSON, KV_NFIELDS };
/* The fields the in-memory index keeps (all but the JSON). */
#define KV_INDEXED_FIELDS KV_JSON

/* Smallest structs a 1.0 host can send: up to their last 1.0 field. Fields
 * past these are read only when TNX_HAS_FIELD says the host sent them. */
#define KV_MIN_RECORD_SIZE (offsetof(tnx_task_record, version) + sizeof(uint64_t))
#define KV_MIN_QUERY_SIZE (offsetof(tnx_list_query, omit_json) + sizeof(uint32_t))
#define KV_MIN_OPEN_ARGS_SIZE (offsetof(tnx_open_args, selector) + sizeof(tnx_str))

/* ======================================================================== */
/* Error messages                                                           */
/* ======================================================================== */

/* Cuts an incomplete UTF-8 sequence off the end of the first `len` bytes of
 * `s` (s[len] is the NUL), so a truncated message stays valid UTF-8. */
static void kv_trim_utf8(char *s, size_t len) {
  size_t i = len, cont = 0, need;
  unsigned char lead;
  while (i > 0 && cont < 3 && ((unsigned char)s[i - 1] & 0xC0u) == 0x80u) {
    --i;
    ++cont;
  }
  if (i == 0) return;
  lead = (unsigned char)s[i - 1];
  need = lead >= 0xF0u ? 3 : lead >= 0xE0u ? 2 : lead >= 0xC0u ? 1 : 0;
  if (need > cont) s[i - 1] = '\0';
}

/* Writes a printf-style message into the host's error buffer and returns
 * `status`, so failures read `return kv_fail(err, cap, TNX_EIO, ...)`.
 * vsnprintf() never writes more than `cap` bytes and always NUL-terminates:
 * the ABI forbids writing past err_cap, and the buffer may be NULL when the
 * capacity is 0. */
__attribute__((format(printf, 4, 5))) static tnx_status kv_fail(char *err, uint32_t cap, tnx_status status,
                                                                const char *fmt, ...) {
  va_list ap;
  int n;
  if (err == NULL || cap == 0) return status;
  va_start(ap, fmt);
  n = vsnprintf(err, cap, fmt, ap);
  va_end(ap);
  if (n < 0) {
    err[0] = '\0';
  } else if ((uint64_t)n >= cap) {
    kv_trim_utf8(err, (size_t)cap - 1);
  }
  return status;
}

/* strerror() is not guaranteed thread-safe; the XSI strerror_r is. */
typedef struct kv_errtext {
  char text[128];
} kv_errtext;

static kv_errtext kv_strerror(int e) {
  kv_errtext t;
  if (strerror_r(e, t.text, sizeof t.text) != 0) snprintf(t.text, sizeof t.text, "error %d", e);
  return t;
}

/* An id as it appears in a message: printable ASCII as is, other bytes as
 * \xHH (ids are any UTF-8, and a message must stay valid UTF-8 even when
 * truncated), cut after about 80 characters. */
typedef struct kv_quoted {
  char text[100];
} kv_quoted;

static kv_quoted kv_quote(const char *s, size_t n) {
  static const char hex[] = "0123456789ABCDEF";
  kv_quoted q;
  size_t o = 0, i;
  q.text[o++] = '\'';
  for (i = 0; i < n; ++i) {
    unsigned char c = (unsigned char)s[i];
    if (o > 80) {
      memcpy(q.text + o, "...", 3);
      o += 3;
      break;
    }
    if (c >= 0x20 && c < 0x7F && c != '\\' && c != '\'') {
      q.text[o++] = (char)c;
    } else {
      q.text[o++] = '\\';
      q.text[o++] = 'x';
      q.text[o++] = hex[c >> 4];
      q.text[o++] = hex[c & 15u];
    }
  }
  q.text[o++] = '\'';
  q.text[o] = '\0';
  return q;
}

/* ======================================================================== */
/* Bytes: little-endian integers, CRC-32, FNV-1a                            */
/* ======================================================================== */

/* Integers are written byte by byte so the file reads the same on any CPU. */
static void kv_put32(unsigned char *p, uint32_t v) {
  p[0] = (unsigned char)(v & 0xFFu);
  p[1] = (unsigned char)((v >> 8) & 0xFFu);
  p[2] = (unsigned char)((v >> 16) & 0xFFu);
  p[3] = (unsigned char)((v >> 24) & 0xFFu);
}

static void kv_put64(unsigned char *p, uint64_t v) {
  kv_put32(p, (uint32_t)(v & 0xFFFFFFFFu));
  kv_put32(p + 4, (uint32_t)(v >> 32));
}

static uint32_t kv_get32(const unsigned char *p) {
  return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static uint64_t kv_get64(const unsigned char *p) {
  return (uint64_t)kv_get32(p) | ((uint64_t)kv_get32(p + 4) << 32);
}

/* int64 <-> uint64 without implementation-defined conversions. */
static uint64_t kv_i64_bits(int64_t v) {
  uint64_t u;
  memcpy(&u, &v, sizeof u);
  return u;
}

static int64_t kv_bits_i64(uint64_t u) {
  int64_t v;
  memcpy(&v, &u, sizeof v);
  return v;
}

/* CRC-32 (IEEE 802.3, reflected polynomial 0xEDB88320), four bits at a time.
 * kv_crc32(kv_crc32(0, a), b) is the CRC of a followed by b, as in zlib. */
static const uint32_t kv_crc_nibble[16] = {
    0x00000000u, 0x1DB71064u, 0x3B6E20C8u, 0x26D930ACu, 0x76DC4190u, 0x6B6B51F4u, 0x4DB26158u, 0x5005713Cu,
    0xEDB88320u, 0xF00F9344u, 0xD6D6A3E8u, 0xCB61B38Cu, 0x9B64C2B0u, 0x86D3D2D4u, 0xA00AE278u, 0xBDBDF21Cu};

static uint32_t kv_crc32(uint32_t crc, const void *data, size_t n) {
  const unsigned char *p = (const unsigned char *)data;
  crc = ~crc;
  while (n-- > 0) {
    crc ^= *p++;
    crc = (crc >> 4) ^ kv_crc_nibble[crc & 15u];
    crc = (crc >> 4) ^ kv_crc_nibble[crc & 15u];
  }
  return ~crc;
}

/* FNV-1a 64: the hash table's hash, and the check value of long-id cursors. */
static uint64_t kv_fnv1a(const char *s, size_t n) {
  uint64_t h = 0xCBF29CE484222325u;
  size_t i;
  for (i = 0; i < n; ++i) {
    h ^= (unsigned char)s[i];
    h *= 0x100000001B3u;
  }
  return h;
}

/* Bytewise comparison of two byte strings, shorter first on a common prefix:
 * the id order the ABI prescribes ("ties by id ascending (bytewise)"). */
static int kv_bytes_cmp(const char *a, size_t an, const char *b, size_t bn) {
  int c = memcmp(a, b, an < bn ? an : bn);
  if (c != 0) return c;
  return an < bn ? -1 : an > bn ? 1 : 0;
}

/* ======================================================================== */
/* Log records                                                              */
/* ======================================================================== */

/* A decoded record header. */
typedef struct kv_hdr {
  uint32_t op;
  uint32_t len[KV_NFIELDS];
  int64_t time_us;
  uint64_t version;
  uint32_t payload_crc;
  uint64_t extent; /* header + payload bytes */
} kv_hdr;

/* Decodes the record header at `p`, of which `avail` bytes exist up to the
 * end of the file (or of the buffer). Returns NULL when it is sound, else
 * why not. */
static const char *kv_parse_header(const unsigned char *p, uint64_t avail, kv_hdr *h) {
  int i;
  uint64_t extent = KV_REC_HDR;
  if (avail < KV_REC_HDR) return "record header cut short";
  if (memcmp(p, KV_REC_MAGIC, 4) != 0) return "no record magic";
  if (kv_crc32(0, p, 52) != kv_get32(p + 52)) return "record header checksum mismatch";
  /* From here the header is what a kv plugin wrote; a check failing below
   * means a writer bug or a future format, not random damage. */
  h->op = p[4];
  if ((h->op != KV_OP_PUT && h->op != KV_OP_DEL) || p[5] != 0 || p[6] != 0 || p[7] != 0)
    return "unknown record type";
  for (i = 0; i < KV_NFIELDS; ++i) {
    h->len[i] = kv_get32(p + 8 + 4 * i);
    extent += h->len[i];
    if (i > KV_ID && h->op == KV_OP_DEL && h->len[i] != 0) return "delete record with fields";
  }
  if (h->len[KV_ID] == 0) return "record with an empty id";
  if (extent > KV_MAX_RECORD) return "record larger than 1 GiB";
  h->time_us = kv_bits_i64(kv_get64(p + 32));
  h->version = kv_get64(p + 40);
  h->payload_crc = kv_get32(p + 48);
  h->extent = extent;
  if (extent > avail) return "record runs past the end of the file";
  return NULL;
}

/* Checks the whole record at `p` (header and payload). */
static const char *kv_check_record(const unsigned char *p, uint64_t avail, kv_hdr *h) {
  const char *why = kv_parse_header(p, avail, h);
  if (why != NULL) return why;
  if (kv_crc32(0, p + KV_REC_HDR, (size_t)(h->extent - KV_REC_HDR)) != h->payload_crc)
    return "record payload checksum mismatch";
  return NULL;
}

/* Builds a whole record in one malloc'd buffer, all but the version and the
 * header checksum (kv_seal() adds them once the version is known, under the
 * writer lock; the expensive part, copying and checksumming a Task of up to
 * 1 GiB, happens here, outside it). Returns NULL when out of memory. */
static unsigned char *kv_encode(uint32_t op, const tnx_str f[KV_NFIELDS], int64_t time_us, size_t *out_n) {
  uint64_t extent = KV_REC_HDR;
  unsigned char *buf, *w;
  int i;
  for (i = 0; i < KV_NFIELDS; ++i) extent += f[i].len;
  buf = (unsigned char *)malloc((size_t)extent);
  if (buf == NULL) return NULL;
  memcpy(buf, KV_REC_MAGIC, 4);
  buf[4] = (unsigned char)op;
  buf[5] = buf[6] = buf[7] = 0;
  w = buf + KV_REC_HDR;
  for (i = 0; i < KV_NFIELDS; ++i) {
    kv_put32(buf + 8 + 4 * i, (uint32_t)f[i].len);
    /* Copying the borrowed input is what lets us keep it: the host's bytes
     * are valid only until this call returns. (memcpy with a NULL source is
     * undefined even for 0 bytes, hence the test.) */
    if (f[i].len != 0) memcpy(w, f[i].data, (size_t)f[i].len);
    w += f[i].len;
  }
  kv_put64(buf + 32, kv_i64_bits(time_us));
  kv_put64(buf + 40, 0);
  kv_put32(buf + 48, kv_crc32(0, buf + KV_REC_HDR, (size_t)(extent - KV_REC_HDR)));
  *out_n = (size_t)extent;
  return buf;
}

static void kv_seal(unsigned char *buf, uint64_t version) {
  kv_put64(buf + 40, version);
  kv_put32(buf + 52, kv_crc32(0, buf, 52));
}

/* ======================================================================== */
/* The index: a hash table from id to the latest record                     */
/* ======================================================================== */

/* One live Task (or, in salvage mode, one damaged stretch of the log). One
 * allocation: the struct, then the id, contextId, state, owner and tenant
 * bytes back to back in `text`. The JSON is not kept: it is read from the
 * log when needed, so a store of large Tasks does not live in memory. */
typedef struct kv_entry {
  struct kv_entry *next; /* next entry in the same bucket */
  uint64_t hash;         /* kv_fnv1a of the id */
  uint64_t offset;       /* where its record starts in the log */
  uint64_t extent;       /* bytes of the record (or of the damaged stretch) */
  uint64_t version;
  int64_t time_us;
  uint32_t len[KV_NFIELDS]; /* len[KV_JSON] is the JSON's length on disk */
  int damaged;              /* salvage mode: an undecodable stretch, not a Task */
  char text[];
} kv_entry;

static const char *kv_field(const kv_entry *e, int field) {
  const char *p = e->text;
  int i;
  for (i = 0; i < field; ++i) p += e->len[i];
  return p;
}

/* A new entry for the record whose header is `h` and whose payload starts at
 * `payload`; NULL when out of memory. */
static kv_entry *kv_entry_new(const kv_hdr *h, const unsigned char *payload, uint64_t offset) {
  size_t text = 0;
  int i;
  kv_entry *e;
  for (i = 0; i < KV_INDEXED_FIELDS; ++i) text += h->len[i];
  e = (kv_entry *)malloc(sizeof *e + text);
  if (e == NULL) return NULL;
  e->next = NULL;
  e->offset = offset;
  e->extent = h->extent;
  e->version = h->version;
  e->time_us = h->time_us;
  for (i = 0; i < KV_NFIELDS; ++i) e->len[i] = h->len[i];
  e->damaged = 0;
  if (text != 0) memcpy(e->text, payload, text);
  e->hash = kv_fnv1a(e->text, e->len[KV_ID]);
  return e;
}

typedef struct kv_index {
  kv_entry **buckets;
  size_t nbuckets; /* a power of two */
  size_t count;
} kv_index;

static int kv_index_init(kv_index *ix) {
  ix->nbuckets = 64;
  ix->count = 0;
  ix->buckets = (kv_entry **)calloc(ix->nbuckets, sizeof *ix->buckets);
  return ix->buckets != NULL;
}

static void kv_index_free(kv_index *ix) {
  size_t b;
  if (ix->buckets == NULL) return;
  for (b = 0; b < ix->nbuckets; ++b) {
    kv_entry *e = ix->buckets[b];
    while (e != NULL) {
      kv_entry *next = e->next;
      free(e);
      e = next;
    }
  }
  free(ix->buckets);
  ix->buckets = NULL;
  ix->count = 0;
}

/* The link that points at the entry of `id` (or at the NULL ending its
 * bucket when there is none), so one function serves find, insert, remove. */
static kv_entry **kv_index_link(const kv_index *ix, const char *id, size_t n, uint64_t hash) {
  kv_entry **link = &ix->buckets[hash & (ix->nbuckets - 1)];
  while (*link != NULL &&
         !((*link)->hash == hash && (*link)->len[KV_ID] == n && memcmp((*link)->text, id, n) == 0))
    link = &(*link)->next;
  return link;
}

static kv_entry *kv_index_find(const kv_index *ix, const char *id, size_t n) {
  return *kv_index_link(ix, id, n, kv_fnv1a(id, n));
}

/* Doubles the bucket array. On allocation failure the table just keeps its
 * size (longer chains, still correct): inserting then cannot fail, which
 * matters because save inserts after its record is already on disk. */
static void kv_index_grow(kv_index *ix) {
  size_t n = ix->nbuckets * 2, b;
  kv_entry **nb = (kv_entry **)calloc(n, sizeof *nb);
  if (nb == NULL) return;
  for (b = 0; b < ix->nbuckets; ++b) {
    kv_entry *e = ix->buckets[b];
    while (e != NULL) {
      kv_entry *next = e->next;
      e->next = nb[e->hash & (n - 1)];
      nb[e->hash & (n - 1)] = e;
      e = next;
    }
  }
  free(ix->buckets);
  ix->buckets = nb;
  ix->nbuckets = n;
}

/* Inserts `e`, replacing (and freeing) the entry of the same id. Never fails. */
static void kv_index_put(kv_index *ix, kv_entry *e) {
  kv_entry **link = kv_index_link(ix, e->text, e->len[KV_ID], e->hash);
  if (*link != NULL) {
    kv_entry *old = *link;
    e->next = old->next;
    *link = e;
    free(old);
    return;
  }
  e->next = NULL;
  *link = e;
  if (++ix->count > ix->nbuckets) kv_index_grow(ix);
}

/* Removes (and frees) the entry of `id`, if any. */
static void kv_index_remove(kv_index *ix, const char *id, size_t n) {
  kv_entry **link = kv_index_link(ix, id, n, kv_fnv1a(id, n));
  if (*link != NULL) {
    kv_entry *old = *link;
    *link = old->next;
    free(old);
    --ix->count;
  }
}

/* ======================================================================== */
/* The store                                                                */
/* ======================================================================== */

/* tnx_store is declared (never defined) by the ABI header: each plugin
 * defines it, so the handle the host holds is typed without casts. */
struct tnx_store {
  char *dir;  /* the directory, as given */
  char *path; /* <dir>/tasks.kvlog, for I/O and messages */
  int fd;     /* the log, open, flock'ed, O_CLOEXEC */
  int read_only; /* ?salvage, or the host's TNX_OPEN_READ_ONLY: change nothing */
  int salvage;   /* ?salvage: also read past damaged stretches */

  /* Serialises save and del: the version counter, the end of the log, and
   * the compare-and-set check (which reads the index without index_lock:
   * only holders of write_mu change the index). */
  pthread_mutex_t write_mu;
  /* Guards the index: read-locked by get and list, write-locked by save and
   * del only while they change it. Order: write_mu, then index_lock. */
  pthread_rwlock_t index_lock;
  int locks_ready;

  kv_index index;
  uint64_t end;          /* where the next record goes (write_mu) */
  uint64_t last_version; /* highest version given or read (write_mu) */
  int sync_failed;       /* an fdatasync failed: writes refused (write_mu) */
  int sync_errno;

  /* Salvage mode only: the damaged stretches of the log. */
  kv_entry **damaged;
  size_t ndamaged;
};

static void kv_destroy(tnx_store *s) {
  size_t i;
  if (s == NULL) return;
  if (s->locks_ready) {
    pthread_rwlock_destroy(&s->index_lock);
    pthread_mutex_destroy(&s->write_mu);
  }
  kv_index_free(&s->index);
  for (i = 0; i < s->ndamaged; ++i) free(s->damaged[i]);
  free(s->damaged);
  if (s->fd >= 0) close(s->fd);
  free(s->path);
  free(s->dir);
  free(s);
}

/* ---- small I/O helpers --------------------------------------------------- */

/* pwrite()/pread() may transfer fewer bytes than asked; loop until done. */
static int kv_pwrite_all(int fd, const unsigned char *p, size_t n, uint64_t off) {
  while (n > 0) {
    ssize_t w = pwrite(fd, p, n, (off_t)off);
    if (w < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    p += w;
    n -= (size_t)w;
    off += (uint64_t)w;
  }
  return 0;
}

/* Returns 0, or -1 with errno set, or -1 with errno 0 when the file ends
 * first (the caller calls that corruption, not an I/O error). */
static int kv_pread_all(int fd, unsigned char *p, size_t n, uint64_t off) {
  while (n > 0) {
    ssize_t r = pread(fd, p, n, (off_t)off);
    if (r < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    if (r == 0) {
      errno = 0;
      return -1;
    }
    p += r;
    n -= (size_t)r;
    off += (uint64_t)r;
  }
  return 0;
}

/* A new file (or a rename) is durable only once its directory entry is:
 * fsync the directory itself. */
static int kv_fsync_dir(const char *dir) {
  int rc, fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return -1;
  rc = fsync(fd);
  close(fd);
  return rc;
}

/* fsyncs the directory holding `path` (path is modified and restored). */
static int kv_fsync_parent(char *path) {
  char *slash = strrchr(path, '/');
  int rc;
  if (slash == NULL) return kv_fsync_dir(".");
  if (slash == path) return kv_fsync_dir("/");
  *slash = '\0';
  rc = kv_fsync_dir(path);
  *slash = '/';
  return rc;
}

/* mkdir -p. Directories are created 0700: Tasks hold conversations. Each
 * new directory is made durable in its parent, or a power loss could take
 * the directory, and with it the log, away after a save reported TNX_OK. */
static int kv_mkdirs(char *path) {
  char *p = path;
  struct stat st;
  if (stat(path, &st) == 0) {
    if (S_ISDIR(st.st_mode)) return 0;
    errno = ENOTDIR;
    return -1;
  }
  for (;;) {
    int made;
    while (*p == '/') ++p;
    p = strchr(p, '/');
    if (p != NULL) *p = '\0';
    made = mkdir(path, 0700) == 0;
    if ((!made && errno != EEXIST) || (made && kv_fsync_parent(path) != 0)) {
      if (p != NULL) *p = '/';
      return -1;
    }
    if (p == NULL) break;
    *p = '/';
  }
  return 0;
}

static char *kv_strndup(const char *s, size_t n) {
  char *d = (char *)malloc(n + 1);
  if (d == NULL) return NULL;
  memcpy(d, s, n);
  d[n] = '\0';
  return d;
}

static char *kv_concat(const char *a, const char *b) {
  size_t an = strlen(a), bn = strlen(b);
  char *d = (char *)malloc(an + bn + 1);
  if (d == NULL) return NULL;
  memcpy(d, a, an);
  memcpy(d + an, b, bn + 1);
  return d;
}

static void kv_file_header(unsigned char h[KV_FILE_HDR], uint64_t base_version) {
  memset(h, 0, KV_FILE_HDR);
  memcpy(h, KV_FILE_MAGIC, 8);
  kv_put32(h + 8, KV_FORMAT);
  kv_put64(h + 16, base_version);
  kv_put32(h + 24, kv_crc32(0, h, 24));
}

/* ---- open: location, lock, replay, recovery, compaction ------------------ */

/* Opens and locks the log. flock() locks the open file, not the name, so
 * after locking we check the name still leads to the file we locked: another
 * process's compaction may have renamed a new log over it in between, and a
 * lock on the old, unlinked file would protect nothing. */
static tnx_status kv_open_log(tnx_store *s, char *err, uint32_t cap) {
  const int flags = s->read_only ? O_RDONLY : (O_RDWR | O_CREAT);
  const int lock = s->read_only ? LOCK_SH : LOCK_EX;
  int attempt;
  for (attempt = 0; attempt < 100; ++attempt) {
    struct stat by_fd, by_name;
    /* O_CLOEXEC: a child the host forks must not inherit the descriptor, or
     * it would hold our lock after we close. 0600: Tasks are private. */
    int fd = open(s->path, flags | O_CLOEXEC, 0600);
    if (fd < 0) {
      int e = errno;
      if (s->read_only && e == ENOENT) /* nothing stored here, and we may not create */
        return kv_fail(err, cap, TNX_ENOTFOUND, "no kv store at '%s' (opened read-only, so not created)",
                       s->path);
      return kv_fail(err, cap, TNX_EIO, "cannot open '%s': %s", s->path, kv_strerror(e).text);
    }
    if (flock(fd, lock | LOCK_NB) != 0) {
      int e = errno;
      close(fd);
      if (e == EWOULDBLOCK)
        return kv_fail(err, cap, TNX_EIO,
                       "'%s' is already open by another process (or by another store in this one); "
                       "a kv store can be open in one place at a time",
                       s->path);
      return kv_fail(err, cap, TNX_EIO, "cannot lock '%s': %s", s->path, kv_strerror(e).text);
    }
    if (fstat(fd, &by_fd) == 0 && stat(s->path, &by_name) == 0 && by_fd.st_dev == by_name.st_dev &&
        by_fd.st_ino == by_name.st_ino) {
      s->fd = fd;
      return TNX_OK;
    }
    close(fd); /* replaced under us: try the new file */
  }
  return kv_fail(err, cap, TNX_EIO, "'%s' keeps being replaced while it is being opened", s->path);
}

/* Writes a fresh file header (new or torn-at-birth log) and makes it durable. */
static tnx_status kv_init_log(tnx_store *s, char *err, uint32_t cap) {
  unsigned char h[KV_FILE_HDR];
  kv_file_header(h, 0);
  if (ftruncate(s->fd, 0) != 0 || kv_pwrite_all(s->fd, h, sizeof h, 0) != 0 || fdatasync(s->fd) != 0 ||
      kv_fsync_dir(s->dir) != 0) {
    int e = errno;
    return kv_fail(err, cap, TNX_EIO, "cannot initialise '%s': %s", s->path, kv_strerror(e).text);
  }
  s->end = KV_FILE_HDR;
  return TNX_OK;
}

/* The first good record at or after `from`, or `size` when there is none.
 * Used after a bad record, to tell a torn tail (nothing good follows) from
 * damage in the middle. A false match would need a magic, a header CRC and
 * a payload CRC to agree by chance. */
static uint64_t kv_next_good(const unsigned char *map, uint64_t size, uint64_t from) {
  uint64_t p;
  kv_hdr h;
  for (p = from; p + KV_REC_HDR <= size; ++p) {
    if (map[p] != (unsigned char)KV_REC_MAGIC[0] || memcmp(map + p, KV_REC_MAGIC, 4) != 0) continue;
    if (kv_check_record(map + p, size - p, &h) == NULL) return p;
  }
  return size;
}

/* Salvage mode: remembers the damaged stretch [off, off+len) as a pseudo
 * entry named "tasks.kvlog@<offset>", which list delivers as a corrupt
 * record when the host asks for them (deliver_corrupt). */
static int kv_add_damaged(tnx_store *s, uint64_t off, uint64_t len) {
  char name[64];
  int n = snprintf(name, sizeof name, KV_LOG_NAME "@%020" PRIu64, off);
  kv_entry *e, **grown;
  if (n < 0) return 0;
  e = (kv_entry *)calloc(1, sizeof *e + (size_t)n);
  if (e == NULL) return 0;
  grown = (kv_entry **)realloc(s->damaged, (s->ndamaged + 1) * sizeof *grown);
  if (grown == NULL) {
    free(e);
    return 0;
  }
  memcpy(e->text, name, (size_t)n);
  e->len[KV_ID] = (uint32_t)n;
  e->hash = kv_fnv1a(e->text, e->len[KV_ID]);
  e->offset = off;
  e->extent = len;
  e->time_us = TNX_TIME_NONE; /* the ABI's value for a corrupt record */
  e->damaged = 1;
  s->damaged = grown;
  s->damaged[s->ndamaged++] = e;
  return 1;
}

/* Rewrites the log with only the live records: into tasks.kvlog.compact,
 * synced, then renamed over tasks.kvlog (rename is atomic: after a crash
 * there is either the old log or the new one, both complete). Compaction is
 * an optimisation, so any failure just keeps the old log. */
static void kv_compact(tnx_store *s, const unsigned char *map) {
  unsigned char h[KV_FILE_HDR];
  uint64_t off = KV_FILE_HDR;
  size_t b;
  char *tmp = kv_concat(s->path, KV_COMPACT_SUFFIX);
  int fd;
  if (tmp == NULL) return;
  fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    free(tmp);
    return;
  }
  /* Lock the new log before it gets the real name, so there is no moment
   * when tasks.kvlog is unlocked. */
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) goto fail;
  /* The base version keeps the counter above versions that only dropped
   * records (deleted Tasks) held. */
  kv_file_header(h, s->last_version);
  if (kv_pwrite_all(fd, h, sizeof h, 0) != 0) goto fail;
  for (b = 0; b < s->index.nbuckets; ++b) {
    const kv_entry *e;
    for (e = s->index.buckets[b]; e != NULL; e = e->next) {
      /* Records are copied verbatim: they carry their own checksums. */
      if (kv_pwrite_all(fd, map + e->offset, (size_t)e->extent, off) != 0) goto fail;
      off += e->extent;
    }
  }
  if (fdatasync(fd) != 0 || rename(tmp, s->path) != 0) goto fail;
  /* Past this point the new log is the log. If the directory sync fails the
   * rename may not survive a crash, which is harmless: both logs hold the
   * same Tasks. */
  (void)kv_fsync_dir(s->dir);
  /* Same iteration order as the copy above: the new offsets. */
  off = KV_FILE_HDR;
  for (b = 0; b < s->index.nbuckets; ++b) {
    kv_entry *e;
    for (e = s->index.buckets[b]; e != NULL; e = e->next) {
      e->offset = off;
      off += e->extent;
    }
  }
  close(s->fd);
  s->fd = fd;
  s->end = off;
  free(tmp);
  return;
fail:
  close(fd);
  unlink(tmp);
  free(tmp);
}

/* Replays the log into the index: the heart of open. */
static tnx_status kv_replay(tnx_store *s, char *err, uint32_t cap) {
  struct stat st;
  uint64_t size, off, live = KV_FILE_HDR;
  unsigned char *map;
  tnx_status status = TNX_OK;
  size_t b;

  if (fstat(s->fd, &st) != 0) {
    int e = errno;
    return kv_fail(err, cap, TNX_EIO, "cannot stat '%s': %s", s->path, kv_strerror(e).text);
  }
  size = (uint64_t)st.st_size;
#if SIZE_MAX < UINT64_MAX
  if (size > SIZE_MAX) return kv_fail(err, cap, TNX_EIO, "'%s' is too large for this machine", s->path);
#endif

  if (size <= KV_FILE_HDR) {
    /* An empty log is a new store. One no longer than a header was torn
     * while being created (the header is synced before any record is
     * written), provided what is there is the start of our header, or zeros
     * (a file whose size reached the disk but whose data did not). A whole,
     * sound header alone is a valid empty log: keep it (its base version). */
    unsigned char head[KV_FILE_HDR];
    size_t i, nonzero = 0;
    if (size != 0 && kv_pread_all(s->fd, head, (size_t)size, 0) != 0)
      return kv_fail(err, cap, TNX_EIO, "cannot read '%s'", s->path);
    for (i = 0; i < (size_t)size; ++i) nonzero += head[i] != 0;
    if (size < KV_FILE_HDR || nonzero == 0) {
      if (nonzero != 0 && memcmp(head, KV_FILE_MAGIC, size < 8 ? (size_t)size : 8) != 0)
        return kv_fail(err, cap, TNX_ECORRUPT, "'%s' is not a toolnexus kv log (%" PRIu64 " bytes, no magic)",
                       s->path, size);
      if (s->read_only) return TNX_OK;
      return kv_init_log(s, err, cap);
    }
  }

  /* mmap keeps the replay a plain walk over bytes. The lock keeps other kv
   * stores from changing the file meanwhile. */
  map = (unsigned char *)mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, s->fd, 0);
  if (map == MAP_FAILED) {
    int e = errno;
    return kv_fail(err, cap, TNX_EIO, "cannot map '%s': %s", s->path, kv_strerror(e).text);
  }

  /* The file header. */
  if (memcmp(map, KV_FILE_MAGIC, 8) != 0) {
    status = kv_fail(err, cap, TNX_ECORRUPT, "'%s' is not a toolnexus kv log (bad magic at offset 0)", s->path);
    goto out;
  }
  if (kv_crc32(0, map, 24) != kv_get32(map + 24)) {
    status = kv_fail(err, cap, TNX_ECORRUPT, "'%s': file header checksum mismatch at offset 0", s->path);
    goto out;
  }
  if (kv_get32(map + 8) != KV_FORMAT) {
    status = kv_fail(err, cap, TNX_EUNSUPPORTED,
                     "'%s' has log format %" PRIu32 "; this plugin reads format %u (written by a newer plugin?)",
                     s->path, kv_get32(map + 8), KV_FORMAT);
    goto out;
  }
  s->last_version = kv_get64(map + 16);

  /* The records. */
  off = KV_FILE_HDR;
  while (off < size) {
    kv_hdr h;
    const char *why = kv_check_record(map + off, size - off, &h);
    uint64_t next;
    if (why == NULL) {
      if (h.op == KV_OP_PUT) {
        kv_entry *e = kv_entry_new(&h, map + off + KV_REC_HDR, off);
        if (e == NULL) {
          status = kv_fail(err, cap, TNX_EINTERNAL, "out of memory reading '%s'", s->path);
          goto out;
        }
        kv_index_put(&s->index, e);
      } else {
        kv_index_remove(&s->index, (const char *)map + off + KV_REC_HDR, h.len[KV_ID]);
      }
      if (h.version > s->last_version) s->last_version = h.version;
      off += h.extent;
      continue;
    }
    /* A bad record. Is there a good one anywhere after it? (Scan from the
     * next byte: when the header is bad its lengths cannot be trusted.) */
    next = kv_next_good(map, size, off + 1);
    if (next == size) {
      /* Nothing good follows: the torn tail of an interrupted save, which
       * never returned TNX_OK. Cut it off so new records follow the last
       * whole one. (Read-only: just ignore it.) */
      if (!s->read_only && (ftruncate(s->fd, (off_t)off) != 0 || fdatasync(s->fd) != 0)) {
        int e = errno;
        status = kv_fail(err, cap, TNX_EIO, "cannot cut the torn tail off '%s' at offset %" PRIu64 ": %s",
                         s->path, off, kv_strerror(e).text);
        goto out;
      }
      size = off;
      break;
    }
    /* Good records follow: this is damage, not a crash. Never skip it
     * silently: fail, unless the user asked to salvage. */
    if (!s->salvage) {
      status = kv_fail(err, cap, TNX_ECORRUPT,
                       "'%s': corrupt record at offset %" PRIu64 " (%s; %" PRIu64 " bytes up to the next good "
                       "record); open 'kv:%s?salvage' to read the rest, e.g. with toolnexus store copy",
                       s->path, off, why, next - off, s->dir);
      goto out;
    }
    if (!kv_add_damaged(s, off, next - off)) {
      status = kv_fail(err, cap, TNX_EINTERNAL, "out of memory reading '%s'", s->path);
      goto out;
    }
    off = next;
  }
  s->end = size;

  for (b = 0; b < s->index.nbuckets; ++b) {
    const kv_entry *e;
    for (e = s->index.buckets[b]; e != NULL; e = e->next) live += e->extent;
  }
  if (!s->read_only && size > 2 * live && size - live >= KV_COMPACT_MIN_DEAD) kv_compact(s, map);

out:
  munmap(map, (size_t)st.st_size);
  return status;
}

/* Splits the location "<dir>[?option]" and checks the option. */
static tnx_status kv_parse_location(tnx_store *s, tnx_str loc, char *err, uint32_t cap) {
  const char *q;
  size_t dir_len;
  if (loc.len == 0) return kv_fail(err, cap, TNX_EINVAL, "kv: a directory is required, as in kv:<dir>");
  if (loc.data == NULL || memchr(loc.data, '\0', (size_t)loc.len) != NULL)
    return kv_fail(err, cap, TNX_EINVAL, "kv: the location contains a NUL byte");
  q = (const char *)memchr(loc.data, '?', (size_t)loc.len);
  dir_len = q == NULL ? (size_t)loc.len : (size_t)(q - loc.data);
  if (q != NULL) {
    size_t opt_len = (size_t)loc.len - dir_len - 1;
    if (opt_len == 7 && memcmp(q + 1, "salvage", 7) == 0) {
      s->read_only = s->salvage = 1;
    } else {
      return kv_fail(err, cap, TNX_EINVAL, "kv: unknown option %s (the only option is ?salvage)",
                     kv_quote(q + 1, opt_len > 64 ? 64 : opt_len).text);
    }
  }
  if (dir_len == 0) return kv_fail(err, cap, TNX_EINVAL, "kv: a directory is required, as in kv:<dir>");
  s->dir = kv_strndup(loc.data, dir_len);
  if (s->dir == NULL) return kv_fail(err, cap, TNX_EINTERNAL, "kv: out of memory");
  s->path = kv_concat(s->dir, "/" KV_LOG_NAME);
  if (s->path == NULL) return kv_fail(err, cap, TNX_EINTERNAL, "kv: out of memory");
  return TNX_OK;
}

static tnx_status kv_open(const tnx_open_args *args, tnx_store **out_store, char *err, uint32_t cap) {
  tnx_store *s;
  tnx_status st;
  if (args == NULL || out_store == NULL || args->header.abi_major != TNX_ABI_MAJOR ||
      args->header.struct_size < KV_MIN_OPEN_ARGS_SIZE)
    return kv_fail(err, cap, TNX_EINVAL, "kv: open called with bad arguments");
  s = (tnx_store *)calloc(1, sizeof *s);
  if (s == NULL) return kv_fail(err, cap, TNX_EINTERNAL, "kv: out of memory");
  s->fd = -1;
  if (!kv_index_init(&s->index)) {
    kv_destroy(s);
    return kv_fail(err, cap, TNX_EINTERNAL, "kv: out of memory");
  }
  /* Only the location: args->selector may hold secrets in other schemes'
   * selectors, so messages quote the directory we parsed, never it. */
  st = kv_parse_location(s, args->location, err, cap);
  /* ABI 1.2 open flags: only a 1.2+ host sends them (TNX_HAS_FIELD). A bit
   * we do not know is refused, never ignored. */
  if (st == TNX_OK && TNX_HAS_FIELD(args, tnx_open_args, flags)) {
    if ((args->flags & ~(uint32_t)TNX_OPEN_ALL) != 0)
      st = kv_fail(err, cap, TNX_EUNSUPPORTED, "kv: unknown open flags 0x%" PRIx32,
                   args->flags & ~(uint32_t)TNX_OPEN_ALL);
    else if ((args->flags & TNX_OPEN_READ_ONLY) != 0)
      s->read_only = 1;
  }
  if (st == TNX_OK && !s->read_only && kv_mkdirs(s->dir) != 0) {
    int e = errno;
    st = kv_fail(err, cap, TNX_EIO, "cannot create directory '%s': %s", s->dir, kv_strerror(e).text);
  }
  if (st == TNX_OK) st = kv_open_log(s, err, cap);
  if (st == TNX_OK && !s->read_only) {
    /* A leftover of a compaction that crashed before its rename: garbage. */
    char *tmp = kv_concat(s->path, KV_COMPACT_SUFFIX);
    if (tmp != NULL) unlink(tmp);
    free(tmp);
  }
  if (st == TNX_OK) st = kv_replay(s, err, cap);
  if (st == TNX_OK) {
    if (pthread_mutex_init(&s->write_mu, NULL) != 0) {
      st = kv_fail(err, cap, TNX_EINTERNAL, "kv: cannot create a mutex");
    } else if (pthread_rwlock_init(&s->index_lock, NULL) != 0) {
      pthread_mutex_destroy(&s->write_mu);
      st = kv_fail(err, cap, TNX_EINTERNAL, "kv: cannot create a lock");
    } else {
      s->locks_ready = 1;
    }
  }
  if (st != TNX_OK) {
    kv_destroy(s); /* "On failure *out_store is untouched" */
    return st;
  }
  *out_store = s;
  return TNX_OK;
}

/* ======================================================================== */
/* get                                                                      */
/* ======================================================================== */

/* A record for a sink, header filled in, everything else empty. */
static tnx_task_record kv_empty_record(void) {
  tnx_task_record r;
  memset(&r, 0, sizeof r);
  r.header = tnx_header(sizeof r);
  r.status_time_us = TNX_TIME_NONE;
  return r;
}

/* Fills `r` with the fields of the verified record in `buf` (borrowed views
 * into buf: valid as long as buf, which outlives the sink call). */
static void kv_fill_record(tnx_task_record *r, const kv_hdr *h, const unsigned char *buf) {
  tnx_str *f[KV_NFIELDS];
  const char *p = (const char *)buf + KV_REC_HDR;
  int i;
  f[KV_ID] = &r->id;
  f[KV_CONTEXT] = &r->context_id;
  f[KV_STATE] = &r->state;
  f[KV_OWNER] = &r->owner;
  f[KV_TENANT] = &r->tenant;
  f[KV_JSON] = &r->task_json;
  for (i = 0; i < KV_NFIELDS; ++i) {
    f[i]->data = p;
    f[i]->len = h->len[i];
    p += h->len[i];
  }
  r->status_time_us = h->time_us;
  r->version = h->version;
}

/* Reads the record of `e` (offset, extent) into `*buf` (grown as needed) and
 * checks it is the sound put record of the expected id. Returns TNX_OK,
 * TNX_EIO, TNX_ECORRUPT or TNX_EINTERNAL with a message. */
static tnx_status kv_read(tnx_store *s, uint64_t offset, uint64_t extent, const char *id, size_t id_len,
                          unsigned char **buf, size_t *buf_cap, kv_hdr *h, int *all_read, char *err,
                          uint32_t cap) {
  const char *why;
  if (all_read != NULL) *all_read = 0;
  if (*buf_cap < extent) {
    unsigned char *nb = (unsigned char *)realloc(*buf, (size_t)extent);
    if (nb == NULL) return kv_fail(err, cap, TNX_EINTERNAL, "kv: out of memory");
    *buf = nb;
    *buf_cap = (size_t)extent;
  }
  if (kv_pread_all(s->fd, *buf, (size_t)extent, offset) != 0) {
    int e = errno;
    if (e == 0)
      return kv_fail(err, cap, TNX_ECORRUPT, "'%s': record of task %s at offset %" PRIu64 " is cut short",
                     s->path, kv_quote(id, id_len).text, offset);
    return kv_fail(err, cap, TNX_EIO, "cannot read '%s' at offset %" PRIu64 ": %s", s->path, offset,
                   kv_strerror(e).text);
  }
  if (all_read != NULL) *all_read = 1; /* *buf holds the stored bytes, sound or not */
  why = kv_check_record(*buf, extent, h);
  if (why == NULL && (h->op != KV_OP_PUT || h->extent != extent || h->len[KV_ID] != id_len ||
                      memcmp(*buf + KV_REC_HDR, id, id_len) != 0))
    why = "it is not the record the index expects there";
  if (why != NULL)
    return kv_fail(err, cap, TNX_ECORRUPT, "'%s': record of task %s at offset %" PRIu64 ": %s", s->path,
                   kv_quote(id, id_len).text, offset, why);
  return TNX_OK;
}

static tnx_status kv_get(tnx_store *s, tnx_str id, tnx_record_sink sink, void *sink_ctx, char *err,
                         uint32_t cap) {
  kv_entry *e;
  uint64_t offset = 0, extent = 0;
  unsigned char *buf = NULL;
  size_t buf_cap = 0;
  kv_hdr h;
  tnx_task_record r;
  tnx_status st;
  int found = 0, damaged;
  if (id.len == 0 || id.data == NULL) return kv_fail(err, cap, TNX_EINVAL, "get: empty id");
  if (sink == NULL) return kv_fail(err, cap, TNX_EINVAL, "get: no sink");

  /* Take what we need from the index and let go of the lock before any
   * I/O: the record at that offset never changes (the log is append-only
   * while open), so reading it unlocked is safe even if a save replaces the
   * entry meanwhile; we then return the version that was current when we
   * looked, which is a correct answer for a get that ran just before. */
  pthread_rwlock_rdlock(&s->index_lock);
  e = kv_index_find(&s->index, id.data, (size_t)id.len);
  if (e != NULL) {
    found = 1;
    offset = e->offset;
    extent = e->extent;
  }
  damaged = s->ndamaged > 0;
  pthread_rwlock_unlock(&s->index_lock);

  if (!found) {
    /* With damaged stretches, "not found" could be a lie: the Task may be in
     * one. The ABI never lets corruption pass as TNX_ENOTFOUND. */
    if (damaged)
      return kv_fail(err, cap, TNX_ECORRUPT,
                     "task %s is not among the readable records of '%s', which has %zu damaged stretch(es), the "
                     "first at offset %" PRIu64,
                     kv_quote(id.data, (size_t)id.len).text, s->path, s->ndamaged, s->damaged[0]->offset);
    return kv_fail(err, cap, TNX_ENOTFOUND, "no task %s in '%s'", kv_quote(id.data, (size_t)id.len).text,
                   s->path);
  }
  st = kv_read(s, offset, extent, id.data, (size_t)id.len, &buf, &buf_cap, &h, NULL, err, cap);
  if (st == TNX_OK) {
    r = kv_empty_record();
    kv_fill_record(&r, &h, buf);
    /* The sink's view into buf is borrowed for the call only; buf is freed
     * right after, by us, who allocated it. */
    (void)sink(sink_ctx, &r);
  }
  free(buf);
  return st;
}

/* ======================================================================== */
/* save and del                                                             */
/* ======================================================================== */

/* Checks a host-given field: data may be NULL only when empty. */
static int kv_str_ok(tnx_str s) { return s.len == 0 || s.data != NULL; }

/* Writes an encoded record at the end of the log and makes it durable.
 * Called with write_mu held. */
static tnx_status kv_append(tnx_store *s, const unsigned char *buf, size_t n, char *err, uint32_t cap) {
  /* pwrite at s->end rather than O_APPEND: if a write fails halfway (disk
   * full), s->end does not move, so the next record simply overwrites the
   * fragment, and the log never has garbage between two good records. */
  if (kv_pwrite_all(s->fd, buf, n, s->end) != 0) {
    int e = errno;
    /* Also cut the fragment off now (best effort), so a crash before the
     * next write does not leave it to the torn-tail recovery. */
    if (ftruncate(s->fd, (off_t)s->end) != 0) {
      /* nothing more to do: see above */
    }
    return kv_fail(err, cap, TNX_EIO, "cannot write to '%s': %s; nothing was saved", s->path,
                   kv_strerror(e).text);
  }
  if (fdatasync(s->fd) != 0) {
    /* After a failed fsync the kernel may have dropped the dirty pages and a
     * retry may "succeed" without the data (the PostgreSQL fsync lesson), so
     * we cannot know what is on disk: refuse further writes until the store
     * is reopened, which replays what really is there. */
    s->sync_failed = 1;
    s->sync_errno = errno;
    if (ftruncate(s->fd, (off_t)s->end) != 0) {
      /* the reopen will sort it out */
    }
    return kv_fail(err, cap, TNX_EIO,
                   "cannot sync '%s': %s; this change may not be durable and the store refuses writes until "
                   "it is reopened",
                   s->path, kv_strerror(s->sync_errno).text);
  }
  return TNX_OK;
}

/* Refuses a write while the store cannot take one. Called with write_mu. */
static tnx_status kv_writable(const tnx_store *s, char *err, uint32_t cap) {
  if (s->sync_failed)
    return kv_fail(err, cap, TNX_EIO, "'%s': an earlier sync failed (%s); reopen the store to write again",
                   s->path, kv_strerror(s->sync_errno).text);
  return TNX_OK;
}

/* The compare-and-set rule shared by save and del: `cur` is the stored
 * entry (NULL: none). */
static int kv_version_ok(const kv_entry *cur, uint64_t expected) {
  if (expected == TNX_VERSION_ANY) return 1;
  if (expected == TNX_VERSION_NONE) return cur == NULL;
  return cur != NULL && cur->version == expected;
}

static tnx_status kv_save(tnx_store *s, const tnx_task_record *rec, uint64_t expected_version,
                          uint64_t *out_version, char *err, uint32_t cap) {
  tnx_str f[KV_NFIELDS];
  uint64_t total = KV_REC_HDR, version = 0;
  unsigned char *buf;
  size_t n;
  kv_entry *e, *cur;
  kv_hdr h;
  tnx_status st;
  int i;
  if (rec == NULL || out_version == NULL) return kv_fail(err, cap, TNX_EINVAL, "save: no record");
  /* Never read past the struct_size the host reported. Every field used
   * here exists since ABI 1.0, so a record smaller than that is malformed. */
  if (rec->header.abi_major != TNX_ABI_MAJOR || rec->header.struct_size < KV_MIN_RECORD_SIZE)
    return kv_fail(err, cap, TNX_EINVAL, "save: record header says ABI %u, %" PRIu32 " bytes",
                   (unsigned)rec->header.abi_major, rec->header.struct_size);
  if (s->read_only)
    return kv_fail(err, cap, TNX_EUNSUPPORTED, "save: '%s' is opened read-only%s", s->path,
                   s->salvage ? " (?salvage)" : "");
  f[KV_ID] = rec->id;
  f[KV_CONTEXT] = rec->context_id;
  f[KV_STATE] = rec->state;
  f[KV_OWNER] = rec->owner;
  f[KV_TENANT] = rec->tenant;
  f[KV_JSON] = rec->task_json;
  if (f[KV_ID].len == 0 || f[KV_ID].data == NULL) return kv_fail(err, cap, TNX_EINVAL, "save: empty id");
  for (i = 0; i < KV_NFIELDS; ++i) {
    if (!kv_str_ok(f[i])) return kv_fail(err, cap, TNX_EINVAL, "save: a field has length but no data");
    if (f[i].len > KV_MAX_RECORD) {
      total = KV_MAX_RECORD + 1;
      break;
    }
    total += f[i].len;
  }
  if (total > KV_MAX_RECORD)
    return kv_fail(err, cap, TNX_EINVAL, "save of task %s: larger than the kv store's 1 GiB record limit",
                   kv_quote(f[KV_ID].data, (size_t)f[KV_ID].len).text);

  /* All allocation before the write: once the record is on disk, updating
   * the index must not be able to fail. */
  buf = kv_encode(KV_OP_PUT, f, rec->status_time_us, &n);
  if (buf == NULL) return kv_fail(err, cap, TNX_EINTERNAL, "save: out of memory");
  memset(&h, 0, sizeof h);
  for (i = 0; i < KV_NFIELDS; ++i) h.len[i] = (uint32_t)f[i].len;
  h.extent = n;
  h.time_us = rec->status_time_us;
  e = kv_entry_new(&h, buf + KV_REC_HDR, 0);
  if (e == NULL) {
    free(buf);
    return kv_fail(err, cap, TNX_EINTERNAL, "save: out of memory");
  }

  pthread_mutex_lock(&s->write_mu);
  st = kv_writable(s, err, cap);
  if (st == TNX_OK) {
    cur = kv_index_find(&s->index, f[KV_ID].data, (size_t)f[KV_ID].len);
    if (!kv_version_ok(cur, expected_version)) {
      st = kv_fail(err, cap, TNX_ECONFLICT, "save of task %s: expected version %" PRIu64 ", stored %" PRIu64,
                   kv_quote(f[KV_ID].data, (size_t)f[KV_ID].len).text, expected_version,
                   cur == NULL ? (uint64_t)0 : cur->version);
    }
  }
  if (st == TNX_OK) {
    version = s->last_version + 1;
    kv_seal(buf, version);
    st = kv_append(s, buf, n, err, cap);
  }
  if (st == TNX_OK) {
    e->offset = s->end;
    e->version = version;
    s->end += n;
    s->last_version = version;
    pthread_rwlock_wrlock(&s->index_lock);
    kv_index_put(&s->index, e);
    pthread_rwlock_unlock(&s->index_lock);
    e = NULL; /* owned by the index now */
  }
  pthread_mutex_unlock(&s->write_mu);
  free(e);
  free(buf);
  if (st == TNX_OK) *out_version = version;
  return st;
}

static tnx_status kv_del(tnx_store *s, tnx_str id, uint64_t expected_version, char *err, uint32_t cap) {
  tnx_str f[KV_NFIELDS];
  unsigned char *buf;
  size_t n;
  kv_entry *cur;
  tnx_status st;
  if (id.len == 0 || id.data == NULL) return kv_fail(err, cap, TNX_EINVAL, "delete: empty id");
  if (id.len > KV_MAX_RECORD - KV_REC_HDR)
    return kv_fail(err, cap, TNX_ENOTFOUND, "delete: no task with an id of %" PRIu64 " bytes", id.len);
  if (s->read_only)
    return kv_fail(err, cap, TNX_EUNSUPPORTED, "delete: '%s' is opened read-only%s", s->path,
                   s->salvage ? " (?salvage)" : "");
  memset(f, 0, sizeof f);
  f[KV_ID] = id;
  buf = kv_encode(KV_OP_DEL, f, TNX_TIME_NONE, &n);
  if (buf == NULL) return kv_fail(err, cap, TNX_EINTERNAL, "delete: out of memory");

  pthread_mutex_lock(&s->write_mu);
  st = kv_writable(s, err, cap);
  if (st == TNX_OK) {
    cur = kv_index_find(&s->index, id.data, (size_t)id.len);
    if (cur == NULL)
      st = kv_fail(err, cap, TNX_ENOTFOUND, "delete: no task %s in '%s'", kv_quote(id.data, (size_t)id.len).text,
                   s->path);
    else if (!kv_version_ok(cur, expected_version))
      st = kv_fail(err, cap, TNX_ECONFLICT, "delete of task %s: expected version %" PRIu64 ", stored %" PRIu64,
                   kv_quote(id.data, (size_t)id.len).text, expected_version, cur->version);
  }
  if (st == TNX_OK) {
    /* A delete takes a version too, so numbers stay unique in the log. */
    kv_seal(buf, s->last_version + 1);
    st = kv_append(s, buf, n, err, cap);
  }
  if (st == TNX_OK) {
    s->end += n;
    s->last_version += 1;
    pthread_rwlock_wrlock(&s->index_lock);
    kv_index_remove(&s->index, id.data, (size_t)id.len);
    pthread_rwlock_unlock(&s->index_lock);
  }
  pthread_mutex_unlock(&s->write_mu);
  free(buf);
  return st;
}

/* ======================================================================== */
/* list                                                                     */
/* ======================================================================== */

/* Where a page starts: after (time_us, id) in list order. */
typedef struct kv_cursor {
  int64_t time_us;
  char id[KV_CURSOR_PREFIX];
  size_t id_len;
  int long_form; /* id holds only the first KV_CURSOR_PREFIX bytes ... */
  uint64_t hash; /* ... of the id whose FNV-1a this is */
} kv_cursor;

static int kv_hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

/* Parses a cursor this plugin made. Anything else (other plugins' cursors,
 * hand-made strings) is refused rather than guessed at: TNX_EINVAL. */
static int kv_cursor_parse(tnx_str c, kv_cursor *k) {
  const char *p = c.data, *end;
  uint64_t mag = 0;
  size_t digits = 0, hex_len = 0, i;
  int neg = 0;
  if (c.data == NULL || c.len == 0 || c.len > KV_CURSOR_MAX) return 0;
  end = c.data + c.len;
  if (*p == '-') {
    neg = 1;
    ++p;
  }
  while (p < end && *p >= '0' && *p <= '9') {
    if (++digits > 19) return 0;
    mag = mag * 10 + (uint64_t)(*p++ - '0');
  }
  if (digits == 0 || mag > (neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX)) return 0;
  k->time_us = neg ? (mag == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)mag) : (int64_t)mag;
  if (p == end || *p++ != '.') return 0;
  while (p + hex_len < end && p[hex_len] != '.') ++hex_len;
  if (hex_len == 0 || hex_len % 2 != 0 || hex_len > 2 * KV_CURSOR_PREFIX) return 0;
  for (i = 0; i < hex_len; i += 2) {
    int hi = kv_hexval(p[i]), lo = kv_hexval(p[i + 1]);
    if (hi < 0 || lo < 0) return 0;
    k->id[i / 2] = (char)(unsigned char)(hi * 16 + lo);
  }
  k->id_len = hex_len / 2;
  p += hex_len;
  k->long_form = 0;
  k->hash = 0;
  if (p == end) return 1;
  /* ".<16 hex>" follows only a full-length prefix. */
  if (k->id_len != KV_CURSOR_PREFIX || end - p != 17) return 0;
  for (i = 1; i < 17; ++i) {
    int v = kv_hexval(p[i]);
    if (v < 0) return 0;
    k->hash = (k->hash << 4) | (uint64_t)v;
  }
  k->long_form = 1;
  return 1;
}

/* Writes the cursor of (time_us, id) into out[KV_CURSOR_MAX + 1]. */
static size_t kv_cursor_encode(char *out, int64_t time_us, const char *id, size_t n) {
  static const char hex[] = "0123456789abcdef";
  size_t o, i, m = n > KV_CURSOR_PREFIX ? KV_CURSOR_PREFIX : n;
  int w = snprintf(out, 32, "%" PRId64 ".", time_us);
  o = w > 0 ? (size_t)w : 0;
  for (i = 0; i < m; ++i) {
    out[o++] = hex[(unsigned char)id[i] >> 4];
    out[o++] = hex[(unsigned char)id[i] & 15u];
  }
  if (n > KV_CURSOR_PREFIX) {
    uint64_t h = kv_fnv1a(id, n);
    int shift;
    out[o++] = '.';
    for (shift = 60; shift >= 0; shift -= 4) out[o++] = hex[(h >> shift) & 15u];
  }
  out[o] = '\0';
  return o;
}

/* List order: newest status time first, then id ascending, bytewise. */
static int kv_order_key(int64_t ta, const char *ia, size_t na, int64_t tb, const char *ib, size_t nb) {
  if (ta != tb) return ta > tb ? -1 : 1;
  return kv_bytes_cmp(ia, na, ib, nb);
}

static int kv_order(const void *a, const void *b) {
  const kv_entry *x = *(const kv_entry *const *)a, *y = *(const kv_entry *const *)b;
  return kv_order_key(x->time_us, x->text, x->len[KV_ID], y->time_us, y->text, y->len[KV_ID]);
}

static int kv_str_eq(tnx_str want, const char *have, size_t n) {
  return want.len == n && (n == 0 || memcmp(want.data, have, n) == 0);
}

static int kv_matches(const tnx_list_query *q, const kv_entry *e) {
  const uint32_t f = q->filter_flags;
  if (e->damaged) return f == 0; /* its fields are unknown: only an unfiltered list has it */
  if ((f & TNX_FILTER_CONTEXT_ID) && !kv_str_eq(q->context_id, kv_field(e, KV_CONTEXT), e->len[KV_CONTEXT]))
    return 0;
  if ((f & TNX_FILTER_STATE) && !kv_str_eq(q->state, kv_field(e, KV_STATE), e->len[KV_STATE])) return 0;
  if ((f & TNX_FILTER_OWNER) && !kv_str_eq(q->owner, kv_field(e, KV_OWNER), e->len[KV_OWNER])) return 0;
  if ((f & TNX_FILTER_TENANT) && !kv_str_eq(q->tenant, kv_field(e, KV_TENANT), e->len[KV_TENANT])) return 0;
  if ((f & TNX_FILTER_AFTER) && !(e->time_us > q->after_us)) return 0;
  if ((f & TNX_FILTER_BEFORE) && !(e->time_us < q->before_us)) return 0;
  return 1;
}

static tnx_status kv_list(tnx_store *s, const tnx_list_query *q, tnx_record_sink record_sink,
                          tnx_cursor_sink cursor_sink, void *sink_ctx, char *err, uint32_t cap) {
  kv_cursor cur;
  const char *key_id = NULL;
  size_t key_len = 0, nmatch = 0, i, b, page, buf_cap = 0;
  kv_entry **match = NULL;
  unsigned char *buf = NULL;
  uint32_t deliver_corrupt = 0;
  int have_cursor = 0, stopped = 0;
  tnx_status st = TNX_OK;

  if (q == NULL || record_sink == NULL || cursor_sink == NULL)
    return kv_fail(err, cap, TNX_EINVAL, "list: no query or sink");
  if (q->header.abi_major != TNX_ABI_MAJOR || q->header.struct_size < KV_MIN_QUERY_SIZE)
    return kv_fail(err, cap, TNX_EINVAL, "list: query header says ABI %u, %" PRIu32 " bytes",
                   (unsigned)q->header.abi_major, q->header.struct_size);
  /* deliver_corrupt came with ABI 1.1: read it only if this host's struct
   * has it (a 1.0 host's struct ends before it, or has 0 there). */
  if (TNX_HAS_FIELD(q, tnx_list_query, deliver_corrupt)) deliver_corrupt = q->deliver_corrupt;
  if (q->page_size == 0) return kv_fail(err, cap, TNX_EINVAL, "list: page size 0");
  page = q->page_size > TNX_LIST_MAX_PAGE ? TNX_LIST_MAX_PAGE : q->page_size;
  if (((q->filter_flags & TNX_FILTER_CONTEXT_ID) && !kv_str_ok(q->context_id)) ||
      ((q->filter_flags & TNX_FILTER_STATE) && !kv_str_ok(q->state)) ||
      ((q->filter_flags & TNX_FILTER_OWNER) && !kv_str_ok(q->owner)) ||
      ((q->filter_flags & TNX_FILTER_TENANT) && !kv_str_ok(q->tenant)))
    return kv_fail(err, cap, TNX_EINVAL, "list: a filter has length but no data");
  if (q->cursor.len != 0) {
    if (!kv_cursor_parse(q->cursor, &cur)) {
      /* Quote only a safe prefix: the cursor may be arbitrary bytes. */
      size_t shown = q->cursor.data == NULL ? 0 : (q->cursor.len > 40 ? 40 : (size_t)q->cursor.len);
      return kv_fail(err, cap, TNX_EINVAL, "list: malformed cursor %s",
                     kv_quote(q->cursor.data, shown).text);
    }
    have_cursor = 1;
    key_id = cur.id;
    key_len = cur.id_len;
  }

  pthread_rwlock_rdlock(&s->index_lock);
  if (s->ndamaged > 0 && !deliver_corrupt) {
    st = kv_fail(err, cap, TNX_ECORRUPT,
                 "'%s' has %zu damaged stretch(es), the first at offset %" PRIu64
                 "; list them with deliver_corrupt (toolnexus store check/copy)",
                 s->path, s->ndamaged, s->damaged[0]->offset);
    goto out;
  }
  /* A long-form cursor names its id by prefix and hash: find the id. If that
   * Task is gone, start right after the prefix instead, which may repeat a
   * few records with the same time and prefix but never skips one. */
  if (have_cursor && cur.long_form) {
    for (b = 0; b < s->index.nbuckets && key_id == cur.id; ++b) {
      const kv_entry *e;
      for (e = s->index.buckets[b]; e != NULL; e = e->next) {
        if (e->time_us == cur.time_us && e->len[KV_ID] > KV_CURSOR_PREFIX && e->hash == cur.hash &&
            memcmp(e->text, cur.id, KV_CURSOR_PREFIX) == 0) {
          key_id = e->text; /* valid while we hold the read lock */
          key_len = e->len[KV_ID];
          break;
        }
      }
    }
  }

  /* Collect the matches after the cursor, sort them, deliver one page. This
   * costs O(n log n) per page; a store meant for millions of Tasks would
   * keep an ordered index instead (see plugins/memory). */
  match = (kv_entry **)malloc((s->index.count + s->ndamaged + 1) * sizeof *match);
  if (match == NULL) {
    st = kv_fail(err, cap, TNX_EINTERNAL, "list: out of memory");
    goto out;
  }
  for (b = 0; b < s->index.nbuckets; ++b) {
    kv_entry *e;
    for (e = s->index.buckets[b]; e != NULL; e = e->next) {
      if (!kv_matches(q, e)) continue;
      if (have_cursor && kv_order_key(cur.time_us, key_id, key_len, e->time_us, e->text, e->len[KV_ID]) >= 0)
        continue;
      match[nmatch++] = e;
    }
  }
  for (i = 0; i < s->ndamaged; ++i) {
    kv_entry *e = s->damaged[i];
    if (!kv_matches(q, e)) continue;
    if (have_cursor && kv_order_key(cur.time_us, key_id, key_len, e->time_us, e->text, e->len[KV_ID]) >= 0)
      continue;
    match[nmatch++] = e;
  }
  qsort(match, nmatch, sizeof *match, kv_order);

  /* The sinks are called with the read lock held (the entries must stay
   * alive); a sink copies what it keeps and returns, as the ABI asks. */
  for (i = 0; i < nmatch && i < page && !stopped; ++i) {
    const kv_entry *e = match[i];
    tnx_task_record r = kv_empty_record();
    kv_hdr h;
    char why[512]; /* r.problem (ABI 1.2) points here during the sink call */
    if (e->damaged) {
      /* Salvage mode: the raw bytes of a damaged stretch, named by where
       * it is, as the ABI describes for deliver_corrupt; `problem` says why. */
      int n = snprintf(why, sizeof why, "'%s': damaged stretch of %" PRIu64 " bytes at offset %" PRIu64
                       " (no valid record there)", s->path, e->extent, e->offset);
      r.problem.data = why;
      r.problem.len = n < 0 ? 0 : (uint64_t)n < sizeof why ? (uint64_t)n : sizeof why - 1;
      r.id.data = e->text;
      r.id.len = e->len[KV_ID];
      if (!q->omit_json) {
        if (buf_cap < e->extent) {
          unsigned char *nb = (unsigned char *)realloc(buf, (size_t)e->extent);
          if (nb == NULL) {
            st = kv_fail(err, cap, TNX_EINTERNAL, "list: out of memory");
            break;
          }
          buf = nb;
          buf_cap = (size_t)e->extent;
        }
        if (kv_pread_all(s->fd, buf, (size_t)e->extent, e->offset) != 0) {
          st = kv_fail(err, cap, TNX_EIO, "cannot read '%s' at offset %" PRIu64, s->path, e->offset);
          break;
        }
        r.task_json.data = (const char *)buf;
        r.task_json.len = e->extent;
      }
    } else if (q->omit_json) {
      /* Index fields only: no disk read at all (they were verified on open). */
      r.id.data = kv_field(e, KV_ID);
      r.id.len = e->len[KV_ID];
      r.context_id.data = kv_field(e, KV_CONTEXT);
      r.context_id.len = e->len[KV_CONTEXT];
      r.state.data = kv_field(e, KV_STATE);
      r.state.len = e->len[KV_STATE];
      r.owner.data = kv_field(e, KV_OWNER);
      r.owner.len = e->len[KV_OWNER];
      r.tenant.data = kv_field(e, KV_TENANT);
      r.tenant.len = e->len[KV_TENANT];
      r.status_time_us = e->time_us;
      r.version = e->version;
    } else {
          int all_read;
      st = kv_read(s, e->offset, e->extent, e->text, e->len[KV_ID], &buf, &buf_cap, &h, &all_read, err, cap);
      if (st == TNX_ECORRUPT && deliver_corrupt) {
        /* Damaged since open: deliver it under its id with the raw stored
         * JSON bytes; the host sees it does not parse. */
        uint64_t json_at = KV_REC_HDR;
        int f;
        for (f = 0; f < KV_JSON; ++f) json_at += e->len[f];
        r.id.data = e->text;
        r.id.len = e->len[KV_ID];
        /* kv_read wrote why into the host's err buffer: pass it on. */
        if (err != NULL && cap > 0) {
          r.problem.data = err;
          r.problem.len = strlen(err);
        }
        if (all_read && json_at + e->len[KV_JSON] <= e->extent) {
          r.task_json.data = (const char *)buf + json_at;
          r.task_json.len = e->len[KV_JSON];
        }
        st = TNX_OK;
      } else if (st != TNX_OK) {
        break;
      } else {
        kv_fill_record(&r, &h, buf);
      }
    }
    if (record_sink(sink_ctx, &r) != 0) stopped = 1; /* the host has enough */
  }
  /* A next cursor only when another matching record exists, and not after
   * the host stopped early. */
  if (st == TNX_OK && !stopped && nmatch > page) {
    char c[KV_CURSOR_MAX + 1];
    const kv_entry *last = match[page - 1];
    tnx_str cs;
    cs.data = c;
    cs.len = kv_cursor_encode(c, last->time_us, last->text, last->len[KV_ID]);
    cursor_sink(sink_ctx, cs);
  }
out:
  pthread_rwlock_unlock(&s->index_lock);
  free(match);
  free(buf);
  return st;
}

/* ======================================================================== */
/* close                                                                    */
/* ======================================================================== */

static tnx_status kv_close(tnx_store *s, char *err, uint32_t cap) {
  /* Every save was synced before it returned, so there is nothing to flush.
   * Whatever close() says, the store is gone afterwards: free everything. */
  tnx_status st = TNX_OK;
  if (s == NULL) return TNX_OK;
  if (s->fd >= 0) {
    if (close(s->fd) != 0) { /* close also releases the flock */
      int e = errno;
      st = kv_fail(err, cap, TNX_EIO, "closing '%s': %s (every save was already synced; nothing is lost)",
                   s->path, kv_strerror(e).text);
    }
    s->fd = -1;
  }
  kv_destroy(s);
  return st;
}

/* ======================================================================== */
/* Descriptor and entry                                                     */
/* ======================================================================== */

/* The vtable, the scheme list and the descriptor are static and const: the
 * ABI wants them valid until the library is unloaded, and this plugin keeps
 * no other global state (everything else hangs off a tnx_store). */
static const tnx_store_vtable kv_vtable = {
    TNX_HEADER_INIT(tnx_store_vtable), kv_get, kv_save, kv_del, kv_list, kv_close,
    NULL, /* count (ABI 1.3) is optional: without it the host counts by listing */
    NULL, /* save_batch (ABI 1.3) is optional: without it the host saves one by one */
    NULL, /* watch (ABI 1.4) is optional: without it the host polls for others' changes */
    NULL, /* unwatch (ABI 1.4): NULL with watch */
    NULL, /* save_stream (ABI 1.5) is optional: without it the host uses save_batch or save */
};

static const char *const kv_schemes[] = {"kv", NULL};

static const tnx_plugin_descriptor kv_descriptor = {
    TNX_HEADER_INIT(tnx_plugin_descriptor),
    "toolnexus-kv-example",
    "0.1.0",
    "Append-only log with an in-memory index: durable, thread-safe, one process at a time",
    kv_schemes,
    TNX_CAP_THREAD_SAFE | TNX_CAP_PAGINATED_LIST | TNX_CAP_COMPARE_AND_SET | TNX_CAP_DURABLE |
        TNX_CAP_PERSISTENT,
    kv_open,
    &kv_vtable,
    /* ABI 1.1 field: a 1.0 host reads the descriptor only up to the size it
     * knows, so adding it costs old hosts nothing. */
    "kv:<dir>[?salvage]",
};

/* The one exported symbol (TNX_PLUGIN_EXPORT overrides -fvisibility=hidden;
 * the version script kv_plugin.map hides everything else). The header only
 * defines its type, so declare it here, and let the compiler prove it has
 * exactly that type: the host calls it through a tnx_plugin_entry_fn, and a
 * mismatch would not be caught by anyone else. */
TNX_PLUGIN_EXPORT const tnx_plugin_descriptor *toolnexus_plugin_entry(const tnx_host_info *host);
_Static_assert(_Generic(&toolnexus_plugin_entry, tnx_plugin_entry_fn: 1, default: 0),
               "toolnexus_plugin_entry must have the type tnx_plugin_entry_fn");

/* It may be called from any thread and does nothing but check the host and
 * return static data, so it needs no locking. */
TNX_PLUGIN_EXPORT const tnx_plugin_descriptor *toolnexus_plugin_entry(const tnx_host_info *host) {
  /* A different major means the structs may have a different layout: refuse
   * by returning NULL (the host reports it) rather than guess. Any minor of
   * our major is fine: structs only grow, and each side reads only what the
   * other's struct_size says is there. */
  if (host == NULL || host->header.abi_major != TNX_ABI_MAJOR) return NULL;
  return &kv_descriptor;
}

/*
 * kv_log_test.c: what the conformance suite cannot see of the kv example
 * plugin (examples/plugin-kv): reopening, versions that survive it, torn
 * tails, corruption in the middle, ?salvage, the one-process lock,
 * compaction, long-id cursors, and the error-buffer rules.
 *
 *   kv_log_test PLUGIN.so SCRATCH_DIR
 *
 * Built by tests/install/install_test.sh with only the *installed* header
 * (cc -std=c11 -I<prefix>/include), which also proves that header is enough
 * for a C program. Talks to the plugin through the C ABI only, as a host.
 * Exit 0 when every check passes; prints each failed check.
 */
#define _DEFAULT_SOURCE
#define _POSIX_C_SOURCE 200809L

#include "toolnexus/task_store.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static int g_failed, g_checks;
static const tnx_plugin_descriptor *g_d;
static const tnx_store_vtable *g_vt;
static char g_root[512];
static char g_err[1024];

#define CHECK(cond, ...)                                                                  \
  do {                                                                                    \
    ++g_checks;                                                                           \
    if (!(cond)) {                                                                        \
      ++g_failed;                                                                         \
      fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                     \
      fprintf(stderr, __VA_ARGS__);                                                       \
      fprintf(stderr, "\n");                                                              \
    }                                                                                     \
  } while (0)

static tnx_str S(const char *s) {
  tnx_str t;
  t.data = s;
  t.len = strlen(s);
  return t;
}

static void path_of(char *out, size_t cap, const char *name) { snprintf(out, cap, "%s/%s", g_root, name); }

static tnx_status open_loc_flags(const char *loc, uint32_t flags, tnx_store **s) {
  tnx_open_args a;
  char sel[1100];
  memset(&a, 0, sizeof a);
  a.header = tnx_header(sizeof a);
  snprintf(sel, sizeof sel, "kv:%s", loc);
  a.scheme = S("kv");
  a.location = S(sel + 3);
  a.selector = S(sel);
  a.flags = flags;
  g_err[0] = '\0';
  return g_d->open(&a, s, g_err, sizeof g_err);
}

static tnx_status open_loc(const char *loc, tnx_store **s) { return open_loc_flags(loc, 0, s); }

/* Opens <root>/<name>[suffix]. */
static tnx_status open_dir(const char *name, const char *suffix, tnx_store **s) {
  char loc[1024];
  snprintf(loc, sizeof loc, "%s/%s%s", g_root, name, suffix);
  return open_loc(loc, s);
}

static void close_store(tnx_store *s) {
  tnx_status st = g_vt->close(s, g_err, sizeof g_err);
  CHECK(st == TNX_OK, "close: %s %s", tnx_err_name(st), g_err);
}

static tnx_status save3(tnx_store *s, const char *id, size_t id_len, const char *json, int64_t t, uint64_t expected,
                        uint64_t *v) {
  tnx_task_record r;
  uint64_t dummy;
  memset(&r, 0, sizeof r);
  r.header = tnx_header(sizeof r);
  r.id.data = id;
  r.id.len = id_len;
  r.context_id = S("ctx");
  r.state = S("working");
  r.status_time_us = t;
  r.task_json = S(json);
  g_err[0] = '\0';
  return g_vt->save(s, &r, expected, v != NULL ? v : &dummy, g_err, sizeof g_err);
}

static tnx_status save(tnx_store *s, const char *id, const char *json, uint64_t expected, uint64_t *v) {
  return save3(s, id, strlen(id), json, 1000, expected, v);
}

static tnx_status del(tnx_store *s, const char *id, uint64_t expected) {
  g_err[0] = '\0';
  return g_vt->del(s, S(id), expected, g_err, sizeof g_err);
}

/* A captured record. */
typedef struct got {
  char id[1024];
  size_t id_len;
  char json[4096];
  size_t json_len;
  int64_t time_us;
  uint64_t version;
  char problem[1024]; /* ABI 1.2 record.problem, "" when absent */
} got;

static int32_t on_get(void *ctx, const tnx_task_record *r) {
  got *g = (got *)ctx;
  g->id_len = r->id.len < sizeof g->id ? (size_t)r->id.len : sizeof g->id;
  if (g->id_len) memcpy(g->id, r->id.data, g->id_len);
  g->json_len = r->task_json.len < sizeof g->json - 1 ? (size_t)r->task_json.len : sizeof g->json - 1;
  if (g->json_len) memcpy(g->json, r->task_json.data, g->json_len);
  g->json[g->json_len] = '\0';
  g->time_us = r->status_time_us;
  g->version = r->version;
  g->problem[0] = '\0';
  if (TNX_HAS_FIELD(r, tnx_task_record, problem) && r->problem.len > 0) {
    size_t n = r->problem.len < sizeof g->problem - 1 ? (size_t)r->problem.len : sizeof g->problem - 1;
    memcpy(g->problem, r->problem.data, n);
    g->problem[n] = '\0';
  }
  return 0;
}

static tnx_status get(tnx_store *s, const char *id, got *g) {
  memset(g, 0, sizeof *g);
  g_err[0] = '\0';
  return g_vt->get(s, S(id), on_get, g, g_err, sizeof g_err);
}

/* A whole list call. */
typedef struct page {
  got rec[64];
  int n;
  char cursor[1100];
  size_t cursor_len;
  int cursors;
} page;

/* on_list stops the list after this many records (0: never). */
static int g_stop_after;

static int32_t on_list(void *ctx, const tnx_task_record *r) {
  page *p = (page *)ctx;
  if (p->n < 64) on_get(&p->rec[p->n], r);
  ++p->n;
  return g_stop_after != 0 && p->n >= g_stop_after;
}

static void on_cursor(void *ctx, tnx_str c) {
  page *p = (page *)ctx;
  ++p->cursors;
  p->cursor_len = c.len < sizeof p->cursor - 1 ? (size_t)c.len : sizeof p->cursor - 1;
  memcpy(p->cursor, c.data, p->cursor_len);
  p->cursor[p->cursor_len] = '\0';
}

static tnx_status list(tnx_store *s, uint32_t page_size, const char *cursor, size_t cursor_len, uint32_t corrupt,
                       uint32_t omit, page *p) {
  tnx_list_query q;
  memset(p, 0, sizeof *p);
  memset(&q, 0, sizeof q);
  q.header = tnx_header(sizeof q);
  q.page_size = page_size;
  q.cursor.data = cursor;
  q.cursor.len = cursor_len;
  q.deliver_corrupt = corrupt;
  q.omit_json = omit;
  g_err[0] = '\0';
  return g_vt->list(s, &q, on_list, on_cursor, p, g_err, sizeof g_err);
}

static long file_size(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

static void log_path(char *out, size_t cap, const char *name) {
  snprintf(out, cap, "%s/%s/tasks.kvlog", g_root, name);
}

/* Reads a whole file into a malloc'd buffer. */
static unsigned char *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  unsigned char *b;
  long sz;
  if (f == NULL) return NULL;
  fseek(f, 0, SEEK_END);
  sz = ftell(f);
  fseek(f, 0, SEEK_SET);
  b = (unsigned char *)malloc((size_t)sz + 1);
  *n = fread(b, 1, (size_t)sz, f);
  fclose(f);
  return b;
}

/* Offset of `needle` in the file, or -1. */
static long find_in_file(const char *path, const char *needle) {
  size_t n, i, k = strlen(needle);
  unsigned char *b = slurp(path, &n);
  long at = -1;
  for (i = 0; b != NULL && i + k <= n; ++i)
    if (memcmp(b + i, needle, k) == 0) {
      at = (long)i;
      break;
    }
  free(b);
  return at;
}

static void poke(const char *path, long off, unsigned char xor_with) {
  int fd = open(path, O_RDWR);
  unsigned char c;
  if (pread(fd, &c, 1, off) != 1) abort();
  c ^= xor_with;
  if (pwrite(fd, &c, 1, off) != 1) abort();
  close(fd);
}

static void append_bytes(const char *path, const void *p, size_t n) {
  int fd = open(path, O_WRONLY | O_APPEND);
  if (write(fd, p, n) != (ssize_t)n) abort();
  close(fd);
}

/* ------------------------------------------------------------------------ */

static void test_entry(tnx_plugin_entry_fn entry) {
  tnx_host_info h;
  const tnx_plugin_descriptor *d;
  uint64_t want = TNX_CAP_THREAD_SAFE | TNX_CAP_PAGINATED_LIST | TNX_CAP_COMPARE_AND_SET | TNX_CAP_DURABLE |
                  TNX_CAP_PERSISTENT;
  CHECK(entry(NULL) == NULL, "entry(NULL) must refuse");
  memset(&h, 0, sizeof h);
  h.header = tnx_header(sizeof h);
  h.header.abi_major = TNX_ABI_MAJOR + 1;
  h.host_name = "test";
  h.host_version = "9";
  CHECK(entry(&h) == NULL, "a host of another major must be refused");
  h.header.abi_major = TNX_ABI_MAJOR;
  h.header.abi_minor = 0; /* a 1.0 host is fine */
  d = entry(&h);
  CHECK(d != NULL, "a 1.0 host must be accepted");
  h.header.abi_minor = TNX_ABI_MINOR;
  d = entry(&h);
  CHECK(d != NULL && d->header.abi_major == TNX_ABI_MAJOR, "entry");
  if (d == NULL) exit(1);
  CHECK(strcmp(d->schemes[0], "kv") == 0 && d->schemes[1] == NULL, "schemes");
  CHECK(d->capabilities == want, "capabilities %" PRIx64, d->capabilities);
  CHECK(TNX_HAS_FIELD(d, tnx_plugin_descriptor, location_syntax) && d->location_syntax != NULL &&
            strncmp(d->location_syntax, "kv:<dir>", 8) == 0,
        "location_syntax");
  CHECK(d->vtable->header.struct_size == sizeof(tnx_store_vtable), "vtable size");
  g_d = d;
  g_vt = d->vtable;
}

static void test_reopen_versions(void) {
  tnx_store *s;
  uint64_t v1, v2, v3, v5;
  got g;
  tnx_status st = open_dir("a", "", &s);
  CHECK(st == TNX_OK, "open: %s", g_err);
  CHECK(save(s, "t1", "{\"id\":\"t1\",\"n\":1}", TNX_VERSION_NONE, &v1) == TNX_OK, "%s", g_err);
  CHECK(save(s, "t1", "{\"id\":\"t1\",\"n\":2}", v1, &v2) == TNX_OK && v2 > v1, "%s", g_err);
  CHECK(save(s, "t2", "{\"id\":\"t2\"}", TNX_VERSION_ANY, &v3) == TNX_OK, "%s", g_err);
  CHECK(del(s, "t2", v3) == TNX_OK, "%s", g_err);
  close_store(s);

  st = open_dir("a", "", &s);
  CHECK(st == TNX_OK, "reopen: %s", g_err);
  CHECK(get(s, "t1", &g) == TNX_OK && g.version == v2 && strcmp(g.json, "{\"id\":\"t1\",\"n\":2}") == 0,
        "t1 after reopen: v%" PRIu64 " %s", g.version, g.json);
  CHECK(get(s, "t2", &g) == TNX_ENOTFOUND, "deleted t2 came back: %s", g_err);
  st = save(s, "t1", "{\"id\":\"t1\",\"n\":3}", v1, NULL);
  CHECK(st == TNX_ECONFLICT, "stale CAS after reopen: %s", tnx_err_name(st));
  CHECK(save(s, "t1", "{\"id\":\"t1\",\"n\":3}", v2, &v5) == TNX_OK && v5 > v3, "%s", g_err);
  /* Re-creating a deleted id gets a version never seen before. */
  CHECK(save(s, "t2", "{\"id\":\"t2\"}", TNX_VERSION_NONE, &v1) == TNX_OK && v1 > v5, "%s", g_err);
  close_store(s);
}

static void test_lock(void) {
  tnx_store *s, *s2;
  pid_t pid;
  int status;
  CHECK(open_dir("a", "", &s) == TNX_OK, "%s", g_err);
  CHECK(open_dir("a", "", &s2) == TNX_EIO && strstr(g_err, "already open") != NULL,
        "second open in-process: %s", g_err);
  pid = fork();
  if (pid == 0) {
    tnx_status st = open_dir("a", "", &s2);
    _exit(st == TNX_EIO && strstr(g_err, "already open by another process") != NULL ? 0 : 1);
  }
  waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "second process must get TNX_EIO already open");
  CHECK(open_dir("a", "?salvage", &s2) == TNX_EIO, "salvage open while a writer has it: %s", g_err);
  close_store(s);
  pid = fork();
  if (pid == 0) {
    tnx_store *c;
    tnx_status st = open_dir("a", "", &c);
    if (st == TNX_OK) g_vt->close(c, NULL, 0);
    _exit(st == TNX_OK ? 0 : 1);
  }
  waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "after close another process may open");
  /* Two readers (salvage) may share. */
  CHECK(open_dir("a", "?salvage", &s) == TNX_OK, "%s", g_err);
  CHECK(open_dir("a", "?salvage", &s2) == TNX_OK, "%s", g_err);
  close_store(s2);
  close_store(s);
}

/* ABI 1.2 TNX_OPEN_READ_ONLY: nothing created, reads work, writes refused,
 * an unknown flag bit refused. */
static void test_host_read_only(void) {
  tnx_store *s;
  got g;
  char loc[1024], path[1100];
  struct stat sb;
  snprintf(loc, sizeof loc, "%s/ro-missing", g_root);
  CHECK(open_loc_flags(loc, TNX_OPEN_READ_ONLY, &s) == TNX_ENOTFOUND && strstr(g_err, "ro-missing") != NULL,
        "read-only open of a missing store: %s", g_err);
  CHECK(stat(loc, &sb) != 0 && errno == ENOENT, "read-only open created %s", loc);
  CHECK(open_dir("ro", "", &s) == TNX_OK, "%s", g_err);
  CHECK(save(s, "t1", "{\"id\":\"t1\"}", TNX_VERSION_NONE, NULL) == TNX_OK, "%s", g_err);
  close_store(s);
  snprintf(loc, sizeof loc, "%s/ro", g_root);
  CHECK(open_loc_flags(loc, TNX_OPEN_READ_ONLY, &s) == TNX_OK, "read-only open: %s", g_err);
  CHECK(get(s, "t1", &g) == TNX_OK && strcmp(g.json, "{\"id\":\"t1\"}") == 0, "read-only get: %s", g_err);
  CHECK(save(s, "t2", "{\"id\":\"t2\"}", TNX_VERSION_ANY, NULL) == TNX_EUNSUPPORTED, "read-only save: %s", g_err);
  CHECK(del(s, "t1", TNX_VERSION_ANY) == TNX_EUNSUPPORTED, "read-only del: %s", g_err);
  close_store(s);
  CHECK(open_loc_flags(loc, 1u << 12, &s) == TNX_EUNSUPPORTED, "unknown open flag: %s", g_err);
  path_of(path, sizeof path, "ro/" "tasks.kvlog");
  CHECK(stat(path, &sb) == 0, "log missing: %s", path);
}

static void test_torn_tail(void) {
  tnx_store *s;
  char log[1024];
  long size_before, size_full;
  got g;
  static const unsigned char zeros[300];
  static const unsigned char partial[] = {'K', 'V', 'R', '1', 1, 0, 0, 0, 5, 0};
  CHECK(open_dir("torn", "", &s) == TNX_OK, "%s", g_err);
  CHECK(save(s, "keep", "{\"id\":\"keep\"}", TNX_VERSION_ANY, NULL) == TNX_OK, "%s", g_err);
  close_store(s);
  log_path(log, sizeof log, "torn");
  size_before = file_size(log);
  CHECK(open_dir("torn", "", &s) == TNX_OK, "%s", g_err);
  CHECK(save(s, "lost", "{\"id\":\"lost\",\"pad\":\"xxxxxxxxxxxxxxxxxxxxxxxx\"}", TNX_VERSION_ANY, NULL) == TNX_OK,
        "%s", g_err);
  close_store(s);
  size_full = file_size(log);

  /* 1. The last record cut short, as by a crash in the middle of its write. */
  CHECK(truncate(log, size_full - 10) == 0, "truncate");
  CHECK(open_dir("torn", "", &s) == TNX_OK, "torn record must be recovered, got: %s", g_err);
  CHECK(get(s, "keep", &g) == TNX_OK, "%s", g_err);
  CHECK(get(s, "lost", &g) == TNX_ENOTFOUND, "the torn record must be gone");
  close_store(s);
  CHECK(file_size(log) == size_before, "torn tail not truncated: %ld, want %ld", file_size(log), size_before);

  /* 2. Zeros (size extended, data never written), 3. a header fragment. */
  append_bytes(log, zeros, sizeof zeros);
  CHECK(open_dir("torn", "", &s) == TNX_OK, "zero tail: %s", g_err);
  CHECK(save(s, "after", "{\"id\":\"after\"}", TNX_VERSION_ANY, NULL) == TNX_OK, "%s", g_err);
  close_store(s);
  size_before = file_size(log);
  append_bytes(log, partial, sizeof partial);
  CHECK(open_dir("torn", "", &s) == TNX_OK, "fragment tail: %s", g_err);
  CHECK(get(s, "keep", &g) == TNX_OK && get(s, "after", &g) == TNX_OK, "records before a torn tail");
  close_store(s);
  CHECK(file_size(log) == size_before, "fragment not truncated");

  /* A log torn while being created (shorter than its header). */
  CHECK(mkdir(strcat(strcpy(log, g_root), "/newborn"), 0700) == 0, "mkdir");
  log_path(log, sizeof log, "newborn");
  {
    int fd = open(log, O_WRONLY | O_CREAT, 0600);
    if (write(fd, "TNXKV", 5) != 5) abort();
    close(fd);
  }
  CHECK(open_dir("newborn", "", &s) == TNX_OK, "log torn at creation: %s", g_err);
  close_store(s);
  /* Torn at creation the other way: the size reached the disk, the header did not. */
  CHECK(mkdir(strcat(strcpy(log, g_root), "/zeroed"), 0700) == 0, "mkdir");
  log_path(log, sizeof log, "zeroed");
  {
    int fd = open(log, O_WRONLY | O_CREAT, 0600);
    if (write(fd, zeros, 32) != 32) abort();
    close(fd);
  }
  CHECK(open_dir("zeroed", "", &s) == TNX_OK, "zero-filled header: %s", g_err);
  CHECK(save(s, "z", "{}", TNX_VERSION_NONE, NULL) == TNX_OK, "%s", g_err);
  close_store(s);
}

static void test_corrupt_middle(const char *name, int in_header) {
  tnx_store *s;
  char log[1024];
  long at;
  got g;
  page p;
  int i, named = 0;
  CHECK(open_dir(name, "", &s) == TNX_OK, "%s", g_err);
  CHECK(save(s, "c1", "{\"id\":\"c1\",\"m\":\"MARK1\"}", TNX_VERSION_ANY, NULL) == TNX_OK, "%s", g_err);
  CHECK(save(s, "c2", "{\"id\":\"c2\",\"m\":\"MARK2\"}", TNX_VERSION_ANY, NULL) == TNX_OK, "%s", g_err);
  CHECK(save(s, "c3", "{\"id\":\"c3\",\"m\":\"MARK3\"}", TNX_VERSION_ANY, NULL) == TNX_OK, "%s", g_err);
  close_store(s);
  log_path(log, sizeof log, name);
  at = find_in_file(log, "MARK2");
  if (in_header) at = find_in_file(log, "c2") - 56 + 10; /* a length byte of c2's header */
  CHECK(at > 0, "marker");
  poke(log, at, 0x20);

  CHECK(open_dir(name, "", &s) == TNX_ECORRUPT, "corrupt middle must fail open: %s", g_err);
  CHECK(strstr(g_err, "tasks.kvlog") != NULL && strstr(g_err, "offset") != NULL && strstr(g_err, "salvage"),
        "message must name the file, the offset and ?salvage: %s", g_err);

  CHECK(open_dir(name, "?salvage", &s) == TNX_OK, "salvage: %s", g_err);
  CHECK(get(s, "c1", &g) == TNX_OK && strstr(g.json, "MARK1") != NULL, "c1 in salvage");
  CHECK(get(s, "c3", &g) == TNX_OK, "c3 in salvage");
  CHECK(get(s, "c2", &g) == TNX_ECORRUPT, "c2 is in a damaged stretch: must not be ENOTFOUND: %s", g_err);
  CHECK(list(s, 10, NULL, 0, 0, 0, &p) == TNX_ECORRUPT, "list without deliver_corrupt");
  CHECK(list(s, 10, NULL, 0, 1, 0, &p) == TNX_OK && p.n == 3, "list with deliver_corrupt: %d %s", p.n, g_err);
  for (i = 0; i < p.n && i < 3; ++i)
    if (strncmp(p.rec[i].id, "tasks.kvlog@", 12) == 0) {
      named = 1;
      CHECK(p.rec[i].version == 0 && p.rec[i].time_us == TNX_TIME_NONE && p.rec[i].json_len > 0,
            "corrupt record fields");
      CHECK(strstr(p.rec[i].problem, "damaged stretch") != NULL && strstr(p.rec[i].problem, "tasks.kvlog"),
            "problem of a damaged stretch: '%s'", p.rec[i].problem);
    } else {
      CHECK(p.rec[i].problem[0] == '\0', "a sound record has a problem: '%s'", p.rec[i].problem);
    }
  CHECK(named, "the damaged stretch must be delivered, named by its offset");
  CHECK(save(s, "x", "{}", TNX_VERSION_ANY, NULL) == TNX_EUNSUPPORTED, "salvage is read-only");
  CHECK(del(s, "c1", TNX_VERSION_ANY) == TNX_EUNSUPPORTED, "salvage is read-only");
  close_store(s);
}

static void test_rot_after_open(void) {
  tnx_store *s;
  char log[1024];
  got g;
  page p;
  CHECK(open_dir("rot", "", &s) == TNX_OK, "%s", g_err);
  CHECK(save(s, "ok", "{\"id\":\"ok\"}", TNX_VERSION_ANY, NULL) == TNX_OK, "%s", g_err);
  CHECK(save(s, "r1", "{\"id\":\"r1\",\"m\":\"ROTTEN\"}", TNX_VERSION_ANY, NULL) == TNX_OK, "%s", g_err);
  log_path(log, sizeof log, "rot");
  poke(log, find_in_file(log, "ROTTEN"), 0x01);
  CHECK(get(s, "r1", &g) == TNX_ECORRUPT && strstr(g_err, "offset") != NULL, "rot: %s", g_err);
  CHECK(list(s, 10, NULL, 0, 0, 0, &p) == TNX_ECORRUPT, "list must stop on it");
  CHECK(list(s, 10, NULL, 0, 1, 0, &p) == TNX_OK && p.n == 2, "deliver_corrupt: %d", p.n);
  CHECK(p.n == 2 && strcmp(p.rec[1].id, "r1") == 0 && p.rec[1].version == 0 &&
            p.rec[1].time_us == TNX_TIME_NONE && strstr(p.rec[1].json, "SOTTEN") != NULL,
        "corrupt r1 delivered under its id with its raw bytes");
  CHECK(p.n == 2 && strstr(p.rec[1].problem, "offset") != NULL, "r1's problem names the offset: '%s'",
        p.rec[1].problem);
  CHECK(list(s, 10, NULL, 0, 0, 1, &p) == TNX_OK && p.n == 2, "omit_json needs no disk read");
  close_store(s);
}

static void test_compaction(void) {
  tnx_store *s;
  char log[1024], leftover[1100];
  char json[1200];
  long before, after;
  uint64_t v = 0, vdel = 0, vnew = 0;
  got g;
  int i;
  memset(json, 0, sizeof json);
  strcpy(json, "{\"id\":\"big\",\"pad\":\"");
  memset(json + strlen(json), 'p', 1000);
  strcat(json, "\"}");
  CHECK(open_dir("compact", "", &s) == TNX_OK, "%s", g_err);
  for (i = 0; i < 300; ++i) CHECK(save(s, "big", json, TNX_VERSION_ANY, &v) == TNX_OK, "%s", g_err);
  CHECK(save(s, "gone", "{}", TNX_VERSION_ANY, NULL) == TNX_OK, "%s", g_err);
  CHECK(del(s, "gone", TNX_VERSION_ANY) == TNX_OK, "%s", g_err);
  vdel = v + 2;
  close_store(s);
  log_path(log, sizeof log, "compact");
  before = file_size(log);
  CHECK(open_dir("compact", "", &s) == TNX_OK, "%s", g_err);
  after = file_size(log);
  CHECK(after < before / 10, "log not compacted: %ld -> %ld bytes", before, after);
  CHECK(get(s, "big", &g) == TNX_OK && g.version == v && g.json_len == strlen(json), "big after compaction");
  CHECK(get(s, "gone", &g) == TNX_ENOTFOUND, "gone came back");
  CHECK(save(s, "gone", "{}", TNX_VERSION_NONE, &vnew) == TNX_OK && vnew > vdel,
        "the version counter must survive compaction: %" PRIu64 " <= %" PRIu64, vnew, vdel);
  close_store(s);
  snprintf(leftover, sizeof leftover, "%s.compact", log);
  CHECK(access(leftover, F_OK) != 0, "compaction left %s", leftover);
  CHECK(open_dir("compact", "", &s) == TNX_OK, "%s", g_err);
  CHECK(get(s, "big", &g) == TNX_OK && g.version == v && get(s, "gone", &g) == TNX_OK, "after second reopen");
  close_store(s);

  /* Everything deleted: compaction leaves a bare 32-byte header, which must
   * still carry the version counter. */
  CHECK(open_dir("compact-empty", "", &s) == TNX_OK, "%s", g_err);
  for (i = 0; i < 100; ++i) CHECK(save(s, "tmp", json, TNX_VERSION_ANY, &v) == TNX_OK, "%s", g_err);
  CHECK(del(s, "tmp", TNX_VERSION_ANY) == TNX_OK, "%s", g_err);
  close_store(s);
  CHECK(open_dir("compact-empty", "", &s) == TNX_OK, "%s", g_err);
  close_store(s);
  log_path(log, sizeof log, "compact-empty");
  CHECK(file_size(log) == 32, "empty store compacted to %ld bytes, want 32", file_size(log));
  CHECK(open_dir("compact-empty", "", &s) == TNX_OK, "%s", g_err);
  CHECK(save(s, "tmp", "{}", TNX_VERSION_NONE, &vnew) == TNX_OK && vnew > v + 1,
        "version after an all-deleted compaction: %" PRIu64 " <= %" PRIu64, vnew, v + 1);
  close_store(s);
}

static void test_long_id_cursors(void) {
  tnx_store *s;
  char ids[3][601];
  page p;
  int i, k, seen = 0;
  size_t j;
  CHECK(open_dir("long", "", &s) == TNX_OK, "%s", g_err);
  for (i = 0; i < 3; ++i) {
    memset(ids[i], 'L', 600);
    ids[i][599] = (char)('a' + i);
    ids[i][600] = '\0';
    CHECK(save3(s, ids[i], 600, "{}", 5, TNX_VERSION_ANY, NULL) == TNX_OK, "%s", g_err);
  }
  CHECK(list(s, 1, NULL, 0, 0, 0, &p) == TNX_OK && p.n == 1 && p.cursors == 1, "first page");
  for (k = 0; k < 5 && p.n == 1; ++k) {
    CHECK(p.rec[0].id_len == 600 && p.rec[0].id[599] == (char)('a' + seen), "order: got ...%c",
          p.rec[0].id[599]);
    ++seen;
    if (p.cursors == 0) break;
    CHECK(p.cursor_len <= 1024, "cursor of %zu bytes", p.cursor_len);
    for (j = 0; j < p.cursor_len; ++j) CHECK(p.cursor[j] > 0x20 && p.cursor[j] < 0x7f, "unprintable cursor");
    {
      char c[1100];
      size_t n = p.cursor_len;
      memcpy(c, p.cursor, n);
      if (seen == 1) CHECK(del(s, ids[0], TNX_VERSION_ANY) == TNX_OK, "%s", g_err); /* cursor's own id gone */
      CHECK(list(s, 1, c, n, 0, 0, &p) == TNX_OK, "next page: %s", g_err);
    }
  }
  CHECK(seen == 3, "saw %d of 3 long ids", seen);
  close_store(s);
}

/* A writer process killed with SIGKILL in the middle of saving: every save
 * it was told succeeded is there after reopening, intact. */
static void test_kill9(void) {
  int fds[2], status, acked = -1, i;
  pid_t pid;
  tnx_store *s;
  got g;
  if (pipe(fds) != 0) abort();
  pid = fork();
  if (pid == 0) {
    static char json[70000];
    tnx_store *c;
    close(fds[0]);
    if (open_dir("kill9", "", &c) != TNX_OK) _exit(3);
    for (i = 0;; ++i) {
      char id[32];
      snprintf(id, sizeof id, "k%d", i);
      snprintf(json, sizeof json, "{\"id\":\"%s\",\"pad\":\"", id);
      {
        size_t at = strlen(json);
        memset(json + at, 'k', 65536);
        strcpy(json + at + 65536, "\"}");
      }
      if (save(c, id, json, TNX_VERSION_NONE, NULL) != TNX_OK) _exit(4);
      if (write(fds[1], &i, sizeof i) != (ssize_t)sizeof i) _exit(5);
    }
  }
  close(fds[1]);
  for (i = 0; i < 20; ++i)
    if (read(fds[0], &acked, sizeof acked) != (ssize_t)sizeof acked) break;
  kill(pid, SIGKILL);
  while (read(fds[0], &i, sizeof i) == (ssize_t)sizeof i) acked = i;
  close(fds[0]);
  waitpid(pid, &status, 0);
  CHECK(WIFSIGNALED(status), "the writer was meant to be killed, exit %d", WEXITSTATUS(status));
  CHECK(acked >= 19, "writer acknowledged only %d saves", acked + 1);
  CHECK(open_dir("kill9", "", &s) == TNX_OK, "reopen after SIGKILL: %s", g_err);
  for (i = 0; i <= acked; ++i) {
    char id[32];
    snprintf(id, sizeof id, "k%d", i);
    CHECK(get(s, id, &g) == TNX_OK, "acknowledged save %s lost: %s", id, g_err);
  }
  close_store(s);
}

static void test_list_misc(void) {
  tnx_store *s;
  page p;
  static const char *bad[] = {"x", "1", "1.", "1.6", "1.zz", "1.6A", "-.61", "99999999999999999999.61",
                              "1.61.0123456789abcdef", "1.61.", " 1.61", "1.61\n", "9223372036854775808.61"};
  char huge[1100];
  size_t i;
  CHECK(open_dir("misc", "", &s) == TNX_OK, "%s", g_err);
  for (i = 0; i < 5; ++i) {
    char id[8];
    snprintf(id, sizeof id, "m%zu", i);
    CHECK(save3(s, id, strlen(id), "{}", (int64_t)i, TNX_VERSION_ANY, NULL) == TNX_OK, "%s", g_err);
  }
  for (i = 0; i < sizeof bad / sizeof bad[0]; ++i)
    CHECK(list(s, 2, bad[i], strlen(bad[i]), 0, 0, &p) == TNX_EINVAL, "cursor '%s' accepted", bad[i]);
  memset(huge, '1', sizeof huge);
  CHECK(list(s, 2, huge, sizeof huge, 0, 0, &p) == TNX_EINVAL, "1100-byte cursor accepted");
  CHECK(list(s, 2, "-9223372036854775808.61", 23, 0, 0, &p) == TNX_OK, "INT64_MIN cursor: %s", g_err);
  CHECK(list(s, 0, NULL, 0, 0, 0, &p) == TNX_EINVAL, "page size 0");
  CHECK(list(s, 5000, NULL, 0, 0, 0, &p) == TNX_OK && p.n == 5 && p.cursors == 0, "page size clamp");
  CHECK(list(s, 5, NULL, 0, 0, 0, &p) == TNX_OK && p.n == 5 && p.cursors == 0, "exact page: no cursor");
  CHECK(p.n == 5 && strcmp(p.rec[0].id, "m4") == 0 && strcmp(p.rec[4].id, "m0") == 0, "newest first");
  g_stop_after = 2;
  CHECK(list(s, 3, NULL, 0, 0, 0, &p) == TNX_OK && p.n == 2 && p.cursors == 0, "stopped early: no cursor");
  g_stop_after = 0;
  CHECK(list(s, 3, NULL, 0, 0, 1, &p) == TNX_OK && p.n == 3 && p.rec[0].json_len == 0 && p.rec[0].version > 0,
        "omit_json");
  close_store(s);
}

static void test_errors_and_locations(void) {
  tnx_store *s;
  char buf[16], loc[1024], path[1024];
  struct stat st;
  size_t i, cut;
  tnx_status rc;
  got g;
  /* err_cap is a hard limit; NULL with 0 is allowed. */
  CHECK(open_dir("errs", "", &s) == TNX_OK, "%s", g_err);
  memset(buf, '#', sizeof buf);
  rc = g_vt->get(s, S("missing-id"), on_get, &g, buf, 8);
  CHECK(rc == TNX_ENOTFOUND && buf[7] == '\0' && strlen(buf) == 7, "cap 8");
  for (i = 8; i < sizeof buf; ++i) CHECK(buf[i] == '#', "wrote past err_cap at %zu", i);
  memset(buf, '#', sizeof buf);
  CHECK(g_vt->get(s, S("missing-id"), on_get, &g, buf, 1) == TNX_ENOTFOUND && buf[0] == '\0' && buf[1] == '#',
        "cap 1");
  CHECK(g_vt->get(s, S("missing-id"), on_get, &g, NULL, 0) == TNX_ENOTFOUND, "NULL, 0");
  CHECK(g_vt->get(s, S(""), on_get, &g, NULL, 0) == TNX_EINVAL, "empty id");
  CHECK(del(s, "missing-id", TNX_VERSION_ANY) == TNX_ENOTFOUND, "del missing");
  close_store(s);

  /* A truncated message stays valid UTF-8: cut inside the e-acute of a
   * path that does not exist (salvage does not create it). */
  snprintf(loc, sizeof loc, "%s/caf\xc3\xa9-missing?salvage", g_root);
  CHECK(open_loc(loc, &s) == TNX_ENOTFOUND, "missing dir in salvage: %s", g_err);
  cut = (size_t)(strstr(g_err, "\xc3\xa9") - g_err);
  {
    tnx_open_args a;
    char small[600];
    memset(&a, 0, sizeof a);
    a.header = tnx_header(sizeof a);
    a.scheme = S("kv");
    a.location = S(loc);
    a.selector = S(loc);
    memset(small, '#', sizeof small);
    if (cut + 2 <= sizeof small) {
      g_d->open(&a, &s, small, (uint32_t)(cut + 2)); /* room for the first byte of the e-acute only */
      CHECK(strlen(small) == cut, "half a UTF-8 sequence kept: %zu != %zu", strlen(small), cut);
    }
  }

  CHECK(open_loc("", &s) == TNX_EINVAL, "empty location");
  CHECK(open_dir("errs", "?bogus", &s) == TNX_EINVAL && strstr(g_err, "bogus") != NULL, "%s", g_err);
  path_of(path, sizeof path, "a-file");
  {
    int fd = open(path, O_WRONLY | O_CREAT, 0600);
    close(fd);
  }
  CHECK(open_dir("a-file", "", &s) == TNX_EIO, "a file as the directory: %s", g_err);

  /* Nested directories are created; the log is private. */
  CHECK(open_dir("n1/n2/n3", "", &s) == TNX_OK, "%s", g_err);
  close_store(s);
  log_path(path, sizeof path, "n1/n2/n3");
  CHECK(stat(path, &st) == 0 && (st.st_mode & 077) == 0, "log mode %o", (unsigned)st.st_mode);

  /* Not a log at all; a log from the future. */
  CHECK(mkdir(strcat(strcpy(path, g_root), "/notlog"), 0700) == 0, "mkdir");
  log_path(path, sizeof path, "notlog");
  {
    int fd = open(path, O_WRONLY | O_CREAT, 0600);
    const char *t = "this is not a kv log, it is plain text of some length\n";
    if (write(fd, t, strlen(t)) < 0) abort();
    close(fd);
  }
  CHECK(open_dir("notlog", "", &s) == TNX_ECORRUPT && strstr(g_err, "not a toolnexus kv log"), "%s", g_err);
  CHECK(open_dir("a", "", &s) == TNX_OK, "%s", g_err); /* a sound log: copy its header, raise the format */
  close_store(s);
  log_path(path, sizeof path, "a");
  poke(path, 8, 0x03); /* format 1 -> 2: the header checksum now fails first */
  CHECK(open_dir("a", "", &s) == TNX_ECORRUPT, "bad file header: %s", g_err);
  poke(path, 8, 0x03);
  CHECK(open_dir("a", "", &s) == TNX_OK, "restored: %s", g_err);
  close_store(s);
}

int main(int argc, char **argv) {
  void *lib;
  tnx_plugin_entry_fn entry;
  if (argc != 3) {
    fprintf(stderr, "usage: kv_log_test PLUGIN.so SCRATCH_DIR\n");
    return 2;
  }
  snprintf(g_root, sizeof g_root, "%s", argv[2]);
  lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (lib == NULL) {
    fprintf(stderr, "kv_log_test: %s\n", dlerror());
    return 2;
  }
  *(void **)(&entry) = dlsym(lib, TNX_PLUGIN_ENTRY_NAME);
  if (entry == NULL) {
    fprintf(stderr, "kv_log_test: no %s in %s\n", TNX_PLUGIN_ENTRY_NAME, argv[1]);
    return 2;
  }
  test_entry(entry);
  test_reopen_versions();
  test_lock();
  test_host_read_only();
  test_torn_tail();
  test_corrupt_middle("mid-payload", 0);
  test_corrupt_middle("mid-header", 1);
  test_rot_after_open();
  test_compaction();
  test_kill9();
  test_long_id_cursors();
  test_list_misc();
  test_errors_and_locations();
  printf("kv_log_test: %d checks, %d failed\n", g_checks, g_failed);
  dlclose(lib);
  return g_failed == 0 ? 0 : 1;
}

// Tests of the file:<dir> plugin through its C ABI only: the test dlopens
// libtnx_file.so from TOOLNEXUS_TEST_PLUGIN_DIR (environment, else the
// compile-time default), calls toolnexus_plugin_entry and drives the vtable.
// It does not use core.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <Poco/Checksum.h>

#include "toolnexus/task_store.h"

#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

namespace fs = std::filesystem;

namespace {

// ---------------------------------------------------------------------------
// Loading the plugin
// ---------------------------------------------------------------------------

const tnx_plugin_descriptor *plugin() {
  static const tnx_plugin_descriptor *d = [] {
    const char *env = std::getenv("TOOLNEXUS_TEST_PLUGIN_DIR");
    std::string dir = env != nullptr && *env != '\0' ? env : "";
#ifdef TOOLNEXUS_TEST_PLUGIN_DIR
    if (dir.empty()) dir = TOOLNEXUS_TEST_PLUGIN_DIR;
#endif
    REQUIRE_MESSAGE(!dir.empty(), "set TOOLNEXUS_TEST_PLUGIN_DIR to the built plugin directory");
    const std::string lib = dir + "/libtnx_file.so";
    void *h = ::dlopen(lib.c_str(), RTLD_NOW | RTLD_LOCAL);
    REQUIRE_MESSAGE(h != nullptr, "dlopen " << lib << ": " << ::dlerror());
    auto entry = reinterpret_cast<tnx_plugin_entry_fn>(::dlsym(h, TNX_PLUGIN_ENTRY_NAME));
    REQUIRE(reinterpret_cast<void *>(entry) != nullptr);
    tnx_host_info host = {TNX_HEADER_INIT(tnx_host_info), "file_store_test", "0"};
    const tnx_plugin_descriptor *desc = entry(&host);
    REQUIRE(desc != nullptr);
    return desc;
  }();
  return d;
}

tnx_str S(const std::string &s) { return tnx_str{s.data(), s.size()}; }
tnx_str S(const char *s) { return tnx_str{s, std::strlen(s)}; }
std::string V(tnx_str s) { return s.len == 0 ? std::string() : std::string(s.data, s.len); }

// ---------------------------------------------------------------------------
// A thin C++ wrapper over one open store
// ---------------------------------------------------------------------------

struct Rec {
  std::string id, context_id, state, owner, tenant, json;
  int64_t time_us = 0;
  uint64_t version = 0;
  std::string problem;  // ABI 1.2, deliver_corrupt only
  int64_t due_us = TNX_TIME_NONE;  // ABI 1.5
};

Rec copy(const tnx_task_record *r) {
  Rec o;
  o.id = V(r->id);
  o.context_id = V(r->context_id);
  o.state = V(r->state);
  o.owner = V(r->owner);
  o.tenant = V(r->tenant);
  o.json = V(r->task_json);
  o.time_us = r->status_time_us;
  o.version = r->version;
  if (TNX_HAS_FIELD(r, tnx_task_record, problem)) o.problem = V(r->problem);
  if (TNX_HAS_FIELD(r, tnx_task_record, due_us)) o.due_us = r->due_us;
  return o;
}

struct Result {
  tnx_status rc = TNX_OK;
  std::string err;
  uint64_t version = 0;
  Rec rec;
  std::vector<Rec> recs;
  std::string cursor;
};

// JSON string literal of arbitrary bytes (non-ASCII bytes kept as is).
std::string jstr(const std::string &s) {
  std::string o = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      o.push_back('\\');
      o.push_back(static_cast<char>(c));
    } else if (c < 0x20) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", c);
      o += b;
    } else {
      o.push_back(static_cast<char>(c));
    }
  }
  return o + "\"";
}

constexpr int64_t kJan1 = 1704067200LL * 1000000;  // 2024-01-01T00:00:00Z

// A Task: its JSON and the matching index fields.
struct Task {
  std::string id, context_id = "ctx", state = "working", json, owner, tenant;
  int64_t time_us = TNX_TIME_NONE;
  int64_t due_us = TNX_TIME_NONE;  // ABI 1.5
};

// Task `id` with status time 2024-01-01T00:00:00Z + `sec` seconds (sec < 0:
// no timestamp), and an extra payload to make bytes distinct.
Task task(const std::string &id, int sec = 0, const std::string &state = "working",
          const std::string &payload = "", const std::string &ctx = "ctx") {
  Task t;
  t.id = id;
  t.state = state;
  t.context_id = ctx;
  std::string status = "{\"state\":" + jstr(state);
  if (sec >= 0) {
    char ts[64];
    std::snprintf(ts, sizeof ts, "2024-01-01T%02d:%02d:%02dZ", sec / 3600, (sec / 60) % 60, sec % 60);
    status += std::string(",\"timestamp\":\"") + ts + "\"";
    t.time_us = kJan1 + int64_t(sec) * 1000000;
  }
  status += "}";
  t.json = "{\"id\":" + jstr(id) + ",\"contextId\":" + jstr(ctx) + ",\"status\":" + status +
           ",\"kind\":\"task\",\"metadata\":{\"p\":" + jstr(payload) + "}}";
  return t;
}

class Store {
 public:
  explicit Store(const std::string &location, uint32_t flags = 0) {
    Result r = open_raw(location, &s_, flags);
    REQUIRE_MESSAGE(r.rc == TNX_OK, "open file:" << location << ": " << r.err);
  }
  ~Store() {
    if (s_ != nullptr) close();
  }
  Store(const Store &) = delete;
  Store &operator=(const Store &) = delete;

  tnx_store *raw() const { return s_; }

  static Result open_raw(const std::string &location, tnx_store **out, uint32_t flags = 0) {
    const std::string sel = "file:" + location;
    tnx_open_args a{};
    a.header = tnx_header(sizeof a);
    a.scheme = S(scheme());
    a.location = S(location);
    a.selector = S(sel);
    a.flags = flags;
    Result r;
    char err[1024] = {0};
    r.rc = plugin()->open(&a, out, err, sizeof err);
    r.err = err;
    return r;
  }

  Result save(const Task &t, uint64_t expected = TNX_VERSION_ANY) {
    tnx_task_record rec{};
    rec.header = tnx_abi_header TNX_HEADER_INIT(tnx_task_record);
    rec.id = S(t.id);
    rec.context_id = S(t.context_id);
    rec.state = S(t.state);
    rec.status_time_us = t.time_us;
    rec.owner = S(t.owner);
    rec.tenant = S(t.tenant);
    rec.task_json = S(t.json);
    rec.due_us = t.due_us;
    Result r;
    char err[1024] = {0};
    r.rc = vt()->save(s_, &rec, expected, &r.version, err, sizeof err);
    r.err = err;
    return r;
  }

  Result get(const std::string &id) {
    Result r;
    char err[1024] = {0};
    int calls = 0;
    struct Ctx {
      Result *r;
      int *calls;
    } ctx{&r, &calls};
    r.rc = vt()->get(
        s_, S(id),
        [](void *c, const tnx_task_record *rec) -> int32_t {
          auto *x = static_cast<Ctx *>(c);
          x->r->rec = copy(rec);
          ++*x->calls;
          return 0;
        },
        &ctx, err, sizeof err);
    r.err = err;
    if (r.rc == TNX_OK) CHECK(calls == 1);
    else CHECK(calls == 0);
    return r;
  }

  Result del(const std::string &id, uint64_t expected = TNX_VERSION_ANY) {
    Result r;
    char err[1024] = {0};
    r.rc = vt()->del(s_, S(id), expected, err, sizeof err);
    r.err = err;
    return r;
  }

  Result list(tnx_list_query q) {
    Result r;
    char err[1024] = {0};
    r.rc = vt()->list(
        s_, &q,
        [](void *c, const tnx_task_record *rec) -> int32_t {
          static_cast<Result *>(c)->recs.push_back(copy(rec));
          return 0;
        },
        [](void *c, tnx_str cur) { static_cast<Result *>(c)->cursor = V(cur); }, &r, err, sizeof err);
    r.err = err;
    return r;
  }

  // Every record, page by page; checks cursors are printable and <= 1024.
  std::vector<Rec> list_all(uint32_t page = 1000, tnx_list_query q = query()) {
    std::vector<Rec> all;
    std::string cursor;
    for (int guard = 0; guard < 100000; ++guard) {
      q.page_size = page;
      q.cursor = S(cursor);
      Result r = list(q);
      REQUIRE_MESSAGE(r.rc == TNX_OK, r.err);
      CHECK(r.recs.size() <= page);
      all.insert(all.end(), r.recs.begin(), r.recs.end());
      if (r.cursor.empty()) break;
      CHECK(r.recs.size() == page);
      CHECK(r.cursor.size() <= 1024);
      for (char c : r.cursor) CHECK((c >= 0x20 && c < 0x7f));
      cursor = r.cursor;
    }
    return all;
  }

  static tnx_list_query query() {
    tnx_list_query q{};
    q.header = tnx_abi_header TNX_HEADER_INIT(tnx_list_query);
    q.page_size = 1000;
    return q;
  }

  tnx_status close() {
    char err[1024] = {0};
    tnx_status rc = vt()->close(s_, err, sizeof err);
    s_ = nullptr;
    return rc;
  }

  static const char *scheme() { return "file"; }
  tnx_store *handle() const { return s_; }
  static const tnx_store_vtable *vt() { return plugin()->vtable; }

 private:
  tnx_store *s_ = nullptr;
};

// ---------------------------------------------------------------------------
// File system helpers
// ---------------------------------------------------------------------------

struct TempDir {
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "tnx-file-test-XXXXXX").string();
    REQUIRE(::mkdtemp(&tmpl[0]) != nullptr);
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::permissions(path, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(path, ec);
  }
  std::string operator/(const std::string &n) const { return path + "/" + n; }
  std::string path;
};

std::string slurp(const std::string &p) {
  std::ifstream in(p, std::ios::binary);
  REQUIRE_MESSAGE(in.good(), "cannot read " << p);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_file(const std::string &p, const std::string &bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << bytes;
  REQUIRE(out.good());
}

// The names in `dir`, without the store's own index and lock files
// (.tnx-index, .tnx-lock), which every read-write open keeps there.
std::set<std::string> names_in(const std::string &dir) {
  std::set<std::string> out;
  for (const auto &e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (n != ".tnx-index" && n != ".tnx-lock") out.insert(n);
  }
  return out;
}

bool any_temp(const std::string &dir) {
  for (const auto &n : names_in(dir))
    if (n.size() >= 4 && n.compare(n.size() - 4, 4, ".tmp") == 0) return true;
  return false;
}

// SHA-256 of a file, lower-case hex (via sha256sum, coreutils).
std::string sha256_file(const std::string &p) {
  const std::string cmd = "sha256sum '" + p + "'";
  FILE *f = ::popen(cmd.c_str(), "r");
  REQUIRE(f != nullptr);
  char buf[65] = {0};
  const size_t n = std::fread(buf, 1, 64, f);
  ::pclose(f);
  REQUIRE(n == 64);
  return std::string(buf, 64);
}

// Blocks SIGXFSZ and caps the process's file size for the scope.
struct FileSizeLimit {
  explicit FileSizeLimit(rlim_t bytes) {
    old_handler = ::signal(SIGXFSZ, SIG_IGN);
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &old) == 0);
    struct rlimit lim = old;
    lim.rlim_cur = bytes;
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &lim) == 0);
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &old);
    ::signal(SIGXFSZ, old_handler);
  }
  struct rlimit old {};
  void (*old_handler)(int) = nullptr;
};

}  // namespace

// ===========================================================================

TEST_CASE("descriptor: scheme, capabilities, CAS between processes stated") {
  const tnx_plugin_descriptor *d = plugin();
  CHECK(std::string(d->name) == "toolnexus-file");
  REQUIRE(d->schemes[0] != nullptr);
  CHECK(std::string(d->schemes[0]) == "file");
  CHECK(d->schemes[1] == nullptr);
  CHECK(d->capabilities == (TNX_CAP_THREAD_SAFE | TNX_CAP_PAGINATED_LIST | TNX_CAP_COMPARE_AND_SET |
                            TNX_CAP_DURABLE | TNX_CAP_MULTI_PROCESS | TNX_CAP_PERSISTENT | TNX_CAP_CHANGE_FEED |
                            TNX_CAP_DUE_INDEX));
  REQUIRE(d->description != nullptr);
  CHECK(std::string(d->description).find("between processes") != std::string::npos);
  REQUIRE(TNX_HAS_FIELD(d, tnx_plugin_descriptor, location_syntax));
  CHECK(std::string(d->location_syntax) == "file:<dir>");
}

TEST_CASE("open: empty location, non-directory, nested and relative directories") {
  tnx_store *s = nullptr;
  Result r = Store::open_raw("", &s);
  CHECK(r.rc == TNX_EINVAL);
  CHECK(r.err.find("file:/var/lib/toolnexus/tasks") != std::string::npos);
  CHECK(s == nullptr);

  TempDir t;
  write_file(t / "plain", "x");
  r = Store::open_raw(t / "plain", &s);
  CHECK(r.rc == TNX_EINVAL);
  CHECK(r.err.find(t / "plain") != std::string::npos);

  {  // parents created
    Store st(t / "a/b/c");
    CHECK(fs::is_directory(t / "a/b/c"));
    CHECK(st.save(task("x")).rc == TNX_OK);
    CHECK(fs::exists(t / "a/b/c/x.json"));
  }
  {  // relative to the working directory at open
    const fs::path old = fs::current_path();
    fs::current_path(t.path);
    {
      Store st("rel/dir");
      fs::current_path(old);  // the store keeps its directory
      CHECK(st.save(task("r1")).rc == TNX_OK);
    }
    CHECK(fs::exists(t / "rel/dir/r1.json"));
  }
}

TEST_CASE("TNX_OPEN_READ_ONLY: a missing directory is ENOTFOUND and not created; nothing changes") {
  TempDir t;
  tnx_store *s = nullptr;
  Result r = Store::open_raw(t / "missing/dir", &s, TNX_OPEN_READ_ONLY);
  CHECK(r.rc == TNX_ENOTFOUND);
  CHECK_MESSAGE(r.err.find(t / "missing/dir") != std::string::npos, r.err);
  CHECK(s == nullptr);
  CHECK_FALSE(fs::exists(t / "missing"));

  {
    Store w(t / "d");
    REQUIRE(w.save(task("a", 3)).rc == TNX_OK);
  }
  const std::string stray = t / "d/.tnx-999999-1.tmp";
  write_file(stray, "half a save");
  {
    Store ro(t / "d", TNX_OPEN_READ_ONLY);
    CHECK(fs::exists(stray));  // a read-only open repairs nothing
    Result g = ro.get("a");
    REQUIRE_MESSAGE(g.rc == TNX_OK, g.err);
    CHECK(g.rec.time_us == task("a", 3).time_us);
    Result sv = ro.save(task("b"));
    CHECK(sv.rc == TNX_EUNSUPPORTED);
    CHECK(ro.del("a").rc == TNX_EUNSUPPORTED);
  }
  CHECK_FALSE(fs::exists(t / "d/b.json"));
  CHECK(fs::exists(t / "d/a.json"));
  CHECK(fs::exists(stray));
  { Store w(t / "d"); }  // a read-write open does clean up
  CHECK_FALSE(fs::exists(stray));

  r = Store::open_raw(t / "d", &s, 1u << 9);
  CHECK(r.rc == TNX_EUNSUPPORTED);
  CHECK(s == nullptr);
}

TEST_CASE("open: a directory where no task file can be created fails at open, naming it") {
  // /proc/self refuses new files even to root (permission bits would not).
  tnx_store *s = nullptr;
  Result r = Store::open_raw("/proc/self", &s);
  CHECK(r.rc == TNX_EIO);
  CHECK_MESSAGE(r.err.find("cannot create task files in '/proc/self'") != std::string::npos, r.err);
  CHECK(s == nullptr);
  // Reading needs no write access.
  r = Store::open_raw("/proc/self", &s, TNX_OPEN_READ_ONLY);
  CHECK(r.rc == TNX_OK);
  if (s != nullptr) CHECK(Store::vt()->close(s, nullptr, 0) == TNX_OK);
}

TEST_CASE("deliver_corrupt: a task file the process may not read is delivered with why, not fatal") {
  TempDir t;
  {
    Store w(t.path);
    REQUIRE(w.save(task("ok", 1)).rc == TNX_OK);
    REQUIRE(w.save(task("locked", 2)).rc == TNX_OK);
  }
  REQUIRE(::chmod(t.path.c_str(), 0755) == 0);  // so that "nobody" may enter
  REQUIRE(::chmod((t / "locked.json").c_str(), 0) == 0);
  const std::string locked = t / "locked.json";
  // Returns "" when everything is as expected, else what was not.
  auto check = [&]() -> std::string {
    tnx_store *raw = nullptr;
    Result o = Store::open_raw(t.path, &raw, TNX_OPEN_READ_ONLY);  // no write access needed
    if (o.rc != TNX_OK) return "open: " + o.err;
    struct Closer {
      tnx_store *s;
      ~Closer() { Store::vt()->close(s, nullptr, 0); }
    } closer{raw};
    auto list = [&](bool deliver) {
      Result r;
      tnx_list_query q = Store::query();
      q.deliver_corrupt = deliver ? 1u : 0u;
      char err[1024] = {0};
      r.rc = Store::vt()->list(
          raw, &q,
          [](void *c, const tnx_task_record *rec) -> int32_t {
            static_cast<Result *>(c)->recs.push_back(copy(rec));
            return 0;
          },
          [](void *, tnx_str) {}, &r, err, sizeof err);
      r.err = err;
      return r;
    };
    Result plain = list(false);
    if (plain.rc != TNX_EIO || plain.err.find(locked) == std::string::npos)
      return "list without deliver_corrupt: rc " + std::to_string(plain.rc) + " " + plain.err;
    Result all = list(true);
    if (all.rc != TNX_OK) return "list with deliver_corrupt: " + all.err;
    if (all.recs.size() != 2) return "want 2 records, got " + std::to_string(all.recs.size());
    for (const Rec &r : all.recs) {
      if (r.id == "ok" && (r.version == 0 || !r.problem.empty())) return "the readable record came back damaged";
      if (r.id == "locked" && (r.version != 0 || r.problem.find("Permission denied") == std::string::npos ||
                               r.problem.find(locked) == std::string::npos))
        return "locked record: version " + std::to_string(r.version) + " problem '" + r.problem + "'";
    }
    return "";
  };
  std::string why;
  if (::geteuid() == 0) {
    // Root reads any file: check as "nobody" in a child process.
    int fds[2];
    REQUIRE(::pipe(fds) == 0);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(77);  // no CAP_SETUID here
      const std::string w = check();
      (void)!::write(fds[1], w.data(), w.size());
      ::_exit(w.empty() ? 0 : 1);
    }
    ::close(fds[1]);
    char buf[2048];
    for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) why.append(buf, size_t(n));
    ::close(fds[0]);
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 77) {
      MESSAGE("root without CAP_SETUID: cannot check as another user; skipped");
      ::chmod((t / "locked.json").c_str(), 0644);
      return;
    }
    CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  } else {
    why = check();
  }
  CHECK_MESSAGE(why.empty(), why);
  ::chmod((t / "locked.json").c_str(), 0644);
}

TEST_CASE("messages: a NUL or newline in an id does not cut or forge the message; long ids cut on a UTF-8 boundary") {
  TempDir t;
  Store st(t.path);
  Result r = st.del(std::string("a\0b\nc", 5));
  CHECK(r.rc == TNX_ENOTFOUND);
  CHECK_MESSAGE(r.err.find("'a\\x00b\\x0ac'") != std::string::npos, r.err);
  std::string long_id;
  for (int i = 0; i < 200; ++i) long_id += "\xC3\xA9";  // 400 bytes of e-acute
  r = st.del(long_id);
  CHECK(r.rc == TNX_ENOTFOUND);
  const size_t open = r.err.find('\'');
  const size_t dots = r.err.find("...'");
  REQUIRE(open != std::string::npos);
  REQUIRE(dots != std::string::npos);
  CHECK((dots - open - 1) % 2 == 0);  // whole two-byte sequences only
  CHECK(dots - open - 1 <= 128);
}

TEST_CASE("layout: a plain id is stored as exactly <dir>/<id>.json holding the saved bytes") {
  TempDir t;
  Store st(t.path);
  Task a = task("abc-1_Z", 5, "completed", "payload \xC3\xBC \\ \"q\"");
  Result r = st.save(a);
  REQUIRE_MESSAGE(r.rc == TNX_OK, r.err);
  CHECK(r.version == 1);
  CHECK(names_in(t.path) == std::set<std::string>{"abc-1_Z.json"});
  CHECK(slurp(t / "abc-1_Z.json") == a.json);

  Result g = st.get("abc-1_Z");
  REQUIRE_MESSAGE(g.rc == TNX_OK, g.err);
  CHECK(g.rec.id == "abc-1_Z");
  CHECK(g.rec.json == a.json);
  CHECK(g.rec.context_id == "ctx");
  CHECK(g.rec.state == "completed");
  CHECK(g.rec.time_us == kJan1 + 5000000);
  CHECK(g.rec.owner.empty());
  CHECK(g.rec.tenant.empty());
  CHECK(g.rec.version == 1);

  CHECK(st.get("abc-1_z").rc == TNX_ENOTFOUND);
  CHECK(st.get("missing").rc == TNX_ENOTFOUND);
}

TEST_CASE("odd ids: distinct files, all inside <dir>, names within 255 bytes, exact round trip") {
  TempDir root;
  const std::string dir = root / "store";
  std::vector<std::string> ids = {
      "a/b", "a_b", "../x", "x", "/", "/etc/passwd", ".", "..", "~x", "~", "x.json", ".tnx-1-2.tmp",
      "\xC3\xBC",  // ü
      "Abc", "abc", "%41", "A", "~%41", "a b", "tab\there", "quote\"back\\slash", "..\\x", "-", "_",
      std::string(300, 'a'), std::string(300, 'a') + "b", std::string(250, 'q'), std::string(251, 'q'),
      std::string(124, '/'), std::string(83, '/'), std::string(82, '/') + "x",
      [] {
        std::string s;
        for (int i = 0; i < 150; ++i) s += "\xC3\xBC";
        return s;
      }(),
      std::string("nul-free\x01\x7f\xff", 11)};
  {
    Store st(dir);
    for (size_t i = 0; i < ids.size(); ++i) {
      Result r = st.save(task(ids[i], int(i), "working", "n" + std::to_string(i)));
      REQUIRE_MESSAGE(r.rc == TNX_OK, "id #" << i << ": " << r.err);
    }
    // Nothing outside <dir>: the parent holds only the store directory, and
    // the store directory holds only regular files, one per id.
    CHECK(names_in(root.path) == std::set<std::string>{"store"});
    std::set<std::string> files = names_in(dir);
    CHECK(files.size() == ids.size());
    for (const auto &n : files) {
      CHECK(n.size() <= 255);
      CHECK(fs::is_regular_file(fs::symlink_status(dir + "/" + n)));
      CHECK(n.find('/') == std::string::npos);
      CHECK((n.size() > 5 && n.compare(n.size() - 5, 5, ".json") == 0));
    }
    CHECK(files.count("a_b.json") == 1);
    CHECK(files.count("Abc.json") == 1);
    CHECK(files.count("abc.json") == 1);
    CHECK(files.count(std::string(250, 'q') + ".json") == 1);
    for (size_t i = 0; i < ids.size(); ++i) {
      Result g = st.get(ids[i]);
      REQUIRE_MESSAGE(g.rc == TNX_OK, "id #" << i << ": " << g.err);
      CHECK(g.rec.id == ids[i]);
      CHECK(g.rec.json == task(ids[i], int(i), "working", "n" + std::to_string(i)).json);
      CHECK(g.rec.time_us == kJan1 + int64_t(i) * 1000000);
    }
  }
  {  // and after reopening, list finds every id exactly once, newest first
    Store st(dir);
    std::vector<Rec> all = st.list_all(7);
    REQUIRE(all.size() == ids.size());
    for (size_t k = 0; k < all.size(); ++k) CHECK(all[k].id == ids[ids.size() - 1 - k]);
    for (const auto &id : ids) CHECK(st.del(id).rc == TNX_OK);
    CHECK(names_in(dir).empty());
  }
}

TEST_CASE("seed compatibility: a directory of hand-written <id>.json files opens and reads") {
  TempDir t;
  const std::string t1 =
      "{\"id\":\"task-1\",\"contextId\":\"c1\",\"kind\":\"task\",\"status\":{\"state\":\"input-required\","
      "\"timestamp\":\"2024-01-01T00:00:10.5+01:00\"},\"history\":[]}";
  const std::string t2 = "{\n  \"id\": \"task-2\",\n  \"status\": {\"state\": \"completed\"}\n}\n";
  const std::string t3 = "{\"id\":\"3f2a9c1e-0b7d-4c55-9e1a-77c0d1f2e3a4\",\"status\":{\"state\":\"working\","
                         "\"timestamp\":\"2024-01-01T00:00:20.123456789Z\"}}";
  write_file(t / "task-1.json", t1);
  write_file(t / "task-2.json", t2);
  write_file(t / "3f2a9c1e-0b7d-4c55-9e1a-77c0d1f2e3a4.json", t3);
  write_file(t / "README", "not a task");
  write_file(t / "task-1.json.tmp", "seed temp file, not ours");
  Store st(t.path);

  Result g = st.get("task-1");
  REQUIRE_MESSAGE(g.rc == TNX_OK, g.err);
  CHECK(g.rec.json == t1);
  CHECK(g.rec.context_id == "c1");
  CHECK(g.rec.state == "input-required");
  CHECK(g.rec.time_us == kJan1 + 10500000 - 3600LL * 1000000);
  CHECK(g.rec.owner.empty());
  CHECK(g.rec.tenant.empty());
  CHECK(g.rec.version == 1);

  g = st.get("task-2");
  REQUIRE_MESSAGE(g.rc == TNX_OK, g.err);
  CHECK(g.rec.json == t2);
  CHECK(g.rec.context_id.empty());
  CHECK(g.rec.state == "completed");
  CHECK(g.rec.time_us == TNX_TIME_NONE);

  std::vector<Rec> all = st.list_all();
  REQUIRE(all.size() == 3);
  CHECK(all[0].id == "3f2a9c1e-0b7d-4c55-9e1a-77c0d1f2e3a4");
  CHECK(all[0].time_us == kJan1 + 20123456);
  CHECK(all[1].id == "task-1");
  CHECK(all[2].id == "task-2");  // no time sorts oldest

  // A save replaces the seed's file in place, with the same name.
  Task n = task("task-1", 30, "completed");
  Result s = st.save(n, 1);
  REQUIRE_MESSAGE(s.rc == TNX_OK, s.err);
  CHECK(s.version == 2);
  CHECK(slurp(t / "task-1.json") == n.json);
  CHECK(fs::exists(t / "README"));
  CHECK(fs::exists(t / "task-1.json.tmp"));
}

TEST_CASE("corrupt files are TNX_ECORRUPT naming the file, for get and for list") {
  struct Case {
    const char *name;
    std::string bytes;
  };
  const std::vector<Case> cases = {
      {"empty", ""},
      {"truncated", "{\"id\":\"truncated\",\"status\":{\"state\":\"wor"},
      {"garbage", "\x7f" "ELF\x01\x02 garbage"},
      {"array", "[1,2,3]"},
      {"noid", "{\"status\":{\"state\":\"working\"}}"},
      {"numid", "{\"id\":42}"},
      {"wrongid", "{\"id\":\"someone-else\"}"},
      {"badtime", "{\"id\":\"badtime\",\"status\":{\"timestamp\":\"yesterday\"}}"},
      {"trailing", "{\"id\":\"trailing\"} {}"},
  };
  for (const auto &c : cases) {
    CAPTURE(c.name);
    TempDir t;
    write_file(t / "good.json", "{\"id\":\"good\"}");
    const std::string bad = t / (std::string(c.name) + ".json");
    write_file(bad, c.bytes);
    Store st(t.path);
    Result g = st.get(c.name);
    CHECK(g.rc == TNX_ECORRUPT);
    CHECK_MESSAGE(g.err.find(bad) != std::string::npos, g.err);
    CHECK(st.get("good").rc == TNX_OK);
    Result l = st.list(Store::query());
    CHECK(l.rc == TNX_ECORRUPT);
    CHECK_MESSAGE(l.err.find(bad) != std::string::npos, l.err);
    // A corrupt Task can be repaired by saving it (for ids whose file it is).
    if (std::string(c.name) != "wrongid") {
      Result s = st.save(task(c.name));
      CHECK_MESSAGE(s.rc == TNX_OK, s.err);
      CHECK(st.get(c.name).rc == TNX_OK);
      CHECK(st.list(Store::query()).rc == TNX_OK);
    }
  }
}

TEST_CASE("a corrupt sidecar is TNX_ECORRUPT naming it") {
  {
    TempDir t;
    {
      Store st(t.path);
      Task a = task("owned");
      a.owner = "alice";
      REQUIRE(st.save(a).rc == TNX_OK);
    }
    write_file(t / "owned.meta", "{\"owner\":");
    Store st(t.path);
    Result g = st.get("owned");
    CHECK(g.rc == TNX_ECORRUPT);
    CHECK(g.err.find(t / "owned.meta") != std::string::npos);
    Result l = st.list(Store::query());
    CHECK(l.rc == TNX_ECORRUPT);
  }
}

TEST_CASE("open removes stray temporary files of this plugin only") {
  TempDir t;
  write_file(t / ".tnx-123-4.tmp", "half a task");
  write_file(t / ".tnx-99999999-0.tmp", "");
  write_file(t / "keep.json", "{\"id\":\"keep\"}");
  write_file(t / "orphan.meta", "{\"owner\":\"x\",\"tenant\":\"\"}");  // no orphan.json
  write_file(t / "keep.meta", "{\"owner\":\"bob\",\"tenant\":\"\"}");
  const std::set<std::string> foreign = {".tnx-abc.tmp", ".tnx-1-2.tmp.bak", "x.tmp", "keep.json.tmp",
                                         ".hidden", "README", "notes.txt"};
  for (const auto &n : foreign) write_file(t / n, "foreign");
  Store st(t.path);
  std::set<std::string> expect = foreign;
  expect.insert("keep.json");
  expect.insert("keep.meta");
  CHECK(names_in(t.path) == expect);
  Result g = st.get("keep");
  REQUIRE(g.rc == TNX_OK);
  CHECK(g.rec.owner == "bob");
  std::vector<Rec> all = st.list_all();
  REQUIRE(all.size() == 1);
  CHECK(all[0].id == "keep");
}

TEST_CASE("a failed write (file too large) keeps the previous version and leaves no temp file") {
  TempDir t;
  Store st(t.path);
  Task v1 = task("t", 1, "working", "small");
  REQUIRE(st.save(v1).rc == TNX_OK);
  Task owned = task("w", 1);
  owned.owner = "alice";
  owned.tenant = "acme";
  REQUIRE(st.save(owned).rc == TNX_OK);
  const std::set<std::string> before = names_in(t.path);

  Task v2 = task("t", 2, "completed", std::string(4096, 'x'));
  Task fresh = task("u", 2, "working", std::string(4096, 'y'));
  Task w2 = task("w", 2, "completed", std::string(4096, 'z'));
  w2.owner = "mallory";
  Result r1, r2, r3;
  {
    FileSizeLimit lim(64);
    r1 = st.save(v2);
    r2 = st.save(fresh, TNX_VERSION_NONE);
    r3 = st.save(w2);
  }
  CHECK(r1.rc == TNX_EIO);
  CHECK_MESSAGE(r1.err.find(t.path) != std::string::npos, r1.err);
  CHECK_MESSAGE(r1.err.find("too large") != std::string::npos, r1.err);
  CHECK(r2.rc == TNX_EIO);
  CHECK(r3.rc == TNX_EIO);
  CHECK(names_in(t.path) == before);
  CHECK_FALSE(any_temp(t.path));

  Result g = st.get("t");
  REQUIRE(g.rc == TNX_OK);
  CHECK(g.rec.json == v1.json);
  CHECK(g.rec.version == 1);
  CHECK(st.get("u").rc == TNX_ENOTFOUND);
  g = st.get("w");
  REQUIRE(g.rc == TNX_OK);
  CHECK(g.rec.json == owned.json);
  CHECK(g.rec.owner == "alice");
  CHECK(g.rec.tenant == "acme");

  // And the store still works afterwards.
  Result ok = st.save(v2, 1);
  CHECK_MESSAGE(ok.rc == TNX_OK, ok.err);
  CHECK(ok.version == 2);
  CHECK(slurp(t / "t.json") == v2.json);
}

TEST_CASE("compare-and-set and versions") {
  TempDir t;
  Store st(t.path);
  Result r = st.save(task("c", 1, "submitted"), TNX_VERSION_NONE);
  REQUIRE(r.rc == TNX_OK);
  CHECK(r.version == 1);
  r = st.save(task("c", 2), TNX_VERSION_NONE);
  CHECK(r.rc == TNX_ECONFLICT);
  r = st.save(task("c", 2, "working"), 1);
  REQUIRE(r.rc == TNX_OK);
  CHECK(r.version == 2);
  r = st.save(task("c", 3, "failed"), 1);  // stale
  CHECK(r.rc == TNX_ECONFLICT);
  CHECK(r.err.find("expected version 1") != std::string::npos);
  Result g = st.get("c");
  CHECK(g.rec.state == "working");
  CHECK(g.rec.version == 2);
  r = st.save(task("c", 3, "completed"), 7);
  CHECK(r.rc == TNX_ECONFLICT);
  r = st.save(task("c", 3, "completed"));
  CHECK(r.version == 3);
  CHECK(st.save(task("nope"), 1).rc == TNX_ECONFLICT);
  CHECK(st.get("nope").rc == TNX_ENOTFOUND);
  CHECK_FALSE(fs::exists(t / "nope.json"));

  CHECK(st.del("c", 2).rc == TNX_ECONFLICT);
  CHECK(fs::exists(t / "c.json"));
  CHECK(st.del("c", 3).rc == TNX_OK);
  CHECK_FALSE(fs::exists(t / "c.json"));
  CHECK(st.get("c").rc == TNX_ENOTFOUND);
  CHECK(st.del("c").rc == TNX_ENOTFOUND);
  r = st.save(task("c", 4), TNX_VERSION_NONE);  // re-created: numbering continues upwards
  REQUIRE(r.rc == TNX_OK);
  CHECK(r.version == 4);

  // Invalid input writes nothing.
  Task bad = task("d");
  bad.json = "{\"id\":\"other\"}";
  r = st.save(bad);
  CHECK(r.rc == TNX_EINVAL);
  bad = task("d", 5);
  bad.time_us += 1;
  CHECK(st.save(bad).rc == TNX_EINVAL);
  bad = task("d");
  bad.json = "not json";
  CHECK(st.save(bad).rc == TNX_EINVAL);
  CHECK_FALSE(fs::exists(t / "d.json"));
  CHECK(st.get("").rc == TNX_EINVAL);
}

TEST_CASE("owner and tenant live beside the Task file, not in it") {
  TempDir t;
  {
    Store st(t.path);
    Task a = task("o1", 1);
    a.owner = "alice";
    a.tenant = "acme";
    REQUIRE(st.save(a).rc == TNX_OK);
    CHECK(slurp(t / "o1.json") == a.json);
    CHECK(fs::exists(t / "o1.meta"));
    Task b = task("o2", 2);
    b.owner = "bob";
    REQUIRE(st.save(b).rc == TNX_OK);
    REQUIRE(st.save(task("o3", 3)).rc == TNX_OK);
    CHECK_FALSE(fs::exists(t / "o3.meta"));

    tnx_list_query q = Store::query();
    q.filter_flags = TNX_FILTER_OWNER;
    std::string owner_alice = "alice";
    q.owner = S(owner_alice);
    std::vector<Rec> l = st.list_all(1000, q);
    REQUIRE(l.size() == 1);
    CHECK(l[0].id == "o1");
    CHECK(l[0].tenant == "acme");
    std::string empty;
    q.owner = S(empty);
    l = st.list_all(1000, q);
    REQUIRE(l.size() == 1);
    CHECK(l[0].id == "o3");
    q.filter_flags = TNX_FILTER_TENANT;
    std::string acme = "acme";
    q.tenant = S(acme);
    l = st.list_all(1000, q);
    REQUIRE(l.size() == 1);
    CHECK(l[0].id == "o1");
  }
  {
    Store st(t.path);  // persisted across reopen
    Result g = st.get("o1");
    REQUIRE(g.rc == TNX_OK);
    CHECK(g.rec.owner == "alice");
    CHECK(g.rec.tenant == "acme");
    // Owner changes together with the bytes.
    Task a2 = task("o1", 5, "completed");
    a2.owner = "carol";
    REQUIRE(st.save(a2, 1).rc == TNX_OK);
    g = st.get("o1");
    CHECK(g.rec.owner == "carol");
    CHECK(g.rec.tenant.empty());
    CHECK(g.rec.json == a2.json);
    CHECK(slurp(t / "o1.meta").find("prev") == std::string::npos);
    // Same bytes, new owner.
    a2.owner = "dave";
    REQUIRE(st.save(a2).rc == TNX_OK);
    CHECK(st.get("o1").rec.owner == "dave");
    // Owner removed: the sidecar goes.
    a2.owner.clear();
    REQUIRE(st.save(a2).rc == TNX_OK);
    CHECK(st.get("o1").rec.owner.empty());
    CHECK_FALSE(fs::exists(t / "o1.meta"));
    // Delete removes the sidecar too.
    CHECK(st.del("o2").rc == TNX_OK);
    CHECK_FALSE(fs::exists(t / "o2.json"));
    CHECK_FALSE(fs::exists(t / "o2.meta"));
  }
  {
    // A crash between the sidecar and the Task file of a save that changes
    // owner and bytes: the sidecar has the new owner plus a "prev" slot for
    // the old bytes, which are still in place, so the old owner holds.
    const std::string meta_of = "{\"owner\":\"eve\",\"tenant\":\"evil\",\"prev\":{\"owner\":\"\","
                                "\"tenant\":\"t0\",\"sha256\":\"";
    write_file(t / "o3.meta", meta_of + sha256_file(t / "o3.json") + "\"}}");
    Store st(t.path);
    Result g = st.get("o3");
    REQUIRE(g.rc == TNX_OK);
    CHECK(g.rec.owner.empty());
    CHECK(g.rec.tenant == "t0");
    // Had the Task file been replaced, the digest would not match: new owner.
    write_file(t / "o3.meta", meta_of + std::string(64, '0') + "\"}}");
    g = st.get("o3");
    CHECK(g.rec.owner == "eve");
    CHECK(g.rec.tenant == "evil");
    // A save that fails after a crash left a "prev" slot behind: the owner of
    // the version still in place (the "prev" one) must survive the failure.
    write_file(t / "o3.meta", meta_of + sha256_file(t / "o3.json") + "\"}}");
    Task big = task("o3", 8, "working", std::string(8192, 'b'));  // owner empty, tenant empty
    big.tenant = "t0";
    Result f;
    {
      FileSizeLimit lim(1024);  // sidecars fit, the Task file does not
      f = st.save(big);
    }
    CHECK(f.rc == TNX_EIO);
    CHECK_FALSE(any_temp(t.path));
    g = st.get("o3");
    REQUIRE(g.rc == TNX_OK);
    CHECK(g.rec.json == task("o3", 3).json);
    CHECK(g.rec.owner.empty());
    CHECK(g.rec.tenant == "t0");
    write_file(t / "o3.meta", meta_of + std::string(64, '0') + "\"}}");
    // The next save cleans the "prev" slot away.
    Task a = task("o3", 9);
    a.owner = "eve";
    a.tenant = "evil";
    REQUIRE(st.save(a).rc == TNX_OK);
    CHECK(slurp(t / "o3.meta").find("prev") == std::string::npos);
    CHECK(st.get("o3").rec.owner == "eve");
  }
}

TEST_CASE("list: order, filters, paging with a keyset cursor, bad queries") {
  TempDir t;
  Store st(t.path);
  std::vector<Task> tasks;
  for (int i = 0; i < 25; ++i) {
    // times with ties, some without a timestamp
    const int sec = i % 5 == 4 ? -1 : (i % 7) * 10;
    tasks.push_back(task("t" + std::to_string(100 + i), sec, i % 2 ? "completed" : "working", "",
                         i % 3 ? "c1" : "c2"));
    REQUIRE(st.save(tasks.back()).rc == TNX_OK);
  }
  std::vector<Task> expect = tasks;
  std::sort(expect.begin(), expect.end(), [](const Task &a, const Task &b) {
    if (a.time_us != b.time_us) return a.time_us > b.time_us;
    return a.id < b.id;
  });
  for (uint32_t page : {1u, 2u, 7u, 24u, 25u, 26u, 5000u}) {
    CAPTURE(page);
    std::vector<Rec> all = st.list_all(page);
    REQUIRE(all.size() == expect.size());
    for (size_t k = 0; k < all.size(); ++k) {
      CHECK(all[k].id == expect[k].id);
      CHECK(all[k].json == expect[k].json);
      CHECK(all[k].time_us == expect[k].time_us);
      CHECK(all[k].version == 1);
    }
  }
  // Filters.
  tnx_list_query q = Store::query();
  q.filter_flags = TNX_FILTER_STATE | TNX_FILTER_CONTEXT_ID;
  std::string working = "working", c1 = "c1";
  q.state = S(working);
  q.context_id = S(c1);
  std::vector<Rec> f = st.list_all(3, q);
  size_t n = 0;
  for (const auto &e : expect)
    if (e.state == "working" && e.context_id == "c1") ++n;
  CHECK(f.size() == n);
  for (const auto &r : f) CHECK((r.state == "working" && r.context_id == "c1"));
  q = Store::query();
  q.filter_flags = TNX_FILTER_AFTER | TNX_FILTER_BEFORE;
  q.after_us = kJan1 + 10 * 1000000;
  q.before_us = kJan1 + 50 * 1000000;
  f = st.list_all(2, q);
  for (const auto &r : f) CHECK((r.time_us > q.after_us && r.time_us < q.before_us));
  n = 0;
  for (const auto &e : expect)
    if (e.time_us > q.after_us && e.time_us < q.before_us) ++n;
  CHECK(f.size() == n);
  // omit_json may drop the JSON but not the index.
  q = Store::query();
  q.omit_json = 1;
  Result l = st.list(q);
  REQUIRE(l.rc == TNX_OK);
  CHECK(l.recs.size() == 25);
  CHECK(l.recs[0].id == expect[0].id);

  // The cursor is a keyset: records added/removed between pages do not shift it.
  q = Store::query();
  q.page_size = 10;
  Result p1 = st.list(q);
  REQUIRE(p1.rc == TNX_OK);
  REQUIRE(p1.recs.size() == 10);
  REQUIRE_FALSE(p1.cursor.empty());
  REQUIRE(st.del(p1.recs[3].id).rc == TNX_OK);
  REQUIRE(st.save(task("t000", 1000)).rc == TNX_OK);  // newest: before the cursor
  q.cursor = S(p1.cursor);
  Result p2 = st.list(q);
  REQUIRE(p2.rc == TNX_OK);
  REQUIRE(p2.recs.size() == 10);
  CHECK(p2.recs[0].id == expect[10].id);

  // Bad queries.
  q = Store::query();
  q.page_size = 0;
  CHECK(st.list(q).rc == TNX_EINVAL);
  q = Store::query();
  std::string bad = "zz.not-a-cursor";
  q.cursor = S(bad);
  CHECK(st.list(q).rc == TNX_EINVAL);
  // Early stop by the sink: TNX_OK, no cursor.
  q = Store::query();
  q.page_size = 5;
  Result stop;
  char err[256] = {0};
  int seen = 0;
  struct Ctx {
    int *seen;
    std::string *cursor;
  } ctx{&seen, &stop.cursor};
  tnx_status rc = Store::vt()->list(
      st.handle(), &q,
      [](void *c, const tnx_task_record *) -> int32_t { return ++*static_cast<Ctx *>(c)->seen == 2; },
      [](void *c, tnx_str cur) { *static_cast<Ctx *>(c)->cursor = V(cur); }, &ctx, err, sizeof err);
  CHECK(rc == TNX_OK);
  CHECK(seen == 2);
  CHECK(stop.cursor.empty());
}

TEST_CASE("list: ids too long for a plain cursor still page exactly") {
  TempDir t;
  Store st(t.path);
  std::vector<std::string> ids;
  const std::string prefix(600, 'p');
  for (int i = 0; i < 6; ++i) ids.push_back(prefix + std::to_string(i));
  ids.push_back(std::string(470, 'p'));  // a prefix of all the others
  ids.push_back(std::string(800, 'z'));
  for (const auto &id : ids) REQUIRE(st.save(task(id, 7)).rc == TNX_OK);
  std::sort(ids.begin(), ids.end());
  std::vector<Rec> all = st.list_all(1);  // checks each cursor <= 1024 bytes
  REQUIRE(all.size() == ids.size());
  for (size_t k = 0; k < ids.size(); ++k) CHECK(all[k].id == ids[k]);
}

TEST_CASE("8 threads saving the same and different ids: no torn or lost record") {
  TempDir t;
  Store st(t.path);
  constexpr int kThreads = 8, kRounds = 40, kIncrements = 15;
  auto counter_task = [](int n) {
    Task c = task("counter", 1);
    c.json = "{\"id\":\"counter\",\"contextId\":\"ctx\",\"status\":{\"state\":\"working\","
             "\"timestamp\":\"2024-01-01T00:00:01Z\"},\"metadata\":{\"n\":" +
             std::to_string(n) + "}}";
    return c;
  };
  REQUIRE(st.save(counter_task(0), TNX_VERSION_NONE).rc == TNX_OK);
  std::atomic<bool> stop{false};
  std::atomic<int> failures{0};
  std::vector<std::string> errors;
  std::mutex errors_mu;
  auto fail = [&](const std::string &what) {
    ++failures;
    std::lock_guard<std::mutex> l(errors_mu);
    if (errors.size() < 20) errors.push_back(what);
  };
  auto valid_shared = [](const std::string &json) {
    for (int th = 0; th < kThreads; ++th)
      for (int r = 0; r < kRounds; ++r)
        if (json == task("shared", r, "working", "t" + std::to_string(th) + "r" + std::to_string(r)).json)
          return true;
    return false;
  };
  // A reader that must only ever see whole records.
  std::thread reader([&] {
    while (!stop.load()) {
      Result g = st.get("shared");
      if (g.rc == TNX_OK && !valid_shared(g.rec.json)) fail("torn get: " + g.rec.json.substr(0, 80));
      if (g.rc != TNX_OK && g.rc != TNX_ENOTFOUND) fail("get: " + g.err);
      Result l = st.list(Store::query());
      if (l.rc != TNX_OK) fail("list: " + l.err);
    }
  });
  std::vector<std::thread> writers;
  for (int th = 0; th < kThreads; ++th) {
    writers.emplace_back([&, th] {
      const std::string own = "own-" + std::to_string(th);
      for (int r = 0; r < kRounds; ++r) {
        Result a = st.save(task(own, r, "working", "r" + std::to_string(r)));
        if (a.rc != TNX_OK || a.version != uint64_t(r + 1)) fail("own save: " + a.err);
        Result b = st.save(task("shared", r, "working", "t" + std::to_string(th) + "r" + std::to_string(r)));
        if (b.rc != TNX_OK) fail("shared save: " + b.err);
      }
      for (int k = 0; k < kIncrements;) {  // CAS increments
        Result g = st.get("counter");
        if (g.rc != TNX_OK) {
          fail("counter get: " + g.err);
          return;
        }
        const size_t p = g.rec.json.find("\"n\":");
        const int n = std::atoi(g.rec.json.c_str() + p + 4);
        Result s = st.save(counter_task(n + 1), g.rec.version);
        if (s.rc == TNX_OK) {
          if (s.version != g.rec.version + 1) fail("counter version");
          ++k;
        } else if (s.rc != TNX_ECONFLICT) {
          fail("counter save: " + s.err);
          return;
        }
      }
    });
  }
  for (auto &w : writers) w.join();
  stop = true;
  reader.join();
  std::string all_errors;
  for (const auto &e : errors) all_errors += e + "\n";
  CHECK_MESSAGE(failures.load() == 0, all_errors);

  for (int th = 0; th < kThreads; ++th) {
    Result g = st.get("own-" + std::to_string(th));
    REQUIRE(g.rc == TNX_OK);
    CHECK(g.rec.json == task("own-" + std::to_string(th), kRounds - 1, "working",
                             "r" + std::to_string(kRounds - 1)).json);
    CHECK(g.rec.version == kRounds);
  }
  Result g = st.get("shared");
  REQUIRE(g.rc == TNX_OK);
  CHECK(valid_shared(g.rec.json));
  CHECK(g.rec.version == uint64_t(kThreads * kRounds));
  g = st.get("counter");
  REQUIRE(g.rc == TNX_OK);
  CHECK(g.rec.json == counter_task(kThreads * kIncrements).json);
  CHECK(g.rec.version == uint64_t(kThreads * kIncrements + 1));
  CHECK_FALSE(any_temp(t.path));
  CHECK(names_in(t.path).size() == size_t(kThreads + 2));
}

// ===========================================================================
// Several processes on one directory, crashes, the index (issue 11)
// ===========================================================================

TEST_CASE("a second read-write open never removes what a live store is writing") {
  // Another live store's in-flight files: a temp file of a save under way,
  // and the sidecar of a first save with an owner whose Task file is not
  // renamed in yet. On main, the second open's clean-up deleted both.
  TempDir t;
  Store live(t.path);
  REQUIRE(live.save(task("done")).rc == TNX_OK);
  const std::string in_flight = ".tnx-" + std::to_string(::getpid()) + "-777777.tmp";
  write_file(t / in_flight, "{\"id\":\"half");
  write_file(t / "first.meta", "{\"owner\":\"alice\",\"tenant\":\"\"}");
  {
    Store second(t.path);  // what `store put`, `store rm` or a second server does
    CHECK(second.get("done").rc == TNX_OK);
  }
  CHECK(fs::exists(t / in_flight));
  CHECK(fs::exists(t / "first.meta"));
  live.close();
  // With no store open any more, the next open cleans up what a crash left.
  {
    Store alone(t.path);
  }
  CHECK_FALSE(fs::exists(t / in_flight));
  CHECK_FALSE(fs::exists(t / "first.meta"));
}

TEST_CASE("compare-and-set holds between two stores (processes) on one directory") {
  // Two open stores do not share memory, like two processes. On main each
  // numbered versions on its own: both "won" with the same expected version
  // (cancel then completed; approve and deny both accepted).
  TempDir t;
  Store a(t.path);
  Store b(t.path);
  Result first = a.save(task("x", 1, "input-required"));
  REQUIRE(first.rc == TNX_OK);
  Result seen_a = a.get("x"), seen_b = b.get("x");
  REQUIRE(seen_a.rc == TNX_OK);
  REQUIRE(seen_b.rc == TNX_OK);
  CHECK(seen_a.rec.version == seen_b.rec.version);
  Result approve = a.save(task("x", 2, "working", "approved"), seen_a.rec.version);
  CHECK(approve.rc == TNX_OK);
  Result deny = b.save(task("x", 3, "rejected", "denied"), seen_b.rec.version);
  CHECK(deny.rc == TNX_ECONFLICT);
  Result now = b.get("x");
  REQUIRE(now.rc == TNX_OK);
  CHECK(now.rec.state == "working");
  CHECK(now.rec.version == approve.version);
  // A delete through one store is seen by the other, and numbering goes on.
  CHECK(b.del("x", approve.version).rc == TNX_OK);
  CHECK(a.get("x").rc == TNX_ENOTFOUND);
  Result again = a.save(task("x", 4), TNX_VERSION_NONE);
  REQUIRE(again.rc == TNX_OK);
  CHECK(again.version > approve.version);
  // list and count of each store see the other's writes.
  REQUIRE(b.save(task("y", 5)).rc == TNX_OK);
  CHECK(a.list_all().size() == 2);
}

TEST_CASE("several processes CAS-incrementing one Task lose no update") {
  TempDir t;
  {
    Store s(t.path);
    Task c = task("counter", 1);
    c.json = "{\"id\":\"counter\",\"contextId\":\"ctx\",\"status\":{\"state\":\"working\","
             "\"timestamp\":\"2024-01-01T00:00:01Z\"},\"metadata\":{\"n\":0}}";
    REQUIRE(s.save(c).rc == TNX_OK);
  }
  constexpr int kProcs = 3, kEach = 20;
  std::vector<pid_t> kids;
  for (int p = 0; p < kProcs; ++p) {
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      int bad = 0;
      Store s(t.path);
      for (int k = 0; k < kEach;) {
        Result g = s.get("counter");
        if (g.rc != TNX_OK) ::_exit(4);
        const int n = std::atoi(g.rec.json.c_str() + g.rec.json.find("\"n\":") + 4);
        Task c = task("counter", 1);
        c.json = "{\"id\":\"counter\",\"contextId\":\"ctx\",\"status\":{\"state\":\"working\","
                 "\"timestamp\":\"2024-01-01T00:00:01Z\"},\"metadata\":{\"n\":" + std::to_string(n + 1) + "}}";
        Result r = s.save(c, g.rec.version);
        if (r.rc == TNX_OK) ++k;
        else if (r.rc != TNX_ECONFLICT) ++bad;
        if (bad > 0) ::_exit(5);
      }
      s.close();
      ::_exit(0);
    }
    kids.push_back(pid);
  }
  for (pid_t pid : kids) {
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  }
  Store s(t.path);
  Result g = s.get("counter");
  REQUIRE(g.rc == TNX_OK);
  CHECK(g.rec.json.find("\"n\":" + std::to_string(kProcs * kEach) + "}") != std::string::npos);
}

TEST_CASE("index: kept across a crash (SIGKILL) mid-saves; rebuilt when missing or stale") {
  TempDir t;
  {
    Store s(t.path);
    for (int i = 0; i < 30; ++i) REQUIRE(s.save(task("k" + std::to_string(i), i, "completed")).rc == TNX_OK);
  }
  // A process killed in the middle of saving: its index may end in a torn
  // record and its files may be ahead of the index.
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    Store s(t.path);
    for (int i = 0;; ++i) (void)s.save(task("k" + std::to_string(i % 30), 100 + i, i % 2 ? "working" : "failed"));
  }
  ::usleep(300 * 1000);
  ::kill(pid, SIGKILL);
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  auto agrees = [&](Store &s) {
    // What list and count say is what the files say.
    std::vector<Rec> all = s.list_all(7);
    REQUIRE(all.size() == 30);
    size_t working = 0;
    for (const Rec &r : all) {
      const std::string on_disk = slurp(t / (r.id + ".json"));
      CHECK(r.json == on_disk);
      if (r.state == "working") ++working;
    }
    tnx_list_query q = Store::query();
    q.filter_flags = TNX_FILTER_STATE;
    q.state = S("working");
    uint64_t n = 0;
    char err[256];
    REQUIRE(plugin()->vtable->count(s.raw(), &q, &n, err, sizeof err) == TNX_OK);
    CHECK(n == working);
    CHECK(s.list_all(5, q).size() == working);
  };
  {
    Store s(t.path);
    agrees(s);
    // Each Task's version still moves forward after the crash.
    Result g = s.get("k3");
    Result again = s.save(task("k3", 999, "completed"), g.rec.version);
    CHECK(again.rc == TNX_OK);
  }
  // Missing: rebuilt from the files.
  fs::remove(t / ".tnx-index");
  {
    Store s(t.path);
    agrees(s);
  }
  CHECK(fs::exists(t / ".tnx-index"));
  // Stale: a Task file written behind the store's back while it was closed
  // (the seed's own program, an editor) is seen at the next open.
  write_file(t / "k40.json", task("k40", 5000, "working").json);
  fs::remove(t / "k0.json");
  {
    Store s(t.path, TNX_OPEN_READ_ONLY);
    std::vector<Rec> all = s.list_all();
    CHECK(all.size() == 30);
    CHECK(all.front().id == "k40");
  }
  Store s(t.path);
  CHECK(s.get("k40").rc == TNX_OK);
  CHECK(s.get("k0").rc == TNX_ENOTFOUND);
}

TEST_CASE("a zero-byte or damaged task file is one bad record, not a broken list") {
  TempDir t;
  {
    Store s(t.path);
    REQUIRE(s.save(task("a", 10)).rc == TNX_OK);
    REQUIRE(s.save(task("b", 20)).rc == TNX_OK);
  }
  write_file(t / "zero.json", "");
  {
    Store s(t.path);
    // Without deliver_corrupt the list still says so (never silent)...
    CHECK(s.list(Store::query()).rc == TNX_ECORRUPT);
    // ...with it, the sound records and the bad one with why.
    tnx_list_query q = Store::query();
    q.deliver_corrupt = 1;
    std::vector<Rec> all = s.list_all(1000, q);
    REQUIRE(all.size() == 3);
    CHECK(all[0].id == "b");
    CHECK(all[2].id == "zero");
    CHECK(all[2].version == 0);
    CHECK(all[2].problem.find("zero.json") != std::string::npos);
    // Counted are the sound ones.
    tnx_list_query cq = Store::query();
    uint64_t n = 0;
    char err[256];
    REQUIRE(plugin()->vtable->count(s.raw(), &cq, &n, err, sizeof err) == TNX_OK);
    CHECK(n == 2);
  }
}

TEST_CASE("a corrupt file among Tasks without a timestamp is listed once, in its place, on every page size") {
  // Corrupt entries share the "no time" end of the order with sound Tasks
  // that have no timestamp. An omit_json page once delivered the corrupt
  // ones after the rest of the page and took the next cursor from them:
  // `store list` printed 1088 lines for 599 Tasks.
  TempDir t;
  std::vector<std::string> want = {"timed-b", "timed-a"};
  {
    Store s(t.path);
    REQUIRE(s.save(task("timed-a", 10)).rc == TNX_OK);
    REQUIRE(s.save(task("timed-b", 20)).rc == TNX_OK);
    for (int i = 0; i < 30; ++i) {
      char id[8];
      std::snprintf(id, sizeof id, "n%02d", i);
      REQUIRE(s.save(task(id, -1)).rc == TNX_OK);
      want.push_back(id);
      if (i == 15) want.push_back("n15b");
    }
  }
  write_file(t / "n15b.json", "garbage");
  Store s(t.path);
  for (int omit = 0; omit < 2; ++omit) {
    for (uint32_t page : {1u, 2u, 4u, 7u, 16u, 1000u}) {
      CAPTURE(omit);
      CAPTURE(page);
      tnx_list_query q = Store::query();
      q.deliver_corrupt = 1;
      q.omit_json = static_cast<uint32_t>(omit);
      std::vector<Rec> all = s.list_all(page, q);
      std::vector<std::string> got;
      for (const Rec &r : all) got.push_back(r.id);
      std::string g, w;  // as text, so that a failure shows both
      for (const auto &x : got) g += x + " ";
      for (const auto &x : want) w += x + " ";
      CHECK(g == w);
      for (const Rec &r : all) CHECK((r.version == 0) == (r.id == "n15b"));
    }
  }
}

TEST_CASE("list: a page whose candidates all keep changing still says where the next page starts") {
  // Covered through the public contract: a listing of untouched Tasks while
  // others are rewritten never ends early. (The fallback used to drop a
  // page's stale candidates and return no cursor, ending the listing.)
  TempDir t;
  {
    Store s(t.path);
    for (int i = 0; i < 300; ++i) REQUIRE(s.save(task("k" + std::to_string(i), i + 1)).rc == TNX_OK);
  }
  std::atomic<bool> stop{false};
  std::thread writer([&] {
    Store w(t.path);
    for (int n = 0; !stop.load(); ++n) (void)w.save(task("k" + std::to_string(299 - n % 20), 5000 + n % 3), TNX_VERSION_ANY);
  });
  for (int round = 0; round < 20; ++round) {
    Store r(t.path, TNX_OPEN_READ_ONLY);
    tnx_list_query q = Store::query();
    q.omit_json = 0;
    std::vector<Rec> all = r.list_all(1, q);
    std::set<std::string> ids;
    for (const Rec &x : all) ids.insert(x.id);
    for (int i = 0; i < 280; ++i) CHECK(ids.count("k" + std::to_string(i)) == 1);
  }
  stop = true;
  writer.join();
}

TEST_CASE("a FIFO in place of .tnx-index or .tnx-lock is refused at open, naming it, not waited on") {
  // A read-only open (store list, get, check) used to block for ever in
  // open(2) on a FIFO with no writer.
  for (const char *own : {".tnx-index", ".tnx-lock"}) {
    CAPTURE(own);
    TempDir t;
    {
      Store s(t.path);
      REQUIRE(s.save(task("a", 10)).rc == TNX_OK);
    }
    fs::remove(t / own);
    REQUIRE(::mkfifo((t / own).c_str(), 0600) == 0);
    for (uint32_t flags : {uint32_t{TNX_OPEN_READ_ONLY}, uint32_t{0}}) {
      tnx_store *s = nullptr;
      Result r = Store::open_raw(t.path, &s, flags);
      CHECK(r.rc == TNX_EIO);
      CHECK(r.err.find(t / own) != std::string::npos);
      CHECK(r.err.find("not a regular file") != std::string::npos);
      CHECK(s == nullptr);
    }
  }
}

TEST_CASE("index compaction: a grown index is rewritten; a second open store follows; versions, tombstones, order kept") {
  TempDir t;
  // A 16 KiB contextId makes every index record ~16 KiB, so that a few
  // hundred saves grow .tnx-index past the 8 MiB at which it is rewritten.
  const std::string ctx(16 * 1024, 'c');
  const fs::path index = t / ".tnx-index";
  Store a(t.path);
  Store b(t.path);  // another open store: reads the old file until it says "moved"
  for (int i = 0; i < 3; ++i) REQUIRE(a.save(task("gone", 1, "working", "", ctx)).rc == TNX_OK);
  REQUIRE(a.del("gone").rc == TNX_OK);  // its last version, 3, lives on as a tombstone
  std::map<std::string, uint64_t> version;
  uintmax_t size = fs::file_size(index), peak = size;
  bool rewritten = false;
  int round = 0;
  for (; round < 1000 && !rewritten; ++round) {
    for (int k = 0; k < 5; ++k) {
      const std::string id = "t" + std::to_string(k);
      Result r = a.save(task(id, 10 * round + k, round % 2 ? "working" : "completed", "", ctx));
      REQUIRE(r.rc == TNX_OK);
      version[id] = r.version;
      const uintmax_t now = fs::file_size(index);
      if (now < size) rewritten = true;
      size = now;
      if (size > peak) peak = size;
    }
  }
  REQUIRE(rewritten);
  CHECK(peak > (7u << 20));  // the save that passed 8 MiB rewrote it at once
  CHECK(size < (1u << 20));  // five live Tasks and a tombstone, not the history
  const int last = round - 1;
  // The follower sees every Task at its newest version, in list order
  // (newest status time first: t4 of the last round first).
  auto check = [&](Store &s) {
    std::vector<Rec> all = s.list_all(2);
    REQUIRE(all.size() == 5);
    for (int k = 0; k < 5; ++k) {
      const Rec &r = all[static_cast<size_t>(k)];
      const std::string id = "t" + std::to_string(4 - k);
      CHECK(r.id == id);
      CHECK(r.version == version[id]);
      CHECK(r.time_us == kJan1 + int64_t(10 * last + 4 - k) * 1000000);
      CHECK(r.context_id == ctx);
      CHECK(s.get(id).rec.version == version[id]);
    }
  };
  check(b);
  // Saves through the follower continue the versions.
  Result r = b.save(task("t0", 10 * last, "completed", "x", ctx), version["t0"]);
  REQUIRE(r.rc == TNX_OK);
  CHECK(r.version == version["t0"] + 1);
  version["t0"] = r.version;
  check(a);
  // A fresh read-only open reads the rewritten file as it is.
  {
    Store ro(t.path, TNX_OPEN_READ_ONLY);
    check(ro);
  }
  // The tombstone survived the rewrite: "gone" comes back above version 3.
  Result back = a.save(task("gone", 1, "working", "", ctx), 0);
  REQUIRE(back.rc == TNX_OK);
  CHECK(back.version == 4);
}

TEST_CASE(".tnx-index records carry zlib's CRC-32: indexes of older and newer builds read alike") {
  TempDir t;
  {
    Store s(t.path);
    for (int i = 0; i < 20; ++i) REQUIRE(s.save(task("c" + std::to_string(i % 7), i, "working", "p")).rc == TNX_OK);
    REQUIRE(s.del("c3").rc == TNX_OK);
  }
  const std::string bytes = slurp(t / ".tnx-index");
  // Framing: u32 length | length bytes (type + payload) | u32 CRC-32 of them.
  auto u32 = [&](size_t at) {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= uint32_t(static_cast<unsigned char>(bytes[at + size_t(i)])) << (8 * i);
    return v;
  };
  size_t off = 0, records = 0;
  while (off < bytes.size()) {
    REQUIRE(bytes.size() - off >= 8);
    const uint32_t len = u32(off);
    REQUIRE(bytes.size() - off - 8 >= len);
    Poco::Checksum zlib(Poco::Checksum::TYPE_CRC32);
    zlib.update(bytes.data() + off + 4, len);
    CHECK(zlib.checksum() == u32(off + 4 + len));
    off += 8 + len;
    ++records;
  }
  CHECK(off == bytes.size());
  CHECK(records >= 22);  // header, open, 20 saves, a delete, close
  // The well-known check value of CRC-32 ("123456789" -> CBF43926), so that
  // the comparison above is with the standard checksum.
  Poco::Checksum check(Poco::Checksum::TYPE_CRC32);
  check.update("123456789", 9);
  CHECK(check.checksum() == 0xCBF43926u);
}

TEST_CASE("versions never go back when the index is lost: deleted, emptied or with a damaged header") {
  for (const std::string how : {"deleted", "emptied", "damaged header"}) {
    CAPTURE(how);
    TempDir t;
    uint64_t v = 0;
    {
      Store s(t.path);
      for (int i = 0; i < 3; ++i) {
        Result r = s.save(task("t1", i, "working", std::to_string(i)));
        REQUIRE(r.rc == TNX_OK);
        v = r.version;
      }
    }
    REQUIRE(v == 3);
    if (how == "deleted") fs::remove(t / ".tnx-index");
    if (how == "emptied") fs::resize_file(t / ".tnx-index", 0);
    if (how == "damaged header") {
      std::string b = slurp(t / ".tnx-index");
      b[6] = static_cast<char>(b[6] ^ 0x55);
      write_file(t / ".tnx-index", b);
    }
    {
      Store ro(t.path, TNX_OPEN_READ_ONLY);  // rebuilt in memory only: above what was handed out, too
      CHECK(ro.get("t1").rec.version > v);
    }
    Store s(t.path);
    const uint64_t now = s.get("t1").rec.version;
    CHECK(now > v);
    // A client holding a version from before the loss is refused, whatever it held.
    for (uint64_t stale = 1; stale <= v; ++stale) CHECK(s.save(task("t1", 9, "completed", "stale"), stale).rc == TNX_ECONFLICT);
    CHECK(s.get("t1").rec.json == task("t1", 2, "working", "2").json);
    Result r = s.save(task("t1", 9, "completed", "fresh"), now);
    CHECK(r.rc == TNX_OK);
    CHECK(r.version == now + 1);
  }
  // A directory no toolnexus store opened (the seed's: no .tnx-lock) starts at 1.
  TempDir seed;
  write_file(seed / "s1.json", task("s1", 1).json);
  Store s(seed.path);
  CHECK(s.get("s1").rec.version == 1);
}

TEST_CASE("an index of large entries or of tombstones is not rewritten on every save") {
  TempDir t;
  Store s(t.path);
  const std::string ctx(1 << 20, 'x');  // 1 MiB contextIds: an index past 8 MiB of live entries
  for (int i = 0; i < 10; ++i) REQUIRE(s.save(task("big" + std::to_string(i), i, "working", "", ctx)).rc == TNX_OK);
  struct stat st {};
  REQUIRE(::stat((t / ".tnx-index").c_str(), &st) == 0);
  REQUIRE(st.st_size > (8 << 20));
  const ino_t ino = st.st_ino;
  for (int i = 0; i < 20; ++i) REQUIRE(s.save(task("small" + std::to_string(i), 100 + i)).rc == TNX_OK);
  REQUIRE(::stat((t / ".tnx-index").c_str(), &st) == 0);
  CHECK(st.st_ino == ino);  // the same file, appended to: no rewrite
  CHECK(s.list_all().size() == 30);
}

TEST_CASE("a symlink as .tnx-index or .tnx-index.new never makes the store write elsewhere") {
  TempDir t, outside;
  const std::string victim = outside / "victim";
  write_file(victim, "precious\n");
  {
    Store s(t.path);
    REQUIRE(s.save(task("a", 1)).rc == TNX_OK);
  }
  // .tnx-index.new (the file a rewrite of the index is written to).
  fs::remove(t / ".tnx-index");
  fs::create_symlink(victim, t / ".tnx-index.new");
  {
    Store s(t.path);  // rebuilds the index and writes it anew
    CHECK(s.get("a").rc == TNX_OK);
  }
  CHECK(slurp(victim) == "precious\n");
  CHECK(fs::is_regular_file(fs::symlink_status(t / ".tnx-index")));
  // .tnx-index itself: refused at open, naming it, and nothing written.
  fs::remove(t / ".tnx-index");
  fs::create_symlink(victim, t / ".tnx-index");
  for (const uint32_t flags : {0u, uint32_t(TNX_OPEN_READ_ONLY)}) {
    tnx_store *h = nullptr;
    Result r = Store::open_raw(t.path, &h, flags);
    CHECK(r.rc == TNX_EIO);
    CHECK_MESSAGE(r.err.find(".tnx-index' is a symbolic link") != std::string::npos, r.err);
    if (h != nullptr) plugin()->vtable->close(h, nullptr, 0);
  }
  CHECK(slurp(victim) == "precious\n");
}

TEST_CASE("two open stores on one directory, each saved to and read by many threads at once: both list every Task") {
  // A save's own index record was applied without reading it back; a read
  // on another thread of the same store (its catch-up) could read it in
  // between, and it was applied twice: the store's index offset ran past
  // the file's end and it missed the other store's records (a fresh-user
  // pass: two servers, 574 task files, 72 listed).
  TempDir t;
  Store a(t.path);
  Store b(t.path);
  constexpr int kWriters = 4, kEach = 120;
  std::atomic<bool> writing{true};
  std::atomic<int> failed{0};
  std::vector<std::thread> writers, readers;
  for (int w = 0; w < kWriters; ++w)
    for (Store *s : {&a, &b})
      writers.emplace_back([&, w, s] {
        const std::string prefix = (s == &a ? "a" : "b") + std::to_string(w) + "-";
        for (int i = 0; i < kEach; ++i)
          if (s->save(task(prefix + std::to_string(i), i, "completed")).rc != TNX_OK) ++failed;
      });
  for (Store *s : {&a, &b})
    for (int r = 0; r < 2; ++r)
      readers.emplace_back([&, s] {
        while (writing.load()) (void)s->get("a0-0");  // each get catches up with the index first
      });
  for (auto &th : writers) th.join();
  writing = false;
  for (auto &th : readers) th.join();
  REQUIRE(failed.load() == 0);
  const size_t total = size_t{2} * kWriters * kEach;
  for (Store *s : {&a, &b}) {
    std::vector<Rec> all = s->list_all(500);
    CHECK(all.size() == total);
    size_t first_versions = 0;
    for (const Rec &r : all) first_versions += r.version == 1;
    CHECK(first_versions == total);
  }
  Store fresh(t.path, TNX_OPEN_READ_ONLY);
  CHECK(fresh.list_all(500).size() == total);
}

namespace {

/// What a change feed reported (ABI 1.4), for the test thread to wait on.
struct FeedEar {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::tuple<uint32_t, std::string, uint64_t>> heard;  // kind, id, version
  static void sink(void *ctx, const tnx_change *c) {
    auto *e = static_cast<FeedEar *>(ctx);
    std::lock_guard<std::mutex> lk(e->mu);
    e->heard.emplace_back(c->kind, std::string(c->id.data != nullptr ? c->id.data : "", c->id.len), c->version);
    e->cv.notify_all();
  }
  /// Waits (a liveness bound of 10 s, not a speed goal) for kind/id/version
  /// (version 0: any; a gap matches any id).
  bool wait(uint32_t kind, const std::string &id, uint64_t version = 0) {
    std::unique_lock<std::mutex> lk(mu);
    return cv.wait_for(lk, std::chrono::seconds(10), [&] {
      for (auto &[k, i, v] : heard)
        if (k == kind && (kind == TNX_CHANGE_GAP || i == id) && (version == 0 || v == version)) return true;
      return false;
    });
  }
};

}  // namespace

TEST_CASE("change feed: another open store's saves and deletes are heard from the index; a compaction is a gap") {
  TempDir t;
  Store a(t.path);
  Store b(t.path);  // another open store: like another process
  FeedEar ear;
  char err[512] = "";
  REQUIRE(plugin()->vtable->watch(a.raw(), &FeedEar::sink, &ear, err, sizeof err) == TNX_OK);
  CHECK(plugin()->vtable->watch(a.raw(), &FeedEar::sink, &ear, err, sizeof err) == TNX_EINVAL);

  Result own = a.save(task("mine", 1));
  REQUIRE(own.rc == TNX_OK);
  CHECK(ear.wait(TNX_CHANGE_SAVED, "mine", own.version));
  Result other = b.save(task("theirs", 2));
  REQUIRE(other.rc == TNX_OK);
  CHECK(ear.wait(TNX_CHANGE_SAVED, "theirs", other.version));  // found by the feed's own look at the index
  REQUIRE(b.del("theirs").rc == TNX_OK);
  CHECK(ear.wait(TNX_CHANGE_DELETED, "theirs", other.version));

  // b grows the index past its rewrite size: a follows the new file and says
  // it may have missed changes.
  const std::string ctx(16 * 1024, 'c');
  const fs::path index = t / ".tnx-index";
  uintmax_t size = fs::file_size(index);
  bool rewritten = false;
  for (int round = 0; round < 1000 && !rewritten; ++round) {
    REQUIRE(b.save(task("big" + std::to_string(round % 5), round, "working", "", ctx)).rc == TNX_OK);
    const uintmax_t now = fs::file_size(index);
    rewritten = now < size;
    size = now;
  }
  REQUIRE(rewritten);
  CHECK(ear.wait(TNX_CHANGE_GAP, ""));
  Result after = b.save(task("after", 3));
  REQUIRE(after.rc == TNX_OK);
  CHECK(ear.wait(TNX_CHANGE_SAVED, "after", after.version));

  REQUIRE(plugin()->vtable->unwatch(a.raw(), err, sizeof err) == TNX_OK);
  CHECK(plugin()->vtable->unwatch(a.raw(), err, sizeof err) == TNX_EINVAL);
  size_t before;
  {
    std::lock_guard<std::mutex> lk(ear.mu);
    before = ear.heard.size();
  }
  REQUIRE(b.save(task("unheard", 4)).rc == TNX_OK);
  REQUIRE(a.get("unheard").rc == TNX_OK);  // a catches up: nothing reported any more
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::lock_guard<std::mutex> lk(ear.mu);
  CHECK(ear.heard.size() == before);
}

TEST_CASE("change feed: a read-only open has none") {
  TempDir t;
  { Store w(t.path); }
  uint64_t caps = plugin()->capabilities;
  tnx_store *s = nullptr;
  const std::string loc = t.path, sel = "file:" + t.path;
  tnx_open_args a{};
  a.header = tnx_header(sizeof a);
  a.scheme = S("file");
  a.location = S(loc);
  a.selector = S(sel);
  a.flags = TNX_OPEN_READ_ONLY;
  a.capabilities = &caps;
  char err[512] = "";
  REQUIRE(plugin()->open(&a, &s, err, sizeof err) == TNX_OK);
  CHECK((caps & TNX_CAP_CHANGE_FEED) == 0);
  FeedEar ear;
  CHECK(plugin()->vtable->watch(s, &FeedEar::sink, &ear, err, sizeof err) == TNX_EUNSUPPORTED);
  CHECK(plugin()->vtable->close(s, err, sizeof err) == TNX_OK);
}

TEST_CASE("due index: due times live in the index records, survive a compaction and a reopen, and a rebuild drops them") {
  TempDir t;
  const int64_t due0 = kJan1 + 3'600'000'000;
  auto due_ids = [](Store &s, int64_t before) {
    tnx_list_query q = Store::query();
    q.filter_flags = TNX_FILTER_DUE_BEFORE;
    q.due_before_us = before;
    std::vector<std::string> ids;
    for (const Rec &r : s.list_all(2, q)) ids.push_back(r.id + "@" + std::to_string(r.due_us - due0));
    return ids;
  };
  {
    Store s(t.path);
    for (int i = 0; i < 5; ++i) {
      Task x = task("d" + std::to_string(i), i);
      if (i != 2) x.due_us = due0 + i;
      REQUIRE(s.save(x).rc == TNX_OK);
    }
    CHECK(due_ids(s, due0 + 4) == std::vector<std::string>{"d0@0", "d1@1", "d3@3"});
    CHECK(s.get("d1").rec.due_us == due0 + 1);
    CHECK(s.get("d2").rec.due_us == TNX_TIME_NONE);
    // Grow the index past its rewrite size: the compacted file keeps them.
    const std::string big(16 * 1024, 'b');  // a contextId: index records grow
    const fs::path index = t / ".tnx-index";
    uintmax_t size = fs::file_size(index);
    bool rewritten = false;
    for (int round = 0; round < 1000 && !rewritten; ++round) {
      REQUIRE(s.save(task("big" + std::to_string(round % 5), round, "completed", "", big)).rc == TNX_OK);
      const uintmax_t now = fs::file_size(index);
      rewritten = now < size;
      size = now;
    }
    REQUIRE(rewritten);
    CHECK(due_ids(s, due0 + 100) == std::vector<std::string>{"d0@0", "d1@1", "d3@3", "d4@4"});
  }
  {
    Store again(t.path);  // read from the compacted index (and the records after it)
    CHECK(due_ids(again, due0 + 100) == std::vector<std::string>{"d0@0", "d1@1", "d3@3", "d4@4"});
    Task moved = task("d0", 0);
    moved.due_us = due0 + 50;
    REQUIRE(again.save(moved).rc == TNX_OK);
    REQUIRE(again.del("d3").rc == TNX_OK);
    CHECK(due_ids(again, due0 + 100) == std::vector<std::string>{"d1@1", "d4@4", "d0@50"});
  }
  // An index deleted (or untrusted) is rebuilt from the task files alone:
  // they hold no due times (the server's full sweep at start finds what is due).
  fs::remove(t / ".tnx-index");
  Store rebuilt(t.path);
  CHECK(due_ids(rebuilt, due0 + 100).empty());
  CHECK(rebuilt.get("d1").rec.due_us == TNX_TIME_NONE);
}

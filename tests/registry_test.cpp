// The plugin registry: discovery order, ABI checks with purpose-built bad
// plugins (tests/fixtures), scheme mapping, and resolve_store's selector
// table and error messages.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "toolnexus/registry.hpp"

#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <filesystem>
#include <functional>
#include <memory>
#include <sys/stat.h>
#include <unistd.h>
#include <string>

namespace fs = std::filesystem;
using namespace toolnexus;

namespace {
const fs::path kFixtures = TOOLNEXUS_TEST_FIXTURE_DIR;
const fs::path kPlugins = TOOLNEXUS_TEST_PLUGIN_DIR;

// A registry that searches exactly the given directories.
std::unique_ptr<PluginRegistry> isolated(std::initializer_list<fs::path> dirs) {
  auto r = std::make_unique<PluginRegistry>();
  r->use_environment(false);
  r->use_default_directory(false);
  for (const auto &d : dirs) r->add_directory(d);
  r->load();
  return r;
}

std::string failure_for(const PluginRegistry &r, const std::string &needle) {
  for (const auto &f : r.failures())
    if (f.path.find(needle) != std::string::npos) return f.reason;
  return "";
}

bool has_scheme(const PluginRegistry &r, const std::string &s) {
  for (const auto &x : r.schemes())
    if (x == s) return true;
  return false;
}

std::string exception_text(const std::function<void()> &f) {
  try {
    f();
  } catch (const std::exception &e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("a sound plugin loads and serves its scheme") {
  auto r = isolated({kFixtures / "good"});
  CHECK(r->failures().empty());
  REQUIRE(has_scheme(*r, "fixture"));
  auto plugins = r->plugins();
  auto it = std::find_if(plugins.begin(), plugins.end(), [](auto &p) { return p.name == "fixture"; });
  REQUIRE(it != plugins.end());
  CHECK(it->version == "0.0.1");
  CHECK(it->abi_major == 1);
  CHECK(it->abi_minor == TNX_ABI_MINOR);
  CHECK(it->location_syntax == "fixture:<anything>");
  CHECK(it->path == fs::canonical(kFixtures / "good" / "libfixture_good.so").string());
  CHECK(capability_names(it->capabilities) == "thread-safe");
  auto store = resolve_store("fixture:x", *r);
  CHECK(store->info().plugin_name == "fixture");
  CHECK_FALSE(store->get("anything").has_value());
}

TEST_CASE("a plugin built against ABI 1.0 (smaller descriptor) still loads") {
  auto r = isolated({kFixtures / "v1_0"});
  CHECK(r->failures().empty());
  REQUIRE(has_scheme(*r, "oldabi"));
  for (const auto &p : r->plugins()) {
    if (p.name != "fixture-v1.0") continue;
    CHECK(p.abi_minor == 0);
    CHECK(p.location_syntax.empty());  // the 1.1 field was not read
  }
  auto store = resolve_store("oldabi:x", *r);
  CHECK(store->list(ListQuery{}).records.empty());
  // Its vtable has no count (ABI 1.3): the host counts by listing.
  CHECK(store->count(ListQuery{}) == 0);
  // No save_batch either: the host says so, and the caller saves one by one.
  Task t = Task::parse(R"({"id":"b","contextId":"c","status":{"state":"working"}})");
  BatchItem item;
  item.task = &t;
  try {
    store->save_batch({item});
    FAIL("save_batch on a store without batches did not throw");
  } catch (const StoreError &e) {
    CHECK(e.code() == Status::unsupported);
  }
}

TEST_CASE("ABI 1.3 count: the host asks a plugin that has one") {
  auto r = isolated({kFixtures / "good"});
  auto store = resolve_store("fixture:x", *r);
  CHECK(store->count(ListQuery{}) == 7);  // the fixture's count, not the empty list
}

TEST_CASE("ABI 1.2 open: read-only flag reaches the plugin, writes are refused by the host") {
  auto r = isolated({kFixtures / "good", kFixtures / "v1_0"});
  OpenOptions ro;
  ro.read_only = true;
  // The fixture fails "expect-ro" unless the host passed TNX_OPEN_READ_ONLY.
  CHECK_THROWS_AS(resolve_store("fixture:expect-ro", *r), std::invalid_argument);
  auto s = resolve_store("fixture:expect-ro", ro, *r);
  CHECK(s->info().read_only);
  CHECK_FALSE(resolve_store("fixture:x", *r)->info().read_only);
  auto t = Task::parse(R"({"id":"t1"})");
  try {
    s->save(t);
    FAIL("save through a read-only store must throw");
  } catch (const StoreError &e) {
    CHECK(e.code() == Status::unsupported);
    // The host's refusal (the fixture's own save says "fixture store is read-only").
    CHECK_MESSAGE(std::string(e.what()).find("'fixture:expect-ro' was opened read-only") != std::string::npos,
                  e.what());
  }
  CHECK_THROWS_AS(s->remove("t1"), StoreError);

  SUBCASE("a 1.0 plugin never sees the flag; the host still refuses writes") {
    auto old = resolve_store("oldabi:x", ro, *r);
    CHECK(old->info().read_only);
    try {
      old->remove("t1");
      FAIL("remove through a read-only store must throw");
    } catch (const StoreError &e) {
      CHECK(e.code() == Status::unsupported);
      CHECK(std::string(e.what()).find("was opened read-only") != std::string::npos);
    }
  }
}

TEST_CASE("ABI 1.2 open: per-store capabilities may narrow, never widen") {
  auto r = isolated({kFixtures / "good", kFixtures / "wide_caps"});
  CHECK(resolve_store("fixture:x", *r)->info().capabilities == TNX_CAP_THREAD_SAFE);
  CHECK(resolve_store("fixture:narrow", *r)->info().capabilities == 0);
  // wide_caps serves "fixture" too; it loads after good, so it is refused
  // for the scheme. Load it alone to open from it.
  auto w = isolated({kFixtures / "wide_caps"});
  try {
    resolve_store("fixture:x", *w);
    FAIL("a store wider than its descriptor must be refused");
  } catch (const StoreError &e) {
    CHECK(e.code() == Status::internal);
    const std::string m = e.what();
    CHECK_MESSAGE(m.find("broke the ABI") != std::string::npos, m);
    CHECK_MESSAGE(m.find("durable") != std::string::npos, m);
    CHECK_MESSAGE(m.find("libfixture_wide_caps.so") != std::string::npos, m);
  }
}

TEST_CASE("bad plugins are refused with their path and reason") {
  struct Case {
    const char *dir;
    const char *file;
    const char *reason_part;
  } cases[] = {
      {"wrong_major", "libfixture_wrong_major.so", "built for ABI 2.0 but this host speaks ABI 1."},
      {"null", "libfixture_null.so", "returned no descriptor"},
      {"bad_scheme", "libfixture_bad_scheme.so", "invalid scheme 'Bad:Scheme'"},
      {"no_entry", "libfixture_no_entry.so", "no exported function 'toolnexus_plugin_entry'"},
      {"small_vtable", "libfixture_small_vtable.so", "vtable is 16 bytes"},
      {"feed_no_watch", "libfixture_feed_no_watch.so",
       "claims the change feed (TNX_CAP_CHANGE_FEED) but its vtable has no watch and unwatch (ABI 1.4)"},
      {"not_a_library", "libbogus.so", "not a loadable shared library: "},
      {"not_a_library", "libbogus.so", "libbogus.so: file too short"},  // dlerror(), not Boost's errno
  };
  for (const auto &c : cases) {
    CAPTURE(c.dir);
    auto r = isolated({kFixtures / c.dir});
    std::string why = failure_for(*r, c.file);
    CHECK(why.find(c.reason_part) != std::string::npos);
    auto f = r->failures();
    REQUIRE(f.size() == 1);
    CHECK(f[0].path == fs::canonical(kFixtures / c.dir / c.file).string());
    CHECK_FALSE(has_scheme(*r, "fixture"));
  }
}

TEST_CASE("one bad plugin does not stop the others") {
  auto r = isolated({kFixtures / "wrong_major", kFixtures / "not_a_library", kFixtures / "good",
                     kFixtures / "v1_0"});
  CHECK(r->failures().size() == 2);
  CHECK(has_scheme(*r, "fixture"));
  CHECK(has_scheme(*r, "oldabi"));
}

TEST_CASE("a second plugin claiming a taken scheme is refused, the first keeps it") {
  auto r = isolated({kPlugins, kFixtures / "dup_scheme"});
  std::string why = failure_for(*r, "libfixture_dup_scheme.so");
  CHECK(why.find("scheme 'memory' is already served by") != std::string::npos);
  CHECK(why.find("libtnx_memory.so") != std::string::npos);
  auto s = resolve_store("memory", *r);
  CHECK(s->info().plugin_name == "toolnexus-memory");
  CHECK(s->info().plugin_path.find("libtnx_memory.so") != std::string::npos);
}

TEST_CASE("search order: environment first, then added directories, then the default") {
  ::setenv(kPluginPathEnv, (kFixtures / "good").c_str(), 1);
  PluginRegistry r;
  r.use_default_directory(false);
  r.add_directory(kFixtures / "v1_0");
  auto path = r.search_path();
  REQUIRE(path.size() == 2);
  CHECK(path[0] == kFixtures / "good");
  CHECK(path[1] == kFixtures / "v1_0");
  // env with several entries, empty ones ignored
  ::setenv(kPluginPathEnv, (":" + (kFixtures / "good").string() + "::" + (kFixtures / "null").string()).c_str(), 1);
  CHECK(r.search_path().size() == 3);
  ::unsetenv(kPluginPathEnv);
  CHECK(r.search_path().size() == 1);
  PluginRegistry d;
  d.use_environment(false);
  auto defaults = PluginRegistry::default_directories();
  REQUIRE(!defaults.empty());  // the build tree's lib/toolnexus/plugins next to bin/
  CHECK(defaults[0] == fs::canonical(kPlugins));
}

TEST_CASE("a missing plugin directory is reported, not fatal") {
  auto r = isolated({"/nonexistent/toolnexus-plugins", kFixtures / "good"});
  CHECK(failure_for(*r, "/nonexistent/toolnexus-plugins").find("does not exist") != std::string::npos);
  CHECK(has_scheme(*r, "fixture"));
}

TEST_CASE("resolve_store: the seed's selector table") {
  auto r = isolated({kPlugins});
  SUBCASE("nothing and \"memory\" give a new memory store each time") {
    auto a = resolve_store("", *r);
    auto b = resolve_store("memory", *r);
    CHECK(a->info().scheme == "memory");
    CHECK(b->info().scheme == "memory");
    CHECK(a != b);
    auto t = Task::parse(R"({"id":"x"})");
    a->save(t);
    CHECK_FALSE(b->get("x").has_value());
  }
  SUBCASE("a store object comes back as the very same object") {
    auto s = resolve_store("memory", *r);
    CHECK(resolve_store(s) == s);
    CHECK(resolve_store(std::shared_ptr<TaskStore>()) != nullptr);
  }
  SUBCASE("any other string is std::invalid_argument quoting it and listing schemes") {
    std::string msg = exception_text([&] { resolve_store("redis:somewhere", *r); });
    CHECK(msg.find("'redis:somewhere'") != std::string::npos);
    CHECK(msg.find("available schemes: ") != std::string::npos);
    CHECK(msg.find("memory") != std::string::npos);
    CHECK_THROWS_AS(resolve_store("redis:somewhere", *r), std::invalid_argument);
    CHECK_THROWS_AS(resolve_store("nonsense", *r), std::invalid_argument);
    CHECK_THROWS_AS(resolve_store("MEMORY", *r), std::invalid_argument);
    CHECK_THROWS_AS(resolve_store(":x", *r), std::invalid_argument);
    CHECK_THROWS_AS(resolve_store("memory:extra", *r), std::invalid_argument);
  }
  SUBCASE("a password in a selector never appears in the message") {
    std::string msg = exception_text([&] { resolve_store("postgresql://bob:s3cret@db/x", *r); });
    CHECK(msg.find("s3cret") == std::string::npos);
    CHECK(msg.find("bob:***@db") != std::string::npos);
  }
}

TEST_CASE("without any plugin directory, memory is still served (embedded)") {
  auto r = isolated({});
  auto s = resolve_store("memory", *r);
  CHECK(s->info().plugin_path == "<embedded in libtoolnexus>");
  CHECK(resolve_store("", *r)->info().scheme == "memory");
}

TEST_CASE("built-in plugins export the entry function and nothing else") {
  for (const auto &e : fs::directory_iterator(kPlugins)) {
    if (e.path().extension() != ".so") continue;
    CAPTURE(e.path().string());
    std::string cmd = "nm -D --defined-only '" + e.path().string() + "'";
    FILE *p = ::popen(cmd.c_str(), "r");
    REQUIRE(p != nullptr);
    std::string out;
    char buf[512];
    while (std::fgets(buf, sizeof buf, p) != nullptr) out += buf;
    CHECK(::pclose(p) == 0);
    int symbols = 0;
    size_t pos = 0;
    while ((pos = out.find('\n', pos)) != std::string::npos) ++symbols, ++pos;
    CHECK(out.find(" T toolnexus_plugin_entry") != std::string::npos);
    CHECK(symbols == 1);
  }
}

namespace {
fs::path fresh_dir() {
  std::string pattern = (fs::temp_directory_path() / "tnx-guard-XXXXXX").string();
  REQUIRE(::mkdtemp(pattern.data()) != nullptr);
  return pattern;
}
const fs::path kGood = kFixtures / "good" / "libfixture_good.so";
}  // namespace

TEST_CASE("guard rails: symlinks must stay inside the plugin directory") {
  fs::path dir = fresh_dir();
  fs::create_symlink(kGood, dir / "libescape.so");
  auto r = isolated({dir});
  CHECK(failure_for(*r, "libescape.so").find("symlink leads outside its plugin directory") != std::string::npos);
  CHECK_FALSE(has_scheme(*r, "fixture"));

  fs::path dir2 = fresh_dir();
  fs::create_directory(dir2 / "real");
  fs::copy_file(kGood, dir2 / "real" / "libfixture.so");
  fs::create_symlink("real/libfixture.so", dir2 / "liblink.so");
  auto r2 = isolated({dir2});
  CHECK(r2->failures().empty());
  CHECK(has_scheme(*r2, "fixture"));  // through the link; the file in real/ itself is not scanned
  auto plugins = r2->plugins();
  CHECK(std::count_if(plugins.begin(), plugins.end(), [](auto &p) { return p.name == "fixture"; }) == 1);

  // Into a world-writable subdirectory: anyone could replace the library.
  fs::path dir3 = fresh_dir();
  fs::create_directories(dir3 / "open" / "deep");
  fs::copy_file(kGood, dir3 / "open" / "deep" / "libfixture.so");
  fs::permissions(dir3 / "open", fs::perms::others_write, fs::perm_options::add);
  fs::create_symlink("open/deep/libfixture.so", dir3 / "libvia.so");
  auto r3 = isolated({dir3});
  const std::string why = failure_for(*r3, "libvia.so");
  CHECK_MESSAGE(why.find("symlink leads to") != std::string::npos, why);
  CHECK_MESSAGE(why.find((fs::canonical(dir3) / "open").string() + " is writable by others") != std::string::npos, why);
  CHECK_FALSE(has_scheme(*r3, "fixture"));
  PluginRegistry lax;  // --allow-insecure-plugins turns the permission checks off
  lax.use_environment(false);
  lax.use_default_directory(false);
  lax.allow_insecure(true);
  lax.add_directory(dir3);
  lax.load();
  CHECK(has_scheme(lax, "fixture"));
  fs::permissions(dir3 / "open", fs::perms::others_write, fs::perm_options::remove);
  fs::remove_all(dir);
  fs::remove_all(dir2);
  fs::remove_all(dir3);
}

TEST_CASE("guard rails: writable by group or others, or a foreign owner, is refused unless allowed") {
  fs::path dir = fresh_dir();
  fs::copy_file(kGood, dir / "libfixture.so");
  fs::permissions(dir / "libfixture.so", fs::perms::group_write, fs::perm_options::add);
  auto r = isolated({dir});
  CHECK(failure_for(*r, "libfixture.so").find("is writable by its group; refused (use --allow-insecure-plugins") !=
        std::string::npos);
  CHECK_FALSE(has_scheme(*r, "fixture"));

  PluginRegistry lax;
  lax.use_environment(false);
  lax.use_default_directory(false);
  lax.allow_insecure(true);
  lax.add_directory(dir);
  lax.load();
  CHECK(has_scheme(lax, "fixture"));

  fs::permissions(dir / "libfixture.so", fs::perms::group_write, fs::perm_options::remove);
  fs::permissions(dir, fs::perms::others_write, fs::perm_options::add);
  auto r2 = isolated({dir});
  CHECK(failure_for(*r2, dir.filename().string()).find("plugin directory") != std::string::npos);
  CHECK(failure_for(*r2, dir.filename().string()).find("writable by others") != std::string::npos);
  CHECK_FALSE(has_scheme(*r2, "fixture"));
  fs::permissions(dir, fs::perms::others_write, fs::perm_options::remove);

  if (::geteuid() == 0) {  // only root can give a file away; CI runs as root
    REQUIRE(::chown((dir / "libfixture.so").c_str(), 65534, 65534) == 0);
    auto r3 = isolated({dir});
    CHECK(failure_for(*r3, "libfixture.so").find("owned by uid 65534, neither root nor the current user") !=
          std::string::npos);
  } else {
    MESSAGE("not root: the foreign-owner case needs chown and is checked in CI");
  }
  fs::remove_all(dir);
}

TEST_CASE("guard rails: only *.so files directly inside are considered") {
  fs::path dir = fresh_dir();
  fs::copy_file(kGood, dir / "libfixture.so.1");
  fs::create_directory(dir / "sub");
  fs::copy_file(kGood, dir / "sub" / "libfixture.so");
  fs::create_directory(dir / "dir.so");
  auto r = isolated({dir});
  CHECK(r->failures().empty());
  CHECK_FALSE(has_scheme(*r, "fixture"));
  fs::remove_all(dir);
}

TEST_CASE("a FIFO, socket or other special file named *.so is reported with its path and type, never opened") {
  fs::path dir = fresh_dir();
  REQUIRE(::mkfifo((dir / "libfifo.so").c_str(), 0644) == 0);
  // A symlink (inside the directory) to a FIFO is judged by what it leads to.
  REQUIRE(::mkfifo((dir / "target.fifo").c_str(), 0644) == 0);
  fs::create_symlink(dir / "target.fifo", dir / "liblink.so");
  fs::copy_file(kGood, dir / "libz_good.so");
  // No writer ever opens these FIFOs: an open(2) for reading would hang here.
  auto r = isolated({dir});
  CHECK(failure_for(*r, "libfifo.so") ==
        "not a regular file but a FIFO (named pipe); only regular *.so files are loaded, this one is skipped");
  CHECK(failure_for(*r, "liblink.so") ==
        "not a regular file but a FIFO (named pipe); only regular *.so files are loaded, this one is skipped");
  CHECK(r->failures().size() == 2);
  CHECK(has_scheme(*r, "fixture"));  // the others still load
  // Reported once, not again on every later search.
  r->load();
  CHECK(r->failures().size() == 2);
  // Loaded by name: the same answer.
  auto named = isolated({});
  std::string why;
  CHECK_FALSE(named->load_file(dir / "libfifo.so", &why));
  CHECK(why == "not a regular file but a FIFO (named pipe); only regular *.so files are loaded, this one is skipped");
  fs::remove_all(dir);
}

TEST_CASE("open() loads plugins in search order only until one serves the scheme; the answer is a full load's") {
  auto lazy = [](std::initializer_list<fs::path> dirs) {
    auto r = std::make_unique<PluginRegistry>();
    r->use_environment(false);
    r->use_default_directory(false);
    for (const auto &d : dirs) r->add_directory(d);
    return r;  // nothing loaded yet
  };
  // "fixture" is served from the first directory: the refused file of the
  // second is not even opened.
  auto r = lazy({kFixtures / "good", kFixtures / "wrong_major"});
  auto s = resolve_store("fixture:x", *r);
  CHECK(s->info().plugin_name == "fixture");
  CHECK(r->failures().empty());
  CHECK(r->plugins().size() == 1);
  // load() then finishes the scan: the refusal is reported as before.
  r->load();
  REQUIRE(r->failures().size() == 1);
  CHECK(r->failures()[0].path.find("libfixture_wrong_major.so") != std::string::npos);
  // A scheme nobody serves scans everything before saying so, naming the
  // schemes of every plugin and keeping every refusal.
  auto u = lazy({kFixtures / "wrong_major", kFixtures / "good", kFixtures / "v1_0"});
  const std::string msg = exception_text([&] { resolve_store("nosuch:x", *u); });
  CHECK(msg.find("no plugin serves 'nosuch'") != std::string::npos);
  CHECK(msg.find("fixture") != std::string::npos);
  CHECK(msg.find("oldabi") != std::string::npos);
  CHECK(u->failures().size() == 1);
  // Two plugins claiming "memory": the first in search order serves it,
  // exactly as after a full load (the later one is not loaded at all).
  auto m = lazy({kPlugins, kFixtures / "dup_scheme"});
  auto ms = resolve_store("memory", *m);
  CHECK(ms->info().plugin_path.find("libtnx_memory.so") != std::string::npos);
  CHECK(failure_for(*m, "libfixture_dup_scheme.so").empty());
  m->load();
  CHECK(failure_for(*m, "libfixture_dup_scheme.so").find("scheme 'memory' is already served by") !=
        std::string::npos);
  CHECK(resolve_store("memory", *m)->info().plugin_path.find("libtnx_memory.so") != std::string::npos);
}

TEST_CASE("a plugin directory that cannot be searched is a failure marked as a directory; a bad file is not") {
  auto r = isolated({kFixtures / "no-such-directory", kFixtures / "wrong_major"});
  auto f = r->failures();
  REQUIRE(f.size() == 2);
  CHECK(f[0].path == (kFixtures / "no-such-directory").string());
  CHECK(f[0].directory);
  CHECK(f[0].reason.find("does not exist") != std::string::npos);
  CHECK(f[1].path.find("libfixture_wrong_major.so") != std::string::npos);
  CHECK_FALSE(f[1].directory);
}

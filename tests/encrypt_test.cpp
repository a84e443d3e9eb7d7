// The encrypt decorator (issue 23.2) over real stores: tampering with the
// stored bytes (a flipped byte, two records' ciphertexts swapped, a record
// rolled back to an old version) reads as corrupt naming the Task; a wrong
// or missing key fails at open naming the key id; nothing of a Task's
// messages or push credentials is readable in the files; and a decorator
// loaded by a host without services refuses cleanly.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "test_util.hpp"
#include "toolnexus/registry.hpp"
#include "toolnexus/task_store.h"

#include <sqlite3.h>

#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>

#include <dlfcn.h>
#include <sys/stat.h>

namespace fs = std::filesystem;
using namespace toolnexus;

namespace {

const char *kKeyA = "k1:000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
const char *kKeyB = "k1:ff0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
const char *kKey2 = "k2:2222222222222222222222222222222222222222222222222222222222222222";

const std::string kSecretText = "the launch code is swordfish-7731";
const std::string kPushToken = "PUSHTOKEN-8f3a-secret";
const std::string kPushCred = "CREDENTIAL-Bearer-61c2-secret";

Task task(const std::string &id, const std::string &state, int sec, const std::string &note = "") {
  return Task::parse(R"({"id":")" + id + R"(","contextId":"ctx-visible","note":")" + note + R"(","status":{"state":")" + state +
                     R"(","timestamp":")" + format_timestamp((1767225600LL + sec) * 1000000LL) +
                     R"("},"kind":"task","history":[{"role":"user","kind":"message","messageId":"m1","parts":[{"kind":"text","text":")" +
                     kSecretText + R"("}]}],"metadata":{"toolnexus/push":{"configs":[{"url":"https://hook.example/x","token":")" +
                     kPushToken + R"(","authentication":{"scheme":"Bearer","credentials":")" + kPushCred + R"("}}]}}})");
}

std::shared_ptr<TaskStore> open(const std::string &sel) { return resolve_store(sel); }

// Runs `sql` with the Task's stored JSON bound as ?1 and its id as ?2 (or
// just runs it) on the sqlite file `db`.
std::string sqlite_json(const fs::path &db, const std::string &id) {
  sqlite3 *h = nullptr;
  REQUIRE(sqlite3_open(db.c_str(), &h) == SQLITE_OK);
  sqlite3_stmt *s = nullptr;
  REQUIRE(sqlite3_prepare_v2(h, "SELECT task_json FROM tnx_tasks WHERE id = ?1", -1, &s, nullptr) == SQLITE_OK);
  sqlite3_bind_text(s, 1, id.data(), static_cast<int>(id.size()), SQLITE_TRANSIENT);
  REQUIRE(sqlite3_step(s) == SQLITE_ROW);
  std::string out(static_cast<const char *>(sqlite3_column_blob(s, 0)), static_cast<size_t>(sqlite3_column_bytes(s, 0)));
  sqlite3_finalize(s);
  sqlite3_close(h);
  return out;
}

void sqlite_set_json(const fs::path &db, const std::string &id, const std::string &json) {
  sqlite3 *h = nullptr;
  REQUIRE(sqlite3_open(db.c_str(), &h) == SQLITE_OK);
  sqlite3_stmt *s = nullptr;
  REQUIRE(sqlite3_prepare_v2(h, "UPDATE tnx_tasks SET task_json = ?1 WHERE id = ?2", -1, &s, nullptr) == SQLITE_OK);
  sqlite3_bind_text(s, 1, json.data(), static_cast<int>(json.size()), SQLITE_TRANSIENT);
  sqlite3_bind_text(s, 2, id.data(), static_cast<int>(id.size()), SQLITE_TRANSIENT);
  REQUIRE(sqlite3_step(s) == SQLITE_DONE);
  REQUIRE(sqlite3_changes(h) == 1);
  sqlite3_finalize(s);
  sqlite3_close(h);
}

// The StoreError a get of `id` throws (its message), or "" when it reads.
std::string get_error(TaskStore &s, const std::string &id, Status want) {
  try {
    (void)s.get(id);
  } catch (const StoreError &e) {
    CHECK(e.code() == want);
    return e.what();
  }
  return "";
}

// Everything in the files under `dir`, concatenated (what `strings` reads).
std::string all_bytes(const fs::path &dir) {
  std::string out;
  for (const auto &e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) out += tnx_test::slurp(e.path());
  return out;
}

}  // namespace

TEST_CASE("tampering with a sealed record reads as corrupt naming the Task") {
  setenv("TNX_ENC_TEST_KEY", kKeyA, 1);
  const fs::path dir = tnx_test::temp_dir("tnx-enc");
  const fs::path db = dir / "tasks.db";
  const std::string sel = "encrypt:env=TNX_ENC_TEST_KEY;sqlite:" + db.string();
  {
    auto s = open(sel);
    s->save(task("a", "working", 1));
    s->save(task("b", "working", 2));
    s->close();
  }
  const std::string a1 = sqlite_json(db, "a"), b1 = sqlite_json(db, "b");
  CHECK(a1.find("tnxSealed") != std::string::npos);

  SUBCASE("a flipped byte") {
    std::string bad = a1;
    const size_t at = bad.size() - 10;  // inside the ciphertext's base64
    bad[at] = bad[at] == 'A' ? 'B' : 'A';
    sqlite_set_json(db, "a", bad);
    auto s = open(sel);
    const std::string m = get_error(*s, "a", Status::corrupt);
    CHECK_MESSAGE(m.find("'a'") != std::string::npos, m);
    CHECK(s->get("b").has_value());
  }
  SUBCASE("two records' ciphertexts swapped") {
    sqlite_set_json(db, "a", b1);
    sqlite_set_json(db, "b", a1);
    auto s = open(sel);
    const std::string ma = get_error(*s, "a", Status::corrupt), mb = get_error(*s, "b", Status::corrupt);
    CHECK_MESSAGE(ma.find("'a'") != std::string::npos, ma);
    CHECK_MESSAGE(mb.find("'b'") != std::string::npos, mb);
  }
  SUBCASE("rolled back to an old version") {
    {
      // The same index fields (state, time, context): only the version
      // tells the old bytes from the new.
      auto s = open(sel);
      s->save(task("a", "working", 1, "second"));
      CHECK(s->get("a")->json.find("second") != std::string::npos);
    }
    sqlite_set_json(db, "a", a1);  // version 1's bytes under version 2
    auto s = open(sel);
    const std::string m = get_error(*s, "a", Status::corrupt);
    CHECK_MESSAGE(m.find("'a'") != std::string::npos, m);
    CHECK_MESSAGE(m.find("rolled back") != std::string::npos, m);
  }
  SUBCASE("bytes that are neither sealed nor JSON are said to be so (not 'stored unsealed')") {
    sqlite_set_json(db, "a", "garbage");
    auto s = open(sel);
    const std::string m = get_error(*s, "a", Status::corrupt);
    CHECK_MESSAGE(m.find("task 'a' is corrupt: its stored bytes are neither a sealed record nor a Task's JSON") !=
                      std::string::npos,
                  m);
  }
  SUBCASE("untouched, every Task reads back whole") {
    auto s = open(sel);
    auto r = s->get("a");
    REQUIRE(r.has_value());
    CHECK(r->json.find(kSecretText) != std::string::npos);
    CHECK(r->context_id == "ctx-visible");
  }
  fs::remove_all(dir);
}

TEST_CASE("a wrong or missing key fails at open naming the key id") {
  const fs::path dir = tnx_test::temp_dir("tnx-enc");
  const std::string inner = ";sqlite:" + (dir / "tasks.db").string();
  setenv("TNX_ENC_TEST_KEY", kKeyA, 1);
  open("encrypt:env=TNX_ENC_TEST_KEY" + inner)->save(task("a", "working", 1));
  auto open_error = [&](const std::string &keys) {
    setenv("TNX_ENC_TEST_KEY", keys.c_str(), 1);
    try {
      open("encrypt:env=TNX_ENC_TEST_KEY" + inner);
    } catch (const std::invalid_argument &e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const std::string wrong = open_error(kKeyB);
  CHECK_MESSAGE(wrong.find("wrong key for id 'k1'") != std::string::npos, wrong);
  CHECK(wrong.find("corrupt") == std::string::npos);
  const std::string missing = open_error(kKey2);
  CHECK_MESSAGE(missing.find("sealed with key 'k1'") != std::string::npos, missing);
  CHECK(missing.find("not found") == std::string::npos);
  // k1 kept beside a newer k2: opens, reads, and new writes use k2.
  CHECK(open_error(std::string(kKeyA) + "\n" + kKey2).empty());
  fs::remove_all(dir);
}

TEST_CASE("a key file readable by others is refused; one of mode 0600 is used") {
  const fs::path dir = tnx_test::temp_dir("tnx-enc");
  const fs::path key = dir / "key";
  tnx_test::spit(key, std::string("# test key\n") + kKeyA + "\n");
  ::chmod(key.c_str(), 0644);
  const std::string sel = "encrypt:key=" + key.string() + ";memory:";
  try {
    open(sel);
    FAIL("a 0644 key file must be refused");
  } catch (const std::invalid_argument &e) {
    const std::string m = e.what();
    CHECK_MESSAGE(m.find("mode 0644") != std::string::npos, m);
    CHECK_MESSAGE(m.find("chmod 600") != std::string::npos, m);
  }
  ::chmod(key.c_str(), 0600);
  auto s = open(sel);
  s->save(task("a", "working", 1));
  CHECK(s->get("a").has_value());
  fs::remove_all(dir);
}

TEST_CASE("no message text or push credential is readable at rest; the index fields are") {
  setenv("TNX_ENC_TEST_KEY", kKeyA, 1);
  for (const char *inner : {"sqlite:{dir}/tasks.db", "file:{dir}/tasks"}) {
    CAPTURE(inner);
    const fs::path dir = tnx_test::temp_dir("tnx-enc");
    std::string sel = std::string("encrypt:env=TNX_ENC_TEST_KEY;") + inner;
    sel.replace(sel.find("{dir}"), 5, dir.string());
    {
      auto s = open(sel);
      for (int i = 0; i < 20; ++i) s->save(task("t" + std::to_string(i), "working", i + 1));
      s->close();
    }
    const std::string bytes = all_bytes(dir);
    CHECK(bytes.find(kSecretText) == std::string::npos);
    CHECK(bytes.find("swordfish") == std::string::npos);
    CHECK(bytes.find(kPushToken) == std::string::npos);
    CHECK(bytes.find(kPushCred) == std::string::npos);
    CHECK(bytes.find("ctx-visible") != std::string::npos);  // an index field, documented as visible
    auto s = open(sel);
    CHECK(s->get("t3")->json.find(kPushCred) != std::string::npos);
    fs::remove_all(dir);
  }
}

TEST_CASE("a decorator loaded by a host without services refuses its open cleanly") {
  const std::string path = std::string(TOOLNEXUS_TEST_PLUGIN_DIR) + "/libtnx_encrypt.so";
  void *lib = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  REQUIRE(lib != nullptr);
  auto entry = reinterpret_cast<tnx_plugin_entry_fn>(::dlsym(lib, TNX_PLUGIN_ENTRY_NAME));
  const bool has_entry = entry != nullptr;
  REQUIRE(has_entry);
  const tnx_host_info host = {TNX_HEADER_INIT(tnx_host_info), "old-host", "0"};
  const tnx_plugin_descriptor *d = entry(&host);
  REQUIRE(d != nullptr);
  setenv("TNX_ENC_TEST_KEY", kKeyA, 1);
  const std::string scheme = "encrypt", location = "env=TNX_ENC_TEST_KEY;memory:";
  const std::string selector = scheme + ":" + location;
  tnx_open_args a{};
  a.header = tnx_header(offsetof(tnx_open_args, services));  // as a 1.5 host lays it out
  a.header.abi_minor = 5;
  a.scheme = tnx_str{scheme.data(), scheme.size()};
  a.location = tnx_str{location.data(), location.size()};
  a.selector = tnx_str{selector.data(), selector.size()};
  tnx_store *st = nullptr;
  char err[512] = {0};
  CHECK(d->open(&a, &st, err, sizeof err) == TNX_EUNSUPPORTED);
  CHECK(st == nullptr);
  CHECK_MESSAGE(std::string(err).find("needs a host of ABI 1.6") != std::string::npos, err);
  CHECK_MESSAGE(std::string(err).find("ABI 1.5") != std::string::npos, err);
  ::dlclose(lib);
}

TEST_CASE("selector errors name the decorator and what is wrong") {
  setenv("TNX_ENC_TEST_KEY", kKeyA, 1);
  auto error = [](const std::string &sel) {
    try {
      open(sel);
    } catch (const std::exception &e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(error("encrypt:env=TNX_ENC_TEST_KEY").find("no ';' before the inner store") != std::string::npos);
  CHECK(error("encrypt:env=TNX_ENC_TEST_KEY;").find("inner store selector after ';' is empty") != std::string::npos);
  CHECK(error("encrypt:env=TNX_ENC_TEST_KEY,color=red;memory:").find("unknown option 'color'") != std::string::npos);
  CHECK(error("encrypt:env=TNX_ENC_TEST_KEY;nosuch:x").find("no plugin serves 'nosuch'") != std::string::npos);
  CHECK(error("encrypt:env=TNX_NO_SUCH_VAR_23;memory:").find("'TNX_NO_SUCH_VAR_23' is not set") != std::string::npos);
  // Key text: what is wrong, said as it is (a '#' starts a comment anywhere).
  const std::string hex64(64, 'a');
  auto key_error = [&](const std::string &keys) {
    setenv("TNX_ENC_KEYS_23", keys.c_str(), 1);
    return error("encrypt:env=TNX_ENC_KEYS_23;memory:");
  };
  CHECK(key_error("k1:" + hex64 + "#the first key").empty());
  CHECK(key_error("k1:" + hex64 + " # the first key\nk2:" + std::string(64, 'b')).empty());
  CHECK(key_error("").find("'TNX_ENC_KEYS_23' is empty") != std::string::npos);
  CHECK(key_error(std::string(33, 'k') + ":" + hex64).find("a key id of 33 characters") != std::string::npos);
  CHECK(key_error("k1:" + hex64 + ":extra").find("found 70 characters, not all of them hex digits") !=
        std::string::npos);
  CHECK(key_error("k1:" + std::string(62, 'a')).find("must be 64 hex digits (32 bytes) after its ':', found 62") !=
        std::string::npos);
}

TEST_CASE("decorators nest, up to a limit, and keep only the capabilities of both layers") {
  setenv("TNX_ENC_TEST_KEY", kKeyA, 1);
  setenv("TNX_ENC_TEST_KEY2", kKey2, 1);
  auto twice = open("encrypt:env=TNX_ENC_TEST_KEY;encrypt:env=TNX_ENC_TEST_KEY2;memory:");
  twice->save(task("n1", "working", 1));
  auto r = twice->get("n1");
  REQUIRE(r.has_value());
  CHECK(r->json.find(kSecretText) != std::string::npos);
  // Over memory: not persistent, not durable, as memory; over sqlite: as sqlite.
  const uint64_t mem = open("memory:")->info().capabilities;
  CHECK(twice->info().capabilities == mem);
  CHECK((mem & TNX_CAP_PERSISTENT) == 0);
  const fs::path dir = tnx_test::temp_dir("tnx-enc");
  const std::string db = "sqlite:" + (dir / "t.db").string();
  CHECK(open("encrypt:env=TNX_ENC_TEST_KEY;" + db)->info().capabilities == open(db)->info().capabilities);
  fs::remove_all(dir);
  std::string deep = "memory:";
  for (int i = 0; i < 9; ++i) deep = "encrypt:env=K;" + deep;
  setenv("K", kKeyA, 1);
  try {
    open(deep);
    FAIL("9 nested decorators must be refused");
  } catch (const std::invalid_argument &e) {
    const std::string m = e.what();
    CHECK_MESSAGE(m.find("more than 8 decorators") != std::string::npos, m);
  }
}

// The `toolnexus plugins` and `toolnexus store` commands, driven through the
// real executable: output, exit codes, and a 10,000-Task copy from file to
// sqlite and back compared field by field.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "cli_run.hpp"
#include "test_util.hpp"
#include "toolnexus/registry.hpp"

#include <rapidjson/document.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <sys/wait.h>
#include <thread>

namespace fs = std::filesystem;
using namespace toolnexus;

namespace {
const std::string kBin = std::string(TOOLNEXUS_BIN_DIR) + "/toolnexus";

using tnx_test::Run;
using tnx_test::sh_quote;
using tnx_test::slurp;
using tnx_test::spit;

fs::path temp_dir() { return tnx_test::temp_dir("tnx-cli"); }

// Runs `toolnexus ARGS` with `input` on stdin; captures stdout and stderr.
Run run(const std::vector<std::string> &args, const std::string &input = "") {
  tnx_test::RunOptions o;
  o.input = input;
  return tnx_test::run_cli(args, o);
}

std::string task_json(const std::string &id, const std::string &ctx, const std::string &state, int sec) {
  return R"({"id":")" + id + R"(","contextId":")" + ctx + R"(","status":{"state":")" + state +
         R"(","timestamp":")" + format_timestamp((1767225600LL + sec) * 1000000LL) + R"("},"kind":"task"})";
}
}  // namespace

TEST_CASE("toolnexus plugins lists the built-in plugins, text and JSON") {
  Run r = run({"plugins"});
  CHECK(r.code == 0);
  for (const char *s : {"memory", "file", "sqlite", "libtnx_file.so", "compare-and-set", "directories searched:"})
    CHECK(r.out.find(s) != std::string::npos);
  r = run({"plugins", "--json"});
  REQUIRE(r.code == 0);
  rapidjson::Document d;
  d.Parse(r.out.c_str());
  REQUIRE(d.IsObject());
  REQUIRE(d["plugins"].IsArray());
  bool file_found = false;
  for (const auto &p : d["plugins"].GetArray())
    if (std::string(p["schemes"][0].GetString()) == "file") {
      file_found = true;
      CHECK(std::string(p["abi"].GetString()).rfind("1.", 0) == 0);
      CHECK(std::string(p["file"].GetString()).find("libtnx_file.so") != std::string::npos);
    }
  CHECK(file_found);
  CHECK(d["failures"].IsArray());
}

TEST_CASE("toolnexus plugins reports a refused file with its reason") {
  Run r = run({"plugins", "--plugin-dir", std::string(TOOLNEXUS_TEST_FIXTURE_DIR) + "/wrong_major"});
  CHECK(r.code == 0);
  CHECK(r.out.find("refused:") != std::string::npos);
  CHECK(r.out.find("libfixture_wrong_major.so: plugin was built for ABI 2.0") != std::string::npos);
  CHECK(run({"plugins", "--bogus"}).code == 2);
  // store commands say why, too, when the scheme is missing because its plugin was refused.
  r = run({"store", "list", "--plugin-dir", std::string(TOOLNEXUS_TEST_FIXTURE_DIR) + "/wrong_major", "fixture:x"});
  CHECK(r.code == 2);
  CHECK_MESSAGE(r.err.find("no plugin serves 'fixture'") != std::string::npos, r.err);
  CHECK_MESSAGE(r.err.find("libfixture_wrong_major.so was not loaded: plugin was built for ABI 2.0") !=
                    std::string::npos,
                r.err);
  CHECK(run({"plugins", "--help"}).out.find("usage: toolnexus plugins") != std::string::npos);
  // A refused directory is called a directory, not a plugin.
  const fs::path open_dir = temp_dir();
  fs::permissions(open_dir, fs::perms::all);
  r = run({"store", "list", "--plugin-dir", open_dir.string(), "nosuch:x"});
  CHECK(r.code == 2);
  CHECK_MESSAGE(r.err.find("plugin directory " + fs::canonical(open_dir).string() + " was not searched: ") !=
                    std::string::npos,
                r.err);
  fs::remove_all(open_dir);
  CHECK(run({"store", "--help"}).out.find("--allow-insecure-plugins") != std::string::npos);
}

TEST_CASE("store put, get, list, rm and their exit codes") {
  fs::path dir = temp_dir();
  const std::string sel = "file:" + (dir / "tasks").string();
  Run r = run({"store", "put", sel}, task_json("t1", "c1", "rejected", 10) + "\n");
  CHECK(r.code == 0);
  CHECK(r.out == "t1\n");
  spit(dir / "t2.json", task_json("t2", "c2", "completed", 20));
  r = run({"store", "put", sel, (dir / "t2.json").string()});
  CHECK(r.code == 0);
  CHECK(r.out == "t2\n");
  CHECK(run({"store", "put", sel, "-"}, task_json("t3", "c1", "input-required", 30)).code == 0);

  r = run({"store", "get", sel, "t2"});
  CHECK(r.code == 0);
  CHECK(r.out == task_json("t2", "c2", "completed", 20) + "\n");

  r = run({"store", "get", sel, "nope"});
  CHECK(r.code == 1);
  CHECK(r.err.find("no Task with id 'nope'") != std::string::npos);
  CHECK(r.out.empty());

  r = run({"store", "list", sel});
  CHECK(r.code == 0);
  CHECK(r.out == "t3\tinput-required\t2026-01-01T00:00:30.000000Z\tc1\n"
                 "t2\tcompleted\t2026-01-01T00:00:20.000000Z\tc2\n"
                 "t1\trejected\t2026-01-01T00:00:10.000000Z\tc1\n");
  CHECK(run({"store", "list", sel, "--context-id", "c1"}).out.find("t2") == std::string::npos);
  CHECK(run({"store", "list", sel, "--state", "completed"}).out ==
        "t2\tcompleted\t2026-01-01T00:00:20.000000Z\tc2\n");
  CHECK(run({"store", "list", sel, "--limit", "1"}).out == "t3\tinput-required\t2026-01-01T00:00:30.000000Z\tc1\n");
  r = run({"store", "list", sel, "--json", "--limit", "2"});
  CHECK(r.out == task_json("t3", "c1", "input-required", 30) + "\n" + task_json("t2", "c2", "completed", 20) + "\n");
  CHECK(run({"store", "list", sel, "--limit", "x"}).code == 2);
  CHECK(run({"store", "list", sel, "--limit", "-1"}).code == 2);
  CHECK(run({"store", "list", sel, "--limit", "0"}).code == 2);
  r = run({"store", "list", sel, "--state", "bogus"});
  CHECK(r.code == 2);
  CHECK(r.err.find("'bogus' is not a TaskState") != std::string::npos);

  CHECK(run({"store", "rm", sel, "t1"}).code == 0);
  CHECK(run({"store", "get", sel, "t1"}).code == 1);
  r = run({"store", "rm", sel, "t1"});
  CHECK(r.code == 1);
  CHECK(r.err.find("no Task with id 't1'") != std::string::npos);

  r = run({"store", "put", sel}, R"({"contextId":"x"})");
  CHECK(r.code == 2);
  CHECK(r.err.find("not a valid Task: task has no \"id\"") != std::string::npos);
  // Storable, but not a Task an A2A server could serve.
  for (const auto &[doc, why] : std::vector<std::pair<std::string, std::string>>{
           {R"({"id":"a"})", "\"contextId\" is required"},
           {R"({"id":"a","contextId":"c"})", "\"status\" with a \"state\" is required"},
           {R"({"id":"a","contextId":"c","status":{"state":"working"},"kind":"message"})", "\"kind\" must be \"task\""}}) {
    r = run({"store", "put", sel}, doc);
    CHECK(r.code == 2);
    CHECK_MESSAGE(r.err.find("not a valid A2A Task: " + why) != std::string::npos, r.err);
  }
  CHECK(run({"store", "get", sel, "a"}).code == 1);  // nothing was stored
  r = run({"store", "put", sel}, "{\"id\":");
  CHECK(r.code == 2);
  CHECK(r.err.find("not valid JSON") != std::string::npos);

  r = run({"store", "get", "redis:x", "t1"});
  CHECK(r.code == 2);
  CHECK(r.err.find("unknown store selector 'redis:x'") != std::string::npos);
  CHECK(run({"store", "frobnicate", sel}).code == 2);
  CHECK(run({"store", "get", sel}).code == 2);
  fs::remove_all(dir);
}

TEST_CASE("get, list, check and copy's source create nothing: a missing store is exit 2 naming it") {
  fs::path dir = temp_dir();
  const fs::path db = dir / "typo" / "tasks.db";
  const fs::path files = dir / "no-such-dir";
  for (const std::string &sel : {"sqlite:" + db.string(), "file:" + files.string()}) {
    CAPTURE(sel);
    const std::string where = sel.rfind("sqlite:", 0) == 0 ? db.string() : files.string();
    for (const std::vector<std::string> &cmd :
         {std::vector<std::string>{"store", "get", sel, "t1"}, {"store", "list", sel}, {"store", "check", sel},
          {"store", "copy", sel, "file:" + (dir / "dest").string()}, {"store", "rm", sel, "t1"}}) {
      CAPTURE(cmd[1]);
      Run r = run(cmd);
      CHECK(r.code == 2);
      CHECK_MESSAGE(r.err.find(where) != std::string::npos, r.err);
      CHECK_MESSAGE(r.err.find("not created") != std::string::npos, r.err);
      CHECK(r.out.empty());
    }
    CHECK_FALSE(fs::exists(dir / "typo"));
    CHECK_FALSE(fs::exists(files));
    CHECK_FALSE(fs::exists(dir / "dest"));  // copy failed before opening the target
  }
  // Once something is stored there, the same commands read it.
  const std::string sel = "sqlite:" + db.string();
  REQUIRE(run({"store", "put", sel}, task_json("t1", "c1", "input-required", 1)).code == 0);
  CHECK(run({"store", "get", sel, "t1"}).out == task_json("t1", "c1", "input-required", 1) + "\n");
  CHECK(run({"store", "check", sel}).out == "1 sound, 0 bad\n");

  // Copying a store onto itself is refused, however the path is spelled.
  const std::string files_sel = "file:" + (dir / "fs").string();
  REQUIRE(run({"store", "put", files_sel}, task_json("t1", "c1", "input-required", 1)).code == 0);
  const auto mtime = fs::last_write_time(dir / "fs" / "t1.json");
  for (const auto &[from, to] : std::vector<std::pair<std::string, std::string>>{
           {sel, sel}, {sel, sel + "?synchronous=normal"}, {files_sel, files_sel + "/"},
           {files_sel, "file:" + (dir / "fs" / "." / "..").string() + "/fs"}}) {
    Run r = run({"store", "copy", from, to});
    CHECK_MESSAGE(r.code == 2, from << " -> " << to);
    CHECK_MESSAGE(r.err.find("same store") != std::string::npos, r.err);
  }
  CHECK(fs::last_write_time(dir / "fs" / "t1.json") == mtime);
  fs::remove_all(dir);
}

TEST_CASE("store check and copy report a corrupt record with its location") {
  fs::path dir = temp_dir();
  const std::string sel = "file:" + dir.string();
  CHECK(run({"store", "put", sel}, task_json("good", "c", "completed", 1)).code == 0);
  Run r = run({"store", "check", sel});
  CHECK(r.code == 0);
  CHECK(r.out == "1 sound, 0 bad\n");
  spit(dir / "broken.json", "{\"id\":\"broken\",\"status\":");
  r = run({"store", "check", sel});
  CHECK(r.code == 1);
  CHECK(r.out.find("BAD broken") != std::string::npos);
  CHECK(r.out.find("1 sound, 1 bad") != std::string::npos);
  // The store's own reason (ABI 1.2 record.problem) names the file.
  CHECK_MESSAGE(r.out.find("BAD broken: task file '" + (dir / "broken.json").string() + "' is not valid JSON") !=
                    std::string::npos,
                r.out);
  r = run({"store", "get", sel, "broken"});
  CHECK(r.code == 2);
  CHECK(r.err.find("broken.json") != std::string::npos);
  // list skips it and says so (exit 1), instead of ending with exit 2.
  r = run({"store", "list", sel});
  CHECK(r.code == 1);
  CHECK(r.out == "good\tcompleted\t2026-01-01T00:00:01.000000Z\tc\n");
  CHECK_MESSAGE(r.err.find("skipped unreadable record 'broken': task file '" + (dir / "broken.json").string()) !=
                    std::string::npos,
                r.err);
  r = run({"store", "list", sel, "--json"});
  CHECK(r.code == 1);
  CHECK(r.out == task_json("good", "c", "completed", 1) + "\n");

  // A file whose JSON is another Task's (a stray copy) is reported and never
  // copied over the real one.
  spit(dir / "zzz.json", task_json("good", "c", "submitted", 0));
  fs::path dest = temp_dir();
  r = run({"store", "copy", sel, "sqlite:" + (dest / "t.db").string()});
  CHECK(r.code == 1);
  CHECK(r.err.find("cannot copy record 'broken'") != std::string::npos);
  CHECK(r.out == "copied 1 Task(s), 2 unreadable\n");
  CHECK(r.err.find("cannot copy record 'zzz'") != std::string::npos);
  r = run({"store", "get", "sqlite:" + (dest / "t.db").string(), "good"});
  CHECK(r.code == 0);
  CHECK(r.out == task_json("good", "c", "completed", 1) + "\n");

  // Files that are not task files at all say so, not "not valid JSON".
  fs::remove(dir / "zzz.json");
  fs::create_directory(dir / "adir.json");
  fs::create_symlink(dir / "broken.json", dir / "link.json");
  r = run({"store", "check", sel});
  CHECK(r.code == 1);
  CHECK_MESSAGE(r.out.find("BAD adir: '" + (dir / "adir.json").string() + "' is not a regular file") !=
                    std::string::npos,
                r.out);
  CHECK_MESSAGE(r.out.find("BAD link: '" + (dir / "link.json").string() + "' is a symbolic link") !=
                    std::string::npos,
                r.out);
  CHECK(r.out.find("1 sound, 3 bad") != std::string::npos);

  // A damaged record whose name decodes to bytes that are not UTF-8 (or are
  // control characters) is printed escaped, never raw to the terminal.
  spit(dir / "~%FF%1Bx.json", "garbage");
  r = run({"store", "check", sel});
  CHECK_MESSAGE(r.out.find("BAD \\xff\\x1bx: ") != std::string::npos, r.out);
  CHECK(r.out.find('\x1b') == std::string::npos);
  fs::remove_all(dir);
  fs::remove_all(dest);
}

TEST_CASE("store check reports a record that store put would refuse (no status, no contextId), naming it and what "
          "is missing") {
  fs::path dir = temp_dir();
  const std::string sel = "file:" + dir.string();
  CHECK(run({"store", "put", sel}, task_json("good", "c", "completed", 1)).code == 0);
  // Written by hand (store put refuses both), as an old tool or an editor would.
  spit(dir / "x.json", R"({"id":"x"})");
  spit(dir / "y.json", R"({"id":"y","contextId":"c","status":{"timestamp":"2026-01-01T00:00:00Z"}})");
  CHECK(run({"store", "put", sel}, R"({"id":"x"})").code == 2);
  Run r = run({"store", "check", sel});
  CHECK(r.code == 1);
  CHECK_MESSAGE(r.out.find("BAD x: not a valid A2A Task: \"contextId\" is required (a non-empty string); \"status\" "
                           "with a \"state\" is required, e.g. {\"state\":\"submitted\"}\n") != std::string::npos,
                r.out);
  CHECK_MESSAGE(r.out.find("BAD y: not a valid A2A Task: \"status\" with a \"state\" is required") != std::string::npos,
                r.out);
  CHECK(r.out.find("1 sound, 2 bad\n") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("copy 10,000 Tasks from file to sqlite and back, field by field") {
  fs::path dir = temp_dir();
  fs::path src = dir / "src", back = dir / "back";
  fs::create_directories(src);
  // The source directory is written as the seed wrote it: <id>.json files.
  const int n = 10000;
  std::vector<std::string> originals(n);
  for (int i = 0; i < n; ++i) {
    std::string id = "task-" + std::to_string(i);
    originals[static_cast<size_t>(i)] =
        R"({"id":")" + id + R"(","contextId":"ctx-)" + std::to_string(i % 7) + R"(","status":{"state":")" +
        (i % 3 ? "completed" : "input-required") + R"(","timestamp":")" +
        format_timestamp((1767225600LL + i) * 1000000LL) + R"("},"history":[{"role":"user","parts":[{"kind":"text","text":"m)" +
        std::to_string(i) + R"("}],"messageId":"m"}],"metadata":{"i":)" + std::to_string(i) + "}}";
    spit(src / (id + ".json"), originals[static_cast<size_t>(i)]);
  }
  const std::string db = "sqlite:" + (dir / "tasks.db").string() + "?synchronous=off";
  Run r = run({"store", "copy", "file:" + src.string(), db});
  REQUIRE(r.code == 0);
  CHECK(r.out == "copied 10000 Task(s), 0 unreadable\n");
  r = run({"store", "copy", db, "file:" + back.string()});
  REQUIRE(r.code == 0);
  CHECK(r.out == "copied 10000 Task(s), 0 unreadable\n");
  // Re-running is safe: same count, same content.
  r = run({"store", "copy", "file:" + src.string(), db});
  CHECK(r.out == "copied 10000 Task(s), 0 unreadable\n");

  auto a = resolve_store("file:" + src.string());
  auto b = resolve_store(db);
  auto c = resolve_store("file:" + back.string());
  int mismatches = 0;
  for (int i = 0; i < n; ++i) {
    std::string id = "task-" + std::to_string(i);
    auto ra = a->get(id), rb = b->get(id), rc = c->get(id);
    if (!ra || !rb || !rc) {
      ++mismatches;
      continue;
    }
    bool same = ra->json == originals[static_cast<size_t>(i)] && rb->json == ra->json && rc->json == ra->json &&
                rb->context_id == ra->context_id && rc->context_id == ra->context_id && rb->state == ra->state &&
                rc->state == ra->state && rb->status_time_us == ra->status_time_us &&
                rc->status_time_us == ra->status_time_us && rb->owner == ra->owner && rc->tenant == ra->tenant;
    if (!same) ++mismatches;
  }
  CHECK(mismatches == 0);
  ListQuery q;
  q.page_size = 1000;
  q.omit_json = true;
  size_t count = 0;
  for (;;) {
    auto p = c->list(q);
    count += p.records.size();
    if (p.next_cursor.empty()) break;
    q.cursor = p.next_cursor;
  }
  CHECK(count == static_cast<size_t>(n));
  fs::remove_all(dir);
}

TEST_CASE("store put: compare-and-set, owner and tenant kept, and JSON lines in one transaction") {
  fs::path dir = temp_dir();
  for (const std::string &sel : std::vector<std::string>{"file:" + (dir / "f").string(), "sqlite:" + (dir / "t.db").string()}) {
    CAPTURE(sel);
    Run r = run({"store", "put", sel, "--owner", "alice", "--tenant", "acme"}, task_json("p", "c", "input-required", 1));
    REQUIRE(r.code == 0);
    // On main a second put replaced it blindly and dropped the owner.
    r = run({"store", "put", sel}, task_json("p", "c", "completed", 2));
    CHECK(r.code == 1);
    CHECK_MESSAGE(r.err.find("exists (version 1)") != std::string::npos, r.err);
    CHECK_MESSAGE(r.err.find("--expect-version 1") != std::string::npos, r.err);
    r = run({"store", "get", sel, "p"});
    CHECK(r.out == task_json("p", "c", "input-required", 1) + "\n");
    CHECK(r.err == "version 1\n");
    // Replacing what was read: owner and tenant stay.
    r = run({"store", "put", sel, "--expect-version", "1"}, task_json("p", "c", "completed", 2));
    CHECK_MESSAGE(r.code == 0, r.err);
    auto s = resolve_store(sel);
    auto rec = s->get("p");
    REQUIRE(rec.has_value());
    CHECK(rec->state == "completed");
    CHECK(rec->owner == "alice");
    CHECK(rec->tenant == "acme");
    const uint64_t v = rec->version;
    s->close();
    // A stale version is refused, saying what is stored now.
    r = run({"store", "put", sel, "--expect-version", "1"}, task_json("p", "c", "failed", 3));
    CHECK(r.code == 1);
    CHECK_MESSAGE(r.err.find("changed since it was read: it is at version " + std::to_string(v)) != std::string::npos,
                  r.err);
    CHECK(run({"store", "put", sel, "--expect-version", "x"}, task_json("p", "c", "failed", 3)).code == 2);
    r = run({"store", "put", sel, "--force", "--owner", "bob"}, task_json("p", "c", "failed", 3));
    CHECK(r.code == 0);
    s = resolve_store(sel);
    CHECK(s->get("p")->owner == "bob");
    CHECK(s->get("p")->tenant == "acme");
    s->close();

    // JSON lines: every bad line named, nothing saved.
    std::string lines;
    for (int i = 0; i < 5000; ++i) lines += task_json("l" + std::to_string(i), "c", "completed", i) + "\n";
    r = run({"store", "put", sel}, lines + "{\"id\":\"bad\"}\nnot json\n");
    CHECK(r.code == 2);
    CHECK(r.err.find("line 5001: not a valid A2A Task") != std::string::npos);
    CHECK(r.err.find("line 5002: not a valid Task") != std::string::npos);
    CHECK(run({"store", "get", sel, "l0"}).code == 1);
    const auto t0 = std::chrono::steady_clock::now();
    r = run({"store", "put", sel}, lines);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CHECK_MESSAGE(r.code == 0, r.err);
    MESSAGE(sel << ": 5000 Tasks put in " << secs << " s: " << r.out);
    s = resolve_store(sel);
    CHECK(s->count(ListQuery{}) == 5001);
    s->close();
    // A line whose Task exists: named, and (sqlite: one transaction) nothing saved.
    r = run({"store", "put", sel}, task_json("new-1", "c", "completed", 1) + "\n" + task_json("l7", "c", "completed", 1) + "\n");
    CHECK(r.code == 1);
    CHECK(r.err.find("line 2 (Task 'l7'): a Task with this id exists") != std::string::npos);
    if (sel.rfind("sqlite:", 0) == 0) CHECK(run({"store", "get", sel, "new-1"}).code == 1);
  }
  fs::remove_all(dir);
}

TEST_CASE("store put --force from four processes at once: every put lands, none is refused") {
  // --force replaces whatever is stored, keeping the owner of what it
  // replaces by compare-and-set on the version it read: a writer that came
  // between is read again, never reported as "exists".
  fs::path dir = temp_dir();
  const std::string sel = "sqlite:" + (dir / "t.db").string();
  REQUIRE(run({"store", "put", sel, "--owner", "alice"}, task_json("hot", "c", "input-required", 0)).code == 0);
  for (int w = 0; w < 4; ++w)
    spit(dir / ("t" + std::to_string(w) + ".json"), task_json("hot", "c", "input-required", w + 1));
  std::string script = "for w in 0 1 2 3; do ( for i in 1 2 3 4 5 6 7 8 9 10; do " +
                       sh_quote(std::string(TOOLNEXUS_BIN_DIR) + "/toolnexus") + " store put " + sh_quote(sel) +
                       " --force " + sh_quote((dir / "t").string()) + "$w.json >/dev/null 2>>" +
                       sh_quote((dir / "err").string()) + " || echo x >>" + sh_quote((dir / "fails").string()) +
                       "; done ) & done; wait";
  REQUIRE(std::system(script.c_str()) == 0);
  CHECK_MESSAGE(!fs::exists(dir / "fails"), slurp(dir / "err"));
  auto s = resolve_store(sel);
  auto rec = s->get("hot");
  REQUIRE(rec.has_value());
  CHECK(rec->version == 41);  // the first put and 40 replacements
  CHECK(rec->owner == "alice");
  s->close();
  fs::remove_all(dir);
}

TEST_CASE("store list: control bytes in ids are escaped in the table; --json is one object per line") {
  fs::path dir = temp_dir();
  const std::string sel = "file:" + (dir / "tasks").string();
  const std::string odd =
      R"({"id":"line1\nline2\tTAB","contextId":"c\nx","status":{"state":"completed","timestamp":"2026-01-01T00:00:00Z"},"kind":"task"})";
  const std::string esc =
      R"({"id":"esc\u001b[31mRED","contextId":"ok","status":{"state":"completed","timestamp":"2026-01-02T00:00:00Z"},"kind":"task"})";
  REQUIRE(run({"store", "put", sel, "-"}, odd + "\n" + esc + "\n").code == 0);
  Run r = run({"store", "list", sel});
  CHECK(r.code == 0);
  CHECK(r.out == "esc\\x1b[31mRED\tcompleted\t2026-01-02T00:00:00.000000Z\tok\n"
                 "line1\\x0aline2\\x09TAB\tcompleted\t2026-01-01T00:00:00.000000Z\tc\\x0ax\n");
  // A task file written by hand over several lines is listed on one.
  spit(dir / "tasks" / "pretty.json",
       "{\n  \"id\": \"pretty\",\n  \"contextId\": \"c\",\n"
       "  \"status\": {\"state\": \"working\", \"timestamp\": \"2026-01-03T00:00:00Z\"},\n  \"kind\": \"task\"\n}\n");
  r = run({"store", "list", sel, "--json"});
  CHECK(r.code == 0);
  CHECK(r.out == std::string(R"({"id":"pretty","contextId":"c","status":{"state":"working","timestamp":"2026-01-03T00:00:00Z"},"kind":"task"})") +
                     "\n" + R"({"id":"esc\u001B[31mRED","contextId":"ok","status":{"state":"completed","timestamp":"2026-01-02T00:00:00Z"},"kind":"task"})" +
                     "\n" + odd + "\n");
}

TEST_CASE("store put refuses a running Task no server runs, or imports it as the state --running-as names") {
  fs::path dir = temp_dir();
  for (const std::string &sel : std::vector<std::string>{"file:" + (dir / "f").string(), "sqlite:" + (dir / "t.db").string()}) {
    CAPTURE(sel);
    // One Task: refused, naming it and the way out; nothing saved.
    Run r = run({"store", "put", sel}, task_json("w1", "c", "working", 1));
    CHECK(r.code == 2);
    CHECK_MESSAGE(r.err.find("Task 'w1' is working and no server runs it") != std::string::npos, r.err);
    CHECK_MESSAGE(r.err.find("--running-as STATE") != std::string::npos, r.err);
    CHECK(run({"store", "get", sel, "w1"}).out.empty());
    // JSON lines: every running line named, nothing saved.
    const std::string lines = task_json("s1", "c", "submitted", 1) + "\n" + task_json("d1", "c", "completed", 2) +
                              "\n" + task_json("w2", "c", "working", 3) + "\n";
    r = run({"store", "put", sel}, lines);
    CHECK(r.code == 2);
    CHECK_MESSAGE(r.err.find("line 1: Task 's1' is submitted and no server runs it") != std::string::npos, r.err);
    CHECK_MESSAGE(r.err.find("line 3: Task 'w2' is working and no server runs it") != std::string::npos, r.err);
    CHECK(run({"store", "get", sel, "d1"}).out.empty());
    // --running-as: saved in that state, with a status message saying so.
    r = run({"store", "put", sel, "--running-as", "input-required"}, lines);
    CHECK_MESSAGE(r.code == 0, r.err);
    auto s = resolve_store(sel);
    for (const char *id : {"s1", "w2"}) {
      CAPTURE(id);
      const Task t = s->get(id)->task();
      CHECK(std::string(t.state()) == "input-required");
      const auto &msg = t.json()["status"]["message"];
      CHECK(std::string(msg["role"].GetString()) == "agent");
      const std::string text = msg["parts"][0]["text"].GetString();
      CHECK_MESSAGE(text.find("Imported by `toolnexus store put --running-as input-required` while ") == 0, text);
      CHECK_MESSAGE(text.find("no server was running this Task") != std::string::npos, text);
    }
    CHECK(s->get("d1")->state == "completed");  // untouched
    s->close();
    r = run({"store", "put", sel, "--running-as", "failed"}, task_json("w1", "c", "working", 1));
    CHECK_MESSAGE(r.code == 0, r.err);
    CHECK(run({"store", "list", sel, "--state", "failed"}).out.find("w1\tfailed") == 0);
    // Not a state that waits or ends: a usage error.
    r = run({"store", "put", sel, "--running-as", "working"}, task_json("w3", "c", "working", 1));
    CHECK(r.code == 2);
    CHECK_MESSAGE(r.err.find("--running-as 'working' is not a state") != std::string::npos, r.err);
    // A Task a server holds (its lease, as `store get` shows it) is put as it is.
    const std::string leased = R"({"id":"h1","contextId":"c","status":{"state":"working"},"kind":"task",)"
                               R"("metadata":{"toolnexus/lease":{"instance":"i","expiresAt":"2026-01-01T00:00:00Z"}}})";
    r = run({"store", "put", sel}, leased);
    CHECK_MESSAGE(r.code == 0, r.err);
    CHECK(run({"store", "list", sel, "--state", "working"}).out.find("h1\tworking") == 0);
    // A lease that no server wrote is no proof that one runs it.
    const std::vector<std::pair<std::string, std::string>> fake = {
        {R"({})", R"(names no server ("instance" must be a non-empty string))"},
        {R"({"instance":"","expiresAt":"2026-01-01T00:00:00Z"})", "names no server"},
        {R"({"instance":"i"})", R"(has no valid "expiresAt" (an RFC 3339 time))"},
        {R"({"instance":"i","expiresAt":"tomorrow"})", R"(has no valid "expiresAt")"},
        {R"("i")", R"(metadata["toolnexus/lease"] is not an object)"}};
    for (const auto &[lease, why] : fake) {
      CAPTURE(lease);
      r = run({"store", "put", sel},
              R"({"id":"h2","contextId":"c","status":{"state":"working"},"kind":"task","metadata":{"toolnexus/lease":)" +
                  lease + "}}");
      CHECK(r.code == 2);
      CHECK_MESSAGE(r.err.find("Task 'h2' is working and no server runs it (its ") != std::string::npos, r.err);
      CHECK_MESSAGE(r.err.find(why) != std::string::npos, r.err);
    }
    CHECK(run({"store", "get", sel, "h2"}).out.empty());
    // --running-as on a Task without history: the message is its history.
    r = run({"store", "put", sel, "--running-as", "canceled"}, task_json("w4", "c", "working", 1));
    CHECK_MESSAGE(r.code == 0, r.err);
    {
      auto s4 = resolve_store(sel);
      const Task t = s4->get("w4")->task();
      REQUIRE(t.json().HasMember("history"));
      REQUIRE(t.json()["history"].Size() == 1);
      const auto &h0 = t.json()["history"][0];
      CHECK(std::string(h0["role"].GetString()) == "agent");
      CHECK(std::string(h0["messageId"].GetString()) == t.json()["status"]["message"]["messageId"].GetString());
      s4->close();
    }
  }
  // The help says it.
  Run h = run({"store", "--help"});
  CHECK(h.out.find("--running-as STATE") != std::string::npos);
  fs::remove_all(dir);
}

TEST_CASE("store check says when a sqlite file was copied without the -wal that holds its latest Tasks") {
  fs::path dir = temp_dir();
  const std::string db = (dir / "live.db").string(), copy = (dir / "copy.db").string();
  // A server holds the store open; `store put` adds a Task through the -wal.
  const fs::path server_out = dir / "serve.out";
  const std::string serve = sh_quote(kBin) + " serve --listen 127.0.0.1:0 --store " + sh_quote("sqlite:" + db) +
                            " >" + sh_quote(server_out.string()) + " 2>/dev/null & echo $!";
  FILE *p = ::popen(serve.c_str(), "r");
  REQUIRE(p != nullptr);
  char pid_text[32] = "";
  REQUIRE(std::fgets(pid_text, sizeof pid_text, p) != nullptr);
  ::pclose(p);
  const pid_t server = static_cast<pid_t>(std::strtol(pid_text, nullptr, 10));
  REQUIRE(server > 0);
  for (int i = 0; i < 500 && slurp(server_out).find("listening on") == std::string::npos; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  REQUIRE(slurp(server_out).find("listening on") != std::string::npos);
  CHECK(run({"store", "put", "sqlite:" + db}, task_json("t1", "c", "completed", 1)).code == 0);
  fs::copy_file(db, copy);

  Run r = run({"store", "check", "sqlite:" + copy});
  CHECK(r.code == 2);
  CHECK(r.out.empty());
  CHECK_MESSAGE(r.err.find("'" + copy + "' is missing its write-ahead log") != std::string::npos, r.err);
  // The original, with its -wal, is sound; so is the copy once the loss is accepted (and it lists nothing).
  CHECK(run({"store", "check", "sqlite:" + db}).out == "1 sound, 0 bad\n");
  CHECK(run({"store", "check", "sqlite:" + copy + "?missing_wal=accept"}).out == "0 sound, 0 bad\n");
  // The -wal removed by hand under the running server: the next look says what is gone.
  fs::remove(db + "-wal");
  r = run({"store", "list", "sqlite:" + db});
  CHECK(r.code == 2);
  CHECK_MESSAGE(r.err.find("'" + db + "-wal' or '" + db + "-shm' removed while a process had the database open") !=
                    std::string::npos,
                r.err);
  // Not our child (the shell started it): wait until it is gone.
  ::kill(server, SIGTERM);
  for (int i = 0; i < 500 && ::kill(server, 0) == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  fs::remove_all(dir);
}

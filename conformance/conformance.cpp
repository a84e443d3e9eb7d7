// The conformance rules. Each holds a store to one promise of the contract.
#include "conformance.hpp"

#include "toolnexus/task_store.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace toolnexus::conformance {
namespace {

/// Throws Failure("expected <cond>: <what>") when `cond` is false. The
/// message stands on its own (the runner prefixes the rule's name and its
/// description); it cites no source file, which is not installed.
#define EXPECT(cond, what)                                                    \
  do {                                                                        \
    if (!(cond)) throw Failure(std::string("expected " #cond ": ") + (what)); \
  } while (0)

std::string q(const std::string &s) { return "'" + s + "'"; }

// A Task with the given fields; time in seconds since 2026-01-01 (0 = none).
Task make_task(const std::string &id, const std::string &context, const std::string &state, int64_t sec,
               const std::string &extra = "") {
  std::string json = "{\"id\":\"" + id + "\",\"contextId\":\"" + context + "\",\"status\":{\"state\":\"" +
                     state + "\"";
  if (sec != 0) json += ",\"timestamp\":\"" + format_timestamp((1767225600LL + sec) * 1000000LL) + "\"";
  json += "},\"kind\":\"task\"" + extra + "}";
  return Task::parse(json);
}

// Every record of a query, following cursors; checks no page is larger than asked.
std::vector<TaskRecord> list_all(TaskStore &s, ListQuery qr, int *pages = nullptr) {
  std::vector<TaskRecord> out;
  int n = 0;
  for (;;) {
    ListPage p = s.list(qr);
    EXPECT(p.records.size() <= qr.page_size, "page of " + std::to_string(p.records.size()) +
                                                 " records for page size " + std::to_string(qr.page_size));
    ++n;
    for (auto &r : p.records) out.push_back(std::move(r));
    if (p.next_cursor.empty()) break;
    EXPECT(n < 10000, "list never ends");
    qr.cursor = p.next_cursor;
  }
  if (pages != nullptr) *pages = n;
  return out;
}

std::vector<std::string> ids_of(const std::vector<TaskRecord> &v) {
  std::vector<std::string> out;
  for (const auto &r : v) out.push_back(r.id);
  return out;
}

std::string join(const std::vector<std::string> &v) {
  std::string s;
  for (const auto &x : v) s += (s.empty() ? "" : ",") + x;
  return s;
}

void expect_status(Status want, const std::function<void()> &f, const std::string &what) {
  try {
    f();
  } catch (const StoreError &e) {
    EXPECT(e.code() == want, what + ": got " + status_name(e.code()) + " (" + e.what() + "), want " +
                                 status_name(want));
    return;
  }
  throw Failure(what + ": no error, want " + status_name(want));
}

// ---------------------------------------------------------------------------

void round_trip(const StoreFactory &fresh) {
  auto s = fresh();
  const std::string json =
      R"({"id":"rt-1","contextId":"ctx","status":{"state":"working","timestamp":"2026-03-01T10:00:00.123456Z",)"
      R"("message":{"role":"agent","parts":[{"kind":"text","text":"h\u00e9llo \"q\" \\ \n"}],"messageId":"m"}},)"
      R"("history":[{"role":"user","parts":[{"kind":"data","data":{"n":[1,2.5,-3e10,true,null]}}],"messageId":"u1"}],)"
      R"("artifacts":[],"metadata":{"x-unknown":{"deep":{"er":["ü","日本",""]}}},"kind":"task","zzz":0})";
  Task t = Task::parse(json);
  uint64_t v = s->save(t);
  EXPECT(v != 0, "version 0 after save");
  auto r = s->get("rt-1");
  EXPECT(r.has_value(), "saved task not found");
  EXPECT(r->json == t.to_json(), "stored bytes differ: " + r->json);
  EXPECT(r->task().json() == t.json(), "read-back Task differs");
  EXPECT(r->version == v, "get version " + std::to_string(r->version) + " != save version " + std::to_string(v));
}

void index_fields(const StoreFactory &fresh) {
  auto s = fresh();
  SaveOptions o;
  o.owner = "alice";
  o.tenant = "acme";
  s->save(make_task("ix-1", "ctx-9", "input-required", 100), o);
  auto r = s->get("ix-1");
  EXPECT(r.has_value(), "not found");
  EXPECT(r->id == "ix-1", r->id);
  EXPECT(r->context_id == "ctx-9", r->context_id);
  EXPECT(r->state == "input-required", r->state);
  EXPECT(r->status_time_us == (1767225600LL + 100) * 1000000LL, std::to_string(r->status_time_us));
  EXPECT(r->owner == "alice", r->owner);
  EXPECT(r->tenant == "acme", r->tenant);
  s->save(make_task("ix-2", "", "submitted", 0));
  auto r2 = s->get("ix-2");
  EXPECT(r2 && r2->status_time_us == kNoTime, "a Task without timestamp must have no status time");
  EXPECT(r2->owner.empty() && r2->tenant.empty(), "owner/tenant must default to empty");
}

void not_found(const StoreFactory &fresh) {
  auto s = fresh();
  EXPECT(!s->get("nope").has_value(), "get of a missing id returned a record");
  expect_status(Status::not_found, [&] { s->remove("nope"); }, "remove of a missing id");
  auto p = s->list(ListQuery{});
  EXPECT(p.records.empty() && p.next_cursor.empty(), "empty store listed something");
}

void overwrite(const StoreFactory &fresh) {
  auto s = fresh();
  uint64_t v1 = s->save(make_task("ow", "c", "submitted", 1));
  uint64_t v2 = s->save(make_task("ow", "c", "completed", 2, R"(,"artifacts":[{"artifactId":"a","parts":[]}])"));
  EXPECT(v2 > v1, "version did not grow: " + std::to_string(v1) + " -> " + std::to_string(v2));
  auto r = s->get("ow");
  EXPECT(r && r->state == "completed", "overwrite lost");
  EXPECT(r->json.find("artifacts") != std::string::npos, r->json);
  EXPECT(list_all(*s, ListQuery{}).size() == 1, "overwrite made two records");
}

void remove_rule(const StoreFactory &fresh) {
  auto s = fresh();
  s->save(make_task("d1", "c", "completed", 1));
  s->save(make_task("d2", "c", "completed", 2));
  s->remove("d1");
  EXPECT(!s->get("d1").has_value(), "deleted task still readable");
  EXPECT(s->get("d2").has_value(), "delete removed the wrong task");
  expect_status(Status::not_found, [&] { s->remove("d1"); }, "second delete");
  auto all = list_all(*s, ListQuery{});
  EXPECT(ids_of(all) == std::vector<std::string>{"d2"}, join(ids_of(all)));
  s->save(make_task("d1", "c", "submitted", 3));
  EXPECT(s->get("d1") && s->get("d1")->state == "submitted", "re-create after delete failed");
}

void odd_ids(const StoreFactory &fresh) {
  auto s = fresh();
  const std::vector<std::string> ids = {"a/b", "a_b", "../x", std::string(300, 'z'), "ü", "Case", "case",
                                        ".", "..", "~x", "a b", "x.json", "CON", "-", "%2F"};
  for (const auto &id : ids) {
    Task t = make_task("placeholder", "c", "working", 1);
    t.json()["id"].SetString(id.c_str(), static_cast<rapidjson::SizeType>(id.size()), t.allocator());
    s->save(t);
  }
  for (const auto &id : ids) {
    auto r = s->get(id);
    EXPECT(r.has_value(), "id " + q(id) + " not found");
    EXPECT(r->id == id && std::string(r->task().id()) == id, "id " + q(id) + " read back as " + q(r->id));
  }
  auto all = list_all(*s, ListQuery{});
  EXPECT(all.size() == ids.size(), "listed " + std::to_string(all.size()) + " of " + std::to_string(ids.size()));
}

void list_order_paging(const StoreFactory &fresh) {
  auto s = fresh();
  // 23 tasks: distinct times, ties (same time, ids order them), and none.
  std::vector<std::pair<int64_t, std::string>> expect;
  for (int i = 0; i < 23; ++i) {
    int64_t sec = (i % 5 == 0) ? 0 : (i % 3 == 0 ? 500 : 1000 + i);
    char id[16];
    std::snprintf(id, sizeof id, "p%02d", 22 - i);
    s->save(make_task(id, "c", "working", sec));
    expect.push_back({sec == 0 ? kNoTime : (1767225600LL + sec) * 1000000LL, id});
  }
  std::sort(expect.begin(), expect.end(), [](const auto &a, const auto &b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  std::vector<std::string> want;
  for (auto &e : expect) want.push_back(e.second);
  ListQuery qr;
  qr.page_size = 5;
  int pages = 0;
  auto got = list_all(*s, qr, &pages);
  EXPECT(ids_of(got) == want, "order " + join(ids_of(got)) + " want " + join(want));
  EXPECT(pages == 5, "pages: " + std::to_string(pages));
  qr.page_size = 23;
  ListPage one = s->list(qr);
  EXPECT(one.records.size() == 23 && one.next_cursor.empty(), "exact page must have no next cursor");
  // A keyset cursor survives inserts: a newer task added between pages is
  // not seen later and nothing repeats.
  qr.page_size = 10;
  ListPage first = s->list(qr);
  s->save(make_task("p-new", "c", "working", 5000));
  qr.cursor = first.next_cursor;
  auto rest = list_all(*s, qr);
  std::vector<std::string> all = ids_of(first.records);
  for (auto &r : rest) all.push_back(r.id);
  EXPECT(all == want, "paging across an insert gave " + join(all));
}

void list_filters(const StoreFactory &fresh) {
  auto s = fresh();
  auto save = [&](const char *id, const char *ctx, const char *state, int64_t sec, const char *owner,
                  const char *tenant) {
    SaveOptions o;
    o.owner = owner;
    o.tenant = tenant;
    s->save(make_task(id, ctx, state, sec), o);
  };
  save("f1", "A", "working", 10, "alice", "t1");
  save("f2", "A", "completed", 20, "bob", "t1");
  save("f3", "B", "working", 30, "alice", "t2");
  save("f4", "B", "input-required", 40, "", "");
  save("f5", "A", "working", 50, "alice", "t2");
  auto ids = [&](ListQuery qr) { return join(ids_of(list_all(*s, qr))); };
  ListQuery qr;
  qr.context_id = "A";
  EXPECT(ids(qr) == "f5,f2,f1", ids(qr));
  qr = {};
  qr.state = "working";
  EXPECT(ids(qr) == "f5,f3,f1", ids(qr));
  qr = {};
  qr.owner = "alice";
  EXPECT(ids(qr) == "f5,f3,f1", ids(qr));
  qr = {};
  qr.owner = "";
  EXPECT(ids(qr) == "f4", "empty owner is a filter value too: " + ids(qr));
  qr = {};
  qr.tenant = "t2";
  EXPECT(ids(qr) == "f5,f3", ids(qr));
  qr = {};
  qr.after_us = (1767225600LL + 20) * 1000000LL;
  EXPECT(ids(qr) == "f5,f4,f3", "after is strict: " + ids(qr));
  qr.before_us = (1767225600LL + 50) * 1000000LL;
  EXPECT(ids(qr) == "f4,f3", "before is strict: " + ids(qr));
  qr = {};
  qr.context_id = "A";
  qr.state = "working";
  qr.owner = "alice";
  qr.tenant = "t2";
  EXPECT(ids(qr) == "f5", ids(qr));
  qr = {};
  qr.context_id = "none";
  EXPECT(ids(qr).empty(), ids(qr));
  // Paging with a filter that skips records in between.
  qr = {};
  qr.state = "working";
  qr.page_size = 1;
  int pages = 0;
  auto got = list_all(*s, qr, &pages);
  EXPECT(join(ids_of(got)) == "f5,f3,f1" && pages == 3, join(ids_of(got)));
}

void bad_cursor(const StoreFactory &fresh) {
  auto s = fresh();
  s->save(make_task("c1", "c", "working", 1));
  ListQuery qr;
  qr.cursor = "definitely not a cursor \x01";
  expect_status(Status::invalid_argument, [&] { s->list(qr); }, "list with a malformed cursor");
}

void compare_and_set(const StoreFactory &fresh) {
  auto s = fresh();
  SaveOptions create;
  create.expected_version = kNoVersion;
  uint64_t v1 = s->save(make_task("cas", "c", "submitted", 1), create);
  expect_status(Status::conflict, [&] { s->save(make_task("cas", "c", "failed", 2), create); },
                "create of an existing id");
  EXPECT(s->get("cas")->state == "submitted", "a conflicting create overwrote the task");
  SaveOptions upd;
  upd.expected_version = v1;
  uint64_t v2 = s->save(make_task("cas", "c", "working", 3), upd);
  EXPECT(v2 > v1, "CAS save did not raise the version");
  expect_status(Status::conflict, [&] { s->save(make_task("cas", "c", "canceled", 4), upd); },
                "save with a stale version");
  auto r = s->get("cas");
  EXPECT(r->state == "working" && r->version == v2, "stale save changed the task: " + r->state);
  upd.expected_version = v2 + 1000;
  expect_status(Status::conflict, [&] { s->save(make_task("cas", "c", "canceled", 4), upd); },
                "save with a future version");
  expect_status(Status::conflict, [&] { s->remove("cas", v1); }, "delete with a stale version");
  EXPECT(s->get("cas").has_value(), "stale delete removed the task");
  upd.expected_version = 1;
  expect_status(Status::conflict, [&] { s->save(make_task("missing", "c", "working", 1), upd); },
                "CAS update of a missing id");
  EXPECT(!s->get("missing").has_value(), "CAS update of a missing id created it");
  s->remove("cas", v2);
  EXPECT(!s->get("cas").has_value(), "delete with the right version failed");
}

void recreate_version(const StoreFactory &fresh) {
  auto s = fresh();
  s->save(make_task("rv", "c", "submitted", 1));
  uint64_t v2 = s->save(make_task("rv", "c", "working", 2));
  s->remove("rv");
  expect_status(Status::not_found, [&] { s->remove("rv", kNoVersion); }, "delete of a missing id with kNoVersion");
  uint64_t v3 = s->save(make_task("rv", "c", "submitted", 3));
  EXPECT(v3 > v2, "a re-created id got version " + std::to_string(v3) + ", not above its old " + std::to_string(v2));
  SaveOptions stale;
  stale.expected_version = v2;
  expect_status(Status::conflict, [&] { s->save(make_task("rv", "c", "failed", 4), stale); },
                "save with the version from before the delete");
  expect_status(Status::conflict, [&] { s->remove("rv", kNoVersion); }, "delete of an existing id with kNoVersion");
}

void invalid_rejected(const StoreFactory &fresh) {
  auto s = fresh();
  Task no_id;
  bool threw = false;
  try {
    s->save(no_id);
  } catch (const InvalidTask &) {
    threw = true;
  }
  EXPECT(threw, "a Task without id was accepted");
  Task bad = make_task("utf", "c", "working", 1);
  const char raw[] = "\xff\xfe";
  bad.json()["contextId"].SetString(raw, 2, bad.allocator());
  threw = false;
  try {
    s->save(bad);
  } catch (const InvalidTask &) {
    threw = true;
  }
  EXPECT(threw, "a Task with invalid UTF-8 was accepted");
  EXPECT(!s->get("utf").has_value(), "the invalid Task reached the store");
}

void large_task(const StoreFactory &fresh) {
  auto s = fresh();
  std::string big(1 << 20, 'x');
  Task t = make_task("big", "c", "completed", 1, ",\"metadata\":{\"blob\":\"" + big + "\"}");
  s->save(t);
  auto r = s->get("big");
  EXPECT(r && r->json.size() == t.to_json().size() && r->json == t.to_json(), "1 MiB task not intact");
}

void concurrency(const StoreFactory &fresh) {
  auto s = fresh();
  const int threads = 8, per_thread = 40, increments = 25;
  s->save(make_task("counter", "c", "working", 1, ",\"metadata\":{\"n\":0}"));
  std::atomic<int> errors{0};
  std::mutex err_mu;
  std::string first_error;
  auto note = [&](const std::string &e) {
    std::lock_guard l(err_mu);
    if (errors++ == 0) first_error = e;
  };
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      try {
        for (int i = 0; i < per_thread; ++i) {
          std::string id = "t" + std::to_string(t) + "-" + std::to_string(i);
          std::string pad(512 + (i * 37) % 900, static_cast<char>('a' + t));
          s->save(make_task(id, "ctx" + std::to_string(t), "working", 1 + i, ",\"metadata\":{\"pad\":\"" + pad + "\"}"));
          // Read a task another thread writes: whole or absent, never torn.
          auto r = s->get("t" + std::to_string((t + 1) % threads) + "-" + std::to_string(i / 2));
          if (r) (void)r->task();
        }
        for (int i = 0; i < increments; ++i) {
          for (int attempt = 0;; ++attempt) {
            auto r = s->get("counter");
            Task c = r->task();
            int n = c.json()["metadata"]["n"].GetInt();
            c.json()["metadata"]["n"].SetInt(n + 1);
            SaveOptions o;
            o.expected_version = r->version;
            try {
              s->save(c, o);
              break;
            } catch (const StoreError &e) {
              if (e.code() != Status::conflict) throw;
              if (attempt > 100000) throw;
            }
          }
        }
      } catch (const std::exception &e) {
        note(e.what());
      }
    });
  }
  for (auto &t : ts) t.join();
  EXPECT(errors == 0, first_error);
  for (int t = 0; t < threads; ++t)
    for (int i = 0; i < per_thread; ++i) {
      std::string id = "t" + std::to_string(t) + "-" + std::to_string(i);
      auto r = s->get(id);
      EXPECT(r.has_value(), "lost " + id);
      Task tk = r->task();
      EXPECT(tk.json()["metadata"]["pad"].GetStringLength() == static_cast<rapidjson::SizeType>(512 + (i * 37) % 900), "torn " + id);
    }
  int n = s->get("counter")->task().json()["metadata"]["n"].GetInt();
  EXPECT(n == threads * increments, "lost update: counter " + std::to_string(n) + " want " +
                                        std::to_string(threads * increments));
  ListQuery qr;
  qr.page_size = 100;
  EXPECT(list_all(*s, qr).size() == static_cast<size_t>(threads * per_thread + 1), "list count after concurrency");
}

void closed_store(const StoreFactory &fresh) {
  auto s = fresh();
  s->save(make_task("cl", "c", "working", 1));
  s->close();
  s->close();  // idempotent
  bool threw = false;
  try {
    s->get("cl");
  } catch (const StoreError &) {
    threw = true;
  }
  EXPECT(threw, "get on a closed store did not throw");
}

// ABI 1.2 TNX_OPEN_READ_ONLY, through the host: a read-only open of a
// location sees what was saved there (persistent stores), and every write
// through it is refused with unsupported, changing nothing.
void read_only_rule(const StoreFactory &fresh) {
  if (!fresh.can_reopen()) throw Skipped("the store factory cannot reopen a location");
  Task t = make_task("ro-1", "c", "working", 5, ",\"metadata\":{\"k\":1}");
  bool persistent = false;
  {
    auto w = fresh();
    w->save(t);
    persistent = (w->info().capabilities & TNX_CAP_PERSISTENT) != 0;
    w->close();  // some stores admit one writer at a time (a lock on the location)
  }
  OpenOptions ro;
  ro.read_only = true;
  auto r = fresh.reopen(ro);
  EXPECT(r->info().read_only, "info().read_only is false on a read-only open");
  if (persistent) {
    auto got = r->get("ro-1");
    EXPECT(got.has_value(), "a read-only open does not see the Task saved before");
    EXPECT(got->json == t.to_json(), "read-only get returned other bytes: " + got->json);
    EXPECT(ids_of(list_all(*r, ListQuery{})) == std::vector<std::string>{"ro-1"}, "read-only list");
  }
  expect_status(Status::unsupported, [&] { r->save(make_task("ro-2", "c", "working", 6)); }, "save when read-only");
  expect_status(Status::unsupported, [&] { r->remove("ro-1"); }, "delete when read-only");
  r->close();
  if (persistent) {
    auto w = fresh.reopen(OpenOptions{});
    EXPECT(w->get("ro-1").has_value(), "the Task is gone after a refused delete");
    EXPECT(!w->get("ro-2").has_value(), "a refused save was stored");
  }
}

// ABI 1.3 count: for every filter combination the number list delivers over
// all pages, kept right across overwrites that move a Task between groups
// (state, owner, tenant, contextId) and across deletes.
void count_rule(const StoreFactory &fresh) {
  auto s = fresh();
  const char *states[] = {"working", "completed", "input-required"};
  const char *owners[] = {"alice", "bob", ""};
  const char *tenants[] = {"t1", ""};
  int n = 0;
  for (int i = 0; i < 30; ++i) {
    SaveOptions o;
    o.owner = owners[i % 3];
    o.tenant = tenants[(i / 3) % 2];
    s->save(make_task("n" + std::to_string(i), "ctx" + std::to_string(i % 4), states[(i / 2) % 3], 10 + i), o);
    ++n;
  }
  // Overwrites that move Tasks between every kind of group, and deletes.
  for (int i = 0; i < 6; ++i) {
    SaveOptions o;
    o.owner = owners[(i + 1) % 3];
    o.tenant = tenants[i % 2];
    s->save(make_task("n" + std::to_string(i), "ctx" + std::to_string((i + 1) % 4), states[i % 3], 100 + i), o);
  }
  s->remove("n7");
  s->remove("n8");
  std::vector<ListQuery> queries;
  queries.emplace_back();
  for (const char *st : states) {
    ListQuery q;
    q.state = st;
    queries.push_back(q);
  }
  for (const char *ow : owners)
    for (const char *te : tenants) {
      ListQuery q;
      q.owner = ow;
      q.tenant = te;
      queries.push_back(q);
      q.state = "working";
      queries.push_back(q);
      q.context_id = "ctx1";
      queries.push_back(q);
    }
  {
    ListQuery q;
    q.owner = "alice";
    queries.push_back(q);
    q = {};
    q.tenant = "";
    queries.push_back(q);
    q = {};
    q.context_id = "ctx2";
    queries.push_back(q);
    q.state = "completed";
    queries.push_back(q);
    q = {};
    q.context_id = "none";
    queries.push_back(q);
    q = {};
    q.after_us = (1767225600LL + 20) * 1000000LL;
    queries.push_back(q);
    q.before_us = (1767225600LL + 102) * 1000000LL;
    queries.push_back(q);
    q.owner = "bob";
    queries.push_back(q);
    q = {};
    q.before_us = (1767225600LL + 15) * 1000000LL;
    queries.push_back(q);
  }
  for (ListQuery q : queries) {
    q.page_size = 7;
    const uint64_t want = list_all(*s, q).size();
    const uint64_t got = s->count(q);
    std::string what = "count(";
    if (q.context_id) what += " contextId=" + q.context_id.value();
    if (q.state) what += " state=" + q.state.value();
    if (q.owner) what += " owner=" + q.owner.value();
    if (q.tenant) what += " tenant=" + q.tenant.value();
    if (q.after_us) what += " after";
    if (q.before_us) what += " before";
    what += " ) = " + std::to_string(got) + " but list delivers " + std::to_string(want);
    EXPECT(got == want, what);
  }
  ListQuery all;
  EXPECT(s->count(all) == static_cast<uint64_t>(n - 2), "count of everything after 2 deletes");
  ListQuery withcursor;
  withcursor.page_size = 3;
  withcursor.cursor = s->list(withcursor).next_cursor;
  EXPECT(s->count(withcursor) == static_cast<uint64_t>(n - 2), "count must ignore the cursor and page size");
  auto e = fresh();
  EXPECT(e->count(ListQuery{}) == 0, "an empty store counts 0");
}

// ABI 1.3 save_batch: all or nothing; a later item sees an earlier one of
// the same id; the failing item is named. A store without batches
// (unsupported) skips the rule.
void save_batch_rule(const StoreFactory &fresh) {
  auto s = fresh();
  const uint64_t v0 = s->save(make_task("sb0", "c", "working", 1));
  Task a = make_task("sb1", "c", "submitted", 2), b = make_task("sb1", "c", "working", 3),
       c = make_task("sb0", "c", "completed", 4);
  std::vector<BatchItem> items(3);
  items[0].task = &a;
  items[0].options.expected_version = kNoVersion;
  items[1].task = &b;
  items[2].task = &c;
  items[2].options.expected_version = v0;
  items[2].options.owner = "alice";
  std::vector<uint64_t> vs;
  try {
    vs = s->save_batch(items);
  } catch (const StoreError &e) {
    if (e.code() == Status::unsupported) throw Skipped("the store saves no batches (save_batch unsupported)");
    throw;
  }
  EXPECT(vs.size() == 3, "save_batch returned " + std::to_string(vs.size()) + " versions for 3 items");
  EXPECT(vs[1] > vs[0], "the second save of an id in a batch must get a greater version");
  auto r = s->get("sb1");
  EXPECT(r && r->state == "working" && r->version == vs[1], "the batch's last save of sb1 is not what is stored");
  r = s->get("sb0");
  EXPECT(r && r->state == "completed" && r->version == vs[2] && r->owner == "alice", "CAS item of the batch");
  // A stale item in the middle: nothing written, that item named.
  Task d = make_task("sb2", "c", "working", 5), e = make_task("sb0", "c", "failed", 6), f = make_task("sb3", "c", "working", 7);
  std::vector<BatchItem> bad(3);
  bad[0].task = &d;
  bad[1].task = &e;
  bad[1].options.expected_version = v0;  // stale
  bad[2].task = &f;
  bool threw = false;
  try {
    s->save_batch(bad);
  } catch (const BatchError &x) {
    threw = true;
    EXPECT(x.code() == Status::conflict, std::string("stale item: ") + status_name(x.code()) + ": " + x.what());
    EXPECT(x.index() == 1, "the failing item is index 1, got " + std::to_string(x.index()));
  }
  EXPECT(threw, "a batch with a stale compare-and-set was accepted");
  EXPECT(!s->get("sb2") && !s->get("sb3"), "a failed batch wrote some of its items");
  EXPECT(s->get("sb0")->state == "completed", "a failed batch changed a stored Task");
}

// ABI 1.2 TNX_OPEN_READ_ONLY at the plugin, not only at the host: (1) a
// read-only open of a location where nothing is stored creates nothing
// (not found, or an empty store; the directory holding it stays empty);
// (2) the plugin itself, called through its vtable, refuses save and
// delete on a read-only store with TNX_EUNSUPPORTED and changes nothing.
// (The host refuses writes through a read-only store whatever the plugin
// does, so only a direct call shows a plugin that ignores the flag.)
void read_only_plugin_rule(const StoreFactory &fresh) {
  auto s = fresh();
  const StoreInfo info = s->info();
  if ((info.capabilities & TNX_CAP_PERSISTENT) == 0) throw Skipped("the store is not persistent");
  if (fresh.can_open_virgin()) {
    std::string where;
    OpenOptions ro;
    ro.read_only = true;
    std::shared_ptr<TaskStore> v;
    try {
      v = fresh.virgin(ro, where);
    } catch (const StoreError &e) {
      EXPECT(e.code() == Status::not_found,
             std::string("a read-only open of a fresh location failed with ") + status_name(e.code()) + ": " + e.what());
    }
    if (v) {
      EXPECT(v->list(ListQuery{}).records.empty(), "a read-only open of a fresh location lists Tasks");
      v->close();
    }
    if (!where.empty()) {
      std::error_code ec;
      std::vector<std::string> made;
      for (const auto &e : std::filesystem::recursive_directory_iterator(where, ec)) made.push_back(e.path().string());
      EXPECT(made.empty(), "a read-only open created " + join(made) + " (TNX_OPEN_READ_ONLY: create nothing)");
    }
  }
  const std::string selector = fresh.last_selector();
  if (info.plugin_path.empty() || info.plugin_path[0] == '<' || selector.empty())
    throw Skipped("no plugin file or selector to call the plugin directly");
  Task t = make_task("ro-raw", "c", "working", 3);
  s->save(t);
  s->close();
  void *lib = ::dlopen(info.plugin_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  EXPECT(lib != nullptr, "cannot dlopen the plugin " + info.plugin_path);
  auto entry = reinterpret_cast<tnx_plugin_entry_fn>(::dlsym(lib, TNX_PLUGIN_ENTRY_NAME));
  const tnx_host_info host = {TNX_HEADER_INIT(tnx_host_info), "toolnexus-conformance", "0"};
  const tnx_plugin_descriptor *d = entry != nullptr ? entry(&host) : nullptr;
  if (d == nullptr || d->header.abi_minor < 2) {
    ::dlclose(lib);
    throw Skipped("the plugin is older than ABI 1.2 and never sees TNX_OPEN_READ_ONLY");
  }
  const std::string scheme = selector.substr(0, selector.find(':'));
  const std::string location = selector.substr(scheme.size() + 1);
  tnx_open_args a{};
  a.header = tnx_header(sizeof a);
  a.scheme = tnx_str{scheme.data(), scheme.size()};
  a.location = tnx_str{location.data(), location.size()};
  a.selector = tnx_str{selector.data(), selector.size()};
  a.flags = TNX_OPEN_READ_ONLY;
  tnx_store *raw = nullptr;
  char err[1024] = {0};
  const tnx_status rc = d->open(&a, &raw, err, sizeof err);
  std::string problem;
  if (rc == TNX_EUNSUPPORTED && d->header.abi_minor >= 6 && location.find(';') != std::string::npos) {
    // A decorator (ABI 1.6) needs the host services this direct call does
    // not offer: refusing cleanly is what it must do. Its read-only opens
    // are checked through the host (read-only-open), its inner plugin's
    // by this rule in that plugin's own run.
    ::dlclose(lib);
    throw Skipped(std::string("a decorator (ABI 1.6): without host services it refuses the open cleanly (") + err +
                  ")");
  }
  if (rc != TNX_OK) {
    problem = std::string("a read-only open of the saved location failed: ") + tnx_err_name(rc) + " " + err;
  } else {
    const std::string json = make_task("ro-raw", "c", "failed", 4).to_json();
    const std::string id = "ro-raw", ctx = "c", state = "failed";
    tnx_task_record r{};
    r.header = tnx_header(sizeof r);
    r.id = tnx_str{id.data(), id.size()};
    r.context_id = tnx_str{ctx.data(), ctx.size()};
    r.state = tnx_str{state.data(), state.size()};
    r.status_time_us = make_task("ro-raw", "c", "failed", 4).status_time_us();
    r.task_json = tnx_str{json.data(), json.size()};
    uint64_t v = 0;
    const tnx_status sr = d->vtable->save(raw, &r, TNX_VERSION_ANY, &v, err, sizeof err);
    const tnx_status dr = d->vtable->del(raw, r.id, TNX_VERSION_ANY, err, sizeof err);
    if (sr != TNX_EUNSUPPORTED)
      problem = std::string("save on a store opened with TNX_OPEN_READ_ONLY returned ") + tnx_err_name(sr) +
                ", not TNX_EUNSUPPORTED (the plugin ignores read-only opens)";
    else if (dr != TNX_EUNSUPPORTED)
      problem = std::string("delete on a store opened with TNX_OPEN_READ_ONLY returned ") + tnx_err_name(dr) +
                ", not TNX_EUNSUPPORTED (the plugin ignores read-only opens)";
    d->vtable->close(raw, err, sizeof err);
  }
  ::dlclose(lib);
  EXPECT(problem.empty(), problem);
  auto w = fresh.reopen(OpenOptions{});
  auto got = w->get("ro-raw");
  EXPECT(got && got->state == "working", "a write refused on a read-only store changed the Task");
}

// The defined symbols of the dynamic symbol table (.dynsym) of the ELF
// shared object at `path`; throws Failure when it cannot be read.
std::vector<std::string> exported_symbols(const std::string &path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw Failure("cannot open the plugin file " + path);
  struct stat st {};
  std::string data;
  if (::fstat(fd, &st) == 0) {
    data.resize(static_cast<size_t>(st.st_size));
    size_t got = 0;
    while (got < data.size()) {
      const ssize_t n = ::read(fd, &data[got], data.size() - got);
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    data.resize(got);
  }
  ::close(fd);
  auto bad = [&](const char *why) { return Failure("the plugin file " + path + " " + why); };
  if (data.size() < sizeof(Elf64_Ehdr) || data.compare(0, 4, ELFMAG) != 0) throw bad("is not an ELF file");
  if (data[EI_CLASS] != ELFCLASS64) throw bad("is not a 64-bit ELF file (this check reads ELF64)");
  Elf64_Ehdr eh;
  std::memcpy(&eh, data.data(), sizeof eh);
  if (eh.e_shoff == 0 || eh.e_shentsize != sizeof(Elf64_Shdr) ||
      eh.e_shoff + uint64_t{eh.e_shnum} * sizeof(Elf64_Shdr) > data.size())
    throw bad("has no readable section headers");
  std::vector<Elf64_Shdr> sh(eh.e_shnum);
  std::memcpy(sh.data(), data.data() + eh.e_shoff, sh.size() * sizeof(Elf64_Shdr));
  std::vector<std::string> out;
  for (const Elf64_Shdr &s : sh) {
    if (s.sh_type != SHT_DYNSYM) continue;
    if (s.sh_link >= sh.size() || s.sh_offset + s.sh_size > data.size()) throw bad("has a damaged .dynsym");
    const Elf64_Shdr &strtab = sh[s.sh_link];
    if (strtab.sh_offset + strtab.sh_size > data.size()) throw bad("has a damaged .dynstr");
    for (uint64_t off = 0; off + sizeof(Elf64_Sym) <= s.sh_size; off += sizeof(Elf64_Sym)) {
      Elf64_Sym sym;
      std::memcpy(&sym, data.data() + s.sh_offset + off, sizeof sym);
      if (sym.st_shndx == SHN_UNDEF) continue;  // imported, not exported
      const unsigned bind = ELF64_ST_BIND(sym.st_info);
      if (bind != STB_GLOBAL && bind != STB_WEAK && bind != STB_GNU_UNIQUE) continue;
      if (ELF64_ST_VISIBILITY(sym.st_other) != STV_DEFAULT && ELF64_ST_VISIBILITY(sym.st_other) != STV_PROTECTED)
        continue;
      if (sym.st_name >= strtab.sh_size) throw bad("has a damaged symbol name");
      out.emplace_back(data.c_str() + strtab.sh_offset + sym.st_name);
    }
  }
  return out;
}

// A plugin exports exactly one symbol, the entry function (ABI rule "one
// export": build with hidden visibility and a version script). Everything
// else it exports can clash with the host's or another plugin's symbols.
void one_export_rule(const StoreFactory &fresh) {
  const StoreInfo info = fresh()->info();
  if (info.plugin_path.empty() || info.plugin_path[0] == '<') throw Skipped("not a plugin loaded from a file");
  std::vector<std::string> syms = exported_symbols(info.plugin_path);
  std::vector<std::string> extra;
  for (const auto &n : syms)
    if (n != TNX_PLUGIN_ENTRY_NAME) extra.push_back(n);
  std::string shown;
  for (size_t i = 0; i < extra.size() && i < 8; ++i) shown += (i ? ", " : "") + extra[i];
  if (extra.size() > 8) shown += ", ...";
  EXPECT(extra.empty(), std::to_string(syms.size()) + " exported symbols in " + info.plugin_path + ", not only " +
                            TNX_PLUGIN_ENTRY_NAME + " (" + shown +
                            "): build with -fvisibility=hidden and a linker version script exporting only the entry");
  EXPECT(syms.size() == 1, std::string("the entry function ") + TNX_PLUGIN_ENTRY_NAME + " is not exported by " +
                               info.plugin_path);
}

void info_rule(const StoreFactory &fresh) {
  auto s = fresh();
  StoreInfo i = s->info();
  EXPECT(!i.scheme.empty(), "info().scheme is empty");
  const uint64_t known = TNX_CAP_THREAD_SAFE | TNX_CAP_PAGINATED_LIST | TNX_CAP_COMPARE_AND_SET |
                         TNX_CAP_DURABLE | TNX_CAP_MULTI_PROCESS | TNX_CAP_PERSISTENT | TNX_CAP_CHANGE_FEED |
                         TNX_CAP_DUE_INDEX;
  EXPECT((i.capabilities & ~known) == 0, "unknown capability bits");
}

}  // namespace

// conformance/change_feed_rule.cpp
void change_feed_rule(const StoreFactory &fresh);
// conformance/due_index_rule.cpp
void due_index_rule(const StoreFactory &fresh);

namespace {

const std::vector<Rule> kRules = {
    {"round-trip-unknown-fields", "a saved Task reads back as the same JSON bytes, unknown fields included", round_trip},
    {"index-fields", "get returns contextId, state, status time, owner and tenant as saved", index_fields},
    {"not-found", "a missing id is not found on get and delete; an empty store lists nothing", not_found},
    {"overwrite", "a second save replaces the first and raises the version", overwrite},
    {"delete", "delete removes exactly one Task; a second delete is not found", remove_rule},
    {"odd-ids", "ids with '/', '..', 300 characters, non-ASCII and case differences are distinct and intact", odd_ids},
    {"list-order-paging", "list is newest status time first, ties by id, paged by a cursor that survives inserts", list_order_paging},
    {"list-filters", "list filters by contextId, state, owner, tenant and a strict time window", list_filters},
    {"bad-cursor", "a malformed cursor is invalid_argument", bad_cursor},
    {"compare-and-set", "a stale expected version is a conflict and writes nothing", compare_and_set},
    {"recreate-version", "a deleted and re-created id never gets back an old version", recreate_version},
    {"invalid-task-rejected", "a Task without id or with invalid UTF-8 never reaches the store", invalid_rejected},
    {"large-task", "a 1 MiB Task round-trips intact", large_task},
    {"concurrency", "8 threads saving, reading and CAS-incrementing lose and tear nothing", concurrency},
    {"close", "through the host, close is idempotent and a closed store refuses calls (a plugin's close runs once)", closed_store},
    {"info", "info() names the scheme and only known capability bits", info_rule},
    {"read-only-open", "a read-only open reads what is stored and refuses every write (ABI 1.2)", read_only_rule},
    {"count", "count equals what list delivers over all pages for every filter, across moves and deletes (ABI 1.3)", count_rule},
    {"save-batch", "save_batch stores all items or none and names the failing one (ABI 1.3)", save_batch_rule},
    {"read-only-plugin", "the plugin itself honours TNX_OPEN_READ_ONLY: creates nothing, refuses save and delete (ABI 1.2)", read_only_plugin_rule},
    {"one-export", "the plugin file exports only the entry function (ELF dynamic symbol table)", one_export_rule},
    {"change-feed", "a store with TNX_CAP_CHANGE_FEED reports every save and delete, in version order, to every listener (ABI 1.4)", change_feed_rule},
    {"due-index", "a store with TNX_CAP_DUE_INDEX keeps each Task's due time and lists what is due before a bound in (due time, id) order, paging with a keyset cursor that misses nothing while Tasks are saved and refuses a malformed one, with the other filters (ABI 1.5)", due_index_rule},
};

std::mutex g_tmp_mu;
std::vector<std::filesystem::path> g_tmp_dirs;

}  // namespace

const std::vector<Rule> &rules() { return kRules; }

std::vector<Result> run(const StoreFactory &fresh, const std::string &filter) {
  std::vector<Result> out;
  for (const auto &r : kRules) {
    if (!filter.empty() && std::string(r.name).find(filter) == std::string::npos) continue;
    Result res;
    res.rule = r.name;
    auto t0 = std::chrono::steady_clock::now();
    try {
      r.run(fresh);
      res.passed = true;
    } catch (const Skipped &e) {
      res.skipped = true;
      res.message = e.what();
    } catch (const std::exception &e) {
      res.message = e.what();
    } catch (...) {
      res.message = "unknown exception";
    }
    res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    out.push_back(std::move(res));
  }
  return out;
}

StoreFactory selector_factory(std::string selector_template, PluginRegistry &registry) {
  auto last = std::make_shared<std::string>();
  auto make = [tmpl = selector_template, &registry, last]() {
    std::string sel = tmpl;
    if (sel.find("{unique}") != std::string::npos) {
      // Process-wide, so tokens never repeat across factories of one run.
      static std::atomic<unsigned> counter{0};
      static const std::string run =
          std::to_string(::getpid()) + "_" + std::to_string(std::random_device{}() % 100000);
      const std::string token = run + "_" + std::to_string(++counter);
      for (size_t p; (p = sel.find("{unique}")) != std::string::npos;) sel.replace(p, 8, token);
    }
    if (sel.find("{tmp}") != std::string::npos) {
      std::string pattern = (std::filesystem::temp_directory_path() / "tnx-conformance-XXXXXX").string();
      if (mkdtemp(pattern.data()) == nullptr) throw Failure("mkdtemp failed");
      {
        std::lock_guard l(g_tmp_mu);
        g_tmp_dirs.emplace_back(pattern);
      }
      size_t p;
      while ((p = sel.find("{tmp}")) != std::string::npos) sel.replace(p, 5, pattern);
    }
    *last = sel;
    return resolve_store(sel, registry);
  };
  auto reopen = [&registry, last](const OpenOptions &options) {
    if (last->empty()) throw std::logic_error("reopen before any store was made");
    return resolve_store(*last, options, registry);
  };
  // A location never made: a fresh {tmp} (watched for what an open
  // creates) or a fresh {unique}.
  StoreFactory::Virgin virgin;
  if (selector_template.find("{tmp}") != std::string::npos || selector_template.find("{unique}") != std::string::npos)
    virgin = [tmpl = selector_template, &registry](const OpenOptions &options, std::string &where) {
      std::string sel = tmpl;
      static std::atomic<unsigned> counter{0};
      const std::string token = "v" + std::to_string(::getpid()) + "_" + std::to_string(++counter);
      for (size_t p; (p = sel.find("{unique}")) != std::string::npos;) sel.replace(p, 8, token);
      where.clear();
      if (sel.find("{tmp}") != std::string::npos) {
        std::string pattern = (std::filesystem::temp_directory_path() / "tnx-conformance-XXXXXX").string();
        if (mkdtemp(pattern.data()) == nullptr) throw Failure("mkdtemp failed");
        {
          std::lock_guard l(g_tmp_mu);
          g_tmp_dirs.emplace_back(pattern);
        }
        // The store's location inside it (e.g. file:{tmp}/store), so that
        // creating the location itself shows.
        for (size_t p; (p = sel.find("{tmp}")) != std::string::npos;) sel.replace(p, 5, pattern + "/fresh");
        where = pattern;
      }
      return resolve_store(sel, options, registry);
    };
  StoreFactory f(std::move(make), std::move(reopen), std::move(virgin));
  f.with_selector([last] { return *last; });
  return f;
}

void cleanup_temp_dirs() {
  std::lock_guard l(g_tmp_mu);
  for (const auto &d : g_tmp_dirs) {
    std::error_code ec;
    std::filesystem::remove_all(d, ec);
  }
  g_tmp_dirs.clear();
}

}  // namespace toolnexus::conformance

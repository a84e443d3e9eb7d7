// conformance/due_index_rule.cpp: the rule for the due index (ABI 1.5,
// tnx_task_record.due_us, TNX_FILTER_DUE_BEFORE; SaveOptions::due_us,
// ListQuery::due_before_us), held by every store that claims
// TNX_CAP_DUE_INDEX.
#include "conformance.hpp"

#include "toolnexus/task_store.h"

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

namespace toolnexus::conformance {

namespace {

#define DUE_EXPECT(cond, what)                                                \
  do {                                                                        \
    if (!(cond)) throw Failure(std::string("expected " #cond ": ") + (what)); \
  } while (0)

constexpr int64_t kBase = 1'900'000'000'000'000;  // 2030-03-17, µs

Task due_task(const std::string &id, const std::string &state, int64_t time_us) {
  Task t = Task::parse("{\"id\":\"" + id + "\",\"contextId\":\"due\",\"status\":{\"state\":\"" + state +
                       "\"},\"kind\":\"task\"}");
  t.set_status(state, rapidjson::Value(), time_us);
  return t;
}

uint64_t save_due(TaskStore &s, const std::string &id, const std::string &state, int64_t time_us, int64_t due_us,
                  const std::string &owner = "") {
  SaveOptions o;
  o.due_us = due_us;
  o.owner = owner;
  return s.save(due_task(id, state, time_us), o);
}

// Every page of `q` (page size `page`), the ids in the order delivered.
// `between` runs after each page but the last (saves while a sweep pages).
std::vector<std::string> due_ids(TaskStore &s, ListQuery q, uint32_t page,
                                 const std::function<void(int)> &between = {}) {
  std::vector<std::string> ids;
  q.page_size = page;
  for (int pages = 0; pages < 1000; ++pages) {
    ListPage p = s.list(q);
    if (!p.next_cursor.empty() && between) between(pages);
    for (const TaskRecord &r : p.records) ids.push_back(r.id);
    if (p.next_cursor.empty()) return ids;
    q.cursor = p.next_cursor;
  }
  throw Failure("a due list did not end after 1000 pages");
}

std::string joined(const std::vector<std::string> &v) {
  std::string out;
  for (const auto &s : v) out += (out.empty() ? "" : ",") + s;
  return "[" + out + "]";
}

}  // namespace

void due_index_rule(const StoreFactory &fresh) {
  auto s = fresh();
  if ((s->info().capabilities & TNX_CAP_DUE_INDEX) == 0) {
    ListQuery q;
    q.due_before_us = kBase;
    bool refused = false;
    try {
      (void)s->list(q);
    } catch (const StoreError &e) {
      refused = e.code() == Status::unsupported;
    }
    DUE_EXPECT(refused, "a due list on a store without TNX_CAP_DUE_INDEX is refused as unsupported");
    throw Skipped("the store keeps no due times (TNX_CAP_DUE_INDEX): the host sweeps by listing");
  }

  // Kept and returned as saved; a re-save replaces it, kNoTime clears it.
  save_due(*s, "d-a", "working", kBase + 5, kBase + 100);
  save_due(*s, "d-b", "working", kBase + 9, kBase + 50, "alice");
  save_due(*s, "d-c", "completed", kBase + 7, kNoTime);
  save_due(*s, "d-d", "input-required", kBase + 9, kBase + 300);
  save_due(*s, "d-e", "working", kBase + 1, kBase + 10);
  DUE_EXPECT(s->get("d-a")->due_us == kBase + 100, "get returns the due time saved");
  DUE_EXPECT(s->get("d-c")->due_us == kNoTime, "a Task saved without one has none");

  // The filter: set and strictly before the bound, in due order (due_us
  // ascending, ties by id; not the list order), at every page size, with
  // and without the JSON.
  ListQuery q;
  q.due_before_us = kBase + 300;
  for (bool omit : {false, true})
    for (uint32_t page : {1u, 2u, 50u}) {
      q.omit_json = omit;
      const auto ids = due_ids(*s, q, page);
      DUE_EXPECT((ids == std::vector<std::string>{"d-e", "d-b", "d-a"}),
                 "due before +300 (page " + std::to_string(page) + (omit ? ", omit_json" : "") +
                     ") is [d-e,d-b,d-a] (due_us order), got " + joined(ids));
    }
  q.omit_json = false;
  q.due_before_us = kBase + 301;
  DUE_EXPECT(due_ids(*s, q, 50) == (std::vector<std::string>{"d-e", "d-b", "d-a", "d-d"}),
             "due before +301 adds d-d last, got " + joined(due_ids(*s, q, 50)));
  DUE_EXPECT(s->count(q) == 4, "count with the due filter is " + std::to_string(s->count(q)) + ", not 4");
  q.due_before_us = kBase + 10;
  DUE_EXPECT(due_ids(*s, q, 50).empty(), "nothing is due before +10 (d-e is due at +10 exactly)");

  // With the other filters.
  ListQuery f;
  f.due_before_us = kBase + 1000;
  f.owner = "alice";
  DUE_EXPECT(due_ids(*s, f, 50) == std::vector<std::string>{"d-b"}, "due and owner alice is [d-b]");
  f = ListQuery{};
  f.due_before_us = kBase + 1000;
  f.state = "working";
  DUE_EXPECT((due_ids(*s, f, 1) == std::vector<std::string>{"d-e", "d-b", "d-a"}),
             "due and working is [d-e,d-b,d-a], got " + joined(due_ids(*s, f, 1)));

  // Ties of due time by id; a bad cursor is refused (invalid argument).
  save_due(*s, "d-f", "working", kBase + 2, kBase + 50);
  save_due(*s, "d-0", "working", kBase + 3, kBase + 50);
  q.due_before_us = kBase + 301;
  DUE_EXPECT((due_ids(*s, q, 1) == std::vector<std::string>{"d-e", "d-0", "d-b", "d-f", "d-a", "d-d"}),
             "ties at +50 by id: [d-e,d-0,d-b,d-f,d-a,d-d], got " + joined(due_ids(*s, q, 1)));
  for (const char *bad : {"garbage", "d", "dx.00", "d12.0", "d12.zz", "d.61"}) {
    ListQuery b = q;
    b.cursor = bad;
    bool refused = false;
    try {
      (void)s->list(b);
    } catch (const StoreError &e) {
      refused = e.code() == Status::invalid_argument;
    }
    DUE_EXPECT(refused, std::string("a due list with the malformed cursor '") + bad + "' is refused as invalid");
  }
  // A list's own cursor is not a due list's (nor the other way round).
  {
    ListQuery plain;
    plain.page_size = 1;
    const std::string list_cursor = s->list(plain).next_cursor;
    ListQuery b = q;
    b.page_size = 1;
    b.cursor = list_cursor;
    bool refused = false;
    try {
      (void)s->list(b);
    } catch (const StoreError &e) {
      refused = e.code() == Status::invalid_argument;
    }
    DUE_EXPECT(refused, "a due list given a plain list's cursor '" + list_cursor + "' is refused as invalid");
  }
  s->remove("d-f");
  s->remove("d-0");

  // A re-save moves it (later, earlier, none); a delete takes it out.
  save_due(*s, "d-a", "working", kBase + 5, kBase + 2000);
  save_due(*s, "d-e", "completed", kBase + 1, kNoTime);
  save_due(*s, "d-c", "completed", kBase + 7, kBase + 20);
  s->remove("d-b");
  q.due_before_us = kBase + 1000;
  DUE_EXPECT((due_ids(*s, q, 50) == std::vector<std::string>{"d-c", "d-d"}),
             "after the re-saves and the delete, due before +1000 is [d-c,d-d], got " + joined(due_ids(*s, q, 50)));
  DUE_EXPECT(s->get("d-e")->due_us == kNoTime, "a re-save without a due time clears it");

  // A due list does not walk what is not due: many Tasks without a due
  // time (and far in the future) change nothing in it.
  for (int i = 0; i < 300; ++i) {
    SaveOptions o;
    if (i % 3 == 0) o.due_us = kBase + 1'000'000;
    s->save(due_task("n-" + std::to_string(i), "completed", kBase + 100 + i), o);
  }
  DUE_EXPECT((due_ids(*s, q, 1) == std::vector<std::string>{"d-c", "d-d"}),
             "300 Tasks not due leave the due list [d-c,d-d], got " + joined(due_ids(*s, q, 1)));

  // Paging while Tasks are saved between pages (a sweep that settles what
  // it reads): 40 due, a page of 7; after each page a new Task due later
  // than the cursor and one due earlier, and one of the 40 not yet read is
  // re-saved with the same due time. Every one of the 40 comes exactly
  // once, in due order.
  {
    ListQuery w;
    w.due_before_us = kBase + 900'000;
    w.state = "submitted";
    std::vector<std::string> want;
    for (int i = 0; i < 40; ++i) {
      // Due times 10_000 apart, saved in an order unrelated to them.
      const int k = (i * 17) % 40;
      save_due(*s, "w-" + std::to_string(k), "submitted", kBase + 50 + i, kBase + 100'000 + k * 10'000);
    }
    for (int k = 0; k < 40; ++k) want.push_back("w-" + std::to_string(k));
    std::sort(want.begin(), want.end(), [](const std::string &a, const std::string &b) {
      return std::stoi(a.substr(2)) < std::stoi(b.substr(2));
    });
    const auto got = due_ids(*s, w, 7, [&](int page) {
      save_due(*s, "late-" + std::to_string(page), "completed", kBase + 1, kBase + 800'000 + page);
      save_due(*s, "early-" + std::to_string(page), "submitted", kBase + 1, kBase + 95'000 + page);
      const int k = 39 - page;
      save_due(*s, "w-" + std::to_string(k), "submitted", kBase + 500 + page, kBase + 100'000 + k * 10'000);
    });
    DUE_EXPECT(got == want, "paging (7 a page) with saves between pages delivers w-0..w-39 once each in due "
                            "order, got " + joined(got));
  }

  // Kept across a reopen (a persistent store).
  if ((s->info().capabilities & TNX_CAP_PERSISTENT) != 0 && fresh.can_reopen()) {
    s->close();
    auto again = fresh.reopen(OpenOptions{});
    DUE_EXPECT(again->get("d-d")->due_us == kBase + 300, "the due time survives a reopen");
    DUE_EXPECT((due_ids(*again, q, 1) == std::vector<std::string>{"d-c", "d-d"}),
               "after a reopen the due list is [d-c,d-d], got " + joined(due_ids(*again, q, 1)));
  }
}

}  // namespace toolnexus::conformance

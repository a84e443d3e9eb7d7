// conformance/due_index_rule.cpp: the rule for the due index (ABI 1.5,
// tnx_task_record.due_us, TNX_FILTER_DUE_BEFORE; SaveOptions::due_us,
// ListQuery::due_before_us), held by every store that claims
// TNX_CAP_DUE_INDEX.
#include "conformance.hpp"

#include "toolnexus/task_store.h"

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
std::vector<std::string> due_ids(TaskStore &s, ListQuery q, uint32_t page) {
  std::vector<std::string> ids;
  q.page_size = page;
  for (int pages = 0; pages < 1000; ++pages) {
    ListPage p = s.list(q);
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

  // The filter: set and strictly before the bound, in list order (newest
  // status first, ties by id), at every page size.
  ListQuery q;
  q.due_before_us = kBase + 300;
  for (uint32_t page : {1u, 2u, 50u}) {
    const auto ids = due_ids(*s, q, page);
    DUE_EXPECT((ids == std::vector<std::string>{"d-b", "d-a", "d-e"}),
               "due before +300 (page " + std::to_string(page) + ") is [d-b,d-a,d-e], got " + joined(ids));
  }
  q.due_before_us = kBase + 301;
  DUE_EXPECT(due_ids(*s, q, 50) == (std::vector<std::string>{"d-b", "d-d", "d-a", "d-e"}),
             "due before +301 adds d-d, got " + joined(due_ids(*s, q, 50)));
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
  DUE_EXPECT((due_ids(*s, f, 50) == std::vector<std::string>{"d-b", "d-a", "d-e"}),
             "due and working is [d-b,d-a,d-e], got " + joined(due_ids(*s, f, 50)));

  // A re-save moves it (later, earlier, none); a delete takes it out.
  save_due(*s, "d-a", "working", kBase + 5, kBase + 2000);
  save_due(*s, "d-e", "completed", kBase + 1, kNoTime);
  save_due(*s, "d-c", "completed", kBase + 7, kBase + 20);
  s->remove("d-b");
  q.due_before_us = kBase + 1000;
  DUE_EXPECT((due_ids(*s, q, 50) == std::vector<std::string>{"d-d", "d-c"}),
             "after the re-saves and the delete, due before +1000 is [d-d,d-c], got " + joined(due_ids(*s, q, 50)));
  DUE_EXPECT(s->get("d-e")->due_us == kNoTime, "a re-save without a due time clears it");

  // A due list does not walk what is not due: many Tasks without a due
  // time (and far in the future) change nothing in it.
  for (int i = 0; i < 300; ++i) {
    SaveOptions o;
    if (i % 3 == 0) o.due_us = kBase + 1'000'000;
    s->save(due_task("n-" + std::to_string(i), "completed", kBase + 100 + i), o);
  }
  DUE_EXPECT((due_ids(*s, q, 1) == std::vector<std::string>{"d-d", "d-c"}),
             "300 Tasks not due leave the due list [d-d,d-c], got " + joined(due_ids(*s, q, 1)));

  // Kept across a reopen (a persistent store).
  if ((s->info().capabilities & TNX_CAP_PERSISTENT) != 0 && fresh.can_reopen()) {
    s->close();
    auto again = fresh.reopen(OpenOptions{});
    DUE_EXPECT(again->get("d-d")->due_us == kBase + 300, "the due time survives a reopen");
    DUE_EXPECT((due_ids(*again, q, 50) == std::vector<std::string>{"d-d", "d-c"}),
               "after a reopen the due list is [d-d,d-c], got " + joined(due_ids(*again, q, 50)));
  }
}

}  // namespace toolnexus::conformance

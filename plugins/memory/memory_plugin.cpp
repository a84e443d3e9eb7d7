// plugins/memory: the "memory" scheme. Tasks live in this process only.
//
// Thread-safe (a shared mutex: reads in parallel, writes exclusive), copies
// everything it is given, keeps an ordered index so list is a range scan,
// and counters by (owner, tenant, state) and (contextId, owner, tenant,
// state) so that count (ABI 1.3) visits no Task unless a time window is
// asked for (then it walks only the window of the ordered index).
// Change feed (ABI 1.4): every save and delete is reported to the host's
// sink under the write lock, so an id's versions arrive in order.
// Due index (ABI 1.5): the records with a due time, ordered by (due time,
// id), kept by every save and delete, so a TNX_FILTER_DUE_BEFORE list is a
// walk of that map from its cursor (sdk::DueKey) in the due list's order:
// a page visits the records it delivers (and those the other filters skip).
// Built against the SDK only.
#include "toolnexus/plugin.hpp"

#include "../common/task_counts.hpp"

#include <climits>
#include <map>
#include <algorithm>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <string>
#include <tuple>
#include <unordered_map>

namespace {

using toolnexus::sdk::DueKey;
using toolnexus::sdk::Error;
using toolnexus::sdk::ListKey;
using toolnexus::sdk::view;
using toolnexus::sdk::quote;

struct Entry {
  std::string context_id, state, owner, tenant, json;
  int64_t time_us = TNX_TIME_NONE;
  int64_t due_us = TNX_TIME_NONE;
  uint64_t version = 0;
};

// Orders (time, id) as list wants: newest first, then id ascending.
struct ListOrder {
  bool operator()(const std::pair<int64_t, std::string> &a,
                  const std::pair<int64_t, std::string> &b) const noexcept {
    if (a.first != b.first) return a.first > b.first;
    return a.second < b.second;
  }
};

class MemoryStore final : public toolnexus::sdk::Store {
 public:
  bool get(std::string_view id, const toolnexus::sdk::RecordOut &out) override {
    std::shared_lock lock(mu_);
    auto it = tasks_.find(std::string(id));
    if (it == tasks_.end()) return false;
    out(record(it->first, it->second, false));
    return true;
  }

  uint64_t save(const tnx_task_record &rec, uint64_t expected) override {
    std::string id(view(rec.id));
    std::unique_lock lock(mu_);
    auto it = tasks_.find(id);
    const uint64_t current = it == tasks_.end() ? 0 : it->second.version;
    if (expected != TNX_VERSION_ANY && expected != current)
      throw Error(TNX_ECONFLICT, "save of task " + quote(id) + ": expected version " +
                                     std::to_string(expected) + ", stored " + std::to_string(current));
    const uint64_t version = apply(id, it, rec);
    feed_.saved(id, version);
    return version;
  }

  // ABI 1.3: every compare-and-set is checked (in order, a later record of
  // an id seeing the earlier one's version) before anything is applied.
  void save_batch(const tnx_task_record *const *recs, const uint64_t *expected, uint64_t n,
                  uint64_t *out) override {
    std::unique_lock lock(mu_);
    std::unordered_map<std::string_view, uint64_t> pending;
    uint64_t next = last_version_;
    for (uint64_t i = 0; i < n; ++i) {
      const std::string_view id = view(recs[i]->id);
      auto p = pending.find(id);
      uint64_t current = 0;
      if (p != pending.end()) {
        current = p->second;
      } else if (auto it = tasks_.find(std::string(id)); it != tasks_.end()) {
        current = it->second.version;
      }
      if (expected[i] != TNX_VERSION_ANY && expected[i] != current)
        throw toolnexus::sdk::BatchError(i, TNX_ECONFLICT,
                                         "save of task " + quote(id) + " (record " + std::to_string(i) +
                                             " of the batch): expected version " + std::to_string(expected[i]) +
                                             ", stored " + std::to_string(current) + "; nothing written");
      pending[id] = ++next;
    }
    for (uint64_t i = 0; i < n; ++i) {
      std::string id(view(recs[i]->id));
      auto it = tasks_.find(id);
      out[i] = apply(id, it, *recs[i]);
      feed_.saved(id, out[i]);
    }
  }

  bool keeps_due() const noexcept override { return true; }
  void watch(tnx_change_sink sink, void *ctx) override { feed_.start(sink, ctx); }
  void unwatch() override {
    if (!feed_.stop()) throw Error(TNX_EINVAL, "unwatch: no change feed runs");
  }
  void close() override { feed_.stop(); }

  void del(std::string_view id_view, uint64_t expected) override {
    std::string id(id_view);
    std::unique_lock lock(mu_);
    auto it = tasks_.find(id);
    if (it == tasks_.end()) throw Error(TNX_ENOTFOUND, "no task with id " + quote(id));
    if (expected != TNX_VERSION_ANY && expected != it->second.version)
      throw Error(TNX_ECONFLICT, "delete of task " + quote(id) + ": expected version " +
                                     std::to_string(expected) + ", stored " +
                                     std::to_string(it->second.version));
    order_.erase({it->second.time_us, id});
    unindex_context(it->second, id);
    unindex_due(it->second, id);
    const Entry &e = it->second;
    counts_.add(e.context_id, e.state, e.owner, e.tenant, -1);
    const uint64_t had = e.version;
    tasks_.erase(it);
    feed_.deleted(id, had);
  }

  uint64_t count(const tnx_list_query &q) override {
    std::shared_lock lock(mu_);
    if (toolnexus::plugins::TaskCounts::answers(q)) return counts_.count(q);
    if (q.filter_flags & TNX_FILTER_DUE_BEFORE) {
      uint64_t n = 0;
      for (auto it = due_.begin(); it != due_.end() && it->first.first < q.due_before_us; ++it) {
        const Entry &e = it->second->second;
        if (toolnexus::sdk::matches(q, e.context_id, e.state, e.owner, e.tenant, e.time_us, e.due_us)) ++n;
      }
      return n;
    }
    // A time window: walk that window of the list order only.
    auto it = order_.begin();
    if (q.filter_flags & TNX_FILTER_BEFORE) {
      if (q.before_us == INT64_MIN) return 0;
      it = order_.lower_bound({q.before_us - 1, std::string()});  // first time < before
    }
    uint64_t n = 0;
    for (; it != order_.end(); ++it) {
      const Entry &e = it->second->second;
      if ((q.filter_flags & TNX_FILTER_AFTER) && !(e.time_us > q.after_us)) break;
      if (toolnexus::sdk::matches(q, e.context_id, e.state, e.owner, e.tenant, e.time_us)) ++n;
    }
    return n;
  }

  std::string list(const tnx_list_query &q, const toolnexus::sdk::RecordOut &out) override {
    const uint32_t limit = toolnexus::sdk::page_size(q);
    std::shared_lock lock(mu_);
    if (q.filter_flags & TNX_FILTER_DUE_BEFORE) return list_due(q, limit, out);
    // A contextId filter walks that context's own ordered index.
    const Order *order = &order_;
    if (q.filter_flags & TNX_FILTER_CONTEXT_ID) {
      auto c = by_context_.find(std::string(view(q.context_id)));
      if (c == by_context_.end()) return std::string();
      order = &c->second;
    }
    auto it = order->begin();
    if (q.cursor.len != 0) {
      ListKey k = ListKey::decode(view(q.cursor));
      it = order->upper_bound({k.time_us, k.id});
    }
    uint32_t n = 0;
    ListKey last;
    for (; it != order->end(); ++it) {
      const std::string &id = it->second->first;
      const Entry &e = it->second->second;
      if (!toolnexus::sdk::matches(q, e.context_id, e.state, e.owner, e.tenant, e.time_us)) continue;
      // One more match after a full page: there is a next page, which starts
      // after the last record delivered.
      if (n == limit) return last.encode();
      if (!out(record(id, e, q.omit_json != 0))) return std::string();
      last = ListKey{e.time_us, id};
      ++n;
    }
    return std::string();
  }

 private:
  using Node = std::pair<const std::string, Entry>;

  // A page of a due list (see list()): the due index walked from the
  // cursor in (due time, id) order, up to the bound; mu_ held.
  std::string list_due(const tnx_list_query &q, uint32_t limit, const toolnexus::sdk::RecordOut &out) const {
    auto it = due_.begin();
    if (q.cursor.len != 0) {
      DueKey k = DueKey::decode(view(q.cursor));
      it = due_.upper_bound({k.due_us, std::move(k.id)});
    }
    uint32_t n = 0;
    const Node *last = nullptr;
    for (; it != due_.end() && it->first.first < q.due_before_us; ++it) {
      const Entry &e = it->second->second;
      if (!toolnexus::sdk::matches(q, e.context_id, e.state, e.owner, e.tenant, e.time_us, e.due_us)) continue;
      // One more match after a full page: a next page, after the last one.
      if (n == limit) return DueKey{last->second.due_us, last->first}.encode();
      if (!out(record(it->second->first, e, q.omit_json != 0))) return std::string();
      last = it->second;
      ++n;
    }
    return std::string();
  }

  void unindex_due(const Entry &e, const std::string &id) {
    if (e.due_us != TNX_TIME_NONE) due_.erase({e.due_us, id});
  }

  // Stores `rec` under `id` (`it`: its entry or end()), with the mutex held
  // exclusively; returns the new version.
  uint64_t apply(std::string id, std::unordered_map<std::string, Entry>::iterator it, const tnx_task_record &rec) {
    if (it == tasks_.end()) {
      it = tasks_.emplace(id, Entry{}).first;
    } else {
      order_.erase({it->second.time_us, id});
      unindex_context(it->second, id);
      unindex_due(it->second, id);
    }
    Entry &e = it->second;
    const std::string_view ctx = view(rec.context_id), state = view(rec.state), owner = view(rec.owner),
                           tenant = view(rec.tenant);
    const bool fresh = e.version == 0;
    if (fresh || e.context_id != ctx || e.state != state || e.owner != owner || e.tenant != tenant) {
      if (!fresh) counts_.add(e.context_id, e.state, e.owner, e.tenant, -1);
      counts_.add(ctx, state, owner, tenant, +1);
    }
    e.context_id.assign(ctx);
    e.state.assign(state);
    e.owner.assign(owner);
    e.tenant.assign(tenant);
    e.json.assign(view(rec.task_json));
    e.time_us = rec.status_time_us;
    e.due_us = toolnexus::sdk::due_of(rec);
    if (e.due_us != TNX_TIME_NONE) due_.emplace(std::make_pair(e.due_us, id), &*it);
    // One counter for the whole store: a deleted and re-created id never
    // gets back a version it had (the ABI's version rule).
    e.version = ++last_version_;
    by_context_[e.context_id].emplace(std::make_pair(e.time_us, id), &*it);
    order_.emplace(std::make_pair(e.time_us, std::move(id)), &*it);
    return e.version;
  }

  void unindex_context(const Entry &e, const std::string &id) {
    auto c = by_context_.find(e.context_id);
    if (c == by_context_.end()) return;
    c->second.erase({e.time_us, id});
    if (c->second.empty()) by_context_.erase(c);
  }

  static tnx_task_record record(const std::string &id, const Entry &e, bool omit_json) {
    tnx_task_record r{};
    r.header = tnx_header(sizeof r);
    r.id = toolnexus::sdk::str(id);
    r.context_id = toolnexus::sdk::str(e.context_id);
    r.state = toolnexus::sdk::str(e.state);
    r.status_time_us = e.time_us;
    r.owner = toolnexus::sdk::str(e.owner);
    r.tenant = toolnexus::sdk::str(e.tenant);
    if (!omit_json) r.task_json = toolnexus::sdk::str(e.json);
    r.version = e.version;
    r.due_us = e.due_us;
    return r;
  }

  toolnexus::sdk::ChangeFeed feed_;
  std::shared_mutex mu_;
  uint64_t last_version_ = 0;  // guarded by mu_ (exclusive)
  toolnexus::plugins::TaskCounts counts_;  // guarded by mu_
  std::unordered_map<std::string, Entry> tasks_;
  // (status time, id) -> the element of tasks_ (pointers to elements of an
  // unordered_map stay valid across rehashing; erased together with it),
  // so list filters without a hash lookup per scanned entry.
  using Order = std::map<std::pair<int64_t, std::string>, const std::pair<const std::string, Entry> *, ListOrder>;
  Order order_;
  // The same order per contextId, for lists filtered by it.
  std::unordered_map<std::string, Order> by_context_;
  // (due time, id) of every record with one, earliest first (ABI 1.5).
  std::map<std::pair<int64_t, std::string>, const Node *> due_;
};

// TNX_OPEN_READ_ONLY: a memory location always "exists" (empty), so a
// read-only open gives an empty store; the helper refuses save and del.
toolnexus::sdk::Store *open_memory(const tnx_open_args &args) {
  if (args.location.len != 0)
    throw Error(TNX_EINVAL, "memory store takes no location, got 'memory:" +
                                std::string(view(args.location)) + "'");
  return new MemoryStore();
}

const char *const kSchemes[] = {"memory", nullptr};

const tnx_plugin_descriptor kDescriptor = {
    TNX_HEADER_INIT(tnx_plugin_descriptor),
    "toolnexus-memory",
    "0.1.0",
    "In-process store: fast, thread-safe, gone when the process exits",
    kSchemes,
    TNX_CAP_THREAD_SAFE | TNX_CAP_PAGINATED_LIST | TNX_CAP_COMPARE_AND_SET | TNX_CAP_CHANGE_FEED |
        TNX_CAP_DUE_INDEX,
    &toolnexus::sdk::open_trampoline<open_memory>,
    nullptr,  // vtable: set in the entry (the helper's vtable is a function-local static)
    "memory",
};

}  // namespace

// The same source is compiled into core as the embedded default, under
// another entry name (core/CMakeLists.txt defines TNX_MEMORY_ENTRY).
#ifndef TNX_MEMORY_ENTRY
#define TNX_MEMORY_ENTRY toolnexus_plugin_entry
#endif

extern "C" TNX_PLUGIN_EXPORT const tnx_plugin_descriptor *TNX_MEMORY_ENTRY(
    const tnx_host_info *host) {
  return toolnexus::sdk::entry<kDescriptor>(host);
}

// plugins/common/task_counts.hpp: counters of stored Tasks by their index
// fields, shared by the in-memory indexes of the memory and file plugins so
// that count (ABI 1.3) answers without visiting the records.
//
// Internal to the built-in plugins (not part of the SDK); header-only, built
// against the SDK header.
#ifndef TOOLNEXUS_PLUGINS_TASK_COUNTS_HPP
#define TOOLNEXUS_PLUGINS_TASK_COUNTS_HPP

#include "toolnexus/plugin.hpp"

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

namespace toolnexus::plugins {

/// How many Tasks are stored for each (owner, tenant, state) and each
/// (contextId, owner, tenant, state). add() keeps it up to date; count()
/// answers a query's equality filters in O(log g + groups visited), where a
/// query with both owner and tenant (what the A2A server asks) or with a
/// contextId visits only the groups of that owner/tenant or context.
/// Not thread-safe: the owner guards it with the lock of its index.
class TaskCounts {
 public:
  /// Adds `delta` (+1 or -1) for a Task with these index fields.
  void add(std::string_view context_id, std::string_view state, std::string_view owner,
           std::string_view tenant, int64_t delta) {
    bump(by_group_, Key3{std::string(owner), std::string(tenant), std::string(state)}, delta);
    bump(by_context_, Key4{std::string(context_id), std::string(owner), std::string(tenant), std::string(state)},
         delta);
  }

  /// True when count() can answer `q` alone: no time window (a time window
  /// needs the ordered index; see the callers).
  static bool answers(const tnx_list_query &q) noexcept {
    return (q.filter_flags & (TNX_FILTER_AFTER | TNX_FILTER_BEFORE)) == 0;
  }

  /// The number of Tasks matching the equality filters of `q` (contextId,
  /// state, owner, tenant). Time filters are ignored (see answers()).
  uint64_t count(const tnx_list_query &q) const {
    const uint32_t f = q.filter_flags;
    const std::string_view ctx = sdk::view(q.context_id), state = sdk::view(q.state),
                           owner = sdk::view(q.owner), tenant = sdk::view(q.tenant);
    auto ok = [&](std::string_view o, std::string_view t, std::string_view s) {
      return (!(f & TNX_FILTER_OWNER) || o == owner) && (!(f & TNX_FILTER_TENANT) || t == tenant) &&
             (!(f & TNX_FILTER_STATE) || s == state);
    };
    uint64_t n = 0;
    if (f & TNX_FILTER_CONTEXT_ID) {
      for (auto it = by_context_.lower_bound(Key4{std::string(ctx), "", "", ""});
           it != by_context_.end() && it->first[0] == ctx; ++it)
        if (ok(it->first[1], it->first[2], it->first[3])) n += it->second;
      return n;
    }
    auto it = by_group_.begin();
    if (f & TNX_FILTER_OWNER)
      it = by_group_.lower_bound(Key3{std::string(owner), (f & TNX_FILTER_TENANT) ? std::string(tenant) : "", ""});
    for (; it != by_group_.end(); ++it) {
      if ((f & TNX_FILTER_OWNER) && it->first[0] != owner) break;
      if ((f & TNX_FILTER_OWNER) && (f & TNX_FILTER_TENANT) && it->first[1] != tenant) break;
      if (ok(it->first[0], it->first[1], it->first[2])) n += it->second;
    }
    return n;
  }

  /// Forgets everything.
  void clear() noexcept {
    by_group_.clear();
    by_context_.clear();
  }

 private:
  using Key3 = std::array<std::string, 3>;
  using Key4 = std::array<std::string, 4>;

  template <class Map, class Key>
  static void bump(Map &m, Key k, int64_t delta) {
    auto it = m.find(k);
    if (it == m.end()) {
      if (delta > 0) m.emplace(std::move(k), static_cast<uint64_t>(delta));
      return;
    }
    if (delta < 0 && it->second <= static_cast<uint64_t>(-delta)) m.erase(it);
    else it->second = static_cast<uint64_t>(static_cast<int64_t>(it->second) + delta);
  }

  std::map<Key3, uint64_t> by_group_;    // owner, tenant, state
  std::map<Key4, uint64_t> by_context_;  // contextId, owner, tenant, state
};

}  // namespace toolnexus::plugins

#endif  // TOOLNEXUS_PLUGINS_TASK_COUNTS_HPP

// plugins/common/task_counts.hpp: counters of stored Tasks by their index
// fields, shared by the in-memory indexes of the memory and file plugins so
// that count (ABI 1.3) answers without visiting the records.
//
// Internal to the built-in plugins (not part of the SDK); header-only, built
// against the SDK header.
#ifndef TOOLNEXUS_PLUGINS_TASK_COUNTS_HPP
#define TOOLNEXUS_PLUGINS_TASK_COUNTS_HPP

#include "toolnexus/plugin.hpp"

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace toolnexus::plugins {

/// How many Tasks are stored for each (owner, tenant, state) and each
/// (contextId, owner, tenant, state). add() keeps it up to date with one
/// hash lookup per map (and a scan of a few states); count() answers a
/// query's equality filters: with owner and tenant (what the A2A server
/// asks) or with a contextId it visits only that group's few entries,
/// otherwise every (owner, tenant) group.
/// Not thread-safe: the owner guards it with the lock of its index.
class TaskCounts {
 public:
  /// Adds `delta` (+1 or -1) for a Task with these index fields.
  void add(std::string_view context_id, std::string_view state, std::string_view owner,
           std::string_view tenant, int64_t delta) {
    key_.assign(owner);
    key_.push_back('\0');
    key_.append(tenant);
    Group &g = groups_[key_];
    if (g.owner.empty() && g.tenant.empty() && g.states.empty()) {
      g.owner.assign(owner);
      g.tenant.assign(tenant);
    }
    bump(g.states, state, std::string_view(), std::string_view(), delta);
    if (g.states.empty()) groups_.erase(key_);
    key_.assign(context_id);
    auto &c = contexts_[key_];
    bump(c, state, owner, tenant, delta);
    if (c.empty()) contexts_.erase(key_);
  }

  /// True when count() can answer `q` alone: no time window (a time window
  /// needs the ordered index; see the callers).
  static bool answers(const tnx_list_query &q) noexcept {
    return (q.filter_flags & (TNX_FILTER_AFTER | TNX_FILTER_BEFORE | TNX_FILTER_DUE_BEFORE)) == 0;
  }

  /// The number of Tasks matching the equality filters of `q` (contextId,
  /// state, owner, tenant). Time filters are ignored (see answers()).
  uint64_t count(const tnx_list_query &q) const {
    const uint32_t f = q.filter_flags;
    const std::string_view ctx = sdk::view(q.context_id), state = sdk::view(q.state),
                           owner = sdk::view(q.owner), tenant = sdk::view(q.tenant);
    uint64_t n = 0;
    if (f & TNX_FILTER_CONTEXT_ID) {
      auto it = contexts_.find(std::string(ctx));
      if (it == contexts_.end()) return 0;
      for (const Slot &s : it->second)
        if ((!(f & TNX_FILTER_OWNER) || s.owner == owner) && (!(f & TNX_FILTER_TENANT) || s.tenant == tenant) &&
            (!(f & TNX_FILTER_STATE) || s.state == state))
          n += s.n;
      return n;
    }
    auto states = [&](const Group &g) {
      uint64_t k = 0;
      for (const Slot &s : g.states)
        if (!(f & TNX_FILTER_STATE) || s.state == state) k += s.n;
      return k;
    };
    if ((f & TNX_FILTER_OWNER) && (f & TNX_FILTER_TENANT)) {
      std::string key(owner);
      key.push_back('\0');
      key.append(tenant);
      auto it = groups_.find(key);
      return it == groups_.end() ? 0 : states(it->second);
    }
    for (const auto &kv : groups_) {
      const Group &g = kv.second;
      if ((f & TNX_FILTER_OWNER) && g.owner != owner) continue;
      if ((f & TNX_FILTER_TENANT) && g.tenant != tenant) continue;
      n += states(g);
    }
    return n;
  }

  /// Forgets everything.
  void clear() noexcept {
    groups_.clear();
    contexts_.clear();
  }

 private:
  struct Slot {
    std::string state, owner, tenant;  // owner/tenant empty in a Group's list
    uint64_t n = 0;
  };
  struct Group {
    std::string owner, tenant;
    std::vector<Slot> states;
  };

  static void bump(std::vector<Slot> &v, std::string_view state, std::string_view owner, std::string_view tenant,
                   int64_t delta) {
    for (size_t i = 0; i < v.size(); ++i) {
      Slot &s = v[i];
      if (s.state != state || s.owner != owner || s.tenant != tenant) continue;
      if (delta < 0 && s.n <= static_cast<uint64_t>(-delta)) {
        v[i] = std::move(v.back());
        v.pop_back();
      } else {
        s.n = static_cast<uint64_t>(static_cast<int64_t>(s.n) + delta);
      }
      return;
    }
    if (delta > 0) v.push_back(Slot{std::string(state), std::string(owner), std::string(tenant), static_cast<uint64_t>(delta)});
  }

  std::unordered_map<std::string, Group> groups_;                // owner '\0' tenant
  std::unordered_map<std::string, std::vector<Slot>> contexts_;  // contextId
  std::string key_;  // scratch key of add()
};

}  // namespace toolnexus::plugins

#endif  // TOOLNEXUS_PLUGINS_TASK_COUNTS_HPP

// core/src/change_hub.hpp: fans one store's change feed out to any number of
// listeners (TaskStore::watch_changes). Internal to core.
#ifndef TOOLNEXUS_CORE_CHANGE_HUB_HPP
#define TOOLNEXUS_CORE_CHANGE_HUB_HPP

#include "toolnexus/task_store.hpp"

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

namespace toolnexus::detail {

/// The listeners of one store's feed. dispatch() calls each in turn under
/// the hub's mutex, so removing a listener (destroying its subscription)
/// waits for a dispatch in progress: once removed, it is never called again.
/// Thread-safe. A listener must not destroy its own subscription (that would
/// wait for itself).
class ChangeHub : public std::enable_shared_from_this<ChangeHub> {
 public:
  /// Registers `listener`; the subscription removes it when destroyed and
  /// keeps the hub alive until then.
  std::unique_ptr<ChangeSubscription> add(ChangeListener listener);

  /// Hands `change` to every listener. A listener that throws is skipped
  /// (the exception goes no further: the caller is a plugin's thread).
  void dispatch(const StoreChange &change) noexcept;

  /// Number of listeners now.
  std::size_t size() const;

 private:
  void remove(uint64_t key);

  mutable std::mutex mu_;
  std::map<uint64_t, ChangeListener> listeners_;
  uint64_t next_ = 1;
};

}  // namespace toolnexus::detail

#endif  // TOOLNEXUS_CORE_CHANGE_HUB_HPP

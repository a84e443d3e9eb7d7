// Internal: the adapter from a plugin's C vtable to the C++ TaskStore.
#ifndef TOOLNEXUS_CORE_PLUGIN_STORE_HPP
#define TOOLNEXUS_CORE_PLUGIN_STORE_HPP

#include "toolnexus/registry.hpp"
#include "toolnexus/task_store.h"
#include "toolnexus/task_store.hpp"

#include <memory>

namespace toolnexus::detail {

/// A plugin that loaded and passed the checks. Owns the library handle (an
/// opaque keep-alive object); shared by every store opened from it, so the
/// library outlives them all.
struct LoadedPlugin {
  std::shared_ptr<void> library;
  const tnx_plugin_descriptor *descriptor = nullptr;
  PluginInfo info;
};

/// Opens a store from `plugin` for "<scheme>:<location>" as `options` say.
/// `display` is the selector with any password masked, for messages. Throws
/// std::invalid_argument when the plugin answers TNX_EINVAL (a bad selector),
/// StoreError for any other failure (internal when the plugin widened its
/// capabilities).
std::shared_ptr<TaskStore> open_plugin_store(std::shared_ptr<LoadedPlugin> plugin,
                                             std::string_view scheme, std::string_view location,
                                             std::string_view selector, const std::string &display,
                                             const OpenOptions &options);

}  // namespace toolnexus::detail

#endif

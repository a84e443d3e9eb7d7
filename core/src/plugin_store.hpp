// Internal: the adapter from a plugin's C vtable to the C++ TaskStore.
#ifndef TOOLNEXUS_CORE_PLUGIN_STORE_HPP
#define TOOLNEXUS_CORE_PLUGIN_STORE_HPP

#include "toolnexus/registry.hpp"
#include "toolnexus/task_store.h"
#include "toolnexus/task_store.hpp"

#include <memory>
#include <string>

namespace toolnexus::detail {

/// A plugin that loaded and passed the checks. Owns the library handle (an
/// opaque keep-alive object); shared by every store opened from it, so the
/// library outlives them all.
struct LoadedPlugin {
  std::shared_ptr<void> library;
  const tnx_plugin_descriptor *descriptor = nullptr;
  PluginInfo info;
};

/// Checks the descriptor a plugin's entry function returned (registry.cpp):
/// "" when it may be loaded, else the reason ("descriptor lists an invalid
/// scheme 'A:b' (...)"). Reads `d` and the strings and vtable it points to,
/// never past the sizes its headers declare for fields newer than ABI 1.0;
/// `d` may be nullptr (the plugin refused this host). Pure; thread-safe.
std::string check_descriptor(const tnx_plugin_descriptor *d);

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

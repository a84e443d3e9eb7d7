// Internal: the adapter from a plugin's C vtable to the C++ TaskStore.
#ifndef TOOLNEXUS_CORE_PLUGIN_STORE_HPP
#define TOOLNEXUS_CORE_PLUGIN_STORE_HPP

#include "toolnexus/registry.hpp"
#include "toolnexus/task_store.h"
#include "toolnexus/task_store.hpp"

#include <functional>
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

/// A selector resolved to the plugin serving its scheme (registry.cpp).
struct ResolvedSelector {
  std::shared_ptr<LoadedPlugin> plugin;
  std::string scheme;    ///< "sqlite"
  std::string location;  ///< everything after "<scheme>:"
  std::string display;   ///< the selector with any password masked, quoted
};

/// Resolves a whole selector; throws std::invalid_argument naming the
/// selector and the schemes on offer when no plugin serves it. Must be
/// callable from any thread while the registry lives.
using SelectorResolver = std::function<ResolvedSelector(std::string_view selector)>;

/// A plugin store opened by the host but not yet wrapped: its handle and
/// its capabilities (the descriptor's, narrowed by open and by every inner
/// store a decorator opened through the host services).
struct RawStore {
  tnx_store *handle = nullptr;
  uint64_t capabilities = 0;
};

/// Opens `r`'s store for `selector` with TNX_OPEN_* `flags`, offering the
/// host services (ABI 1.6, inner_store.cpp) so that a decorator can open
/// its inner store through `resolver`; `depth` counts the decorators around
/// this one (at most kMaxDecoratorDepth). Throws std::invalid_argument when
/// the plugin answers TNX_EINVAL, StoreError otherwise (internal when the
/// plugin widened its capabilities). Thread-safe.
RawStore open_raw(const ResolvedSelector &r, std::string_view selector, uint32_t flags,
                  const SelectorResolver &resolver, int depth);

/// How many decorators may wrap one another in one selector.
inline constexpr int kMaxDecoratorDepth = 8;

/// The host services table (ABI 1.6) of one open: open_inner resolves with
/// `resolver` and opens at `depth` + 1, narrowing `*inner_caps` (starts as
/// every bit) to the capabilities of every inner store it opened. The table
/// and `ctx` live in the caller's frame for the duration of the open.
struct ServicesCtx {
  const SelectorResolver *resolver = nullptr;
  int depth = 0;
  uint64_t inner_caps = ~uint64_t{0};
};
tnx_host_services make_services(ServicesCtx &ctx);

/// Opens a store from `r` for `selector` as `options` say, wrapped as a
/// TaskStore. Throws as open_raw.
std::shared_ptr<TaskStore> open_plugin_store(const ResolvedSelector &r, std::string_view selector,
                                             const OpenOptions &options, const SelectorResolver &resolver);

}  // namespace toolnexus::detail

#endif

// toolnexus/registry.hpp: finds, loads and checks storage plugins, and maps
// selector schemes to them; resolve_store().
#ifndef TOOLNEXUS_REGISTRY_HPP
#define TOOLNEXUS_REGISTRY_HPP

#include "toolnexus/task_store.h"
#include "toolnexus/task_store.hpp"

#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace toolnexus {

/// Environment variable listing plugin directories, colon-separated, searched
/// first.
inline constexpr const char *kPluginPathEnv = "TOOLNEXUS_PLUGIN_PATH";

/// A plugin that loaded and passed the ABI checks.
struct PluginInfo {
  /// Absolute canonical path of the library.
  std::string path;
  std::string name;
  std::string version;
  std::string description;
  std::vector<std::string> schemes;
  /// How a selector is written ("file:<dir>"); "" when the plugin (ABI 1.0)
  /// does not say.
  std::string location_syntax;
  /// TNX_CAP_* bits.
  uint64_t capabilities = 0;
  /// ABI version the plugin was compiled with.
  uint16_t abi_major = 0;
  uint16_t abi_minor = 0;
};

/// A file that was considered and refused, or a plugin directory that was
/// not searched (missing, unreadable, writable by others), with why.
struct PluginFailure {
  std::string path;
  std::string reason;
  /// `path` is a plugin directory of the search path, not a file in one.
  bool directory = false;
};

/// "thread-safe,paginated-list,..." for TNX_CAP_* bits.
std::string capability_names(uint64_t caps);

/// How a store is opened (PluginRegistry::open, resolve_store).
struct OpenOptions {
  /// Inspect only (TNX_OPEN_READ_ONLY, ABI 1.2): the plugin creates,
  /// migrates and repairs nothing, and a location where nothing is stored
  /// is StoreError(not_found) instead of a new empty store. save and remove
  /// on the store throw StoreError(unsupported), whatever the plugin's ABI
  /// minor; a plugin older than ABI 1.2 cannot be kept from creating the
  /// location at open. Used by `toolnexus store get|list|check` and the
  /// source of `store copy`.
  bool read_only = false;
};

/// The plugin registry. Searches, in order: the directories of
/// TOOLNEXUS_PLUGIN_PATH, the directories added with add_directory() (in the
/// order added), then the default directory next to the running binary or the
/// core library (<dir>/../lib/toolnexus/plugins). The first plugin to claim a
/// scheme serves it; a later claim is reported in failures().
///
/// Loading uses Boost.DLL with rtld_now | rtld_local on absolute canonical
/// paths. A loaded library is never unloaded (stores opened from it may live
/// until exit). Thread-safe: every method may be called concurrently.
class PluginRegistry {
 public:
  PluginRegistry();
  ~PluginRegistry();
  PluginRegistry(const PluginRegistry &) = delete;
  PluginRegistry &operator=(const PluginRegistry &) = delete;

  /// The process-wide registry used by resolve_store(selector).
  static PluginRegistry &global();

  /// Appends a directory to search (after the environment's). Takes effect at
  /// the next load()/open(). Does not check that it exists (a missing
  /// directory is reported as a failure when scanned).
  void add_directory(const std::filesystem::path &dir);

  /// When false, TOOLNEXUS_PLUGIN_PATH is not read. Default true.
  void use_environment(bool on);

  /// When false, the default directory next to the binary is not searched.
  /// Default true.
  void use_default_directory(bool on);

  /// Guard rails (on by default): a plugin directory or library file that
  /// is writable by group or others, or owned by a user other than root and
  /// the current one, is refused, as is a symlink that leads outside its
  /// plugin directory or into a subdirectory of it that fails those checks
  /// (any directory between the plugin directory and the library).
  /// allow_insecure(true) turns the permission checks off (the rule that a
  /// symlink stays inside its plugin directory stays). Only regular files named *.so directly inside
  /// a plugin directory are ever considered.
  void allow_insecure(bool on);

  /// The directories searched, in order, as absolute paths.
  std::vector<std::filesystem::path> search_path() const;

  /// The default plugin directory, if one exists next to the running binary
  /// or the core library.
  static std::vector<std::filesystem::path> default_directories();

  /// Scans every directory in search_path() for *.so files not loaded yet
  /// and loads them. Never throws for a bad plugin: it goes to failures().
  void load();

  /// Loads one library file. Returns true when it loaded; otherwise the
  /// reason is in failures() (and returned in `why` when not null).
  bool load_file(const std::filesystem::path &file, std::string *why = nullptr);

  /// Plugins loaded so far (call load() first).
  std::vector<PluginInfo> plugins() const;
  /// Files refused so far, with reasons.
  std::vector<PluginFailure> failures() const;
  /// Schemes served, sorted.
  std::vector<std::string> schemes() const;

  /// Opens a store for "<scheme>:<location>" from the plugin serving the
  /// scheme, as `options` say. Loads plugins in search-path order only until
  /// one serves the scheme (the first one to claim a scheme keeps it, so
  /// the result is what a full load() gives); failures() then holds the
  /// files refused so far. An unknown scheme loads every plugin first.
  /// Throws std::invalid_argument when no plugin serves the scheme (message
  /// quotes the selector and lists the schemes available) and StoreError
  /// when the plugin refuses to open (message names plugin and reason;
  /// not_found for a read-only open of a location with nothing stored;
  /// internal when the plugin widened its capabilities, an ABI breach).
  std::shared_ptr<TaskStore> open(std::string_view selector, const OpenOptions &options = {});

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// resolve_store() with no selector: a new memory store (seed: nil).
std::shared_ptr<TaskStore> resolve_store();

/// The seed's selector table (seed-task-store.md, "resolve_store/1
/// selectors"):
///   ""  or "memory"    -> a new memory store
///   "file:<dir>"       -> a file store in <dir> (created if missing);
///                         "file:" alone is an error
///   "<scheme>:<rest>"  -> the plugin serving <scheme>
///   anything else      -> std::invalid_argument quoting the selector and
///                         listing the available schemes
/// Uses `registry` (PluginRegistry::global() by default).
/// Throws std::invalid_argument (bad selector) or StoreError (the plugin
/// could not open the location).
std::shared_ptr<TaskStore> resolve_store(std::string_view selector);
std::shared_ptr<TaskStore> resolve_store(std::string_view selector, PluginRegistry &registry);
/// The same with OpenOptions (e.g. read_only for inspection). "" and
/// "memory" still give a new, empty memory store.
std::shared_ptr<TaskStore> resolve_store(std::string_view selector, const OpenOptions &options,
                                         PluginRegistry &registry = PluginRegistry::global());
/// Overload so that a string literal picks the selector form.
inline std::shared_ptr<TaskStore> resolve_store(const char *selector) {
  return resolve_store(std::string_view(selector == nullptr ? "" : selector));
}

/// A store object is used as-is: returns `store` itself (seed: "a struct ->
/// used as-is"). A null pointer gives a new memory store, like nil.
std::shared_ptr<TaskStore> resolve_store(std::shared_ptr<TaskStore> store);

}  // namespace toolnexus

#endif  // TOOLNEXUS_REGISTRY_HPP

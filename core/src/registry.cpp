// The plugin registry: finds plugin libraries, loads them with Boost.DLL,
// checks their ABI and descriptor, maps schemes to them; resolve_store().
#include "toolnexus/registry.hpp"

#include "plugin_store.hpp"

#include <boost/dll/runtime_symbol_info.hpp>
#include <boost/dll/shared_library.hpp>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <set>
#include <stdexcept>
#include <system_error>

#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef TOOLNEXUS_VERSION
#define TOOLNEXUS_VERSION "0.0.0"
#endif

// The memory plugin compiled into core as well (see core/CMakeLists.txt), used
// only when no plugin library serves "memory": the embedded default.
extern "C" const tnx_plugin_descriptor *toolnexus_embedded_memory_entry(const tnx_host_info *host);

namespace fs = std::filesystem;

namespace toolnexus {

using detail::LoadedPlugin;

std::string capability_names(uint64_t caps) {
  static const std::pair<uint64_t, const char *> names[] = {
      {TNX_CAP_THREAD_SAFE, "thread-safe"},   {TNX_CAP_PAGINATED_LIST, "paginated-list"},
      {TNX_CAP_COMPARE_AND_SET, "compare-and-set"}, {TNX_CAP_DURABLE, "durable"},
      {TNX_CAP_MULTI_PROCESS, "multi-process"}, {TNX_CAP_PERSISTENT, "persistent"},
      {TNX_CAP_CHANGE_FEED, "change-feed"},   {TNX_CAP_DUE_INDEX, "due-index"},
  };
  std::string out;
  for (const auto &[bit, name] : names) {
    if ((caps & bit) == 0) continue;
    if (!out.empty()) out += ',';
    out += name;
  }
  uint64_t known = 0;
  for (const auto &n : names) known |= n.first;
  if ((caps & ~known) != 0) {
    if (!out.empty()) out += ',';
    out += "unknown-bits";
  }
  return out;
}

namespace {

bool valid_scheme(std::string_view s) noexcept {
  if (s.empty() || s.size() > 64 || !(s[0] >= 'a' && s[0] <= 'z')) return false;
  for (char c : s) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '+' || c == '-' || c == '.';
    if (!ok) return false;
  }
  return true;
}

// The selector for messages: a password in "scheme://user:pass@host" masked.
std::string redact(std::string_view selector) {
  std::string s(selector);
  size_t scheme_end = s.find("://");
  if (scheme_end == std::string::npos) return "'" + s + "'";
  size_t auth_start = scheme_end + 3;
  size_t at = s.find('@', auth_start);
  size_t slash = s.find('/', auth_start);
  if (at != std::string::npos && (slash == std::string::npos || at < slash)) {
    size_t colon = s.find(':', auth_start);
    if (colon != std::string::npos && colon < at) s.replace(colon + 1, at - colon - 1, "***");
  }
  // password=... in a query string
  for (const char *key : {"password=", "PASSWORD="}) {
    size_t p = s.find(key);
    if (p != std::string::npos) {
      size_t v = p + std::string_view(key).size();
      size_t e = s.find('&', v);
      s.replace(v, (e == std::string::npos ? s.size() : e) - v, "***");
    }
  }
  return "'" + s + "'";
}

std::vector<fs::path> split_path_list(const char *value) {
  std::vector<fs::path> out;
  if (value == nullptr) return out;
  std::string_view v(value);
  size_t start = 0;
  while (start <= v.size()) {
    size_t end = v.find(':', start);
    if (end == std::string_view::npos) end = v.size();
    if (end > start) out.emplace_back(std::string(v.substr(start, end - start)));
    start = end + 1;
  }
  return out;
}

fs::path absolute_lexical(const fs::path &p) {
  std::error_code ec;
  fs::path a = fs::absolute(p, ec);
  return (ec ? p : a).lexically_normal();
}

constexpr uint32_t kMinDescriptorSize =
    static_cast<uint32_t>(offsetof(tnx_plugin_descriptor, vtable) + sizeof(void *));
constexpr uint32_t kMinVtableSize = static_cast<uint32_t>(offsetof(tnx_store_vtable, close) + sizeof(void *));

// Why `p` (a plugin file or directory) may not be trusted, or "".
std::string insecure(const fs::path &p, const char *what) {
  struct stat st {};
  if (::stat(p.c_str(), &st) != 0) return std::string("cannot stat ") + what;
  const uid_t me = ::geteuid();
  if (st.st_uid != 0 && st.st_uid != me)
    return std::string(what) + " " + p.string() + " is owned by uid " + std::to_string(st.st_uid) +
           ", neither root nor the current user; refused (use --allow-insecure-plugins to load anyway)";
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0)
    return std::string(what) + " " + p.string() + " is writable by " +
           ((st.st_mode & S_IWOTH) != 0 ? "others" : "its group") +
           "; refused (use --allow-insecure-plugins to load anyway)";
  return {};
}

// Why a plugin candidate of type `t` (from stat(2), which never opens it: a
// FIFO opened for reading would block until a writer came) is not loaded;
// "" for a regular file.
std::string not_regular(fs::file_type t) {
  const char *what = nullptr;
  switch (t) {
    case fs::file_type::regular: return {};
    case fs::file_type::fifo: what = "a FIFO (named pipe)"; break;
    case fs::file_type::socket: what = "a socket"; break;
    case fs::file_type::character: what = "a character device"; break;
    case fs::file_type::block: what = "a block device"; break;
    case fs::file_type::directory: what = "a directory"; break;
    case fs::file_type::not_found: what = "nothing (it does not exist)"; break;
    default: what = "a file of an unknown type"; break;
  }
  return std::string("not a regular file but ") + what + "; only regular *.so files are loaded, this one is skipped";
}

bool inside(const fs::path &child, const fs::path &dir) {
  auto d = dir.begin(), c = child.begin();
  for (; d != dir.end(); ++d, ++c)
    if (c == child.end() || *c != *d) return false;
  return true;
}

const tnx_host_info &host_info() {
  static const tnx_host_info h = {TNX_HEADER_INIT(tnx_host_info), "toolnexus", TOOLNEXUS_VERSION};
  return h;
}

}  // namespace

namespace detail {

std::string check_descriptor(const tnx_plugin_descriptor *d) {
  if (d == nullptr)
    return "entry function returned no descriptor (the plugin refused this host, which speaks ABI " +
           std::to_string(TNX_ABI_MAJOR) + "." + std::to_string(TNX_ABI_MINOR) + ")";
  if (d->header.abi_major != TNX_ABI_MAJOR)
    return "plugin was built for ABI " + std::to_string(d->header.abi_major) + "." +
           std::to_string(d->header.abi_minor) + " but this host speaks ABI " +
           std::to_string(TNX_ABI_MAJOR) + "." + std::to_string(TNX_ABI_MINOR) +
           " (a different major version is never loaded)";
  if (d->header.struct_size < kMinDescriptorSize)
    return "descriptor is " + std::to_string(d->header.struct_size) + " bytes, ABI 1.0 needs at least " +
           std::to_string(kMinDescriptorSize);
  if (d->name == nullptr || d->name[0] == '\0') return "descriptor has no name";
  if (d->version == nullptr) return "descriptor has no version";
  if (d->schemes == nullptr || d->schemes[0] == nullptr) return "descriptor lists no scheme";
  for (const char *const *s = d->schemes; *s != nullptr; ++s) {
    if (!valid_scheme(*s))
      return std::string("descriptor lists an invalid scheme '") + *s +
             "' (lower-case letter first, then [a-z0-9+.-], no colon)";
  }
  if (d->open == nullptr) return "descriptor has no open function";
  const tnx_store_vtable *vt = d->vtable;
  if (vt == nullptr) return "descriptor has no vtable";
  if (vt->header.abi_major != TNX_ABI_MAJOR)
    return "vtable was built for ABI major " + std::to_string(vt->header.abi_major);
  if (vt->header.struct_size < kMinVtableSize)
    return "vtable is " + std::to_string(vt->header.struct_size) + " bytes, ABI 1.0 needs at least " +
           std::to_string(kMinVtableSize);
  if (vt->get == nullptr || vt->save == nullptr || vt->del == nullptr || vt->list == nullptr ||
      vt->close == nullptr)
    return "vtable is missing a function (get, save, del, list and close are all required)";
  const bool has_watch = TNX_HAS_FIELD(vt, tnx_store_vtable, unwatch) && vt->watch != nullptr;
  if (has_watch && vt->unwatch == nullptr) return "vtable has watch but no unwatch (ABI 1.4 needs both)";
  if ((d->capabilities & TNX_CAP_CHANGE_FEED) != 0 && !has_watch)
    return "descriptor claims the change feed (TNX_CAP_CHANGE_FEED) but its vtable has no watch and unwatch "
           "(ABI 1.4)";
  return {};
}

}  // namespace detail

namespace {

PluginInfo info_from(const tnx_plugin_descriptor *d, const std::string &path) {
  PluginInfo i;
  i.path = path;
  i.name = d->name;
  i.version = d->version;
  if (d->description != nullptr) i.description = d->description;
  for (const char *const *s = d->schemes; *s != nullptr; ++s) i.schemes.emplace_back(*s);
  i.capabilities = d->capabilities;
  // ABI 1.1 field: never read past what the plugin's struct holds.
  if (TNX_HAS_FIELD(d, tnx_plugin_descriptor, location_syntax) && d->location_syntax != nullptr)
    i.location_syntax = d->location_syntax;
  i.abi_major = d->header.abi_major;
  i.abi_minor = d->header.abi_minor;
  return i;
}

}  // namespace

struct PluginRegistry::Impl {
  mutable std::mutex mu;
  std::vector<fs::path> added;
  bool use_env = true;
  bool use_default = true;
  bool allow_insecure = false;
  std::set<std::string> seen;  // canonical paths already considered
  std::vector<std::shared_ptr<LoadedPlugin>> loaded;
  std::vector<PluginFailure> failures;
  std::map<std::string, std::shared_ptr<LoadedPlugin>, std::less<>> by_scheme;
  std::shared_ptr<LoadedPlugin> embedded_memory;

  // The plugin serving `selector`'s scheme, loading plugins as needed;
  // throws std::invalid_argument naming the selector (password masked).
  detail::ResolvedSelector resolve(std::string_view selector);

  void fail(const std::string &path, const std::string &reason, bool directory = false) {
    failures.push_back({path, reason, directory});
  }

  // Registers a checked plugin; refuses it when one of its schemes is taken.
  bool add(std::shared_ptr<LoadedPlugin> p, std::string *why) {
    for (const auto &s : p->info.schemes) {
      auto it = by_scheme.find(s);
      if (it != by_scheme.end()) {
        std::string reason = "scheme '" + s + "' is already served by " + it->second->info.path +
                             " (loaded earlier in the search path); this plugin is not used";
        fail(p->info.path, reason);
        if (why != nullptr) *why = reason;
        return false;
      }
    }
    for (const auto &s : p->info.schemes) by_scheme.emplace(s, p);
    loaded.push_back(std::move(p));
    return true;
  }

  bool load_file_locked(const fs::path &file, std::string *why) {
    std::error_code ec;
    fs::path canon = fs::canonical(file, ec);
    std::string shown = ec ? absolute_lexical(file).string() : canon.string();
    auto refuse = [&](const std::string &reason) {
      fail(shown, reason);
      if (why != nullptr) *why = reason;
      return false;
    };
    if (ec) return refuse("cannot resolve path: " + ec.message());
    if (!seen.insert(shown).second) {
      for (const auto &p : loaded)
        if (p->info.path == shown) return true;
      if (why != nullptr) *why = "already refused";
      return false;
    }
    const fs::file_status st = fs::status(canon, ec);
    if (ec) return refuse("cannot stat: " + ec.message());
    if (const std::string bad_type = not_regular(st.type()); !bad_type.empty()) return refuse(bad_type);

    boost::dll::shared_library lib;
    boost::dll::fs::error_code lec;
    lib.load(canon, boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local, lec);
    if (lec || !lib.is_loaded()) {
      // Boost's error code says little ("Bad file descriptor"); dlerror()
      // says why (not an ELF file, a missing dependency, ...).
      std::string reason = lec.message();
      if (void *h = ::dlopen(canon.c_str(), RTLD_NOW | RTLD_LOCAL); h != nullptr) {
        ::dlclose(h);
      } else if (const char *e = ::dlerror(); e != nullptr) {
        reason = e;
      }
      return refuse("not a loadable shared library: " + reason);
    }
    if (!lib.has(TNX_PLUGIN_ENTRY_NAME))
      return refuse(std::string("not a toolnexus plugin: no exported function '") + TNX_PLUGIN_ENTRY_NAME + "'");
    auto entry = lib.get<const tnx_plugin_descriptor *(const tnx_host_info *)>(TNX_PLUGIN_ENTRY_NAME);
    const tnx_plugin_descriptor *d = entry(&host_info());
    std::string bad = detail::check_descriptor(d);
    if (!bad.empty()) return refuse(bad);

    auto p = std::make_shared<LoadedPlugin>();
    // The library is kept alive by every LoadedPlugin copy and so by every
    // store opened from it.
    p->library = std::make_shared<boost::dll::shared_library>(std::move(lib));
    p->descriptor = d;
    p->info = info_from(d, shown);
    return add(std::move(p), why);
  }

  std::vector<fs::path> search_path() const {
    std::vector<fs::path> dirs;
    if (use_env)
      for (auto &d : split_path_list(std::getenv(kPluginPathEnv))) dirs.push_back(absolute_lexical(d));
    for (auto &d : added) dirs.push_back(absolute_lexical(d));
    if (use_default)
      for (auto &d : PluginRegistry::default_directories()) dirs.push_back(d);
    std::vector<fs::path> unique;
    for (auto &d : dirs)
      if (std::find(unique.begin(), unique.end(), d) == unique.end()) unique.push_back(d);
    return unique;
  }

  // Loads the plugins of the search path in order (directories in order,
  // files sorted by name), skipping what is loaded or refused already. With
  // `want`, stops as soon as a plugin serves that scheme: the first plugin
  // in that order keeps a scheme, so the ones after it cannot change which
  // plugin serves it, and `store list file:...` need not load libpq and
  // its 27 libraries (5 ms of a 45 ms listing).
  void load_locked(std::string_view want = {}) {
    const auto found = [&] { return !want.empty() && by_scheme.find(want) != by_scheme.end(); };
    if (found()) return;
    for (const auto &dir : search_path()) {
      std::error_code ec;
      if (!fs::is_directory(dir, ec)) {
        std::string key = "dir:" + dir.string();
        if (seen.insert(key).second) fail(dir.string(), "plugin directory does not exist or is not a directory", true);
        continue;
      }
      fs::path canon_dir = fs::canonical(dir, ec);
      if (ec) {
        fail(dir.string(), "cannot resolve plugin directory: " + ec.message(), true);
        continue;
      }
      if (!allow_insecure) {
        std::string why = insecure(canon_dir, "plugin directory");
        if (!why.empty()) {
          if (seen.insert("dir:" + canon_dir.string()).second) fail(canon_dir.string(), why, true);
          continue;
        }
      }
      std::vector<fs::path> files;
      for (fs::directory_iterator it(canon_dir, ec), end; !ec && it != end; it.increment(ec)) {
        const fs::path &p = it->path();
        if (p.extension() != ".so") continue;
        std::error_code sec;
        if (it->is_symlink(sec)) {
          fs::path target = fs::canonical(p, sec);
          if (sec || !inside(target, canon_dir)) {
            if (seen.insert("link:" + p.string()).second)
              fail(p.string(), sec ? "broken symlink" : "symlink leads outside its plugin directory (to " +
                                                            target.string() + "); refused");
            continue;
          }
          // Into a subdirectory: every directory on the way is held to the
          // same rules as the plugin directory (a writable one lets anyone
          // swap the library).
          std::string why;
          if (!allow_insecure)
            for (fs::path d = target.parent_path(); why.empty() && d != canon_dir && inside(d, canon_dir);
                 d = d.parent_path())
              why = insecure(d, "directory");
          if (!why.empty()) {
            if (seen.insert("link:" + p.string()).second)
              fail(p.string(), "symlink leads to " + target.string() + " through " + why);
            continue;
          }
        }
        // Subdirectories are not looked into (a directory named *.so is
        // not a plugin file and says nothing); any other file that is not
        // regular (a FIFO, a socket, a device) is reported, never opened.
        const fs::file_status st = it->status(sec);
        if (!sec && st.type() == fs::file_type::directory) continue;
        const std::string bad_type = sec ? "cannot stat: " + sec.message() : not_regular(st.type());
        if (!bad_type.empty()) {
          if (seen.insert("special:" + p.string()).second) fail(p.string(), bad_type);
          continue;
        }
        files.push_back(p);
      }
      if (ec) {
        fail(dir.string(), "cannot read plugin directory: " + ec.message(), true);
        continue;
      }
      std::sort(files.begin(), files.end());
      for (const auto &f : files) {
        if (!allow_insecure) {
          std::error_code cec;
          fs::path real = fs::canonical(f, cec);
          std::string why = insecure(cec ? f : real, "plugin file");
          if (!why.empty()) {
            if (seen.insert((cec ? f : real).string()).second) fail((cec ? f : real).string(), why);
            continue;
          }
        }
        load_file_locked(f, nullptr);
        if (found()) return;
      }
    }
    // The embedded memory store is the fallback for "memory" only.
    if (by_scheme.find("memory") == by_scheme.end()) {
      if (!embedded_memory) {
        const tnx_plugin_descriptor *d = toolnexus_embedded_memory_entry(&host_info());
        embedded_memory = std::make_shared<LoadedPlugin>();
        embedded_memory->descriptor = d;
        embedded_memory->info = info_from(d, "<embedded in libtoolnexus>");
      }
      by_scheme.emplace("memory", embedded_memory);
      loaded.push_back(embedded_memory);
    }
  }
};

PluginRegistry::PluginRegistry() : impl_(std::make_unique<Impl>()) {}
PluginRegistry::~PluginRegistry() = default;

PluginRegistry &PluginRegistry::global() {
  // Never destroyed: stores may outlive static destruction order.
  static PluginRegistry *r = new PluginRegistry();
  return *r;
}

void PluginRegistry::add_directory(const fs::path &dir) {
  std::lock_guard lock(impl_->mu);
  impl_->added.push_back(dir);
}

void PluginRegistry::use_environment(bool on) {
  std::lock_guard lock(impl_->mu);
  impl_->use_env = on;
}

void PluginRegistry::allow_insecure(bool on) {
  std::lock_guard lock(impl_->mu);
  impl_->allow_insecure = on;
}

void PluginRegistry::use_default_directory(bool on) {
  std::lock_guard lock(impl_->mu);
  impl_->use_default = on;
}

std::vector<fs::path> PluginRegistry::search_path() const {
  std::lock_guard lock(impl_->mu);
  return impl_->search_path();
}

std::vector<fs::path> PluginRegistry::default_directories() {
  std::vector<fs::path> out;
  auto consider = [&](const fs::path &p) {
    std::error_code ec;
    fs::path c = fs::canonical(p, ec);
    if (!ec && fs::is_directory(c, ec) && std::find(out.begin(), out.end(), c) == out.end())
      out.push_back(c);
  };
  boost::dll::fs::error_code ec;
  fs::path exe = boost::dll::program_location(ec);
  if (!ec) consider(exe.parent_path() / ".." / "lib" / "toolnexus" / "plugins");
  fs::path self = boost::dll::this_line_location(ec);
  if (!ec) consider(self.parent_path() / "toolnexus" / "plugins");
  return out;
}

void PluginRegistry::load() {
  std::lock_guard lock(impl_->mu);
  impl_->load_locked();
}

bool PluginRegistry::load_file(const fs::path &file, std::string *why) {
  std::lock_guard lock(impl_->mu);
  // An explicitly loaded library beats the embedded memory fallback.
  if (impl_->embedded_memory) {
    auto it = impl_->by_scheme.find("memory");
    if (it != impl_->by_scheme.end() && it->second == impl_->embedded_memory) impl_->by_scheme.erase(it);
    impl_->loaded.erase(std::remove(impl_->loaded.begin(), impl_->loaded.end(), impl_->embedded_memory),
                        impl_->loaded.end());
  }
  bool ok = impl_->load_file_locked(file, why);
  if (impl_->by_scheme.find("memory") == impl_->by_scheme.end() && impl_->embedded_memory) {
    impl_->by_scheme.emplace("memory", impl_->embedded_memory);
    impl_->loaded.push_back(impl_->embedded_memory);
  }
  return ok;
}

std::vector<PluginInfo> PluginRegistry::plugins() const {
  std::lock_guard lock(impl_->mu);
  std::vector<PluginInfo> out;
  for (const auto &p : impl_->loaded) out.push_back(p->info);
  return out;
}

std::vector<PluginFailure> PluginRegistry::failures() const {
  std::lock_guard lock(impl_->mu);
  return impl_->failures;
}

std::vector<std::string> PluginRegistry::schemes() const {
  std::lock_guard lock(impl_->mu);
  std::vector<std::string> out;
  for (const auto &kv : impl_->by_scheme) out.push_back(kv.first);
  return out;
}

detail::ResolvedSelector PluginRegistry::Impl::resolve(std::string_view selector) {
  const std::string shown = redact(selector);
  size_t colon = selector.find(':');
  std::string_view scheme = colon == std::string_view::npos ? selector : selector.substr(0, colon);
  std::string_view location = colon == std::string_view::npos ? std::string_view() : selector.substr(colon + 1);
  std::shared_ptr<LoadedPlugin> plugin;
  std::string available;
  {
    std::lock_guard lock(mu);
    const bool valid = colon != std::string_view::npos && valid_scheme(scheme);
    load_locked(valid ? scheme : std::string_view());
    if (valid) {
      auto it = by_scheme.find(scheme);
      if (it != by_scheme.end()) plugin = it->second;
    }
    if (!plugin) {
      for (const auto &kv : by_scheme) {
        if (!available.empty()) available += ", ";
        available += kv.first;
      }
    }
  }
  if (!plugin) {
    std::string msg = "unknown store selector " + shown +
                      ": expected \"memory\", \"file:<dir>\" or \"<scheme>:<location>\" with a scheme "
                      "served by a plugin; available schemes: " +
                      (available.empty() ? std::string("(none)") : available);
    if (colon != std::string_view::npos && valid_scheme(scheme))
      msg += " (no plugin serves '" + std::string(scheme) +
             "'; add its directory with --plugin-dir or " + kPluginPathEnv + ")";
    throw std::invalid_argument(msg);
  }
  return detail::ResolvedSelector{std::move(plugin), std::string(scheme), std::string(location), shown};
}

std::shared_ptr<TaskStore> PluginRegistry::open(std::string_view selector, const OpenOptions &options) {
  // Decorators (ABI 1.6) open their inner stores through this registry.
  Impl *impl = impl_.get();
  const detail::SelectorResolver resolver = [impl](std::string_view s) { return impl->resolve(s); };
  return detail::open_plugin_store(impl->resolve(selector), selector, options, resolver);
}

std::shared_ptr<TaskStore> resolve_store() { return resolve_store(std::string_view("memory")); }

std::shared_ptr<TaskStore> resolve_store(std::string_view selector) {
  return resolve_store(selector, PluginRegistry::global());
}

std::shared_ptr<TaskStore> resolve_store(std::string_view selector, PluginRegistry &registry) {
  return resolve_store(selector, OpenOptions{}, registry);
}

std::shared_ptr<TaskStore> resolve_store(std::string_view selector, const OpenOptions &options,
                                         PluginRegistry &registry) {
  if (selector.empty() || selector == "memory") return registry.open("memory:", options);
  return registry.open(selector, options);  // an unknown form throws invalid_argument listing schemes
}

std::shared_ptr<TaskStore> resolve_store(std::shared_ptr<TaskStore> store) {
  if (!store) return resolve_store();
  return store;
}

}  // namespace toolnexus

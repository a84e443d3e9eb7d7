// cli/options.hpp: the small argument parser shared by the subcommands:
// `--plugin-dir DIR` (repeatable, added to the global registry),
// `--allow-insecure-plugins` (PluginRegistry::allow_insecure), `--help`,
// boolean flags and valued options named by the caller, positionals.
#ifndef TOOLNEXUS_CLI_OPTIONS_HPP
#define TOOLNEXUS_CLI_OPTIONS_HPP

#include "toolnexus/registry.hpp"

#include <algorithm>
#include <map>
#include <string>
#include <vector>

namespace toolnexus::cli {

/// How a refused plugin path is told to the user: "plugin FILE was not
/// loaded: REASON", or "plugin directory DIR was not searched: REASON"
/// (PluginRegistry::failures() holds both).
inline std::string plugin_failure_text(const PluginFailure &f) {
  if (f.directory) return "plugin directory " + f.path + " was not searched: " + f.reason;
  return "plugin " + f.path + " was not loaded: " + f.reason;
}

/// Parsed arguments. argv[0] (the subcommand name) is skipped. A "--"
/// ends options. `error` is set (and parsing stops) on an unknown option or
/// a valued option without its value.
struct Options {
  Options(int argc, char **argv, std::vector<std::string> flags, std::vector<std::string> valued) {
    bool only_positional = false;
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      if (only_positional || a == "-" || a.empty() || a[0] != '-') {
        positional.push_back(a);
      } else if (a == "--") {
        only_positional = true;
      } else if (a == "--help" || a == "-h") {
        help = true;
      } else if (a == "--allow-insecure-plugins") {
        PluginRegistry::global().allow_insecure(true);
      } else if (a == "--plugin-dir") {
        if (i + 1 >= argc) {
          error = "--plugin-dir needs a directory";
          return;
        }
        PluginRegistry::global().add_directory(argv[++i]);
      } else if (std::find(flags.begin(), flags.end(), a) != flags.end()) {
        flags_set.push_back(a);
      } else if (std::find(valued.begin(), valued.end(), a) != valued.end()) {
        if (i + 1 >= argc) {
          error = a + " needs a value";
          return;
        }
        values[a].push_back(argv[++i]);
      } else {
        error = "unknown option '" + a + "'";
        return;
      }
    }
  }
  bool flag(const std::string &f) const {
    return std::find(flags_set.begin(), flags_set.end(), f) != flags_set.end();
  }
  /// The value of valued option `k` (the last one given), or nullptr.
  const std::string *value(const std::string &k) const {
    auto it = values.find(k);
    return it == values.end() ? nullptr : &it->second.back();
  }
  /// Every value of a repeatable option `k`, in order (empty: none given).
  std::vector<std::string> all(const std::string &k) const {
    auto it = values.find(k);
    return it == values.end() ? std::vector<std::string>{} : it->second;
  }

  std::vector<std::string> positional;
  std::vector<std::string> flags_set;
  std::map<std::string, std::vector<std::string>> values;
  bool help = false;
  std::string error;
};

}  // namespace toolnexus::cli

#endif

// `toolnexus plugins`: what the registry sees.
#include "commands.hpp"
#include "options.hpp"

#include "toolnexus/registry.hpp"

#include <rapidjson/prettywriter.h>
#include <rapidjson/stringbuffer.h>

#include <iostream>

namespace toolnexus::cli {

namespace {
const char *kHelp =
    "usage: toolnexus plugins [--json] [--plugin-dir DIR]... [--allow-insecure-plugins]\n"
    "  Lists the plugin directories searched (in order), each plugin loaded with its\n"
    "  file, scheme(s), version, ABI version and capabilities, and each file that\n"
    "  was refused with the reason. Directories come from TOOLNEXUS_PLUGIN_PATH, then\n"
    "  --plugin-dir, then <bin>/../lib/toolnexus/plugins.\n";
}

int run_plugins(int argc, char **argv) {
  Options o(argc, argv, {"--json"}, {});
  if (o.help) {
    std::cout << kHelp;
    return 0;
  }
  if (!o.error.empty() || !o.positional.empty()) {
    std::cerr << "toolnexus plugins: " << (o.error.empty() ? "unexpected argument '" + o.positional[0] + "'" : o.error)
              << "\n" << kHelp;
    return 2;
  }
  PluginRegistry &reg = PluginRegistry::global();
  reg.load();
  auto dirs = reg.search_path();
  auto plugins = reg.plugins();
  auto failures = reg.failures();
  if (o.flag("--json")) {
    rapidjson::StringBuffer buf;
    rapidjson::PrettyWriter<rapidjson::StringBuffer> w(buf);
    w.StartObject();
    w.Key("directories");
    w.StartArray();
    for (const auto &d : dirs) w.String(d.string().c_str());
    w.EndArray();
    w.Key("plugins");
    w.StartArray();
    for (const auto &p : plugins) {
      w.StartObject();
      w.Key("file"); w.String(p.path.c_str());
      w.Key("name"); w.String(p.name.c_str());
      w.Key("version"); w.String(p.version.c_str());
      w.Key("description"); w.String(p.description.c_str());
      w.Key("schemes");
      w.StartArray();
      for (const auto &s : p.schemes) w.String(s.c_str());
      w.EndArray();
      w.Key("syntax"); w.String(p.location_syntax.c_str());
      w.Key("abi"); w.String((std::to_string(p.abi_major) + "." + std::to_string(p.abi_minor)).c_str());
      w.Key("capabilities");
      w.StartArray();
      std::string caps = capability_names(p.capabilities);
      size_t start = 0;
      while (!caps.empty() && start <= caps.size()) {
        size_t end = caps.find(',', start);
        if (end == std::string::npos) end = caps.size();
        w.String(caps.substr(start, end - start).c_str());
        start = end + 1;
      }
      w.EndArray();
      w.EndObject();
    }
    w.EndArray();
    w.Key("failures");
    w.StartArray();
    for (const auto &f : failures) {
      w.StartObject();
      w.Key("file"); w.String(f.path.c_str());
      w.Key("reason"); w.String(f.reason.c_str());
      if (f.directory) {
        w.Key("directory"); w.Bool(true);  // "file" names a plugin directory that was not searched
      }
      w.EndObject();
    }
    w.EndArray();
    w.EndObject();
    std::cout << buf.GetString() << "\n";
    return 0;
  }
  std::cout << "directories searched:\n";
  for (const auto &d : dirs) std::cout << "  " << d.string() << "\n";
  std::cout << "plugins:\n";
  for (const auto &p : plugins) {
    std::string schemes;
    for (const auto &s : p.schemes) schemes += (schemes.empty() ? "" : ",") + s;
    std::cout << "  " << schemes << "\t" << p.name << " " << p.version << "\tABI " << p.abi_major << "."
              << p.abi_minor << "\t" << capability_names(p.capabilities) << "\n"
              << "    file: " << p.path << "\n";
    if (!p.location_syntax.empty()) std::cout << "    syntax: " << p.location_syntax << "\n";
  }
  if (!failures.empty()) {
    std::cout << "refused:\n";
    for (const auto &f : failures) std::cout << "  " << f.path << ": " << f.reason << "\n";
  }
  return 0;
}

}  // namespace toolnexus::cli

// cli/main.cpp: the `toolnexus` program: a dispatcher over the subcommands
// registered by the other files of cli/ (see subcommand.hpp).
#include "commands.hpp"
#include "subcommand.hpp"

#include "toolnexus/server.hpp"

#include <algorithm>
#include <cstdio>
#include <string>

namespace toolnexus::cli {
namespace {

std::vector<Subcommand> &registry() {
  static std::vector<Subcommand> all;
  return all;
}

void usage(std::FILE *out) {
  std::fprintf(out, "usage: toolnexus <command> [options]\n\ncommands:\n");
  for (const Subcommand &c : subcommands())
    std::fprintf(out, "  %-10.*s %.*s\n", static_cast<int>(c.name.size()), c.name.data(),
                 static_cast<int>(c.summary.size()), c.summary.data());
  std::fprintf(out, "\nRun 'toolnexus <command> --help' for a command's options.\n");
}

}  // namespace

const std::vector<Subcommand> &subcommands() { return registry(); }

Registration::Registration(std::string_view name, std::string_view summary, int (*run)(int, char **)) {
  auto &all = registry();
  all.push_back(Subcommand{name, summary, run});
  std::sort(all.begin(), all.end(), [](const Subcommand &a, const Subcommand &b) { return a.name < b.name; });
}

namespace {
// The subcommands declared in commands.hpp register here; newer ones
// register themselves in their own file (see subcommand.hpp).
const Registration plugins_registration{"plugins", "list the storage plugins found and the files refused",
                                        &run_plugins};
const Registration store_registration{"store", "inspect, copy and check Task stores (get|put|list|rm|copy|check)",
                                      &run_store};
}  // namespace

}  // namespace toolnexus::cli

int main(int argc, char **argv) {
  using namespace toolnexus::cli;
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  const std::string_view first = argv[1];
  if (first == "--help" || first == "-h" || first == "help") {
    usage(stdout);
    return 0;
  }
  if (first == "--version") {
    std::printf("toolnexus %s\n", toolnexus::server_version());
    return 0;
  }
  for (const Subcommand &c : subcommands())
    if (c.name == first) return c.run(argc - 1, argv + 1);
  std::fprintf(stderr, "toolnexus: unknown command '%s'\n\n", argv[1]);
  usage(stderr);
  return 2;
}

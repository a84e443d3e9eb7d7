// cli/subcommand.hpp: how a `toolnexus` subcommand plugs into the
// dispatcher in main.cpp. Adding a subcommand is one file: cli/<name>.cpp
// defining its run function and one static registration:
//
//   static const toolnexus::cli::Registration reg{
//       "plugins", "list the storage plugins found", &run_plugins};
//
// (cli/CMakeLists.txt compiles every cli/*.cpp.)
#ifndef TOOLNEXUS_CLI_SUBCOMMAND_HPP
#define TOOLNEXUS_CLI_SUBCOMMAND_HPP

#include <string_view>
#include <vector>

namespace toolnexus::cli {

/// A subcommand. `run` gets argv without the program name: argv[0] is the
/// subcommand's name. Returns the process exit code (0 ok, 1 failure,
/// 2 usage error).
struct Subcommand {
  std::string_view name;
  std::string_view summary;
  int (*run)(int argc, char **argv);
};

/// Every registered subcommand, sorted by name. Filled during static
/// initialisation; read only afterwards (from main).
const std::vector<Subcommand> &subcommands();

/// Registers a subcommand at static-initialisation time.
struct Registration {
  Registration(std::string_view name, std::string_view summary, int (*run)(int, char **));
};

}  // namespace toolnexus::cli

#endif  // TOOLNEXUS_CLI_SUBCOMMAND_HPP

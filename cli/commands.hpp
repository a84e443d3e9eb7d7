// cli/commands.hpp: the `toolnexus` subcommands other than `serve`.
//
// Each takes the arguments after its own name (argv[0] is the subcommand
// name) and returns the process exit code. They print results to stdout and
// errors to stderr. Not thread-safe (they touch the global plugin registry).
#ifndef TOOLNEXUS_CLI_COMMANDS_HPP
#define TOOLNEXUS_CLI_COMMANDS_HPP

namespace toolnexus::cli {

/// `toolnexus plugins [--json] [--plugin-dir DIR]...`: the directories
/// searched, each plugin found and each file refused with the reason.
/// Exit 0, or 2 on a usage error.
int run_plugins(int argc, char **argv);

/// `toolnexus store get|put|list|rm|copy|check ...`: inspect, copy and check
/// stores. Exit codes per subcommand in its --help; 2 is always "error other
/// than the ones named" (bad selector, corrupt record, usage).
int run_store(int argc, char **argv);

}  // namespace toolnexus::cli

#endif

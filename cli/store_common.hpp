// cli/store_common.hpp: what the parts of `toolnexus store` share
// (store_command.cpp: the subcommands; store_import.cpp: `store put` of
// JSON lines, streamed). Not thread-safe, as the commands.
#ifndef TOOLNEXUS_CLI_STORE_COMMON_HPP
#define TOOLNEXUS_CLI_STORE_COMMON_HPP

#include "line_reader.hpp"
#include "options.hpp"

#include "toolnexus/registry.hpp"

#include <optional>
#include <string>
#include <string_view>

namespace toolnexus::cli::store_detail {

/// get, list, check and the source of copy only read: they open with
/// OpenOptions::read_only, so a mistyped selector is "no store at ..." (exit
/// 2) instead of a new empty store, and nothing is migrated or cleaned up.
inline const OpenOptions kInspect{true};

/// Prints `msg` and the usage on stderr; returns exit code 2.
int usage_error(const std::string &msg);

/// Text from a store (an id, a reason) as it may be printed on a terminal:
/// valid UTF-8 kept, control bytes and bytes of invalid UTF-8 as \xHH.
std::string printable(std::string_view s);

/// Parses `text` as a Task an A2A server can serve into `t`; "" or why not.
std::string parse_a2a_task(const std::string &text, Task &t);

/// Applies --running-as to `t`, read from input `text`: "" when it may be
/// saved (reset when it was a submitted or working Task without a server's
/// lease and the option is given; `import_id`, if given, then receives its
/// status message's messageId, derived from `text`), else why not.
std::string running_as(const Options &o, Task &t, std::string_view text, std::string *import_id = nullptr);

/// The SaveOptions of saving `t` (`current`: what is stored, if any):
/// owner and tenant not given on the command line are kept; its due time
/// is what a server would record (task_due_us: a held lease's expiry, a
/// pending push delivery; ABI 1.5), so that a server's due sweep finds it.
SaveOptions put_options(const Options &o, const Task &t, const std::optional<TaskRecord> &current);

/// `store put SELECTOR` of JSON lines read from `in` (store_import.cpp):
/// streamed, in one transaction where the store has them, else Task by
/// Task; --force, --resume. Returns the exit code (0; 1 a Task exists;
/// 2 bad lines or another error).
int put_lines(const Options &o, LineReader &in);

/// `store gc ...` (store_gc.cpp): argv[0] is "gc". Returns the exit code.
int run_gc(int argc, char **argv);

/// `store rekey ...` (store_rekey.cpp): argv[0] is "rekey". Returns the
/// exit code.
int run_rekey(int argc, char **argv);

}  // namespace toolnexus::cli::store_detail

#endif  // TOOLNEXUS_CLI_STORE_COMMON_HPP

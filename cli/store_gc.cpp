// cli/store_gc.cpp: `toolnexus store gc`: the retention sweep by hand
// (toolnexus/retention.hpp collect_expired): deletes the terminal Tasks past
// their keep time and ends the waiting ones past their wait, as a server
// with the same policy would, with a progress line on stderr.
#include "options.hpp"
#include "retention_config.hpp"
#include "store_common.hpp"

#include "toolnexus/registry.hpp"
#include "toolnexus/retention.hpp"
#include "toolnexus/server.hpp"

#include <chrono>
#include <iostream>
#include <set>
#include <stdexcept>
#include <string>

namespace toolnexus::cli::store_detail {

namespace {

const char *kGcHelp =
    "usage: toolnexus store gc [SELECTOR] [--config FILE] [--retention STATE=DURATION[:canceled|failed]]...\n"
    "                          [--older-than DURATION] [--state STATE]... [--dry-run]\n"
    "  Deletes the Tasks in a terminal state (completed, failed, canceled, rejected) whose\n"
    "  last status is older than their state's retention, and ends (canceled, or failed\n"
    "  when configured) the input-required and auth-required Tasks that waited longer than\n"
    "  theirs, with a status message saying so: what a server with that policy does. Safe\n"
    "  while servers run on the store (each Task is deleted or ended by one of them).\n"
    "  --config FILE     the policy of the serve config's \"retention\" section; its a2a.store\n"
    "                    when SELECTOR is not given\n"
    "  --retention R     a rule as `serve --retention` takes it (repeatable)\n"
    "  --older-than D    every terminal state (or those --state names) is kept D; a waiting\n"
    "                    state named by --state expires after D\n"
    "  --state S         only these states (repeatable)\n"
    "  --dry-run         count what would be deleted and ended; change nothing\n"
    "  DURATION: a whole number with a unit: ms, s, m, h, d (30d, 2h, 250ms)\n"
    "  Prints a progress line on stderr about once a second, then a summary on stdout:\n"
    "  \"deleted N Task(s), expired M waiting Task(s), read R record(s)\".\n"
    "  Exit 0; 1 when some records could not be read (each named on stderr, left as they are;\n"
    "  the others were collected); 2 on a usage error, a bad policy or a store error.\n";

int gc_usage(const std::string &msg) {
  std::cerr << "toolnexus store gc: " << msg << "\n" << kGcHelp;
  return 2;
}

}  // namespace

int run_gc(int argc, char **argv) {
  const Options o(argc, argv, {"--dry-run"}, {"--config", "--retention", "--older-than", "--state"});
  if (o.help) {
    std::cout << kGcHelp;
    return 0;
  }
  if (!o.error.empty()) return gc_usage(o.error);
  if (o.positional.size() > 1)
    return gc_usage("gc takes one SELECTOR, got '" + o.positional[0] + "' and '" + o.positional[1] + "'");
  std::string selector = o.positional.empty() ? "" : o.positional[0];
  const std::string config = o.value("--config") ? *o.value("--config") : "";
  const std::string older_than = o.value("--older-than") ? *o.value("--older-than") : "";
  const std::vector<std::string> rules = o.all("--retention"), states = o.all("--state");
  const bool dry_run = o.flag("--dry-run");
  RetentionOptions policy;
  try {
    if (!config.empty()) {
      std::string configured;
      policy = read_retention_config(config, &configured);
      if (selector.empty()) selector = configured;
    }
    for (const std::string &r : rules) add_retention_flag(policy, r, "--retention");
    for (const std::string &s : states)
      if (!task_state::is_terminal(s) && s != task_state::kInputRequired && s != task_state::kAuthRequired)
        throw std::invalid_argument("--state '" + s +
                                    "' is not a state gc handles (completed, failed, canceled, rejected, "
                                    "input-required, auth-required)");
    if (!older_than.empty()) {
      const std::set<std::string> named(states.begin(), states.end());
      for (const char *s : {"completed", "failed", "canceled", "rejected"})
        if (named.empty() || named.count(s) != 0) add_retention_rule(policy, s, older_than, {}, "--older-than");
      for (const char *s : {"input-required", "auth-required"})
        if (named.count(s) != 0) {
          auto it = policy.wait.find(s);
          const std::string to = it == policy.wait.end() ? "canceled" : it->second.to;
          add_retention_rule(policy, s, older_than, to, "--older-than");
        }
    }
    if (!states.empty()) {
      const std::set<std::string> named(states.begin(), states.end());
      for (auto it = policy.keep_ms.begin(); it != policy.keep_ms.end();)
        it = named.count(it->first) != 0 ? std::next(it) : policy.keep_ms.erase(it);
      for (auto it = policy.wait.begin(); it != policy.wait.end();)
        it = named.count(it->first) != 0 ? std::next(it) : policy.wait.erase(it);
      for (const std::string &s : named)
        if (policy.keep_ms.count(s) == 0 && policy.wait.count(s) == 0)
          throw std::invalid_argument("--state " + s + ": no retention rule for it (give --older-than, --retention " +
                                      s + "=DURATION, or a --config whose retention names it)");
    }
  } catch (const std::invalid_argument &e) {
    return gc_usage(e.what());
  }
  if (selector.empty()) return gc_usage("no store: give SELECTOR, or a --config with a2a.store");
  if (policy.empty())
    return gc_usage("nothing to collect: give --older-than, --retention, or a --config with a \"retention\" section");

  using Clock = std::chrono::steady_clock;
  auto last = Clock::now();
  try {
    // Opened read-only first: a mistyped selector is "no store at ...",
    // not a new empty store with nothing to collect.
    auto store = resolve_store(selector, OpenOptions{true});
    if (!dry_run) {
      store->close();
      store = resolve_store(selector);
    }
    const GcCounts c = collect_expired(
        *store, policy, dry_run,
        [&](const GcCounts &p) {
          if (Clock::now() - last < std::chrono::seconds(1)) return;
          last = Clock::now();
          std::cerr << "gc: read " << p.read << ", " << (dry_run ? "would delete " : "deleted ") << p.deleted << ", "
                    << (dry_run ? "would expire " : "expired ") << p.expired << std::endl;
        },
        [](const std::string &text) { std::cerr << "toolnexus store gc: " << printable(text) << "\n"; });
    store->close();
    if (dry_run)
      std::cout << "would delete " << c.deleted << " Task(s), would expire " << c.expired << " waiting Task(s), read "
                << c.read << " record(s) (dry run: nothing changed)\n";
    else
      std::cout << "deleted " << c.deleted << " Task(s), expired " << c.expired << " waiting Task(s), read " << c.read
                << " record(s)\n";
    if (c.unreadable > 0) {
      std::cerr << "toolnexus store gc: " << c.unreadable
                << " record(s) could not be read and were left (named above; `toolnexus store check` reports them)\n";
      return 1;
    }
  } catch (const std::exception &e) {
    std::cerr << "toolnexus store gc: " << e.what() << "\n";
    for (const PluginFailure &f : PluginRegistry::global().failures())
      std::cerr << "toolnexus store gc: " << plugin_failure_text(f) << "\n";
    return 2;
  }
  return 0;
}

}  // namespace toolnexus::cli::store_detail

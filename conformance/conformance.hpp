// toolnexus/conformance.hpp: the shared conformance suite every TaskStore
// (built-in plugin, third-party plugin, or C++ store) is held to.
//
// Each rule is a named check of one promise of the store contract
// (sdk/include/toolnexus/task_store.h and core's task_store.hpp). Rules get a
// factory that makes a fresh, empty store for each call, and report failure
// by throwing conformance::Failure with the file:line of the broken
// expectation.
#ifndef TOOLNEXUS_CONFORMANCE_HPP
#define TOOLNEXUS_CONFORMANCE_HPP

#include "toolnexus/registry.hpp"

#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace toolnexus::conformance {

/// Makes a fresh, empty store; called once or more per rule. May throw.
using StoreFactory = std::function<std::shared_ptr<TaskStore>()>;

/// A broken expectation: what was expected, what happened, where.
class Failure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// One rule of the contract.
struct Rule {
  /// Stable short name, e.g. "round-trip-unknown-fields".
  const char *name;
  /// One line: what the rule holds the store to.
  const char *description;
  /// Runs the rule; throws Failure (or anything else) when it does not hold.
  void (*run)(const StoreFactory &fresh);
};

/// Every rule, in a fixed order. Static; thread-safe.
const std::vector<Rule> &rules();

/// Outcome of one rule.
struct Result {
  std::string rule;
  bool passed = false;
  /// Why it failed ("" when passed).
  std::string message;
  double seconds = 0;
};

/// Runs every rule whose name contains `filter` ("" = all) and returns the
/// outcomes; never throws for a failing rule.
std::vector<Result> run(const StoreFactory &fresh, const std::string &filter = "");

/// A factory for a selector template: each call replaces every "{tmp}" in
/// `selector_template` with a new empty temporary directory (removed by
/// cleanup_temp_dirs()) and every "{unique}" with a token ([0-9_]) unique to
/// that store (for backends whose fresh stores share one server and differ
/// by a name, e.g. postgresql://...?tnx_table=conf_{unique}), then resolves
/// it with `registry`.
StoreFactory selector_factory(std::string selector_template, PluginRegistry &registry);

/// Removes the temporary directories made by selector_factory factories.
void cleanup_temp_dirs();

}  // namespace toolnexus::conformance

#endif

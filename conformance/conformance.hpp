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
#include <type_traits>
#include <vector>

namespace toolnexus::conformance {

/// Makes fresh, empty stores for the rules (operator(), called once or
/// more per rule; may throw). Optionally it can also reopen the location of
/// the last store it made with other OpenOptions (reopen()); the rules that
/// need that are skipped for a factory without it. Copies share state.
/// Not thread-safe: rules call it from one thread.
class StoreFactory {
 public:
  using Make = std::function<std::shared_ptr<TaskStore>()>;
  using Reopen = std::function<std::shared_ptr<TaskStore>(const OpenOptions &)>;

  /// From any callable returning std::shared_ptr<TaskStore> (a lambda).
  template <class F, class = std::enable_if_t<std::is_invocable_r_v<std::shared_ptr<TaskStore>, F &>>>
  StoreFactory(F make) : make_(std::move(make)) {}  // NOLINT: implicit on purpose
  /// Opens a location where no store has been made yet with `options`
  /// (for the read-only rules); `where` receives a directory that holds the
  /// location, or "" when there is none to watch.
  using Virgin = std::function<std::shared_ptr<TaskStore>(const OpenOptions &, std::string &where)>;

  /// With a reopen function: `reopen(options)` opens the location of the
  /// store `make` made last.
  StoreFactory(Make make, Reopen reopen) : make_(std::move(make)), reopen_(std::move(reopen)) {}
  /// With a reopen and a virgin-location function.
  StoreFactory(Make make, Reopen reopen, Virgin virgin)
      : make_(std::move(make)), reopen_(std::move(reopen)), virgin_(std::move(virgin)) {}

  /// A fresh, empty store.
  std::shared_ptr<TaskStore> operator()() const { return make_(); }
  /// True when reopen() is available.
  bool can_reopen() const noexcept { return static_cast<bool>(reopen_); }
  /// The location of the last store made, opened again with `options`.
  /// Throws std::logic_error without a reopen function, or what opening
  /// throws.
  std::shared_ptr<TaskStore> reopen(const OpenOptions &options) const {
    if (!reopen_) throw std::logic_error("this store factory cannot reopen a location");
    return reopen_(options);
  }
  /// The selector of the last store made, when the factory knows it ("").
  std::string last_selector() const { return selector_ ? selector_() : std::string(); }
  /// Sets where last_selector() comes from.
  StoreFactory &with_selector(std::function<std::string()> f) {
    selector_ = std::move(f);
    return *this;
  }
  /// True when virgin() is available.
  bool can_open_virgin() const noexcept { return static_cast<bool>(virgin_); }
  /// A location where nothing was ever stored, opened with `options`; may
  /// throw what opening throws (StoreError(not_found) for a read-only open
  /// of a location that does not exist).
  std::shared_ptr<TaskStore> virgin(const OpenOptions &options, std::string &where) const {
    if (!virgin_) throw std::logic_error("this store factory cannot open a fresh location");
    return virgin_(options, where);
  }

 private:
  Make make_;
  Reopen reopen_;
  Virgin virgin_;
  std::function<std::string()> selector_;
};

/// Thrown by a rule that does not apply (e.g. needs reopen()); the result
/// is reported as skipped, with this message.
class Skipped : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

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
  /// The rule did not apply (passed is false too); message says why.
  bool skipped = false;
  /// Why it failed or was skipped ("" when passed).
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
/// it with `registry`. Its reopen() resolves the last selector made again.
StoreFactory selector_factory(std::string selector_template, PluginRegistry &registry);

/// Removes the temporary directories made by selector_factory factories.
void cleanup_temp_dirs();

}  // namespace toolnexus::conformance

#endif

// The conformance suite must fail stores that break the contract: a suite
// that passes everything proves nothing. Each lying store wraps a real
// memory store and breaks one promise.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "conformance.hpp"
#include "test_util.hpp"

#include <map>

using namespace toolnexus;

namespace {
enum class Lie {
  ignore_cas,
  drop_unknown_fields,
  list_oldest_first,
  not_found_is_empty_record,
  count_ignores_filters,
  feed_drops_deletes,
  feed_claimed_not_given,
};

class LyingStore final : public TaskStore {
 public:
  explicit LyingStore(Lie lie) : lie_(lie), real_(resolve_store("memory")) {}
  std::optional<TaskRecord> get(std::string_view id) override {
    auto r = real_->get(id);
    if (!r && lie_ == Lie::not_found_is_empty_record) {
      TaskRecord empty;
      empty.id = std::string(id);
      empty.json = "{}";
      return empty;
    }
    return r;
  }
  void remove(std::string_view id, uint64_t v) override { real_->remove(id, v); }
  ListPage list(const ListQuery &q) override {
    ListPage p = real_->list(q);
    if (lie_ == Lie::list_oldest_first) std::reverse(p.records.begin(), p.records.end());
    return p;
  }
  uint64_t count(const ListQuery &q) override {
    return lie_ == Lie::count_ignores_filters ? real_->count(ListQuery{}) : real_->count(q);
  }
  StoreInfo info() const override { return real_->info(); }
  void close() override { real_->close(); }
  std::unique_ptr<ChangeSubscription> watch_changes(ChangeListener l) override {
    if (lie_ == Lie::feed_claimed_not_given) return nullptr;  // info() still claims TNX_CAP_CHANGE_FEED
    if (lie_ == Lie::feed_drops_deletes)
      return real_->watch_changes([l](const StoreChange &c) {
        if (c.kind != StoreChange::Kind::deleted) l(c);
      });
    return real_->watch_changes(std::move(l));
  }

 protected:
  uint64_t do_save(const TaskRecord &r, uint64_t expected) override {
    SaveOptions o;
    o.owner = r.owner;
    o.tenant = r.tenant;
    o.expected_version = lie_ == Lie::ignore_cas ? kAnyVersion : expected;
    Task t = r.task();
    if (lie_ == Lie::drop_unknown_fields) t.json().RemoveMember("metadata");
    return real_->save(t, o);
  }

 private:
  Lie lie_;
  std::shared_ptr<TaskStore> real_;
};

bool rule_fails(Lie lie, const char *rule) {
  auto results = conformance::run([lie] { return std::make_shared<LyingStore>(lie); }, rule);
  REQUIRE(results.size() >= 1);
  for (const auto &r : results)
    if (r.rule == rule) return !r.passed;
  FAIL("no such rule");
  return false;
}
}  // namespace

TEST_CASE("an honest wrapper passes every rule; one that cannot reopen skips only read-only-open") {
  for (const auto &r : conformance::run([] { return resolve_store("memory"); })) {
    INFO(r.rule << ": " << r.message);
    if (r.rule == "read-only-open" || r.rule == "read-only-plugin") CHECK(r.skipped);
    else CHECK((r.passed || (r.skipped && r.rule == "one-export")));
  }
  auto results = conformance::run(conformance::selector_factory("memory", PluginRegistry::global()));
  CHECK(results.size() == conformance::rules().size());
  for (const auto &r : results) {
    INFO(r.rule << ": " << r.message);
    CHECK((r.passed || (r.skipped && r.rule == "read-only-plugin")));  // memory is not persistent
  }
}

TEST_CASE("read-only-open catches a reopen that ignores read_only, and one that loses the data") {
  const std::filesystem::path dir = tnx_test::temp_dir("tnx-catches");
  const std::string sel = "file:" + dir.string();
  // Ignores the options: hands out a writable store.
  conformance::StoreFactory writable([&] { return resolve_store(sel); },
                                     [&](const OpenOptions &) { return resolve_store(sel); });
  auto r = conformance::run(writable, "read-only-open");
  REQUIRE(r.size() == 1);
  CHECK_FALSE(r[0].passed);
  CHECK_MESSAGE(r[0].message.find("read_only") != std::string::npos, r[0].message);
  // Opens somewhere else: the persistent store's Task is not there.
  conformance::StoreFactory elsewhere([&] { return resolve_store(sel); },
                                      [&](const OpenOptions &o) { return resolve_store("memory", o); });
  r = conformance::run(elsewhere, "read-only-open");
  REQUIRE(r.size() == 1);
  CHECK_FALSE(r[0].passed);
  CHECK_MESSAGE(r[0].message.find("does not see the Task") != std::string::npos, r[0].message);
  std::filesystem::remove_all(dir);
}

namespace {
// The outcome of one rule against the fixture plugin in test-fixtures/<dir>.
conformance::Result fixture_rule(const char *dir, const char *rule) {
  static std::map<std::string, std::unique_ptr<PluginRegistry>> regs;
  auto &r = regs[dir];
  if (!r) {
    r = std::make_unique<PluginRegistry>();
    r->use_environment(false);
    r->use_default_directory(false);
    r->add_directory(std::filesystem::path(TOOLNEXUS_TEST_FIXTURE_DIR) / dir);
  }
  auto results = conformance::run(conformance::selector_factory("fixture:x", *r), rule);
  REQUIRE(results.size() == 1);
  return results[0];
}
}  // namespace

TEST_CASE("the kit fails a plugin that ignores read-only opens, and one that exports 44 symbols") {
  conformance::Result r = fixture_rule("ignores_ro", "read-only-plugin");
  CHECK_FALSE(r.passed);
  CHECK_FALSE(r.skipped);
  CHECK_MESSAGE(r.message.find("ignores read-only opens") != std::string::npos, r.message);
  CHECK_MESSAGE(r.message.find(".cpp") == std::string::npos, r.message);  // self-contained: no source file cited
  r = fixture_rule("many_exports", "one-export");
  CHECK_FALSE(r.passed);
  CHECK_MESSAGE(r.message.find("44 exported symbols") != std::string::npos, r.message);
  CHECK_MESSAGE(r.message.find("fixture_extra_") != std::string::npos, r.message);
  // The sound fixture passes the symbol rule.
  CHECK(fixture_rule("good", "one-export").passed);
}

TEST_CASE("the suite catches each lie") {
  CHECK(rule_fails(Lie::ignore_cas, "compare-and-set"));
  CHECK(rule_fails(Lie::drop_unknown_fields, "round-trip-unknown-fields"));
  CHECK(rule_fails(Lie::list_oldest_first, "list-order-paging"));
  CHECK(rule_fails(Lie::not_found_is_empty_record, "not-found"));
  CHECK(rule_fails(Lie::count_ignores_filters, "count"));
  CHECK(rule_fails(Lie::feed_drops_deletes, "change-feed"));
  CHECK(rule_fails(Lie::feed_claimed_not_given, "change-feed"));
  CHECK_FALSE(rule_fails(Lie::ignore_cas, "change-feed"));  // a store forwarding the feed holds the rule
}

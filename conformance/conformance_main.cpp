// toolnexus-conformance: runs the shared conformance suite against any store
// selector, so a third-party plugin is held to the same contract as ours.
//
//   toolnexus-conformance [--plugin-dir DIR]... [--allow-insecure-plugins] [--rule SUBSTRING] [--list] SELECTOR
//
// SELECTOR may contain "{tmp}", replaced by a fresh temporary directory for
// every store a rule opens (e.g. "file:{tmp}", "sqlite:{tmp}/t.db"), and
// "{unique}", replaced by a token unique to each store (e.g.
// "postgresql://127.0.0.1/db?tnx_table=conf_{unique}").
// Exit 0 when every rule passes, 1 when one fails, 2 on bad usage or when the
// store cannot be opened at all.
#include "conformance.hpp"

#include <cstdio>
#include <cstring>
#include <iostream>

namespace {
void usage(std::ostream &os) {
  os << "usage: toolnexus-conformance [--plugin-dir DIR]... [--allow-insecure-plugins] [--rule SUBSTRING] [--list]\n"
        "                             SELECTOR\n"
        "  --allow-insecure-plugins: load plugins from group/other-writable or foreign-owned\n"
        "  files and directories (as toolnexus serve; symlinks must still stay inside).\n"
        "  Runs the TaskStore conformance rules against SELECTOR; \"{tmp}\" in it becomes a\n"
        "  fresh temporary directory for each store (e.g. file:{tmp}, sqlite:{tmp}/t.db);\n"
        "  \"{unique}\" a token unique to each store (postgresql://...?tnx_table=t_{unique}).\n"
        "  Exit: 0 all rules pass, 1 a rule failed, 2 usage error or store unusable.\n";
}
}  // namespace

int main(int argc, char **argv) {
  using namespace toolnexus;
  PluginRegistry &reg = PluginRegistry::global();
  std::string selector, filter;
  bool list_only = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      usage(std::cout);
      return 0;
    } else if (a == "--plugin-dir" && i + 1 < argc) {
      reg.add_directory(argv[++i]);
    } else if (a == "--allow-insecure-plugins") {
      reg.allow_insecure(true);
    } else if (a == "--rule" && i + 1 < argc) {
      filter = argv[++i];
    } else if (a == "--list") {
      list_only = true;
    } else if (!a.empty() && a[0] == '-') {
      std::cerr << "toolnexus-conformance: unknown option '" << a << "'\n";
      usage(std::cerr);
      return 2;
    } else if (selector.empty()) {
      selector = a;
    } else {
      std::cerr << "toolnexus-conformance: more than one selector given\n";
      return 2;
    }
  }
  if (list_only) {
    for (const auto &r : conformance::rules()) std::cout << r.name << "\t" << r.description << "\n";
    return 0;
  }
  if (selector.empty()) {
    usage(std::cerr);
    return 2;
  }
  auto fresh = conformance::selector_factory(selector, reg);
  try {
    (void)fresh();
  } catch (const std::exception &e) {
    std::cerr << "toolnexus-conformance: cannot open " << selector << ": " << e.what() << "\n";
    for (const auto &f : reg.failures()) std::cerr << "  plugin refused: " << f.path << ": " << f.reason << "\n";
    conformance::cleanup_temp_dirs();
    return 2;
  }
  auto results = conformance::run(fresh, filter);
  int failed = 0, skipped = 0;
  for (const auto &r : results) {
    std::printf("%s %-28s %7.3fs%s%s\n", r.passed ? "PASS" : r.skipped ? "SKIP" : "FAIL", r.rule.c_str(),
                r.seconds, r.passed ? "" : "  ", r.message.c_str());
    if (r.skipped) ++skipped;
    else if (!r.passed) ++failed;
  }
  std::printf("%zu passed, %d failed", results.size() - static_cast<size_t>(failed + skipped), failed);
  if (skipped != 0) std::printf(", %d skipped", skipped);
  std::printf("\n");
  conformance::cleanup_temp_dirs();
  return failed == 0 ? 0 : 1;
}

// cli/store_rekey.cpp: `toolnexus store rekey`: re-saves every Task of a
// store, so that a decorator that transforms what it writes (encrypt:
// seals each write with its newest key) rewrites every record in place.
// Each Task is saved with compare-and-set on the version just read, with its
// owner, tenant and due time, so a server running on the store loses
// nothing (a Task it changed meanwhile was written with the newest key
// already); a page at a time in one transaction where the store has
// batches (sqlite:, postgresql:), Task by Task otherwise. Resumable: with --checkpoint FILE the list cursor after each
// finished page is kept in FILE (written atomically), and a run killed
// halfway and started again goes on from there; FILE is removed at the end.
#include "options.hpp"
#include "store_common.hpp"

#include "toolnexus/registry.hpp"

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <stdexcept>
#include <string>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

namespace toolnexus::cli::store_detail {

namespace {

const char *kRekeyHelp =
    "usage: toolnexus store rekey SELECTOR [--checkpoint FILE] [--page N]\n"
    "  Reads every Task and saves it again, in place, with compare-and-set on the version\n"
    "  read (owner, tenant and due time kept): over an encrypt: store every Task is then\n"
    "  sealed with the newest key, so the older keys can be dropped. Safe while servers\n"
    "  run on the store (a Task they change meanwhile is skipped: it was just written).\n"
    "  --checkpoint FILE  keep the position in FILE after each page; a run killed halfway\n"
    "                     and started again with the same FILE goes on from there; FILE is\n"
    "                     removed when the rekey completes\n"
    "  --page N           Tasks per page (1..1000, default 200)\n"
    "  A checkpoint names the store it was made for: another store's is refused. A record that\n"
    "  cannot be read (corrupt, or sealed with a key not given) is named on stderr and left as\n"
    "  it is; the rest are re-saved.\n"
    "  Prints a progress line on stderr about once a second, then on stdout:\n"
    "  \"re-saved N Task(s), skipped M changed meanwhile[, U unreadable], in S s (R Tasks/s)\".\n"
    "  Exit 0; 1 when some records could not be read (each named; the checkpoint is removed all\n"
    "  the same); 2 on a usage error or a store error.\n";

const char *kCheckpointMagic = "toolnexus store rekey checkpoint 2";

int rekey_usage(const std::string &msg) {
  std::cerr << "toolnexus store rekey: " << msg << "\n" << kRekeyHelp;
  return 2;
}

// The cursor and count a checkpoint file holds; false when there is none.
// Throws when it is not one, or was made for another store than `selector`.
bool read_checkpoint(const std::string &path, const std::string &selector, std::string &cursor, uint64_t &done) {
  std::ifstream in(path);
  if (!in) return false;
  std::string magic, of, count;
  if (!std::getline(in, magic) || magic != kCheckpointMagic || !std::getline(in, of) || !std::getline(in, cursor) ||
      !std::getline(in, count))
    throw std::runtime_error("checkpoint file '" + path + "' is not a rekey checkpoint of this version (remove it "
                             "to start over)");
  if (of != selector)
    throw std::runtime_error("checkpoint file '" + path + "' belongs to a rekey of '" + of + "', not of '" + selector +
                             "' (finish that one with its selector, or remove the file to start over)");
  try {
    done = std::stoull(count);
  } catch (const std::exception &) {
    throw std::runtime_error("checkpoint file '" + path + "' has a bad count line (remove it to start over)");
  }
  return true;
}

// Replaces the checkpoint atomically (write, fsync, rename): a kill leaves
// the old one or the new one.
void write_checkpoint(const std::string &path, const std::string &selector, const std::string &cursor, uint64_t done) {
  const std::string tmp = path + ".tmp";
  const std::string text =
      std::string(kCheckpointMagic) + "\n" + selector + "\n" + cursor + "\n" + std::to_string(done) + "\n";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) throw std::runtime_error("cannot write checkpoint file '" + tmp + "'");
  const bool ok = ::write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size()) && ::fsync(fd) == 0;
  ::close(fd);
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0)
    throw std::runtime_error("cannot write checkpoint file '" + path + "'");
}

}  // namespace

int run_rekey(int argc, char **argv) {
  const Options o(argc, argv, {}, {"--checkpoint", "--page"});
  if (o.help) {
    std::cout << kRekeyHelp;
    return 0;
  }
  if (!o.error.empty()) return rekey_usage(o.error);
  if (o.positional.size() > 1)
    return rekey_usage("rekey takes one SELECTOR, got '" + o.positional[0] + "' and '" + o.positional[1] + "'");
  const std::string selector = o.positional.empty() ? "" : o.positional[0];
  const std::string checkpoint = o.value("--checkpoint") ? *o.value("--checkpoint") : "";
  uint32_t page = 200;
  if (const std::string *v = o.value("--page")) {
    unsigned long n = 0;
    try {
      n = std::stoul(*v);
    } catch (const std::logic_error &) {
    }
    if (n < 1 || n > 1000) return rekey_usage("--page " + *v + ": expected 1..1000");
    page = static_cast<uint32_t>(n);
  }
  if (selector.empty()) return rekey_usage("no store: give SELECTOR");

  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  auto last = start;
  uint64_t saved = 0, skipped = 0, unreadable = 0, before = 0;
  try {
    std::string cursor;
    if (!checkpoint.empty() && read_checkpoint(checkpoint, selector, cursor, before))
      std::cerr << "rekey: resuming after " << before << " Task(s) (checkpoint '" << checkpoint << "')" << std::endl;
    // Read-only first: a mistyped selector is "no store at ...", not a new
    // empty store.
    resolve_store(selector, OpenOptions{true})->close();
    auto store = resolve_store(selector);
    const uint64_t total = store->count(ListQuery{});
    bool batch = true;
    do {
      ListQuery q;
      q.page_size = page;
      q.cursor = cursor;
      q.deliver_corrupt = true;  // named and left, not the end of the rekey
      const ListPage p = store->list(q);
      std::vector<Task> tasks;
      std::vector<BatchItem> items;
      tasks.reserve(p.records.size());
      for (const TaskRecord &r : p.records) {
        std::string problem = r.problem;
        if (problem.empty() && r.version == 0) problem = "the store cannot decode it";
        if (problem.empty()) {
          try {
            tasks.push_back(Task::parse_stored(r.json));
          } catch (const std::exception &e) {
            problem = e.what();
          }
        }
        if (!problem.empty()) {
          ++unreadable;
          std::cerr << "toolnexus store rekey: skipped unreadable record '" << printable(r.id)
                    << "', left as it is: " << printable(problem) << std::endl;
          continue;
        }
        BatchItem it;
        it.options.expected_version = r.version;
        it.options.owner = r.owner;
        it.options.tenant = r.tenant;
        it.options.due_us = r.due_us;
        items.push_back(std::move(it));
      }
      for (size_t i = 0; i < items.size(); ++i) items[i].task = &tasks[i];
      // A page in one transaction where the store has them (one commit per
      // page, not per Task); Task by Task when it has none, or when a Task
      // of the page changed meanwhile (the batch then wrote nothing).
      bool done_page = false;
      if (batch && !items.empty()) {
        try {
          store->save_batch(items);
          saved += items.size();
          done_page = true;
        } catch (const StoreError &e) {
          if (e.code() == Status::unsupported) batch = false;
          else if (e.code() != Status::conflict && e.code() != Status::not_found) throw;
        }
      }
      for (size_t i = 0; !done_page && i < items.size(); ++i) {
        try {
          store->save(tasks[i], items[i].options);
          ++saved;
        } catch (const StoreError &e) {
          if (e.code() != Status::conflict && e.code() != Status::not_found) throw;
          ++skipped;  // changed or deleted meanwhile: written anew already
        }
      }
      if (Clock::now() - last >= std::chrono::seconds(1)) {
        last = Clock::now();
        std::cerr << "rekey: " << before + saved + skipped + unreadable << " of " << total << " Task(s)" << std::endl;
      }
      cursor = p.next_cursor;
      if (!checkpoint.empty() && !cursor.empty())
        write_checkpoint(checkpoint, selector, cursor, before + saved + skipped + unreadable);
    } while (!cursor.empty());
    store->close();
    if (!checkpoint.empty()) std::remove(checkpoint.c_str());
  } catch (const std::exception &e) {
    std::cerr << "toolnexus store rekey: " << printable(e.what()) << "\n";
    for (const PluginFailure &f : PluginRegistry::global().failures())
      std::cerr << "toolnexus store rekey: " << plugin_failure_text(f) << "\n";
    return 2;
  }
  const double secs = std::chrono::duration<double>(Clock::now() - start).count();
  char rate[64];
  std::snprintf(rate, sizeof rate, "%.1f s (%.0f Tasks/s)", secs, secs > 0 ? static_cast<double>(saved) / secs : 0.0);
  std::cout << "re-saved " << saved << " Task(s), skipped " << skipped << " changed meanwhile"
            << (unreadable > 0 ? ", " + std::to_string(unreadable) + " unreadable (named above)" : std::string()) << ", in "
            << rate << "\n";
  return unreadable > 0 ? 1 : 0;
}

}  // namespace toolnexus::cli::store_detail

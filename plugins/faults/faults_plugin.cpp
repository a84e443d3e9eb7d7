// plugins/faults: the "faults" decorator (ABI 1.6; docs/faults.md), for
// tests and chaos drills. It wraps any store and, deterministically from a
// seed, makes its operations slow or fail the ways real stores fail:
//
//   faults:seed=7,error_rate=0.05,conflict_rate=0.05,lost_rate=0.02,latency_ms=0-3;sqlite:/tmp/t.db
//
// Options (all optional; rates are probabilities in [0, 1]):
//   seed=N            the seed (default 1): the same seed and the same
//                     sequence of operations give the same faults
//   latency_ms=A[-B]  every operation first sleeps A ms (or a drawn A..B)
//   error_rate=P      an operation fails with TNX_EIO before it is done
//   error_rate.OP=P   the same for one operation (get, save, del, list,
//                     count), overriding error_rate for it
//   conflict_rate=P   a compare-and-set save or delete on a version (not
//                     TNX_VERSION_ANY, not a create-only TNX_VERSION_NONE)
//                     fails with TNX_ECONFLICT before it is done, as if
//                     another writer had come first
//   lost_rate=P       a save or delete is done, then fails with TNX_EIO
//                     "connection lost": the caller cannot know whether it
//                     was applied (the ambiguous failure of a network store)
//   crash_at=N        the process aborts (SIGABRT) at the N-th operation,
//                     before doing it: a crash at a chosen point
//   ops=OP|OP...      only these operations get faults (default all)
//
// The draw of operation n is a hash of (seed, n, what is drawn), with n the
// store's operation counter: a single-threaded caller gets the same faults
// on every run; concurrent callers get the same faults for the same order.
// Every injected failure's message starts "faults: injected" and names the
// operation, its number and the seed, so a chaos run's log says what was
// injected. The change feed, counts and capabilities pass through: a
// faulty store keeps what the inner store keeps.
#include "toolnexus/decorator.hpp"
#include "toolnexus/plugin.hpp"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

namespace toolnexus::faults {
namespace {

using sdk::Error;
using sdk::quote;
using sdk::view;

enum Op : int { kGet, kSave, kDel, kList, kCount, kOps };
const char *const kOpNames[kOps] = {"get", "save", "del", "list", "count"};

// SplitMix64 finaliser: a well-mixed 64-bit hash of one 64-bit input.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

double parse_rate(const std::string &name, const std::string &v) {
  char *end = nullptr;
  const double d = std::strtod(v.c_str(), &end);
  if (v.empty() || end == nullptr || *end != '\0' || !(d >= 0.0 && d <= 1.0))
    throw Error(TNX_EINVAL, "faults: option " + name + "=" + quote(v) + ": expected a probability from 0 to 1");
  return d;
}

uint64_t parse_u64(const std::string &name, const std::string &v) {
  char *end = nullptr;
  errno = 0;
  const unsigned long long n = std::strtoull(v.c_str(), &end, 10);
  if (v.empty() || v[0] == '-' || end == nullptr || *end != '\0' || errno != 0)
    throw Error(TNX_EINVAL, "faults: option " + name + "=" + quote(v) + ": expected a non-negative integer");
  return n;
}

int op_of(const std::string &name, const std::string &text) {
  for (int i = 0; i < kOps; ++i)
    if (text == kOpNames[i]) return i;
  throw Error(TNX_EINVAL, "faults: option " + name + ": unknown operation " + quote(text) +
                              " (get, save, del, list, count)");
}

class FaultStore final : public sdk::Store {
 public:
  FaultStore(const tnx_open_args &args, const sdk::DecoratorLocation &loc) : inner_(args, loc.inner, "faults") {
    for (int i = 0; i < kOps; ++i) error_rate_[i] = 0.0, enabled_[i] = true;
    bool per_op_error[kOps] = {false, false, false, false, false};
    for (const auto &[name, value] : loc.options) {
      if (name == "seed") {
        seed_ = parse_u64(name, value);
      } else if (name == "latency_ms") {
        const size_t dash = value.find('-');
        lat_min_ = parse_u64(name, value.substr(0, dash));
        lat_max_ = dash == std::string::npos ? lat_min_ : parse_u64(name, value.substr(dash + 1));
        if (lat_max_ < lat_min_ || lat_max_ > 60000)
          throw Error(TNX_EINVAL, "faults: option latency_ms=" + quote(value) + ": expected A or A-B ms, A <= B <= 60000");
      } else if (name == "error_rate") {
        const double r = parse_rate(name, value);
        for (int i = 0; i < kOps; ++i)
          if (!per_op_error[i]) error_rate_[i] = r;
      } else if (name.rfind("error_rate.", 0) == 0) {
        const int op = op_of(name, name.substr(11));
        error_rate_[op] = parse_rate(name, value);
        per_op_error[op] = true;
      } else if (name == "conflict_rate") {
        conflict_rate_ = parse_rate(name, value);
      } else if (name == "lost_rate") {
        lost_rate_ = parse_rate(name, value);
      } else if (name == "crash_at") {
        crash_at_ = parse_u64(name, value);
        if (crash_at_ == 0) throw Error(TNX_EINVAL, "faults: option crash_at=0: operations are counted from 1");
      } else if (name == "ops") {
        for (int i = 0; i < kOps; ++i) enabled_[i] = false;
        std::string rest = value;
        while (!rest.empty()) {
          const size_t bar = rest.find('|');
          enabled_[op_of(name, rest.substr(0, bar))] = true;
          rest = bar == std::string::npos ? std::string() : rest.substr(bar + 1);
        }
      } else {
        throw Error(TNX_EINVAL, "faults: unknown option " + quote(name) +
                                    " (seed, latency_ms, error_rate, error_rate.OP, conflict_rate, lost_rate, "
                                    "crash_at, ops)");
      }
    }
    keeps_due_ = (inner_.capabilities() & TNX_CAP_DUE_INDEX) != 0;
    sdk::clear_capabilities(args, ~inner_.capabilities());
  }

  bool keeps_due() const noexcept override { return keeps_due_; }

  bool get(std::string_view id, const sdk::RecordOut &out) override {
    before(kGet, id, TNX_VERSION_ANY);
    return inner_.get(id, [&](const tnx_task_record &r) { out(r); });
  }

  uint64_t save(const tnx_task_record &rec, uint64_t expected) override {
    const uint64_t n = before(kSave, view(rec.id), expected);
    const uint64_t v = inner_.save(rec, expected);
    after_write(kSave, n, view(rec.id));
    return v;
  }

  void del(std::string_view id, uint64_t expected) override {
    const uint64_t n = before(kDel, id, expected);
    inner_.del(id, expected);
    after_write(kDel, n, id);
  }

  std::string list(const tnx_list_query &q, const sdk::RecordOut &out) override {
    before(kList, {}, TNX_VERSION_ANY);
    return inner_.list(q, [&](const tnx_task_record &r) { return out(r); });
  }

  uint64_t count(const tnx_list_query &q) override {
    before(kCount, {}, TNX_VERSION_ANY);
    return inner_.count(q);
  }

  void watch(tnx_change_sink sink, void *ctx) override { inner_.watch(sink, ctx); }
  void unwatch() override { inner_.unwatch(); }
  void close() override { inner_.close(); }

 private:
  // A draw in [0, 1) for operation `n`, purpose `salt`.
  double draw(uint64_t n, uint64_t salt) const {
    return static_cast<double>(mix(mix(seed_ ^ (salt << 56)) ^ n) >> 11) * (1.0 / 9007199254740992.0);
  }

  std::string where(int op, uint64_t n, std::string_view id) const {
    std::string s = std::string(kOpNames[op]) + " #" + std::to_string(n);
    if (!id.empty()) s += " of task " + quote(id);
    return s + " (seed " + std::to_string(seed_) + ")";
  }

  // Counts the operation, then sleeps, crashes or fails it as drawn;
  // returns its number.
  uint64_t before(int op, std::string_view id, uint64_t expected) {
    const uint64_t n = ops_.fetch_add(1, std::memory_order_relaxed) + 1;
    if (crash_at_ != 0 && n == crash_at_) std::abort();  // a crash at a chosen point
    if (!enabled_[op]) return n;
    if (lat_max_ != 0) {
      const uint64_t ms = lat_min_ + static_cast<uint64_t>(draw(n, 1) * static_cast<double>(lat_max_ - lat_min_ + 1));
      std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    }
    if (error_rate_[op] > 0 && draw(n, 2) < error_rate_[op])
      throw Error(TNX_EIO, "faults: injected I/O error on " + where(op, n, id) + "; nothing was done");
    // Only where a real store can conflict: a compare-and-set on a version
    // (a create-only save conflicts only when the id exists, which a fault
    // cannot make true).
    if ((op == kSave || op == kDel) && expected != TNX_VERSION_ANY && expected != TNX_VERSION_NONE &&
        conflict_rate_ > 0 &&
        draw(n, 3) < conflict_rate_)
      throw Error(TNX_ECONFLICT, "faults: injected compare-and-set conflict on " + where(op, n, id) +
                                     "; nothing was done");
    return n;
  }

  // A write that was done, reported lost as drawn.
  void after_write(int op, uint64_t n, std::string_view id) const {
    if (enabled_[op] && lost_rate_ > 0 && draw(n, 4) < lost_rate_)
      throw Error(TNX_EIO, "faults: injected connection loss after " + where(op, n, id) +
                               "; the write may have been applied");
  }

  sdk::InnerStore inner_;
  uint64_t seed_ = 1;
  uint64_t lat_min_ = 0, lat_max_ = 0;
  double error_rate_[kOps];
  bool enabled_[kOps];
  double conflict_rate_ = 0, lost_rate_ = 0;
  uint64_t crash_at_ = 0;
  bool keeps_due_ = false;
  std::atomic<uint64_t> ops_{0};
};

sdk::Store *open_store(const tnx_open_args &args) {
  const sdk::DecoratorLocation loc = sdk::parse_decorator_location("faults", view(args.location));
  return new FaultStore(args, loc);
}

const char *const kSchemes[] = {"faults", nullptr};

const tnx_plugin_descriptor kDescriptor = {
    TNX_HEADER_INIT(tnx_plugin_descriptor),
    "toolnexus-faults",
    "1.0.0",
    "decorator for tests and chaos drills: seeded latency, I/O errors, CAS conflicts, lost writes, a crash",
    kSchemes,
    TNX_CAP_THREAD_SAFE | TNX_CAP_PAGINATED_LIST | TNX_CAP_COMPARE_AND_SET | TNX_CAP_DURABLE |
        TNX_CAP_MULTI_PROCESS | TNX_CAP_PERSISTENT | TNX_CAP_CHANGE_FEED | TNX_CAP_DUE_INDEX,
    &sdk::open_trampoline<open_store>,
    nullptr,  // set by sdk::entry
    "faults:[seed=N][,latency_ms=A[-B]][,error_rate[.OP]=P][,conflict_rate=P][,lost_rate=P][,crash_at=N][,ops=OP|OP];"
    "<inner selector>",
};

}  // namespace
}  // namespace toolnexus::faults

extern "C" TNX_PLUGIN_EXPORT const tnx_plugin_descriptor *toolnexus_plugin_entry(const tnx_host_info *host) {
  return toolnexus::sdk::entry<toolnexus::faults::kDescriptor>(host);
}

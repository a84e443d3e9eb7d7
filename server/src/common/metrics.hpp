// server/src/common/metrics.hpp: counters and histograms for /metrics, and
// their Prometheus text exposition (format 0.0.4,
// https://prometheus.io/docs/instrumenting/exposition_formats/).
//
// Recording never takes a lock: a Counter is one atomic add, a Histogram an
// atomic add to its bucket, its sum and its count. A labelled family
// (SeriesTable) finds a series in a fixed open-addressing table whose slots
// are claimed with compare-and-set, so that the request threads never wait
// on each other; only the first use of a label set writes its key.
//
// (Debian's prometheus-cpp would do this too, but its Histogram::Observe and
// Family::Add take a mutex: on every request, on every store call.)
#ifndef TOOLNEXUS_SERVER_METRICS_HPP
#define TOOLNEXUS_SERVER_METRICS_HPP

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace toolnexus::server_detail {

/// A monotonically increasing count. Thread-safe, lock-free.
class Counter {
 public:
  /// Adds `n` (relaxed: a scrape sees each add once, in no particular order).
  void add(uint64_t n = 1) noexcept { value_.fetch_add(n, std::memory_order_relaxed); }
  /// The count so far.
  uint64_t value() const noexcept { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> value_{0};
};

/// Upper bounds (seconds, increasing) of a histogram's buckets, as they
/// are printed in `le` ("0.005"); +Inf is implied.
using BucketBounds = std::vector<std::string>;

/// Latency buckets of an A2A request: 1 ms .. 10 s.
const BucketBounds &request_buckets();
/// Latency buckets of a store operation: 100 us .. 2.5 s.
const BucketBounds &store_buckets();

/// A latency histogram (cumulative buckets at exposition). Thread-safe,
/// lock-free. At most kMaxBuckets bounds.
class Histogram {
 public:
  /// Bounds beyond the first kMaxBuckets are ignored.
  static constexpr std::size_t kMaxBuckets = 16;
  /// `bounds` must outlive the histogram (the tables above are static).
  explicit Histogram(const BucketBounds &bounds);
  Histogram(const Histogram &) = delete;
  Histogram &operator=(const Histogram &) = delete;
  /// Counts one observation of `ns` nanoseconds.
  void observe_ns(uint64_t ns) noexcept;
  /// Observations so far.
  uint64_t count() const noexcept { return count_.load(std::memory_order_relaxed); }
  /// Appends the _bucket, _sum and _count lines of `name` with `labels`
  /// (rendered label pairs without braces, "" for none) to `out`.
  void render(std::string &out, std::string_view name, std::string_view labels) const;

 private:
  const BucketBounds &bounds_;
  std::vector<uint64_t> limits_ns_;
  /// Per bucket (not cumulative); the last is +Inf.
  std::array<std::atomic<uint64_t>, kMaxBuckets + 1> buckets_{};
  std::atomic<uint64_t> sum_ns_{0};
  std::atomic<uint64_t> count_{0};
};

/// `name="value"` with the value escaped as the text format requires
/// (backslash, double quote, line feed), appended to `out` (with a comma
/// first when `out` is not empty).
void append_label(std::string &out, std::string_view name, std::string_view value);

/// A family's series by label set: a fixed table of kSlots, claimed without
/// locks. `Series` is Counter or Histogram (constructed with `args...`).
/// The key is the rendered label pairs (append_label). When the table is
/// full, further label sets share one series labelled `overflow_key`. Thread-
/// safe; series are never removed.
template <class Series, std::size_t kSlots = 512>
class SeriesTable {
  static_assert((kSlots & (kSlots - 1)) == 0, "kSlots must be a power of two");

 public:
  /// `make()` returns a std::unique_ptr<Series>: each slot's series (and the
  /// overflow one).
  template <class Make>
  SeriesTable(std::string overflow_key, Make make) : overflow_key_(std::move(overflow_key)) {
    slots_.reserve(kSlots);
    for (std::size_t i = 0; i < kSlots; ++i) slots_.push_back(std::make_unique<Slot>(make()));
    overflow_ = make();
  }
  /// The series of `key`, created at its first use.
  Series &at(std::string_view key) {
    const std::size_t h = std::hash<std::string_view>{}(key);
    for (std::size_t i = 0; i < kSlots; ++i) {
      Slot &s = *slots_[(h + i) & (kSlots - 1)];
      int state = s.state.load(std::memory_order_acquire);
      if (state == kFree) {
        if (s.state.compare_exchange_strong(state, kWriting, std::memory_order_acq_rel)) {
          s.key.assign(key);
          s.state.store(kReady, std::memory_order_release);
          return *s.series;
        }
      }
      while (state == kWriting) {  // another thread is writing this slot's key: a few instructions
        std::this_thread::yield();
        state = s.state.load(std::memory_order_acquire);
      }
      if (s.key == key) return *s.series;
    }
    overflowed_.store(true, std::memory_order_relaxed);
    return *overflow_;
  }
  /// Calls fn(key, series) for every series in use (order unspecified).
  template <class Fn>
  void for_each(Fn fn) const {
    for (const auto &s : slots_)
      if (s->state.load(std::memory_order_acquire) == kReady) fn(std::string_view(s->key), *s->series);
    if (overflowed_.load(std::memory_order_relaxed)) fn(std::string_view(overflow_key_), *overflow_);
  }

 private:
  static constexpr int kFree = 0, kWriting = 1, kReady = 2;
  struct Slot {
    explicit Slot(std::unique_ptr<Series> made) : series(std::move(made)) {}
    std::atomic<int> state{kFree};
    std::string key;
    std::unique_ptr<Series> series;
  };
  std::vector<std::unique_ptr<Slot>> slots_;
  std::string overflow_key_;
  std::unique_ptr<Series> overflow_;
  std::atomic<bool> overflowed_{false};
};

/// Appends "# HELP name help\n# TYPE name type\n" to `out`.
void append_header(std::string &out, std::string_view name, std::string_view type, std::string_view help);
/// Appends one sample line: name{labels} value ("name value" without labels).
void append_sample(std::string &out, std::string_view name, std::string_view labels, std::string_view value);

}  // namespace toolnexus::server_detail

#endif  // TOOLNEXUS_SERVER_METRICS_HPP

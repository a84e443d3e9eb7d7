// Counters, histograms and the Prometheus text exposition (metrics.hpp).
#include "common/metrics.hpp"

#include <cstdio>
#include <cstdlib>

namespace toolnexus::server_detail {

const BucketBounds &request_buckets() {
  static const BucketBounds b = {"0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1",
                                 "0.25",  "0.5",    "1",     "2.5",  "5",     "10"};
  return b;
}

const BucketBounds &store_buckets() {
  static const BucketBounds b = {"0.0001", "0.00025", "0.0005", "0.001", "0.0025", "0.005", "0.01",
                                 "0.025",  "0.05",    "0.1",    "0.25",  "0.5",    "1",     "2.5"};
  return b;
}

Histogram::Histogram(const BucketBounds &bounds) : bounds_(bounds) {
  for (std::size_t i = 0; i < bounds.size() && i < kMaxBuckets; ++i)
    limits_ns_.push_back(static_cast<uint64_t>(std::strtod(bounds[i].c_str(), nullptr) * 1e9 + 0.5));
}

void Histogram::observe_ns(uint64_t ns) noexcept {
  std::size_t i = 0;
  while (i < limits_ns_.size() && ns > limits_ns_[i]) ++i;
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  sum_ns_.fetch_add(ns, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
}

void Histogram::render(std::string &out, std::string_view name, std::string_view labels) const {
  // Read the buckets first and make the count their sum, so that a scrape
  // racing an observation still shows _count equal to the +Inf bucket.
  uint64_t cumulative = 0;
  std::string bucket_name(name);
  bucket_name += "_bucket";
  for (std::size_t i = 0; i <= limits_ns_.size(); ++i) {
    cumulative += buckets_[i].load(std::memory_order_relaxed);
    std::string l(labels);
    append_label(l, "le", i < limits_ns_.size() ? std::string_view(bounds_[i]) : std::string_view("+Inf"));
    append_sample(out, bucket_name, l, std::to_string(cumulative));
  }
  char sum[64];
  std::snprintf(sum, sizeof sum, "%.9f", static_cast<double>(sum_ns_.load(std::memory_order_relaxed)) / 1e9);
  append_sample(out, std::string(name) + "_sum", labels, sum);
  append_sample(out, std::string(name) + "_count", labels, std::to_string(cumulative));
}

void append_label(std::string &out, std::string_view name, std::string_view value) {
  if (!out.empty()) out += ',';
  out.append(name);
  out += "=\"";
  for (const char c : value) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  out += '"';
}

void append_header(std::string &out, std::string_view name, std::string_view type, std::string_view help) {
  out += "# HELP ";
  out.append(name);
  out += ' ';
  out.append(help);
  out += "\n# TYPE ";
  out.append(name);
  out += ' ';
  out.append(type);
  out += '\n';
}

void append_sample(std::string &out, std::string_view name, std::string_view labels, std::string_view value) {
  out.append(name);
  if (!labels.empty()) {
    out += '{';
    out.append(labels);
    out += '}';
  }
  out += ' ';
  out.append(value);
  out += '\n';
}

}  // namespace toolnexus::server_detail

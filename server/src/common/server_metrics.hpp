// server/src/common/server_metrics.hpp: what a server counts for /metrics
// (docs/operations.md, "Running replicas" lists the metrics). One per
// server (serve()), shared by its layers; every recording is lock-free
// (metrics.hpp). Names follow the Prometheus conventions: base units
// (seconds), counters end in _total.
#ifndef TOOLNEXUS_SERVER_SERVER_METRICS_HPP
#define TOOLNEXUS_SERVER_SERVER_METRICS_HPP

#include "common/metrics.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace toolnexus::server_detail {

/// A TaskStore operation, as /metrics labels it (op="get", ...).
enum class StoreOp { get, save, save_batch, remove, list, count };
/// Number of StoreOp values.
constexpr std::size_t kStoreOps = 6;
/// "get", "save", "save_batch", "delete", "list", "count".
std::string_view store_op_name(StoreOp op) noexcept;

/// Values read when /metrics is scraped (not counted on the hot path).
struct GaugeValues {
  /// Tasks whose executor runs in this server now.
  std::size_t tasks_running = 0;
  /// Tasks waiting for an executor thread.
  std::size_t tasks_queued = 0;
  /// SSE streams open.
  std::size_t streams_open = 0;
  /// Client connections open (idle ones included).
  std::size_t connections_open = 0;
  /// 1 while ready (see /readyz), 0 once the drain started.
  bool ready = true;
  /// The store's change feed (ABI 1.4) carries others' changes (else: polling).
  bool change_feed = false;
  /// Gaps the feed reported (each re-read every watched Task).
  uint64_t change_feed_gaps = 0;
  /// Store reads made to learn of others' changes (feed re-reads or polls).
  uint64_t watch_rereads = 0;
};

/// A server's metrics. Thread-safe; recording never locks.
class ServerMetrics {
 public:
  ServerMetrics();
  ServerMetrics(const ServerMetrics &) = delete;
  ServerMetrics &operator=(const ServerMetrics &) = delete;

  /// One answered A2A request: `method` the A2A v1.0 method name
  /// ("GetTask"; "unknown" before it was read, "other" for a name A2A does
  /// not have), `dialect` "0.3", "1.0" or "1.1", `transport` "jsonrpc", "rest" or
  /// "sse" (a stream was opened), `status` the HTTP status, `ns` the time
  /// until the answer (or the stream) was handed to the connection.
  void observe_request(std::string_view method, std::string_view dialect, std::string_view transport, int status,
                       uint64_t ns);
  /// One TaskStore call that took `ns`; `error` is the TNX status name
  /// ("conflict", "io", ...; nullptr when it succeeded). A conflict of a
  /// compare-and-set save or delete also counts in CAS conflicts.
  void observe_store(StoreOp op, uint64_t ns, const char *error);

  /// Requests with `method` counted so far (all labels but the method
  /// summed); for tests.
  uint64_t requests(std::string_view method) const;
  /// Store calls of `op` so far; for tests.
  uint64_t store_calls(StoreOp op) const { return store_latency_[static_cast<std::size_t>(op)]->count(); }

  /// Expired leases of Tasks settled (failed) by this server.
  Counter leases_settled;
  /// Retention sweeps (issue 22.3): records their lists read (the cost),
  /// terminal Tasks deleted past their keep time, waiting Tasks ended past
  /// their wait, by this server.
  Counter retention_read;
  Counter retention_deleted;
  Counter retention_expired;
  /// Push notifications a webhook accepted (2xx).
  Counter push_deliveries;
  /// Push notification POSTs that failed (no answer, not 2xx).
  Counter push_failures;
  /// Retries scheduled after a failed push notification.
  Counter push_retries;
  /// Push configs given up on (attempts or time exhausted).
  Counter push_give_ups;

  /// The whole exposition (text format 0.0.4), with `gauges`.
  std::string render(const GaugeValues &gauges) const;

 private:
  SeriesTable<Counter, 1024> requests_;
  SeriesTable<Histogram, 256> request_latency_;
  std::array<std::unique_ptr<Histogram>, kStoreOps> store_latency_;
  SeriesTable<Counter, 128> store_errors_;
  Counter cas_conflicts_;
};

}  // namespace toolnexus::server_detail

#endif  // TOOLNEXUS_SERVER_SERVER_METRICS_HPP

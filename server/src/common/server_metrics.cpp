// A server's metrics and their exposition (server_metrics.hpp).
#include "common/server_metrics.hpp"

#include <cstring>

namespace toolnexus::server_detail {

namespace {

constexpr const char *kRequests = "toolnexus_a2a_requests_total";
constexpr const char *kRequestSeconds = "toolnexus_a2a_request_duration_seconds";
constexpr const char *kStoreCalls = "toolnexus_store_operations_total";
constexpr const char *kStoreSeconds = "toolnexus_store_operation_duration_seconds";
constexpr const char *kStoreErrors = "toolnexus_store_errors_total";

std::string request_key(std::string_view method, std::string_view dialect, std::string_view transport, int status) {
  std::string k;
  append_label(k, "method", method);
  append_label(k, "dialect", dialect);
  append_label(k, "transport", transport);
  append_label(k, "code", std::to_string(status));
  return k;
}

std::string latency_key(std::string_view method, std::string_view transport) {
  std::string k;
  append_label(k, "method", method);
  append_label(k, "transport", transport);
  return k;
}

void counter(std::string &out, const char *name, const char *help, uint64_t v) {
  append_header(out, name, "counter", help);
  append_sample(out, name, "", std::to_string(v));
}

void gauge(std::string &out, const char *name, const char *help, uint64_t v) {
  append_header(out, name, "gauge", help);
  append_sample(out, name, "", std::to_string(v));
}

}  // namespace

std::string_view store_op_name(StoreOp op) noexcept {
  switch (op) {
    case StoreOp::get: return "get";
    case StoreOp::save: return "save";
    case StoreOp::save_batch: return "save_batch";
    case StoreOp::remove: return "delete";
    case StoreOp::list: return "list";
    case StoreOp::count: return "count";
  }
  return "other";
}

ServerMetrics::ServerMetrics()
    : requests_(request_key("overflow", "overflow", "overflow", 0), [] { return std::make_unique<Counter>(); }),
      request_latency_(latency_key("overflow", "overflow"),
                       [] { return std::make_unique<Histogram>(request_buckets()); }),
      store_errors_("op=\"overflow\",error=\"overflow\"", [] { return std::make_unique<Counter>(); }) {
  for (auto &h : store_latency_) h = std::make_unique<Histogram>(store_buckets());
}

void ServerMetrics::observe_request(std::string_view method, std::string_view dialect, std::string_view transport,
                                    int status, uint64_t ns) {
  requests_.at(request_key(method, dialect, transport, status)).add();
  request_latency_.at(latency_key(method, transport)).observe_ns(ns);
}

void ServerMetrics::observe_store(StoreOp op, uint64_t ns, const char *error) {
  store_latency_[static_cast<std::size_t>(op)]->observe_ns(ns);
  if (error == nullptr) return;
  std::string k;
  append_label(k, "op", store_op_name(op));
  append_label(k, "error", error);
  store_errors_.at(k).add();
  if (std::strcmp(error, "conflict") == 0 && (op == StoreOp::save || op == StoreOp::save_batch || op == StoreOp::remove))
    cas_conflicts_.add();
}

uint64_t ServerMetrics::requests(std::string_view method) const {
  std::string prefix;
  append_label(prefix, "method", method);
  prefix += ',';
  uint64_t n = 0;
  requests_.for_each([&](std::string_view key, const Counter &c) {
    if (key.substr(0, prefix.size()) == prefix) n += c.value();
  });
  return n;
}

std::string ServerMetrics::render(const GaugeValues &g) const {
  std::string out;
  out.reserve(16 * 1024);
  append_header(out, kRequests, "counter",
                "A2A requests answered, by A2A method, protocol dialect, transport (jsonrpc, rest, sse) and HTTP "
                "status code.");
  requests_.for_each([&](std::string_view key, const Counter &c) {
    append_sample(out, kRequests, key, std::to_string(c.value()));
  });
  append_header(out, kRequestSeconds, "histogram",
                "Time from a complete A2A request to its answer (for a stream: to its opening), in seconds.");
  request_latency_.for_each(
      [&](std::string_view key, const Histogram &h) { h.render(out, kRequestSeconds, key); });

  append_header(out, kStoreCalls, "counter", "TaskStore calls, by operation.");
  for (std::size_t i = 0; i < kStoreOps; ++i) {
    std::string l;
    append_label(l, "op", store_op_name(static_cast<StoreOp>(i)));
    append_sample(out, kStoreCalls, l, std::to_string(store_latency_[i]->count()));
  }
  append_header(out, kStoreSeconds, "histogram", "Duration of TaskStore calls, by operation, in seconds.");
  for (std::size_t i = 0; i < kStoreOps; ++i) {
    std::string l;
    append_label(l, "op", store_op_name(static_cast<StoreOp>(i)));
    store_latency_[i]->render(out, kStoreSeconds, l);
  }
  append_header(out, kStoreErrors, "counter",
                "TaskStore calls that failed, by operation and TNX status name (not_found, conflict, io, corrupt, "
                "...).");
  store_errors_.for_each([&](std::string_view key, const Counter &c) {
    append_sample(out, kStoreErrors, key, std::to_string(c.value()));
  });
  counter(out, "toolnexus_store_cas_conflicts_total",
          "Compare-and-set saves and deletes refused because the Task had changed meanwhile.", cas_conflicts_.value());
  gauge(out, "toolnexus_tasks_running", "Tasks whose executor runs in this server.", g.tasks_running);
  gauge(out, "toolnexus_tasks_queued", "Tasks waiting for an executor thread.", g.tasks_queued);
  gauge(out, "toolnexus_streams_open", "SSE streams open.", g.streams_open);
  gauge(out, "toolnexus_http_connections_open", "Client connections open, idle ones included.",
        g.connections_open);
  gauge(out, "toolnexus_ready", "1 while /readyz answers 200, 0 once the drain has begun or the store fails.",
        g.ready ? 1 : 0);
  counter(out, "toolnexus_push_deliveries_total", "Push notifications a webhook accepted (HTTP 2xx).",
          push_deliveries.value());
  counter(out, "toolnexus_push_failures_total", "Push notification POSTs that failed (no answer, or not 2xx).",
          push_failures.value());
  counter(out, "toolnexus_push_retries_total", "Retries scheduled after a failed push notification.",
          push_retries.value());
  counter(out, "toolnexus_push_give_ups_total",
          "Push notification configs given up on after their attempts or time ran out.", push_give_ups.value());
  gauge(out, "toolnexus_change_feed",
        "1 when the store's change feed (ABI 1.4) tells this server of others' changes, 0 when it polls.",
        g.change_feed ? 1 : 0);
  counter(out, "toolnexus_change_feed_gaps_total",
          "Gaps the store's change feed reported (changes possibly missed; every watched Task was read again).",
          g.change_feed_gaps);
  counter(out, "toolnexus_watch_rereads_total",
          "Store reads made to learn of changes made elsewhere (a change the feed announced, or a poll).",
          g.watch_rereads);
  counter(out, "toolnexus_leases_settled_total",
          "Tasks left running by a stopped server (expired lease) that this server settled as failed.",
          leases_settled.value());
  counter(out, "toolnexus_retention_records_read_total",
          "Records the retention sweeps of this server read (their cost: what was due, or a full pass's).",
          retention_read.value());
  counter(out, "toolnexus_retention_deleted_total",
          "Terminal Tasks this server deleted past their retention (keep time).", retention_deleted.value());
  counter(out, "toolnexus_retention_expired_total",
          "Waiting Tasks (input-required, auth-required) this server ended past their retention wait.",
          retention_expired.value());
  return out;
}

}  // namespace toolnexus::server_detail

// server/src/bindings/operator.hpp: the endpoints operators run replicas
// with (docs/operations.md, "Running replicas"):
//   GET|HEAD /healthz  200 "ok": the process serves HTTP (no store access).
//   GET|HEAD /readyz   200 "ready" when the store answers a read within
//                      kReadyStoreTimeoutMs; 503 with the reason when it
//                      fails or is slower, and from the moment the stop
//                      (SIGTERM) begins: the balancer stops sending first.
//   GET|HEAD /metrics  Prometheus text exposition 0.0.4 (ServerMetrics),
//                      on the admin listener only (--admin-listen).
// Other methods: 405. They take no authentication and none of the API's
// Host, Origin or Content-Type checks (probes come from balancers and
// kubelets, which send none of that). The admin listener is a small
// HttpReactor of its own that serves only these and keeps answering through
// the whole drain, after the API listener has stopped accepting.
#ifndef TOOLNEXUS_SERVER_OPERATOR_HPP
#define TOOLNEXUS_SERVER_OPERATOR_HPP

#include "common/log.hpp"
#include "common/server_metrics.hpp"
#include "service/a2a_methods.hpp"
#include "wire/http_reactor.hpp"

#include "toolnexus/task_store.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

namespace toolnexus::server_detail {

/// How long /readyz waits for the store's answer to its read, in ms.
constexpr int kReadyStoreTimeoutMs = 1000;

/// The A2A v1.0 method name of a JSON-RPC method name of either dialect
/// ("tasks/get" -> "GetTask"); "other" for a name A2A does not define,
/// "unknown" for "" (the request was not read that far). For labels.
std::string_view method_label(std::string_view rpc_method) noexcept;
/// The A2A v1.0 method name of `m` (the HTTP+JSON routes).
std::string_view method_label(A2AMethod m) noexcept;

/// A Responder that counts its request in ServerMetrics (observe_request)
/// when the answer or the stream is handed over, before the client can have
/// it: a client that reads its answer and then scrapes /metrics sees its
/// request counted. The labels are read then, through the pointers (the
/// router sets them while handling; an empty method: not counted). Used on
/// one worker thread for one request.
class MeteredResponder final : public Responder {
 public:
  /// `metrics` null: counts nothing. The pointed-to labels outlive this.
  MeteredResponder(Responder &inner, ServerMetrics *metrics, const std::string_view *method,
                   const std::string_view *dialect, const std::string_view *transport)
      : inner_(inner), metrics_(metrics), method_(method), dialect_(dialect), transport_(transport),
        started_(std::chrono::steady_clock::now()) {}
  void reply(HttpReply reply) override {
    count(reply.status);
    inner_.reply(std::move(reply));
  }
  std::shared_ptr<SseStream> start_stream(std::vector<std::pair<std::string, std::string>> headers,
                                          std::string label) override {
    count(200);
    return inner_.start_stream(std::move(headers), std::move(label));
  }
  bool answered() const noexcept override { return inner_.answered(); }

 private:
  void count(int status);

  Responder &inner_;
  ServerMetrics *metrics_;
  const std::string_view *method_, *dialect_, *transport_;
  std::chrono::steady_clock::time_point started_;
};

/// The probes and the metrics page. Thread-safe; one per server.
class OperatorEndpoints {
 public:
  /// `store` is read by /readyz; `gauges` is called by /metrics (any
  /// thread); `metrics` must outlive this.
  OperatorEndpoints(std::shared_ptr<TaskStore> store, ServerMetrics &metrics, std::function<GaugeValues()> gauges);
  /// Stops the store-check thread (a read still hanging in the store is
  /// waited for).
  ~OperatorEndpoints();
  OperatorEndpoints(const OperatorEndpoints &) = delete;
  OperatorEndpoints &operator=(const OperatorEndpoints &) = delete;

  /// Whether `path` is /healthz, /readyz or /metrics.
  static bool serves(std::string_view path) noexcept;
  /// Answers a request for one of those paths; returns the status sent.
  /// `metrics_here` false: /metrics is 404 with a word on --admin-listen.
  int handle(const HttpRequest &req, Responder &out, bool metrics_here);
  /// From now on /readyz answers 503 (the stop began). Idempotent.
  void begin_drain() noexcept { draining_.store(true); }
  /// "" when ready, else why not (what /readyz says with its 503).
  std::string not_ready_reason();

 private:
  void check_loop();

  std::shared_ptr<TaskStore> store_;
  ServerMetrics &metrics_;
  std::function<GaugeValues()> gauges_;
  std::atomic<bool> draining_{false};
  // The store check: one read at a time on check_thread_, whoever waits.
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t requested_ = 0;  // checks asked for
  uint64_t finished_ = 0;   // checks done (the last one's result below)
  std::string last_error_;
  bool stop_ = false;
  std::thread check_thread_;
};

/// The admin listener: /healthz, /readyz and /metrics on an address of
/// their own (everything else 404). start()/stop() from one thread.
class AdminListener {
 public:
  /// Binds HOST:PORT (throws std::runtime_error naming the address when it
  /// cannot). `endpoints` and `log` must outlive this.
  AdminListener(const std::string &host, uint16_t port, OperatorEndpoints &endpoints, const Logger &log);
  ~AdminListener();
  AdminListener(const AdminListener &) = delete;
  AdminListener &operator=(const AdminListener &) = delete;
  void start();
  /// Stops (requests being answered get up to `grace_ms`). Idempotent.
  void stop(int grace_ms);
  /// The bound port.
  uint16_t port() const noexcept { return port_; }

 private:
  std::unique_ptr<HttpReactor> reactor_;
  uint16_t port_ = 0;
};

}  // namespace toolnexus::server_detail

#endif  // TOOLNEXUS_SERVER_OPERATOR_HPP

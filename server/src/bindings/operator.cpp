// The probes, the metrics page and the admin listener (operator.hpp).
#include "bindings/operator.hpp"

#include <Poco/Exception.h>
#include <Poco/Net/HTTPRequest.h>
#include <Poco/Net/ServerSocket.h>
#include <Poco/Net/SocketAddress.h>

#include <chrono>
#include <stdexcept>
#include <utility>

namespace toolnexus::server_detail {

namespace {

// JSON-RPC names of both dialects -> the A2A v1.0 method name.
constexpr std::pair<std::string_view, std::string_view> kRpcNames[] = {
    {"SendMessage", "SendMessage"},
    {"message/send", "SendMessage"},
    {"SendStreamingMessage", "SendStreamingMessage"},
    {"message/stream", "SendStreamingMessage"},
    {"GetTask", "GetTask"},
    {"tasks/get", "GetTask"},
    {"CancelTask", "CancelTask"},
    {"tasks/cancel", "CancelTask"},
    {"ListTasks", "ListTasks"},
    {"tasks/list", "ListTasks"},
    {"SubscribeToTask", "SubscribeToTask"},
    {"tasks/resubscribe", "SubscribeToTask"},
    {"CreateTaskPushNotificationConfig", "CreateTaskPushNotificationConfig"},
    {"SetTaskPushNotificationConfig", "CreateTaskPushNotificationConfig"},
    {"tasks/pushNotificationConfig/set", "CreateTaskPushNotificationConfig"},
    {"GetTaskPushNotificationConfig", "GetTaskPushNotificationConfig"},
    {"tasks/pushNotificationConfig/get", "GetTaskPushNotificationConfig"},
    {"ListTaskPushNotificationConfigs", "ListTaskPushNotificationConfigs"},
    {"ListTaskPushNotificationConfig", "ListTaskPushNotificationConfigs"},
    {"tasks/pushNotificationConfig/list", "ListTaskPushNotificationConfigs"},
    {"DeleteTaskPushNotificationConfig", "DeleteTaskPushNotificationConfig"},
    {"tasks/pushNotificationConfig/delete", "DeleteTaskPushNotificationConfig"},
    {"GetExtendedAgentCard", "GetExtendedAgentCard"},
    {"GetAuthenticatedExtendedCard", "GetExtendedAgentCard"},
    {"agent/getAuthenticatedExtendedCard", "GetExtendedAgentCard"},
};

HttpReply text_reply(int status, std::string text, const HttpRequest &req) {
  HttpReply r;
  r.status = status;
  r.content_type = "text/plain; charset=utf-8";
  r.body = std::move(text);
  r.body += '\n';
  r.headers.emplace_back("Cache-Control", "no-store");
  r.head_only = req.head.getMethod() == Poco::Net::HTTPRequest::HTTP_HEAD;
  return r;
}

}  // namespace

std::string_view method_label(std::string_view rpc_method) noexcept {
  if (rpc_method.empty()) return "unknown";
  for (const auto &[wire, name] : kRpcNames)
    if (wire == rpc_method) return name;
  return "other";
}

std::string_view method_label(A2AMethod m) noexcept {
  switch (m) {
    case A2AMethod::send_message: return "SendMessage";
    case A2AMethod::get_task: return "GetTask";
    case A2AMethod::cancel_task: return "CancelTask";
    case A2AMethod::list_tasks: return "ListTasks";
    case A2AMethod::send_streaming_message: return "SendStreamingMessage";
    case A2AMethod::subscribe_to_task: return "SubscribeToTask";
    case A2AMethod::push_create: return "CreateTaskPushNotificationConfig";
    case A2AMethod::push_get: return "GetTaskPushNotificationConfig";
    case A2AMethod::push_list: return "ListTaskPushNotificationConfigs";
    case A2AMethod::push_delete: return "DeleteTaskPushNotificationConfig";
    case A2AMethod::extended_card: return "GetExtendedAgentCard";
  }
  return "other";
}

void MeteredResponder::count(int status) {
  if (metrics_ == nullptr || method_->empty() || answered()) return;
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - started_);
  metrics_->observe_request(*method_, *dialect_, *transport_, status, static_cast<uint64_t>(ns.count()));
}

OperatorEndpoints::OperatorEndpoints(std::shared_ptr<TaskStore> store, ServerMetrics &metrics,
                                     std::function<GaugeValues()> gauges)
    : store_(std::move(store)), metrics_(metrics), gauges_(std::move(gauges)) {
  check_thread_ = std::thread([this] { check_loop(); });
}

OperatorEndpoints::~OperatorEndpoints() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  check_thread_.join();
}

bool OperatorEndpoints::serves(std::string_view path) noexcept {
  return path == "/healthz" || path == "/readyz" || path == "/metrics";
}

void OperatorEndpoints::check_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || requested_ > finished_; });
    if (stop_) return;
    const uint64_t serving = requested_;
    lock.unlock();
    std::string error;
    try {
      // Any id: a store that answers "none" (or the record) is open and
      // reading.
      (void)store_->get("toolnexus-readiness-probe");
    } catch (const std::exception &e) {
      error = e.what();
      if (error.empty()) error = "an unnamed error";
    }
    lock.lock();
    last_error_ = std::move(error);
    finished_ = serving;
    cv_.notify_all();
  }
}

std::string OperatorEndpoints::not_ready_reason() {
  if (draining_.load())
    return "not ready: this server is stopping (the drain began); send new requests to another replica";
  std::unique_lock<std::mutex> lock(mu_);
  // Joins a check in flight, or asks for a new one: never more than one
  // read at a time, however many probes wait (a hung store holds one
  // thread, not one per probe).
  const uint64_t want = requested_ > finished_ ? requested_ : ++requested_;
  cv_.notify_all();
  if (!cv_.wait_for(lock, std::chrono::milliseconds(kReadyStoreTimeoutMs), [&] { return finished_ >= want; }))
    return "not ready: the task store did not answer a read within " + std::to_string(kReadyStoreTimeoutMs) + " ms";
  if (!last_error_.empty()) return "not ready: the task store failed a read: " + last_error_;
  return {};
}

int OperatorEndpoints::handle(const HttpRequest &req, Responder &out, bool metrics_here) {
  const std::string &m = req.head.getMethod();
  if (m != Poco::Net::HTTPRequest::HTTP_GET && m != Poco::Net::HTTPRequest::HTTP_HEAD) {
    HttpReply r = text_reply(405, m.substr(0, 32) + " is not allowed here; " + req.path + " takes GET or HEAD", req);
    r.headers.emplace_back("Allow", "GET, HEAD");
    out.reply(std::move(r));
    return 405;
  }
  if (req.path == "/healthz") {
    out.reply(text_reply(200, "ok", req));
    return 200;
  }
  if (req.path == "/readyz") {
    std::string why = not_ready_reason();
    const int status = why.empty() ? 200 : 503;
    out.reply(text_reply(status, why.empty() ? std::string("ready") : std::move(why), req));
    return status;
  }
  if (!metrics_here) {
    out.reply(text_reply(
        404, "/metrics is served on the admin listener only: start the server with --admin-listen HOST:PORT", req));
    return 404;
  }
  GaugeValues g = gauges_ ? gauges_() : GaugeValues{};
  g.ready = !draining_.load();
  HttpReply r = text_reply(200, metrics_.render(g), req);
  r.body.pop_back();  // the exposition ends in its own line feed
  r.content_type = "text/plain; version=0.0.4; charset=utf-8";
  out.reply(std::move(r));
  return 200;
}

AdminListener::AdminListener(const std::string &host, uint16_t port, OperatorEndpoints &endpoints,
                             const Logger &log) {
  Poco::Net::ServerSocket socket;
  try {
    socket.bind(Poco::Net::SocketAddress(host, port), /*reuseAddress=*/true, /*reusePort=*/false);
    socket.listen(64);
  } catch (const Poco::Exception &e) {
    throw std::runtime_error("cannot listen on " + host + ":" + std::to_string(port) +
                             " (admin.listen): " + e.displayText());
  }
  port_ = socket.address().port();
  ReactorLimits rl;
  rl.max_header_bytes = 8 * 1024;
  rl.max_body_bytes = 1024;
  rl.workers = 2;
  rl.max_queued_requests = 64;
  rl.max_open_connections = 256;
  rl.server_name = "toolnexus-admin";
  OperatorEndpoints *ep = &endpoints;
  reactor_ = std::make_unique<HttpReactor>(
      std::move(socket), rl,
      [ep](HttpRequest &req, Responder &out) {
        if (OperatorEndpoints::serves(req.path)) {
          ep->handle(req, out, /*metrics_here=*/true);
          return;
        }
        HttpReply r;
        r.status = 404;
        r.content_type = "text/plain; charset=utf-8";
        r.body = "not found: this is the admin listener (GET /healthz, /readyz, /metrics); the A2A API is on "
                 "--listen\n";
        out.reply(std::move(r));
      },
      log);
}

AdminListener::~AdminListener() {
  try {
    stop(1000);
  } catch (...) {
  }
}

void AdminListener::start() { reactor_->start(); }

void AdminListener::stop(int grace_ms) {
  if (reactor_) reactor_->stop(grace_ms);
}

}  // namespace toolnexus::server_detail

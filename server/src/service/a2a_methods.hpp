// server/src/service/a2a_methods.hpp: the A2A methods, the place where a Task is
// served. Validates params (naming the offending field), applies owner and
// tenant scoping, and maps lifecycle and store errors to the A2A error codes.
// One implementation serves both bindings (JSON-RPC, A2A v1.0 section 9;
// HTTP+JSON, section 11: see rest.hpp) and both dialects (v0.3 and v1.0
// shapes: see dialect.hpp). Spec: A2A v0.3 section 7 / v1.0 section 3.1
// (operations), v0.3 section 8 / v1.0 section 3.3.2 and 9.5 (errors).
#ifndef TOOLNEXUS_SERVER_A2A_METHODS_HPP
#define TOOLNEXUS_SERVER_A2A_METHODS_HPP

#include "common/log.hpp"
#include "delivery/push.hpp"
#include "delivery/streams.hpp"
#include "domain/task_lifecycle.hpp"
#include "wire/dialect.hpp"
#include "wire/errors.hpp"
#include "wire/jsonrpc.hpp"

#include <atomic>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace toolnexus::server_detail {

/// The A2A operations (one name for each, whatever the binding calls it).
enum class A2AMethod {
  send_message,       ///< SendMessage / message/send / POST /message:send
  get_task,           ///< GetTask / tasks/get / GET /tasks/{id}
  cancel_task,        ///< CancelTask / tasks/cancel / POST /tasks/{id}:cancel
  list_tasks,         ///< ListTasks / tasks/list / GET /tasks
  send_streaming_message,  ///< SendStreamingMessage / message/stream / POST /message:stream
  subscribe_to_task,  ///< SubscribeToTask / tasks/resubscribe / GET|POST /tasks/{id}:subscribe
  push_create,        ///< CreateTaskPushNotificationConfig / tasks/pushNotificationConfig/set / POST .../pushNotificationConfigs
  push_get,           ///< GetTaskPushNotificationConfig / .../get / GET .../pushNotificationConfigs/{cid}
  push_list,          ///< ListTaskPushNotificationConfigs / .../list / GET .../pushNotificationConfigs
  push_delete,        ///< DeleteTaskPushNotificationConfig / .../delete / DELETE .../pushNotificationConfigs/{cid}
  extended_card,      ///< GetExtendedAgentCard (-32007)
};

/// Who is calling and how.
struct CallContext {
  /// The authenticated principal ("" when authentication is off).
  std::string principal;
  /// The shapes the request and its answer use.
  Dialect dialect = Dialect::v0_3;
  /// The tenant (v1.0: the HTTP+JSON path's {tenant}, else params.tenant;
  /// "" = none). A Task is visible only with the tenant it was created
  /// with; a v0.3 request has tenant "".
  std::string tenant;
  /// The tenant the caller's credential binds it to (a JWT's tenant claim,
  /// auth.jwt.tenant_claim; nullopt = not bound). See bind_tenant().
  std::optional<std::string> bound_tenant;
};

/// Applies `call.bound_tenant`: a request that names no tenant gets it; one
/// naming another tenant is refused (throws RpcError -32602 on
/// params.tenant, "... is not the tenant this credential is bound to").
/// Does nothing when the caller is not bound.
void bind_tenant(CallContext &call);

/// Serves the A2A methods. Thread-safe (per-thread parse buffers); the
/// lifecycle and store it uses are shared.
class A2AMethods {
 public:
  /// `push` (borrowed, may be null: push notifications off) validates and
  /// delivers webhook configs. A message with more than `max_message_parts`
  /// parts is refused (-32602, params.message.parts).
  /// `max_long_polls`: how many GetTask long-polls (currentGeneration) may
  /// wait at once; one more is answered at once with the Task as it is (as
  /// at the bound), so that waiting polls never take every request thread
  /// (server.cpp passes half of limits.max_connections).
  A2AMethods(TaskLifecycle &lifecycle, const Logger &log, int max_json_depth, int blocking_timeout_ms,
             PushDeliverer *push = nullptr, std::size_t max_message_parts = 100, std::size_t max_long_polls = 64);

  /// JSON-RPC: handles one request body and writes the complete response
  /// into `out`. `a2a_version` is the request's A2A-Version (header or query
  /// parameter; "" when absent = v0.3; an unsupported one is answered
  /// -32009 VersionNotSupported). `method` receives the method name (for the
  /// request log; empty when the envelope was unreadable). A streaming method
  /// that succeeds fills `*stream` instead (when `stream` is null it is
  /// refused like an unknown method); `last_event_id` is the request's
  /// Last-Event-ID header ("" = none). `*is_stream_method` (may be null) is
  /// set when the method is a streaming one, also when it failed (v0.3
  /// clients then expect the error as an SSE event). `bound_tenant`: the
  /// caller's credential's tenant (CallContext::bound_tenant). Never throws.
  void handle(std::string_view body, std::string_view a2a_version, const std::string &principal,
              ResponseWriter &out, std::string &method, std::string_view last_event_id = {},
              std::optional<StreamPlan> *stream = nullptr, bool *is_stream_method = nullptr,
              Dialect *dialect_out = nullptr, const std::optional<std::string> &bound_tenant = std::nullopt);

  /// HTTP+JSON: runs `m` with `params` (an object in the JSON-RPC v1.0
  /// params shape, built by the REST router from path, query and body) and
  /// writes the bare result into `out`. Returns std::nullopt on success,
  /// else the failure (and `out` holds nothing useful). Never throws.
  std::optional<Failure> call(A2AMethod m, const rapidjson::Value &params, const CallContext &call,
                              ResponseWriter &out);

  /// HTTP+JSON streaming (send_streaming_message, subscribe_to_task): on
  /// success returns std::nullopt and fills `plan`. Never throws.
  std::optional<Failure> call_stream(A2AMethod m, const rapidjson::Value &params, const CallContext &call,
                                     std::string_view last_event_id, StreamPlan &plan);

  /// The method a JSON-RPC name stands for (v1.0 and v0.3 spellings), or
  /// std::nullopt.
  static std::optional<A2AMethod> method_named(std::string_view name);

 private:
  void dispatch(A2AMethod m, const rapidjson::Value &params, const CallContext &call, JsonWriter &w);
  void send_message(const rapidjson::Value &params, const CallContext &call, JsonWriter &w);
  void get_task(const rapidjson::Value &params, const CallContext &call, JsonWriter &w);
  void cancel_task(const rapidjson::Value &params, const CallContext &call, JsonWriter &w);
  void list_tasks(const rapidjson::Value &params, const CallContext &call, JsonWriter &w);
  void push_config(A2AMethod m, const rapidjson::Value &params, const CallContext &call, JsonWriter &w);
  /// The push config of a SendMessage's configuration, or nullopt.
  std::optional<PushConfig> message_push_config(const rapidjson::Value &configuration, const CallContext &call);
  /// Validates SendMessage params and creates or resumes the Task (with a
  /// watch hold when `hold` is set). Returns the Task and the view.
  Task start_message(const rapidjson::Value &params, const CallContext &call, bool streaming, TaskView &view,
                     bool &blocking, std::unique_ptr<TaskWatch::Hold> *hold);
  void stream(A2AMethod m, const rapidjson::Value &params, const CallContext &call, std::string_view last_event_id,
              StreamPlan &plan);
  /// Maps the exception being handled (call only inside a catch block) to a
  /// Failure, logging store and internal errors.
  Failure current_failure(std::optional<A2AMethod> m, std::string_view method_name) const;

  TaskLifecycle &lifecycle_;
  const Logger &log_;
  int max_json_depth_;
  int blocking_timeout_ms_;
  std::size_t max_message_parts_;
  PushDeliverer *push_;
  std::size_t max_long_polls_;
  std::atomic<std::size_t> long_polls_{0};  // GetTask long-polls waiting now
};

}  // namespace toolnexus::server_detail

#endif  // TOOLNEXUS_SERVER_A2A_METHODS_HPP

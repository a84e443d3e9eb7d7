// server/src/a2a_methods.hpp: the A2A JSON-RPC methods, the place where a
// Task is served. Validates params (naming the offending field), applies
// owner scoping, and maps lifecycle and store errors to JSON-RPC codes
// (A2A v0.3 section 7 methods, section 8 errors; ListTasks as in v1.0
// section 9.4.4).
#ifndef TOOLNEXUS_SERVER_A2A_METHODS_HPP
#define TOOLNEXUS_SERVER_A2A_METHODS_HPP

#include "jsonrpc.hpp"
#include "log.hpp"
#include "task_lifecycle.hpp"

#include <string>
#include <string_view>

namespace toolnexus::server_detail {

/// Who is calling and how.
struct CallContext {
  /// The authenticated principal ("" when authentication is off).
  std::string principal;
  /// The A2A-Version request header ("" when absent = v0.3).
  std::string_view a2a_version;
};

/// Dispatches JSON-RPC requests to the A2A methods:
///   SendMessage / message/send      create or continue a Task (section 7.1)
///   GetTask / tasks/get             read a Task, honouring historyLength (7.3)
///   CancelTask / tasks/cancel       cancel a Task (7.4)
///   ListTasks / tasks/list          the caller's Tasks, newest first, paged
///   streaming methods               -32004 (the card says streaming: false)
///   push-notification methods       -32003
///   anything else                   -32601
/// Every answer echoes the request id. Thread-safe (per-thread parse
/// buffers); the lifecycle and store it uses are shared.
class A2AMethods {
 public:
  A2AMethods(TaskLifecycle &lifecycle, const Logger &log, int max_json_depth, int blocking_timeout_ms);

  /// Handles one request body and writes the complete response into `out`.
  /// `method` receives the method name (for the request log; empty when the
  /// envelope was unreadable). Never throws.
  void handle(std::string_view body, const CallContext &call, ResponseWriter &out, std::string &method);

 private:
  void dispatch(std::string_view method, const rapidjson::Value *id, const rapidjson::Value *params,
                const CallContext &call, ResponseWriter &out);
  void send_message(const rapidjson::Value *id, const rapidjson::Value *params, const CallContext &call,
                    ResponseWriter &out);
  void get_task(const rapidjson::Value *id, const rapidjson::Value *params, const CallContext &call,
                ResponseWriter &out);
  void cancel_task(const rapidjson::Value *id, const rapidjson::Value *params, const CallContext &call,
                   ResponseWriter &out);
  void list_tasks(const rapidjson::Value *id, const rapidjson::Value *params, const CallContext &call,
                  ResponseWriter &out);

  TaskLifecycle &lifecycle_;
  const Logger &log_;
  int max_json_depth_;
  int blocking_timeout_ms_;
};

}  // namespace toolnexus::server_detail

#endif  // TOOLNEXUS_SERVER_A2A_METHODS_HPP

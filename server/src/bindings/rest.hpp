// server/src/bindings/rest.hpp: the HTTP+JSON (REST) binding of A2A v1.0 (spec
// section 11), over the same A2AMethods as JSON-RPC. Routes (each also under
// a leading /{tenant}):
//   POST   /message:send                        SendMessage (body: SendMessageRequest)
//   POST   /message:stream                      SendStreamingMessage (SSE of StreamResponse)
//   GET    /tasks/{id}?historyLength=N          GetTask
//   POST   /tasks/{id}:cancel                   CancelTask (body optional)
//   GET    /tasks?contextId&status&pageSize&pageToken&historyLength&statusTimestampAfter&includeArtifacts
//                                               ListTasks
//   GET|POST /tasks/{id}:subscribe              SubscribeToTask (SSE; both verbs: the spec says
//                                               POST, the proto GET; clients send either)
//   POST|GET /tasks/{id}/pushNotificationConfigs, GET|DELETE .../{cid}
//                                               push notification configs
//   GET    /extendedAgentCard                   (-> ExtendedAgentCardNotConfigured)
// Answers: 200 with the result as JSON (v1.0 shapes), or an HTTP error
// status with {"error": {"code": <HTTP status>, "status": <google.rpc code
// name>, "message", "details": [google.rpc.ErrorInfo]}} (section 11.6).
#ifndef TOOLNEXUS_SERVER_REST_HPP
#define TOOLNEXUS_SERVER_REST_HPP

#include "service/a2a_methods.hpp"

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace toolnexus::server_detail {

/// A matched HTTP+JSON route.
struct RestRoute {
  A2AMethod method = A2AMethod::get_task;
  /// The {tenant} path segment, decoded ("" when the route has none).
  std::string tenant;
  /// The {id} path segment, decoded ("" when the route has none).
  std::string task_id;
  /// The push config id segment of .../pushNotificationConfigs/{cid}.
  std::string config_id;
  /// bad_request: what is wrong with the path (a sentence naming it).
  std::string error;
};

/// Result of matching a request line against the routes.
/// bad_request: the path cannot be read (a malformed percent-escape,
/// RFC 3986 section 2.1); RestRoute::error says where. Answered 400.
enum class RestMatch { matched, not_found, method_not_allowed, bad_request };

/// Matches `http_method` and the request path `path` (still percent-encoded,
/// without the query; leading slashes are folded, so a base URL ending in
/// "/" works) against the routes above. On method_not_allowed, `allow`
/// receives the methods the path takes ("GET, POST"). A route without a
/// tenant wins over the same path read with one ("/tasks/x" is GetTask
/// "x", never ListTasks of tenant "tasks"... it has only two segments).
RestMatch match_rest_route(std::string_view http_method, std::string_view path, RestRoute &route,
                           std::string &allow);

/// The query of the request target `uri` ("/tasks?pageSize=5&x=a%20b"),
/// decoded into `out` in order (name, value; '+' reads as a space, as HTML
/// forms send it). Returns "" or, when it cannot be read, a sentence naming
/// the parameter: a malformed percent-escape (RFC 3986 section 2.1: '%'
/// and two hex digits), or a parameter given twice (which one would count
/// depends on the server: refused). Never throws (std::bad_alloc aside).
std::string parse_query(std::string_view uri, std::vector<std::pair<std::string, std::string>> &out);

/// Serves one matched route: builds the method's params from the route,
/// the decoded query parameters and the body (JSON, checked against
/// `max_json_depth`; only SendMessage requires one), calls `methods`, and
/// leaves the answer in `body`. Returns the HTTP status. A streaming route
/// (message:stream, :subscribe) that succeeds fills `*plan` instead and
/// returns 0; `last_event_id` is the request's Last-Event-ID. Never throws.
/// Query parameters are the request fields of section 11.5 (contextId,
/// status, pageSize, pageToken, historyLength, statusTimestampAfter,
/// includeArtifacts, tenant), each by its camelCase name or its proto
/// (snake_case) name; one named both ways is refused. Other names are
/// ignored (section 5.7: unrecognized fields SHOULD be ignored), except a
/// near miss of a known one ("history__length", "HistoryLength"), which is
/// refused 400 naming it: ignored, it would silently not apply.
int serve_rest(A2AMethods &methods, const RestRoute &route,
               const std::vector<std::pair<std::string, std::string>> &query, std::string_view request_body,
               int max_json_depth, CallContext call, ResponseWriter &out, std::string &body,
               std::string_view last_event_id = {}, std::optional<StreamPlan> *plan = nullptr);

}  // namespace toolnexus::server_detail

#endif  // TOOLNEXUS_SERVER_REST_HPP

// The HTTP+JSON binding (A2A v1.0 section 11): routes, params, errors.
#include "bindings/rest.hpp"

#include "common/util.hpp"

#include <Poco/URI.h>

#include <cctype>
#include <rapidjson/error/en.h>

namespace toolnexus::server_detail {

namespace {

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

std::string decoded(std::string_view raw) {
  std::string out;
  Poco::URI::decode(std::string(raw), out);
  return out;
}

// One route read from segs[from..]. Returns not_found when the path is not
// one of ours; method_not_allowed (with `allow`) when it is, for other
// methods.
RestMatch match_from(std::string_view m, const std::vector<std::string_view> &segs, std::size_t from,
                     RestRoute &route, std::string &allow) {
  const std::size_t n = segs.size() - from;
  if (n == 0) return RestMatch::not_found;
  const std::string_view s0 = segs[from];
  auto only = [&](std::string_view want, A2AMethod method) {
    if (m == want) {
      route.method = method;
      return RestMatch::matched;
    }
    allow = std::string(want);
    return RestMatch::method_not_allowed;
  };
  if (n == 1) {
    if (s0 == "message:send") return only("POST", A2AMethod::send_message);
    if (s0 == "message:stream") return only("POST", A2AMethod::send_streaming_message);
    if (s0 == "tasks") return only("GET", A2AMethod::list_tasks);
    if (s0 == "extendedAgentCard") return only("GET", A2AMethod::extended_card);
    return RestMatch::not_found;
  }
  if (s0 != "tasks") return RestMatch::not_found;
  const std::string_view raw_id = segs[from + 1];
  if (n == 2) {
    // The verb suffix is read before decoding, so an id holding an encoded
    // ":cancel" is an id.
    if (ends_with(raw_id, ":cancel")) {
      route.task_id = decoded(raw_id.substr(0, raw_id.size() - 7));
      return only("POST", A2AMethod::cancel_task);
    }
    if (ends_with(raw_id, ":subscribe")) {
      route.task_id = decoded(raw_id.substr(0, raw_id.size() - 10));
      if (m == "GET" || m == "POST") {
        route.method = A2AMethod::subscribe_to_task;
        return RestMatch::matched;
      }
      allow = "GET, POST";
      return RestMatch::method_not_allowed;
    }
    route.task_id = decoded(raw_id);
    return only("GET", A2AMethod::get_task);
  }
  if (segs[from + 2] != "pushNotificationConfigs" || n > 4) return RestMatch::not_found;
  route.task_id = decoded(raw_id);
  const bool one = n == 4;
  if (one) route.config_id = decoded(segs[from + 3]);
  if ((!one && (m == "GET" || m == "POST")) || (one && (m == "GET" || m == "DELETE"))) {
    route.method = !one ? (m == "POST" ? A2AMethod::push_create : A2AMethod::push_list)
                        : (m == "GET" ? A2AMethod::push_get : A2AMethod::push_delete);
    return RestMatch::matched;
  }
  allow = one ? "GET, DELETE" : "GET, POST";
  return RestMatch::method_not_allowed;
}

void add_string(rapidjson::Document &d, std::string_view name, std::string_view value) {
  auto &a = d.GetAllocator();
  set_member(d, name, make_string(value, a), a);
}

// The query parameters of section 11.5 (and the 1.1 draft's GetTask
// currentGeneration): camelCase, then the proto name.
constexpr std::pair<std::string_view, std::string_view> kQueryParams[] = {
    {"contextId", "context_id"},         {"status", "status"},
    {"pageSize", "page_size"},           {"pageToken", "page_token"},
    {"historyLength", "history_length"}, {"statusTimestampAfter", "status_timestamp_after"},
    {"includeArtifacts", "include_artifacts"}, {"tenant", "tenant"},
    {"currentGeneration", "current_generation"},  // GetTask's long-poll (A2A 1.1 draft)
};

// `name` folded for the near-miss check: lower case, no '_' or '-'.
std::string folded(std::string_view name) {
  std::string out;
  for (char c : name)
    if (c != '_' && c != '-') out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// The camelCase name of query parameter `name`: itself or the JSON name of
// its proto name; "" for an unknown name. A near miss throws.
std::string_view query_param(std::string_view name) {
  for (const auto &[camel, proto] : kQueryParams)
    if (name == camel || name == proto) return camel;
  const std::string f = folded(name);
  for (const auto &[camel, proto] : kQueryParams)
    if (f == folded(camel))
      throw RpcError(rpc_code::kInvalidRequest,
                     "unknown query parameter " + in_quotes(name) + ": did you mean '" + std::string(camel) +
                         "' (or its proto name '" + std::string(proto) + "')? (A2A v1.0 section 11.5)",
                     std::string(name));
  return {};
}

}  // namespace

std::string parse_query(std::string_view uri, std::vector<std::pair<std::string, std::string>> &out) {
  out.clear();
  const std::size_t q = uri.find('?');
  if (q == std::string_view::npos) return {};
  std::string_view rest = uri.substr(q + 1);
  while (!rest.empty()) {
    const std::size_t amp = rest.find('&');
    const std::string_view pair = rest.substr(0, amp);
    const std::size_t eq = pair.find('=');
    const std::string_view raw_name = pair.substr(0, eq);
    std::string decoded_pair[2];
    const std::string_view raw[2] = {raw_name, eq == std::string_view::npos ? std::string_view() : pair.substr(eq + 1)};
    for (int k = 0; k < 2; ++k) {
      const std::string_view s = raw[k];
      std::string &d = decoded_pair[k];
      for (std::size_t i = 0; i < s.size(); ++i) {
        if (s[i] == '+') {
          d += ' ';
        } else if (s[i] != '%') {
          d += s[i];
        } else if (i + 2 < s.size() && std::isxdigit(static_cast<unsigned char>(s[i + 1])) != 0 &&
                   std::isxdigit(static_cast<unsigned char>(s[i + 2])) != 0) {
          d += static_cast<char>(std::stoi(std::string(s.substr(i + 1, 2)), nullptr, 16));
          i += 2;
        } else {
          return "malformed percent-escape " + in_quotes(s.substr(i, 3)) + " in the " +
                 (k == 0 ? std::string("name of the query parameter ") + in_quotes(raw_name)
                         : "value of the query parameter " + in_quotes(raw_name)) +
                 " (RFC 3986 section 2.1: '%' and two hex digits)";
        }
      }
    }
    if (!pair.empty()) {
      for (const auto &[name, value] : out)
        if (name == decoded_pair[0])
          return "the query parameter " + in_quotes(name) + " is given more than once; give it once";
      out.emplace_back(std::move(decoded_pair[0]), std::move(decoded_pair[1]));
    }
    if (amp == std::string_view::npos) break;
    rest.remove_prefix(amp + 1);
  }
  return {};
}

RestMatch match_rest_route(std::string_view http_method, std::string_view path, RestRoute &route,
                           std::string &allow) {
  // Every '%' starts an escape of two hex digits (RFC 3986 section 2.1):
  // checked here so that decoding never fails later.
  for (std::size_t i = path.find('%'); i != std::string_view::npos; i = path.find('%', i + 1)) {
    if (i + 2 >= path.size() || std::isxdigit(static_cast<unsigned char>(path[i + 1])) == 0 ||
        std::isxdigit(static_cast<unsigned char>(path[i + 2])) == 0) {
      route = RestRoute{};
      route.error = "malformed percent-escape " + in_quotes(path.substr(i, 3)) + " at byte " + std::to_string(i) +
                    " of the path (RFC 3986 section 2.1: '%' and two hex digits)";
      return RestMatch::bad_request;
    }
  }
  while (!path.empty() && path.front() == '/') path.remove_prefix(1);
  if (!path.empty() && path.back() == '/') path.remove_suffix(1);
  std::vector<std::string_view> segs;
  while (!path.empty()) {
    const auto slash = path.find('/');
    segs.push_back(path.substr(0, slash));
    if (slash == std::string_view::npos) break;
    path.remove_prefix(slash + 1);
  }
  if (segs.empty()) return RestMatch::not_found;
  route = RestRoute{};
  std::string allow_plain;
  const RestMatch plain = match_from(http_method, segs, 0, route, allow_plain);
  if (plain == RestMatch::matched) return plain;
  RestRoute with_tenant;
  std::string allow_tenant;
  const RestMatch tenant = segs[0].empty() ? RestMatch::not_found
                                           : match_from(http_method, segs, 1, with_tenant, allow_tenant);
  if (tenant == RestMatch::matched) {
    with_tenant.tenant = decoded(segs[0]);
    route = std::move(with_tenant);
    return tenant;
  }
  if (plain == RestMatch::method_not_allowed) {
    allow = allow_plain;
    return plain;
  }
  if (tenant == RestMatch::method_not_allowed) allow = allow_tenant;
  return tenant;
}

int serve_rest(A2AMethods &methods, const RestRoute &route,
               const std::vector<std::pair<std::string, std::string>> &query, std::string_view request_body,
               int max_json_depth, CallContext call, ResponseWriter &out, std::string &body,
               std::string_view last_event_id, std::optional<StreamPlan> *plan) {
  rapidjson::Document params(rapidjson::kObjectType);
  try {
    // The body, when there is one, is the request message's JSON.
    bool blank = true;
    for (char c : request_body) blank = blank && (c == ' ' || c == '\t' || c == '\r' || c == '\n');
    if (!blank) {
      std::size_t at = 0;
      if (json_depth(request_body, max_json_depth, &at) > max_json_depth)
        throw RpcError(rpc_code::kInvalidRequest,
                       "the request body nests deeper than " + std::to_string(max_json_depth) +
                           " levels (at byte " + std::to_string(at) + ")");
      if (!is_valid_utf8(request_body))
        throw RpcError(rpc_code::kParseError, "the request body is not valid UTF-8");
      params.Parse(request_body.data(), request_body.size());
      if (params.HasParseError())
        throw RpcError(rpc_code::kParseError,
                       std::string("the request body is not JSON: ") + rapidjson::GetParseError_En(params.GetParseError()) +
                           " at byte " + std::to_string(params.GetErrorOffset()));
      if (const std::size_t bad = lone_surrogate_escape(request_body); bad != std::string_view::npos)
        throw RpcError(rpc_code::kParseError, "the request body is not JSON: " + lone_surrogate_message(bad));
      if (!params.IsObject()) throw RpcError(rpc_code::kInvalidRequest, "the request body must be a JSON object");
    } else if (route.method == A2AMethod::send_message || route.method == A2AMethod::send_streaming_message) {
      throw RpcError(rpc_code::kInvalidParams, "invalid params: the body must be a SendMessageRequest "
                                                "({\"message\": {...}})");
    }
    // Query parameters: strings; the methods read integers and booleans
    // from strings too. A2A-Version was read by the caller.
    for (const auto &[name, value] : query) {
      if (name == "A2A-Version" || name == "a2a-version") continue;
      const std::string_view camel = query_param(name);
      if (camel.empty()) continue;  // not a request field: ignored (section 5.7)
      if (find(params, camel) != nullptr)
        throw RpcError(rpc_code::kInvalidRequest,
                       "the query parameter " + in_quotes(name) + " names '" + std::string(camel) +
                           "', which is given again (in the query or the body); give it once",
                       std::string(camel));
      add_string(params, camel, value);
    }
    // Proto field names (page_size, task_id) in the body or the query are
    // renamed to the JSON names (A2A v1.0 section 5.5), before the path's
    // members are set.
    accept_proto_names(params, "params", params.GetAllocator());
    const bool push = route.method == A2AMethod::push_create || route.method == A2AMethod::push_get ||
                      route.method == A2AMethod::push_list || route.method == A2AMethod::push_delete;
    if (push) {
      // The v1.0 params of the push methods: taskId and (config) id.
      add_string(params, "taskId", route.task_id);
      if (!route.config_id.empty()) add_string(params, "id", route.config_id);
    } else if (!route.task_id.empty() || route.method == A2AMethod::get_task ||
               route.method == A2AMethod::cancel_task || route.method == A2AMethod::subscribe_to_task) {
      add_string(params, "id", route.task_id);
    }
    // The tenant: the path's, else the body's or the query's.
    if (!route.tenant.empty()) add_string(params, "tenant", route.tenant);
    const rapidjson::Value *t = find(params, "tenant");
    if (t != nullptr && !t->IsNull()) {
      if (!t->IsString()) throw RpcError(rpc_code::kInvalidParams, "invalid params: params.tenant must be a string",
                                         "params.tenant");
      call.tenant.assign(t->GetString(), t->GetStringLength());
    }
    bind_tenant(call);
  } catch (const RpcError &e) {
    return write_rest_error(Failure{e.code(), e.message(), e.field()}, body);
  }
  if (route.method == A2AMethod::send_streaming_message || route.method == A2AMethod::subscribe_to_task) {
    if (plan == nullptr)
      return write_rest_error(Failure{rpc_code::kUnsupportedOperation, "streaming is not available here", {}}, body);
    StreamPlan p;
    if (std::optional<Failure> f = methods.call_stream(route.method, params, call, last_event_id, p))
      return write_rest_error(*f, body);
    plan->emplace(std::move(p));
    return 0;
  }
  if (std::optional<Failure> f = methods.call(route.method, params, call, out)) return write_rest_error(*f, body);
  const std::string_view bytes = out.bytes();
  body.assign(bytes.data(), bytes.size());
  // google.protobuf.Empty is {} on HTTP+JSON.
  if (route.method == A2AMethod::push_delete) body = "{}";
  return 200;
}

}  // namespace toolnexus::server_detail

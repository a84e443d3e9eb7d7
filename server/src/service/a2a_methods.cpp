// The A2A JSON-RPC methods: where a Task is served.
#include "service/a2a_methods.hpp"

#include "common/util.hpp"

#include <rapidjson/reader.h>

#include <optional>
#include <unordered_map>

namespace toolnexus::server_detail {

namespace ts = toolnexus::task_state;

namespace {

const std::unordered_map<std::string_view, A2AMethod> &method_table() {
  static const std::unordered_map<std::string_view, A2AMethod> table = {
      {"SendMessage", A2AMethod::send_message},
      {"message/send", A2AMethod::send_message},
      {"GetTask", A2AMethod::get_task},
      {"tasks/get", A2AMethod::get_task},
      {"CancelTask", A2AMethod::cancel_task},
      {"tasks/cancel", A2AMethod::cancel_task},
      {"ListTasks", A2AMethod::list_tasks},
      {"tasks/list", A2AMethod::list_tasks},
      {"SendStreamingMessage", A2AMethod::send_streaming_message},
      {"message/stream", A2AMethod::send_streaming_message},
      {"SubscribeToTask", A2AMethod::subscribe_to_task},
      {"tasks/resubscribe", A2AMethod::subscribe_to_task},
      {"tasks/pushNotificationConfig/set", A2AMethod::push_create},
      {"tasks/pushNotificationConfig/get", A2AMethod::push_get},
      {"tasks/pushNotificationConfig/list", A2AMethod::push_list},
      {"tasks/pushNotificationConfig/delete", A2AMethod::push_delete},
      {"SetTaskPushNotificationConfig", A2AMethod::push_create},
      {"CreateTaskPushNotificationConfig", A2AMethod::push_create},
      {"GetTaskPushNotificationConfig", A2AMethod::push_get},
      {"ListTaskPushNotificationConfig", A2AMethod::push_list},
      {"ListTaskPushNotificationConfigs", A2AMethod::push_list},
      {"DeleteTaskPushNotificationConfig", A2AMethod::push_delete},
      {"agent/getAuthenticatedExtendedCard", A2AMethod::extended_card},
      {"GetExtendedAgentCard", A2AMethod::extended_card},
      {"GetAuthenticatedExtendedCard", A2AMethod::extended_card},
  };
  return table;
}

// Per-thread parse state: a document whose allocator starts in a fixed
// buffer, so a typical request parses without touching the heap.
struct ThreadState {
  static constexpr std::size_t kBuffer = 32 * 1024;
  char buffer[kBuffer];
  rapidjson::MemoryPoolAllocator<> alloc{buffer, kBuffer};
  rapidjson::Document doc{&alloc};
  /// GetTask's fast path filters stored bytes into this first.
  rapidjson::StringBuffer scratch;
  void reset() {
    doc.SetNull();
    alloc.Clear();
  }
  /// ListTasks and GetTask parse each stored record into this, in place
  /// (TaskRecord::a2a_task_in_place), one after the other: the request's
  /// `doc` holds the params meanwhile. An echo Task's values take ~3 KiB
  /// (strings stay in the record); a bigger one spills into heap chunks.
  static constexpr std::size_t kStoredBuffer = 16 * 1024;
  char stored_buffer[kStoredBuffer];
  rapidjson::MemoryPoolAllocator<> stored_alloc{stored_buffer, kStoredBuffer};
  rapidjson::Document stored{&stored_alloc};
  void reset_stored() {
    stored.SetNull();
    stored_alloc.Clear();
  }
};

ThreadState &thread_state() {
  thread_local ThreadState st;
  return st;
}

[[noreturn]] void bad_param(const std::string &field, const std::string &what) {
  throw RpcError(rpc_code::kInvalidParams, "invalid params: " + field + " " + what, field);
}

// Optional member that must be a string when present (null counts as absent).
std::optional<std::string_view> opt_string(const rapidjson::Value &obj, std::string_view name,
                                           const std::string &field) {
  const rapidjson::Value *v = find(obj, name);
  if (v == nullptr || v->IsNull()) return std::nullopt;
  if (!v->IsString()) bad_param(field, "must be a string");
  return std::string_view(v->GetString(), v->GetStringLength());
}

std::string_view required_string(const rapidjson::Value &obj, std::string_view name, const std::string &field) {
  auto s = opt_string(obj, name, field);
  if (!s) bad_param(field, "is required");
  if (s->empty()) bad_param(field, "must not be empty");
  return *s;
}

std::optional<int64_t> opt_int(const rapidjson::Value &obj, std::string_view name, const std::string &field,
                               int64_t min, int64_t max) {
  const rapidjson::Value *v = find(obj, name);
  if (v == nullptr || v->IsNull()) return std::nullopt;
  int64_t n = 0;
  if (v->IsInt64()) {
    n = v->GetInt64();
  } else if (v->IsString()) {
    // ProtoJSON may send integers as strings; HTTP+JSON query values are.
    const std::string_view s(v->GetString(), v->GetStringLength());
    const std::size_t digits_from = !s.empty() && s[0] == '-' ? 1 : 0;
    if (s.size() == digits_from || s.size() > 18 ||
        s.find_first_not_of("0123456789", digits_from) != std::string_view::npos)
      bad_param(field, "must be an integer");
    n = std::stoll(std::string(s));
  } else {
    bad_param(field, "must be an integer");
  }
  if (n < min || n > max)
    bad_param(field, "must be between " + std::to_string(min) + " and " + std::to_string(max));
  return n;
}

// A generation a v1.1 request names (ifGenerationMatch, currentGeneration):
// an int64 as a JSON number or, ProtoJSON's form, a decimal string; none
// for the older dialects, which do not have these members (A2A 1.1 draft,
// sections 3.2.2 and 3.2.7).
std::optional<uint64_t> opt_generation(const rapidjson::Value &obj, std::string_view name, const std::string &field,
                                       Dialect d) {
  if (d != Dialect::v1_1) {
    // Ignoring it would turn a conditional change into an unconditional one.
    const rapidjson::Value *v = find(obj, name);
    if (v != nullptr && !v->IsNull())
      bad_param(field, "is an A2A 1.1 member: send the header A2A-Version: 1.1 to use it (this request is " +
                           std::string(d == Dialect::v0_3 ? "v0.3" : "v1.0") + ")");
    return std::nullopt;
  }
  const std::optional<int64_t> g = opt_int(obj, name, field, 0, INT64_MAX / 2);
  if (!g) return std::nullopt;
  return static_cast<uint64_t>(*g);
}

std::optional<bool> opt_bool(const rapidjson::Value &obj, std::string_view name, const std::string &field) {
  const rapidjson::Value *v = find(obj, name);
  if (v == nullptr || v->IsNull()) return std::nullopt;
  if (v->IsString()) {  // HTTP+JSON query values
    const std::string_view s(v->GetString(), v->GetStringLength());
    if (s == "true") return true;
    if (s == "false") return false;
  }
  if (!v->IsBool()) bad_param(field, "must be true or false");
  return v->GetBool();
}

// A copy of obj[name] into `out` when it is present and not null.
void keep(rapidjson::Value &out, const rapidjson::Value &obj, const char *name,
          rapidjson::Document::AllocatorType &a) {
  const rapidjson::Value *v = find(obj, name);
  if (v != nullptr && !v->IsNull()) out.AddMember(rapidjson::StringRef(name), rapidjson::Value(*v, a), a);
}

// A2A v0.3 section 6.5 Part, in the stored form: "kind" is required (as the
// spec's TextPart, FilePart and DataPart say, and as the official SDKs
// send), and only the members of that kind are kept (kind, text | file |
// data, metadata, and the stored form's mediaType of a text or data part;
// in a file: bytes | uri, mimeType, name). Other members are dropped, not
// stored and echoed (docs/a2a.md, "Parts").
rapidjson::Value stored_part_v03(const rapidjson::Value &p, const std::string &pf,
                                 rapidjson::Document::AllocatorType &a) {
  if (!p.IsObject()) bad_param(pf, "must be an object");
  const std::optional<std::string_view> kind = opt_string(p, "kind", pf + ".kind");
  if (!kind)
    bad_param(pf + ".kind", "is required in A2A 0.3 (\"kind\": \"text\", \"file\" or \"data\"); a part without "
                            "it is an A2A 1.0 part, which needs the header A2A-Version: 1.0");
  if (const rapidjson::Value *md = find(p, "metadata"); md != nullptr && !md->IsNull() && !md->IsObject())
    bad_param(pf + ".metadata", "must be an object");
  rapidjson::Value out(rapidjson::kObjectType);
  out.AddMember("kind", rapidjson::Value(*find(p, "kind"), a), a);
  if (*kind == "text") {
    const rapidjson::Value *t = find(p, "text");
    if (t == nullptr || !t->IsString()) bad_param(pf + ".text", "must be a string");
    keep(out, p, "text", a);
  } else if (*kind == "file") {
    const rapidjson::Value *f = find(p, "file");
    if (f == nullptr || !f->IsObject()) bad_param(pf + ".file", "must be an object");
    const rapidjson::Value *uri = find(*f, "uri");
    const rapidjson::Value *bytes = find(*f, "bytes");
    const bool has_uri = uri != nullptr && !uri->IsNull(), has_bytes = bytes != nullptr && !bytes->IsNull();
    if (has_uri == has_bytes)
      bad_param(pf + ".file", has_uri ? "must have one of \"uri\" (FileWithUri) or \"bytes\" (FileWithBytes), not both"
                                      : "must have a string \"uri\" or \"bytes\"");
    if (!(has_uri ? uri : bytes)->IsString()) bad_param(pf + ".file." + (has_uri ? "uri" : "bytes"), "must be a string");
    rapidjson::Value file(rapidjson::kObjectType);
    keep(file, *f, has_uri ? "uri" : "bytes", a);
    for (const char *name : {"mimeType", "name"}) {
      opt_string(*f, name, pf + ".file." + name);
      keep(file, *f, name, a);
    }
    out.AddMember("file", file, a);
  } else if (*kind == "data") {
    const rapidjson::Value *d = find(p, "data");
    if (d == nullptr || !d->IsObject()) bad_param(pf + ".data", "must be an object");
    keep(out, p, "data", a);
  } else {
    bad_param(pf + ".kind", "must be \"text\", \"file\" or \"data\"");
  }
  if (*kind != "file") {
    opt_string(p, "mediaType", pf + ".mediaType");
    keep(out, p, "mediaType", a);
  }
  keep(out, p, "metadata", a);
  return out;
}

// A2A v0.3 section 6.4 Message, checked; returns its stored form: the
// message as sent, its parts as stored_part_v03 makes them.
rapidjson::Value stored_message_v03(const rapidjson::Value &m, rapidjson::Document::AllocatorType &a) {
  const std::string base = "params.message";
  const std::string_view role = required_string(m, "role", base + ".role");
  if (role != "user" && role != "agent") bad_param(base + ".role", "must be \"user\" or \"agent\"");
  const rapidjson::Value *parts = find(m, "parts");
  if (parts == nullptr) bad_param(base + ".parts", "is required");
  if (!parts->IsArray() || parts->Empty()) bad_param(base + ".parts", "must be a non-empty array of parts");
  rapidjson::Value stored_parts(rapidjson::kArrayType);
  for (rapidjson::SizeType i = 0; i < parts->Size(); ++i)
    stored_parts.PushBack(stored_part_v03((*parts)[i], base + ".parts[" + std::to_string(i) + "]", a), a);
  required_string(m, "messageId", base + ".messageId");
  if (const rapidjson::Value *t = find(m, "taskId"); t != nullptr && !t->IsNull()) {
    if (!t->IsString() || t->GetStringLength() == 0) bad_param(base + ".taskId", "must be a non-empty string");
  }
  opt_string(m, "contextId", base + ".contextId");
  if (auto kind = opt_string(m, "kind", base + ".kind"); kind && *kind != "message")
    bad_param(base + ".kind", "must be \"message\"");
  if (const rapidjson::Value *md = find(m, "metadata"); md != nullptr && !md->IsNull() && !md->IsObject())
    bad_param(base + ".metadata", "must be an object");
  rapidjson::Value out(rapidjson::kObjectType);
  bool parts_done = false;
  for (auto it = m.MemberBegin(); it != m.MemberEnd(); ++it) {
    if (std::string_view(it->name.GetString(), it->name.GetStringLength()) != "parts") {
      out.AddMember(rapidjson::Value(it->name, a), rapidjson::Value(it->value, a), a);
    } else if (!parts_done) {  // the first "parts" (the one checked), rebuilt
      out.AddMember("parts", stored_parts, a);
      parts_done = true;
    }
  }
  return out;
}

bool text_output_accepted(const rapidjson::Value &modes) {
  if (modes.Empty()) return true;
  for (const auto &m : modes.GetArray()) {
    const std::string_view s(m.GetString(), m.GetStringLength());
    if (s == "text/plain" || s == "text/*" || s == "*/*" || s == "text") return true;
  }
  return false;
}


// A v0.3 validation error names v0.3 members; a v1.0 client is told how
// its own message differs when it sent a v1.0 shape without the header.
rapidjson::Value message_from_v03(const rapidjson::Value &m, rapidjson::Document::AllocatorType &a) {
  try {
    return stored_message_v03(m, a);
  } catch (const RpcError &e) {
    const std::string_view role = str(find(m, "role"));
    if (role == "ROLE_USER" || role == "ROLE_AGENT")
      throw RpcError(e.code(),
                     e.message() + " (this is an A2A 1.0 message: send the header A2A-Version: 1.0)",
                     e.field());
    throw;
  }
}

// The JSON-RPC params of a request without any: an empty object.
const rapidjson::Value &empty_object() {
  static const rapidjson::Value empty(rapidjson::kObjectType);
  return empty;
}

void write_view(JsonWriter &w, const Task &task, Dialect d, const TaskView &view) {
  write_task(w, task.json(), d, view);
}

}  // namespace

A2AMethods::A2AMethods(TaskLifecycle &lifecycle, const Logger &log, int max_json_depth, int blocking_timeout_ms,
                       PushDeliverer *push, std::size_t max_message_parts, std::size_t max_long_polls)
    : lifecycle_(lifecycle),
      log_(log),
      max_json_depth_(max_json_depth),
      blocking_timeout_ms_(blocking_timeout_ms),
      max_message_parts_(max_message_parts),
      push_(push),
      max_long_polls_(max_long_polls) {}

std::optional<A2AMethod> A2AMethods::method_named(std::string_view name) {
  const auto &table = method_table();
  auto it = table.find(name);
  if (it == table.end()) return std::nullopt;
  return it->second;
}

Failure A2AMethods::current_failure(std::optional<A2AMethod> m, std::string_view method_name) const {
  const std::string what_method = method_name.empty() ? std::string("request") : std::string(method_name);
  try {
    throw;
  } catch (const RpcError &e) {
    return {e.code(), e.message(), e.field(), e.metadata()};
  } catch (const LifecycleError &e) {
    switch (e.code()) {
      case LifecycleErrc::not_found:
        // SendMessage names its Task in params.message.taskId, the others in params.id.
        return {rpc_code::kTaskNotFound, e.what(),
                m == A2AMethod::send_message ? "params.message.taskId" : "params.id"};
      case LifecycleErrc::not_cancelable: return {rpc_code::kTaskNotCancelable, e.what(), {}};
      case LifecycleErrc::terminal:
      case LifecycleErrc::not_interrupted: return {rpc_code::kUnsupportedOperation, e.what(), {}};
      case LifecycleErrc::context_mismatch:
        return {rpc_code::kInvalidParams, std::string("invalid params: ") + e.what(), "params.message.contextId"};
      case LifecycleErrc::overloaded:
      case LifecycleErrc::stopping: {
        Failure f{rpc_code::kInternalError, e.what(), {}};
        f.unavailable = true;
        return f;
      }
      case LifecycleErrc::generation_mismatch: {
        // Both generations, for a client to re-read and retry (ErrorInfo
        // metadata in v1.x, error.data in v0.3).
        Failure f{rpc_code::kTaskGenerationMismatch, e.what(),
                  m == A2AMethod::cancel_task ? "params.ifGenerationMatch"
                                              : "params.configuration.ifGenerationMatch",
                  {}};
        if (const auto &g = e.generation())
          f.metadata = {{"expectedGeneration", std::to_string(g->expected)},
                        {"currentGeneration", std::to_string(g->current)}};
        return f;
      }
      case LifecycleErrc::message_reused:
        // A retry must repeat its first send exactly (task_idempotency.hpp).
        return {rpc_code::kInvalidParams, std::string("invalid params: ") + e.what(), "params.message.messageId"};
      case LifecycleErrc::too_large: {
        // The limit, its value and the size the request would have made
        // (ErrorInfo.metadata in v1.0, error.data in v0.3).
        Failure f{rpc_code::kInvalidParams, std::string("invalid params: ") + e.what(),
                  m == A2AMethod::send_message || m == A2AMethod::send_streaming_message ? "params.message" : "params",
                  {}};
        if (const auto &l = e.limit())
          f.metadata = {{"limit", l->limit}, {"max", std::to_string(l->max)}, {"size", std::to_string(l->size)}};
        return f;
      }
    }
    return {rpc_code::kInternalError, e.what(), {}};
  } catch (const StoreError &e) {
    log_.error("task store error in " + what_method + ": " + e.what());
    return {rpc_code::kInternalError,
            std::string("internal error: the task store failed (") + status_name(e.code()) +
                "); details are in the server log",
            {}};
  } catch (const InvalidTask &e) {
    return {rpc_code::kInvalidParams, std::string("invalid params: ") + e.what(), "params.message"};
  } catch (const std::exception &e) {
    log_.error("internal error in " + what_method + ": " + e.what());
    return {rpc_code::kInternalError, "internal error; details are in the server log", {}};
  } catch (...) {
    log_.error("internal error in " + what_method + ": unknown exception");
    return {rpc_code::kInternalError, "internal error; details are in the server log", {}};
  }
}

void bind_tenant(CallContext &call) {
  if (!call.bound_tenant) return;
  if (call.tenant.empty()) {
    call.tenant = *call.bound_tenant;
  } else if (call.tenant != *call.bound_tenant) {
    throw RpcError(rpc_code::kInvalidParams,
                   "invalid params: params.tenant " + in_quotes(call.tenant) +
                       " is not the tenant this credential is bound to (leave it out, or name the credential's)",
                   "params.tenant");
  }
}

void A2AMethods::handle(std::string_view body, std::string_view a2a_version, const std::string &principal,
                        ResponseWriter &out, std::string &method, std::string_view last_event_id,
                        std::optional<StreamPlan> *stream, bool *is_stream_method, Dialect *dialect_out,
                        const std::optional<std::string> &bound_tenant) {
  ThreadState &st = thread_state();
  st.reset();
  out.reset();
  method.clear();
  if (is_stream_method != nullptr) *is_stream_method = false;
  Envelope env;
  std::optional<A2AMethod> m;
  // Until the version is known, errors use the v1.0 shape when the client
  // asked for anything but 0.3 (ErrorInfo is what a v1.0 client reads).
  const std::optional<Dialect> dialect = dialect_for_version(a2a_version, Dialect::v0_3);
  CallContext call;
  call.principal = principal;
  call.dialect = dialect.value_or(Dialect::v1_0);
  if (dialect_out != nullptr) *dialect_out = call.dialect;
  try {
    parse_envelope(body, max_json_depth_, st.doc, env);
    method.assign(env.method);
    m = method_named(env.method);
    const bool streaming = m == A2AMethod::send_streaming_message || m == A2AMethod::subscribe_to_task;
    if (is_stream_method != nullptr) *is_stream_method = streaming;
    if (!dialect) {
      throw RpcError(rpc_code::kVersionNotSupported,
                     "A2A-Version " + in_quotes(a2a_version) +
                         " is not supported: this server speaks A2A 1.1 (A2A-Version: 1.1, the draft's Task "
                         "generations), 1.0 (A2A-Version: 1.0) and 0.3 (no A2A-Version, or 0.3)",
                     "A2A-Version");
    }
    if (!m || (streaming && stream == nullptr)) {
      throw RpcError(rpc_code::kMethodNotFound,
                     "method " + in_quotes(env.method) +
                         " not found (this agent serves SendMessage, SendStreamingMessage, GetTask, CancelTask, "
                         "ListTasks, SubscribeToTask, the push notification config methods, and their v0.3 "
                         "spellings)");
    }
    // v1.0 (ProtoJSON) takes the proto field names too: renamed to the
    // JSON names here, once, for every method.
    if (is_v1(call.dialect) && env.params != nullptr)
      accept_proto_names(st.doc["params"], "params", st.doc.GetAllocator());
    const rapidjson::Value &params = env.params != nullptr ? *env.params : empty_object();
    if (is_v1(call.dialect)) {
      if (auto tenant = opt_string(params, "tenant", "params.tenant")) call.tenant = std::string(*tenant);
    }
    call.bound_tenant = bound_tenant;
    bind_tenant(call);
    if (streaming) {
      StreamPlan plan;
      plan.style.binding = Binding::jsonrpc;
      plan.style.dialect = call.dialect;
      plan.style.rpc_id = env.id_json();
      this->stream(*m, params, call, last_event_id, plan);
      stream->emplace(std::move(plan));
      return;
    }
    JsonWriter &w = out.begin_result(env.rpc_id());
    dispatch(*m, params, call, w);
    out.end_result();
  } catch (...) {
    const Failure f = current_failure(m, method);
    out.error(env.rpc_id(), f.code, f.message, f.field, call.dialect, &f.metadata);
  }
}

std::optional<Failure> A2AMethods::call(A2AMethod m, const rapidjson::Value &params, const CallContext &call,
                                        ResponseWriter &out) {
  out.reset();
  try {
    JsonWriter &w = out.begin_bare();
    dispatch(m, params, call, w);
    out.end_bare();
    return std::nullopt;
  } catch (...) {
    out.reset();
    return current_failure(m, {});
  }
}

std::optional<Failure> A2AMethods::call_stream(A2AMethod m, const rapidjson::Value &params,
                                               const CallContext &call, std::string_view last_event_id,
                                               StreamPlan &plan) {
  try {
    plan.style.binding = Binding::rest;
    plan.style.dialect = call.dialect;
    stream(m, params, call, last_event_id, plan);
    return std::nullopt;
  } catch (...) {
    return current_failure(m, {});
  }
}

void A2AMethods::dispatch(A2AMethod m, const rapidjson::Value &params, const CallContext &call, JsonWriter &w) {
  switch (m) {
    case A2AMethod::send_message: return send_message(params, call, w);
    case A2AMethod::get_task: return get_task(params, call, w);
    case A2AMethod::cancel_task: return cancel_task(params, call, w);
    case A2AMethod::list_tasks: return list_tasks(params, call, w);
    case A2AMethod::send_streaming_message:
    case A2AMethod::subscribe_to_task:
      throw RpcError(rpc_code::kUnsupportedOperation, "this method answers with a stream (text/event-stream)");
    case A2AMethod::push_create:
    case A2AMethod::push_get:
    case A2AMethod::push_list:
    case A2AMethod::push_delete: return push_config(m, params, call, w);
    case A2AMethod::extended_card:
      throw RpcError(rpc_code::kExtendedCardNotConfigured, "this agent has no authenticated extended card");
  }
}

Task A2AMethods::start_message(const rapidjson::Value &p, const CallContext &call, bool streaming, TaskView &view,
                              bool &blocking, std::unique_ptr<TaskWatch::Hold> *hold) {
  const bool v1 = is_v1(call.dialect);
  const rapidjson::Value *m = find(p, "message");
  if (m == nullptr || m->IsNull()) bad_param("params.message", "is required");
  if (!m->IsObject()) bad_param("params.message", "must be an object");
  // A bound on what one message may add to a Task, in either dialect,
  // before any part is looked at.
  if (const rapidjson::Value *parts = find(*m, "parts");
      parts != nullptr && parts->IsArray() && parts->Size() > max_message_parts_)
    throw RpcError(rpc_code::kInvalidParams,
                   "invalid params: params.message.parts has " + std::to_string(parts->Size()) +
                       " parts, past the limit of " + std::to_string(max_message_parts_) +
                       " parts per message (limits.max_message_parts); nothing was changed",
                   "params.message.parts",
                   {{"limit", "limits.max_message_parts"},
                    {"max", std::to_string(max_message_parts_)},
                    {"size", std::to_string(parts->Size())}});
  // The stored (v0.3) form of the message: a v1.0 one converted, a v0.3
  // one checked and its parts rebuilt.
  rapidjson::Document converted;
  const rapidjson::Value stored = v1 ? message_from_v1(*m, "params.message", converted.GetAllocator())
                                     : message_from_v03(*m, converted.GetAllocator());
  const rapidjson::Value *message = &stored;
  // Blocking is the default in both dialects (v1.0: returnImmediately
  // false, section 3.2.2; v0.3: blocking absent = true, as the official
  // SDKs do): the answer comes when the Task is terminal or interrupted.
  // Streams ignore it (v1.0 section 3.2.2: "no effect").
  blocking = !streaming;
  int64_t history_length = -1;
  std::optional<PushConfig> push_cfg;
  std::optional<uint64_t> if_generation;
  if (const rapidjson::Value *c = find(p, "configuration"); c != nullptr && !c->IsNull()) {
    if (!c->IsObject()) bad_param("params.configuration", "must be an object");
    if (v1) {
      const bool immediate =
          opt_bool(*c, "returnImmediately", "params.configuration.returnImmediately").value_or(false);
      if (!streaming) blocking = !immediate;
    } else {
      const bool b = opt_bool(*c, "blocking", "params.configuration.blocking").value_or(true);
      if (!streaming) blocking = b;
    }
    history_length =
        opt_int(*c, "historyLength", "params.configuration.historyLength", 0, INT32_MAX).value_or(-1);
    if (const rapidjson::Value *modes = find(*c, "acceptedOutputModes"); modes != nullptr && !modes->IsNull()) {
      if (!modes->IsArray()) bad_param("params.configuration.acceptedOutputModes", "must be an array of strings");
      for (const auto &mode : modes->GetArray())
        if (!mode.IsString()) bad_param("params.configuration.acceptedOutputModes", "must be an array of strings");
      if (!text_output_accepted(*modes))
        throw RpcError(rpc_code::kContentTypeNotSupported,
                       "this agent answers in text/plain, which acceptedOutputModes does not include",
                       "params.configuration.acceptedOutputModes");
    }
    push_cfg = message_push_config(*c, call);
    if_generation =
        opt_generation(*c, "ifGenerationMatch", "params.configuration.ifGenerationMatch", call.dialect);
  }
  if (const rapidjson::Value *md = find(p, "metadata"); md != nullptr && !md->IsNull() && !md->IsObject())
    bad_param("params.metadata", "must be an object");
  view.history_length = history_length;
  const std::string_view task_id = str(find(*message, "taskId"));
  if (if_generation && task_id.empty())
    bad_param("params.configuration.ifGenerationMatch",
              "applies to a message to an existing Task (params.message.taskId); a new Task has no generation "
              "to match");
  std::function<void(Task &)> prepare;
  if (push_cfg) {
    // The webhook gets every event from this message on.
    const std::size_t max = push_->options().max_configs_per_task;
    prepare = [cfg = *push_cfg, max](Task &t) { put_push_config(t, cfg, event_seq(t), max); };
  }
  // A blocking SendMessage that creates a Task answers only when the Task
  // settles: without idempotency it is saved once, with its outcome
  // (TaskLifecycle::create defer_save), unless its run lasts. A blocking one
  // whose executor runs_briefly() runs on this thread, which would only wait
  // for it. A retry of a send (same messageId and body) gets the Task the
  // first made, and then waits or streams exactly as the first did.
  return task_id.empty() ? lifecycle_.create(*message, call.principal, call.tenant, hold, prepare, blocking)
                         : lifecycle_.resume(task_id, *message, call.principal, call.tenant, hold, prepare, blocking,
                                             if_generation);
}

std::optional<PushConfig> A2AMethods::message_push_config(const rapidjson::Value &c, const CallContext &call) {
  for (const char *name : {"taskPushNotificationConfig", "pushNotificationConfig"}) {
    const rapidjson::Value *push = find(c, name);
    if (push == nullptr || push->IsNull()) continue;
    const std::string field = std::string("params.configuration.") + name;
    if (push_ == nullptr)
      throw RpcError(rpc_code::kPushNotificationNotSupported,
                     "push notifications are not enabled on this agent (its card says pushNotifications: false)",
                     field);
    return read_push_config(*push, call.dialect, field, push_->policy());
  }
  return std::nullopt;
}

void A2AMethods::push_config(A2AMethod m, const rapidjson::Value &p, const CallContext &call, JsonWriter &w) {
  if (push_ == nullptr)
    throw RpcError(rpc_code::kPushNotificationNotSupported,
                   "push notifications are not enabled on this agent (its card says pushNotifications: false)");
  const bool v1 = is_v1(call.dialect);
  // The Task: v1.0 params.taskId; v0.3 params.taskId (set) or params.id.
  std::string task_field = "params.taskId";
  std::optional<std::string_view> tid = opt_string(p, "taskId", task_field);
  if (!v1 && !tid) {
    task_field = "params.id";
    tid = opt_string(p, "id", task_field);
  }
  if (!tid) bad_param(v1 ? "params.taskId" : "params.taskId (or params.id)", "is required");
  if (tid->empty()) bad_param(task_field, "must not be empty");
  const std::string task_id(*tid);
  // The config id: v1.0 params.id; v0.3 params.pushNotificationConfigId.
  std::optional<std::string_view> cid =
      v1 ? opt_string(p, "id", "params.id") : opt_string(p, "pushNotificationConfigId", "params.pushNotificationConfigId");
  const std::string not_found = "Task " + in_quotes(task_id) + " not found";
  if (m == A2AMethod::push_create) {
    // v1.0: the config is the params themselves (older forms nest it);
    // v0.3: params.pushNotificationConfig.
    const rapidjson::Value *src = &p;
    std::string field = "params";
    for (const char *nested : {"pushNotificationConfig", "config"}) {
      if (const rapidjson::Value *n = find(p, nested); n != nullptr && n->IsObject()) {
        src = n;
        field = std::string("params.") + nested;
        break;
      }
    }
    if (!v1 && src == &p) bad_param("params.pushNotificationConfig", "is required");
    PushConfig cfg = read_push_config(*src, call.dialect, field, push_->policy());
    if (const rapidjson::Value *cfg_id = find(p, "configId"); cfg_id != nullptr && cfg_id->IsString() &&
                                                              cfg_id->GetStringLength() != 0 && src != &p)
      cfg.id.assign(cfg_id->GetString(), cfg_id->GetStringLength());
    const std::size_t max = push_->options().max_configs_per_task;
    lifecycle_.edit(task_id, call.principal, call.tenant, [&](Task &t) {
      // A webhook set now gets the Task's events from now on.
      put_push_config(t, cfg, event_seq(t), max);
      lifecycle_.refuse_if_too_large(t, "the push notification config would make Task '" + task_id + "'",
                                     "; the Task is unchanged");
      return true;
    });
    write_push_config(w, cfg, task_id, call.tenant, call.dialect);
    return;
  }
  if (m == A2AMethod::push_delete) {
    if (!cid || cid->empty()) bad_param(v1 ? "params.id" : "params.pushNotificationConfigId", "is required");
    const std::string config_id(*cid);
    // Idempotent (v1.0 section 3.1.10): deleting a config that is not
    // there succeeds too, as long as the Task is.
    lifecycle_.edit(task_id, call.principal, call.tenant, [&](Task &t) { return remove_push_config(t, config_id); });
    w.Null();
    return;
  }
  std::optional<TaskRecord> rec = lifecycle_.store()->get(task_id);
  if (!rec || rec->owner != call.principal || rec->tenant != call.tenant)
    throw LifecycleError(LifecycleErrc::not_found, not_found);
  const Task task = rec->a2a_task();
  const std::vector<PushConfig> configs = push_configs(task);
  if (m == A2AMethod::push_get) {
    // v0.3 allows leaving out the config id: the Task's first config.
    for (const PushConfig &c : configs) {
      if (cid ? c.id == *cid : true) {
        write_push_config(w, c, task_id, call.tenant, call.dialect);
        return;
      }
    }
    throw RpcError(rpc_code::kTaskNotFound,
                   "Task " + in_quotes(task_id) + " has no push notification config" +
                       (cid ? " " + in_quotes(*cid) : std::string()),
                   v1 ? "params.id" : "params.pushNotificationConfigId");
  }
  // list: every config (a Task has few: no pages).
  opt_int(p, "pageSize", "params.pageSize", 0, 1000);
  if (v1) {
    w.StartObject();
    w.Key("configs");
  }
  w.StartArray();
  for (const PushConfig &c : configs) write_push_config(w, c, task_id, call.tenant, call.dialect);
  w.EndArray();
  if (v1) {
    w.Key("nextPageToken");
    w.String("");
    w.EndObject();
  }
}

void A2AMethods::send_message(const rapidjson::Value &p, const CallContext &call, JsonWriter &w) {
  TaskView view;
  bool blocking = true;
  std::unique_ptr<TaskWatch::Hold> hold;
  // The hold is taken only to wait: then every change of the new Task is
  // seen without reading the store.
  Task task = start_message(p, call, false, view, blocking, &hold);
  if (blocking) {
    uint64_t version = 0;
    task = lifecycle_.wait_until_settled(*hold, call.principal, call.tenant,
                                         std::chrono::milliseconds(blocking_timeout_ms_), &version);
    if (version == 0) {
      // Not saved yet (a deferred Task whose wait ended early): it is
      // saved now, before anything about it is acknowledged.
      if (lifecycle_.stopping()) throw LifecycleError(LifecycleErrc::stopping, "the server is stopping");
      task = lifecycle_.persist(hold->id()).task;
    }
  }
  hold.reset();
  if (is_v1(call.dialect)) {
    // SendMessageResponse: the oneof {task | message} (v1.0 section 3.1.1).
    w.StartObject();
    w.Key("task");
    write_view(w, task, call.dialect, view);
    w.EndObject();
  } else {
    write_view(w, task, call.dialect, view);
  }
}

void A2AMethods::stream(A2AMethod m, const rapidjson::Value &p, const CallContext &call,
                        std::string_view last_event_id, StreamPlan &plan) {
  // Last-Event-ID: the SSE id of the last frame the client saw (a
  // sequence number, see task_events.hpp); anything else is ignored.
  std::optional<uint64_t> resume;
  {
    std::string_view v = last_event_id;
    while (!v.empty() && v.front() == ' ') v.remove_prefix(1);
    while (!v.empty() && v.back() == ' ') v.remove_suffix(1);
    if (!v.empty() && v.size() <= 18 && v.find_first_not_of("0123456789") == std::string_view::npos)
      resume = std::stoull(std::string(v));
  }
  if (m == A2AMethod::send_streaming_message) {
    TaskView view;
    bool blocking = false;
    std::unique_ptr<TaskWatch::Hold> hold;
    // The stream begins with the Task as created (or resumed), then every
    // event after it, however far the run has got meanwhile.
    auto first = std::make_shared<Snapshot>();
    first->task = start_message(p, call, true, view, blocking, &hold);
    plan.first = std::move(first);
    plan.hold = std::move(hold);
    plan.history_length = view.history_length;
    plan.subscribe = false;
    return;
  }
  // SubscribeToTask (v1.0 section 3.1.6; v0.3 tasks/resubscribe, 7.9).
  const std::string id(required_string(p, "id", "params.id"));
  if (const rapidjson::Value *md = find(p, "metadata"); md != nullptr && !md->IsNull() && !md->IsObject())
    bad_param("params.metadata", "must be an object");
  // Watched before it is read: no change between the read and the stream
  // is missed.
  std::unique_ptr<TaskWatch::Hold> hold = lifecycle_.watch().hold(id);
  std::optional<TaskRecord> rec = lifecycle_.store()->get(id);
  if (!rec || rec->owner != call.principal || rec->tenant != call.tenant)
    throw LifecycleError(LifecycleErrc::not_found, "Task " + in_quotes(id) + " not found");
  auto snap = std::make_shared<Snapshot>();
  snap->task = rec->a2a_task();
  snap->version = rec->version;
  snap->owner = std::move(rec->owner);
  snap->tenant = std::move(rec->tenant);
  const std::string state(snap->task.state());
  if (ts::is_terminal(state) && !resume)
    throw RpcError(rpc_code::kUnsupportedOperation,
                   "Task " + in_quotes(id) + " is " + state +
                       ": a terminal Task has no more updates to stream (read it with GetTask)",
                   "params.id");
  hold->offer(snap);
  plan.first = resume ? nullptr : hold->latest();
  plan.resume_after = resume;
  plan.hold = std::move(hold);
  plan.subscribe = true;
}

void A2AMethods::get_task(const rapidjson::Value &p, const CallContext &call, JsonWriter &w) {
  const std::string_view task_id = required_string(p, "id", "params.id");
  const std::optional<int64_t> history_length = opt_int(p, "historyLength", "params.historyLength", 0, INT32_MAX);
  if (const std::optional<uint64_t> current =
          opt_generation(p, "currentGeneration", "params.currentGeneration", call.dialect)) {
    // The long-poll (A2A 1.1 draft, section 3.2.7): the answer waits, at
    // most limits.blocking_timeout_ms, until the Task's generation passes
    // the one given; then (or at the bound) the Task as it is. A wait holds
    // a request thread: past max_long_polls_ waiting at once, the answer is
    // the Task as it is now, as at the bound (a client polls again), so
    // that polls cannot starve every other request.
    const bool may_wait = long_polls_.fetch_add(1) < max_long_polls_;
    struct Release {
      std::atomic<std::size_t> &n;
      ~Release() { n.fetch_sub(1); }
    } release{long_polls_};
    const Snapshot s =
        lifecycle_.wait_for_generation(std::string(task_id), call.principal, call.tenant, *current,
                                       std::chrono::milliseconds(may_wait ? blocking_timeout_ms_ : 0));
    TaskView view;
    view.history_length = history_length.value_or(-1);
    write_view(w, s.task, call.dialect, view);
    return;
  }
  std::optional<TaskRecord> rec = lifecycle_.store()->get(task_id);
  // Another principal's or tenant's Task answers exactly like a missing one.
  if (!rec || rec->owner != call.principal || rec->tenant != call.tenant)
    throw LifecycleError(LifecycleErrc::not_found, "Task " + in_quotes(std::string(task_id)) + " not found");
  if (!history_length && call.dialect == Dialect::v0_3) {
    // The stored bytes, less private metadata, are the answer, without a
    // DOM. Most stored Tasks (all terminal ones) have no private metadata:
    // those are checked and spliced in as they are; the others filtered.
    // A record the checks refuse is parsed again to say why (a2a_task()
    // throws StoreError corrupt naming what is wrong or missing).
    const auto refuse = [&rec] {
      (void)rec->a2a_task();
      throw StoreError(Status::corrupt, "stored task '" + rec->id + "' is not a valid JSON object with that id");
    };
    if (rec->json.find("\"toolnexus/") == std::string::npos) {
      if (!is_stored_task_of(rec->json, rec->id)) refuse();
      w.RawValue(rec->json.data(), rec->json.size(), rapidjson::kObjectType);
      return;
    }
    rapidjson::StringBuffer &scratch = thread_state().scratch;
    scratch.Clear();
    if (!filter_stored_task_v03(rec->json, rec->id, scratch)) refuse();
    w.RawValue(scratch.GetString(), scratch.GetSize(), rapidjson::kObjectType);
    if (scratch.GetSize() > 256 * 1024) {  // do not pin big buffers
      scratch.Clear();
      scratch.ShrinkToFit();
    }
    return;
  }
  // Parsed in place into the per-thread document (ListTasks does the same).
  ThreadState &st = thread_state();
  st.reset_stored();
  rec->a2a_task_in_place(st.stored);
  TaskView view;
  view.history_length = history_length.value_or(-1);
  write_task(w, st.stored, call.dialect, view);
  st.reset_stored();
}

void A2AMethods::cancel_task(const rapidjson::Value &p, const CallContext &call, JsonWriter &w) {
  const std::string_view task_id = required_string(p, "id", "params.id");
  if (const rapidjson::Value *md = find(p, "metadata"); md != nullptr && !md->IsNull() && !md->IsObject())
    bad_param("params.metadata", "must be an object");
  const Task task = lifecycle_.cancel(task_id, call.principal, call.tenant,
                                      opt_generation(p, "ifGenerationMatch", "params.ifGenerationMatch", call.dialect));
  write_view(w, task, call.dialect, TaskView{});
}

void A2AMethods::list_tasks(const rapidjson::Value &p, const CallContext &call, JsonWriter &w) {
  ListQuery q;
  q.owner = call.principal;
  q.tenant = call.tenant;
  if (auto ctx = opt_string(p, "contextId", "params.contextId"); ctx && !ctx->empty())
    q.context_id = std::string(*ctx);
  // The state filter: a name in either spelling, or (ProtoJSON) the enum's
  // number. TASK_STATE_UNSPECIFIED / 0 mean no filter, and so does
  // "UNRECOGNIZED", which the official JS client (@a2a-js/sdk 1.x) sends
  // when listTasks() is called without a status.
  std::optional<std::string> status_text;
  if (const rapidjson::Value *sv = find(p, "status"); sv != nullptr && sv->IsInt() && sv->GetInt() >= 0 &&
                                                      sv->GetInt() <= 8) {
    static const char *const by_number[] = {"",          "submitted",      "working",  "completed",    "failed",
                                            "canceled", "input-required", "rejected", "auth-required"};
    status_text = by_number[sv->GetInt()];
  } else if (auto s = opt_string(p, "status", "params.status")) {
    status_text = std::string(*s);
  }
  if (status_text && !status_text->empty() && *status_text != "TASK_STATE_UNSPECIFIED" &&
      *status_text != "UNRECOGNIZED") {
    auto state = state_from_any(*status_text);
    if (!state)
      bad_param("params.status", is_v1(call.dialect)
                                     ? "must be a TaskState (TASK_STATE_SUBMITTED, TASK_STATE_WORKING, "
                                       "TASK_STATE_INPUT_REQUIRED, TASK_STATE_AUTH_REQUIRED, "
                                       "TASK_STATE_COMPLETED, TASK_STATE_CANCELED, TASK_STATE_FAILED, "
                                       "TASK_STATE_REJECTED)"
                                     : "must be a task state (submitted, working, input-required, auth-required, "
                                       "completed, canceled, failed, rejected, unknown)");
    q.state = *state;
  }
  const int64_t page_size = opt_int(p, "pageSize", "params.pageSize", 1, 100).value_or(50);
  q.page_size = static_cast<uint32_t>(page_size);
  if (auto token = opt_string(p, "pageToken", "params.pageToken")) q.cursor = std::string(*token);
  TaskView view;
  view.history_length = opt_int(p, "historyLength", "params.historyLength", 0, INT32_MAX).value_or(-1);
  if (auto after = opt_string(p, "statusTimestampAfter", "params.statusTimestampAfter")) {
    int64_t us = 0;
    if (!parse_timestamp(*after, us))
      bad_param("params.statusTimestampAfter", "must be an RFC 3339 time such as \"2026-01-31T12:00:00Z\"");
    q.after_us = us - 1;  // the filter is inclusive (>=); the store's is strict
  }
  view.include_artifacts = opt_bool(p, "includeArtifacts", "params.includeArtifacts").value_or(false);
  // One unreadable record must not take ListTasks away from every client:
  // the store delivers it (version 0, ABI 1.1 deliver_corrupt) and it is
  // left out of the answer and logged as an error, naming it, below.
  q.deliver_corrupt = true;

  ListPage page;
  try {
    page = lifecycle_.store()->list(q);
  } catch (const StoreError &e) {
    if (e.code() == Status::invalid_argument && !q.cursor.empty())
      bad_param("params.pageToken", "is not a page token this server issued");
    throw;
  }
  // totalSize: every match before pagination, exact (A2A v1.0 a2a.proto,
  // ListTasksResponse.total_size: "Total number of tasks available (before
  // pagination)", REQUIRED). The store counts (ABI 1.3 count: counters or an
  // index, not a scan of every record); a record known to be unreadable is
  // not counted.
  const uint64_t total = lifecycle_.store()->count(q);
  w.StartObject();
  w.Key("tasks");
  w.StartArray();
  // Each record is parsed in place into one per-thread document and
  // written at once: no Task (and no copy of its strings) per record. A
  // record is written only after every check passed, so one that fails
  // leaves nothing behind in `w`.
  ThreadState &st = thread_state();
  for (TaskRecord &rec : page.records) {
    try {
      if (rec.version == 0) throw StoreError(Status::corrupt, "stored task '" + rec.id + "' is unreadable" +
                                                                  (rec.problem.empty() ? "" : ": " + rec.problem));
      st.reset_stored();
      rec.a2a_task_in_place(st.stored);
    } catch (const StoreError &e) {
      if (e.code() != Status::corrupt) throw;
      log_.error(std::string("ListTasks left out an unreadable record (run `toolnexus store check` on the "
                             "store): ") + e.what());
      continue;
    }
    write_task(w, st.stored, call.dialect, view);
  }
  st.reset_stored();
  w.EndArray();
  w.Key("nextPageToken");
  w.String(page.next_cursor.data(), static_cast<rapidjson::SizeType>(page.next_cursor.size()));
  w.Key("pageSize");
  w.Int64(page_size);
  w.Key("totalSize");
  w.Uint64(total);
  w.EndObject();
}

}  // namespace toolnexus::server_detail

// The A2A JSON-RPC methods: where a Task is served.
#include "a2a_methods.hpp"

#include "util.hpp"

#include <rapidjson/reader.h>

#include <optional>
#include <unordered_map>

namespace toolnexus::server_detail {

namespace ts = toolnexus::task_state;

namespace {

enum class Method {
  send_message,
  get_task,
  cancel_task,
  list_tasks,
  streaming,
  push_notification,
  extended_card,
};

const std::unordered_map<std::string_view, Method> &method_table() {
  static const std::unordered_map<std::string_view, Method> table = {
      {"SendMessage", Method::send_message},
      {"message/send", Method::send_message},
      {"GetTask", Method::get_task},
      {"tasks/get", Method::get_task},
      {"CancelTask", Method::cancel_task},
      {"tasks/cancel", Method::cancel_task},
      {"ListTasks", Method::list_tasks},
      {"tasks/list", Method::list_tasks},
      {"SendStreamingMessage", Method::streaming},
      {"message/stream", Method::streaming},
      {"SubscribeToTask", Method::streaming},
      {"tasks/resubscribe", Method::streaming},
      {"tasks/pushNotificationConfig/set", Method::push_notification},
      {"tasks/pushNotificationConfig/get", Method::push_notification},
      {"tasks/pushNotificationConfig/list", Method::push_notification},
      {"tasks/pushNotificationConfig/delete", Method::push_notification},
      {"SetTaskPushNotificationConfig", Method::push_notification},
      {"CreateTaskPushNotificationConfig", Method::push_notification},
      {"GetTaskPushNotificationConfig", Method::push_notification},
      {"ListTaskPushNotificationConfig", Method::push_notification},
      {"ListTaskPushNotificationConfigs", Method::push_notification},
      {"DeleteTaskPushNotificationConfig", Method::push_notification},
      {"agent/getAuthenticatedExtendedCard", Method::extended_card},
      {"GetExtendedAgentCard", Method::extended_card},
      {"GetAuthenticatedExtendedCard", Method::extended_card},
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
  void reset() {
    doc.SetNull();
    alloc.Clear();
  }
};

ThreadState &thread_state() {
  thread_local ThreadState st;
  return st;
}

[[noreturn]] void bad_param(const std::string &field, const std::string &what) {
  throw RpcError(rpc_code::kInvalidParams, "invalid params: " + field + " " + what, field);
}

const rapidjson::Value &require_params(const rapidjson::Value *params) {
  if (params == nullptr) bad_param("params", "is required");
  return *params;
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
  if (!v->IsInt64()) bad_param(field, "must be an integer");
  const int64_t n = v->GetInt64();
  if (n < min || n > max)
    bad_param(field, "must be between " + std::to_string(min) + " and " + std::to_string(max));
  return n;
}

std::optional<bool> opt_bool(const rapidjson::Value &obj, std::string_view name, const std::string &field) {
  const rapidjson::Value *v = find(obj, name);
  if (v == nullptr || v->IsNull()) return std::nullopt;
  if (!v->IsBool()) bad_param(field, "must be true or false");
  return v->GetBool();
}

// A2A v0.3 section 6.4 Message / 6.5 Part.
void validate_message(const rapidjson::Value &m) {
  const std::string base = "params.message";
  const std::string_view role = required_string(m, "role", base + ".role");
  if (role != "user" && role != "agent") bad_param(base + ".role", "must be \"user\" or \"agent\"");
  const rapidjson::Value *parts = find(m, "parts");
  if (parts == nullptr) bad_param(base + ".parts", "is required");
  if (!parts->IsArray() || parts->Empty()) bad_param(base + ".parts", "must be a non-empty array of parts");
  for (rapidjson::SizeType i = 0; i < parts->Size(); ++i) {
    const std::string pf = base + ".parts[" + std::to_string(i) + "]";
    const rapidjson::Value &p = (*parts)[i];
    if (!p.IsObject()) bad_param(pf, "must be an object");
    std::optional<std::string_view> kind = opt_string(p, "kind", pf + ".kind");
    std::string_view k = kind ? *kind : std::string_view();
    if (!kind) {
      if (find(p, "text") != nullptr) k = "text";
      else if (find(p, "file") != nullptr) k = "file";
      else if (find(p, "data") != nullptr) k = "data";
      else bad_param(pf + ".kind", "is required (\"text\", \"file\" or \"data\")");
    }
    if (k == "text") {
      const rapidjson::Value *t = find(p, "text");
      if (t == nullptr || !t->IsString()) bad_param(pf + ".text", "must be a string");
    } else if (k == "file") {
      const rapidjson::Value *f = find(p, "file");
      if (f == nullptr || !f->IsObject()) bad_param(pf + ".file", "must be an object");
      const rapidjson::Value *uri = find(*f, "uri");
      const rapidjson::Value *bytes = find(*f, "bytes");
      if ((uri == nullptr || !uri->IsString()) && (bytes == nullptr || !bytes->IsString()))
        bad_param(pf + ".file", "must have a string \"uri\" or \"bytes\"");
    } else if (k == "data") {
      const rapidjson::Value *d = find(p, "data");
      if (d == nullptr || !d->IsObject()) bad_param(pf + ".data", "must be an object");
    } else {
      bad_param(pf + ".kind", "must be \"text\", \"file\" or \"data\"");
    }
  }
  required_string(m, "messageId", base + ".messageId");
  if (const rapidjson::Value *t = find(m, "taskId"); t != nullptr && !t->IsNull()) {
    if (!t->IsString() || t->GetStringLength() == 0) bad_param(base + ".taskId", "must be a non-empty string");
  }
  opt_string(m, "contextId", base + ".contextId");
  if (auto kind = opt_string(m, "kind", base + ".kind"); kind && *kind != "message")
    bad_param(base + ".kind", "must be \"message\"");
  if (const rapidjson::Value *md = find(m, "metadata"); md != nullptr && !md->IsNull() && !md->IsObject())
    bad_param(base + ".metadata", "must be an object");
}

bool text_output_accepted(const rapidjson::Value &modes) {
  if (modes.Empty()) return true;
  for (const auto &m : modes.GetArray()) {
    const std::string_view s(m.GetString(), m.GetStringLength());
    if (s == "text/plain" || s == "text/*" || s == "*/*" || s == "text") return true;
  }
  return false;
}

void trim_history(Task &task, int64_t history_length) {
  rapidjson::Value *h = find(task.json(), "history");
  if (h == nullptr || !h->IsArray()) return;
  const auto size = static_cast<int64_t>(h->Size());
  if (size <= history_length) return;
  h->Erase(h->Begin(), h->Begin() + (size - history_length));
}

// Writes a Task as a result value; `history_length` < 0 = whole history.
void write_task_value(rapidjson::Writer<rapidjson::StringBuffer> &w, Task &task, int64_t history_length,
                      bool include_artifacts) {
  if (history_length >= 0) trim_history(task, history_length);
  if (!include_artifacts) remove_member(task.json(), "artifacts");
  task.json().Accept(w);
}

void write_task(ResponseWriter &out, const rapidjson::Value *id, Task &task, int64_t history_length) {
  auto &w = out.begin_result(id);
  write_task_value(w, task, history_length, true);
  out.end_result();
}

// Records the top-level "id" string of the object it reads.
struct TopLevelId : rapidjson::BaseReaderHandler<rapidjson::UTF8<>, TopLevelId> {
  int depth = 0;
  bool next_is_id = false;
  bool seen = false;
  std::string id;
  bool Default() {
    next_is_id = false;
    return true;
  }
  bool String(const char *s, rapidjson::SizeType n, bool) {
    if (next_is_id && !seen) {
      id.assign(s, n);
      seen = true;
    }
    next_is_id = false;
    return true;
  }
  bool Key(const char *s, rapidjson::SizeType n, bool) {
    next_is_id = depth == 1 && std::string_view(s, n) == "id";
    return true;
  }
  bool StartObject() {
    ++depth;
    next_is_id = false;
    return true;
  }
  bool EndObject(rapidjson::SizeType) {
    --depth;
    return true;
  }
  bool StartArray() {
    ++depth;
    next_is_id = false;
    return true;
  }
  bool EndArray(rapidjson::SizeType) {
    --depth;
    return true;
  }
};

// True when `json` is one well-formed, UTF-8-valid JSON object whose "id" is
// `id` (checked without building a DOM and without recursion): stored bytes
// that belong to another Task are never served as this one.
bool is_task_json_of(const std::string &json, std::string_view id) {
  std::size_t i = 0;
  while (i < json.size() && (json[i] == ' ' || json[i] == '\n' || json[i] == '\r' || json[i] == '\t')) ++i;
  if (i == json.size() || json[i] != '{') return false;
  rapidjson::StringStream ss(json.c_str());
  TopLevelId handler;
  rapidjson::Reader reader;
  const auto ok =
      reader.Parse<rapidjson::kParseIterativeFlag | rapidjson::kParseValidateEncodingFlag>(ss, handler);
  return !ok.IsError() && ss.Tell() == json.size() && handler.seen && handler.id == id;
}

std::optional<std::string> parse_state_filter(std::string_view s) {
  if (ts::is_known(s)) return std::string(s);
  // v1.0 spelling: TASK_STATE_INPUT_REQUIRED -> input-required.
  constexpr std::string_view prefix = "TASK_STATE_";
  if (s.substr(0, prefix.size()) == prefix) {
    std::string out;
    for (char c : s.substr(prefix.size()))
      out += c == '_' ? '-' : static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
    if (out == "cancelled") out = "canceled";
    if (ts::is_known(out)) return out;
  }
  return std::nullopt;
}

}  // namespace

A2AMethods::A2AMethods(TaskLifecycle &lifecycle, const Logger &log, int max_json_depth, int blocking_timeout_ms)
    : lifecycle_(lifecycle), log_(log), max_json_depth_(max_json_depth), blocking_timeout_ms_(blocking_timeout_ms) {}

void A2AMethods::handle(std::string_view body, const CallContext &call, ResponseWriter &out, std::string &method) {
  ThreadState &st = thread_state();
  st.reset();
  out.reset();
  method.clear();
  Envelope env;
  try {
    parse_envelope(body, max_json_depth_, st.doc, env);
    method.assign(env.method);
    if (!call.a2a_version.empty() && call.a2a_version.substr(0, 2) != "0.") {
      throw RpcError(rpc_code::kVersionNotSupported,
                     "A2A-Version '" + std::string(call.a2a_version.substr(0, 32)) +
                         "' is not supported: this server speaks A2A 0.3 (send no A2A-Version header, or 0.3)");
    }
    dispatch(env.method, env.id, env.params, call, out);
  } catch (const RpcError &e) {
    out.error(env.id, e.code(), e.what(), e.field());
  } catch (const LifecycleError &e) {
    switch (e.code()) {
      case LifecycleErrc::not_found: {
        // SendMessage names its Task in params.message.taskId, the others in params.id.
        auto m = method_table().find(env.method);
        const bool send = m != method_table().end() && m->second == Method::send_message;
        out.error(env.id, rpc_code::kTaskNotFound, e.what(), send ? "params.message.taskId" : "params.id");
        break;
      }
      case LifecycleErrc::not_cancelable: out.error(env.id, rpc_code::kTaskNotCancelable, e.what()); break;
      case LifecycleErrc::terminal:
      case LifecycleErrc::not_interrupted: out.error(env.id, rpc_code::kUnsupportedOperation, e.what()); break;
      case LifecycleErrc::context_mismatch:
        out.error(env.id, rpc_code::kInvalidParams, std::string("invalid params: ") + e.what(),
                  "params.message.contextId");
        break;
      case LifecycleErrc::overloaded:
      case LifecycleErrc::stopping: out.error(env.id, rpc_code::kInternalError, e.what()); break;
    }
  } catch (const StoreError &e) {
    log_.error(std::string("task store error in ") + (method.empty() ? "request" : method) + ": " + e.what());
    out.error(env.id, rpc_code::kInternalError,
              std::string("internal error: the task store failed (") + status_name(e.code()) +
                  "); details are in the server log");
  } catch (const InvalidTask &e) {
    out.error(env.id, rpc_code::kInvalidParams, std::string("invalid params: ") + e.what(), "params.message");
  } catch (const std::exception &e) {
    log_.error(std::string("internal error in ") + (method.empty() ? "request" : method) + ": " + e.what());
    out.error(env.id, rpc_code::kInternalError, "internal error; details are in the server log");
  }
}

void A2AMethods::dispatch(std::string_view method, const rapidjson::Value *id, const rapidjson::Value *params,
                          const CallContext &call, ResponseWriter &out) {
  const auto &table = method_table();
  auto it = table.find(method);
  if (it == table.end()) {
    throw RpcError(rpc_code::kMethodNotFound,
                   "method '" + std::string(method.substr(0, 100)) + "' not found (this agent serves "
                   "SendMessage, GetTask, CancelTask, ListTasks and their v0.3 spellings)");
  }
  switch (it->second) {
    case Method::send_message: return send_message(id, params, call, out);
    case Method::get_task: return get_task(id, params, call, out);
    case Method::cancel_task: return cancel_task(id, params, call, out);
    case Method::list_tasks: return list_tasks(id, params, call, out);
    case Method::streaming:
      throw RpcError(rpc_code::kUnsupportedOperation,
                     "streaming is not supported by this agent (its card says capabilities.streaming: false); "
                     "use SendMessage and GetTask");
    case Method::push_notification:
      throw RpcError(rpc_code::kPushNotificationNotSupported,
                     "push notifications are not supported by this agent");
    case Method::extended_card:
      throw RpcError(rpc_code::kExtendedCardNotConfigured,
                     "this agent has no authenticated extended card");
  }
}

void A2AMethods::send_message(const rapidjson::Value *id, const rapidjson::Value *params, const CallContext &call,
                              ResponseWriter &out) {
  const rapidjson::Value &p = require_params(params);
  const rapidjson::Value *m = find(p, "message");
  if (m == nullptr || m->IsNull()) bad_param("params.message", "is required");
  if (!m->IsObject()) bad_param("params.message", "must be an object");
  validate_message(*m);
  bool blocking = false;
  int64_t history_length = -1;
  if (const rapidjson::Value *c = find(p, "configuration"); c != nullptr && !c->IsNull()) {
    if (!c->IsObject()) bad_param("params.configuration", "must be an object");
    blocking = opt_bool(*c, "blocking", "params.configuration.blocking").value_or(false);
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
    const rapidjson::Value *push = find(*c, "pushNotificationConfig");
    if (push != nullptr && !push->IsNull())
      throw RpcError(rpc_code::kPushNotificationNotSupported,
                     "push notifications are not supported by this agent",
                     "params.configuration.pushNotificationConfig");
  }
  if (const rapidjson::Value *md = find(p, "metadata"); md != nullptr && !md->IsNull() && !md->IsObject())
    bad_param("params.metadata", "must be an object");

  const std::string_view task_id = str(find(*m, "taskId"));
  Task task = task_id.empty() ? lifecycle_.create(*m, call.principal)
                              : lifecycle_.resume(task_id, *m, call.principal);
  if (blocking) {
    const std::string tid(task.id());
    task = lifecycle_.wait_until_settled(tid, call.principal, std::chrono::milliseconds(blocking_timeout_ms_));
  }
  write_task(out, id, task, history_length);
}

void A2AMethods::get_task(const rapidjson::Value *id, const rapidjson::Value *params, const CallContext &call,
                          ResponseWriter &out) {
  const rapidjson::Value &p = require_params(params);
  const std::string_view task_id = required_string(p, "id", "params.id");
  const std::optional<int64_t> history_length = opt_int(p, "historyLength", "params.historyLength", 0, INT32_MAX);
  std::optional<TaskRecord> rec = lifecycle_.store()->get(task_id);
  // Another principal's Task answers exactly like a missing one.
  if (!rec || rec->owner != call.principal)
    throw LifecycleError(LifecycleErrc::not_found, "Task '" + std::string(task_id) + "' not found");
  if (!history_length) {
    // The stored bytes are the answer: spliced in without a DOM.
    if (!is_task_json_of(rec->json, rec->id))
      throw StoreError(Status::corrupt, "stored task '" + rec->id + "' is not a valid JSON object with that id");
    auto &w = out.begin_result(id);
    w.RawValue(rec->json.data(), rec->json.size(), rapidjson::kObjectType);
    out.end_result();
    return;
  }
  Task task = rec->task();
  write_task(out, id, task, *history_length);
}

void A2AMethods::cancel_task(const rapidjson::Value *id, const rapidjson::Value *params, const CallContext &call,
                             ResponseWriter &out) {
  const rapidjson::Value &p = require_params(params);
  const std::string_view task_id = required_string(p, "id", "params.id");
  Task task = lifecycle_.cancel(task_id, call.principal);
  write_task(out, id, task, -1);
}

void A2AMethods::list_tasks(const rapidjson::Value *id, const rapidjson::Value *params, const CallContext &call,
                            ResponseWriter &out) {
  static const rapidjson::Value empty(rapidjson::kObjectType);
  const rapidjson::Value &p = params == nullptr ? empty : *params;
  ListQuery q;
  q.owner = call.principal;
  if (auto ctx = opt_string(p, "contextId", "params.contextId")) q.context_id = std::string(*ctx);
  if (auto status = opt_string(p, "status", "params.status")) {
    auto state = parse_state_filter(*status);
    if (!state)
      bad_param("params.status", "must be a task state (submitted, working, input-required, auth-required, "
                                 "completed, canceled, failed, rejected, unknown)");
    q.state = *state;
  }
  const int64_t page_size = opt_int(p, "pageSize", "params.pageSize", 1, 100).value_or(50);
  q.page_size = static_cast<uint32_t>(page_size);
  if (auto token = opt_string(p, "pageToken", "params.pageToken")) q.cursor = std::string(*token);
  const int64_t history_length = opt_int(p, "historyLength", "params.historyLength", 0, INT32_MAX).value_or(-1);
  if (auto after = opt_string(p, "statusTimestampAfter", "params.statusTimestampAfter")) {
    int64_t us = 0;
    if (!parse_timestamp(*after, us))
      bad_param("params.statusTimestampAfter", "must be an RFC 3339 time such as \"2026-01-31T12:00:00Z\"");
    q.after_us = us - 1;  // the filter is inclusive (>=); the store's is strict
  }
  const bool include_artifacts = opt_bool(p, "includeArtifacts", "params.includeArtifacts").value_or(false);
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
  // totalSize: every readable match, counted from index fields only (a
  // record delivered as unreadable has version 0; a sound one never does).
  uint64_t total = 0;
  {
    ListQuery cq = q;
    cq.cursor.clear();
    cq.omit_json = true;
    cq.page_size = 1000;
    do {
      ListPage cp = lifecycle_.store()->list(cq);
      for (const TaskRecord &r : cp.records) total += r.version != 0 ? 1 : 0;
      cq.cursor = cp.next_cursor;
    } while (!cq.cursor.empty());
  }
  std::vector<Task> tasks;
  tasks.reserve(page.records.size());
  for (const TaskRecord &rec : page.records) {
    try {
      if (rec.version == 0) throw StoreError(Status::corrupt, "stored task '" + rec.id + "' is unreadable" +
                                                                  (rec.problem.empty() ? "" : ": " + rec.problem));
      tasks.push_back(rec.task());
    } catch (const StoreError &e) {
      if (e.code() != Status::corrupt) throw;
      log_.error(std::string("ListTasks left out an unreadable record (run `toolnexus store check` on the "
                             "store): ") + e.what());
    }
  }
  auto &w = out.begin_result(id);
  w.StartObject();
  w.Key("tasks");
  w.StartArray();
  for (Task &task : tasks) write_task_value(w, task, history_length, include_artifacts);
  w.EndArray();
  w.Key("nextPageToken");
  w.String(page.next_cursor.data(), static_cast<rapidjson::SizeType>(page.next_cursor.size()));
  w.Key("pageSize");
  w.Int64(page_size);
  w.Key("totalSize");
  w.Uint64(total);
  w.EndObject();
  out.end_result();
}

}  // namespace toolnexus::server_detail

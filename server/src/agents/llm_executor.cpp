// The llm agent (toolnexus/llm_executor.hpp): an OpenAI-compatible chat
// completions client on Poco's HTTP(S) client, and the conversation logic that
// parks a Task on a tool call needing approval and resumes it from the
// pending request saved in the Task.
//
// Pending request data (ExecutionResult::request_data, saved by the server
// in metadata["toolnexus/pending"].data):
//   {"kind": "llm-tool-call",
//    "messages": [<chat messages so far, without the system prompt: the
//                  assistant message with the tool_calls and the "tool"
//                  messages of the calls already answered>],
//    "calls": [{"id", "name", "arguments"}],   // that message's tool calls
//    "next": <index into calls of the call awaiting approval>}
#include "toolnexus/llm_executor.hpp"

#include "common/util.hpp"

#include <Poco/Exception.h>
#include <Poco/Net/Context.h>
#include <Poco/Net/HTTPClientSession.h>
#include <Poco/Net/HTTPRequest.h>
#include <Poco/Net/HTTPResponse.h>
#include <Poco/Net/HTTPSClientSession.h>
#include <Poco/Net/NetException.h>
#include <Poco/Net/SSLManager.h>
#include <Poco/URI.h>
#include <rapidjson/error/en.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <istream>
#include <memory>
#include <mutex>
#include <optional>
#include <ostream>
#include <stdexcept>
#include <thread>

#ifndef TOOLNEXUS_VERSION
#define TOOLNEXUS_VERSION "0.0.0"
#endif

namespace toolnexus {

using server_detail::find;
using server_detail::make_string;
using server_detail::message_text;
using server_detail::str;

namespace {

constexpr const char *kPendingKind = "llm-tool-call";
/// Largest response body read from the endpoint.
constexpr std::size_t kMaxResponseBytes = 16u << 20;
/// Longest excerpt of endpoint text quoted in a status message.
constexpr std::size_t kMaxQuote = 500;

std::string to_json(const rapidjson::Value &v) {
  rapidjson::StringBuffer b;
  rapidjson::Writer<rapidjson::StringBuffer> w(b);
  v.Accept(w);
  return std::string(b.GetString(), b.GetSize());
}

/// `text` cut to `max` bytes (never inside a UTF-8 sequence) with "...",
/// control characters as blanks: safe to put in a one-line status message.
std::string excerpt(std::string_view text, std::size_t max = kMaxQuote) {
  std::size_t n = std::min(text.size(), max);
  if (n < text.size())
    while (n > 0 && (static_cast<unsigned char>(text[n]) & 0xC0) == 0x80) --n;
  std::string out;
  out.reserve(n + 3);
  for (std::size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    out.push_back(c < 0x20 || c == 0x7f ? ' ' : static_cast<char>(c));
  }
  if (n < text.size()) out += "...";
  return out;
}

bool valid_tool_name(std::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  return std::all_of(name.begin(), name.end(), [](unsigned char c) {
    return std::isalnum(c) != 0 || c == '_' || c == '-';
  });
}

// ---- configuration ----------------------------------------------------------

std::string get_string(const rapidjson::Value &obj, const char *key, const std::string &where, bool required) {
  const rapidjson::Value *v = find(obj, key);
  if (v == nullptr || v->IsNull()) {
    if (required) throw std::invalid_argument(where + "." + key + " is required");
    return {};
  }
  if (!v->IsString()) throw std::invalid_argument(where + "." + key + " must be a string");
  return std::string(v->GetString(), v->GetStringLength());
}

void get_int(const rapidjson::Value &obj, const char *key, const std::string &where, int min, int max, int &out) {
  const rapidjson::Value *v = find(obj, key);
  if (v == nullptr || v->IsNull()) return;
  if (!v->IsInt() || v->GetInt() < min || v->GetInt() > max)
    throw std::invalid_argument(where + "." + key + " must be an integer between " + std::to_string(min) +
                                " and " + std::to_string(max));
  out = v->GetInt();
}

void check_keys(const rapidjson::Value &obj, const std::string &where, std::initializer_list<const char *> known) {
  for (auto it = obj.MemberBegin(); it != obj.MemberEnd(); ++it) {
    const std::string_view key(it->name.GetString(), it->name.GetStringLength());
    if (std::none_of(known.begin(), known.end(), [&](const char *k) { return key == k; })) {
      std::string list;
      for (const char *k : known) list += (list.empty() ? "" : ", ") + std::string(k);
      throw std::invalid_argument(where + "." + std::string(key) + " is not a known key (keys: " + list + ")");
    }
  }
}

// ---- HTTP --------------------------------------------------------------------

/// One answer of the endpoint, or a transport failure.
struct Reply {
  /// 0 when no HTTP answer arrived (transport_error says why).
  int status = 0;
  std::string reason;
  std::string body;
  /// Retry-After in seconds, or -1.
  int retry_after_s = -1;
  std::string transport_error;
  bool timed_out = false;
  /// A failure that another attempt would repeat (an oversized answer).
  bool final = false;
};

bool retryable(const Reply &r) {
  if (r.final) return false;
  return r.status == 0 || r.status == 429 || (r.status >= 500 && r.status <= 599);
}

/// "(code): message" from an OpenAI-style error body
/// {"error": {"message", "type", "code"}} (or {"error": "text"}, or
/// {"message": "text"}); else an excerpt of the body.
std::string endpoint_error(const std::string &body) {
  rapidjson::Document d;
  d.Parse(body.data(), body.size());
  if (!d.HasParseError() && d.IsObject()) {
    const rapidjson::Value *e = find(d, "error");
    if (e != nullptr && e->IsString()) return ": " + excerpt(str(e));
    const rapidjson::Value *holder = e != nullptr && e->IsObject() ? e : &d;
    const std::string_view msg = str(find(*holder, "message"));
    std::string code;
    if (const rapidjson::Value *c = find(*holder, "code"); c != nullptr && !c->IsNull())
      code = c->IsString() ? std::string(str(c)) : to_json(*c);
    if (code.empty()) code = std::string(str(find(*holder, "type")));
    if (!msg.empty() || !code.empty())
      return (code.empty() ? std::string() : " (" + excerpt(code, 100) + ")") +
             (msg.empty() ? std::string() : ": " + excerpt(msg));
  }
  if (body.empty()) return "";
  return ": " + excerpt(body);
}

// ---- the executor -------------------------------------------------------------

/// How a run ends or goes on.
struct Step {
  bool done = false;
  ExecutionResult result;
};

class LlmExecutor final : public AgentExecutor {
 public:
  explicit LlmExecutor(LlmOptions o) : o_(std::move(o)) {
    if (o_.model.empty()) throw std::invalid_argument("llm.model must not be empty");
    Poco::URI uri;
    try {
      uri = Poco::URI(o_.base_url);
    } catch (const Poco::Exception &e) {
      throw std::invalid_argument("llm.base_url '" + excerpt(o_.base_url, 200) + "' is not a URL: " + e.displayText());
    }
    https_ = uri.getScheme() == "https";
    if ((!https_ && uri.getScheme() != "http") || uri.getHost().empty())
      throw std::invalid_argument("llm.base_url '" + excerpt(o_.base_url, 200) +
                                  "' must be http://HOST[:PORT][/PATH] or https://...");
    if (!uri.getUserInfo().empty())
      throw std::invalid_argument("llm.base_url must not hold credentials; name the API key's variable in "
                                  "llm.api_key_env");
    if (!uri.getRawQuery().empty() || !uri.getFragment().empty())
      throw std::invalid_argument("llm.base_url '" + excerpt(o_.base_url, 200) + "' must have no query or fragment");
    host_ = uri.getHost();
    port_ = uri.getPort();
    std::string path = uri.getPath();
    while (!path.empty() && path.back() == '/') path.pop_back();
    path_ = path + "/chat/completions";
    url_ = uri.getScheme() + "://" + uri.getAuthority() + path_;
    if (o_.timeout_ms <= 0) throw std::invalid_argument("llm.timeout_ms must be positive");
    if (o_.max_retries < 0 || o_.max_retries > 10) throw std::invalid_argument("llm.max_retries must be 0..10");
    if (o_.retry_initial_ms <= 0 || o_.retry_max_ms < o_.retry_initial_ms)
      throw std::invalid_argument("llm.retry_initial_ms must be positive and at most llm.retry_max_ms");
    if (o_.max_model_calls < 1 || o_.max_model_calls > 100)
      throw std::invalid_argument("llm.max_model_calls must be 1..100");

    tools_.SetArray();
    auto &a = tools_.GetAllocator();
    for (std::size_t i = 0; i < o_.tools.size(); ++i) {
      const LlmTool &t = o_.tools[i];
      const std::string where = "llm.tools[" + std::to_string(i) + "]";
      if (!valid_tool_name(t.name))
        throw std::invalid_argument(where + ".name '" + excerpt(t.name, 80) + "' must be 1 to 64 of A-Z a-z 0-9 _ -");
      for (std::size_t j = 0; j < i; ++j)
        if (o_.tools[j].name == t.name) throw std::invalid_argument(where + ".name '" + t.name + "' is declared twice");
      rapidjson::Document params;
      params.Parse(t.parameters_json.data(), t.parameters_json.size());
      if (params.HasParseError() || !params.IsObject())
        throw std::invalid_argument(where + ".parameters must be a JSON Schema object");
      rapidjson::Value fn(rapidjson::kObjectType);
      fn.AddMember("name", make_string(t.name, a), a);
      if (!t.description.empty()) fn.AddMember("description", make_string(t.description, a), a);
      fn.AddMember("parameters", rapidjson::Value(params, a), a);
      rapidjson::Value tool(rapidjson::kObjectType);
      tool.AddMember("type", "function", a);
      tool.AddMember("function", fn, a);
      tools_.PushBack(tool, a);
    }

    if (!o_.api_key_env.empty()) {
      const char *key = std::getenv(o_.api_key_env.c_str());
      if (key == nullptr || *key == '\0')
        throw std::invalid_argument("llm.api_key_env names the environment variable " + o_.api_key_env +
                                    ", which is not set (or empty)");
      api_key_ = key;
      rapidjson::Value k(rapidjson::StringRef(api_key_.data(), static_cast<rapidjson::SizeType>(api_key_.size())));
      std::string quoted = to_json(k);
      quoted = quoted.substr(1, quoted.size() - 2);
      if (quoted != api_key_) api_key_escaped_ = quoted;
    }

    if (https_) {
      static std::once_flag ssl_once;
      std::call_once(ssl_once, [] { Poco::Net::initializeSSL(); });
      try {
        tls_ = new Poco::Net::Context(Poco::Net::Context::TLS_CLIENT_USE, "", "", o_.ca_file,
                                      Poco::Net::Context::VERIFY_RELAXED, 9, o_.ca_file.empty());
        tls_->requireMinimumProtocol(Poco::Net::Context::PROTO_TLSV1_2);
      } catch (const Poco::Exception &e) {
        throw std::runtime_error("llm: cannot set up TLS" +
                                 (o_.ca_file.empty() ? std::string() : " with llm.ca_file " + o_.ca_file) + ": " +
                                 e.displayText());
      }
    }
  }

  std::string name() const override { return "llm"; }

  std::vector<AgentSkill> skills() const override {
    std::string tools;
    for (const LlmTool &t : o_.tools)
      tools += (tools.empty() ? "" : ", ") + t.name + (t.needs_approval ? " (asks for approval)" : "");
    return {AgentSkill{"llm", "LLM agent",
                       "Answers with the model " + o_.model +
                           (tools.empty() ? std::string(".")
                                          : "; may call the tools " + tools +
                                                ". A call that asks for approval parks the Task in "
                                                "input-required until you answer approve or deny."),
                       {"llm", "tools", "human-in-the-loop"},
                       {"What can you do?"}}};
  }

  // The one door of every run: whatever the steps below produce (the
  // artifacts, the status message, the pending request with its tool-call
  // arguments and conversation, progress, an exception's text) passes
  // through redaction of the API key here before the server sees it, so a
  // model that echoes the key (in a 200 answer, a tool call, anywhere)
  // cannot have it stored or returned.
  ExecutionResult execute(const ExecutionContext &ctx) override {
    RedactingProgress progress(ctx.progress, *this);
    const ExecutionContext inner{ctx.task, ctx.pending, ctx.latest_text, ctx.cancel_requested, progress};
    ExecutionResult r;
    try {
      r = step(inner);
    } catch (const std::exception &e) {
      throw std::runtime_error(redact(e.what()));
    }
    r.message = redact(std::move(r.message));
    redact_json(r.artifacts, r.artifacts.GetAllocator());
    redact_json(r.request_data, r.request_data.GetAllocator());
    return r;
  }

 private:
  // TaskProgress that redacts what it passes on to the server's.
  class RedactingProgress final : public TaskProgress {
   public:
    RedactingProgress(TaskProgress &to, const LlmExecutor &by) : to_(to), by_(by) {}
    void status(std::string_view text) override { to_.status(by_.redact(std::string(text))); }
    void artifact_chunk(std::string_view artifact_id, std::string_view name, const rapidjson::Value &parts,
                        bool last_chunk) override {
      rapidjson::Document copy;
      copy.CopyFrom(parts, copy.GetAllocator());
      by_.redact_json(copy, copy.GetAllocator());
      to_.artifact_chunk(by_.redact(std::string(artifact_id)), by_.redact(std::string(name)), copy, last_chunk);
    }

   private:
    TaskProgress &to_;
    const LlmExecutor &by_;
  };

  // One run: a first run, or the answer to a pending tool call.
  ExecutionResult step(const ExecutionContext &ctx) {
    rapidjson::Document conv(rapidjson::kObjectType);
    auto &a = conv.GetAllocator();
    rapidjson::Value messages(rapidjson::kArrayType);
    if (ctx.pending == nullptr) {
      // First run: the Task's history is the conversation.
      const rapidjson::Value *history = find(ctx.task.json(), "history");
      if (history != nullptr && history->IsArray()) {
        for (const auto &m : history->GetArray()) {
          const std::string_view role = str(find(m, "role"));
          const std::string text = message_text(m);
          if (text.empty() || (role != "user" && role != "agent")) continue;
          rapidjson::Value msg(rapidjson::kObjectType);
          msg.AddMember("role", rapidjson::StringRef(role == "user" ? "user" : "assistant"), a);
          msg.AddMember("content", make_string(text, a), a);
          messages.PushBack(msg, a);
        }
      }
      if (messages.Empty())
        return ExecutionResult::rejected("The llm agent reads text parts only, and this Task's messages have none.");
      conv.AddMember("messages", messages, a);
      return run(ctx, conv);
    }

    // A reply to a pending tool call.
    const rapidjson::Value *data = find(*ctx.pending, "data");
    const rapidjson::Value *saved = data == nullptr ? nullptr : find(*data, "messages");
    const rapidjson::Value *calls = data == nullptr ? nullptr : find(*data, "calls");
    const rapidjson::Value *next = data == nullptr ? nullptr : find(*data, "next");
    if (data == nullptr || str(find(*data, "kind")) != kPendingKind || saved == nullptr || !saved->IsArray() ||
        calls == nullptr || !calls->IsArray() || next == nullptr || !next->IsUint() ||
        next->GetUint() >= calls->Size())
      return ExecutionResult::failed(
          "This Task's pending request was not saved by the llm agent (or is damaged), so the llm agent cannot "
          "resume it.");
    const rapidjson::Value &call = (*calls)[next->GetUint()];
    const std::string reply(ctx.latest_text);
    std::string first, rest;
    split_reply(reply, first, rest);
    bool approved = false;
    if (first == "approve" || first == "approved" || first == "yes") {
      approved = true;
    } else if (first != "deny" && first != "denied" && first != "no") {
      rapidjson::Document again;
      again.CopyFrom(*data, again.GetAllocator());
      return ExecutionResult::input_required("Please answer \"approve\" or \"deny\". " + approval_prompt(call),
                                             std::move(again));
    }
    conv.AddMember("messages", rapidjson::Value(*saved, a), a);
    const LlmTool *tool = find_tool(str(find(call, "name")));
    std::string content;
    if (approved) {
      content = tool == nullptr ? std::string("approved") : result_of(*tool);
    } else {
      content = "denied: the user did not approve this call";
    }
    if (!rest.empty()) content += "\nUser comment: " + rest;
    add_tool_message(conv, str(find(call, "id")), content);
    rapidjson::Document pending_calls;
    pending_calls.CopyFrom(*calls, pending_calls.GetAllocator());
    Step s = handle_calls(conv, pending_calls, next->GetUint() + 1);
    if (s.done) return std::move(s.result);
    return run(ctx, conv);
  }

  // Model calls until an answer, a parked tool call or a failure.
  ExecutionResult run(const ExecutionContext &ctx, rapidjson::Document &conv) {
    for (int n = 0; n < o_.max_model_calls; ++n) {
      rapidjson::Document answer;
      if (std::optional<ExecutionResult> failed = complete(ctx, conv["messages"], answer)) return std::move(*failed);
      // choices[0].message
      const rapidjson::Value *choices = find(answer, "choices");
      const rapidjson::Value *msg =
          choices != nullptr && choices->IsArray() && !choices->Empty() ? find((*choices)[0], "message") : nullptr;
      if (msg == nullptr || !msg->IsObject())
        return ExecutionResult::failed(redact("The model endpoint " + url_ +
                                              " answered HTTP 200 without choices[0].message: " +
                                              excerpt(to_json(answer))));
      const std::string_view finish = str(find((*choices)[0], "finish_reason"));
      const rapidjson::Value *tool_calls = find(*msg, "tool_calls");
      const rapidjson::Value *content = find(*msg, "content");
      const std::string text = content != nullptr && content->IsString() ? std::string(str(content)) : std::string();
      auto &a = conv.GetAllocator();

      if (tool_calls == nullptr || !tool_calls->IsArray() || tool_calls->Empty()) {
        if (text.empty()) return ExecutionResult::failed("The model returned neither an answer nor a tool call.");
        ExecutionResult r = ExecutionResult::completed(
            finish == "length" ? "The answer was cut off at the model's length limit." : "");
        r.add_text_artifact(text, "answer");
        return r;
      }

      // The assistant message as the endpoint must see it again, and the
      // calls in a normalised form.
      rapidjson::Document calls(rapidjson::kArrayType);
      auto &ca = calls.GetAllocator();
      rapidjson::Value assistant(rapidjson::kObjectType);
      assistant.AddMember("role", "assistant", a);
      assistant.AddMember("content", text.empty() ? rapidjson::Value() : make_string(text, a), a);
      rapidjson::Value echoed(rapidjson::kArrayType);
      for (rapidjson::SizeType i = 0; i < tool_calls->Size(); ++i) {
        const rapidjson::Value &tc = (*tool_calls)[i];
        const rapidjson::Value *fn = find(tc, "function");
        std::string id(str(find(tc, "id")));
        if (id.empty()) id = "call_" + std::to_string(i);
        const std::string fname(fn == nullptr ? std::string_view() : str(find(*fn, "name")));
        std::string args;
        if (const rapidjson::Value *av = fn == nullptr ? nullptr : find(*fn, "arguments")) {
          if (av->IsString()) args.assign(av->GetString(), av->GetStringLength());
          else if (!av->IsNull()) args = to_json(*av);  // an object, from a lenient server
        }
        rapidjson::Value f(rapidjson::kObjectType);
        f.AddMember("name", make_string(fname, a), a);
        f.AddMember("arguments", make_string(args, a), a);
        rapidjson::Value e(rapidjson::kObjectType);
        e.AddMember("id", make_string(id, a), a);
        e.AddMember("type", "function", a);
        e.AddMember("function", f, a);
        echoed.PushBack(e, a);
        rapidjson::Value c(rapidjson::kObjectType);
        c.AddMember("id", make_string(id, ca), ca);
        c.AddMember("name", make_string(fname, ca), ca);
        c.AddMember("arguments", make_string(args, ca), ca);
        calls.PushBack(c, ca);
      }
      assistant.AddMember("tool_calls", echoed, a);
      conv["messages"].PushBack(assistant, a);
      Step s = handle_calls(conv, calls, 0);
      if (s.done) return std::move(s.result);
    }
    return ExecutionResult::failed("The model called tools " + std::to_string(o_.max_model_calls) +
                                   " times in a row without answering (llm.max_model_calls).");
  }

  // Answers calls[from...] in order: runs the tools that need no approval,
  // answers unknown tools and bad arguments with an error text, parks the
  // Task on the first call that needs approval.
  Step handle_calls(rapidjson::Document &conv, const rapidjson::Document &calls, rapidjson::SizeType from) const {
    for (rapidjson::SizeType i = from; i < calls.Size(); ++i) {
      const rapidjson::Value &call = calls[i];
      const std::string_view id = str(find(call, "id"));
      const std::string_view fname = str(find(call, "name"));
      const LlmTool *tool = find_tool(fname);
      if (tool == nullptr) {
        std::string names;
        for (const LlmTool &t : o_.tools) names += (names.empty() ? "" : ", ") + t.name;
        add_tool_message(conv, id,
                         "error: there is no tool named '" + excerpt(fname, 80) + "'" +
                             (names.empty() ? std::string(" (no tools are available)")
                                            : " (tools: " + names + ")"));
        continue;
      }
      std::string why;
      if (!arguments_ok(str(find(call, "arguments")), why)) {
        add_tool_message(conv, id, "error: the arguments are not a JSON object: " + why);
        continue;
      }
      if (!tool->needs_approval) {
        add_tool_message(conv, id, result_of(*tool));
        continue;
      }
      rapidjson::Document data(rapidjson::kObjectType);
      auto &a = data.GetAllocator();
      data.AddMember("kind", rapidjson::StringRef(kPendingKind), a);
      data.AddMember("messages", rapidjson::Value(conv["messages"], a), a);
      data.AddMember("calls", rapidjson::Value(calls, a), a);
      data.AddMember("next", i, a);
      Step s;
      s.done = true;
      s.result = ExecutionResult::input_required(approval_prompt(call), std::move(data));
      return s;
    }
    return Step{};
  }

  static bool arguments_ok(std::string_view args, std::string &why) {
    if (args.find_first_not_of(" \t\r\n") == std::string_view::npos) return true;  // "" = no arguments
    rapidjson::Document d;
    d.Parse(args.data(), args.size());
    if (d.HasParseError()) {
      why = std::string(rapidjson::GetParseError_En(d.GetParseError())) + " at byte " +
            std::to_string(d.GetErrorOffset());
      return false;
    }
    if (!d.IsObject()) {
      why = "a JSON value that is not an object";
      return false;
    }
    return true;
  }

  static std::string approval_prompt(const rapidjson::Value &call) {
    std::string args(str(find(call, "arguments")));
    rapidjson::Document d;
    d.Parse(args.data(), args.size());
    if (!d.HasParseError()) args = to_json(d);
    if (args.find_first_not_of(" \t\r\n") == std::string::npos) args = "{}";
    return "Approval required: the agent wants to call " + std::string(str(find(call, "name"))) + " with " +
           excerpt(args, 2000) + ". Reply \"approve\" to run it or \"deny\" to refuse.";
  }

  // The first word of a reply (lower case) and the rest (trimmed).
  static void split_reply(const std::string &reply, std::string &first, std::string &rest) {
    std::size_t i = 0;
    while (i < reply.size() && std::isspace(static_cast<unsigned char>(reply[i]))) ++i;
    while (i < reply.size() && std::isalpha(static_cast<unsigned char>(reply[i])))
      first.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(reply[i++]))));
    while (i < reply.size() && (std::isspace(static_cast<unsigned char>(reply[i])) ||
                                std::ispunct(static_cast<unsigned char>(reply[i]))))
      ++i;
    rest = reply.substr(i);
    while (!rest.empty() && std::isspace(static_cast<unsigned char>(rest.back()))) rest.pop_back();
  }

  const LlmTool *find_tool(std::string_view name) const {
    for (const LlmTool &t : o_.tools)
      if (t.name == name) return &t;
    return nullptr;
  }

  static std::string result_of(const LlmTool &t) {
    if (!t.result.empty()) return t.result;
    return t.needs_approval ? "approved" : "ok";
  }

  static void add_tool_message(rapidjson::Document &conv, std::string_view id, const std::string &content) {
    auto &a = conv.GetAllocator();
    rapidjson::Value m(rapidjson::kObjectType);
    m.AddMember("role", "tool", a);
    m.AddMember("tool_call_id", make_string(id, a), a);
    m.AddMember("content", make_string(content, a), a);
    conv["messages"].PushBack(m, a);
  }

  // `text` with every occurrence of the API key, as is or as written inside
  // a JSON string (a tool call's arguments are JSON in a string), replaced
  // by "[redacted]".
  std::string redact(std::string text) const {
    for (const std::string *key : {&api_key_, &api_key_escaped_}) {
      if (key->empty()) continue;
      for (std::size_t p = text.find(*key); p != std::string::npos; p = text.find(*key, p + 10))
        text.replace(p, key->size(), "[redacted]");
    }
    return text;
  }

  // Redacts every string of `v` (member names too), in place.
  void redact_json(rapidjson::Value &v, rapidjson::Document::AllocatorType &a) const {
    if (api_key_.empty()) return;
    auto fix = [&](rapidjson::Value &s) {
      const std::string_view text(s.GetString(), s.GetStringLength());
      if (text.find(api_key_) == std::string_view::npos &&
          (api_key_escaped_.empty() || text.find(api_key_escaped_) == std::string_view::npos))
        return;
      const std::string clean = redact(std::string(text));
      s.SetString(clean.data(), static_cast<rapidjson::SizeType>(clean.size()), a);
    };
    if (v.IsString()) {
      fix(v);
    } else if (v.IsArray()) {
      for (auto &e : v.GetArray()) redact_json(e, a);
    } else if (v.IsObject()) {
      for (auto it = v.MemberBegin(); it != v.MemberEnd(); ++it) {
        fix(it->name);
        redact_json(it->value, a);
      }
    }
  }

  // One chat completion, with retries. Fills `answer` and returns nothing on
  // success; else the failed result (or a canceled placeholder, which the
  // server discards).
  std::optional<ExecutionResult> complete(const ExecutionContext &ctx, const rapidjson::Value &messages,
                                          rapidjson::Document &answer) const {
    rapidjson::Document req(rapidjson::kObjectType);
    auto &a = req.GetAllocator();
    req.AddMember("model", make_string(o_.model, a), a);
    rapidjson::Value msgs(rapidjson::kArrayType);
    if (!o_.system_prompt.empty()) {
      rapidjson::Value sys(rapidjson::kObjectType);
      sys.AddMember("role", "system", a);
      sys.AddMember("content", make_string(o_.system_prompt, a), a);
      msgs.PushBack(sys, a);
    }
    for (const auto &m : messages.GetArray()) msgs.PushBack(rapidjson::Value(m, a), a);
    req.AddMember("messages", msgs, a);
    if (!tools_.Empty()) req.AddMember("tools", rapidjson::Value(tools_, a), a);
    const std::string body = to_json(req);

    Reply r;
    const int attempts = o_.max_retries + 1;
    int made = 0;
    for (int attempt = 0; attempt < attempts; ++attempt) {
      if (ctx.cancel_requested) return ExecutionResult::failed("Canceled.");
      if (attempt > 0) {
        int64_t wait = int64_t{o_.retry_initial_ms} << std::min(attempt - 1, 20);
        if (r.retry_after_s >= 0) wait = std::max<int64_t>(wait, int64_t{r.retry_after_s} * 1000);
        wait = std::min<int64_t>(wait, o_.retry_max_ms);
        const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait);
        while (std::chrono::steady_clock::now() < until) {
          if (ctx.cancel_requested) return ExecutionResult::failed("Canceled.");
          std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(
              std::chrono::milliseconds(20), until - std::chrono::steady_clock::now()));
        }
      }
      r = post(body);
      ++made;
      if (r.status == 200 || !retryable(r)) break;
    }
    // Redacted as it arrives, before any excerpt could cut a key in two and
    // leave a prefix of it that a later redaction would not recognise.
    r.body = redact(std::move(r.body));
    r.reason = redact(std::move(r.reason));
    r.transport_error = redact(std::move(r.transport_error));
    const std::string tries = made > 1 ? " (after " + std::to_string(made) + " attempts)" : std::string();
    if (r.status == 0 && r.final)
      return ExecutionResult::failed(redact("The model endpoint failed: POST " + url_ + ": " + r.transport_error));
    if (r.status == 0) {
      return ExecutionResult::failed(redact("The model endpoint could not be reached: POST " + url_ + ": " +
                                            (r.timed_out ? "no answer within " + std::to_string(o_.timeout_ms) +
                                                               " ms (llm.timeout_ms)"
                                                         : excerpt(r.transport_error)) +
                                            tries));
    }
    if (r.status != 200) {
      return ExecutionResult::failed(redact("The model endpoint failed: POST " + url_ + " answered HTTP " +
                                            std::to_string(r.status) + (r.reason.empty() ? "" : " " + r.reason) +
                                            endpoint_error(r.body) + tries));
    }
    answer.Parse(r.body.data(), r.body.size());
    if (answer.HasParseError() || !answer.IsObject())
      return ExecutionResult::failed(redact("The model endpoint " + url_ +
                                            " answered HTTP 200 with a body that is not a JSON object" +
                                            (answer.HasParseError()
                                                 ? std::string(" (") + rapidjson::GetParseError_En(answer.GetParseError()) +
                                                       " at byte " + std::to_string(answer.GetErrorOffset()) + ")"
                                                 : std::string()) +
                                            ": " + excerpt(r.body)));
    if (const rapidjson::Value *e = find(answer, "error"); e != nullptr && !e->IsNull())
      return ExecutionResult::failed(redact("The model endpoint " + url_ + " answered HTTP 200 with an error" +
                                            endpoint_error(r.body)));
    return std::nullopt;
  }

  // One POST; never throws.
  Reply post(const std::string &body) const {
    Reply r;
    try {
      std::unique_ptr<Poco::Net::HTTPClientSession> s;
      if (https_) s = std::make_unique<Poco::Net::HTTPSClientSession>(host_, port_, tls_);
      else s = std::make_unique<Poco::Net::HTTPClientSession>(host_, port_);
      const Poco::Timespan t(static_cast<Poco::Timespan::TimeDiff>(o_.timeout_ms) * 1000);
      s->setTimeout(t, t, t);
      s->setKeepAlive(false);
      Poco::Net::HTTPRequest req(Poco::Net::HTTPRequest::HTTP_POST, path_, Poco::Net::HTTPMessage::HTTP_1_1);
      req.setContentType("application/json");
      req.setContentLength(static_cast<std::streamsize>(body.size()));
      req.set("Accept", "application/json");
      req.set("User-Agent", "toolnexus/" TOOLNEXUS_VERSION);
      if (!api_key_.empty()) req.set("Authorization", "Bearer " + api_key_);
      std::ostream &os = s->sendRequest(req);
      os.write(body.data(), static_cast<std::streamsize>(body.size()));
      os.flush();
      Poco::Net::HTTPResponse resp;
      std::istream &is = s->receiveResponse(resp);
      r.status = static_cast<int>(resp.getStatus());
      r.reason = resp.getReason();
      const std::string ra = resp.get("Retry-After", "");
      if (!ra.empty() && ra.size() <= 6 && std::all_of(ra.begin(), ra.end(), [](unsigned char c) {
            return std::isdigit(c) != 0;
          }))
        r.retry_after_s = std::stoi(ra);
      char buf[16384];
      while (is) {
        is.read(buf, sizeof buf);
        r.body.append(buf, static_cast<std::size_t>(is.gcount()));
        if (r.body.size() > kMaxResponseBytes) {
          r.status = 0;
          r.final = true;
          r.transport_error = "the answer is larger than " + std::to_string(kMaxResponseBytes) + " bytes";
          return r;
        }
      }
    } catch (const Poco::TimeoutException &) {
      r = Reply{};
      r.timed_out = true;
    } catch (const Poco::Exception &e) {
      r = Reply{};
      r.transport_error = e.displayText();
    } catch (const std::exception &e) {
      r = Reply{};
      r.transport_error = e.what();
    }
    return r;
  }

  LlmOptions o_;
  bool https_ = false;
  std::string host_;
  uint16_t port_ = 0;
  std::string path_;
  std::string url_;
  std::string api_key_;
  /// api_key_ as written inside a JSON string, when that differs ("" else).
  std::string api_key_escaped_;
  rapidjson::Document tools_;
  Poco::Net::Context::Ptr tls_;
};

}  // namespace

LlmOptions parse_llm_options(const rapidjson::Value &section, const std::string &where) {
  if (!section.IsObject()) throw std::invalid_argument(where + " must be an object");
  check_keys(section, where,
             {"base_url", "model", "api_key_env", "system_prompt", "tools", "timeout_ms", "max_retries",
              "retry_initial_ms", "retry_max_ms", "max_model_calls", "ca_file"});
  LlmOptions o;
  o.base_url = get_string(section, "base_url", where, true);
  o.model = get_string(section, "model", where, true);
  o.api_key_env = get_string(section, "api_key_env", where, false);
  o.system_prompt = get_string(section, "system_prompt", where, false);
  o.ca_file = get_string(section, "ca_file", where, false);
  constexpr int kDay = 24 * 3600 * 1000;
  get_int(section, "timeout_ms", where, 1, kDay, o.timeout_ms);
  get_int(section, "max_retries", where, 0, 10, o.max_retries);
  get_int(section, "retry_initial_ms", where, 1, kDay, o.retry_initial_ms);
  get_int(section, "retry_max_ms", where, 1, kDay, o.retry_max_ms);
  get_int(section, "max_model_calls", where, 1, 100, o.max_model_calls);
  if (const rapidjson::Value *tools = find(section, "tools"); tools != nullptr && !tools->IsNull()) {
    if (!tools->IsArray()) throw std::invalid_argument(where + ".tools must be an array of tool objects");
    for (rapidjson::SizeType i = 0; i < tools->Size(); ++i) {
      const rapidjson::Value &t = (*tools)[i];
      const std::string tw = where + ".tools[" + std::to_string(i) + "]";
      if (!t.IsObject()) throw std::invalid_argument(tw + " must be an object");
      check_keys(t, tw, {"name", "description", "parameters", "approval", "result"});
      LlmTool tool;
      tool.name = get_string(t, "name", tw, true);
      tool.description = get_string(t, "description", tw, false);
      tool.result = get_string(t, "result", tw, false);
      if (const rapidjson::Value *p = find(t, "parameters"); p != nullptr && !p->IsNull()) {
        if (!p->IsObject()) throw std::invalid_argument(tw + ".parameters must be a JSON Schema object");
        tool.parameters_json = to_json(*p);
      }
      if (const rapidjson::Value *ap = find(t, "approval"); ap != nullptr && !ap->IsNull()) {
        if (!ap->IsBool()) throw std::invalid_argument(tw + ".approval must be true or false");
        tool.needs_approval = ap->GetBool();
      }
      o.tools.push_back(std::move(tool));
    }
  }
  return o;
}

std::shared_ptr<AgentExecutor> make_llm_executor(LlmOptions options) {
  return std::make_shared<LlmExecutor>(std::move(options));
}

}  // namespace toolnexus

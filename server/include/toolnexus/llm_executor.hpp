// toolnexus/llm_executor.hpp: the "llm" agent. An AgentExecutor that answers
// a Task with a model behind an OpenAI-compatible chat completions endpoint
// (POST {base_url}/chat/completions; OpenAI API reference, "Create chat
// completion"), offering it the tools declared in the configuration.
//
// One run (AgentExecutor::execute):
//   1. The Task's history becomes the messages (user -> "user", agent ->
//      "assistant", text parts joined with "\n"), after the system prompt.
//   2. The model is called with the tools (type "function", JSON-schema
//      parameters). An answer without tool calls completes the Task with the
//      answer as an artifact named "answer".
//   3. Each tool call is handled in order. A tool that needs no approval runs
//      at once: its result (LlmTool::result) goes back as a "tool" message.
//      A tool that needs approval parks the Task in input-required; the prompt
//      names the tool and its arguments, and the whole conversation so far
//      (messages, the tool calls, which one waits) is saved as the pending
//      request's data (ExecutionResult::input_required), so any process can
//      resume it from the stored Task.
//   4. A follow-up message on the same Task answers the pending call:
//      "approve"/"approved"/"yes" runs the tool (result as in 3), "deny"/
//      "denied"/"no" sends the denial as the tool's result; the rest of the
//      reply after the first word, if any, is passed on to the model with it.
//      Anything else asks again. The model is then called again (step 2).
//   Calls for a tool that is not declared, or with arguments that are not a
//   JSON object, get an error text as their tool result (the model may try
//   again); no tool ever executes a program or reaches the network.
//
// Failures end the Task in failed with a status message that names the
// endpoint and quotes its error (HTTP status, error.code/type,
// error.message), never the API key. Nothing the agent returns holds the
// key: every occurrence of it in the artifacts, status messages, pending
// request data (tool-call arguments, the saved conversation), progress and
// exception texts is replaced by "[redacted]" at the one exit of execute().
// 429 and 5xx answers, timeouts and
// connection errors are retried up to LlmOptions::max_retries times with
// exponential backoff (honouring Retry-After up to retry_max_ms); other 4xx
// answers are not retried.
#ifndef TOOLNEXUS_LLM_EXECUTOR_HPP
#define TOOLNEXUS_LLM_EXECUTOR_HPP

#include "toolnexus/agent_executor.hpp"

#include <rapidjson/document.h>

#include <memory>
#include <string>
#include <vector>

namespace toolnexus {

/// One tool offered to the model. Plain value type.
struct LlmTool {
  /// The function name the model calls: 1 to 64 of [A-Za-z0-9_-] (the
  /// OpenAI function-name rule). Unique within LlmOptions::tools.
  std::string name;
  /// Told to the model ("" = left out).
  std::string description;
  /// JSON Schema of the arguments, as JSON text of an object (OpenAI
  /// "parameters").
  std::string parameters_json = R"({"type":"object","properties":{}})";
  /// true: each call parks the Task in input-required until a person
  /// answers approve or deny.
  bool needs_approval = false;
  /// The content of the "tool" message sent back to the model when the tool
  /// runs (at once, or once approved). "" = "approved" for a tool that needs
  /// approval, "ok" for one that does not.
  std::string result;
};

/// Settings of the llm agent. Plain value type; see parse_llm_options() for
/// the JSON form.
struct LlmOptions {
  /// The API base, "http://HOST[:PORT][/PATH]" or "https://..."
  /// (e.g. "https://api.openai.com/v1"); requests go to
  /// POST {base_url}/chat/completions. No query or fragment.
  std::string base_url;
  /// The "model" of each request.
  std::string model;
  /// Name of the environment variable holding the API key, read once by
  /// make_llm_executor() and sent as "Authorization: Bearer <key>". "" = no
  /// Authorization header (a local server).
  std::string api_key_env;
  /// First message, role "system" ("" = none).
  std::string system_prompt;
  /// The tools offered (none = no "tools" in requests).
  std::vector<LlmTool> tools;
  /// Connect timeout and the limit on each socket send or receive of one
  /// request, in milliseconds (> 0).
  int timeout_ms = 60000;
  /// Attempts after the first one on 429, 5xx, a timeout or a connection
  /// error (0..10).
  int max_retries = 3;
  /// Wait before the first retry, doubled for each further one (ms, > 0).
  int retry_initial_ms = 500;
  /// Longest single wait between attempts, also the cap on Retry-After (ms).
  int retry_max_ms = 8000;
  /// Model calls allowed in one run (one execute(): the first message, or one
  /// approval) before the Task fails (1..100): bounds a model that keeps
  /// calling tools.
  int max_model_calls = 8;
  /// PEM file of the certificate authorities trusted for https ("" = the
  /// system's). Certificates and host names are always verified.
  std::string ca_file;
};

/// Reads the "llm" section of a configuration:
///   {"base_url": "https://api.openai.com/v1", "model": "gpt-4o-mini",
///    "api_key_env": "OPENAI_API_KEY", "system_prompt": "...",
///    "timeout_ms": 60000, "max_retries": 3, "retry_initial_ms": 500,
///    "retry_max_ms": 8000, "max_model_calls": 8, "ca_file": "...",
///    "tools": [{"name": "authorize", "description": "...",
///               "parameters": {<JSON Schema object>},
///               "approval": true, "result": "..."}]}
/// base_url and model are required. `where` prefixes every error ("cfg.json:
/// llm"). A relative ca_file is taken as given (the caller resolves it).
/// Throws std::invalid_argument naming the key ("cfg.json: llm.tools[0].name
/// must be 1 to 64 of A-Z a-z 0-9 _ -"), also for an unknown key.
LlmOptions parse_llm_options(const rapidjson::Value &section, const std::string &where);

/// The llm agent. Checks `options` (the rules of LlmOptions) and reads the
/// API key from the environment now. Throws std::invalid_argument (a bad
/// option, quoting it; api_key_env naming a variable that is not set or
/// empty) and std::runtime_error (ca_file unreadable, TLS set-up failed).
/// The executor is thread-safe (one HTTP session per request) and keeps no
/// state between runs: everything a resumed run needs is in the stored Task.
/// A cancel (ExecutionContext::cancel_requested) is noticed between attempts
/// and during backoff waits; a request in flight finishes or times out
/// first.
std::shared_ptr<AgentExecutor> make_llm_executor(LlmOptions options);

}  // namespace toolnexus

#endif  // TOOLNEXUS_LLM_EXECUTOR_HPP

// The AgentExecutor interface's helpers and the built-in executors: echo and
// approval.
#include "toolnexus/agent_executor.hpp"

#include "util.hpp"

#include <algorithm>
#include <cctype>
#include <stdexcept>

namespace toolnexus {

using server_detail::find;
using server_detail::make_string;
using server_detail::str;

AgentExecutor::~AgentExecutor() = default;

ExecutionResult ExecutionResult::completed(std::string note) {
  ExecutionResult r;
  r.outcome = Outcome::completed;
  r.message = std::move(note);
  return r;
}

ExecutionResult ExecutionResult::failed(std::string error) {
  ExecutionResult r;
  r.outcome = Outcome::failed;
  r.message = std::move(error);
  return r;
}

ExecutionResult ExecutionResult::rejected(std::string reason) {
  ExecutionResult r;
  r.outcome = Outcome::rejected;
  r.message = std::move(reason);
  return r;
}

ExecutionResult ExecutionResult::input_required(std::string prompt, rapidjson::Document data) {
  ExecutionResult r;
  r.outcome = Outcome::input_required;
  r.message = std::move(prompt);
  r.request_data.Swap(data);
  return r;
}

ExecutionResult &ExecutionResult::add_text_artifact(std::string_view text, std::string_view name) {
  auto &a = artifacts.GetAllocator();
  if (!artifacts.IsArray()) artifacts.SetArray();
  rapidjson::Value part(rapidjson::kObjectType);
  part.AddMember("kind", "text", a);
  part.AddMember("text", make_string(text, a), a);
  rapidjson::Value parts(rapidjson::kArrayType);
  parts.PushBack(part, a);
  rapidjson::Value art(rapidjson::kObjectType);
  art.AddMember("artifactId", make_string(server_detail::new_uuid(), a), a);
  if (!name.empty()) art.AddMember("name", make_string(name, a), a);
  art.AddMember("parts", parts, a);
  artifacts.PushBack(art, a);
  return *this;
}

namespace {

class EchoExecutor final : public AgentExecutor {
 public:
  std::string name() const override { return "echo"; }
  std::vector<AgentSkill> skills() const override {
    return {AgentSkill{"echo", "Echo", "Completes each Task with one text artifact holding the message text.",
                       {"echo", "test"}, {"hello"}}};
  }
  ExecutionResult execute(const ExecutionContext &ctx) override {
    ExecutionResult r = ExecutionResult::completed();
    r.add_text_artifact(ctx.latest_text, "echo");
    return r;
  }
};

std::string normalized(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  std::string out(s.substr(b, e - b));
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  // "approve." / "yes!" count too.
  while (!out.empty() && (out.back() == '.' || out.back() == '!')) out.pop_back();
  return out;
}

class ApprovalExecutor final : public AgentExecutor {
 public:
  std::string name() const override { return "approval"; }
  std::vector<AgentSkill> skills() const override {
    return {AgentSkill{"approval", "Approval",
                       "Parks each request in input-required until a person answers approve (or yes) "
                       "or deny (or no); approved requests complete with their text echoed.",
                       {"approval", "human-in-the-loop"},
                       {"deploy release 1.4", "approve", "deny"}}};
  }
  ExecutionResult execute(const ExecutionContext &ctx) override {
    if (ctx.pending == nullptr) {
      // First run: remember what is to be approved, in the Task itself.
      rapidjson::Document data(rapidjson::kObjectType);
      data.AddMember("kind", "approval", data.GetAllocator());
      data.AddMember("originalText", make_string(ctx.latest_text, data.GetAllocator()),
                     data.GetAllocator());
      return ExecutionResult::input_required(prompt_for(ctx.latest_text), std::move(data));
    }
    const rapidjson::Value *data = find(*ctx.pending, "data");
    const std::string original(str(data == nullptr ? nullptr : find(*data, "originalText")));
    const std::string answer = normalized(ctx.latest_text);
    if (answer == "approve" || answer == "approved" || answer == "yes") {
      ExecutionResult r = ExecutionResult::completed("Approved.");
      r.add_text_artifact(original, "approved-request");
      return r;
    }
    if (answer == "deny" || answer == "denied" || answer == "no") {
      return ExecutionResult::rejected("Denied: the request was not approved.");
    }
    rapidjson::Document again;
    if (data != nullptr) again.CopyFrom(*data, again.GetAllocator());
    return ExecutionResult::input_required(
        "Please answer \"approve\" or \"deny\". " + prompt_for(original), std::move(again));
  }

 private:
  static std::string prompt_for(std::string_view text) {
    return "Approval required for: \"" + std::string(text) +
           "\". Reply \"approve\" (or \"yes\") to go ahead, or \"deny\" (or \"no\") to reject it.";
  }
};

}  // namespace

std::shared_ptr<AgentExecutor> make_echo_executor() { return std::make_shared<EchoExecutor>(); }
std::shared_ptr<AgentExecutor> make_approval_executor() { return std::make_shared<ApprovalExecutor>(); }

std::vector<std::string> builtin_executor_names() { return {"approval", "echo"}; }

std::shared_ptr<AgentExecutor> make_builtin_executor(std::string_view name) {
  if (name == "echo") return make_echo_executor();
  if (name == "approval") return make_approval_executor();
  if (name == "llm")
    throw std::invalid_argument("the llm agent needs its options: make_llm_executor() (toolnexus/llm_executor.hpp), "
                                "or the \"llm\" section of toolnexus serve's config file");
  throw std::invalid_argument("unknown agent '" + std::string(name) + "' (built-in agents: approval, echo)");
}

}  // namespace toolnexus

// The AgentExecutor interface's helpers and the built-in executors: echo and
// approval.
#include "toolnexus/agent_executor.hpp"

#include "common/util.hpp"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <stdexcept>
#include <thread>

namespace toolnexus {

using server_detail::find;
using server_detail::make_string;
using server_detail::str;

AgentExecutor::~AgentExecutor() = default;
bool AgentExecutor::runs_briefly() const { return false; }
TaskProgress::~TaskProgress() = default;

void TaskProgress::text_chunk(std::string_view artifact_id, std::string_view name, std::string_view text,
                              bool last_chunk) {
  rapidjson::Document parts(rapidjson::kArrayType);
  auto &a = parts.GetAllocator();
  rapidjson::Value part(rapidjson::kObjectType);
  part.AddMember("kind", "text", a);
  part.AddMember("text", make_string(text, a), a);
  parts.PushBack(part, a);
  artifact_chunk(artifact_id, name, parts, last_chunk);
}

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

// The message text cut into at most `n` pieces at word boundaries (the
// pieces concatenated give the text back).
std::vector<std::string_view> pieces(std::string_view text, std::size_t n) {
  std::vector<std::string_view> words;
  std::size_t start = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == ' ' && i + 1 < text.size() && text[i + 1] != ' ') {
      words.push_back(text.substr(start, i + 1 - start));
      start = i + 1;
    }
  }
  words.push_back(text.substr(start));
  std::vector<std::string_view> out;
  const std::size_t per = (words.size() + n - 1) / n;
  for (std::size_t i = 0; i < words.size(); i += per) {
    const std::size_t last = std::min(words.size(), i + per) - 1;
    const char *b = words[i].data();
    const char *e = words[last].data() + words[last].size();
    out.emplace_back(b, static_cast<std::size_t>(e - b));
  }
  return out;
}

class EchoExecutor final : public AgentExecutor {
 public:
  explicit EchoExecutor(int chunk_delay_ms) : delay_ms_(chunk_delay_ms) {}
  std::string name() const override { return "echo"; }
  bool runs_briefly() const override { return delay_ms_ <= 0; }
  std::vector<AgentSkill> skills() const override {
    return {AgentSkill{"echo", "Echo",
                       "Completes each Task with one text artifact holding the message text, streamed in chunks.",
                       {"echo", "test"}, {"hello"}}};
  }
  ExecutionResult execute(const ExecutionContext &ctx) override {
    const std::string id = server_detail::new_uuid();
    const std::vector<std::string_view> chunks = pieces(ctx.latest_text, 4);
    for (std::size_t i = 0; i < chunks.size(); ++i) {
      if (i != 0 && delay_ms_ > 0) {
        // Sleep in short steps so a cancel is noticed at once.
        const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(delay_ms_);
        while (std::chrono::steady_clock::now() < until && !ctx.cancel_requested)
          std::this_thread::sleep_for(std::chrono::milliseconds(std::min(delay_ms_, 10)));
      }
      if (ctx.cancel_requested) return ExecutionResult::failed("canceled");
      ctx.progress.text_chunk(id, "echo", chunks[i], i + 1 == chunks.size());
    }
    return ExecutionResult::completed();
  }

 private:
  int delay_ms_;
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
  bool runs_briefly() const override { return true; }
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

std::shared_ptr<AgentExecutor> make_echo_executor(int chunk_delay_ms) {
  return std::make_shared<EchoExecutor>(std::max(0, chunk_delay_ms));
}
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

// toolnexus/agent_executor.hpp: what runs a Task. The server hands an
// AgentExecutor the Task as read from the store (with its history) and saves
// what it returns: a result (completed, with artifacts), a failure, a
// rejection, or a pending request that parks the Task in input-required with
// its prompt and request data saved in the Task itself, so that any later
// process can resume it from what is persisted (A2A v0.3 section 6.3,
// "input-required"; seed example 2).
#ifndef TOOLNEXUS_AGENT_EXECUTOR_HPP
#define TOOLNEXUS_AGENT_EXECUTOR_HPP

#include "toolnexus/task.hpp"

#include <rapidjson/document.h>

#include <atomic>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace toolnexus {

/// One skill advertised in the Agent Card (A2A v0.3 section 5.5.4,
/// AgentSkill). Plain value type.
struct AgentSkill {
  std::string id;
  std::string name;
  std::string description;
  std::vector<std::string> tags;
  std::vector<std::string> examples;
};

/// Progress an executor reports while it runs, before its ExecutionResult:
/// status messages and artifact chunks. Clients see each as an event of the
/// Task's stream (A2A v1.0 section 3.1.2 TaskStatusUpdateEvent /
/// TaskArtifactUpdateEvent; v0.3 section 7.2.2) and in the stored Task
/// (history, artifacts), so it survives a restart like everything else.
///
/// Saving: updates are written to the store together, at most every
/// progress_interval_ms (the server's setting, default 100 ms) and always
/// with the final result; a burst of chunks costs one store write, a slow
/// executor's chunk is visible within the interval. After a cancel the
/// calls do nothing (cancel_requested is true).
///
/// Thread-safety: call from the thread running execute() only. The object
/// is borrowed for the duration of execute().
class TaskProgress {
 public:
  virtual ~TaskProgress();
  /// A status message from the agent; the Task stays working. Appended to
  /// history as an agent Message.
  virtual void status(std::string_view text) = 0;
  /// Appends `parts` (a JSON array of A2A Parts, e.g.
  /// [{"kind":"text","text":"..."}]; copied) to the artifact
  /// `artifact_id`, which is created (with `name`, may be empty) by its
  /// first chunk. `last_chunk`: the artifact is complete. Throws
  /// std::invalid_argument when `parts` is not a non-empty array of objects,
  /// or the artifact is already complete.
  virtual void artifact_chunk(std::string_view artifact_id, std::string_view name, const rapidjson::Value &parts,
                              bool last_chunk) = 0;
  /// artifact_chunk with one text part.
  void text_chunk(std::string_view artifact_id, std::string_view name, std::string_view text, bool last_chunk);
};

/// What an executor sees for one run. Every reference is borrowed for the
/// duration of AgentExecutor::execute() only.
struct ExecutionContext {
  /// The Task as read from the store: "id", "contextId", "status" (working),
  /// "history" (oldest first; the message that started this run is the last
  /// user message), "artifacts" and "metadata" as saved.
  const Task &task;
  /// The pending request saved when the Task was last parked in
  /// input-required, or nullptr on a first run. An object
  /// {"prompt": string, "data": <ExecutionResult::request_data>,
  ///  "askedAt": RFC 3339 time}, read from the Task's
  /// metadata["toolnexus/pending"].
  const rapidjson::Value *pending;
  /// The text parts of the newest user message, joined with "\n" ("" when it
  /// has none).
  std::string_view latest_text;
  /// Becomes true when the Task is canceled (CancelTask, here or on another
  /// server sharing the store) or the server is stopping; long-running
  /// executors should poll it and return early. Whatever they return after a
  /// cancel is discarded: a terminal state is never overwritten. When the
  /// stopping server asked (its drain timeout passed), the Task fails with a
  /// status message saying so, whatever they return.
  const std::atomic<bool> &cancel_requested;
  /// Where to report progress (status messages, artifact chunks) before
  /// returning.
  TaskProgress &progress;
};

/// What an executor returns. Move-only (it owns RapidJSON documents).
struct ExecutionResult {
  /// The state the Task moves to.
  enum class Outcome { completed, failed, rejected, input_required };

  Outcome outcome = Outcome::failed;
  /// Text of the agent status message: the prompt (input_required), the
  /// error (failed), the reason (rejected), an optional note (completed; ""
  /// = no status message). Saved as status.message and appended to history.
  std::string message;
  /// Artifacts appended to the Task: an array of A2A Artifact objects
  /// ({"artifactId"?, "name"?, "parts": [Part]}); a missing artifactId is
  /// filled with a UUID.
  rapidjson::Document artifacts{rapidjson::kArrayType};
  /// input_required only: any JSON value saved with the prompt in the Task
  /// and handed back in ExecutionContext::pending["data"] on resume. Must be
  /// enough to continue: the next run may be in another process.
  rapidjson::Document request_data;

  /// completed, with an optional status note.
  static ExecutionResult completed(std::string note = {});
  /// failed, with the error text as status message.
  static ExecutionResult failed(std::string error);
  /// rejected, with the reason as status message.
  static ExecutionResult rejected(std::string reason);
  /// input_required with `prompt`; `data` (may be null) is saved with it.
  static ExecutionResult input_required(std::string prompt, rapidjson::Document data = {});
  /// Appends an artifact holding one text part; returns *this.
  ExecutionResult &add_text_artifact(std::string_view text, std::string_view name = {});
};

/// What runs a Task. Implementations must be thread-safe: execute() is
/// called from several worker threads at once (for different Tasks). An
/// exception thrown by execute() fails the Task with the exception's message;
/// it never reaches the server.
class AgentExecutor {
 public:
  virtual ~AgentExecutor();
  /// Short name ("echo", "approval").
  virtual std::string name() const = 0;
  /// Skills for the Agent Card.
  virtual std::vector<AgentSkill> skills() const = 0;
  /// Runs one step of a Task (see ExecutionContext / ExecutionResult).
  virtual ExecutionResult execute(const ExecutionContext &ctx) = 0;
  /// True when execute() returns promptly: it computes, and waits for
  /// nothing (no network, no model, no sleep, no lock held for long). The
  /// server may then run a Task of a blocking SendMessage on the thread
  /// that serves the request, which waits for the outcome anyway, instead
  /// of handing it to a worker thread and back: two thread switches fewer
  /// per request (a worker slot is still taken, so at most `workers` runs
  /// are in progress). Default false: runs go to the worker threads, and a
  /// blocking request's wait is bounded by the server's blocking timeout.
  /// Thread-safe; must return the same value for the executor's lifetime.
  virtual bool runs_briefly() const;
};

/// echo: completes every Task with one text artifact holding the message
/// text, streamed as chunks (one per word group, through TaskProgress) with
/// `chunk_delay_ms` between them (0: no pause; the chunks are then saved
/// together with the result).
std::shared_ptr<AgentExecutor> make_echo_executor(int chunk_delay_ms = 0);

/// approval: parks every new Task in input-required asking for approval. A
/// follow-up message "approve" or "yes" (any case, surrounding blanks
/// ignored) completes it with the original text echoed in an artifact;
/// "deny" or "no" rejects it; anything else asks again. The original text is
/// kept in the pending request's data, so the approval works across
/// restarts.
std::shared_ptr<AgentExecutor> make_approval_executor();

/// Names accepted by make_builtin_executor(): {"approval", "echo"}.
std::vector<std::string> builtin_executor_names();

/// The built-in executor called `name`. Throws std::invalid_argument quoting
/// the name and listing the known ones.
std::shared_ptr<AgentExecutor> make_builtin_executor(std::string_view name);

}  // namespace toolnexus

#endif  // TOOLNEXUS_AGENT_EXECUTOR_HPP

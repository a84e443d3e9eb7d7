// fuzz/dialect_fuzz.cpp: the two dialect views of a stored Task
// (server/src/wire/dialect.hpp): write_task for v0.3 and v1.0,
// filter_stored_task_v03 (GetTask's fast path), and message_from_v1 (a v1.0
// Message into the stored form).
//
// Input: byte 0 picks the view (history length, artifacts); the rest is
// JSON: a stored Task, or a v1.0 Message.
//
// Invariants: every view written is valid JSON (an object) with no private
// "toolnexus/" metadata key; the fast v0.3 path accepts exactly the Tasks
// is_stored_task_of accepts, writes valid JSON when it does, and it agrees
// with write_task's v0.3 view; a v1.0 Message either is refused with
// RpcError -32602 naming a field, or becomes a stored Message (an object)
// whose v1.0 and v0.3 views are valid JSON (for a Message the JSON-RPC
// envelope parser accepted).
#include "fuzz_check.hpp"
#include "toolnexus/task.hpp"
#include "wire/dialect.hpp"
#include "wire/jsonrpc.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

using namespace toolnexus::server_detail;

namespace {

// The JSON `write` produces, checked valid and an object.
template <class F>
std::string render(F &&write, const char *what) {
  rapidjson::StringBuffer buf;
  JsonWriter w(buf);
  write(w);
  const std::string out(buf.GetString(), buf.GetSize());
  FUZZ_CHECK(w.IsComplete(), std::string(what) + " left the JSON incomplete: " + out);
  FUZZ_CHECK(toolnexus::fuzz::valid_json(out), std::string(what) + ": " + out);
  FUZZ_CHECK(!out.empty() && out[0] == '{', std::string(what) + ": " + out);
  return out;
}

// True when the JSON `out` has a "metadata" object with a private key.
bool shows_private_metadata(const std::string &out) {
  rapidjson::Document d;
  d.Parse(out.data(), out.size());
  if (!d.IsObject()) return false;
  auto m = d.FindMember("metadata");
  if (m == d.MemberEnd() || !m->value.IsObject()) return false;
  for (auto &k : m->value.GetObject())
    if (is_private_metadata_key(std::string_view(k.name.GetString(), k.name.GetStringLength()))) return true;
  return false;
}

void fuzz_task(std::string_view json, const TaskView &view) {
  toolnexus::Task task;
  try {
    task = toolnexus::Task::parse(json);
  } catch (const toolnexus::InvalidTask &) {
    return;
  }
  const auto &doc = task.json();
  for (Dialect d : {Dialect::v0_3, Dialect::v1_0, Dialect::v1_1}) {
    const std::string out = render([&](JsonWriter &w) { write_task(w, doc, d, view); }, dialect_name(d));
    FUZZ_CHECK(!shows_private_metadata(out), out);
  }
  // The fast path, on the stored bytes as the store returns them.
  const std::string stored = task.to_json();
  rapidjson::StringBuffer fast;
  const bool ok = filter_stored_task_v03(stored, task.id(), fast);
  FUZZ_CHECK(ok == is_stored_task_of(stored, task.id()), stored);
  // The fast path serves exactly the records that are valid A2A Tasks
  // (a2a_task_problem(): contextId, status.state, kind "task" ...); the
  // others are refused, as the parsing path refuses them.
  const bool valid = toolnexus::a2a_task_problem(task).empty();
  FUZZ_CHECK(ok == valid, (ok ? "a record that is no valid A2A Task passed the fast path: "
                              : "a valid stored Task refused by the fast path: ") + stored);
  if (!ok) return;
  const std::string fast_out(fast.GetString(), fast.GetSize());
  FUZZ_CHECK(toolnexus::fuzz::valid_json(fast_out), fast_out);
  FUZZ_CHECK(!shows_private_metadata(fast_out), fast_out);
  const std::string slow = render([&](JsonWriter &w) { write_task(w, doc, Dialect::v0_3, TaskView{}); }, "v0.3");
  FUZZ_CHECK(toolnexus::fuzz::valid_json(slow), slow);
  // Another id never passes.
  const std::string other = std::string(task.id()) + "x";
  rapidjson::StringBuffer none;
  FUZZ_CHECK(!filter_stored_task_v03(stored, other, none), stored);
}

void fuzz_bytes(std::string_view json) {
  // Raw bytes on the fast path: its verdict agrees with the check alone,
  // and what it accepts it writes as valid JSON.
  rapidjson::Document d;
  d.Parse(json.data(), json.size());
  std::string id = "t";
  if (d.IsObject()) {
    auto it = d.FindMember("id");
    if (it != d.MemberEnd() && it->value.IsString()) id.assign(it->value.GetString(), it->value.GetStringLength());
  }
  rapidjson::StringBuffer out;
  const bool ok = filter_stored_task_v03(json, id, out);
  FUZZ_CHECK(ok == is_stored_task_of(json, id), std::string(json));
  if (ok) FUZZ_CHECK(toolnexus::fuzz::valid_json(std::string_view(out.GetString(), out.GetSize())), std::string(json));
}

void fuzz_message(std::string_view json) {
  // What the request parsers let through: valid UTF-8, depth within limits.
  std::size_t at = 0;
  if (json_depth(json, 32, &at) > 32) return;
  rapidjson::Document in;
  Envelope env;
  try {
    std::string body = R"({"jsonrpc":"2.0","id":1,"method":"m","params":{"message":)";
    body.append(json);
    body += "}}";
    parse_envelope(body, 40, in, env);
  } catch (const RpcError &) {
    return;
  }
  const rapidjson::Value &msg = (*env.params)["message"];
  if (!msg.IsObject()) return;
  rapidjson::Document stored;
  rapidjson::Value m;
  try {
    m = message_from_v1(msg, "params.message", stored.GetAllocator());
  } catch (const RpcError &e) {
    FUZZ_CHECK(e.code() == rpc_code::kInvalidParams, std::to_string(e.code()));
    FUZZ_CHECK(e.what()[0] != '\0' && !e.field().empty(), e.what());
    return;
  }
  FUZZ_CHECK(m.IsObject(), "a stored Message that is not an object");
  render([&](JsonWriter &w) { write_message(w, m, Dialect::v1_0); }, "message v1.0");
  render([&](JsonWriter &w) { write_message(w, m, Dialect::v0_3); }, "message v0.3");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, std::size_t size) {
  if (size < 1) return 0;
  TaskView view;
  view.history_length = static_cast<int64_t>(data[0] & 7) - 1;  // -1 (all) .. 6
  view.include_artifacts = (data[0] & 8) == 0;
  const std::string_view json(reinterpret_cast<const char *>(data) + 1, size - 1);
  fuzz_task(json, view);
  fuzz_bytes(json);
  fuzz_message(json);
  return 0;
}

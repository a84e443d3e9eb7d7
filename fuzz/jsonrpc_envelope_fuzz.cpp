// fuzz/jsonrpc_envelope_fuzz.cpp: the JSON-RPC request envelope
// (parse_envelope, server/src/wire/jsonrpc.hpp) and the response that
// echoes its id.
//
// Input: a request body.
//
// Invariants: a refusal is one of the envelope's error codes (-32700,
// -32600, -32602) with a message; an accepted envelope has a string
// method, params absent or an object, and an id that is a string, number or
// null; the response written for it (result and error) is valid JSON whose
// "id" is the id exactly as sent (numbers too: "1e400", "-0", "1.50").
#include "fuzz_check.hpp"
#include "wire/jsonrpc.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

using namespace toolnexus::server_detail;

namespace {

constexpr int kMaxDepth = 32;

// The response `r` holds, checked: valid JSON with an "id" written as
// `id_json` says.
void check_response(std::string_view bytes, const std::string &id_json) {
  FUZZ_CHECK(toolnexus::fuzz::valid_json(bytes), std::string(bytes));
  FUZZ_CHECK(bytes.find("\"id\":" + id_json) != std::string_view::npos, std::string(bytes) + " / " + id_json);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, std::size_t size) {
  const std::string_view body(reinterpret_cast<const char *>(data), size);
  rapidjson::Document doc;
  Envelope env;
  try {
    parse_envelope(body, kMaxDepth, doc, env);
  } catch (const RpcError &e) {
    FUZZ_CHECK(e.code() == rpc_code::kParseError || e.code() == rpc_code::kInvalidRequest ||
                   e.code() == rpc_code::kInvalidParams,
               std::to_string(e.code()));
    FUZZ_CHECK(e.what()[0] != '\0', "an error without a message");
    ResponseWriter w;
    w.error(env.rpc_id(), e.code(), e.what(), e.field());
    FUZZ_CHECK(toolnexus::fuzz::valid_json(w.bytes()), std::string(w.bytes()));
    return 0;
  }
  FUZZ_CHECK(env.id != nullptr && (env.id->IsString() || env.id->IsNumber() || env.id->IsNull()), "bad id accepted");
  FUZZ_CHECK(env.params == nullptr || env.params->IsObject(), "params not an object accepted");
  const std::string id_json = env.id_json();
  FUZZ_CHECK(toolnexus::fuzz::valid_json(id_json), id_json);
  if (env.id->IsNumber()) {
    // The id as sent: the raw text of the top-level "id" member (which
    // raw_id_number reads from bodies RapidJSON parses: not 1e400 ones).
    const std::string raw = raw_id_number(body);
    FUZZ_CHECK(raw.empty() || id_json == raw, id_json + " vs " + raw);
  }
  ResponseWriter w;
  auto &jw = w.begin_result(env.rpc_id());
  jw.StartObject();
  jw.EndObject();
  w.end_result();
  check_response(w.bytes(), id_json);
  w.reset();
  w.error(env.rpc_id(), rpc_code::kInvalidParams, "x");
  check_response(w.bytes(), id_json);
  return 0;
}

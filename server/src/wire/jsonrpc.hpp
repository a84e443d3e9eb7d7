// server/src/wire/jsonrpc.hpp: the JSON-RPC 2.0 envelope (A2A v0.3 section 6.11
// JSON-RPC structures, section 8 error codes): parsing a request body with
// limits (depth scan without recursion, UTF-8 validation), and writing
// responses that echo the request id.
#ifndef TOOLNEXUS_SERVER_JSONRPC_HPP
#define TOOLNEXUS_SERVER_JSONRPC_HPP

#include "wire/dialect.hpp"

#include <rapidjson/document.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace toolnexus::server_detail {

/// JSON-RPC 2.0 and A2A error codes (A2A v0.3 section 8.1/8.2; v1.0 adds
/// -32009).
namespace rpc_code {
inline constexpr int kParseError = -32700;
inline constexpr int kInvalidRequest = -32600;
inline constexpr int kMethodNotFound = -32601;
inline constexpr int kInvalidParams = -32602;
inline constexpr int kInternalError = -32603;
inline constexpr int kTaskNotFound = -32001;
inline constexpr int kTaskNotCancelable = -32002;
inline constexpr int kPushNotificationNotSupported = -32003;
inline constexpr int kUnsupportedOperation = -32004;
inline constexpr int kContentTypeNotSupported = -32005;
inline constexpr int kInvalidAgentResponse = -32006;
inline constexpr int kExtendedCardNotConfigured = -32007;
inline constexpr int kExtensionSupportRequired = -32008;
inline constexpr int kVersionNotSupported = -32009;
/// TaskGenerationMismatchError (A2A 1.1 draft, sections 3.3.2 and 5.4):
/// ifGenerationMatch named another generation than the Task's.
inline constexpr int kTaskGenerationMismatch = -32010;
}  // namespace rpc_code

/// The google.rpc.ErrorInfo reason of an error code (A2A v1.0 section
/// 5.4/9.5: "TASK_NOT_FOUND", ...; "INVALID_PARAMS", "INTERNAL_ERROR", ...
/// for the JSON-RPC codes). Never null.
const char *error_reason(int code) noexcept;

/// The ErrorInfo domain of A2A errors.
inline constexpr const char *kErrorDomain = "a2a-protocol.org";

/// Further facts about an error, as name/value pairs, in order, written
/// beside "field": in ErrorInfo.metadata (v1.0, a map of strings) and in
/// error.data (v0.3). Used by the Task size limits: {"limit":
/// "limits.max_task_bytes", "max": "8388608", "size": "9437312"}.
using ErrorMetadata = std::vector<std::pair<std::string, std::string>>;

/// Writes [ {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason",
/// "domain": "a2a-protocol.org", "metadata"?: {"field": `field`, ...
/// `metadata`}} ], the details v1.0 errors carry (error.data on JSON-RPC,
/// error.details on HTTP+JSON). `metadata` may be null.
void write_error_details(JsonWriter &w, int code, std::string_view field, const ErrorMetadata *metadata = nullptr);

/// A JSON-RPC error to answer with. `field` (may be empty) names the
/// offending request member ("params.message.parts[0].text"); it goes to
/// error.data.field. `metadata` (may be empty) goes beside it.
class RpcError : public std::runtime_error {
 public:
  RpcError(int code, const std::string &message, std::string field = {}, ErrorMetadata metadata = {})
      : std::runtime_error(message), code_(code), message_(message), field_(std::move(field)),
        metadata_(std::move(metadata)) {}
  int code() const noexcept { return code_; }
  /// The whole message: what() is a C string, cut at a NUL that an echoed
  /// client text may hold; this is not.
  const std::string &message() const noexcept { return message_; }
  const std::string &field() const noexcept { return field_; }
  const ErrorMetadata &metadata() const noexcept { return metadata_; }

 private:
  int code_;
  std::string message_;
  std::string field_;
  ErrorMetadata metadata_;
};

/// The deepest nesting of arrays/objects in `json`, scanning linearly
/// without recursion and stopping as soon as it exceeds `limit` (strings and
/// their escapes are skipped). `*offset` receives the byte offset where the
/// limit was passed.
int json_depth(std::string_view json, int limit, std::size_t *offset) noexcept;

/// The id a response echoes (JSON-RPC 2.0 section 5: "It MUST be the same
/// as the value of the id member in the Request Object"). Either a parsed
/// value or the exact JSON text of the id; the text wins when set. A plain
/// value type of borrowed pointers: what it points to must outlive the
/// write.
struct RpcId {
  /// The id as parsed; nullptr writes null.
  const rapidjson::Value *value = nullptr;
  /// The id's JSON text exactly as it is to appear ("18446744073709551616",
  /// "1.50", "-0", "\"abc\"", "null"); when empty, `value` is written.
  std::string_view json;
  RpcId() = default;
  /// The parsed id (nullptr = null). Implicit: every writer taking an RpcId
  /// takes a `const rapidjson::Value *`.
  RpcId(const rapidjson::Value *v) : value(v) {}
  /// An id given as JSON text (e.g. a stream's FrameStyle::rpc_id).
  static RpcId from_json(std::string_view text) {
    RpcId id;
    id.json = text;
    return id;
  }
};

/// A parsed request envelope. Pointers point into the document.
struct Envelope {
  /// The id (string, number or null); nullptr when it could not be read.
  const rapidjson::Value *id = nullptr;
  /// The exact text of a numeric id that would not be written back as the
  /// client sent it from the parsed value: RapidJSON holds numbers that are
  /// not int64/uint64 (2^64 and above, below -2^63, fractions, exponents)
  /// as doubles, and reads -0 as 0. Empty otherwise (then `id` prints
  /// exactly as sent).
  std::string id_text;
  std::string_view method;
  /// params, or nullptr when absent.
  const rapidjson::Value *params = nullptr;
  /// What a response to this request echoes as its id.
  RpcId rpc_id() const {
    RpcId r(id);
    r.json = id_text;
    return r;
  }
  /// The id as JSON text, exactly as the client sent it ("null" when
  /// there is none): what each SSE frame of a stream echoes.
  std::string id_json() const;
};

/// The raw JSON text of the top-level member "id" of the JSON object in
/// `body` when it is a number (re-read with a SAX reader that keeps numbers
/// as text, stopping as soon as the id is read); "" when there is no such
/// member or it is not a number. `body` must be JSON that parsed.
std::string raw_id_number(std::string_view body);

/// Why JSON with a lone surrogate escape at byte `at` is refused (see
/// toolnexus::lone_surrogate_escape): "a \\u escape of a lone surrogate
/// (U+D800..U+DFFF), which is no character, at byte 97".
std::string lone_surrogate_message(std::size_t at);

/// Parses `body` into `doc` and checks the envelope. On failure throws
/// RpcError; `env.id` is set as soon as a valid id was read, so the caller
/// can echo it. Refuses: nesting deeper than `max_depth` (-32600), invalid
/// UTF-8 (-32700), malformed JSON (-32700), a batch or non-object (-32600),
/// no id / a bad id (notifications are not supported: -32600), jsonrpc not
/// "2.0" (-32600), method not a string (-32600), params not an object
/// (-32602), a \u escape of a lone surrogate (-32700).
void parse_envelope(std::string_view body, int max_depth, rapidjson::Document &doc, Envelope &env);

/// Builds one response into a reusable buffer.
/// Not thread-safe; use one per thread (see thread_buffer()).
class ResponseWriter {
 public:
  ResponseWriter() : writer_(buffer_) {}
  /// Clears the buffer for a new response.
  void reset();
  /// Writes {"jsonrpc":"2.0","id":<id>,"result": and leaves the writer
  /// positioned for the result value; finish with end_result().
  rapidjson::Writer<rapidjson::StringBuffer> &begin_result(RpcId id);
  void end_result();
  /// Positions the writer for a bare value (no JSON-RPC envelope: the
  /// HTTP+JSON binding); finish with end_bare().
  rapidjson::Writer<rapidjson::StringBuffer> &begin_bare();
  void end_bare() {}
  /// A complete error response (replacing anything written). v0.3:
  /// error.data = {"field"} when `field` is set; v1.0: error.data =
  /// [ErrorInfo] (see write_error_details).
  void error(RpcId id, int code, std::string_view message, std::string_view field = {},
             Dialect dialect = Dialect::v0_3, const ErrorMetadata *metadata = nullptr);
  /// The response bytes (valid until the next reset()).
  std::string_view bytes() const noexcept { return {buffer_.GetString(), buffer_.GetSize()}; }

 private:
  void write_id(RpcId id);
  rapidjson::StringBuffer buffer_;
  rapidjson::Writer<rapidjson::StringBuffer> writer_;
};

}  // namespace toolnexus::server_detail

#endif  // TOOLNEXUS_SERVER_JSONRPC_HPP

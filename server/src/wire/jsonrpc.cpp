// The JSON-RPC 2.0 envelope: parsing with limits, error responses.
#include "wire/jsonrpc.hpp"

#include "toolnexus/task.hpp"
#include "common/util.hpp"

#include <rapidjson/error/en.h>
#include <rapidjson/memorystream.h>
#include <rapidjson/reader.h>

#include <cstring>

namespace toolnexus::server_detail {

int json_depth(std::string_view json, int limit, std::size_t *offset) noexcept {
  int depth = 0, max_depth = 0;
  bool in_string = false, escaped = false;
  for (std::size_t i = 0; i < json.size(); ++i) {
    const char c = json[i];
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) {
        max_depth = depth;
        if (max_depth > limit) {
          if (offset != nullptr) *offset = i;
          return max_depth;
        }
      }
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return max_depth;
}

namespace {

// SAX handler that stops at the top-level key "id" and records where the
// reader stood then (just after the key).
struct IdKeyFinder : rapidjson::BaseReaderHandler<rapidjson::UTF8<>, IdKeyFinder> {
  const rapidjson::MemoryStream *stream = nullptr;
  int depth = 0;
  std::size_t after_key = std::string_view::npos;
  bool StartObject() {
    ++depth;
    return true;
  }
  bool EndObject(rapidjson::SizeType) {
    --depth;
    return true;
  }
  bool StartArray() {
    ++depth;
    return true;
  }
  bool EndArray(rapidjson::SizeType) {
    --depth;
    return true;
  }
  bool Key(const char *s, rapidjson::SizeType n, bool) {
    if (depth == 1 && n == 2 && s[0] == 'i' && s[1] == 'd') {
      after_key = stream->Tell();
      return false;
    }
    return true;
  }
};

// The byte offset of the first top-level "id" member's value in `body`, or
// npos when the reader does not get that far (a parse error before it).
std::size_t id_value_offset(std::string_view body) {
  IdKeyFinder finder;
  rapidjson::MemoryStream ms(body.data(), body.size());
  finder.stream = &ms;
  rapidjson::Reader reader;
  reader.Parse<rapidjson::kParseNumbersAsStringsFlag | rapidjson::kParseIterativeFlag>(ms, finder);
  std::size_t i = finder.after_key;
  if (i == std::string_view::npos) return i;
  auto skip_ws = [&] {
    while (i < body.size() && (body[i] == ' ' || body[i] == '\t' || body[i] == '\n' || body[i] == '\r')) ++i;
  };
  skip_ws();
  if (i >= body.size() || body[i] != ':') return std::string_view::npos;
  ++i;
  skip_ws();
  return i;
}

}  // namespace

std::string lone_surrogate_message(std::size_t at) {
  return "a \\u escape of a lone surrogate (U+D800..U+DFFF), which is no character, at byte " + std::to_string(at);
}

void parse_envelope(std::string_view body, int max_depth, rapidjson::Document &doc, Envelope &env) {
  env = Envelope{};
  std::string big_id;     // the text of an id beyond a double's range
  std::size_t shift = 0;  // what the error offset lost to the id's replacement
  std::size_t where = 0;
  if (json_depth(body, max_depth, &where) > max_depth) {
    throw RpcError(rpc_code::kInvalidRequest, "request refused: JSON nested deeper than " +
                                                  std::to_string(max_depth) + " levels (at byte " +
                                                  std::to_string(where) + ")");
  }
  constexpr unsigned kFlags = rapidjson::kParseIterativeFlag | rapidjson::kParseValidateEncodingFlag;
  doc.Parse<kFlags>(body.data(), body.size());
  if (doc.HasParseError() && doc.GetParseError() == rapidjson::kParseErrorNumberTooBig) {
    // RapidJSON stops at a double's range (RFC 8259 section 6 leaves the
    // range to implementations). When the number is the top-level id, the
    // request is read with 0 in its place and the id echoed as sent; a
    // number beyond that range anywhere else stays a parse error.
    const std::size_t at = doc.GetErrorOffset();
    if (at != std::string_view::npos && at == id_value_offset(body)) {
      std::size_t end = at;
      while (end < body.size() && std::strchr("+-.0123456789eE", body[end]) != nullptr && body[end] != '\0') ++end;
      std::string copy(body);
      if (end > at) copy.replace(at, end - at, "0");
      doc.Parse<kFlags>(copy.data(), copy.size());
      // Only when the id is what was replaced (a fuzzer found bytes where
      // the offsets of the two readers disagree: nothing was replaced).
      // (MemberEnd() is only for an object: RapidJSON asserts otherwise.)
      bool replaced_id = false;
      if (end > at && !doc.HasParseError() && doc.IsObject()) {
        const auto id = doc.FindMember("id");
        replaced_id = id != doc.MemberEnd() && id->value.IsInt() && id->value.GetInt() == 0;
      }
      if (replaced_id)
        big_id.assign(body.substr(at, end - at));
      else if (!doc.HasParseError())
        doc.Parse<kFlags>(body.data(), body.size());  // back to the client's bytes and their error
      // Else the error is further on: its offset in the client's bytes.
      if (doc.HasParseError() && doc.GetErrorOffset() > at) shift = end - at - 1;
    }
  }
  if (doc.HasParseError()) {
    const auto code = doc.GetParseError();
    const std::string at = " at byte " + std::to_string(doc.GetErrorOffset() + shift);
    if (code == rapidjson::kParseErrorStringInvalidEncoding)
      throw RpcError(rpc_code::kParseError, "parse error: invalid UTF-8 in a string" + at);
    if (code == rapidjson::kParseErrorDocumentEmpty)
      throw RpcError(rpc_code::kParseError, "parse error: the request body is empty");
    throw RpcError(rpc_code::kParseError, std::string("parse error: ") + rapidjson::GetParseError_En(code) + at);
  }
  // RapidJSON takes "\udc00" alone and decodes it into bytes that are not
  // UTF-8 (the Task holding them could not be saved).
  if (const std::size_t bad = lone_surrogate_escape(body); bad != std::string_view::npos)
    throw RpcError(rpc_code::kParseError, "parse error: " + lone_surrogate_message(bad));
  if (doc.IsArray())
    throw RpcError(rpc_code::kInvalidRequest, "batch requests are not supported: send one request object");
  if (!doc.IsObject()) throw RpcError(rpc_code::kInvalidRequest, "a JSON-RPC request must be a JSON object");
  auto id = doc.FindMember("id");
  if (id == doc.MemberEnd())
    throw RpcError(rpc_code::kInvalidRequest, "\"id\" is required (notifications are not supported)", "id");
  if (!id->value.IsString() && !id->value.IsNumber() && !id->value.IsNull())
    throw RpcError(rpc_code::kInvalidRequest, "\"id\" must be a string, a number or null", "id");
  env.id = &id->value;
  // RapidJSON reads a number that is not an int64/uint64 as a double and
  // -0 as 0: such an id is echoed from its text, as the client sent it.
  if (!big_id.empty())
    env.id_text = big_id;
  else if (id->value.IsNumber() &&
           ((!id->value.IsInt64() && !id->value.IsUint64()) || (id->value.IsUint64() && id->value.GetUint64() == 0)))
    env.id_text = raw_id_number(body);
  auto jsonrpc = doc.FindMember("jsonrpc");
  if (jsonrpc == doc.MemberEnd() || !jsonrpc->value.IsString() ||
      std::string_view(jsonrpc->value.GetString(), jsonrpc->value.GetStringLength()) != "2.0")
    throw RpcError(rpc_code::kInvalidRequest, "\"jsonrpc\" must be \"2.0\"", "jsonrpc");
  auto method = doc.FindMember("method");
  if (method == doc.MemberEnd())
    throw RpcError(rpc_code::kInvalidRequest, "\"method\" is required", "method");
  if (!method->value.IsString())
    throw RpcError(rpc_code::kInvalidRequest, "\"method\" must be a string", "method");
  env.method = std::string_view(method->value.GetString(), method->value.GetStringLength());
  auto params = doc.FindMember("params");
  if (params != doc.MemberEnd()) {
    if (!params->value.IsObject() && !params->value.IsNull())
      throw RpcError(rpc_code::kInvalidParams, "invalid params: \"params\" must be an object", "params");
    if (params->value.IsObject()) env.params = &params->value;
  }
}

namespace {

// SAX handler that captures the text of the top-level "id" member when it is
// a number (the reader runs with kParseNumbersAsStringsFlag) and stops the
// reader as soon as the id's value is seen.
struct IdNumberFinder : rapidjson::BaseReaderHandler<rapidjson::UTF8<>, IdNumberFinder> {
  int depth = 0;
  bool at_id = false;  // the next value is the top-level id
  std::string text;

  // Any value that is not a number: when it is the id, stop (not a number).
  bool Default() {
    if (at_id) return false;
    return true;
  }
  bool RawNumber(const char *s, rapidjson::SizeType n, bool) {
    if (at_id) {
      text.assign(s, n);
      return false;
    }
    return true;
  }
  bool StartObject() {
    if (at_id) return false;
    ++depth;
    return true;
  }
  bool EndObject(rapidjson::SizeType) {
    --depth;
    return true;
  }
  bool StartArray() {
    if (at_id) return false;
    ++depth;
    return true;
  }
  bool EndArray(rapidjson::SizeType) {
    --depth;
    return true;
  }
  bool Key(const char *s, rapidjson::SizeType n, bool) {
    // The first top-level "id" only, as Document::FindMember finds it.
    at_id = depth == 1 && n == 2 && s[0] == 'i' && s[1] == 'd';
    return true;
  }
};

}  // namespace

std::string raw_id_number(std::string_view body) {
  IdNumberFinder finder;
  rapidjson::Reader reader;
  rapidjson::MemoryStream ms(body.data(), body.size());
  // The handler ends the parse at the id (kParseErrorTermination): that is
  // the expected outcome, not an error.
  reader.Parse<rapidjson::kParseNumbersAsStringsFlag | rapidjson::kParseIterativeFlag>(ms, finder);
  return std::move(finder.text);
}

std::string Envelope::id_json() const {
  if (!id_text.empty()) return id_text;
  if (id == nullptr) return "null";
  rapidjson::StringBuffer b;
  rapidjson::Writer<rapidjson::StringBuffer> w(b);
  id->Accept(w);
  return std::string(b.GetString(), b.GetSize());
}

void ResponseWriter::reset() {
  // A writer lives per request thread: after a large answer (a Task of
  // megabytes) keeping its buffer would pin that much memory in each of
  // them (128 threads x 8 MiB). Small buffers are kept for reuse.
  const bool large = buffer_.GetSize() > 256 * 1024;
  buffer_.Clear();
  if (large) buffer_.ShrinkToFit();
  writer_.Reset(buffer_);
}

void ResponseWriter::write_id(RpcId id) {
  writer_.Key("id");
  if (!id.json.empty()) writer_.RawValue(id.json.data(), id.json.size(), rapidjson::kNumberType);
  else if (id.value == nullptr) writer_.Null();
  else id.value->Accept(writer_);
}

rapidjson::Writer<rapidjson::StringBuffer> &ResponseWriter::begin_result(RpcId id) {
  writer_.StartObject();
  writer_.Key("jsonrpc");
  writer_.String("2.0");
  write_id(id);
  writer_.Key("result");
  return writer_;
}

void ResponseWriter::end_result() { writer_.EndObject(); }

namespace {

void write_metadata_members(JsonWriter &w, const ErrorMetadata &metadata) {
  for (const auto &[name, value] : metadata) {
    w.Key(name.data(), static_cast<rapidjson::SizeType>(name.size()));
    w.String(value.data(), static_cast<rapidjson::SizeType>(value.size()));
  }
}

}  // namespace

const char *error_reason(int code) noexcept {
  switch (code) {
    case rpc_code::kParseError: return "PARSE_ERROR";
    case rpc_code::kInvalidRequest: return "INVALID_REQUEST";
    case rpc_code::kMethodNotFound: return "METHOD_NOT_FOUND";
    case rpc_code::kInvalidParams: return "INVALID_PARAMS";
    case rpc_code::kTaskNotFound: return "TASK_NOT_FOUND";
    case rpc_code::kTaskNotCancelable: return "TASK_NOT_CANCELABLE";
    case rpc_code::kPushNotificationNotSupported: return "PUSH_NOTIFICATION_NOT_SUPPORTED";
    case rpc_code::kUnsupportedOperation: return "UNSUPPORTED_OPERATION";
    case rpc_code::kContentTypeNotSupported: return "CONTENT_TYPE_NOT_SUPPORTED";
    case rpc_code::kInvalidAgentResponse: return "INVALID_AGENT_RESPONSE";
    case rpc_code::kExtendedCardNotConfigured: return "EXTENDED_AGENT_CARD_NOT_CONFIGURED";
    case rpc_code::kExtensionSupportRequired: return "EXTENSION_SUPPORT_REQUIRED";
    case rpc_code::kVersionNotSupported: return "VERSION_NOT_SUPPORTED";
    case rpc_code::kTaskGenerationMismatch: return "TASK_GENERATION_MISMATCH";
    default: return "INTERNAL_ERROR";
  }
}

void write_error_details(JsonWriter &w, int code, std::string_view field, const ErrorMetadata *metadata) {
  w.StartArray();
  w.StartObject();
  w.Key("@type");
  w.String("type.googleapis.com/google.rpc.ErrorInfo");
  w.Key("reason");
  w.String(error_reason(code));
  w.Key("domain");
  w.String(kErrorDomain);
  const bool more = metadata != nullptr && !metadata->empty();
  if (!field.empty() || more) {
    w.Key("metadata");
    w.StartObject();
    if (!field.empty()) {
      w.Key("field");
      w.String(field.data(), static_cast<rapidjson::SizeType>(field.size()));
    }
    if (more) write_metadata_members(w, *metadata);
    w.EndObject();
  }
  w.EndObject();
  w.EndArray();
}

rapidjson::Writer<rapidjson::StringBuffer> &ResponseWriter::begin_bare() { return writer_; }

void ResponseWriter::error(RpcId id, int code, std::string_view message, std::string_view field, Dialect dialect,
                           const ErrorMetadata *metadata) {
  reset();
  writer_.StartObject();
  writer_.Key("jsonrpc");
  writer_.String("2.0");
  write_id(id);
  writer_.Key("error");
  writer_.StartObject();
  writer_.Key("code");
  writer_.Int(code);
  writer_.Key("message");
  const std::string text = valid_utf8_text(message);  // echoed client bytes stay valid JSON
  writer_.String(text.data(), static_cast<rapidjson::SizeType>(text.size()));
  const bool more = metadata != nullptr && !metadata->empty();
  if (is_v1(dialect)) {
    writer_.Key("data");
    write_error_details(writer_, code, field, metadata);
  } else if (!field.empty() || more) {
    writer_.Key("data");
    writer_.StartObject();
    if (!field.empty()) {
      writer_.Key("field");
      writer_.String(field.data(), static_cast<rapidjson::SizeType>(field.size()));
    }
    if (more) write_metadata_members(writer_, *metadata);
    writer_.EndObject();
  }
  writer_.EndObject();
  writer_.EndObject();
}

}  // namespace toolnexus::server_detail

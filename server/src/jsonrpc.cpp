// The JSON-RPC 2.0 envelope: parsing with limits, error responses.
#include "jsonrpc.hpp"

#include <rapidjson/error/en.h>

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

void parse_envelope(std::string_view body, int max_depth, rapidjson::Document &doc, Envelope &env) {
  env = Envelope{};
  std::size_t where = 0;
  if (json_depth(body, max_depth, &where) > max_depth) {
    throw RpcError(rpc_code::kInvalidRequest, "request refused: JSON nested deeper than " +
                                                  std::to_string(max_depth) + " levels (at byte " +
                                                  std::to_string(where) + ")");
  }
  constexpr unsigned kFlags = rapidjson::kParseIterativeFlag | rapidjson::kParseValidateEncodingFlag;
  doc.Parse<kFlags>(body.data(), body.size());
  if (doc.HasParseError()) {
    const auto code = doc.GetParseError();
    const std::string at = " at byte " + std::to_string(doc.GetErrorOffset());
    if (code == rapidjson::kParseErrorStringInvalidEncoding)
      throw RpcError(rpc_code::kParseError, "parse error: invalid UTF-8 in a string" + at);
    if (code == rapidjson::kParseErrorDocumentEmpty)
      throw RpcError(rpc_code::kParseError, "parse error: the request body is empty");
    throw RpcError(rpc_code::kParseError, std::string("parse error: ") + rapidjson::GetParseError_En(code) + at);
  }
  if (doc.IsArray())
    throw RpcError(rpc_code::kInvalidRequest, "batch requests are not supported: send one request object");
  if (!doc.IsObject()) throw RpcError(rpc_code::kInvalidRequest, "a JSON-RPC request must be a JSON object");
  auto id = doc.FindMember("id");
  if (id == doc.MemberEnd())
    throw RpcError(rpc_code::kInvalidRequest, "\"id\" is required (notifications are not supported)", "id");
  if (!id->value.IsString() && !id->value.IsNumber() && !id->value.IsNull())
    throw RpcError(rpc_code::kInvalidRequest, "\"id\" must be a string, a number or null", "id");
  env.id = &id->value;
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

void ResponseWriter::reset() {
  buffer_.Clear();
  writer_.Reset(buffer_);
}

void ResponseWriter::write_id(const rapidjson::Value *id) {
  writer_.Key("id");
  if (id == nullptr) writer_.Null();
  else id->Accept(writer_);
}

rapidjson::Writer<rapidjson::StringBuffer> &ResponseWriter::begin_result(const rapidjson::Value *id) {
  writer_.StartObject();
  writer_.Key("jsonrpc");
  writer_.String("2.0");
  write_id(id);
  writer_.Key("result");
  return writer_;
}

void ResponseWriter::end_result() { writer_.EndObject(); }

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
    default: return "INTERNAL_ERROR";
  }
}

void write_error_details(JsonWriter &w, int code, std::string_view field) {
  w.StartArray();
  w.StartObject();
  w.Key("@type");
  w.String("type.googleapis.com/google.rpc.ErrorInfo");
  w.Key("reason");
  w.String(error_reason(code));
  w.Key("domain");
  w.String(kErrorDomain);
  if (!field.empty()) {
    w.Key("metadata");
    w.StartObject();
    w.Key("field");
    w.String(field.data(), static_cast<rapidjson::SizeType>(field.size()));
    w.EndObject();
  }
  w.EndObject();
  w.EndArray();
}

rapidjson::Writer<rapidjson::StringBuffer> &ResponseWriter::begin_bare() { return writer_; }

void ResponseWriter::error(const rapidjson::Value *id, int code, std::string_view message, std::string_view field,
                           Dialect dialect) {
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
  writer_.String(message.data(), static_cast<rapidjson::SizeType>(message.size()));
  if (dialect == Dialect::v1_0) {
    writer_.Key("data");
    write_error_details(writer_, code, field);
  } else if (!field.empty()) {
    writer_.Key("data");
    writer_.StartObject();
    writer_.Key("field");
    writer_.String(field.data(), static_cast<rapidjson::SizeType>(field.size()));
    writer_.EndObject();
  }
  writer_.EndObject();
  writer_.EndObject();
}

}  // namespace toolnexus::server_detail

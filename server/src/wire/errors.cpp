// Failures as the HTTP+JSON binding reports them (see errors.hpp).
#include "wire/errors.hpp"

#include "common/util.hpp"

#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

namespace toolnexus::server_detail {

// The status names are the gRPC column of the A2A error mapping (v1.0
// section 5.4), the names a gRPC client of the same server sees; the HTTP
// status is the same table's HTTP column.
std::pair<int, const char *> rest_status_for(int code) noexcept {
  switch (code) {
    case rpc_code::kTaskNotFound: return {404, "NOT_FOUND"};
    case rpc_code::kTaskNotCancelable: return {409, "FAILED_PRECONDITION"};
    case rpc_code::kTaskGenerationMismatch: return {409, "ABORTED"};
    case rpc_code::kPushNotificationNotSupported:
    case rpc_code::kUnsupportedOperation: return {400, "UNIMPLEMENTED"};
    case rpc_code::kContentTypeNotSupported: return {415, "INVALID_ARGUMENT"};
    case rpc_code::kInvalidAgentResponse: return {502, "INTERNAL"};
    case rpc_code::kExtendedCardNotConfigured:
    case rpc_code::kExtensionSupportRequired:
    case rpc_code::kVersionNotSupported: return {400, "FAILED_PRECONDITION"};
    case rpc_code::kParseError:
    case rpc_code::kInvalidRequest:
    case rpc_code::kInvalidParams: return {400, "INVALID_ARGUMENT"};
    case rpc_code::kMethodNotFound: return {404, "NOT_FOUND"};
    default: return {500, "INTERNAL"};
  }
}

int write_rest_error(const Failure &f, std::string &body) {
  const auto [status, name] = f.unavailable ? std::pair<int, const char *>{503, "UNAVAILABLE"} : rest_status_for(f.code);
  std::string_view field = f.field;
  std::string message = valid_utf8_text(f.message);  // echoed client bytes stay valid JSON
  if (field.substr(0, 7) == "params.") {
    field.remove_prefix(7);
    // "invalid params: params.x ..." reads "invalid request: x ..." here.
    const std::string prefix = "invalid params: params.";
    if (message.compare(0, prefix.size(), prefix) == 0) message = "invalid request: " + message.substr(prefix.size());
  }
  rapidjson::StringBuffer buf;
  JsonWriter w(buf);
  w.StartObject();
  w.Key("error");
  w.StartObject();
  w.Key("code");
  w.Int(status);
  w.Key("status");
  w.String(name);
  w.Key("message");
  w.String(message.data(), static_cast<rapidjson::SizeType>(message.size()));
  w.Key("details");
  write_error_details(w, f.code, field, &f.metadata);
  w.EndObject();
  w.EndObject();
  body.assign(buf.GetString(), buf.GetSize());
  return status;
}

}  // namespace toolnexus::server_detail

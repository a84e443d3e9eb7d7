// server/src/wire/errors.hpp: a failed request as both bindings report it,
// and its HTTP+JSON error body (A2A v1.0 section 11.6). The JSON-RPC error
// codes and error objects are in jsonrpc.hpp.
#ifndef TOOLNEXUS_SERVER_WIRE_ERRORS_HPP
#define TOOLNEXUS_SERVER_WIRE_ERRORS_HPP

#include "wire/jsonrpc.hpp"

#include <string>
#include <utility>

namespace toolnexus::server_detail {

/// Why a request failed, as both bindings report it: the A2A / JSON-RPC
/// error code, the client-facing message, and the offending request member
/// ("params.message.parts[0].text"; may be empty).
struct Failure {
  Failure() = default;
  Failure(int c, std::string m, std::string f = {}, ErrorMetadata md = {})
      : code(c), message(std::move(m)), field(std::move(f)), metadata(std::move(md)) {}
  int code = rpc_code::kInternalError;
  std::string message;
  std::string field;
  /// Further facts (a limit's name, bound and the size met); may be empty.
  ErrorMetadata metadata;
  /// A transient refusal (server busy, stopping, too many streams): the
  /// HTTP+JSON binding answers 503 UNAVAILABLE (google.rpc.Code 14, the
  /// spec's section 11.6 mapping) instead of the code's 500 INTERNAL.
  bool unavailable = false;
};

/// HTTP status and google.rpc status name for an A2A error code in the
/// HTTP+JSON binding (v1.0 section 11.6), both from the error mapping of
/// section 5.4 (its HTTP and gRPC columns; the A2A error itself is
/// ErrorInfo.reason): TaskNotFound 404 NOT_FOUND, TaskNotCancelable 409
/// FAILED_PRECONDITION, TaskGenerationMismatch (A2A 1.1 draft) 409
/// ABORTED, PushNotificationNotSupported and
/// UnsupportedOperation 400 UNIMPLEMENTED, ExtendedAgentCardNotConfigured,
/// ExtensionSupportRequired and VersionNotSupported 400
/// FAILED_PRECONDITION, ContentTypeNotSupported 415 INVALID_ARGUMENT,
/// InvalidAgentResponse 502 INTERNAL, malformed requests 400
/// INVALID_ARGUMENT, internal errors 500 INTERNAL. (The gRPC names do not
/// always match google/rpc/code.proto's HTTP mapping, e.g. 409 with
/// FAILED_PRECONDITION; the spec's table is followed.)
std::pair<int, const char *> rest_status_for(int code) noexcept;

/// The error body for `f` (its "params." field prefix dropped: REST has no
/// params object). Returns the HTTP status to send it with: the code's
/// (rest_status_for), or 503 UNAVAILABLE when `f.unavailable`.
int write_rest_error(const Failure &f, std::string &body);

}  // namespace toolnexus::server_detail

#endif  // TOOLNEXUS_SERVER_WIRE_ERRORS_HPP

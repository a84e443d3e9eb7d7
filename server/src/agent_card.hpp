// server/src/agent_card.hpp: the Agent Card (A2A v0.3 section 5.5, v1.0
// section 8.4), served
// at /.well-known/agent-card.json and /.well-known/agent.json.
#ifndef TOOLNEXUS_SERVER_AGENT_CARD_HPP
#define TOOLNEXUS_SERVER_AGENT_CARD_HPP

#include "toolnexus/server.hpp"

#include <string>
#include <string_view>
#include <vector>

namespace toolnexus::server_detail {

/// What the card says besides its url.
struct CardConfig {
  AgentCardOptions options;
  std::vector<AgentSkill> skills;
  /// Declares the "bearer" HTTP security scheme and requires it.
  bool bearer_auth = false;
  /// capabilities.pushNotifications.
  bool push_notifications = false;
};

/// The card as JSON, readable by v1.0 and v0.3 clients alike: name,
/// description, supportedInterfaces (v1.0 section 8.4: JSONRPC 1.0 at `url`,
/// HTTP+JSON 1.0 at `url` without its trailing "/", JSONRPC 0.3 at `url`),
/// the v0.3 fields protocolVersion "0.3.0", url, preferredTransport
/// "JSONRPC", additionalInterfaces; provider (only when configured),
/// version, documentationUrl (when set), capabilities {streaming: true,
/// pushNotifications (as configured), extendedAgentCard: false,
/// stateTransitionHistory: false}, securitySchemes with both versions'
/// shapes and security (v0.3) / securityRequirements (v1.0) when
/// bearer_auth, defaultInputModes and defaultOutputModes ["text/plain"],
/// skills, supportsAuthenticatedExtendedCard: false.
std::string agent_card_json(const CardConfig &config, std::string_view url);

/// The JSON-RPC endpoint URL as the client reached it: scheme from
/// Forwarded proto= / X-Forwarded-Proto (http or https; default http), host
/// from Forwarded host= / X-Forwarded-Host / Host; a host with characters
/// outside [A-Za-z0-9.-_:[]] is ignored; `fallback` ("HOST:PORT") when none
/// is usable. Always ends in "/".
std::string reached_url(std::string_view forwarded, std::string_view x_forwarded_proto,
                        std::string_view x_forwarded_host, std::string_view host, std::string_view fallback);

}  // namespace toolnexus::server_detail

#endif  // TOOLNEXUS_SERVER_AGENT_CARD_HPP

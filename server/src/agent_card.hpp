// server/src/agent_card.hpp: the Agent Card (A2A v0.3 section 5.5), served
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
};

/// The card as JSON: protocolVersion "0.3.0", name, description, url,
/// preferredTransport "JSONRPC", provider (only when configured), version,
/// documentationUrl (when set), capabilities {streaming: false,
/// pushNotifications: false, stateTransitionHistory: false},
/// securitySchemes/security (when bearer_auth), defaultInputModes and
/// defaultOutputModes ["text/plain"], skills,
/// supportsAuthenticatedExtendedCard: false.
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

// cli/retention_config.hpp: the "retention" section of the config file,
// shared by `toolnexus serve` and `toolnexus store gc`:
//   "retention": {"completed": "30d", "failed": "90d", "canceled": "7d",
//                 "rejected": "7d",
//                 "input-required": {"after": "2h", "to": "canceled"},
//                 "auth-required": "1h"}
// (a waiting state's plain duration expires to canceled).
#ifndef TOOLNEXUS_CLI_RETENTION_CONFIG_HPP
#define TOOLNEXUS_CLI_RETENTION_CONFIG_HPP

#include "toolnexus/retention.hpp"

#include <rapidjson/document.h>

#include <string>

namespace toolnexus::cli {

/// Adds the rules of the section `v` (the value of "retention" in `file`)
/// to `r`. Throws std::invalid_argument naming the file, the key
/// ("retention.completed", "retention.input-required.to") and the bad
/// value.
void parse_retention_section(const rapidjson::Value &v, const std::string &file, RetentionOptions &r);

/// The config file `file` (serve's --config), read for its "retention"
/// section (absent: no rule) and its a2a.store selector ("" when absent),
/// for `store gc --config`. Throws std::invalid_argument naming the file
/// (unreadable, not JSON, a bad rule).
RetentionOptions read_retention_config(const std::string &file, std::string *store_selector);

}  // namespace toolnexus::cli

#endif  // TOOLNEXUS_CLI_RETENTION_CONFIG_HPP

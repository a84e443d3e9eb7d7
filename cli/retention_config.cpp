// cli/retention_config.cpp: see retention_config.hpp.
#include "retention_config.hpp"

#include <rapidjson/error/en.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace toolnexus::cli {

void parse_retention_section(const rapidjson::Value &v, const std::string &file, RetentionOptions &r) {
  if (!v.IsObject())
    throw std::invalid_argument(file + ": retention must be an object of state -> duration (\"completed\": \"30d\")");
  for (auto it = v.MemberBegin(); it != v.MemberEnd(); ++it) {
    const std::string state(it->name.GetString(), it->name.GetStringLength());
    const std::string where = file + ": retention." + state;
    const rapidjson::Value &rule = it->value;
    if (rule.IsString()) {
      add_retention_rule(r, state, std::string_view(rule.GetString(), rule.GetStringLength()), {}, where);
      continue;
    }
    if (!rule.IsObject() || (state != "input-required" && state != "auth-required"))
      throw std::invalid_argument(where + " must be a duration string (\"30d\")" +
                                  std::string(state == "input-required" || state == "auth-required"
                                                  ? " or {\"after\": \"2h\", \"to\": \"canceled\"}"
                                                  : ""));
    std::string after, to;
    for (auto m = rule.MemberBegin(); m != rule.MemberEnd(); ++m) {
      const std::string key(m->name.GetString(), m->name.GetStringLength());
      if ((key != "after" && key != "to") || !m->value.IsString())
        throw std::invalid_argument(where + "." + key +
                                    (key == "after" || key == "to" ? " must be a string" : " is not a key (after, to)"));
      (key == "after" ? after : to).assign(m->value.GetString(), m->value.GetStringLength());
    }
    if (after.empty()) throw std::invalid_argument(where + ".after is missing (how long it may wait: \"2h\")");
    if (to.empty()) to = "canceled";
    add_retention_rule(r, state, after, to, where + (to == "canceled" || to == "failed" ? ".after" : ".to"));
  }
}

RetentionOptions read_retention_config(const std::string &file, std::string *store_selector) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw std::invalid_argument("cannot read the config file " + file + ": " + std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  rapidjson::Document doc;
  doc.Parse(text.data(), text.size());
  if (doc.HasParseError())
    throw std::invalid_argument("the config file " + file + " is not valid JSON: " +
                                rapidjson::GetParseError_En(doc.GetParseError()) + " at byte " +
                                std::to_string(doc.GetErrorOffset()));
  if (!doc.IsObject()) throw std::invalid_argument("the config file " + file + " must hold a JSON object");
  RetentionOptions r;
  if (auto it = doc.FindMember("retention"); it != doc.MemberEnd() && !it->value.IsNull())
    parse_retention_section(it->value, file, r);
  if (store_selector != nullptr) {
    store_selector->clear();
    if (auto a2a = doc.FindMember("a2a"); a2a != doc.MemberEnd() && a2a->value.IsObject())
      if (auto s = a2a->value.FindMember("store"); s != a2a->value.MemberEnd() && s->value.IsString())
        store_selector->assign(s->value.GetString(), s->value.GetStringLength());
  }
  return r;
}

}  // namespace toolnexus::cli

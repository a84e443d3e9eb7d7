// The "auth.jwt" config object (toolnexus/jwt_options.hpp).
#include "toolnexus/jwt_options.hpp"

#include "common/util.hpp"
#include "wire/web_origin.hpp"

#include <algorithm>
#include <cstdint>
#include <stdexcept>

namespace toolnexus {
namespace {

std::string text(const rapidjson::Value &v) { return std::string(v.GetString(), v.GetStringLength()); }

std::string string_member(const rapidjson::Value &s, const char *key, const std::string &where) {
  auto it = s.FindMember(key);
  if (it == s.MemberEnd() || it->value.IsNull()) return {};
  if (!it->value.IsString() || it->value.GetStringLength() == 0)
    throw std::invalid_argument(where + "." + key + " must be a non-empty string");
  return text(it->value);
}

void int_member(const rapidjson::Value &s, const char *key, const std::string &where, int64_t min, int64_t max,
                int &into) {
  auto it = s.FindMember(key);
  if (it == s.MemberEnd() || it->value.IsNull()) return;
  if (!it->value.IsInt64() || it->value.GetInt64() < min || it->value.GetInt64() > max)
    throw std::invalid_argument(where + "." + key + " must be an integer between " + std::to_string(min) + " and " +
                                std::to_string(max));
  into = static_cast<int>(it->value.GetInt64());
}

std::vector<std::string> strings_member(const rapidjson::Value &s, const char *key, const std::string &where,
                                        bool single_allowed, bool &present) {
  std::vector<std::string> out;
  auto it = s.FindMember(key);
  present = it != s.MemberEnd() && !it->value.IsNull();
  if (!present) return out;
  const std::string bad = where + "." + key + " must be " + (single_allowed ? "a non-empty string or " : "") +
                          "an array of non-empty strings";
  if (single_allowed && it->value.IsString()) {
    if (it->value.GetStringLength() == 0) throw std::invalid_argument(bad);
    out.push_back(text(it->value));
    return out;
  }
  if (!it->value.IsArray()) throw std::invalid_argument(bad);
  for (const auto &e : it->value.GetArray()) {
    if (!e.IsString() || e.GetStringLength() == 0) throw std::invalid_argument(bad);
    out.push_back(text(e));
  }
  return out;
}

}  // namespace

void check_jwt_options(const JwtOptions &o, const std::string &where) {
  if (o.issuer.empty()) throw std::invalid_argument(where + ".issuer is required (the \"iss\" tokens must name)");
  if (o.audience.empty())
    throw std::invalid_argument(where + ".audience is required (a string or an array: the \"aud\" accepted)");
  for (const std::string &a : o.audience)
    if (a.empty()) throw std::invalid_argument(where + ".audience must not hold an empty string");
  if (o.jwks_file.empty() == o.jwks_url.empty())
    throw std::invalid_argument(where + ": set exactly one of jwks_file and jwks_url (where the keys come from)");
  const auto url = [&](const char *name, const std::string &value) {
    std::string normalized;
    if (value.empty()) return;
    if (std::string why = server_detail::parse_http_url(value, normalized); !why.empty())
      throw std::invalid_argument(where + "." + name + " " + server_detail::in_quotes(value) + ": " + why);
  };
  url("jwks_url", o.jwks_url);
  url("openid_configuration_url", o.openid_configuration_url);
  if (o.principal_claim.empty()) throw std::invalid_argument(where + ".principal_claim must not be empty");
  if (o.algorithms.empty())
    throw std::invalid_argument(where + ".algorithms must name at least one of RS256, ES256, HS256");
  for (const std::string &a : o.algorithms)
    if (a != "RS256" && a != "ES256" && a != "HS256")
      throw std::invalid_argument(where + ".algorithms: '" + a +
                                  "' is not supported (RS256, ES256 and HS256 are; \"none\" never is)");
  const auto range = [&](const char *name, int v, int min, int max) {
    if (v < min || v > max)
      throw std::invalid_argument(where + "." + name + " must be an integer between " + std::to_string(min) +
                                  " and " + std::to_string(max));
  };
  range("clock_skew_s", o.clock_skew_s, 0, 600);
  range("jwks_refresh_min_s", o.jwks_refresh_min_s, 1, 86400);
  range("jwks_max_age_s", o.jwks_max_age_s, 60, 604800);
  range("jwks_timeout_ms", o.jwks_timeout_ms, 1, 60000);
}

void normalize_jwt_urls(JwtOptions &o) {
  for (std::string *u : {&o.jwks_url, &o.openid_configuration_url}) {
    std::string normalized;
    if (!u->empty() && server_detail::parse_http_url(*u, normalized).empty()) *u = std::move(normalized);
  }
}

JwtOptions parse_jwt_options(const rapidjson::Value &s, const std::string &where) {
  if (!s.IsObject()) throw std::invalid_argument(where + " must be an object");
  static const char *const known[] = {"issuer",        "audience",        "jwks_file",     "jwks_url",
                                      "principal_claim", "tenant_claim",  "clock_skew_s",  "algorithms",
                                      "jwks_refresh_min_s", "jwks_max_age_s", "jwks_timeout_ms",
                                      "openid_configuration_url"};
  for (auto it = s.MemberBegin(); it != s.MemberEnd(); ++it) {
    const std::string key = text(it->name);
    if (std::none_of(std::begin(known), std::end(known), [&](const char *k) { return key == k; }))
      throw std::invalid_argument(where + "." + key +
                                  " is not a known key (see docs/configuration.md, \"JWT bearer tokens\")");
  }
  JwtOptions o;
  o.issuer = string_member(s, "issuer", where);
  bool present = false;
  o.audience = strings_member(s, "audience", where, true, present);
  o.jwks_file = string_member(s, "jwks_file", where);
  o.jwks_url = string_member(s, "jwks_url", where);
  if (auto v = string_member(s, "principal_claim", where); !v.empty()) o.principal_claim = v;
  o.tenant_claim = string_member(s, "tenant_claim", where);
  int_member(s, "clock_skew_s", where, 0, 600, o.clock_skew_s);
  auto algs = strings_member(s, "algorithms", where, false, present);
  if (present) o.algorithms = std::move(algs);
  int_member(s, "jwks_refresh_min_s", where, 1, 86400, o.jwks_refresh_min_s);
  int_member(s, "jwks_max_age_s", where, 60, 604800, o.jwks_max_age_s);
  int_member(s, "jwks_timeout_ms", where, 1, 60000, o.jwks_timeout_ms);
  o.openid_configuration_url = string_member(s, "openid_configuration_url", where);
  check_jwt_options(o, where);
  normalize_jwt_urls(o);
  return o;
}

}  // namespace toolnexus

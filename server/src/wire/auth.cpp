// Bearer-token authentication and the token file.
#include "wire/auth.hpp"

#include "toolnexus/server.hpp"

#include <Poco/SHA2Engine.h>
#include <rapidjson/document.h>
#include <rapidjson/error/en.h>

#include <fstream>
#include <sstream>
#include <stdexcept>

namespace toolnexus {

namespace server_detail {
namespace {

std::array<uint8_t, 32> sha256(std::string_view s) {
  Poco::SHA2Engine engine(Poco::SHA2Engine::SHA_256);
  engine.update(s.data(), static_cast<unsigned>(s.size()));
  const Poco::DigestEngine::Digest &d = engine.digest();
  std::array<uint8_t, 32> out{};
  for (std::size_t i = 0; i < out.size() && i < d.size(); ++i) out[i] = d[i];
  return out;
}

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const auto x = static_cast<unsigned char>(a[i]), y = static_cast<unsigned char>(b[i]);
    if ((x | 0x20) != (y | 0x20)) return false;
  }
  return true;
}

}  // namespace

TokenAuth::TokenAuth(const std::map<std::string, std::string> &tokens) {
  for (const auto &[token, principal] : tokens) entries_.push_back(Entry{sha256(token), principal});
}

std::optional<std::string_view> bearer_credential(std::string_view authorization) {
  while (!authorization.empty() && authorization.front() == ' ') authorization.remove_prefix(1);
  const auto space = authorization.find(' ');
  if (space == std::string_view::npos || !iequals(authorization.substr(0, space), "bearer")) return std::nullopt;
  std::string_view token = authorization.substr(space + 1);
  while (!token.empty() && token.front() == ' ') token.remove_prefix(1);
  while (!token.empty() && token.back() == ' ') token.remove_suffix(1);
  if (token.empty()) return std::nullopt;
  return token;
}

std::optional<std::string> TokenAuth::authenticate(std::string_view authorization) const {
  const std::optional<std::string_view> token = bearer_credential(authorization);
  if (!token) return std::nullopt;
  const auto digest = sha256(*token);
  const Entry *match = nullptr;
  for (const Entry &e : entries_) {
    // Constant time: every byte of every entry is looked at.
    unsigned diff = 0;
    for (std::size_t i = 0; i < digest.size(); ++i) diff |= static_cast<unsigned>(e.digest[i] ^ digest[i]);
    const bool same = diff == 0;
    if (same && match == nullptr) match = &e;
  }
  if (match == nullptr) return std::nullopt;
  return match->principal;
}

}  // namespace server_detail

std::map<std::string, std::string> load_auth_tokens(const std::filesystem::path &file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read the token file " + file.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  rapidjson::Document doc;
  doc.Parse<rapidjson::kParseValidateEncodingFlag | rapidjson::kParseIterativeFlag>(text.data(), text.size());
  if (doc.HasParseError())
    throw std::runtime_error("the token file " + file.string() + " is not valid JSON: " +
                             rapidjson::GetParseError_En(doc.GetParseError()) + " at byte " +
                             std::to_string(doc.GetErrorOffset()));
  if (!doc.IsObject())
    throw std::runtime_error("the token file " + file.string() +
                             " must be a JSON object mapping tokens to principal names");
  std::map<std::string, std::string> out;
  std::size_t n = 0;
  for (auto it = doc.MemberBegin(); it != doc.MemberEnd(); ++it, ++n) {
    const std::string where = "entry " + std::to_string(n + 1) + " of the token file " + file.string();
    if (it->name.GetStringLength() == 0) throw std::runtime_error(where + " has an empty token");
    if (!it->value.IsString() || it->value.GetStringLength() == 0)
      throw std::runtime_error(where + " must map its token to a non-empty principal name");
    out.emplace(std::string(it->name.GetString(), it->name.GetStringLength()),
                std::string(it->value.GetString(), it->value.GetStringLength()));
  }
  if (out.empty()) throw std::runtime_error("the token file " + file.string() + " lists no tokens");
  return out;
}

}  // namespace toolnexus

// plugins/file/names.cpp: Task id <-> file stem (see names.hpp and the
// layout comment of file_plugin.cpp).
#include "names.hpp"

#include "basics.hpp"

namespace toolnexus::file_plugin {
namespace {

bool plain_byte(unsigned char c) noexcept {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '-';
}

bool all_plain(std::string_view s) noexcept {
  for (char c : s)
    if (!plain_byte(static_cast<unsigned char>(c))) return false;
  return true;
}

}  // namespace

std::string stem_for(std::string_view id) {
  if (id.size() <= kMaxStem && all_plain(id)) return std::string(id);
  static const char *hex = "0123456789ABCDEF";
  std::string enc = "~";
  for (char ch : id) {
    if (enc.size() > kMaxStem) break;
    const auto c = static_cast<unsigned char>(ch);
    if (plain_byte(c)) {
      enc.push_back(ch);
    } else {
      enc.push_back('%');
      enc.push_back(hex[c >> 4]);
      enc.push_back(hex[c & 15]);
    }
  }
  if (enc.size() <= kMaxStem) return enc;
  return std::string(kHashPrefix) + sha256_hex(id);
}

int hex_value(char h, bool upper) noexcept {
  if (h >= '0' && h <= '9') return h - '0';
  if (upper && h >= 'A' && h <= 'F') return h - 'A' + 10;
  if (!upper && h >= 'a' && h <= 'f') return h - 'a' + 10;
  return -1;
}

std::optional<StemInfo> classify(std::string_view stem) {
  if (stem.empty() || stem.size() > kMaxStem) return std::nullopt;
  if (all_plain(stem)) return StemInfo{StemKind::plain, std::string(stem)};
  if (stem.size() == kHashPrefix.size() + 64 && starts_with(stem, kHashPrefix)) {
    for (size_t i = kHashPrefix.size(); i < stem.size(); ++i)
      if (hex_value(stem[i], false) < 0) return std::nullopt;
    return StemInfo{StemKind::hashed, std::string()};
  }
  if (stem[0] != '~') return std::nullopt;
  std::string id;
  for (size_t i = 1; i < stem.size();) {
    const auto c = static_cast<unsigned char>(stem[i]);
    if (plain_byte(c)) {
      id.push_back(stem[i]);
      ++i;
    } else if (c == '%' && i + 2 < stem.size() && hex_value(stem[i + 1], true) >= 0 &&
               hex_value(stem[i + 2], true) >= 0) {
      id.push_back(static_cast<char>(hex_value(stem[i + 1], true) * 16 + hex_value(stem[i + 2], true)));
      i += 3;
    } else {
      return std::nullopt;
    }
  }
  if (id.empty() || stem_for(id) != stem) return std::nullopt;
  return StemInfo{StemKind::escaped, std::move(id)};
}

bool is_temp_name(std::string_view n) noexcept {
  if (!starts_with(n, kTempPrefix) || !ends_with(n, kTempSuffix)) return false;
  std::string_view mid = n.substr(kTempPrefix.size(), n.size() - kTempPrefix.size() - kTempSuffix.size());
  const size_t dash = mid.find('-');
  if (dash == std::string_view::npos || dash == 0 || dash + 1 == mid.size()) return false;
  for (size_t i = 0; i < mid.size(); ++i)
    if (i != dash && (mid[i] < '0' || mid[i] > '9')) return false;
  return true;
}

}  // namespace toolnexus::file_plugin

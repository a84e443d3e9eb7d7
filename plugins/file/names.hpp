// plugins/file/names.hpp: the names of files in file:<dir>: Task id <->
// file stem (the rules are in the layout comment of file_plugin.cpp), the
// extensions of Task files and sidecars, and the temporary files of saves.
//
// Pure functions of their arguments: thread-safe, no I/O.
#ifndef TOOLNEXUS_FILE_NAMES_HPP
#define TOOLNEXUS_FILE_NAMES_HPP

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace toolnexus::file_plugin {

/// Longest stem: NAME_MAX (255) minus ".json".
inline constexpr size_t kMaxStem = 250;
/// Extension of a Task file (<stem>.json).
inline constexpr std::string_view kJsonExt = ".json";
/// Extension of an owner/tenant sidecar (<stem>.meta).
inline constexpr std::string_view kMetaExt = ".meta";
/// Prefix of the stem of an id too long to escape ("~sha256-<64 hex>").
inline constexpr std::string_view kHashPrefix = "~sha256-";
/// Temporary files of saves are named kTempPrefix + "<pid>-<n>" + kTempSuffix.
inline constexpr std::string_view kTempPrefix = ".tnx-";
/// See kTempPrefix.
inline constexpr std::string_view kTempSuffix = ".tmp";

/// The stem ("<stem>.json") of the Task `id` (non-empty): the id itself,
/// "~" + the %XX-escaped id, or "~sha256-" + its hash (layout comment).
std::string stem_for(std::string_view id);

/// The three forms of a stem (see stem_for).
enum class StemKind { plain, escaped, hashed };

/// What a stem found on disk stands for. `id` is empty for hashed stems (the
/// id is then only known from the file).
struct StemInfo {
  StemKind kind;
  std::string id;
};

/// The value of hex digit `h` (upper-case digits when `upper`, else
/// lower-case), or -1 when it is not one.
int hex_value(char h, bool upper) noexcept;

/// Classifies a stem; nullopt when it is not a canonical task file stem
/// (decoding and re-encoding it does not give it back).
std::optional<StemInfo> classify(std::string_view stem);

/// True when `n` is the name of a save's temporary file (.tnx-<pid>-<n>.tmp).
bool is_temp_name(std::string_view n) noexcept;

}  // namespace toolnexus::file_plugin

#endif  // TOOLNEXUS_FILE_NAMES_HPP

// fuzz/fuzz_check.hpp: the invariant check the fuzz targets share.
#ifndef TOOLNEXUS_FUZZ_CHECK_HPP
#define TOOLNEXUS_FUZZ_CHECK_HPP

#include <rapidjson/document.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

/// Aborts (libFuzzer then saves the input as a crash) when `cond` is false,
/// printing the invariant and `what` (a short context string).
#define FUZZ_CHECK(cond, what)                                                              \
  do {                                                                                      \
    if (!(cond)) {                                                                          \
      std::fprintf(stderr, "%s:%d: invariant broken: %s (%s)\n", __FILE__, __LINE__, #cond, \
                   std::string(what).c_str());                                              \
      std::abort();                                                                         \
    }                                                                                       \
  } while (0)

namespace toolnexus::fuzz {

/// True when `json` is one well-formed, UTF-8-valid JSON text. Numbers of
/// any size are JSON (RFC 8259 section 6): where RapidJSON stops at a
/// double's range (1e400), the number is read as 0 and the text re-checked.
inline bool valid_json(std::string_view json) {
  std::string text(json);
  for (;;) {
    rapidjson::Document d;
    d.Parse<rapidjson::kParseValidateEncodingFlag>(text.data(), text.size());
    if (!d.HasParseError()) return true;
    if (d.GetParseError() != rapidjson::kParseErrorNumberTooBig) return false;
    const std::size_t at = d.GetErrorOffset();
    std::size_t end = at;
    while (end < text.size() && std::string_view("+-.0123456789eE").find(text[end]) != std::string_view::npos) ++end;
    if (end == at) return false;
    text.replace(at, end - at, "0");
  }
}

}  // namespace toolnexus::fuzz

#endif  // TOOLNEXUS_FUZZ_CHECK_HPP

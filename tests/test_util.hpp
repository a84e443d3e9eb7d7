// tests/test_util.hpp: small file helpers shared by the doctest programs.
// Header-only; include after <doctest/doctest.h> (REQUIRE is used).
#ifndef TOOLNEXUS_TESTS_TEST_UTIL_HPP
#define TOOLNEXUS_TESTS_TEST_UTIL_HPP

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace tnx_test {

/// A new empty directory under the temp dir, named "<prefix>-XXXXXX". The
/// caller removes it.
inline std::filesystem::path temp_dir(const std::string &prefix) {
  std::string pattern = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
  REQUIRE(::mkdtemp(pattern.data()) != nullptr);
  return pattern;
}

/// The whole file's bytes ("" when it cannot be read).
inline std::string slurp(const std::filesystem::path &p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

/// Writes `s` to `p`, replacing it.
inline void spit(const std::filesystem::path &p, const std::string &s) {
  std::ofstream f(p, std::ios::binary);
  f << s;
}

}  // namespace tnx_test

#endif

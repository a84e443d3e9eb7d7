// server/src/common/log.hpp: the server's logger: one line per call, to a sink or
// stderr. Thread-safe. Never give it a bearer token.
#ifndef TOOLNEXUS_SERVER_LOG_HPP
#define TOOLNEXUS_SERVER_LOG_HPP

#include "toolnexus/server.hpp"

#include <string>
#include <string_view>

namespace toolnexus::server_detail {

/// Writes log lines at or above a level. Errors are always written.
/// Thread-safe; cheap to query with enabled() before building a message.
class Logger {
 public:
  Logger(LogLevel level, LogSink sink);
  /// True when a line at `level` would be written.
  bool enabled(LogLevel level) const noexcept { return level == LogLevel::error || level <= level_; }
  /// Writes "<time> toolnexus[<level>] <text>" (stderr, control bytes of
  /// `text` as \xHH: one line whatever it holds) or passes `text` to the
  /// sink as it is (a sink that writes lines escapes it itself).
  void log(LogLevel level, std::string_view text) const;
  void error(std::string_view text) const { log(LogLevel::error, text); }
  void warn(std::string_view text) const { log(LogLevel::warn, text); }
  void info(std::string_view text) const { log(LogLevel::info, text); }
  void debug(std::string_view text) const { log(LogLevel::debug, text); }

 private:
  LogLevel level_;
  LogSink sink_;
};

}  // namespace toolnexus::server_detail

#endif  // TOOLNEXUS_SERVER_LOG_HPP

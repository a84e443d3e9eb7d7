// The server's logger.
#include "common/log.hpp"

#include <cstdio>
#include <mutex>
#include <stdexcept>

namespace toolnexus {

LogLevel parse_log_level(std::string_view name) {
  if (name == "error") return LogLevel::error;
  if (name == "warn" || name == "warning") return LogLevel::warn;
  if (name == "info") return LogLevel::info;
  if (name == "debug") return LogLevel::debug;
  throw std::invalid_argument("unknown log level '" + std::string(name) +
                              "' (expected error, warn, info or debug)");
}

namespace server_detail {
namespace {

const char *level_name(LogLevel l) noexcept {
  switch (l) {
    case LogLevel::error: return "error";
    case LogLevel::warn: return "warn";
    case LogLevel::info: return "info";
    case LogLevel::debug: return "debug";
  }
  return "?";
}

std::mutex &stderr_mutex() {
  static std::mutex m;
  return m;
}

}  // namespace

Logger::Logger(LogLevel level, LogSink sink) : level_(level), sink_(std::move(sink)) {}

void Logger::log(LogLevel level, std::string_view text) const {
  if (!enabled(level)) return;
  if (sink_) {
    sink_(level, text);
    return;
  }
  std::string line = format_timestamp(now_us());
  line += " toolnexus[";
  line += level_name(level);
  line += "] ";
  // One line per call, whatever the text holds: a control byte (a client's
  // header or token may put one in a message) is written as \xHH, so that
  // no input can forge a line of its own or drive the terminal.
  for (const char ch : text) {
    const auto u = static_cast<unsigned char>(ch);
    if (u < 0x20 || u == 0x7f) {
      static const char *hex = "0123456789abcdef";
      line += "\\x";
      line += hex[u >> 4];
      line += hex[u & 15];
    } else {
      line += ch;
    }
  }
  line += '\n';
  std::lock_guard<std::mutex> lock(stderr_mutex());
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

}  // namespace server_detail
}  // namespace toolnexus

// cli/line_reader.hpp: the lines of `toolnexus store put`'s input, read one
// at a time from a file descriptor, so that an import of any size costs the
// memory of its longest line, not of the whole input.
#ifndef TOOLNEXUS_CLI_LINE_READER_HPP
#define TOOLNEXUS_CLI_LINE_READER_HPP

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <stdexcept>
#include <string>
#include <utility>

namespace toolnexus::cli {

/// Reads the lines of descriptor `fd` (borrowed; stdin or an opened FILE)
/// through a 1 MiB buffer. Lines end at '\n'; trailing '\r', ' ' and '\t'
/// are cut; blank lines are skipped but counted, so that line numbers are
/// those of an editor. Not thread-safe. Throws std::runtime_error naming
/// `name` when a read fails.
class LineReader {
 public:
  /// Reads `fd` from where it is now; `name` ("stdin", a path) for errors.
  LineReader(int fd, std::string name) : fd_(fd), name_(std::move(name)) {
    struct stat st {};
    start_ = ::lseek(fd_, 0, SEEK_CUR);
    seekable_ = start_ >= 0 && ::fstat(fd_, &st) == 0 && S_ISREG(st.st_mode);
  }

  /// The next non-blank line into `line`, its 1-based number into `no`;
  /// false at the end of the input.
  bool next(std::string &line, size_t &no) {
    if (!back_.empty()) {
      line = std::move(back_.front().first);
      no = back_.front().second;
      back_.pop_front();
      return true;
    }
    for (;;) {
      if (!raw_line(line)) return false;
      ++line_no_;
      while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) line.pop_back();
      if (!line.empty()) {
        no = line_no_;
        return true;
      }
    }
  }

  /// Hands `line` (number `no`) out again before anything not yet read.
  void push_back(std::string line, size_t no) { back_.emplace_back(std::move(line), no); }

  /// Appends everything not yet read, as it is, to `out`.
  void rest(std::string &out) {
    for (auto &b : back_) out.append(b.first).push_back('\n');
    back_.clear();
    out.append(buf_, pos_, std::string::npos);
    pos_ = buf_.size();
    while (fill()) {
      out.append(buf_);
      pos_ = buf_.size();
    }
  }

  /// True when the input is a regular file that rewind() can read again.
  bool seekable() const noexcept { return seekable_; }

  /// Starts over at the first line (seekable() only).
  void rewind() {
    if (!seekable_ || ::lseek(fd_, start_, SEEK_SET) != start_)
      throw std::runtime_error("cannot read '" + name_ + "' again: " + std::strerror(errno));
    back_.clear();
    buf_.clear();
    pos_ = 0;
    line_no_ = 0;
    eof_ = false;
  }

 private:
  // The next line as it is, without its '\n'; false at the end.
  bool raw_line(std::string &line) {
    line.clear();
    for (;;) {
      const size_t nl = buf_.find('\n', pos_);
      if (nl != std::string::npos) {
        line.append(buf_, pos_, nl - pos_);
        pos_ = nl + 1;
        return true;
      }
      line.append(buf_, pos_, std::string::npos);
      pos_ = buf_.size();
      if (!fill()) return !line.empty();
    }
  }

  // Replaces the buffer with the next bytes of the input; false at its end.
  bool fill() {
    if (eof_) return false;
    buf_.resize(kChunk);
    for (;;) {
      const ssize_t n = ::read(fd_, buf_.data(), buf_.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw std::runtime_error("cannot read '" + name_ + "': " + std::strerror(errno));
      buf_.resize(static_cast<size_t>(n));
      pos_ = 0;
      if (n == 0) eof_ = true;
      return n > 0;
    }
  }

  static constexpr size_t kChunk = size_t(1) << 20;
  int fd_;
  std::string name_;
  off_t start_ = 0;
  bool seekable_ = false;
  std::string buf_;
  size_t pos_ = 0;
  size_t line_no_ = 0;
  bool eof_ = false;
  std::deque<std::pair<std::string, size_t>> back_;
};

}  // namespace toolnexus::cli

#endif  // TOOLNEXUS_CLI_LINE_READER_HPP

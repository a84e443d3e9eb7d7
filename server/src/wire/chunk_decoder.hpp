// server/src/wire/chunk_decoder.hpp: the decoder of a chunked request body
// (RFC 9112 section 7.1), used by the reactor (http_reactor.cpp) and fuzzed
// on its own (fuzz/chunk_decoder_fuzz.cpp).
#ifndef TOOLNEXUS_SERVER_WIRE_CHUNK_DECODER_HPP
#define TOOLNEXUS_SERVER_WIRE_CHUNK_DECODER_HPP

#include "common/util.hpp"
#include "wire/http_head.hpp"

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>

namespace toolnexus::server_detail {

// A strict incremental decoder of a chunked request body (RFC 9112
// section 7.1): hex size (chunk extensions ignored), CRLF, data, CRLF, ...,
// a zero-size chunk, optional trailer fields, CRLF.
///
/// One decoder per request body; not thread-safe (one connection's reader
/// uses it). Holds no buffer of its own: the caller keeps the unread bytes.
class ChunkDecoder {
 public:
  /// more: needs more input; done: the body ended (bytes after the last
  /// CRLF of the trailer stay in `in`, the next request's); bad: malformed
  /// (`why` says how: answer 400); too_large: the body would pass
  /// `max_body` bytes (answer 413).
  enum class Result { more, done, bad, too_large };

  /// Consumes what it can of `in` (erasing it), appending the chunks' data
  /// to `body`. `max_body` bounds body.size(); `max_line` bounds a
  /// chunk-size line and the whole trailer. Call again with more input
  /// while it returns more; after done, bad or too_large, reset it.
  Result feed(std::string &in, std::string &body, std::size_t max_body, std::size_t max_line, std::string &why) {
    std::size_t pos = 0;
    Result r = Result::more;
    while (r == Result::more) {
      if (state_ == State::size_line || state_ == State::trailer) {
        const std::size_t eol = in.find("\r\n", pos);
        if (eol == std::string::npos) {
          if (in.size() - pos > max_line) {
            why = state_ == State::size_line ? "a chunk-size line is too long" : "the chunked trailer is too long";
            r = Result::bad;
          }
          break;
        }
        const std::string_view line(in.data() + pos, eol - pos);
        pos = eol + 2;
        if (line.size() > max_line) {
          why = state_ == State::size_line ? "a chunk-size line is too long" : "the chunked trailer is too long";
          r = Result::bad;
          break;
        }
        if (state_ == State::trailer) {
          // Trailer fields are field lines (RFC 9112 section 7.1.2): held
          // to the head's rules, so that a proxy reading LF as a line end
          // cannot find a request hidden in them.
          trailer_bytes_ += line.size() + 2;
          if (line.empty()) {
            r = Result::done;
          } else if (trailer_bytes_ > max_line) {
            why = "the chunked trailer is too long";
            r = Result::bad;
          } else if (std::string problem = field_line_problem(line); !problem.empty()) {
            why = "chunked trailer: " + problem;
            r = Result::bad;
          }
          continue;
        }
        // chunk = chunk-size [ chunk-ext ] CRLF, chunk-ext = *( BWS ";" ...)
        // (RFC 9112 section 7.1.1): no whitespace before the size, none after
        // it unless an extension follows, no control byte anywhere (a bare LF
        // here let a request hidden behind it be read by a proxy).
        for (char ch : line) {
          const auto c = static_cast<unsigned char>(ch);
          if ((c < 0x20 && c != '\t') || c == 0x7f) {
            why = "a control byte (bare CR or LF?) in the chunk-size line (RFC 9112 section 7.1.1)";
            return fail(in, pos, Result::bad);
          }
        }
        const std::size_t semi = line.find(';');
        std::string_view size_text = line.substr(0, semi);
        if (semi != std::string_view::npos) size_text = trim_ows(size_text);
        if (size_text.empty() || size_text.size() > 15 ||
            size_text.find_first_not_of("0123456789abcdefABCDEF") != std::string_view::npos) {
          why = "bad chunk size " + in_quotes(line.substr(0, 40));
          r = Result::bad;
          break;
        }
        remaining_ = std::stoull(std::string(size_text), nullptr, 16);
        if (remaining_ == 0) {
          state_ = State::trailer;
        } else if (body.size() + remaining_ > max_body) {
          r = Result::too_large;
        } else {
          state_ = State::data;
        }
      } else if (state_ == State::data) {
        const std::size_t take = std::min<std::size_t>(remaining_, in.size() - pos);
        body.append(in, pos, take);
        pos += take;
        remaining_ -= take;
        if (remaining_ != 0) break;
        state_ = State::data_end;
      } else {  // data_end: the CRLF after a chunk's data
        if (in.size() - pos < 2) break;
        if (in[pos] != '\r' || in[pos + 1] != '\n') {
          why = "a chunk's data is not followed by CRLF (wrong chunk size?)";
          r = Result::bad;
          break;
        }
        pos += 2;
        state_ = State::size_line;
      }
    }
    in.erase(0, pos);
    return r;
  }

 private:
  static Result fail(std::string &in, std::size_t pos, Result r) {
    in.erase(0, pos);
    return r;
  }

 public:

 private:
  enum class State { size_line, data, data_end, trailer };
  State state_ = State::size_line;
  uint64_t remaining_ = 0;
  std::size_t trailer_bytes_ = 0;
};

}  // namespace toolnexus::server_detail

#endif  // TOOLNEXUS_SERVER_WIRE_CHUNK_DECODER_HPP

// fuzz/chunk_decoder_fuzz.cpp: the chunked request body decoder
// (server/src/wire/chunk_decoder.hpp).
//
// Input: byte 0 picks the piece size the body arrives in (1..64 bytes, as
// reads from a socket), byte 1 the body limit; the rest is the chunked
// body.
//
// Invariants: the decoded body never passes the limit; a refusal (bad) says
// why; fed whole or in pieces, the decoder reaches the same result with the
// same body and leaves the same bytes unread (where a request ends does not
// depend on how the bytes arrived: a smuggling hazard otherwise), except
// that a line too long is refused sooner when it arrives without its CRLF.
#include "fuzz_check.hpp"
#include "wire/chunk_decoder.hpp"

#include <cstddef>
#include <algorithm>
#include <cstdint>
#include <string>

using toolnexus::server_detail::ChunkDecoder;

namespace {

constexpr std::size_t kMaxLine = 64;

struct Outcome {
  ChunkDecoder::Result result = ChunkDecoder::Result::more;
  std::string body;
  std::string rest;  // bytes not consumed
  std::string why;
};

Outcome decode(const std::string &input, std::size_t piece, std::size_t max_body) {
  Outcome o;
  ChunkDecoder d;
  std::string in;
  std::size_t pos = 0;
  do {
    const std::size_t n = std::min(piece, input.size() - pos);
    in.append(input, pos, n);
    pos += n;
    o.result = d.feed(in, o.body, max_body, kMaxLine, o.why);
    FUZZ_CHECK(o.body.size() <= max_body, "body passed its limit");
  } while (o.result == ChunkDecoder::Result::more && pos < input.size());
  o.rest = in + input.substr(pos);
  return o;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, std::size_t size) {
  if (size < 2) return 0;
  const std::size_t piece = 1 + data[0] % 64;
  const std::size_t max_body = 16 + std::size_t{data[1]} * 16;
  const std::string input(reinterpret_cast<const char *>(data) + 2, size - 2);
  const Outcome whole = decode(input, input.size() + 1, max_body);
  const Outcome pieces = decode(input, piece, max_body);
  FUZZ_CHECK(whole.result != ChunkDecoder::Result::bad || !whole.why.empty(), "refusal without a reason");
  // A line too long is seen sooner in pieces, before its CRLF arrives;
  // otherwise how the bytes arrive changes nothing.
  const bool line_limit = whole.why.find("too long") != std::string::npos ||
                          pieces.why.find("too long") != std::string::npos;
  if (!line_limit) {
    FUZZ_CHECK(whole.result == pieces.result, "whole and piecewise results differ");
    if (whole.result == ChunkDecoder::Result::done) {
      FUZZ_CHECK(whole.body == pieces.body, "whole and piecewise bodies differ");
      FUZZ_CHECK(whole.rest == pieces.rest, "whole and piecewise leave different bytes unread");
    }
  }
  return 0;
}

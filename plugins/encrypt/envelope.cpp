// plugins/encrypt/envelope.cpp: sealing and opening records (envelope.hpp).
#include "envelope.hpp"

#include "toolnexus/plugin.hpp"

#include <rapidjson/stringbuffer.h>

#include <array>
#include <atomic>
#include <rapidjson/writer.h>
#include <sodium.h>

#include <cstring>
#include <ctime>
#include <mutex>

#include <pthread.h>

namespace toolnexus::encrypt {

using sdk::Error;
using sdk::quote;

namespace {

constexpr std::string_view kTag = "tnx1";
constexpr std::string_view kMember = "\"tnxSealed\":\"";
constexpr size_t kNonce = crypto_aead_xchacha20poly1305_ietf_NPUBBYTES;
constexpr size_t kMac = crypto_aead_xchacha20poly1305_ietf_ABYTES;

void put_u64(std::string &o, uint64_t v) {
  for (int i = 0; i < 8; ++i) o.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void put_str(std::string &o, std::string_view s) {
  put_u64(o, s.size());
  o.append(s);
}

std::string aad(std::string_view kid, const IndexFields &f, uint64_t version) {
  std::string a;
  a.reserve(96 + f.id.size() + f.context_id.size() + f.owner.size() + f.tenant.size());
  put_str(a, kTag);
  put_str(a, kid);
  put_str(a, f.id);
  put_u64(a, version);
  put_str(a, f.context_id);
  put_str(a, f.state);
  put_u64(a, static_cast<uint64_t>(f.time_us));
  put_str(a, f.owner);
  put_str(a, f.tenant);
  return a;
}

// Random nonces, drawn from a per-thread buffer refilled by
// randombytes_buf (the kernel's getrandom) 4 KiB at a time: one system call
// per 170 records instead of one per record. A forked child refills before
// its first nonce (pthread_atfork bumps the generation), so parent and child
// never share buffered bytes.
std::atomic<uint64_t> g_fork_generation{0};

void nonce(unsigned char *out) {
  static std::once_flag once;
  std::call_once(once, [] { pthread_atfork(nullptr, nullptr, [] { g_fork_generation.fetch_add(1); }); });
  struct Pool {
    unsigned char bytes[4096];
    size_t used = sizeof bytes;
    uint64_t generation = 0;
  };
  thread_local Pool pool;
  const uint64_t gen = g_fork_generation.load(std::memory_order_relaxed);
  if (pool.used + kNonce > sizeof pool.bytes || pool.generation != gen) {
    randombytes_buf(pool.bytes, sizeof pool.bytes);
    pool.used = 0;
    pool.generation = gen;
  }
  std::memcpy(out, pool.bytes + pool.used, kNonce);
  sodium_memzero(pool.bytes + pool.used, kNonce);
  pool.used += kNonce;
}

// Standard base64 (RFC 4648, with padding) into `out`; false on anything
// else. Not constant-time, on purpose: it decodes ciphertext, which is
// public (libsodium's constant-time decoder was a fifth of a get's time).
bool base64_decode(std::string_view in, std::string &out) {
  static const auto table = [] {
    std::array<int8_t, 256> t{};
    t.fill(-1);
    const char *a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (int i = 0; i < 64; ++i) t[static_cast<unsigned char>(a[i])] = static_cast<int8_t>(i);
    return t;
  }();
  if (in.size() % 4 != 0) return false;
  size_t pad = 0;
  if (!in.empty() && in.back() == '=') ++pad;
  if (in.size() > 1 && in[in.size() - 2] == '=') ++pad;
  out.resize(in.size() / 4 * 3 - pad);
  size_t o = 0;
  for (size_t i = 0; i < in.size(); i += 4) {
    int v[4];
    for (int j = 0; j < 4; ++j) {
      const char c = in[i + j];
      if (c == '=' && i + 4 == in.size() && j >= 2 && (j == 3 || in[i + 3] == '=')) {
        v[j] = 0;
        continue;
      }
      v[j] = table[static_cast<unsigned char>(c)];
      if (v[j] < 0) return false;
    }
    const uint32_t n = (uint32_t(v[0]) << 18) | (uint32_t(v[1]) << 12) | (uint32_t(v[2]) << 6) | uint32_t(v[3]);
    if (o < out.size()) out[o++] = static_cast<char>(n >> 16);
    if (o < out.size()) out[o++] = static_cast<char>((n >> 8) & 0xff);
    if (o < out.size()) out[o++] = static_cast<char>(n & 0xff);
  }
  return true;
}

std::string hex(const unsigned char *p, size_t n) {
  static const char *h = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    s.push_back(h[p[i] >> 4]);
    s.push_back(h[p[i] & 15]);
  }
  return s;
}

}  // namespace

std::string rfc3339(int64_t us) {
  int64_t secs = us / 1000000, frac = us % 1000000;
  if (frac < 0) {
    frac += 1000000;
    --secs;
  }
  const time_t t = static_cast<time_t>(secs);
  struct tm tm {};
  gmtime_r(&t, &tm);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%06lldZ", tm.tm_year + 1900, tm.tm_mon + 1,
                tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<long long>(frac));
  return buf;
}

std::string seal(const Key &key, const IndexFields &f, uint64_t version, std::string_view json) {
  std::string box(kNonce + json.size() + kMac, '\0');
  auto *b = reinterpret_cast<unsigned char *>(box.data());
  nonce(b);
  const std::string ad = aad(key.id, f, version);
  unsigned long long clen = 0;
  crypto_aead_xchacha20poly1305_ietf_encrypt(b + kNonce, &clen, reinterpret_cast<const unsigned char *>(json.data()),
                                             json.size(), reinterpret_cast<const unsigned char *>(ad.data()),
                                             ad.size(), nullptr, b, key.bytes.data());
  std::string b64(sodium_base64_ENCODED_LEN(box.size(), sodium_base64_VARIANT_ORIGINAL), '\0');
  sodium_bin2base64(b64.data(), b64.size(), b, box.size(), sodium_base64_VARIANT_ORIGINAL);
  b64.resize(std::strlen(b64.c_str()));

  rapidjson::StringBuffer sb;
  sb.Reserve(b64.size() + f.id.size() + f.context_id.size() + 192);
  rapidjson::Writer<rapidjson::StringBuffer> w(sb);
  w.StartObject();
  w.Key("id");
  w.String(f.id.data(), static_cast<rapidjson::SizeType>(f.id.size()));
  if (!f.context_id.empty()) {
    w.Key("contextId");
    w.String(f.context_id.data(), static_cast<rapidjson::SizeType>(f.context_id.size()));
  }
  if (!f.state.empty() || f.time_us != TNX_TIME_NONE) {
    w.Key("status");
    w.StartObject();
    if (!f.state.empty()) {
      w.Key("state");
      w.String(f.state.data(), static_cast<rapidjson::SizeType>(f.state.size()));
    }
    if (f.time_us != TNX_TIME_NONE) {
      const std::string ts = rfc3339(f.time_us);
      w.Key("timestamp");
      w.String(ts.data(), static_cast<rapidjson::SizeType>(ts.size()));
    }
    w.EndObject();
  }
  // The sealed token is the last member: find_sealed looks for it from the end.
  const std::string token = std::string(kTag) + "." + key.id + "." + hex(key.check.data(), key.check.size()) + "." + b64;
  w.Key("tnxSealed");
  w.String(token.data(), static_cast<rapidjson::SizeType>(token.size()));
  w.EndObject();
  return std::string(sb.GetString(), sb.GetSize());
}

bool find_sealed(std::string_view stored, std::string_view id, Sealed &out) {
  const size_t at = stored.rfind(kMember);
  if (at == std::string_view::npos) return false;
  const size_t start = at + kMember.size();
  const size_t end = stored.find('"', start);
  auto bad = [&](const char *why) {
    return Error(TNX_ECORRUPT, "encrypt: task " + quote(id) + " is corrupt: its sealed record " + why);
  };
  if (end == std::string_view::npos || stored.substr(end) .size() < 2 || stored.substr(end + 1, 1) != "}")
    throw bad("is cut short");
  std::string_view tok = stored.substr(start, end - start);
  if (tok.substr(0, kTag.size() + 1) != std::string(kTag) + ".") throw bad("has an unknown format tag");
  tok.remove_prefix(kTag.size() + 1);
  const size_t d1 = tok.find('.');
  if (d1 == std::string_view::npos || d1 == 0) throw bad("names no key id");
  out.kid = tok.substr(0, d1);
  tok.remove_prefix(d1 + 1);
  const size_t d2 = tok.find('.');
  if (d2 != 16) throw bad("has no key check value");
  out.check_hex = tok.substr(0, d2);
  out.b64 = tok.substr(d2 + 1);
  return true;
}

std::string open(const KeyRing &keys, const IndexFields &f, uint64_t version, const Sealed &s) {
  const Key *key = keys.find(s.kid);
  if (key == nullptr)
    throw Error(TNX_EINVAL, "encrypt: task " + quote(f.id) + " is sealed with key " + quote(s.kid) +
                                ", which is not among the keys of " + keys.source() + " (" + keys.ids() + ")");
  if (s.check_hex != hex(key->check.data(), key->check.size()))
    throw Error(TNX_EINVAL, "encrypt: key " + quote(s.kid) + " of " + keys.source() +
                                " is not the key task " + quote(f.id) + " was sealed with (wrong key for id " +
                                quote(s.kid) + ")");
  std::string box;
  if (!base64_decode(s.b64, box) || box.size() < kNonce + kMac)
    throw Error(TNX_ECORRUPT, "encrypt: task " + quote(f.id) + " is corrupt: its sealed bytes are not base64 or too short");
  const size_t blen = box.size();
  const auto *b = reinterpret_cast<const unsigned char *>(box.data());
  std::string plain(blen - kNonce - kMac, '\0');
  const std::string ad = aad(s.kid, f, version);
  unsigned long long plen = 0;
  if (crypto_aead_xchacha20poly1305_ietf_decrypt(reinterpret_cast<unsigned char *>(plain.data()), &plen, nullptr,
                                                 b + kNonce, blen - kNonce,
                                                 reinterpret_cast<const unsigned char *>(ad.data()), ad.size(), b,
                                                 key->bytes.data()) != 0)
    throw Error(TNX_ECORRUPT, "encrypt: task " + quote(f.id) + " (version " + std::to_string(version) +
                                  ") is corrupt: its sealed record does not authenticate (altered, copied from "
                                  "another task, or rolled back to an older version)");
  plain.resize(static_cast<size_t>(plen));
  return plain;
}

}  // namespace toolnexus::encrypt

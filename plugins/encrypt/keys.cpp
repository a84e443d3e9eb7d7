// plugins/encrypt/keys.cpp: loading and checking keys (keys.hpp).
#include "keys.hpp"

#include "toolnexus/plugin.hpp"

#include <sodium.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace toolnexus::encrypt {

using sdk::Error;

namespace {

bool id_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '.' ||
         c == '-';
}

int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::vector<Key> parse_keys(std::string_view text, const std::string &where) {
  std::vector<Key> out;
  size_t line = 1;
  size_t i = 0;
  while (i < text.size()) {
    const char c = text[i];
    if (c == '\n') { ++line; ++i; continue; }
    if (c == ' ' || c == '\t' || c == '\r') { ++i; continue; }
    if (c == '#') {
      while (i < text.size() && text[i] != '\n') ++i;
      continue;
    }
    size_t e = i;
    // A token ends at a blank, a line end, or a '#' (a comment after it).
    while (e < text.size() && text[e] != ' ' && text[e] != '\t' && text[e] != '\r' && text[e] != '\n' &&
           text[e] != '#')
      ++e;
    const std::string_view tok = text.substr(i, e - i);
    i = e;
    const std::string at = where + " line " + std::to_string(line);
    const size_t colon = tok.find(':');
    if (colon != std::string_view::npos && colon > 32)
      throw Error(TNX_EINVAL, "encrypt: " + at + ": a key id of " + std::to_string(colon) +
                                  " characters; an id has 1..32 of A-Z a-z 0-9 _ . -");
    if (colon == std::string_view::npos || colon == 0)
      throw Error(TNX_EINVAL, "encrypt: " + at + ": expected <id>:<64 hex digits> (an id of 1..32 of A-Z a-z 0-9 _ . -)");
    Key k;
    k.id = std::string(tok.substr(0, colon));
    for (char ch : k.id)
      if (!id_char(ch)) throw Error(TNX_EINVAL, "encrypt: " + at + ": key id " + sdk::quote(k.id) + " has a character outside A-Z a-z 0-9 _ . -");
    const std::string_view hex = tok.substr(colon + 1);
    bool all_hex = true;
    for (char ch : hex) all_hex = all_hex && hexval(ch) >= 0;
    if (hex.size() != 64 || !all_hex)
      throw Error(TNX_EINVAL, "encrypt: " + at + ": key " + sdk::quote(k.id) + " must be 64 hex digits (32 bytes) after " +
                                  "its ':', found " + std::to_string(hex.size()) + " characters" +
                                  (all_hex ? "" : ", not all of them hex digits"));
    for (size_t j = 0; j < 32; ++j) {
      const int hi = hexval(hex[2 * j]), lo = hexval(hex[2 * j + 1]);
      if (hi < 0 || lo < 0) throw Error(TNX_EINVAL, "encrypt: " + at + ": key " + sdk::quote(k.id) + " is not hexadecimal");
      k.bytes[j] = static_cast<unsigned char>(hi * 16 + lo);
    }
    for (const Key &o : out)
      if (o.id == k.id) throw Error(TNX_EINVAL, "encrypt: " + at + ": key id " + sdk::quote(k.id) + " is listed twice");
    static const char kCheck[] = "toolnexus-encrypt key check";
    crypto_generichash(k.check.data(), k.check.size(), reinterpret_cast<const unsigned char *>(kCheck),
                       sizeof kCheck - 1, k.bytes.data(), k.bytes.size());
    out.push_back(std::move(k));
  }
  if (out.empty()) throw Error(TNX_EINVAL, "encrypt: " + where + " holds no key (expected lines <id>:<64 hex digits>)");
  return out;
}

KeyRing KeyRing::load(const std::string *key_file, const std::string *env_var) {
  if ((key_file == nullptr) == (env_var == nullptr))
    throw Error(TNX_EINVAL, "encrypt: give exactly one of the options key=<key file> and env=<variable>");
  KeyRing r;
  std::string text;
  if (env_var != nullptr) {
    r.source_ = "environment variable " + sdk::quote(*env_var);
    const char *v = std::getenv(env_var->c_str());
    if (v == nullptr) throw Error(TNX_EINVAL, "encrypt: " + r.source_ + " is not set (it must hold the keys)");
    if (v[0] == '\0') throw Error(TNX_EINVAL, "encrypt: " + r.source_ + " is empty (it must hold the keys)");
    text = v;
  } else {
    r.source_ = "key file " + sdk::quote(*key_file, 4096);
    const int fd = ::open(key_file->c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) throw Error(TNX_EINVAL, "encrypt: cannot open " + r.source_ + ": " + std::strerror(errno));
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      ::close(fd);
      throw Error(TNX_EINVAL, "encrypt: " + r.source_ + " is not a regular file");
    }
    if ((st.st_mode & 077) != 0) {
      ::close(fd);
      char mode[8];
      std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
      throw Error(TNX_EINVAL, "encrypt: " + r.source_ + " has mode " + mode +
                                  ": a key file must be readable by its owner only (chmod 600)");
    }
    char buf[4096];
    for (;;) {
      const ssize_t n = ::read(fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        const int e = errno;
        ::close(fd);
        throw Error(TNX_EINVAL, "encrypt: cannot read " + r.source_ + ": " + std::strerror(e));
      }
      if (n == 0) break;
      text.append(buf, static_cast<size_t>(n));
      if (text.size() > (1u << 20)) {
        ::close(fd);
        throw Error(TNX_EINVAL, "encrypt: " + r.source_ + " is larger than 1 MiB: not a key file");
      }
    }
    ::close(fd);
  }
  r.keys_ = parse_keys(text, r.source_);
  sodium_memzero(text.data(), text.size());
  return r;
}

const Key *KeyRing::find(std::string_view id) const noexcept {
  for (const Key &k : keys_)
    if (k.id == id) return &k;
  return nullptr;
}

std::string KeyRing::ids() const {
  std::string s;
  for (const Key &k : keys_) s += (s.empty() ? "" : ", ") + k.id;
  return s;
}

}  // namespace toolnexus::encrypt

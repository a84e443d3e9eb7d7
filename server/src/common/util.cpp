// Small helpers shared by the server's parts.
#include "common/util.hpp"

#include <malloc.h>
#include <pthread.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <random>

#include <rapidjson/writer.h>

namespace toolnexus::server_detail {

std::string in_quotes(std::string_view s) {
  static const char *hex = "0123456789abcdef";
  constexpr std::size_t kMax = 200;
  std::string out = "'";
  std::size_t i = 0;
  while (i < s.size() && i < kMax) {
    const auto c = static_cast<unsigned char>(s[i]);
    std::size_t n = 1;
    if (c >= 0xc0 && c < 0xe0) n = 2;
    else if (c >= 0xe0 && c < 0xf0) n = 3;
    else if (c >= 0xf0) n = 4;
    if (c >= 0x80 && (n == 1 || !is_valid_utf8(s.substr(i, n)))) n = 0;  // not a sequence: one byte, escaped
    if (n >= 2) {
      out.append(s.substr(i, n));
      i += n;
      continue;
    }
    if (c < 0x20 || c >= 0x7f) {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
    ++i;
  }
  if (i < s.size()) out += "...";
  out += '\'';
  return out;
}

std::string valid_utf8_text(std::string_view s) {
  if (is_valid_utf8(s)) return std::string(s);
  static const char *hex = "0123456789abcdef";
  std::string out;
  out.reserve(s.size() + 16);
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    std::size_t n = 1;
    if (c >= 0xc0 && c < 0xe0) n = 2;
    else if (c >= 0xe0 && c < 0xf0) n = 3;
    else if (c >= 0xf0) n = 4;
    if (c < 0x80 || (n >= 2 && is_valid_utf8(s.substr(i, n)))) {
      out.append(s.substr(i, n));
      i += n;
      continue;
    }
    out += "\\x";
    out += hex[c >> 4];
    out += hex[c & 15];
    ++i;
  }
  return out;
}

std::string new_uuid() {
  thread_local std::mt19937_64 rng([] {
    std::random_device rd;
    std::seed_seq seq{rd(), rd(), rd(), rd(), rd(), rd(), rd(), rd()};
    return std::mt19937_64(seq);
  }());
  uint64_t hi = rng(), lo = rng();
  hi = (hi & 0xffffffffffff0fffULL) | 0x0000000000004000ULL;  // version 4
  lo = (lo & 0x3fffffffffffffffULL) | 0x8000000000000000ULL;  // variant 10
  static const char hex[] = "0123456789abcdef";
  std::string out(36, '-');
  size_t pos = 0;
  auto put = [&](uint64_t v, int nibbles_from, int nibbles_to) {
    for (int i = nibbles_from; i < nibbles_to; ++i) {
      if (pos == 8 || pos == 13 || pos == 18 || pos == 23) ++pos;
      out[pos++] = hex[(v >> (60 - 4 * i)) & 0xf];
    }
  };
  put(hi, 0, 16);
  put(lo, 0, 16);
  return out;
}

const rapidjson::Value *find(const rapidjson::Value &obj, std::string_view name) noexcept {
  if (!obj.IsObject()) return nullptr;
  for (auto it = obj.MemberBegin(); it != obj.MemberEnd(); ++it) {
    if (it->name.GetStringLength() == name.size() &&
        std::string_view(it->name.GetString(), name.size()) == name)
      return &it->value;
  }
  return nullptr;
}

rapidjson::Value *find(rapidjson::Value &obj, std::string_view name) noexcept {
  return const_cast<rapidjson::Value *>(find(static_cast<const rapidjson::Value &>(obj), name));
}

std::string_view str(const rapidjson::Value *v) noexcept {
  if (v == nullptr || !v->IsString()) return {};
  return std::string_view(v->GetString(), v->GetStringLength());
}

rapidjson::Value make_string(std::string_view s, rapidjson::Document::AllocatorType &a) {
  return rapidjson::Value(s.data(), static_cast<rapidjson::SizeType>(s.size()), a);
}

void set_member(rapidjson::Value &obj, std::string_view name, rapidjson::Value value,
                rapidjson::Document::AllocatorType &a) {
  if (rapidjson::Value *existing = find(obj, name)) {
    *existing = value;
    return;
  }
  obj.AddMember(make_string(name, a), value, a);
}

void remove_member(rapidjson::Value &obj, std::string_view name) {
  if (!obj.IsObject()) return;
  for (auto it = obj.MemberBegin(); it != obj.MemberEnd(); ++it) {
    if (std::string_view(it->name.GetString(), it->name.GetStringLength()) == name) {
      obj.EraseMember(it);  // keeps the order of the others
      return;
    }
  }
}

std::string message_text(const rapidjson::Value &message) {
  std::string out;
  const rapidjson::Value *parts = find(message, "parts");
  if (parts == nullptr || !parts->IsArray()) return out;
  bool first = true;
  for (const auto &p : parts->GetArray()) {
    const rapidjson::Value *text = find(p, "text");
    const std::string_view kind = str(find(p, "kind"));
    if (text == nullptr || !text->IsString() || (!kind.empty() && kind != "text")) continue;
    if (!first) out += '\n';
    out.append(text->GetString(), text->GetStringLength());
    first = false;
  }
  return out;
}

rapidjson::Value agent_message(std::string_view text, std::string_view task_id,
                               std::string_view context_id, rapidjson::Document::AllocatorType &a) {
  rapidjson::Value part(rapidjson::kObjectType);
  part.AddMember("kind", "text", a);
  part.AddMember("text", make_string(text, a), a);
  rapidjson::Value parts(rapidjson::kArrayType);
  parts.PushBack(part, a);
  rapidjson::Value msg(rapidjson::kObjectType);
  msg.AddMember("role", "agent", a);
  msg.AddMember("parts", parts, a);
  msg.AddMember("messageId", make_string(new_uuid(), a), a);
  msg.AddMember("taskId", make_string(task_id, a), a);
  if (!context_id.empty()) msg.AddMember("contextId", make_string(context_id, a), a);
  msg.AddMember("kind", "message", a);
  return msg;
}

const rapidjson::Value *task_metadata(const Task &task, std::string_view key) noexcept {
  const rapidjson::Value *md = find(task.json(), "metadata");
  return md == nullptr ? nullptr : find(*md, key);
}

void set_task_metadata(Task &task, std::string_view key, rapidjson::Value value) {
  auto &a = task.allocator();
  rapidjson::Value *md = find(task.json(), "metadata");
  if (md == nullptr || !md->IsObject()) {
    set_member(task.json(), "metadata", rapidjson::Value(rapidjson::kObjectType), a);
    md = find(task.json(), "metadata");
  }
  set_member(*md, key, std::move(value), a);
}

void remove_task_metadata(Task &task, std::string_view key) {
  rapidjson::Value *md = find(task.json(), "metadata");
  if (md == nullptr || !md->IsObject()) return;
  remove_member(*md, key);
  if (md->MemberCount() == 0) remove_member(task.json(), "metadata");
}

void append_history(Task &task, rapidjson::Value message) {
  auto &a = task.allocator();
  rapidjson::Value *h = find(task.json(), "history");
  if (h == nullptr || !h->IsArray()) {
    set_member(task.json(), "history", rapidjson::Value(rapidjson::kArrayType), a);
    h = find(task.json(), "history");
  }
  h->PushBack(message, a);
}

namespace {

// An output stream that only counts what a rapidjson::Writer puts.
struct CountingStream {
  using Ch = char;
  std::size_t n = 0;
  void Put(Ch) { ++n; }
  void Flush() {}
};

}  // namespace

std::size_t serialized_size(const rapidjson::Value &v) {
  CountingStream out;
  rapidjson::Writer<CountingStream> w(out);
  v.Accept(w);
  return out.n;
}

const std::string &host_name() {
  static const std::string name = [] {
    char buf[256] = {0};
    if (::gethostname(buf, sizeof buf - 1) != 0) return std::string();
    return std::string(buf);
  }();
  return name;
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define TNX_SANITIZED_ALLOCATOR 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#define TNX_SANITIZED_ALLOCATOR 1
#endif
#endif

void name_this_thread(const char *name) noexcept {
  char cut[16] = {};
  std::strncpy(cut, name, sizeof cut - 1);
  (void)::pthread_setname_np(::pthread_self(), cut);
}

void release_free_memory() noexcept {
#ifndef TNX_SANITIZED_ALLOCATOR
  ::malloc_trim(0);
#endif
}

}  // namespace toolnexus::server_detail

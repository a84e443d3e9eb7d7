// plugins/file/task_codec.cpp: Task JSON and sidecar codecs (see
// task_codec.hpp).
#include "task_codec.hpp"

#include <rapidjson/document.h>
#include <rapidjson/error/en.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

namespace toolnexus::file_plugin {
namespace {

// ---------------------------------------------------------------------------
// RFC 3339 timestamps (same acceptance as the host: Z/z or +HH:MM/-HH:MM,
// T or t, optional fraction truncated to microseconds, second 60 allowed)
// ---------------------------------------------------------------------------

int64_t days_from_civil(int64_t y, int64_t m, int64_t d) noexcept {
  y -= m <= 2 ? 1 : 0;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const int64_t yoe = y - era * 400;
  const int64_t doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1;
  const int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + doe - 719468;
}

bool parse_rfc3339(std::string_view t, int64_t &out_us) noexcept {
  auto num = [&](size_t pos, size_t n, int64_t &v) {
    if (pos + n > t.size()) return false;
    v = 0;
    for (size_t i = pos; i < pos + n; ++i) {
      if (t[i] < '0' || t[i] > '9') return false;
      v = v * 10 + (t[i] - '0');
    }
    return true;
  };
  int64_t year = 0, month = 0, day = 0, hour = 0, minute = 0, second = 0;
  if (t.size() < 20 || !num(0, 4, year) || t[4] != '-' || !num(5, 2, month) || t[7] != '-' ||
      !num(8, 2, day) || (t[10] != 'T' && t[10] != 't') || !num(11, 2, hour) || t[13] != ':' ||
      !num(14, 2, minute) || t[16] != ':' || !num(17, 2, second))
    return false;
  size_t p = 19;
  int64_t frac = 0;
  if (p < t.size() && t[p] == '.') {
    const size_t start = ++p;
    int digits = 0;
    while (p < t.size() && t[p] >= '0' && t[p] <= '9') {
      if (digits < 6) {
        frac = frac * 10 + (t[p] - '0');
        ++digits;
      }
      ++p;
    }
    if (p == start) return false;
    for (; digits < 6; ++digits) frac *= 10;
  }
  if (p >= t.size()) return false;
  int64_t offset_s = 0;
  if (t[p] == 'Z' || t[p] == 'z') {
    if (p + 1 != t.size()) return false;
  } else if (t[p] == '+' || t[p] == '-') {
    int64_t oh = 0, om = 0;
    if (p + 6 != t.size() || !num(p + 1, 2, oh) || t[p + 3] != ':' || !num(p + 4, 2, om)) return false;
    offset_s = (t[p] == '-' ? -1 : 1) * (oh * 3600 + om * 60);
  } else {
    return false;
  }
  static const int kDays[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  if (month < 1 || month > 12 || day < 1 || hour > 23 || minute > 59 || second > 60) return false;
  const bool leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
  const int64_t dim = kDays[month - 1] + (month == 2 && leap ? 1 : 0);
  if (day > dim) return false;
  const int64_t secs = days_from_civil(year, month, day) * 86400 + hour * 3600 + minute * 60 + second -
                       offset_s;
  out_us = secs * 1000000 + frac;
  return true;
}

}  // namespace

std::string parse_task(std::string_view json, TaskFields &f) {
  if (json.empty()) return "is empty";
  rapidjson::Document d;
  d.Parse<rapidjson::kParseIterativeFlag>(json.data(), json.size());
  if (d.HasParseError())
    return std::string("is not valid JSON: ") + rapidjson::GetParseError_En(d.GetParseError()) +
           " at byte " + std::to_string(d.GetErrorOffset());
  if (!d.IsObject()) return "is not a JSON object";
  auto str = [](const rapidjson::Value &v) { return std::string(v.GetString(), v.GetStringLength()); };
  auto id = d.FindMember("id");
  if (id == d.MemberEnd() || !id->value.IsString()) return "has no string \"id\"";
  f.id = str(id->value);
  if (f.id.empty()) return "has an empty \"id\"";
  if (f.id.find('\0') != std::string::npos) return "has an \"id\" containing NUL";
  auto ctx = d.FindMember("contextId");
  f.context_id.clear();
  if (ctx != d.MemberEnd()) {
    if (!ctx->value.IsString()) return "has a \"contextId\" that is not a string";
    f.context_id = str(ctx->value);
  }
  f.state.clear();
  f.time_us = TNX_TIME_NONE;
  auto st = d.FindMember("status");
  if (st != d.MemberEnd()) {
    if (!st->value.IsObject()) return "has a \"status\" that is not an object";
    auto state = st->value.FindMember("state");
    if (state != st->value.MemberEnd()) {
      if (!state->value.IsString()) return "has a \"status.state\" that is not a string";
      f.state = str(state->value);
    }
    auto ts = st->value.FindMember("timestamp");
    if (ts != st->value.MemberEnd()) {
      int64_t us = 0;
      if (!ts->value.IsString() || !parse_rfc3339(str(ts->value), us))
        return "has a \"status.timestamp\" that is not an RFC 3339 time";
      f.time_us = us;
    }
  }
  return std::string();
}


std::string parse_meta(std::string_view bytes, Meta &m) {
  if (bytes.empty()) return "is empty";
  rapidjson::Document d;
  d.Parse<rapidjson::kParseIterativeFlag>(bytes.data(), bytes.size());
  if (d.HasParseError())
    return std::string("is not valid JSON: ") + rapidjson::GetParseError_En(d.GetParseError()) +
           " at byte " + std::to_string(d.GetErrorOffset());
  if (!d.IsObject()) return "is not a JSON object";
  auto get = [](const rapidjson::Value &o, const char *key, std::string &out) {
    auto it = o.FindMember(key);
    out.clear();
    if (it == o.MemberEnd()) return true;
    if (!it->value.IsString()) return false;
    out.assign(it->value.GetString(), it->value.GetStringLength());
    return true;
  };
  if (!get(d, "owner", m.owner) || !get(d, "tenant", m.tenant))
    return "has an \"owner\" or \"tenant\" that is not a string";
  auto prev = d.FindMember("prev");
  m.has_prev = prev != d.MemberEnd();
  if (m.has_prev) {
    if (!prev->value.IsObject() || !get(prev->value, "owner", m.prev_owner) ||
        !get(prev->value, "tenant", m.prev_tenant) || !get(prev->value, "sha256", m.prev_sha) ||
        m.prev_sha.size() != 64)
      return "has a malformed \"prev\"";
  }
  return std::string();
}

std::string encode_meta(const Meta &m) {
  rapidjson::StringBuffer buf;
  rapidjson::Writer<rapidjson::StringBuffer> w(buf);
  auto s = [&](const std::string &v) { w.String(v.data(), static_cast<rapidjson::SizeType>(v.size())); };
  w.StartObject();
  w.Key("owner");
  s(m.owner);
  w.Key("tenant");
  s(m.tenant);
  if (m.has_prev) {
    w.Key("prev");
    w.StartObject();
    w.Key("owner");
    s(m.prev_owner);
    w.Key("tenant");
    s(m.prev_tenant);
    w.Key("sha256");
    s(m.prev_sha);
    w.EndObject();
  }
  w.EndObject();
  std::string out(buf.GetString(), buf.GetSize());
  out.push_back('\n');
  return out;
}

}  // namespace toolnexus::file_plugin

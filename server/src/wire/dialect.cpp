// The v0.3 and v1.0 views of the stored Task form (see dialect.hpp).
#include "wire/dialect.hpp"

#include "wire/jsonrpc.hpp"
#include "toolnexus/task.hpp"
#include "common/util.hpp"
#include "domain/task_timeline.hpp"

#include <rapidjson/memorystream.h>
#include <rapidjson/reader.h>

#include <array>
#include <cctype>
#include <utility>

namespace toolnexus::server_detail {

namespace {

std::string_view sv(const rapidjson::Value &v) noexcept { return {v.GetString(), v.GetStringLength()}; }

void put_string(JsonWriter &w, std::string_view s) {
  w.String(s.data(), static_cast<rapidjson::SizeType>(s.size()));
}

void put_key(JsonWriter &w, std::string_view s) { w.Key(s.data(), static_cast<rapidjson::SizeType>(s.size())); }

// obj[name] when it is a string: writes "key": value.
void copy_string(JsonWriter &w, const rapidjson::Value &obj, std::string_view name, std::string_view key) {
  const rapidjson::Value *v = find(obj, name);
  if (v == nullptr || !v->IsString()) return;
  put_key(w, key);
  v->Accept(w);
}

// obj[name] whatever it is (not null): writes "key": value.
void copy_value(JsonWriter &w, const rapidjson::Value &obj, std::string_view name, std::string_view key) {
  const rapidjson::Value *v = find(obj, name);
  if (v == nullptr || v->IsNull()) return;
  put_key(w, key);
  v->Accept(w);
}

// obj[name] when it is a non-empty array (ProtoJSON leaves empty lists out).
void copy_array(JsonWriter &w, const rapidjson::Value &obj, std::string_view name) {
  const rapidjson::Value *v = find(obj, name);
  if (v == nullptr || !v->IsArray() || v->Empty()) return;
  put_key(w, name);
  v->Accept(w);
}

bool has_public_metadata(const rapidjson::Value &md) {
  for (auto it = md.MemberBegin(); it != md.MemberEnd(); ++it)
    if (!is_private_metadata_key(sv(it->name))) return true;
  return false;
}

// "metadata": the Task's metadata less private keys; nothing when empty.
void write_public_metadata(JsonWriter &w, const rapidjson::Value &md) {
  if (!md.IsObject()) {
    if (md.IsNull()) return;
    put_key(w, "metadata");
    md.Accept(w);
    return;
  }
  if (!has_public_metadata(md)) return;
  put_key(w, "metadata");
  w.StartObject();
  for (auto it = md.MemberBegin(); it != md.MemberEnd(); ++it) {
    if (is_private_metadata_key(sv(it->name))) continue;
    w.Key(it->name.GetString(), it->name.GetStringLength());
    it->value.Accept(w);
  }
  w.EndObject();
}

std::string_view role_to_v1(std::string_view role) noexcept {
  if (role == "user") return "ROLE_USER";
  if (role == "agent") return "ROLE_AGENT";
  return "ROLE_UNSPECIFIED";
}

// A stored part's kind: its "kind", else the member that carries content.
std::string_view part_kind(const rapidjson::Value &p) noexcept {
  const std::string_view kind = str(find(p, "kind"));
  if (!kind.empty()) return kind;
  if (find(p, "text") != nullptr) return "text";
  if (find(p, "file") != nullptr) return "file";
  if (find(p, "data") != nullptr) return "data";
  return {};
}

// A stored data part's wrapped value (see kWrappedValueKey): the V of
// "data": {"value": V} when its metadata marks it, else nullptr.
const rapidjson::Value *wrapped_value(const rapidjson::Value &p) {
  const rapidjson::Value *md = find(p, "metadata");
  const rapidjson::Value *mark = md != nullptr && md->IsObject() ? find(*md, kWrappedValueKey) : nullptr;
  const rapidjson::Value *data = find(p, "data");
  if (mark == nullptr || !mark->IsTrue() || data == nullptr || !data->IsObject() || data->MemberCount() != 1)
    return nullptr;
  return find(*data, "value");
}

// A part's metadata less kWrappedValueKey; nothing when that leaves it empty.
void write_metadata_unwrapped(JsonWriter &w, const rapidjson::Value &md) {
  if (md.MemberCount() == 1) return;
  put_key(w, "metadata");
  w.StartObject();
  for (auto it = md.MemberBegin(); it != md.MemberEnd(); ++it) {
    if (sv(it->name) == kWrappedValueKey) continue;
    w.Key(it->name.GetString(), it->name.GetStringLength());
    it->value.Accept(w);
  }
  w.EndObject();
}

void write_part_v1(JsonWriter &w, const rapidjson::Value &p) {
  w.StartObject();
  if (p.IsObject()) {
    const std::string_view kind = part_kind(p);
    std::string_view media_type = str(find(p, "mediaType"));
    std::string_view filename;
    const rapidjson::Value *unwrapped = kind == "data" ? wrapped_value(p) : nullptr;
    if (kind == "text") {
      copy_value(w, p, "text", "text");
    } else if (kind == "file") {
      if (const rapidjson::Value *f = find(p, "file"); f != nullptr && f->IsObject()) {
        if (find(*f, "bytes") != nullptr) copy_value(w, *f, "bytes", "raw");
        else copy_value(w, *f, "uri", "url");
        if (const std::string_view mt = str(find(*f, "mimeType")); !mt.empty()) media_type = mt;
        filename = str(find(*f, "name"));
      }
    } else if (kind == "data") {
      if (unwrapped != nullptr) {
        put_key(w, "data");
        unwrapped->Accept(w);
      } else {
        copy_value(w, p, "data", "data");
      }
    }
    if (unwrapped != nullptr) write_metadata_unwrapped(w, *find(p, "metadata"));
    else copy_value(w, p, "metadata", "metadata");
    if (!filename.empty()) {
      put_key(w, "filename");
      put_string(w, filename);
    }
    if (!media_type.empty()) {
      put_key(w, "mediaType");
      put_string(w, media_type);
    }
  }
  w.EndObject();
}

void write_parts_v1(JsonWriter &w, const rapidjson::Value &obj) {
  const rapidjson::Value *parts = find(obj, "parts");
  put_key(w, "parts");
  w.StartArray();
  if (parts != nullptr && parts->IsArray())
    for (const auto &p : parts->GetArray()) write_part_v1(w, p);
  w.EndArray();
}

void write_message_v1(JsonWriter &w, const rapidjson::Value &m) {
  w.StartObject();
  if (m.IsObject()) {
    copy_string(w, m, "messageId", "messageId");
    copy_string(w, m, "contextId", "contextId");
    copy_string(w, m, "taskId", "taskId");
    put_key(w, "role");
    put_string(w, role_to_v1(str(find(m, "role"))));
    write_parts_v1(w, m);
    copy_value(w, m, "metadata", "metadata");
    copy_array(w, m, "extensions");
    copy_array(w, m, "referenceTaskIds");
  }
  w.EndObject();
}

void write_artifact_v1(JsonWriter &w, const rapidjson::Value &a) {
  w.StartObject();
  if (a.IsObject()) {
    copy_string(w, a, "artifactId", "artifactId");
    copy_string(w, a, "name", "name");
    copy_string(w, a, "description", "description");
    write_parts_v1(w, a);
    copy_value(w, a, "metadata", "metadata");
    copy_array(w, a, "extensions");
  }
  w.EndObject();
}

void write_status_v1(JsonWriter &w, const rapidjson::Value &s) {
  w.StartObject();
  put_key(w, "state");
  put_string(w, state_to_v1(str(find(s, "state"))));
  if (const rapidjson::Value *m = find(s, "message"); m != nullptr && m->IsObject()) {
    put_key(w, "message");
    write_message_v1(w, *m);
  }
  if (const rapidjson::Value *t = find(s, "timestamp"); t != nullptr && t->IsString()) {
    put_key(w, "timestamp");
    put_string(w, timestamp_to_v1(sv(*t)));
  }
  w.EndObject();
}

// The first message of `history` a view shows.
rapidjson::SizeType history_start(const rapidjson::Value &h, int64_t history_length) {
  const rapidjson::SizeType n = h.Size();
  if (history_length < 0 || static_cast<uint64_t>(history_length) >= n) return 0;
  return n - static_cast<rapidjson::SizeType>(history_length);
}

void write_task_v03(JsonWriter &w, const rapidjson::Value &task, const TaskView &view) {
  w.StartObject();
  for (auto it = task.MemberBegin(); it != task.MemberEnd(); ++it) {
    const std::string_view name = sv(it->name);
    const rapidjson::Value &v = it->value;
    if (name == "artifacts" && !view.include_artifacts) continue;
    if (name == "metadata") {
      write_public_metadata(w, v);
      continue;
    }
    w.Key(it->name.GetString(), it->name.GetStringLength());
    if (name == "history" && v.IsArray() && view.history_length >= 0) {
      w.StartArray();
      for (auto i = history_start(v, view.history_length); i < v.Size(); ++i) v[i].Accept(w);
      w.EndArray();
      continue;
    }
    v.Accept(w);
  }
  w.EndObject();
}

void write_task_v1(JsonWriter &w, const rapidjson::Value &task, const TaskView &view, bool generation) {
  w.StartObject();
  copy_string(w, task, "id", "id");
  copy_string(w, task, "contextId", "contextId");
  if (const rapidjson::Value *s = find(task, "status"); s != nullptr && s->IsObject()) {
    put_key(w, "status");
    write_status_v1(w, *s);
  }
  if (generation) {
    put_key(w, "generation");
    w.Uint64(generation_of(task));
  }
  if (const rapidjson::Value *a = find(task, "artifacts");
      view.include_artifacts && a != nullptr && a->IsArray() && !a->Empty()) {
    put_key(w, "artifacts");
    w.StartArray();
    for (const auto &art : a->GetArray()) write_artifact_v1(w, art);
    w.EndArray();
  }
  if (const rapidjson::Value *h = find(task, "history"); h != nullptr && h->IsArray()) {
    const rapidjson::SizeType start = history_start(*h, view.history_length);
    if (start < h->Size()) {
      put_key(w, "history");
      w.StartArray();
      for (auto i = start; i < h->Size(); ++i) write_message_v1(w, (*h)[i]);
      w.EndArray();
    }
  }
  if (const rapidjson::Value *md = find(task, "metadata")) write_public_metadata(w, *md);
  w.EndObject();
}

// SAX filter for filter_stored_task_v03: copies events to a writer, leaving
// out private members of the top-level "metadata" object (and "metadata"
// itself when nothing public is in it), stops at nesting deeper than
// kMaxTaskDepth (which Task::parse and parse_stored refuse), records the
// top-level "id", and
// notes what a2a_task_problem() asks of a served Task (a non-empty string
// "contextId", a "status" object with a "state", "kind" "task" if present).
template <class Writer>
struct StoredTaskFilter {
  explicit StoredTaskFilter(Writer &writer) : w(writer) {}

  Writer &w;
  // The A2A shape (a2a_ok()): which top-level member's value comes next.
  enum class Top { other, context_id, status, kind };
  Top top = Top::other;
  bool in_status = false;  // directly inside the top-level status object
  bool has_context = false;
  bool has_state = false;
  bool kind_ok = true;
  bool a2a_ok() const { return has_context && has_state && kind_ok; }
  // A scalar value at `depth`: a string (`s`) or not (nullptr).
  void shape_scalar(const char *s, rapidjson::SizeType n) {
    if (depth != 1) return;
    if (top == Top::context_id && s != nullptr && n > 0) has_context = true;
    if (top == Top::kind) kind_ok = s != nullptr && std::string_view(s, n) == "task";
    top = Top::other;
  }
  // An object or array opened, `depth` already counting it.
  void shape_open(bool object) {
    if (depth != 2) return;
    if (top == Top::status && object) in_status = true;
    if (top == Top::kind) kind_ok = false;
    top = Top::other;
  }
  // A member named twice counts once, the first time, as a2a_task_problem()
  // reads it (RapidJSON's FindMember returns the first of equal names).
  bool seen_context = false, seen_status = false, seen_kind = false;
  void shape_key(std::string_view k) {
    if (depth == 1) {
      top = Top::other;
      if (k == "contextId" && !std::exchange(seen_context, true)) top = Top::context_id;
      else if (k == "status" && !std::exchange(seen_status, true)) top = Top::status;
      else if (k == "kind" && !std::exchange(seen_kind, true)) top = Top::kind;
    } else if (depth == 2 && in_status && k == "state") {
      has_state = true;
    }
  }
  int depth = 0;           // nesting of the event being handled
  int skip = 0;            // > 0: inside a skipped value, this many levels deep
  bool skip_scalar = false;  // the next scalar value is skipped
  bool next_is_id = false;
  bool next_is_metadata = false;
  bool in_metadata = false;  // directly inside the top-level metadata object
  bool metadata_open = false;
  bool seen_id = false;
  std::string id;

  // Returns true when the event belongs to a skipped value (and swallows it).
  bool skipping_scalar() {
    if (skip > 0) return true;
    if (skip_scalar) {
      skip_scalar = false;
      return true;
    }
    return false;
  }
  bool scalar_pending_metadata() {
    // "metadata" whose value is not an object: shown as is.
    if (next_is_metadata) {
      w.Key("metadata", 8);
      next_is_metadata = false;
    }
    return true;
  }
  bool Null() {
    next_is_id = false;
    shape_scalar(nullptr, 0);
    if (skipping_scalar()) return true;
    if (next_is_metadata) {  // "metadata": null is left out
      next_is_metadata = false;
      return true;
    }
    return w.Null();
  }
  bool Bool(bool b) {
    next_is_id = false;
    shape_scalar(nullptr, 0);
    if (skipping_scalar()) return true;
    scalar_pending_metadata();
    return w.Bool(b);
  }
  bool Int(int) { return false; }  // numbers arrive as RawNumber (kParseNumbersAsStringsFlag)
  bool Uint(unsigned) { return false; }
  bool Int64(int64_t) { return false; }
  bool Uint64(uint64_t) { return false; }
  bool Double(double) { return false; }
  bool RawNumber(const char *s, rapidjson::SizeType n, bool) {
    next_is_id = false;
    shape_scalar(nullptr, 0);
    if (skipping_scalar()) return true;
    scalar_pending_metadata();
    // Verbatim (Writer::RawNumber would quote it).
    return w.RawValue(s, n, rapidjson::kNumberType);
  }
  bool String(const char *s, rapidjson::SizeType n, bool) {
    shape_scalar(s, n);
    if (next_is_id && !seen_id) {
      id.assign(s, n);
      seen_id = true;
    }
    next_is_id = false;
    if (skipping_scalar()) return true;
    scalar_pending_metadata();
    return w.String(s, n);
  }
  bool Key(const char *s, rapidjson::SizeType n, bool) {
    if (skip > 0) return true;
    const std::string_view k(s, n);
    shape_key(k);
    if (depth == 1) {
      next_is_id = k == "id";
      if (k == "metadata") {
        next_is_metadata = true;
        return true;
      }
    } else if (in_metadata && depth == 2) {
      if (is_private_metadata_key(k)) {
        skip_scalar = true;  // StartObject/StartArray turn it into a nested skip
        return true;
      }
      if (!metadata_open) {
        w.Key("metadata", 8);
        w.StartObject();
        metadata_open = true;
      }
    }
    return w.Key(s, n);
  }
  bool StartObject() {
    if (++depth > kMaxTaskDepth) return false;  // as every other read refuses it
    next_is_id = false;
    shape_open(true);
    if (skip > 0 || skip_scalar) {
      skip_scalar = false;
      ++skip;
      return true;
    }
    if (next_is_metadata) {
      next_is_metadata = false;
      in_metadata = true;  // written lazily, at its first public member
      return true;
    }
    return w.StartObject();
  }
  bool EndObject(rapidjson::SizeType) {
    --depth;
    if (depth == 1) in_status = false;
    if (skip > 0) {
      --skip;
      return true;
    }
    if (in_metadata && depth == 1) {
      in_metadata = false;
      if (!metadata_open) return true;
      metadata_open = false;
    }
    return w.EndObject();
  }
  bool StartArray() {
    if (++depth > kMaxTaskDepth) return false;
    next_is_id = false;
    shape_open(false);
    if (skip > 0 || skip_scalar) {
      skip_scalar = false;
      ++skip;
      return true;
    }
    scalar_pending_metadata();
    return w.StartArray();
  }
  bool EndArray(rapidjson::SizeType) {
    --depth;
    if (skip > 0) {
      --skip;
      return true;
    }
    return w.EndArray();
  }
};

// ---------------------------------------------------------------------------
// v1.0 input
// ---------------------------------------------------------------------------

[[noreturn]] void bad(const std::string &field, const std::string &what) {
  throw RpcError(rpc_code::kInvalidParams, "invalid params: " + field + " " + what, field);
}

// obj[name]; null counts as absent. (Proto names were renamed to JSON
// names before: accept_proto_names.)
const rapidjson::Value *member(const rapidjson::Value &obj, std::string_view name) {
  const rapidjson::Value *v = find(obj, name);
  return v == nullptr || v->IsNull() ? nullptr : v;
}

rapidjson::Value copy_of(const rapidjson::Value &v, rapidjson::Document::AllocatorType &a) {
  return rapidjson::Value(v, a);
}

std::optional<std::string_view> opt_str(const rapidjson::Value &obj, std::string_view name, const std::string &field) {
  const rapidjson::Value *v = member(obj, name);
  if (v == nullptr) return std::nullopt;
  if (!v->IsString()) bad(field, "must be a string");
  return sv(*v);
}

void check_string_list(const rapidjson::Value &v, const std::string &field) {
  if (!v.IsArray()) bad(field, "must be an array of strings");
  for (const auto &e : v.GetArray())
    if (!e.IsString()) bad(field, "must be an array of strings");
}

bool is_base64(std::string_view s) noexcept {
  std::size_t pad = 0;
  for (char c : s) {
    const bool alnum = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
    if (c == '=') {
      ++pad;
      continue;
    }
    if (pad != 0) return false;  // '=' only at the end
    if (!alnum && c != '+' && c != '/' && c != '-' && c != '_') return false;
  }
  return pad <= 2;
}

rapidjson::Value part_from_v1(const rapidjson::Value &p, const std::string &pf, rapidjson::Document::AllocatorType &a) {
  if (!p.IsObject()) bad(pf, "must be an object");
  const rapidjson::Value *text = member(p, "text");
  const rapidjson::Value *raw = member(p, "raw");
  const rapidjson::Value *url = member(p, "url");
  const rapidjson::Value *data = find(p, "data");  // a JSON null is data too
  const int contents = (text != nullptr) + (raw != nullptr) + (url != nullptr) + (data != nullptr);
  if (contents != 1) {
    if (find(p, "kind") != nullptr && contents == 0)
      bad(pf, "is a v0.3 part (\"kind\"); A2A 1.0 parts have exactly one of text, raw, url or data "
              "(send no A2A-Version header to speak 0.3)");
    bad(pf, contents == 0 ? "must have one of text, raw, url or data"
                          : "must have exactly one of text, raw, url or data, not several");
  }
  const auto media_type = opt_str(p, "mediaType", pf + ".mediaType");
  const auto filename = opt_str(p, "filename", pf + ".filename");
  const rapidjson::Value *md = member(p, "metadata");
  if (md != nullptr && !md->IsObject()) bad(pf + ".metadata", "must be an object");
  if (md != nullptr && find(*md, kWrappedValueKey) != nullptr)
    bad(pf + ".metadata." + std::string(kWrappedValueKey),
        "is reserved: the server marks with it a data value it shows A2A 0.3 clients wrapped in an object");
  // A data value that is no object: stored wrapped, marked in the metadata.
  const bool wrap = data != nullptr && !data->IsObject();

  rapidjson::Value out(rapidjson::kObjectType);
  if (text != nullptr) {
    if (!text->IsString()) bad(pf + ".text", "must be a string");
    out.AddMember("kind", "text", a);
    out.AddMember("text", copy_of(*text, a), a);
    if (media_type && !media_type->empty()) out.AddMember("mediaType", make_string(*media_type, a), a);
  } else if (data != nullptr) {
    out.AddMember("kind", "data", a);
    if (wrap) {
      rapidjson::Value boxed(rapidjson::kObjectType);
      boxed.AddMember("value", copy_of(*data, a), a);
      out.AddMember("data", boxed, a);
    } else {
      out.AddMember("data", copy_of(*data, a), a);
    }
    if (media_type && !media_type->empty()) out.AddMember("mediaType", make_string(*media_type, a), a);
  } else {
    rapidjson::Value file(rapidjson::kObjectType);
    if (raw != nullptr) {
      if (!raw->IsString() || !is_base64(sv(*raw))) bad(pf + ".raw", "must be a base64 string");
      file.AddMember("bytes", copy_of(*raw, a), a);
    } else {
      if (!url->IsString() || url->GetStringLength() == 0) bad(pf + ".url", "must be a non-empty string");
      file.AddMember("uri", copy_of(*url, a), a);
    }
    if (media_type && !media_type->empty()) file.AddMember("mimeType", make_string(*media_type, a), a);
    if (filename && !filename->empty()) file.AddMember("name", make_string(*filename, a), a);
    out.AddMember("kind", "file", a);
    out.AddMember("file", file, a);
  }
  if (md != nullptr || wrap) {
    rapidjson::Value meta = md != nullptr ? copy_of(*md, a) : rapidjson::Value(rapidjson::kObjectType);
    if (wrap) meta.AddMember(make_string(kWrappedValueKey, a), rapidjson::Value(true), a);
    out.AddMember("metadata", meta, a);
  }
  return out;
}

// The JSON name of a proto field name (protoc's ToJsonName): "_" dropped,
// the character after it upper-cased.
std::string json_name(std::string_view proto) {
  std::string out;
  out.reserve(proto.size());
  bool upper = false;
  for (char c : proto) {
    if (c == '_') {
      upper = true;
      continue;
    }
    out += upper ? static_cast<char>(std::toupper(static_cast<unsigned char>(c))) : c;
    upper = false;
  }
  return out;
}

}  // namespace

const char *dialect_name(Dialect d) noexcept {
  switch (d) {
    case Dialect::v0_3: return "0.3";
    case Dialect::v1_0: return "1.0";
    case Dialect::v1_1: return "1.1";
  }
  return "1.0";
}

std::optional<Dialect> dialect_for_version(std::string_view v, Dialect absent) noexcept {
  while (!v.empty() && (v.front() == ' ' || v.front() == '\t')) v.remove_prefix(1);
  while (!v.empty() && (v.back() == ' ' || v.back() == '\t')) v.remove_suffix(1);
  if (v.empty()) return absent;
  // MAJOR[.MINOR[.PATCH]], each a run of digits.
  std::array<std::string_view, 3> part{};
  std::size_t n = 0;
  while (n < part.size()) {
    const auto dot = v.find('.');
    part[n++] = v.substr(0, dot);
    if (dot == std::string_view::npos) {
      v = {};
      break;
    }
    v.remove_prefix(dot + 1);
  }
  if (!v.empty()) return std::nullopt;
  for (std::size_t i = 0; i < n; ++i) {
    if (part[i].empty() || part[i].size() > 9) return std::nullopt;
    for (char c : part[i])
      if (c < '0' || c > '9') return std::nullopt;
  }
  auto num = [](std::string_view s) {
    long x = 0;
    for (char c : s) x = x * 10 + (c - '0');
    return x;
  };
  const long major = num(part[0]);
  const long minor = n > 1 ? num(part[1]) : 0;
  if (major == 0) return Dialect::v0_3;
  if (major == 1 && minor == 0) return Dialect::v1_0;
  if (major == 1 && minor == 1) return Dialect::v1_1;
  return std::nullopt;
}

bool is_private_metadata_key(std::string_view key) noexcept { return key.substr(0, 10) == "toolnexus/"; }

std::string_view state_to_v1(std::string_view s) noexcept {
  if (s == "submitted") return "TASK_STATE_SUBMITTED";
  if (s == "working") return "TASK_STATE_WORKING";
  if (s == "input-required") return "TASK_STATE_INPUT_REQUIRED";
  if (s == "auth-required") return "TASK_STATE_AUTH_REQUIRED";
  if (s == "completed") return "TASK_STATE_COMPLETED";
  if (s == "canceled") return "TASK_STATE_CANCELED";
  if (s == "failed") return "TASK_STATE_FAILED";
  if (s == "rejected") return "TASK_STATE_REJECTED";
  return "TASK_STATE_UNSPECIFIED";
}

std::optional<std::string> state_from_any(std::string_view s) {
  if (task_state::is_known(s)) return std::string(s);
  constexpr std::string_view prefix = "TASK_STATE_";
  if (s.substr(0, prefix.size()) != prefix) return std::nullopt;
  std::string out;
  for (char c : s.substr(prefix.size()))
    out += c == '_' ? '-' : static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (out == "cancelled") out = "canceled";
  if (out == "unspecified") out = "unknown";
  if (!task_state::is_known(out)) return std::nullopt;
  return out;
}

std::string timestamp_to_v1(std::string_view stored) {
  int64_t us = 0;
  if (!parse_timestamp(stored, us)) return std::string(stored);
  // Floor to the millisecond, also before 1970; then the first 23
  // characters of the RFC 3339 microsecond form. (Poco's formatter wrote
  // "0001-01-01T-23:-59:-59.-500Z" for times before 1582-10-15.)
  const int64_t ms = us >= 0 ? us / 1000 : -((-us + 999) / 1000);
  std::string text = format_timestamp(ms * 1000);
  if (text.size() != 27) return std::string(stored);  // a year outside 0000..9999: no RFC 3339 form
  text.resize(23);
  text += 'Z';
  return text;
}

void write_task(JsonWriter &w, const rapidjson::Value &task, Dialect d, const TaskView &view) {
  if (is_v1(d)) write_task_v1(w, task, view, d == Dialect::v1_1);
  else write_task_v03(w, task, view);
}

void write_message(JsonWriter &w, const rapidjson::Value &message, Dialect d) {
  if (is_v1(d)) write_message_v1(w, message);
  else message.Accept(w);
}

void write_status(JsonWriter &w, const rapidjson::Value &status, Dialect d) {
  if (is_v1(d)) write_status_v1(w, status);
  else status.Accept(w);
}

void write_artifact(JsonWriter &w, const rapidjson::Value &artifact, Dialect d) {
  if (is_v1(d)) write_artifact_v1(w, artifact);
  else artifact.Accept(w);
}

namespace {

// Writes nothing: StoredTaskFilter<NullWriter> only checks (is_stored_task_of).
struct NullWriter {
  bool Null() { return true; }
  bool Bool(bool) { return true; }
  bool RawValue(const char *, rapidjson::SizeType, rapidjson::Type) { return true; }
  bool String(const char *, rapidjson::SizeType) { return true; }
  bool Key(const char *, rapidjson::SizeType) { return true; }
  bool StartObject() { return true; }
  bool EndObject() { return true; }
  bool StartArray() { return true; }
  bool EndArray() { return true; }
  bool IsComplete() const { return true; }
};

template <class Writer>
bool run_stored_task_filter(std::string_view json, std::string_view id, Writer &w) {
  std::size_t i = 0;
  while (i < json.size() && (json[i] == ' ' || json[i] == '\n' || json[i] == '\r' || json[i] == '\t')) ++i;
  if (i == json.size() || json[i] != '{') return false;
  StoredTaskFilter<Writer> filter(w);
  rapidjson::MemoryStream in(json.data(), json.size());
  rapidjson::Reader reader;
  constexpr unsigned kFlags =
      rapidjson::kParseIterativeFlag | rapidjson::kParseValidateEncodingFlag | rapidjson::kParseNumbersAsStringsFlag;
  const rapidjson::ParseResult ok = reader.Parse<kFlags>(in, filter);
  if (ok.IsError()) return false;
  // Nothing but blanks may follow the object.
  for (std::size_t p = in.Tell(); p < json.size(); ++p)
    if (json[p] != ' ' && json[p] != '\n' && json[p] != '\r' && json[p] != '\t') return false;
  return filter.seen_id && filter.id == id && filter.a2a_ok() && w.IsComplete();
}

}  // namespace

bool filter_stored_task_v03(std::string_view json, std::string_view id, rapidjson::StringBuffer &out) {
  // A lone surrogate escape (\udc00) would be served as invalid UTF-8:
  // such bytes take the parsing path, which refuses them (found by fuzzing).
  if (lone_surrogate_escape(json) != std::string_view::npos) return false;
  JsonWriter w(out);
  return run_stored_task_filter(json, id, w);
}

bool is_stored_task_of(std::string_view json, std::string_view id) {
  if (lone_surrogate_escape(json) != std::string_view::npos) return false;
  NullWriter w;
  return run_stored_task_filter(json, id, w);
}

void accept_proto_names(rapidjson::Value &v, const std::string &base, rapidjson::Document::AllocatorType &a) {
  if (v.IsArray()) {
    for (rapidjson::SizeType i = 0; i < v.Size(); ++i)
      if (v[i].IsObject() || v[i].IsArray()) accept_proto_names(v[i], base + "[" + std::to_string(i) + "]", a);
    return;
  }
  if (!v.IsObject()) return;
  for (auto it = v.MemberBegin(); it != v.MemberEnd(); ++it) {
    if (const std::string_view key = sv(it->name); key.find('_') != std::string_view::npos) {
      const std::string name = json_name(key);
      if (!name.empty()) {
        if (find(v, name) != nullptr)
          bad(base + "." + name, "is given twice, as \"" + name + "\" and as \"" + std::string(key) +
                                     "\" (its proto name); send one of them");
        it->name.SetString(name.data(), static_cast<rapidjson::SizeType>(name.size()), a);
      }
    }
    const std::string_view name = sv(it->name);
    if (name == "metadata" || name == "data") continue;  // free-form: the client's keys
    if (it->value.IsObject() || it->value.IsArray()) accept_proto_names(it->value, base + "." + std::string(name), a);
  }
}

rapidjson::Value message_from_v1(const rapidjson::Value &m, const std::string &base,
                                 rapidjson::Document::AllocatorType &a) {
  if (!m.IsObject()) bad(base, "must be an object");
  rapidjson::Value out(rapidjson::kObjectType);

  const rapidjson::Value *role = member(m, "role");
  if (role == nullptr) bad(base + ".role", "is required (\"ROLE_USER\" or \"ROLE_AGENT\")");
  const std::string_view r = role->IsString() ? sv(*role) : std::string_view();
  if (r == "ROLE_USER") out.AddMember("role", "user", a);
  else if (r == "ROLE_AGENT") out.AddMember("role", "agent", a);
  else if (r == "user" || r == "agent")
    bad(base + ".role", "must be \"ROLE_USER\" or \"ROLE_AGENT\" in A2A 1.0 (\"" + std::string(r) +
                            "\" is the 0.3 spelling; send no A2A-Version header to speak 0.3)");
  else bad(base + ".role", "must be \"ROLE_USER\" or \"ROLE_AGENT\"");

  const rapidjson::Value *parts = member(m, "parts");
  if (parts == nullptr) bad(base + ".parts", "is required");
  if (!parts->IsArray() || parts->Empty()) bad(base + ".parts", "must be a non-empty array of parts");
  rapidjson::Value stored_parts(rapidjson::kArrayType);
  for (rapidjson::SizeType i = 0; i < parts->Size(); ++i)
    stored_parts.PushBack(part_from_v1((*parts)[i], base + ".parts[" + std::to_string(i) + "]", a), a);
  out.AddMember("parts", stored_parts, a);

  const auto message_id = opt_str(m, "messageId", base + ".messageId");
  if (!message_id) bad(base + ".messageId", "is required");
  if (message_id->empty()) bad(base + ".messageId", "must not be empty");
  out.AddMember("messageId", make_string(*message_id, a), a);
  if (auto t = opt_str(m, "taskId", base + ".taskId"); t && !t->empty())
    out.AddMember("taskId", make_string(*t, a), a);
  if (auto c = opt_str(m, "contextId", base + ".contextId"); c && !c->empty())
    out.AddMember("contextId", make_string(*c, a), a);
  if (const rapidjson::Value *md = member(m, "metadata")) {
    if (!md->IsObject()) bad(base + ".metadata", "must be an object");
    out.AddMember("metadata", copy_of(*md, a), a);
  }
  if (const rapidjson::Value *ext = member(m, "extensions")) {
    check_string_list(*ext, base + ".extensions");
    out.AddMember("extensions", copy_of(*ext, a), a);
  }
  if (const rapidjson::Value *refs = member(m, "referenceTaskIds")) {
    check_string_list(*refs, base + ".referenceTaskIds");
    out.AddMember("referenceTaskIds", copy_of(*refs, a), a);
  }
  out.AddMember("kind", "message", a);
  return out;
}

}  // namespace toolnexus::server_detail

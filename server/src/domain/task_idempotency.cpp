// Idempotent SendMessage retries: Task ids from (tenant, principal,
// contextId, messageId), message digests, and the recentMessages list.
#include "domain/task_idempotency.hpp"

#include "common/util.hpp"

#include <Poco/DigestEngine.h>
#include <Poco/SHA1Engine.h>
#include <Poco/SHA2Engine.h>
#include <Poco/UUID.h>
#include <Poco/UUIDGenerator.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include <algorithm>
#include <vector>

namespace toolnexus::server_detail {

namespace {

using Writer = rapidjson::Writer<rapidjson::StringBuffer>;

void write_canonical(Writer &w, const rapidjson::Value &v, bool top) {
  if (v.IsObject()) {
    std::vector<rapidjson::Value::ConstMemberIterator> members;
    for (auto it = v.MemberBegin(); it != v.MemberEnd(); ++it) {
      const std::string_view name(it->name.GetString(), it->name.GetStringLength());
      if (top && (name == "taskId" || name == "contextId" || name == "kind")) continue;
      members.push_back(it);
    }
    std::stable_sort(members.begin(), members.end(), [](const auto &x, const auto &y) {
      return std::string_view(x->name.GetString(), x->name.GetStringLength()) <
             std::string_view(y->name.GetString(), y->name.GetStringLength());
    });
    w.StartObject();
    for (const auto &m : members) {
      w.Key(m->name.GetString(), m->name.GetStringLength());
      write_canonical(w, m->value, false);
    }
    w.EndObject();
  } else if (v.IsArray()) {
    w.StartArray();
    for (const auto &e : v.GetArray()) write_canonical(w, e, false);
    w.EndArray();
  } else {
    v.Accept(w);
  }
}

void add_name_part(std::string &name, std::string_view part) {
  name += std::to_string(part.size());
  name += ':';
  name.append(part.data(), part.size());
}

}  // namespace

std::string idempotent_task_id(std::string_view tenant, std::string_view principal, std::string_view context_id,
                               std::string_view message_id) {
  static const Poco::UUID ns(kIdempotencyNamespace);
  std::string name;
  add_name_part(name, tenant);
  add_name_part(name, principal);
  add_name_part(name, context_id);
  add_name_part(name, message_id);
  Poco::SHA1Engine sha1;
  return Poco::UUIDGenerator::defaultGenerator().createFromName(ns, name, sha1).toString();
}

std::string message_digest(const rapidjson::Value &message) {
  rapidjson::StringBuffer b;
  Writer w(b);
  write_canonical(w, message, true);
  Poco::SHA2Engine sha(Poco::SHA2Engine::SHA_256);
  sha.update(b.GetString(), static_cast<unsigned>(b.GetSize()));
  return Poco::DigestEngine::digestToHex(sha.digest());
}

namespace {

// The entry's time, or false when it is malformed.
bool entry_time(const rapidjson::Value &e, int64_t &at) {
  return e.IsObject() && parse_timestamp(str(find(e, "at")), at);
}

}  // namespace

SeenMessage seen_message(const Task &task, std::string_view message_id, std::string_view digest, int64_t now_us,
                         int64_t window_ms) {
  const rapidjson::Value *list = task_metadata(task, kRecentMessagesKey);
  if (list == nullptr || !list->IsArray()) return SeenMessage::no;
  const int64_t oldest = now_us - window_ms * 1000;
  SeenMessage seen = SeenMessage::no;
  for (const auto &e : list->GetArray()) {
    int64_t at = 0;
    if (!entry_time(e, at) || at < oldest || str(find(e, "messageId")) != message_id) continue;
    if (str(find(e, "digest")) == digest) return SeenMessage::same;
    seen = SeenMessage::different;
  }
  return seen;
}

void remember_message(Task &task, std::string_view message_id, std::string_view digest, int64_t now_us,
                      const IdempotencyRules &rules) {
  auto &a = task.allocator();
  const int64_t oldest = now_us - rules.window_ms * 1000;
  rapidjson::Value kept(rapidjson::kArrayType);
  if (const rapidjson::Value *list = task_metadata(task, kRecentMessagesKey); list != nullptr && list->IsArray()) {
    for (const auto &e : list->GetArray()) {
      int64_t at = 0;
      if (entry_time(e, at) && at >= oldest) kept.PushBack(rapidjson::Value(e, a), a);
    }
  }
  rapidjson::Value entry(rapidjson::kObjectType);
  entry.AddMember("messageId", make_string(message_id, a), a);
  entry.AddMember("digest", make_string(digest, a), a);
  entry.AddMember("at", make_string(format_timestamp(now_us), a), a);
  kept.PushBack(entry, a);
  const std::size_t max = std::max<std::size_t>(rules.recent_messages, 1);
  if (kept.Size() > max) kept.Erase(kept.Begin(), kept.Begin() + static_cast<rapidjson::SizeType>(kept.Size() - max));
  set_task_metadata(task, kRecentMessagesKey, std::move(kept));
}

std::string reused_message_text(std::string_view message_id) {
  return "messageId " + in_quotes(message_id) + " was already used with a different message";
}

}  // namespace toolnexus::server_detail

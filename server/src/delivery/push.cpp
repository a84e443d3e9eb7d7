// Push notifications: configs stored with the Task, delivery with retries
// (see push.hpp).
#include "delivery/push.hpp"

#include "wire/jsonrpc.hpp"
#include "wire/sse.hpp"
#include "domain/task_lifecycle.hpp"
#include "common/util.hpp"
#include "toolnexus/task_store.h"

#include <Poco/Exception.h>
#include <Poco/Net/Context.h>
#include <Poco/Net/HTTPClientSession.h>
#include <Poco/Net/HTTPRequest.h>
#include <Poco/Net/HTTPResponse.h>
#include <Poco/Net/HTTPSClientSession.h>
#include <Poco/Net/SecureStreamSocket.h>
#include <Poco/Net/SocketAddress.h>
#include <Poco/URI.h>

#include <algorithm>
#include <istream>
#include <map>
#include <optional>
#include <random>

namespace toolnexus::server_detail {

namespace ts = toolnexus::task_state;

namespace {

[[noreturn]] void bad(const std::string &field, const std::string &what) {
  throw RpcError(rpc_code::kInvalidParams, "invalid params: " + field + " " + what, field);
}

// scheme://host:port of a webhook URL, for logs (its path and query may
// carry secrets).
std::string origin(std::string_view url) {
  try {
    Poco::URI u{std::string(url)};
    return u.getScheme() + "://" + u.getHost() + ":" + std::to_string(u.getPort());
  } catch (const Poco::Exception &) {
    return "(a webhook)";
  }
}

std::string lower(std::string s) {
  for (char &c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

rapidjson::Value *configs_of(Task &task) {
  rapidjson::Value *md = find(task.json(), "metadata");
  if (md == nullptr || !md->IsObject()) return nullptr;
  rapidjson::Value *push = find(*md, kPushKey);
  if (push == nullptr || !push->IsObject()) return nullptr;
  rapidjson::Value *c = find(*push, "configs");
  return c != nullptr && c->IsArray() ? c : nullptr;
}

const rapidjson::Value *configs_of(const Task &task) {
  const rapidjson::Value *push = task_metadata(task, kPushKey);
  if (push == nullptr || !push->IsObject()) return nullptr;
  const rapidjson::Value *c = find(*push, "configs");
  return c != nullptr && c->IsArray() ? c : nullptr;
}

uint64_t u64(const rapidjson::Value &obj, std::string_view name) {
  const rapidjson::Value *v = find(obj, name);
  return v != nullptr && v->IsUint64() ? v->GetUint64() : 0;
}

PushConfig config_from_stored(const rapidjson::Value &c) {
  PushConfig p;
  p.id = std::string(str(find(c, "id")));
  p.url = std::string(str(find(c, "url")));
  p.token = std::string(str(find(c, "token")));
  if (const rapidjson::Value *a = find(c, "authentication"); a != nullptr && a->IsObject()) {
    p.scheme = std::string(str(find(*a, "scheme")));
    p.credentials = std::string(str(find(*a, "credentials")));
  }
  const std::string_view dialect = str(find(c, "dialect"));
  p.dialect = dialect == "0.3" ? Dialect::v0_3 : dialect == "1.1" ? Dialect::v1_1 : Dialect::v1_0;
  return p;
}

// A config has a delivery due: events after "delivered", and it has not
// given up on them (a config that gave up takes events newer than those).
bool due(const rapidjson::Value &c, uint64_t seq) {
  const uint64_t delivered = u64(c, "delivered");
  if (delivered >= seq) return false;
  const rapidjson::Value *gave = find(c, "gaveUp");
  if (gave != nullptr && gave->IsBool() && gave->GetBool()) return seq > u64(c, "gaveUpSeq");
  return true;
}

int64_t next_attempt_us(const rapidjson::Value &c) {
  int64_t us = 0;
  const std::string_view t = str(find(c, "nextAttemptAt"));
  if (!t.empty() && parse_timestamp(t, us)) return us;
  return 0;
}

}  // namespace

int64_t push_due_us(const Task &task) {
  const rapidjson::Value *configs = configs_of(task);
  if (configs == nullptr) return kNoTime;
  const uint64_t seq = event_seq(task);
  int64_t earliest = kNoTime;
  for (const auto &c : configs->GetArray()) {
    if (!c.IsObject() || !due(c, seq)) continue;
    int64_t at = next_attempt_us(c);
    if (at == 0) at = task.status_time_us() != kNoTime ? task.status_time_us() : 1;
    if (earliest == kNoTime || at < earliest) earliest = at;
  }
  return earliest;
}

// ---------------------------------------------------------------------------
// Configs
// ---------------------------------------------------------------------------

PushConfig read_push_config(const rapidjson::Value &v, Dialect d, const std::string &field,
                            const TargetPolicy &policy) {
  if (!v.IsObject()) bad(field, "must be an object");
  PushConfig c;
  c.dialect = d;
  const rapidjson::Value *url = find(v, "url");
  if (url == nullptr || !url->IsString() || url->GetStringLength() == 0) bad(field + ".url", "is required");
  c.url.assign(url->GetString(), url->GetStringLength());
  if (c.url.size() > 2048) bad(field + ".url", "is longer than 2048 bytes");
  Poco::URI uri;
  try {
    uri = Poco::URI(c.url);
  } catch (const Poco::Exception &e) {
    bad(field + ".url", "is not a URL: " + e.message());
  }
  const std::string scheme = lower(uri.getScheme());
  if (scheme != "http" && scheme != "https") bad(field + ".url", "must be an http or https URL");
  if (uri.getHost().empty()) bad(field + ".url", "has no host");
  if (!uri.getUserInfo().empty()) bad(field + ".url", "must not hold credentials (use authentication)");
  try {
    policy.addresses(uri.getHost());
  } catch (const std::exception &e) {
    bad(field + ".url", std::string("is refused: ") + e.what());
  }
  if (const rapidjson::Value *id = find(v, "id"); id != nullptr && !id->IsNull()) {
    if (!id->IsString() || id->GetStringLength() == 0 || id->GetStringLength() > 256)
      bad(field + ".id", "must be a non-empty string of at most 256 bytes");
    c.id.assign(id->GetString(), id->GetStringLength());
  }
  if (c.id.empty()) c.id = new_uuid();
  if (const rapidjson::Value *t = find(v, "token"); t != nullptr && !t->IsNull()) {
    if (!t->IsString() || t->GetStringLength() > 4096) bad(field + ".token", "must be a string of at most 4096 bytes");
    c.token.assign(t->GetString(), t->GetStringLength());
  }
  if (const rapidjson::Value *a = find(v, "authentication"); a != nullptr && !a->IsNull()) {
    if (!a->IsObject()) bad(field + ".authentication", "must be an object");
    if (const rapidjson::Value *s = find(*a, "scheme"); s != nullptr && s->IsString()) {
      c.scheme.assign(s->GetString(), s->GetStringLength());
    } else if (const rapidjson::Value *ss = find(*a, "schemes"); ss != nullptr && ss->IsArray() && !ss->Empty() &&
                                                                  (*ss)[0].IsString()) {
      c.scheme.assign((*ss)[0].GetString(), (*ss)[0].GetStringLength());
    } else {
      bad(field + ".authentication", is_v1(d) ? "needs a \"scheme\" (e.g. \"Bearer\")"
                                                        : "needs \"schemes\" (e.g. [\"Bearer\"])");
    }
    if (c.scheme.empty() || c.scheme.find_first_of(" \r\n") != std::string::npos)
      bad(field + ".authentication.scheme", "must be one word (e.g. \"Bearer\")");
    if (const rapidjson::Value *cr = find(*a, "credentials"); cr != nullptr && !cr->IsNull()) {
      if (!cr->IsString() || cr->GetStringLength() > 8192)
        bad(field + ".authentication.credentials", "must be a string of at most 8192 bytes");
      c.credentials.assign(cr->GetString(), cr->GetStringLength());
    }
  }
  if (c.token.find_first_of("\r\n") != std::string::npos || c.credentials.find_first_of("\r\n") != std::string::npos)
    bad(field, "must not hold line breaks in token or credentials");
  return c;
}

void put_push_config(Task &task, const PushConfig &cfg, uint64_t delivered_seq, std::size_t max_configs) {
  auto &a = task.allocator();
  if (configs_of(task) == nullptr) {
    rapidjson::Value push(rapidjson::kObjectType);
    push.AddMember("configs", rapidjson::Value(rapidjson::kArrayType), a);
    set_task_metadata(task, kPushKey, std::move(push));
  }
  rapidjson::Value &configs = *configs_of(task);
  rapidjson::Value c(rapidjson::kObjectType);
  c.AddMember("id", make_string(cfg.id, a), a);
  c.AddMember("url", make_string(cfg.url, a), a);
  if (!cfg.token.empty()) c.AddMember("token", make_string(cfg.token, a), a);
  if (!cfg.scheme.empty()) {
    rapidjson::Value auth(rapidjson::kObjectType);
    auth.AddMember("scheme", make_string(cfg.scheme, a), a);
    if (!cfg.credentials.empty()) auth.AddMember("credentials", make_string(cfg.credentials, a), a);
    c.AddMember("authentication", auth, a);
  }
  c.AddMember("dialect", make_string(dialect_name(cfg.dialect), a), a);
  c.AddMember("delivered", delivered_seq, a);
  for (auto &existing : configs.GetArray()) {
    if (str(find(existing, "id")) == cfg.id) {
      existing = c;
      return;
    }
  }
  if (configs.Size() >= max_configs)
    throw RpcError(rpc_code::kInvalidParams,
                   "invalid params: Task '" + std::string(task.id()) + "' has " + std::to_string(configs.Size()) +
                       " push notification configs already, the most it may have (push.max_configs_per_task)");
  configs.PushBack(c, a);
}

std::vector<PushConfig> push_configs(const Task &task) {
  std::vector<PushConfig> out;
  if (const rapidjson::Value *configs = configs_of(task))
    for (const auto &c : configs->GetArray())
      if (c.IsObject()) out.push_back(config_from_stored(c));
  return out;
}

bool remove_push_config(Task &task, std::string_view id) {
  rapidjson::Value *configs = configs_of(task);
  if (configs == nullptr) return false;
  for (auto it = configs->Begin(); it != configs->End(); ++it) {
    if (str(find(*it, "id")) == id) {
      configs->Erase(it);
      if (configs->Empty()) remove_task_metadata(task, kPushKey);
      return true;
    }
  }
  return false;
}

void write_push_config(JsonWriter &w, const PushConfig &cfg, std::string_view task_id, std::string_view tenant,
                       Dialect d) {
  auto put = [&](const char *k, std::string_view v) {
    w.Key(k);
    w.String(v.data(), static_cast<rapidjson::SizeType>(v.size()));
  };
  if (is_v1(d)) {
    w.StartObject();
    if (!tenant.empty()) put("tenant", tenant);
    put("id", cfg.id);
    put("taskId", task_id);
    put("url", cfg.url);
    if (!cfg.token.empty()) put("token", cfg.token);
    if (!cfg.scheme.empty()) {
      w.Key("authentication");
      w.StartObject();
      put("scheme", cfg.scheme);
      w.EndObject();
    }
    w.EndObject();
    return;
  }
  w.StartObject();
  put("taskId", task_id);
  w.Key("pushNotificationConfig");
  w.StartObject();
  put("id", cfg.id);
  put("url", cfg.url);
  if (!cfg.token.empty()) put("token", cfg.token);
  if (!cfg.scheme.empty()) {
    w.Key("authentication");
    w.StartObject();
    w.Key("schemes");
    w.StartArray();
    w.String(cfg.scheme.data(), static_cast<rapidjson::SizeType>(cfg.scheme.size()));
    w.EndArray();
    w.EndObject();
  }
  w.EndObject();
  w.EndObject();
}

// ---------------------------------------------------------------------------
// Delivery
// ---------------------------------------------------------------------------

std::string target_of(std::string_view url) {
  try {
    Poco::URI u{std::string(url)};
    return lower(u.getScheme() + "://" + u.getHost() + ":" + std::to_string(u.getPort()));
  } catch (const Poco::Exception &) {
    return {};
  }
}

namespace {

PushScheduler::Limits limits_of(const PushOptions &o) {
  PushScheduler::Limits l;
  l.min_threads = o.workers;
  l.max_in_flight = o.max_in_flight;
  l.max_in_flight_per_target = o.max_in_flight_per_target;
  return l;
}

}  // namespace

PushDeliverer::PushDeliverer(TaskLifecycle &lifecycle, PushOptions options, const Logger &log)
    : lifecycle_(lifecycle),
      options_(std::move(options)),
      log_(log),
      policy_(options_.allow_targets),
      scheduler_(limits_of(options_), [this](const std::string &target, const std::string &id) {
        try {
          const bool sent = deliver(target, id);
          std::lock_guard<std::mutex> lock(store_retry_mu_);
          store_retries_.erase(id);
          return sent;
        } catch (const StoreError &e) {
          store_failed(target, id, e.what());
          return true;  // the webhook is not at fault
        } catch (const std::exception &e) {
          log_.error("push delivery of Task '" + id + "' to " + target + " failed: " + e.what());
          return false;
        }
      }) {}

PushDeliverer::~PushDeliverer() { stop(); }

void PushDeliverer::store_failed(const std::string &target, const std::string &id, const std::string &what) {
  int n = 0;
  {
    std::lock_guard<std::mutex> lock(store_retry_mu_);
    n = ++store_retries_[id];
  }
  const double pause_ms =
      std::min<double>(options_.backoff_max_ms, options_.backoff_initial_ms * std::pow(2.0, std::min(n - 1, 30)));
  log_.warn("push delivery of Task '" + id + "' to " + target + ": the store failed (" + what + "); again in " +
            std::to_string(static_cast<int64_t>(pause_ms)) + " ms");
  scheduler_.schedule(target, id, Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(pause_ms)));
}

void PushDeliverer::start() {
  if (started_) return;
  started_ = true;
  scheduler_.start();
  sweeper_ = start_named_thread("tnx-push-sweep", [this] { sweep_loop(); });
}

void PushDeliverer::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  sweep_cv_.notify_all();
  scheduler_.stop();
  if (sweeper_.joinable()) sweeper_.join();
}

void PushDeliverer::notify(const Snapshot &snap) {
  const rapidjson::Value *configs = configs_of(snap.task);
  if (configs == nullptr) return;
  const uint64_t seq = event_seq(snap.task);
  // Per target: the earliest attempt due.
  std::map<std::string, int64_t> earliest;
  for (const auto &c : configs->GetArray()) {
    if (!c.IsObject() || !due(c, seq)) continue;
    const std::string target = target_of(str(find(c, "url")));
    const int64_t at = next_attempt_us(c);
    auto [it, fresh] = earliest.emplace(target, at);
    if (!fresh) it->second = std::min(it->second, at);
  }
  const int64_t now = now_us();
  const std::string id(snap.task.id());
  for (const auto &[target, at] : earliest)
    scheduler_.schedule(target, id, Clock::now() + std::chrono::microseconds(std::max<int64_t>(0, at - now)));
}

void PushDeliverer::sweep_loop() {
  using SteadyClock = std::chrono::steady_clock;
  // Full at start and every full_sweep_interval_ms; otherwise what is due.
  SteadyClock::time_point next_full = SteadyClock::now();
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    lock.unlock();
    try {
      const bool full = SteadyClock::now() >= next_full;
      if (full)
        next_full = options_.full_sweep_interval_ms > 0
                        ? SteadyClock::now() + std::chrono::milliseconds(options_.full_sweep_interval_ms)
                        : SteadyClock::time_point::max();
      sweep(full);
    } catch (const std::exception &e) {
      log_.warn(std::string("push sweep failed: ") + e.what());
    }
    lock.lock();
    sweep_cv_.wait_for(lock, std::chrono::milliseconds(std::max(10, options_.sweep_interval_ms)),
                       [this] { return stopping_; });
  }
}

void PushDeliverer::sweep(bool full) {
  // Candidates: with a due index and after the first sweep, the Tasks due
  // now. Otherwise the Tasks whose status changed within the give-up
  // window, and running ones (whose artifacts may be newer than their
  // status): what was saved without a due time (by an older server sharing
  // the store, or before the store had the index) is found by the full
  // sweeps (at start and every full_sweep_interval_ms).
  std::vector<ListQuery> queries;
  if (!full && (lifecycle_.store()->info().capabilities & TNX_CAP_DUE_INDEX) != 0) {
    ListQuery q;
    q.due_before_us = now_us() + 1;
    queries.push_back(q);
  } else {
    add_full_sweep(queries);
  }
  run_sweep(queries);
}

void PushDeliverer::add_full_sweep(std::vector<ListQuery> &queries) const {
  ListQuery recent;
  recent.after_us = now_us() - int64_t{options_.give_up_after_ms} * 1000;
  queries.push_back(recent);
  for (const std::string_view state : {ts::kSubmitted, ts::kWorking}) {
    ListQuery q;
    q.state = std::string(state);
    queries.push_back(q);
  }
}

void PushDeliverer::run_sweep(std::vector<ListQuery> &queries) {
  for (ListQuery &q : queries) {
    // Large pages: a due list is an index walk in due order (earliest
    // first) from its cursor, so a backlog (a webhook down for hours)
    // costs a few calls of 1000 records each.
    q.page_size = q.due_before_us ? 1000 : 200;
    q.deliver_corrupt = true;
    do {
      ListPage page = lifecycle_.store()->list(q);
      for (TaskRecord &rec : page.records) {
        if (rec.version == 0 || rec.json.find(kPushKey) == std::string::npos) continue;
        try {
          Snapshot s;
          s.task = rec.a2a_task();
          s.version = rec.version;
          notify(s);
        } catch (const std::exception &) {
        }
      }
      q.cursor = page.next_cursor;
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) return;
    } while (!q.cursor.empty());
  }
}

bool PushDeliverer::deliver(const std::string &target, const std::string &id) {
  std::optional<TaskRecord> rec = lifecycle_.store()->get(id);
  if (!rec) return true;
  const Task task = rec->a2a_task();
  const rapidjson::Value *configs = configs_of(task);
  if (configs == nullptr) return true;
  const uint64_t seq = event_seq(task);
  const int64_t now = now_us();

  struct Outcome {
    std::string id;
    uint64_t delivered = 0;  // highest seq acknowledged
    std::string error;       // "" = all sent
  };
  std::vector<Outcome> outcomes;
  for (const auto &c : configs->GetArray()) {
    if (!c.IsObject() || !due(c, seq) || next_attempt_us(c) > now) continue;
    const PushConfig cfg = config_from_stored(c);
    if (target_of(cfg.url) != target) continue;
    Outcome o;
    o.id = cfg.id;
    o.delivered = u64(c, "delivered");
    // The payloads, in order: v1.0 one StreamResponse per event (or the
    // Task when the events left the timeline); v0.3 the Task.
    std::vector<std::pair<uint64_t, std::string>> bodies;
    FrameStyle style;
    style.binding = Binding::rest;
    style.dialect = cfg.dialect;
    if (is_v1(cfg.dialect)) {
      const bool all = for_each_event(task, o.delivered, style, [&](uint64_t s, std::string_view json, std::string_view) {
        bodies.emplace_back(s, std::string(json));
      });
      if (!all) bodies = {{seq, snapshot_payload(task, style)}};
    } else {
      bodies = {{seq, snapshot_payload(task, style)}};
    }
    for (const auto &[s, body] : bodies) {
      o.error = post(cfg, id, body);
      if (!o.error.empty()) break;
      o.delivered = s;
    }
    outcomes.push_back(std::move(o));
  }
  if (outcomes.empty()) {
    // Nothing due yet: come back at the earliest retry.
    notify(Snapshot{task, rec->version, rec->owner, rec->tenant});
    return true;
  }
  const bool all_sent =
      std::all_of(outcomes.begin(), outcomes.end(), [](const Outcome &o) { return o.error.empty(); });
  // Record what was delivered (and the failures), with compare-and-set.
  bool retry = false;
  uint64_t retries = 0, give_ups = 0;  // of the edit that was saved (it may run again on a conflict)
  try {
    lifecycle_.edit(id, rec->owner, rec->tenant, [&](Task &t) {
      retries = give_ups = 0;
      rapidjson::Value *cs = configs_of(t);
      if (cs == nullptr) return false;
      auto &a = t.allocator();
      const uint64_t newest = event_seq(t);
      bool changed = false;
      for (const Outcome &o : outcomes) {
        for (auto &c : cs->GetArray()) {
          if (str(find(c, "id")) != o.id) continue;
          if (o.delivered > u64(c, "delivered")) {
            set_member(c, "delivered", rapidjson::Value(o.delivered), a);
            changed = true;
          }
          if (o.error.empty()) {
            for (const char *k : {"attempts", "nextAttemptAt", "failingSince", "lastError", "gaveUp", "gaveUpSeq"}) {
              if (find(c, k) != nullptr) {
                remove_member(c, k);
                changed = true;
              }
            }
            continue;
          }
          const uint64_t attempts = u64(c, "attempts") + 1;
          std::string since(str(find(c, "failingSince")));
          if (since.empty()) since = format_timestamp(now);
          int64_t since_us = now;
          parse_timestamp(since, since_us);
          set_member(c, "attempts", rapidjson::Value(attempts), a);
          set_member(c, "failingSince", make_string(since, a), a);
          set_member(c, "lastError", make_string(o.error.substr(0, 500), a), a);
          const bool give_up = attempts >= static_cast<uint64_t>(options_.max_attempts) ||
                               now - since_us >= int64_t{options_.give_up_after_ms} * 1000;
          if (give_up) {
            set_member(c, "gaveUp", rapidjson::Value(true), a);
            set_member(c, "gaveUpSeq", rapidjson::Value(newest), a);
            remove_member(c, "nextAttemptAt");
            ++give_ups;
            log_.warn("push notifications of Task '" + id + "' to " + origin(str(find(c, "url"))) + " gave up after " +
                      std::to_string(attempts) + " attempts: " + o.error);
          } else {
            const double backoff = std::min<double>(options_.backoff_max_ms,
                                                    options_.backoff_initial_ms * std::pow(2.0, attempts - 1));
            thread_local std::mt19937 rng{std::random_device{}()};
            const double jitter = std::uniform_real_distribution<double>(0.9, 1.1)(rng);
            const int64_t next = now + static_cast<int64_t>(backoff * jitter * 1000);
            set_member(c, "nextAttemptAt", make_string(format_timestamp(next), a), a);
            retry = true;
            ++retries;
            if (log_.enabled(LogLevel::info))
              log_.info("push notification of Task '" + id + "' to " + origin(str(find(c, "url"))) + " failed (attempt " +
                        std::to_string(attempts) + "), retrying in " +
                        std::to_string(static_cast<int64_t>(backoff * jitter)) + " ms: " + o.error);
          }
          changed = true;
        }
      }
      return changed;
    });
  } catch (const LifecycleError &) {
    return all_sent;  // the Task is gone
  }
  if (ServerMetrics *m = lifecycle_.metrics()) {
    m->push_retries.add(retries);
    m->push_give_ups.add(give_ups);
  }
  // The save was published: notify() schedules the retry or the events that
  // arrived meanwhile.
  (void)retry;
  return all_sent;
}

std::string PushDeliverer::post(const PushConfig &cfg, std::string_view task_id, const std::string &body) {
  try {
    Poco::URI uri(cfg.url);
    const std::string host = uri.getHost();
    const auto port = uri.getPort();
    const std::vector<Poco::Net::IPAddress> addrs = policy_.addresses(host);
    const Poco::Net::SocketAddress addr(addrs.front(), port);
    const Poco::Timespan timeout(static_cast<long>(options_.timeout_ms) * 1000);
    std::string path = uri.getPathEtc();
    if (path.empty()) path = "/";
    Poco::Net::HTTPRequest req(Poco::Net::HTTPRequest::HTTP_POST, path, Poco::Net::HTTPMessage::HTTP_1_1);
    req.setHost(host, port);
    req.setContentType(is_v1(cfg.dialect) ? "application/a2a+json" : "application/json");
    req.setContentLength(static_cast<std::streamsize>(body.size()));
    req.set("User-Agent", std::string("toolnexus/") + server_version());
    if (!cfg.scheme.empty() && !cfg.credentials.empty()) req.set("Authorization", cfg.scheme + " " + cfg.credentials);
    if (!cfg.token.empty()) req.set("X-A2A-Notification-Token", cfg.token);
    Poco::Net::HTTPResponse resp;
    auto exchange = [&](Poco::Net::HTTPClientSession &session) {
      session.setTimeout(timeout, timeout, timeout);
      session.sendRequest(req) << body;
      std::istream &in = session.receiveResponse(resp);
      char sink[4096];
      std::size_t total = 0;
      while (in.read(sink, sizeof sink) || in.gcount() > 0) {
        total += static_cast<std::size_t>(in.gcount());
        if (total > (1 << 20)) break;  // a webhook's answer body is not read past 1 MiB
      }
    };
    if (lower(uri.getScheme()) == "https") {
      static Poco::Net::Context::Ptr context = new Poco::Net::Context(
          Poco::Net::Context::TLS_CLIENT_USE, "", Poco::Net::Context::VERIFY_RELAXED, 9, true);
      Poco::Net::SecureStreamSocket socket(context);
      socket.setPeerHostName(host);
      socket.connect(addr, timeout);
      Poco::Net::HTTPSClientSession session(socket);
      exchange(session);
    } else {
      Poco::Net::HTTPClientSession session(addr);
      exchange(session);
    }
    const int status = static_cast<int>(resp.getStatus());
    if (status < 200 || status > 299) {
      if (ServerMetrics *m = lifecycle_.metrics()) m->push_failures.add();
      return "the webhook answered HTTP " + std::to_string(status) + " " + resp.getReason();
    }
    if (ServerMetrics *m = lifecycle_.metrics()) m->push_deliveries.add();
    if (log_.enabled(LogLevel::debug))
      log_.debug("push notification of Task '" + std::string(task_id) + "' delivered to " + origin(cfg.url));
    return {};
  } catch (const Poco::Exception &e) {
    if (ServerMetrics *m = lifecycle_.metrics()) m->push_failures.add();
    return e.displayText();
  } catch (const std::exception &e) {
    if (ServerMetrics *m = lifecycle_.metrics()) m->push_failures.add();
    return e.what();
  }
}

}  // namespace toolnexus::server_detail

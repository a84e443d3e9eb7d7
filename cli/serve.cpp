// cli/serve.cpp: `toolnexus serve`: runs the A2A JSON-RPC server until
// SIGINT or SIGTERM.
#include "options.hpp"
#include "retention_config.hpp"
#include "store_common.hpp"
#include "subcommand.hpp"

#include "toolnexus/llm_executor.hpp"
#include "toolnexus/registry.hpp"
#include "toolnexus/server.hpp"

#include <rapidjson/document.h>
#include <rapidjson/error/en.h>

#include <signal.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace toolnexus::cli {
namespace {

constexpr const char *kUsage = R"(usage: toolnexus serve [options]

Runs an A2A agent (JSON-RPC at POST / in protocol v1.0 and v0.3, chosen by the
A2A-Version header; HTTP+JSON at /message:send, /tasks... in v1.0) whose every
Task read and write goes through the configured store. Prints "listening on http://HOST:PORT/" as its first line on
stdout (with --admin-listen, "admin listening on http://HOST:PORT/" next);
stops on SIGINT or SIGTERM (finishing requests in progress, closing the store) and exits 0. Logs go to stderr.

options (flags override the config file):
  --config FILE            JSON configuration (see below)
  --listen HOST:PORT       address to listen on (default 127.0.0.1:8080;
                           port 0 picks a free port)
  --admin-listen HOST:PORT the admin listener: GET /healthz, /readyz and
                           /metrics (Prometheus), no authentication; keep it
                           off public networks (default: none; /healthz and
                           /readyz are on --listen too, /metrics only here)
  --store SELECTOR         memory (default), file:DIR, sqlite:PATH, or
                           <scheme>:<location> served by a plugin
  --plugin-dir DIR         also search DIR for storage plugins (repeatable)
  --allow-insecure-plugins load plugins from group/other-writable or foreign-
                           owned files and directories (the guard rails'
                           permission checks off; symlinks must still stay
                           inside a plugin directory)
  --agent NAME             echo (default), approval, or llm (a model behind
                           an OpenAI-compatible endpoint: the config's "llm")
  --name NAME              agent name on the card (default toolnexus)
  --description TEXT       agent description on the card
  --public-url URL         the card's url (default: the Host header when it
                           names this server, see --allowed-host; else the
                           local address the request arrived on)
  --allowed-host HOST      a host name (or HOST:PORT) the card's url may take
                           from the Host header and API requests may name
                           (repeatable; "*": any Host is served): a DNS name,
                           an IPv4 address or [IPV6], port 1..65535
  --allowed-origin ORIGIN  a web origin whose pages may call the API through
                           CORS: http(s)://HOST[:PORT], no path, not even "/"
                           (https://console.example.com; repeatable; "*": any)
  --trust-forwarded        a reverse proxy in front sets Forwarded /
                           X-Forwarded-Proto / X-Forwarded-Host: the card's
                           url and this server's own origin follow them
                           (off: they are ignored)
  --card-max-age SECONDS   how long clients may cache the card (Cache-Control
                           max-age; default 300; it also has an ETag)
  --auth-tokens FILE       JSON {"<token>": "<principal>", ...}; turns on
                           bearer authentication and per-principal Tasks
  --console                serve the approval console, a web page at
                           /console/ that lists Tasks and approves, denies
                           or cancels them through this API with a pasted
                           bearer token (default: off, /console/ is 404;
                           see docs/console.md)
  --console-dir DIR        the console's files (default: the installed
                           <exe>/../share/toolnexus/console)
  --workers N              Tasks run at once, on executor threads (default
                           64 on a durable store, whose runs wait for the
                           disk; 4 on memory); a blocking SendMessage to a
                           brief agent (echo, approval) runs on its request
                           thread, in one of these slots
  --max-connections N      connections served at once (default 128)
  --max-body BYTES         largest request body (default 1048576)
  --max-depth N            deepest JSON nesting accepted (default 64)
  --read-timeout MS        drop a client silent this long (default 10000)
  --header-timeout MS      a request header must be complete this long after
                           its first byte, else 408 (default 10000)
  --max-task-history N     messages a Task's history may hold when a client's
                           message is added; more is refused (default 1000)
  --max-message-parts N    parts one message may have (default 100)
  --max-task-bytes BYTES   largest stored Task (its JSON); a message that would
                           pass it is refused, an agent output that would
                           fails the Task (default 8388608)
  --lease-ms MS            lease of a running Task (default 30000)
  --lease-renew-ms MS      lease renewal interval (default 10000)
  --settle-interval-ms MS  sweep for expired leases this often (default 10000)
  --full-settle-interval-ms MS
                           on a store with a due index, that sweep reads every
                           running Task this often, not only the due ones
                           (default 3600000; 0 = at start only)
  --cancel-poll-ms MS      re-read running Tasks this often to notice a cancel
                           made by another server (default: the renew interval)
  --max-streams N          SSE streams open at once (default 10000)
  --stream-keepalive-ms MS keep-alive comment on idle streams (default 15000)
  --stream-poll-ms MS      re-read streamed Tasks that did not change here this
                           often: the bound on seeing changes made by other
                           servers sharing the store (default 200)
  --progress-interval-ms MS  save executor progress at most this often; runs
                           lasting longer save "working" (default 100)
  --echo-chunk-delay-ms MS pause between the chunks of the echo agent's reply
                           (default 0)
  --drain-timeout-ms MS    on SIGTERM/SIGINT, how long running Tasks may take
                           to finish; their streams stay open meanwhile, and
                           end with a frame saying to resubscribe elsewhere
                           if the Task outlives it (default 10000)
  --instance-id ID         this server's instance id in leases (unique among
                           servers sharing the store; default: the one kept
                           in the instance file, else a new one)
  --instance-file PATH     keep the instance id in PATH-0, PATH-1, ... (the
                           first one no running server holds), so that a
                           restart settles the Tasks it left running at once;
                           default: DIR/.toolnexus-instance for file:DIR,
                           PATH.toolnexus-instance for sqlite:PATH, none
                           otherwise; "-" = none
  --allow-push-target CIDR let push notifications reach this range although
                           it is not globally reachable (loopback, private,
                           ...; repeatable; "*" = any)
  --no-push                turn push notifications off (card: false; the
                           config methods answer -32003)
  --retention STATE=DURATION[:canceled|failed]
                           how long Tasks are kept (repeatable; adds to the
                           config's "retention"): a terminal state's Tasks
                           are deleted DURATION after their last status
                           (completed=30d); an input-required or
                           auth-required Task waiting longer ends canceled
                           (or failed: input-required=2h:failed). Units ms,
                           s, m, h, d. Default: kept forever, no expiry
  --log-level LEVEL        error, warn, info (default) or debug (one line per
                           request)
  --help                   this text

config file:
  {"listen": "127.0.0.1:8080", "plugin_dirs": ["..."], "allow_insecure_plugins": false,
   "admin": {"listen": "127.0.0.1:9090"},
   "agent": "approval",
   "a2a": {"name": "...", "description": "...", "version": "...",
           "store": "file:/var/lib/toolnexus/tasks",
           "provider": {"organization": "...", "url": "..."},
           "documentation_url": "...", "public_url": "...",
           "allowed_hosts": ["agents.example.com"], "trust_forwarded": false,
           "card_max_age_s": 300},
   "auth_tokens": "tokens.json", "log_level": "info", "workers": 64,
   "auth": {"jwt": {"issuer": "https://login.example.com", "audience": "toolnexus",
                    "jwks_url": "https://login.example.com/jwks.json",
                    "principal_claim": "sub", "tenant_claim": null,
                    "clock_skew_s": 60, "algorithms": ["RS256", "ES256"],
                    "jwks_refresh_min_s": 60, "jwks_max_age_s": 3600,
                    "jwks_timeout_ms": 5000,
                    "openid_configuration_url":
                      "https://login.example.com/.well-known/openid-configuration"}},
   "console": {"enabled": false, "dir": "/usr/share/toolnexus/console"},
   "limits": {"max_body_bytes": 1048576, "max_header_bytes": 32768,
              "max_json_depth": 64, "read_timeout_ms": 10000,
              "keep_alive_timeout_ms": 10000, "header_timeout_ms": 10000,
              "body_deadline_ms": 30000, "max_connections": 128,
              "max_queued_connections": 512, "max_open_connections": 20000,
              "stream_stall_ms": 60000,
              "max_queued_tasks": 4096, "queue_wait_ms": 10000,
              "blocking_timeout_ms": 60000, "max_task_history": 1000,
              "max_message_parts": 100, "max_task_bytes": 8388608},
   "lease": {"lease_ms": 30000, "renew_interval_ms": 10000,
             "settle_interval_ms": 10000},
   "retention": {"completed": "30d", "failed": "90d", "canceled": "7d", "rejected": "7d",
                 "input-required": {"after": "2h", "to": "canceled"}, "auth-required": "1h"},
   "streams": {"max_streams": 10000, "keepalive_ms": 15000, "poll_ms": 200},
   "push": {"enabled": true, "allow_targets": ["10.0.0.0/8"], "timeout_ms": 10000,
            "max_attempts": 10, "backoff_initial_ms": 1000, "backoff_max_ms": 300000,
            "give_up_after_ms": 86400000, "sweep_interval_ms": 60000, "workers": 2,
            "max_in_flight": 64, "max_in_flight_per_target": 2, "max_configs_per_task": 10},
   "idempotency": {"enabled": true, "recent_messages": 32, "window_ms": 86400000},
   "progress_interval_ms": 100, "echo_chunk_delay_ms": 0, "drain_timeout_ms": 10000,
   "instance_id": "...", "instance_file": "...",
   "llm": {"base_url": "https://api.openai.com/v1", "model": "gpt-4o-mini",
           "api_key_env": "OPENAI_API_KEY", "system_prompt": "...",
           "timeout_ms": 60000, "max_retries": 3, "retry_initial_ms": 500,
           "retry_max_ms": 8000, "max_model_calls": 8, "ca_file": "...",
           "tools": [{"name": "authorize", "description": "...",
                      "parameters": {"type": "object", "properties": {}},
                      "approval": true, "result": "authorized"}]}}
  plugin_dirs, auth_tokens, auth.jwt.jwks_file, instance_file, console.dir and
  llm.ca_file are relative to the config file's directory. "llm" is used by
  --agent llm (see docs/llm-agent.md). "auth.jwt" takes bearer JWTs (OAuth 2 /
  OIDC access tokens; "jwks_file" or "jwks_url", one of them): a credential the
  token file knows is its principal, any other is validated as a JWT; see
  docs/configuration.md, "JWT bearer tokens". A key given twice in one object
  is refused (JSON parsers disagree on which one wins).
)";

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

int64_t parse_int(const std::string &what, const std::string &text, int64_t min, int64_t max) {
  std::size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(text, &used);
  } catch (...) {
    used = 0;
  }
  if (used == 0 || used != text.size() || v < min || v > max)
    throw UsageError(what + " must be an integer between " + std::to_string(min) + " and " +
                     std::to_string(max) + " (got '" + text + "')");
  return v;
}

int to_int(int64_t v) { return static_cast<int>(v); }

// ---- config file ----------------------------------------------------------

struct Config {
  rapidjson::Document doc;
  std::filesystem::path dir;
  std::string file;
};

const rapidjson::Value *member(const rapidjson::Value &obj, const char *name) {
  if (!obj.IsObject()) return nullptr;
  auto it = obj.FindMember(name);
  return it == obj.MemberEnd() || it->value.IsNull() ? nullptr : &it->value;
}

std::string config_string(const Config &c, const rapidjson::Value &obj, const char *name, const std::string &path) {
  const rapidjson::Value *v = member(obj, name);
  if (v == nullptr) return {};
  if (!v->IsString()) throw UsageError(c.file + ": " + path + " must be a string");
  return std::string(v->GetString(), v->GetStringLength());
}

std::optional<int64_t> config_int(const Config &c, const rapidjson::Value &obj, const char *name,
                                  const std::string &path, int64_t min, int64_t max) {
  const rapidjson::Value *v = member(obj, name);
  if (v == nullptr) return std::nullopt;
  if (!v->IsInt64() || v->GetInt64() < min || v->GetInt64() > max)
    throw UsageError(c.file + ": " + path + " must be an integer between " + std::to_string(min) + " and " +
                     std::to_string(max));
  return v->GetInt64();
}

void warn_unknown(const Config &c, const rapidjson::Value &obj, const std::string &path,
                  std::initializer_list<const char *> known) {
  if (!obj.IsObject()) return;
  for (auto it = obj.MemberBegin(); it != obj.MemberEnd(); ++it) {
    const std::string key(it->name.GetString(), it->name.GetStringLength());
    bool ok = false;
    for (const char *k : known) ok = ok || key == k;
    // A typo must not silently fall back to a default (e.g. "store" at the
    // top level instead of "a2a.store" would serve from memory and lose
    // every Task at exit): an unknown key stops the start.
    if (!ok)
      throw UsageError(c.file + ": unknown key " + path + key);
  }
}

// The path ("auth.jwt.issuer", "a2a.allowed_hosts[2].x") of the first key
// that an object under `v` names twice, or "".
std::string duplicate_key(const rapidjson::Value &v, const std::string &path) {
  if (v.IsArray()) {
    for (rapidjson::SizeType i = 0; i < v.Size(); ++i)
      if (std::string d = duplicate_key(v[i], path + "[" + std::to_string(i) + "]"); !d.empty()) return d;
  }
  if (!v.IsObject()) return {};
  std::set<std::string_view> seen;
  for (auto it = v.MemberBegin(); it != v.MemberEnd(); ++it) {
    const std::string_view key(it->name.GetString(), it->name.GetStringLength());
    const std::string sub = path.empty() ? std::string(key) : path + "." + std::string(key);
    if (!seen.insert(key).second) return sub;
    if (std::string d = duplicate_key(it->value, sub); !d.empty()) return d;
  }
  return {};
}

void apply_config(const std::string &file, ServerOptions &o, std::vector<std::string> &plugin_dirs,
                  std::string &auth_file, std::optional<LlmOptions> &llm, bool &allow_insecure) {
  Config c;
  c.file = file;
  std::ifstream in(file, std::ios::binary);
  if (!in) throw UsageError("cannot read the config file " + file + ": " + std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  c.doc.Parse<rapidjson::kParseValidateEncodingFlag | rapidjson::kParseIterativeFlag>(text.data(), text.size());
  if (c.doc.HasParseError())
    throw UsageError("the config file " + file + " is not valid JSON: " +
                     rapidjson::GetParseError_En(c.doc.GetParseError()) + " at byte " +
                     std::to_string(c.doc.GetErrorOffset()));
  if (!c.doc.IsObject()) throw UsageError("the config file " + file + " must hold a JSON object");
  if (const std::string dup = duplicate_key(c.doc, ""); !dup.empty())
    throw UsageError(file + ": the key " + dup +
                     " is given twice in one object (JSON parsers disagree on which one counts: keep one)");
  c.dir = std::filesystem::absolute(file).parent_path();
  const rapidjson::Value &root = c.doc;
  warn_unknown(c, root, "",
               {"listen", "admin", "plugin_dirs", "allow_insecure_plugins", "a2a", "agent", "auth_tokens", "auth", "log_level",
                "workers", "limits", "lease", "streams", "push", "idempotency", "progress_interval_ms", "echo_chunk_delay_ms", "llm",
                "drain_timeout_ms", "instance_id", "instance_file", "retention", "console"});

  if (auto v = config_string(c, root, "listen", "listen"); !v.empty()) o.listen = v;
  if (const rapidjson::Value *ad = member(root, "admin")) {
    if (!ad->IsObject()) throw UsageError(file + ": admin must be an object");
    warn_unknown(c, *ad, "admin.", {"listen"});
    if (auto v = config_string(c, *ad, "listen", "admin.listen"); !v.empty()) o.admin_listen = v;
  }
  if (const rapidjson::Value *dirs = member(root, "plugin_dirs")) {
    if (!dirs->IsArray()) throw UsageError(file + ": plugin_dirs must be an array of directory names");
    for (const auto &d : dirs->GetArray()) {
      if (!d.IsString()) throw UsageError(file + ": plugin_dirs must be an array of directory names");
      plugin_dirs.push_back((c.dir / std::string(d.GetString(), d.GetStringLength())).lexically_normal().string());
    }
  }
  if (const rapidjson::Value *v = member(root, "allow_insecure_plugins")) {
    if (!v->IsBool()) throw UsageError(file + ": allow_insecure_plugins must be true or false");
    allow_insecure = v->GetBool();
  }
  if (auto v = config_string(c, root, "agent", "agent"); !v.empty()) o.agent = v;
  if (auto v = config_string(c, root, "auth_tokens", "auth_tokens"); !v.empty())
    auth_file = (c.dir / v).lexically_normal().string();
  if (const rapidjson::Value *au = member(root, "auth")) {
    if (!au->IsObject()) throw UsageError(file + ": auth must be an object");
    warn_unknown(c, *au, "auth.", {"jwt"});
    if (const rapidjson::Value *j = member(*au, "jwt")) {
      try {
        o.jwt = parse_jwt_options(*j, file + ": auth.jwt");
      } catch (const std::invalid_argument &e) {
        throw UsageError(e.what());
      }
      if (!o.jwt.jwks_file.empty()) o.jwt.jwks_file = (c.dir / o.jwt.jwks_file).lexically_normal().string();
    }
  }
  if (auto v = config_string(c, root, "log_level", "log_level"); !v.empty()) o.log_level = parse_log_level(v);
  if (auto v = config_int(c, root, "workers", "workers", 1, 1024)) o.workers = static_cast<unsigned>(*v);
  if (auto v = config_int(c, root, "progress_interval_ms", "progress_interval_ms", 1, 3600000))
    o.progress_interval_ms = to_int(*v);
  if (auto v = config_int(c, root, "echo_chunk_delay_ms", "echo_chunk_delay_ms", 0, 3600000))
    o.echo_chunk_delay_ms = to_int(*v);
  if (auto v = config_int(c, root, "drain_timeout_ms", "drain_timeout_ms", 0, 3600000))
    o.drain_timeout_ms = to_int(*v);
  if (auto v = config_string(c, root, "instance_id", "instance_id"); !v.empty()) o.instance_id = v;
  if (auto v = config_string(c, root, "instance_file", "instance_file"); !v.empty())
    o.instance_file = v == "-" ? v : (c.dir / v).lexically_normal().string();
  if (const rapidjson::Value *co = member(root, "console")) {
    if (!co->IsObject()) throw UsageError(file + ": console must be an object ({\"enabled\": true})");
    warn_unknown(c, *co, "console.", {"enabled", "dir"});
    if (const rapidjson::Value *en = member(*co, "enabled")) {
      if (!en->IsBool()) throw UsageError(file + ": console.enabled must be true or false");
      o.console = en->GetBool();
    }
    if (auto v = config_string(c, *co, "dir", "console.dir"); !v.empty())
      o.console_dir = (c.dir / v).lexically_normal().string();
  }
  if (const rapidjson::Value *pu = member(root, "push")) {
    if (!pu->IsObject()) throw UsageError(file + ": push must be an object");
    warn_unknown(c, *pu, "push.",
                 {"enabled", "allow_targets", "timeout_ms", "max_attempts", "backoff_initial_ms", "backoff_max_ms",
                  "give_up_after_ms", "sweep_interval_ms", "full_sweep_interval_ms", "workers", "max_in_flight",
                  "max_in_flight_per_target", "max_configs_per_task"});
    if (const rapidjson::Value *en = member(*pu, "enabled")) {
      if (!en->IsBool()) throw UsageError(file + ": push.enabled must be true or false");
      o.push.enabled = en->GetBool();
    }
    if (const rapidjson::Value *at = member(*pu, "allow_targets")) {
      if (!at->IsArray()) throw UsageError(file + ": push.allow_targets must be an array of CIDR ranges");
      for (const auto &t : at->GetArray()) {
        if (!t.IsString()) throw UsageError(file + ": push.allow_targets must be an array of CIDR ranges");
        o.push.allow_targets.emplace_back(t.GetString(), t.GetStringLength());
      }
    }
    constexpr int64_t kMaxMs = 24LL * 3600 * 1000 * 30;
    if (auto v = config_int(c, *pu, "timeout_ms", "push.timeout_ms", 1, kMaxMs)) o.push.timeout_ms = to_int(*v);
    if (auto v = config_int(c, *pu, "max_attempts", "push.max_attempts", 1, 1000000)) o.push.max_attempts = to_int(*v);
    if (auto v = config_int(c, *pu, "backoff_initial_ms", "push.backoff_initial_ms", 1, kMaxMs))
      o.push.backoff_initial_ms = to_int(*v);
    if (auto v = config_int(c, *pu, "backoff_max_ms", "push.backoff_max_ms", 1, kMaxMs))
      o.push.backoff_max_ms = to_int(*v);
    if (auto v = config_int(c, *pu, "give_up_after_ms", "push.give_up_after_ms", 1, kMaxMs))
      o.push.give_up_after_ms = to_int(*v);
    if (auto v = config_int(c, *pu, "sweep_interval_ms", "push.sweep_interval_ms", 1, kMaxMs))
      o.push.sweep_interval_ms = to_int(*v);
    if (auto v = config_int(c, *pu, "full_sweep_interval_ms", "push.full_sweep_interval_ms", 0, kMaxMs))
      o.push.full_sweep_interval_ms = to_int(*v);
    if (auto v = config_int(c, *pu, "workers", "push.workers", 1, 64)) o.push.workers = static_cast<unsigned>(*v);
    if (auto v = config_int(c, *pu, "max_in_flight", "push.max_in_flight", 1, 4096))
      o.push.max_in_flight = static_cast<unsigned>(*v);
    if (auto v = config_int(c, *pu, "max_in_flight_per_target", "push.max_in_flight_per_target", 1, 4096))
      o.push.max_in_flight_per_target = static_cast<unsigned>(*v);
    if (auto v = config_int(c, *pu, "max_configs_per_task", "push.max_configs_per_task", 1, 1000))
      o.push.max_configs_per_task = static_cast<std::size_t>(*v);
  }
  if (const rapidjson::Value *id = member(root, "idempotency")) {
    if (!id->IsObject()) throw UsageError(file + ": idempotency must be an object");
    warn_unknown(c, *id, "idempotency.", {"enabled", "recent_messages", "window_ms"});
    if (const rapidjson::Value *en = member(*id, "enabled")) {
      if (!en->IsBool()) throw UsageError(file + ": idempotency.enabled must be true or false");
      o.idempotency.enabled = en->GetBool();
    }
    if (auto v = config_int(c, *id, "recent_messages", "idempotency.recent_messages", 1, 4096))
      o.idempotency.recent_messages = static_cast<std::size_t>(*v);
    if (auto v = config_int(c, *id, "window_ms", "idempotency.window_ms", 1, int64_t{365} * 24 * 3600 * 1000))
      o.idempotency.window_ms = *v;
  }
  if (const rapidjson::Value *st = member(root, "streams")) {
    if (!st->IsObject()) throw UsageError(file + ": streams must be an object");
    warn_unknown(c, *st, "streams.", {"max_streams", "keepalive_ms", "poll_ms"});
    if (auto v = config_int(c, *st, "max_streams", "streams.max_streams", 1, 1 << 22))
      o.streams.max_streams = static_cast<std::size_t>(*v);
    if (auto v = config_int(c, *st, "keepalive_ms", "streams.keepalive_ms", 1, 3600000))
      o.streams.keepalive_ms = to_int(*v);
    if (auto v = config_int(c, *st, "poll_ms", "streams.poll_ms", 1, 3600000)) o.streams.poll_ms = to_int(*v);
  }
  if (const rapidjson::Value *a2a = member(root, "a2a")) {
    if (!a2a->IsObject()) throw UsageError(file + ": a2a must be an object");
    warn_unknown(c, *a2a, "a2a.",
                 {"name", "description", "version", "store", "provider", "documentation_url", "public_url",
                  "allowed_hosts", "allowed_origins", "trust_forwarded", "card_max_age_s"});
    if (auto v = config_string(c, *a2a, "name", "a2a.name"); !v.empty()) o.card.name = v;
    if (auto v = config_string(c, *a2a, "description", "a2a.description"); !v.empty()) o.card.description = v;
    if (auto v = config_string(c, *a2a, "version", "a2a.version"); !v.empty()) o.card.version = v;
    if (const rapidjson::Value *s = member(*a2a, "store")) {
      if (!s->IsString()) throw UsageError(file + ": a2a.store must be a selector string");
      o.store = std::string(s->GetString(), s->GetStringLength());
    }
    if (auto v = config_string(c, *a2a, "documentation_url", "a2a.documentation_url"); !v.empty())
      o.card.documentation_url = v;
    if (auto v = config_string(c, *a2a, "public_url", "a2a.public_url"); !v.empty()) o.card.public_url = v;
    const auto names = [&](const char *key, const char *what, std::vector<std::string> &into) {
      const rapidjson::Value *list = member(*a2a, key);
      if (list == nullptr) return;
      const std::string bad = file + ": a2a." + key + " must be an array of " + what;
      if (!list->IsArray()) throw UsageError(bad);
      for (const auto &h : list->GetArray()) {
        if (!h.IsString() || h.GetStringLength() == 0) throw UsageError(bad);
        into.emplace_back(h.GetString(), h.GetStringLength());
      }
    };
    names("allowed_hosts", "host names", o.card.allowed_hosts);
    names("allowed_origins", "origins (\"https://console.example.com\")", o.card.allowed_origins);
    if (const rapidjson::Value *tf = member(*a2a, "trust_forwarded")) {
      if (!tf->IsBool()) throw UsageError(file + ": a2a.trust_forwarded must be true or false");
      o.card.trust_forwarded = tf->GetBool();
    }
    if (auto v = config_int(c, *a2a, "card_max_age_s", "a2a.card_max_age_s", 0, 31536000))
      o.card.cache_max_age_s = to_int(*v);
    if (const rapidjson::Value *p = member(*a2a, "provider")) {
      if (!p->IsObject()) throw UsageError(file + ": a2a.provider must be an object");
      o.card.provider_organization = config_string(c, *p, "organization", "a2a.provider.organization");
      o.card.provider_url = config_string(c, *p, "url", "a2a.provider.url");
    }
  }
  if (const rapidjson::Value *l = member(root, "limits")) {
    warn_unknown(c, *l, "limits.",
                 {"max_body_bytes", "max_header_bytes", "max_json_depth", "read_timeout_ms",
                  "keep_alive_timeout_ms", "header_timeout_ms", "body_deadline_ms", "max_connections",
                  "max_queued_connections", "max_open_connections", "stream_stall_ms", "max_queued_tasks",
                  "queue_wait_ms", "blocking_timeout_ms", "max_task_history", "max_message_parts",
                  "max_task_bytes"});
    constexpr int64_t kMaxMs = 24LL * 3600 * 1000;
    if (auto v = config_int(c, *l, "max_body_bytes", "limits.max_body_bytes", 1, int64_t{1} << 40))
      o.limits.max_body_bytes = static_cast<std::size_t>(*v);
    if (auto v = config_int(c, *l, "max_header_bytes", "limits.max_header_bytes", 1024, 1 << 20))
      o.limits.max_header_bytes = static_cast<std::size_t>(*v);
    if (auto v = config_int(c, *l, "header_timeout_ms", "limits.header_timeout_ms", 1, kMaxMs))
      o.limits.header_timeout_ms = to_int(*v);
    if (auto v = config_int(c, *l, "max_queued_connections", "limits.max_queued_connections", 1, 1 << 20))
      o.limits.max_queued_connections = static_cast<unsigned>(*v);
    if (auto v = config_int(c, *l, "max_open_connections", "limits.max_open_connections", 1, 1 << 22))
      o.limits.max_open_connections = static_cast<std::size_t>(*v);
    if (auto v = config_int(c, *l, "stream_stall_ms", "limits.stream_stall_ms", 1, kMaxMs))
      o.limits.stream_stall_ms = to_int(*v);
    if (auto v = config_int(c, *l, "max_json_depth", "limits.max_json_depth", 2, 64))
      o.limits.max_json_depth = to_int(*v);
    if (auto v = config_int(c, *l, "read_timeout_ms", "limits.read_timeout_ms", 1, kMaxMs))
      o.limits.read_timeout_ms = to_int(*v);
    if (auto v = config_int(c, *l, "keep_alive_timeout_ms", "limits.keep_alive_timeout_ms", 1, kMaxMs))
      o.limits.keep_alive_timeout_ms = to_int(*v);
    if (auto v = config_int(c, *l, "body_deadline_ms", "limits.body_deadline_ms", 1, kMaxMs))
      o.limits.body_deadline_ms = to_int(*v);
    if (auto v = config_int(c, *l, "max_connections", "limits.max_connections", 1, 10000))
      o.limits.max_connections = static_cast<unsigned>(*v);
    if (auto v = config_int(c, *l, "max_queued_tasks", "limits.max_queued_tasks", 1, int64_t{1} << 32))
      o.limits.max_queued_tasks = static_cast<std::size_t>(*v);
    if (auto v = config_int(c, *l, "queue_wait_ms", "limits.queue_wait_ms", 0, kMaxMs))
      o.limits.queue_wait_ms = to_int(*v);
    if (auto v = config_int(c, *l, "blocking_timeout_ms", "limits.blocking_timeout_ms", 0, kMaxMs))
      o.limits.blocking_timeout_ms = to_int(*v);
    if (auto v = config_int(c, *l, "max_task_history", "limits.max_task_history", 1, 1 << 24))
      o.limits.max_task_history = static_cast<std::size_t>(*v);
    if (auto v = config_int(c, *l, "max_message_parts", "limits.max_message_parts", 1, 1 << 20))
      o.limits.max_message_parts = static_cast<std::size_t>(*v);
    if (auto v = config_int(c, *l, "max_task_bytes", "limits.max_task_bytes", 4096, int64_t{1} << 40))
      o.limits.max_task_bytes = static_cast<std::size_t>(*v);
  }
  if (const rapidjson::Value *r = member(root, "retention")) parse_retention_section(*r, file, o.retention);
  if (const rapidjson::Value *l = member(root, "llm")) {
    try {
      llm = parse_llm_options(*l, file + ": llm");
    } catch (const std::invalid_argument &e) {
      throw UsageError(e.what());
    }
    if (!llm->ca_file.empty()) llm->ca_file = (c.dir / llm->ca_file).lexically_normal().string();
  }
  if (const rapidjson::Value *l = member(root, "lease")) {
    warn_unknown(c, *l, "lease.", {"lease_ms", "renew_interval_ms", "settle_interval_ms", "full_settle_interval_ms",
                                        "cancel_poll_ms"});
    constexpr int64_t kMaxMs = 24LL * 3600 * 1000;
    if (auto v = config_int(c, *l, "lease_ms", "lease.lease_ms", 1, kMaxMs)) o.lease.lease_ms = to_int(*v);
    if (auto v = config_int(c, *l, "renew_interval_ms", "lease.renew_interval_ms", 1, kMaxMs))
      o.lease.renew_interval_ms = to_int(*v);
    if (auto v = config_int(c, *l, "settle_interval_ms", "lease.settle_interval_ms", 1, kMaxMs))
      o.lease.settle_interval_ms = to_int(*v);
    if (auto v = config_int(c, *l, "full_settle_interval_ms", "lease.full_settle_interval_ms", 0, kMaxMs))
      o.lease.full_settle_interval_ms = to_int(*v);
    if (auto v = config_int(c, *l, "cancel_poll_ms", "lease.cancel_poll_ms", 0, kMaxMs))
      o.lease.cancel_poll_ms = to_int(*v);
  }
}

// ---- command line ---------------------------------------------------------

// The console's files beside this program, as installed and as the build
// tree mirrors it: <exe>/../share/toolnexus/console ("" when the program's
// path cannot be read; serve() then names the missing directory).
std::string default_console_dir() {
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return "share/toolnexus/console";
  return (exe.parent_path().parent_path() / "share" / "toolnexus" / "console").string();
}

int run_serve(int argc, char **argv) {
  ServerOptions o;
  std::vector<std::string> plugin_dirs;
  std::string auth_file;
  std::optional<LlmOptions> llm;
  bool allow_insecure = false;
  try {
    // The config file first, wherever --config appears; flags override it.
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--help" || a == "-h") {
        std::fputs(kUsage, stdout);
        return 0;
      }
      if (a == "--config" || a.rfind("--config=", 0) == 0) {
        std::string file;
        if (a == "--config") {
          if (i + 1 >= argc) throw UsageError("--config needs a value");
          file = argv[++i];
        } else {
          file = a.substr(9);
        }
        apply_config(file, o, plugin_dirs, auth_file, llm, allow_insecure);
      }
    }
    constexpr int64_t kMaxMs = 24LL * 3600 * 1000;
    for (int i = 1; i < argc; ++i) {
      std::string a = argv[i];
      std::string value;
      bool has_inline = false;
      if (a.rfind("--", 0) == 0) {
        const auto eq = a.find('=');
        if (eq != std::string::npos) {
          value = a.substr(eq + 1);
          a = a.substr(0, eq);
          has_inline = true;
        }
      }
      auto next = [&]() -> std::string {
        if (has_inline) return value;
        if (i + 1 >= argc) throw UsageError(a + " needs a value");
        return argv[++i];
      };
      if (a == "--config") next();
      else if (a == "--listen") o.listen = next();
      else if (a == "--admin-listen") o.admin_listen = next();
      else if (a == "--store") o.store = next();
      else if (a == "--plugin-dir") plugin_dirs.push_back(next());
      else if (a == "--allow-insecure-plugins" && !has_inline) allow_insecure = true;
      else if (a == "--agent") o.agent = next();
      else if (a == "--name") o.card.name = next();
      else if (a == "--description") o.card.description = next();
      else if (a == "--public-url") o.card.public_url = next();
      else if (a == "--allowed-host") {
        const std::string h = next();
        if (h.empty()) throw UsageError("--allowed-host needs a host name");
        o.card.allowed_hosts.push_back(h);
      }
      else if (a == "--allowed-origin") {
        const std::string h = next();
        if (h.empty()) throw UsageError("--allowed-origin needs an origin (https://console.example.com, or *)");
        o.card.allowed_origins.push_back(h);
      }
      else if (a == "--trust-forwarded" && !has_inline) o.card.trust_forwarded = true;
      else if (a == "--card-max-age") o.card.cache_max_age_s = to_int(parse_int(a, next(), 0, 31536000));
      else if (a == "--auth-tokens") auth_file = next();
      else if (a == "--console" && !has_inline) o.console = true;
      else if (a == "--console-dir") {
        o.console_dir = next();
        if (o.console_dir.empty()) throw UsageError("--console-dir needs a directory");
      }
      else if (a == "--log-level") o.log_level = parse_log_level(next());
      else if (a == "--workers") o.workers = static_cast<unsigned>(parse_int(a, next(), 1, 1024));
      else if (a == "--max-connections") o.limits.max_connections = static_cast<unsigned>(parse_int(a, next(), 1, 10000));
      else if (a == "--max-body") o.limits.max_body_bytes = static_cast<std::size_t>(parse_int(a, next(), 1, int64_t{1} << 40));
      else if (a == "--max-depth") o.limits.max_json_depth = to_int(parse_int(a, next(), 2, 64));
      else if (a == "--read-timeout") o.limits.read_timeout_ms = to_int(parse_int(a, next(), 1, kMaxMs));
      else if (a == "--header-timeout") o.limits.header_timeout_ms = to_int(parse_int(a, next(), 1, kMaxMs));
      else if (a == "--max-task-history") o.limits.max_task_history = static_cast<std::size_t>(parse_int(a, next(), 1, 1 << 24));
      else if (a == "--max-message-parts") o.limits.max_message_parts = static_cast<std::size_t>(parse_int(a, next(), 1, 1 << 20));
      else if (a == "--max-task-bytes") o.limits.max_task_bytes = static_cast<std::size_t>(parse_int(a, next(), 4096, int64_t{1} << 40));
      else if (a == "--lease-ms") o.lease.lease_ms = to_int(parse_int(a, next(), 1, kMaxMs));
      else if (a == "--lease-renew-ms") o.lease.renew_interval_ms = to_int(parse_int(a, next(), 1, kMaxMs));
      else if (a == "--settle-interval-ms") o.lease.settle_interval_ms = to_int(parse_int(a, next(), 1, kMaxMs));
      else if (a == "--full-settle-interval-ms")
        o.lease.full_settle_interval_ms = to_int(parse_int(a, next(), 0, kMaxMs));
      else if (a == "--cancel-poll-ms") o.lease.cancel_poll_ms = to_int(parse_int(a, next(), 0, kMaxMs));
      else if (a == "--max-streams") o.streams.max_streams = static_cast<std::size_t>(parse_int(a, next(), 1, 1 << 22));
      else if (a == "--stream-keepalive-ms") o.streams.keepalive_ms = to_int(parse_int(a, next(), 1, kMaxMs));
      else if (a == "--stream-poll-ms") o.streams.poll_ms = to_int(parse_int(a, next(), 1, kMaxMs));
      else if (a == "--progress-interval-ms") o.progress_interval_ms = to_int(parse_int(a, next(), 1, kMaxMs));
      else if (a == "--echo-chunk-delay-ms") o.echo_chunk_delay_ms = to_int(parse_int(a, next(), 0, kMaxMs));
      else if (a == "--drain-timeout-ms") o.drain_timeout_ms = to_int(parse_int(a, next(), 0, kMaxMs));
      else if (a == "--instance-id") {
        o.instance_id = next();
        if (o.instance_id.empty()) throw UsageError("--instance-id needs a non-empty id");
      }
      else if (a == "--instance-file") {
        o.instance_file = next();
        if (o.instance_file.empty()) throw UsageError("--instance-file needs a path (or - for none)");
      }
      else if (a == "--allow-push-target") o.push.allow_targets.push_back(next());
      else if (a == "--no-push") o.push.enabled = false;
      else if (a == "--retention") add_retention_flag(o.retention, next(), "--retention");
      else throw UsageError("unknown option '" + a + "'");
    }
    if (o.console && o.console_dir.empty()) o.console_dir = default_console_dir();
    if (o.agent == "llm") {
      if (!llm) throw UsageError("--agent llm needs an \"llm\" section in the config file (--config FILE)");
      o.executor = make_llm_executor(*llm);
    }
  } catch (const std::exception &e) {
    std::fprintf(stderr, "toolnexus serve: %s\n(see toolnexus serve --help)\n", store_detail::printable(e.what()).c_str());
    return 2;
  }

  PluginRegistry &registry = PluginRegistry::global();
  for (const std::string &d : plugin_dirs) registry.add_directory(d);
  if (allow_insecure) registry.allow_insecure(true);
  // Every plugin now, not only the store's (open() stops at the scheme's):
  // the server warns at start about each file it refused.
  registry.load();

  // SIGINT/SIGTERM are blocked in every thread (the server's threads inherit
  // this mask) and taken with sigwait() below.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  std::optional<ServerHandle> server;
  try {
    if (!auth_file.empty()) o.auth_tokens = load_auth_tokens(auth_file);
    server.emplace(serve(std::move(o)));
  } catch (const std::exception &e) {
    std::fprintf(stderr, "toolnexus serve: %s\n", store_detail::printable(e.what()).c_str());
    const auto failures = registry.failures();
    for (const PluginFailure &f : failures)
      std::fprintf(stderr, "toolnexus serve: %s\n", plugin_failure_text(f).c_str());
    return 1;
  }
  for (const PluginFailure &f : registry.failures())
    std::fprintf(stderr, "toolnexus serve: warning: %s\n", plugin_failure_text(f).c_str());

  std::printf("listening on %s\n", server->url().c_str());
  if (!server->admin_url().empty()) std::printf("admin listening on %s\n", server->admin_url().c_str());
  std::fflush(stdout);

  int sig = 0;
  while (sigwait(&stop_signals, &sig) != 0) {
  }
  std::fprintf(stderr, "toolnexus serve: %s received, stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
  server->stop();
  server.reset();
  return 0;
}

const Registration registration{"serve", "run an A2A JSON-RPC agent backed by a Task store", &run_serve};

}  // namespace
}  // namespace toolnexus::cli

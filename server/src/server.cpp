// serve(): wires the store, the executor, the lifecycle, the methods and
// the HTTP front end together, and stops them in order.
#include "toolnexus/server.hpp"

#include "service/a2a_methods.hpp"
#include "wire/agent_card.hpp"
#include "wire/auth.hpp"
#include "bindings/jwt_auth.hpp"
#include "wire/web_origin.hpp"
#include "bindings/console.hpp"
#include "bindings/http.hpp"
#include "bindings/operator.hpp"
#include "common/server_metrics.hpp"
#include "domain/metered_store.hpp"
#include "common/log.hpp"
#include "delivery/push.hpp"
#include "domain/instance_id.hpp"
#include "domain/task_lifecycle.hpp"
#include "domain/task_lifecycle_detail.hpp"
#include "domain/task_watch.hpp"
#include "common/util.hpp"

#include "toolnexus/registry.hpp"
#include "toolnexus/task_store.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <mutex>
#include <stdexcept>

#ifndef TOOLNEXUS_VERSION
#define TOOLNEXUS_VERSION "0.0.0"
#endif

namespace toolnexus {

using namespace server_detail;

const char *server_version() noexcept { return TOOLNEXUS_VERSION; }

namespace {
// Executor threads when ServerOptions::workers is 0. On a durable store
// (TNX_CAP_DURABLE) an executor spends most of a short run waiting for its
// save to reach the disk, so the workers bound the saves in flight, and with
// them group commit: 64 let 64 blocking SendMessage clients share fsyncs
// (file: 1,552 -> 3,308 req/s, sqlite: 3,010 -> 4,969 on a journaled ext4);
// 4 serve a memory store, whose runs use the CPU.
unsigned default_workers(const StoreInfo &info) { return (info.capabilities & TNX_CAP_DURABLE) != 0 ? 64 : 4; }
// At stop, after the drain: how long requests and streams get at least to
// write their last bytes (a stream's reconnect frame), in ms.
constexpr int64_t kLastWordsMs = 1000;
}  // namespace

struct ServerHandle::Impl {
  /// The instance identity held (destroyed last: held until all is stopped).
  std::unique_ptr<InstanceClaim> identity;
  std::unique_ptr<Logger> log;
  /// What /metrics shows; outlives everything that counts into it.
  std::unique_ptr<ServerMetrics> metrics;
  std::shared_ptr<TaskStore> store;
  /// `store` with every call timed into `metrics`: what the server uses.
  std::shared_ptr<TaskStore> metered;
  std::unique_ptr<OperatorEndpoints> operator_endpoints;
  /// The console's files (ServerOptions::console); null when off.
  std::unique_ptr<ConsoleFiles> console;
  std::unique_ptr<AdminListener> admin;
  std::string admin_url;
  bool owns_store = false;
  std::unique_ptr<TokenAuth> auth;
  std::unique_ptr<JwtAuth> jwt;
  CardConfig card;
  std::unique_ptr<TaskWatch> watch;
  std::unique_ptr<TaskLifecycle> lifecycle;
  std::unique_ptr<PushDeliverer> push;
  std::unique_ptr<A2AMethods> methods;
  std::unique_ptr<HttpFrontend> http;
  std::string url;
  uint16_t port = 0;
  std::string instance_id;
  int drain_timeout_ms = 10000;
  std::once_flag stop_once;

  void stop() {
    std::call_once(stop_once, [this] {
      using Clock = std::chrono::steady_clock;
      const auto deadline = Clock::now() + std::chrono::milliseconds(drain_timeout_ms);
      // /readyz says 503 from now on (the admin listener answers through
      // the whole stop): balancers stop sending here.
      if (operator_endpoints) operator_endpoints->begin_drain();
      // No new connections; idle ones close; streams stay open.
      if (http) http->begin_stop();
      // No new Tasks; blocking SendMessage waits return now, so requests in
      // progress end.
      if (lifecycle) lifecycle->begin_stop();
      // The drain: streams of Tasks running here stay open until their Task
      // ends (and end as usual) or the drain timeout passes; every other
      // stream, and those left at the timeout, end with a frame telling the
      // client to resubscribe elsewhere (never a silent end).
      if (watch && lifecycle) {
        TaskLifecycle *lc = lifecycle.get();
        watch->begin_drain([lc](const std::string &id) { return lc->running_here(id); });
        lifecycle->wait_idle(deadline);
        watch->end_drain();
      }
      // Requests and streams finish; at least a moment to write the last
      // frames even when the drain used all of its time.
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (http) http->stop(static_cast<int>(std::max<int64_t>(left, kLastWordsMs)));
      if (lifecycle) lifecycle->stop();
      if (push) push->stop();
      if (watch) watch->stop();
      if (admin) admin->stop(kLastWordsMs);
      if (owns_store && store) {
        try {
          store->close();
        } catch (const std::exception &e) {
          log->error(std::string("closing the task store failed: ") + e.what());
        }
      }
      log->info("stopped");
    });
  }
};

ServerHandle::ServerHandle(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ServerHandle::ServerHandle(ServerHandle &&) noexcept = default;
ServerHandle &ServerHandle::operator=(ServerHandle &&other) noexcept {
  if (this != &other) {
    if (impl_) impl_->stop();
    impl_ = std::move(other.impl_);
  }
  return *this;
}
ServerHandle::~ServerHandle() {
  if (impl_) impl_->stop();
}
const std::string &ServerHandle::url() const noexcept { return impl_->url; }
uint16_t ServerHandle::port() const noexcept { return impl_->port; }
const std::string &ServerHandle::admin_url() const noexcept { return impl_->admin_url; }
const std::string &ServerHandle::instance_id() const noexcept { return impl_->instance_id; }
std::shared_ptr<TaskStore> ServerHandle::store() const { return impl_->store; }
ServerStats ServerHandle::stats() const {
  ServerStats s;
  if (impl_->http) {
    s.open_connections = impl_->http->open_connections();
    s.open_streams = impl_->http->open_streams();
  }
  if (impl_->lifecycle) s.queued_tasks = impl_->lifecycle->queued();
  return s;
}
void ServerHandle::stop() {
  if (impl_) impl_->stop();
}

ServerHandle serve(ServerOptions o) {
  const ServerLimits &l = o.limits;
  if (l.max_body_bytes == 0) throw std::invalid_argument("limits.max_body_bytes must be positive");
  if (l.max_json_depth < 2 || l.max_json_depth > kMaxTaskDepth)
    throw std::invalid_argument("limits.max_json_depth must be between 2 and " + std::to_string(kMaxTaskDepth));
  if (l.read_timeout_ms <= 0 || l.keep_alive_timeout_ms <= 0 || l.body_deadline_ms <= 0 ||
      l.header_timeout_ms <= 0 || l.stream_stall_ms <= 0 || l.blocking_timeout_ms < 0)
    throw std::invalid_argument("timeouts must be positive");
  if (l.max_connections == 0) throw std::invalid_argument("limits.max_connections must be positive");
  if (l.max_header_bytes < 1024) throw std::invalid_argument("limits.max_header_bytes must be at least 1024");
  if (l.max_open_connections == 0 || l.max_queued_connections == 0)
    throw std::invalid_argument("limits.max_open_connections and limits.max_queued_connections must be positive");
  if (l.max_task_history == 0 || l.max_message_parts == 0)
    throw std::invalid_argument("limits.max_task_history and limits.max_message_parts must be at least 1");
  if (l.max_task_bytes < 4096)
    throw std::invalid_argument("limits.max_task_bytes must be at least 4096 (got " + std::to_string(l.max_task_bytes) +
                                "): a new Task with one short message takes about 1 KiB");
  if (l.max_queued_tasks == 0 || l.queue_wait_ms < 0)
    throw std::invalid_argument("limits.max_queued_tasks must be positive and limits.queue_wait_ms not negative");
  if (o.idempotency.recent_messages == 0 || o.idempotency.recent_messages > 4096 || o.idempotency.window_ms <= 0)
    throw std::invalid_argument("idempotency.recent_messages must be 1..4096 and idempotency.window_ms positive");
  if (o.lease.lease_ms <= 0 || o.lease.renew_interval_ms <= 0 || o.lease.settle_interval_ms <= 0)
    throw std::invalid_argument("lease times must be positive");
  if (o.lease.cancel_poll_ms < 0 || o.lease.cancel_poll_ms > o.lease.renew_interval_ms)
    throw std::invalid_argument("lease.cancel_poll_ms (" + std::to_string(o.lease.cancel_poll_ms) +
                                ") must be between 0 (= renew_interval_ms) and lease.renew_interval_ms (" +
                                std::to_string(o.lease.renew_interval_ms) + ")");
  if (int64_t{o.lease.renew_interval_ms} * 2 > o.lease.lease_ms)
    throw std::invalid_argument("lease.renew_interval_ms (" + std::to_string(o.lease.renew_interval_ms) +
                                ") must be at most half of lease.lease_ms (" + std::to_string(o.lease.lease_ms) +
                                ") so that a live server's Tasks never look abandoned");

  check_retention(o.retention);

  // Entries that could never match are refused, not kept silently.
  for (const std::string &h : o.card.allowed_hosts)
    if (const std::string why = allowed_host_problem(h); !why.empty())
      throw std::invalid_argument("a2a.allowed_hosts (--allowed-host) entry " + in_quotes(h) + ": " + why);
  for (const std::string &origin : o.card.allowed_origins)
    if (const std::string why = allowed_origin_problem(origin); !why.empty())
      throw std::invalid_argument("a2a.allowed_origins (--allowed-origin) entry " + in_quotes(origin) + ": " + why);

  // URLs the card (and clients) will follow: refused unless absolute http(s)
  // with a host and nothing a client could misread (a blank, a control byte,
  // user@, a fragment), their scheme and host then written in lower case.
  const auto card_url = [](const char *name, std::string &url) {
    std::string normalized;
    if (url.empty()) return;
    if (std::string why = parse_http_url(url, normalized); !why.empty())
      throw std::invalid_argument(std::string(name) + " " + in_quotes(url) + ": " + why);
    url = std::move(normalized);
  };
  card_url("a2a.public_url (--public-url)", o.card.public_url);
  card_url("a2a.documentation_url", o.card.documentation_url);
  card_url("a2a.provider.url", o.card.provider_url);
  if (o.jwt.enabled()) {
    check_jwt_options(o.jwt, "auth.jwt");
    normalize_jwt_urls(o.jwt);
  }

  std::string host;
  uint16_t port = 0;
  split_listen(o.listen, host, port);

  auto impl = std::make_unique<ServerHandle::Impl>();
  impl->log = std::make_unique<Logger>(o.log_level, std::move(o.log_sink));
  impl->drain_timeout_ms = o.drain_timeout_ms;
  impl->metrics = std::make_unique<ServerMetrics>();
  std::string admin_host;
  uint16_t admin_port = 0;
  if (!o.admin_listen.empty()) split_listen(o.admin_listen, admin_host, admin_port);
  if (o.console) {
    if (o.console_dir.empty())
      throw std::invalid_argument("the console is on but no console directory is set (ServerOptions::console_dir)");
    impl->console = std::make_unique<ConsoleFiles>(o.console_dir);
  }

  if (o.streams.max_streams == 0 || o.streams.keepalive_ms <= 0 || o.streams.poll_ms <= 0)
    throw std::invalid_argument("streams.max_streams, streams.keepalive_ms and streams.poll_ms must be positive");
  if (o.progress_interval_ms <= 0) throw std::invalid_argument("progress_interval_ms must be positive");
  std::shared_ptr<AgentExecutor> executor =
      o.executor ? o.executor
                 : (o.agent == "echo" ? make_echo_executor(o.echo_chunk_delay_ms) : make_builtin_executor(o.agent));

  if (o.store.store) {
    impl->store = o.store.store;
  } else {
    impl->store = resolve_store(o.store.selector);
    impl->owns_store = true;
  }
  impl->metered = std::make_shared<MeteredStore>(impl->store, *impl->metrics);
  // The instance id: configured, kept on disk, or new.
  if (o.instance_id.empty() && o.instance_file != "-") {
    const std::string base = o.instance_file.empty() && !o.store.store ? default_instance_base(o.store.selector)
                                                                       : o.instance_file;
    if (!base.empty()) {
      impl->identity = std::make_unique<InstanceClaim>(base);
      o.instance_id = impl->identity->id();
    }
  }

  // A peer that disconnects mid-response must not kill the process.
  if (std::signal(SIGPIPE, SIG_IGN) == SIG_ERR) impl->log->warn("could not ignore SIGPIPE");
  // Every open connection and stream is a file descriptor: raise the soft
  // limit towards the hard one so that max_open_connections can be reached.
  {
    rlimit rl{};
    const rlim_t want = static_cast<rlim_t>(l.max_open_connections) + 256;
    if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < want && rl.rlim_cur != RLIM_INFINITY) {
      const rlim_t before = rl.rlim_cur;
      rl.rlim_cur = rl.rlim_max == RLIM_INFINITY ? want : std::min(want, rl.rlim_max);
      if (::setrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < static_cast<rlim_t>(l.max_open_connections))
        impl->log->warn("the open-file limit is " + std::to_string(rl.rlim_cur) + " (was " + std::to_string(before) +
                        "): fewer than limits.max_open_connections connections can be open at once");
    }
  }

  impl->auth = std::make_unique<TokenAuth>(o.auth_tokens);
  impl->card.options = o.card;
  impl->card.skills = executor->skills();
  if (o.jwt.enabled()) impl->jwt = std::make_unique<JwtAuth>(o.jwt, *impl->log);
  impl->card.bearer_auth = impl->auth->enabled() || impl->jwt != nullptr;
  impl->card.bearer_jwt = impl->jwt != nullptr;
  impl->card.jwt_only = impl->jwt != nullptr && !impl->auth->enabled();
  if (impl->jwt != nullptr) impl->card.openid_connect_url = o.jwt.openid_configuration_url;

  LifecycleOptions lo;
  lo.workers = o.workers != 0 ? o.workers : default_workers(impl->store->info());
  lo.max_queued_tasks = l.max_queued_tasks;
  lo.queue_wait_ms = l.queue_wait_ms;
  lo.lease_ms = o.lease.lease_ms;
  lo.renew_interval_ms = o.lease.renew_interval_ms;
  lo.settle_interval_ms = o.lease.settle_interval_ms;
  lo.full_settle_interval_ms = o.lease.full_settle_interval_ms;
  lo.cancel_poll_ms = o.lease.cancel_poll_ms == 0 ? o.lease.renew_interval_ms : o.lease.cancel_poll_ms;
  lo.drain_timeout_ms = o.drain_timeout_ms;
  lo.progress_interval_ms = o.progress_interval_ms;
  lo.instance_id = o.instance_id;
  lo.max_task_history = l.max_task_history;
  lo.max_task_bytes = l.max_task_bytes;
  lo.idempotency.enabled = o.idempotency.enabled;
  lo.idempotency.recent_messages = o.idempotency.recent_messages;
  lo.idempotency.window_ms = o.idempotency.window_ms;
  lo.metrics = impl->metrics.get();
  // A retried SendMessage finds its first outcome through the Task itself
  // (its id is derived from the messageId; its recent messageIds are in its
  // record): a Task deleted before the idempotency window ends would be run
  // again by a retry. So no terminal Task is deleted sooner than that.
  if (o.idempotency.enabled) {
    for (auto &[state, keep] : o.retention.keep_ms) {
      if (keep >= o.idempotency.window_ms) continue;
      impl->log->warn("retention." + state + " (" + format_duration(keep) +
                      ") is shorter than idempotency.window_ms (" + format_duration(o.idempotency.window_ms) +
                      "): such Tasks are kept " + format_duration(o.idempotency.window_ms) +
                      ", so that a retried SendMessage finds its Task instead of running it again");
      keep = o.idempotency.window_ms;
    }
  }
  if (!o.retention.empty()) impl->log->info("retention: " + describe_retention(o.retention));
  lo.retention = o.retention;
  // Deliveries pending give a due time, when this server delivers them.
  if (o.push.enabled) lo.due_of = push_due_us;
  WatchOptions wo;
  wo.poll_ms = o.streams.poll_ms;
  wo.max_subscribers = o.streams.max_streams;
  wo.idle_tick_ms = std::max(10, std::min(1000, o.streams.keepalive_ms / 2));
  impl->watch = std::make_unique<TaskWatch>(impl->metered, wo, *impl->log);
  impl->lifecycle = std::make_unique<TaskLifecycle>(impl->metered, executor, lo, *impl->log, *impl->watch);
  impl->instance_id = impl->lifecycle->instance_id();
  if (o.push.enabled) {
    const PushOptions &p = o.push;
    if (p.timeout_ms <= 0 || p.max_attempts <= 0 || p.backoff_initial_ms <= 0 || p.backoff_max_ms <= 0 ||
        p.give_up_after_ms <= 0 || p.sweep_interval_ms <= 0 || p.max_configs_per_task == 0)
      throw std::invalid_argument("push timeouts, attempts, backoffs, intervals and max_configs_per_task must be positive");
    impl->push = std::make_unique<PushDeliverer>(*impl->lifecycle, o.push, *impl->log);
    PushDeliverer *pusher = impl->push.get();
    impl->watch->set_listener([pusher](const Snapshot &s) { pusher->notify(s); });
  }
  impl->card.push_notifications = o.push.enabled;
  impl->methods = std::make_unique<A2AMethods>(*impl->lifecycle, *impl->log, l.max_json_depth,
                                               l.blocking_timeout_ms, impl->push.get(), l.max_message_parts,
                                               std::max<std::size_t>(1, l.max_connections / 2));

  {
    ServerHandle::Impl *self = impl.get();
    impl->operator_endpoints = std::make_unique<OperatorEndpoints>(impl->metered, *impl->metrics, [self] {
      GaugeValues g;
      if (self->lifecycle) {
        g.tasks_running = self->lifecycle->running();
        g.tasks_queued = self->lifecycle->queued();
        g.change_feed = self->lifecycle->watch().has_feed();
        g.change_feed_gaps = self->lifecycle->watch().feed_gaps();
        g.watch_rereads = self->lifecycle->watch().rereads();
      }
      if (self->http) {
        g.streams_open = self->http->open_streams();
        g.connections_open = self->http->open_connections();
      }
      return g;
    });
  }
  HttpServices services;
  services.operator_endpoints = impl->operator_endpoints.get();
  services.metrics = impl->metrics.get();
  services.console = impl->console.get();
  services.methods = impl->methods.get();
  services.auth = impl->auth.get();
  services.jwt = impl->jwt.get();
  services.card = &impl->card;
  services.log = impl->log.get();
  services.watch = impl->watch.get();
  services.streams.max_streams = o.streams.max_streams;
  services.streams.keepalive_ms = o.streams.keepalive_ms;
  services.limits = l;
  const std::string url_host = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  services.fallback_host = url_host;
  impl->http = std::make_unique<HttpFrontend>(host, port, services);
  impl->port = impl->http->port();
  impl->url = "http://" + url_host + ":" + std::to_string(impl->port) + "/";

  if (!o.admin_listen.empty()) {
    impl->admin = std::make_unique<AdminListener>(admin_host, admin_port, *impl->operator_endpoints, *impl->log);
    const std::string h = admin_host.find(':') != std::string::npos ? "[" + admin_host + "]" : admin_host;
    impl->admin_url = "http://" + h + ":" + std::to_string(impl->admin->port()) + "/";
  }

  impl->watch->start();
  impl->lifecycle->start();
  if (impl->push) impl->push->start();
  impl->http->start();
  if (impl->admin) impl->admin->start();
  const StoreInfo info = impl->store->info();
  impl->log->info("serving A2A at " + impl->url + " (store " + info.scheme +
                  (info.plugin_name.empty() ? std::string() : " via " + info.plugin_name) + " [" +
                  capability_names(info.capabilities) + "], agent " +
                  executor->name() + ", instance " + impl->instance_id +
                  (impl->identity ? " kept in " + impl->identity->path() : std::string()) + " on " + host_name() +
                  " pid " +
                  std::to_string(::getpid()) +
                  (impl->auth->enabled() ? ", bearer authentication on" : "") +
                  (impl->jwt ? ", bearer JWTs from " + o.jwt.issuer : std::string()) + ")");
  if (impl->admin) impl->log->info("admin endpoints (/healthz, /readyz, /metrics) at " + impl->admin_url);
  if ((info.capabilities & TNX_CAP_PERSISTENT) != 0 && (info.capabilities & TNX_CAP_MULTI_PROCESS) == 0)
    impl->log->info("this store's compare-and-set holds within this process only: servers in other processes "
                    "must not share it (run replicas on a multi-process store such as sqlite)");
  return ServerHandle(std::move(impl));
}

int64_t task_due_us(const Task &task) {
  int64_t due = server_detail::push_due_us(task);
  const std::string_view state = task.state();
  if (state == task_state::kSubmitted || state == task_state::kWorking) {
    const server_detail::lifecycle_detail::Lease l = server_detail::lifecycle_detail::read_lease(task);
    if (l.present && l.expires_us != kNoTime && (due == kNoTime || l.expires_us < due)) due = l.expires_us;
  }
  return due;
}

int64_t task_due_us(const Task &task, const RetentionOptions &retention) {
  const int64_t due = task_due_us(task);
  const int64_t kept = retention_due_us(task, retention);
  return kept != kNoTime && (due == kNoTime || kept < due) ? kept : due;
}

}  // namespace toolnexus

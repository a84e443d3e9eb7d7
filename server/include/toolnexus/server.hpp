// toolnexus/server.hpp: the embedding API of the A2A JSON-RPC server
// ("toolnexus serve"). serve() starts a server (an epoll event loop over
// Poco sockets and Poco's HTTP message parsing, server/src/wire/http_reactor.hpp) and
// returns a handle; every Task read and write goes through the configured
// TaskStore (nothing is kept in memory as the truth), so several servers may
// share one store.
//
// HTTP surface (A2A v1.0 section 9 JSON-RPC, section 11 HTTP+JSON, section
// 8 Agent Card; v0.3 section 3.2 and 5.3):
//   POST /                              JSON-RPC 2.0 (SendMessage/message/send,
//                                       SendStreamingMessage/message/stream and
//                                       SubscribeToTask/tasks/resubscribe (SSE),
//                                       GetTask/tasks/get, CancelTask/tasks/cancel,
//                                       ListTasks/tasks/list); v1.0 shapes with
//                                       A2A-Version: 1.0, v0.3 without
//   POST /message:send, POST /message:stream, GET /tasks/{id},
//   POST /tasks/{id}:cancel, GET|POST /tasks/{id}:subscribe, GET /tasks
//                                       HTTP+JSON (v1.0), also under /{tenant}/
//   GET  /.well-known/agent-card.json   Agent Card (also /.well-known/agent.json)
//   GET  /healthz, /readyz              probes (no authentication; /metrics on
//                                       the admin listener, ServerOptions::admin_listen)
//   anything else                       404 (405 for a REST path's wrong method)
// Clients never see the server's bookkeeping (Task metadata "toolnexus/*").
#ifndef TOOLNEXUS_SERVER_HPP
#define TOOLNEXUS_SERVER_HPP

#include "toolnexus/agent_executor.hpp"
#include "toolnexus/jwt_options.hpp"
#include "toolnexus/retention.hpp"
#include "toolnexus/task_store.hpp"

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace toolnexus {

/// Log levels, most to least severe. Errors are always logged.
enum class LogLevel { error = 0, warn = 1, info = 2, debug = 3 };

/// "error", "warn", "info", "debug" -> LogLevel; throws std::invalid_argument
/// on anything else.
LogLevel parse_log_level(std::string_view name);

/// Which store the server uses: a selector string for resolve_store() (the
/// server opens it and closes it on stop) or a store object (used as-is and
/// never closed by the server: the caller owns it). Implicitly constructible
/// from both, so `opts.store = "file:/var/tasks";` and
/// `opts.store = my_store;` both work.
struct StoreSpec {
  /// A new memory store.
  StoreSpec() = default;
  /// A selector ("memory", "file:<dir>", "sqlite:<path>", "<scheme>:...").
  StoreSpec(std::string sel) : selector(std::move(sel)) {}
  /// A selector; nullptr is "" (a new memory store).
  StoreSpec(const char *sel) : selector(sel == nullptr ? "" : sel) {}
  /// A store object (TaskStore or a class derived from it), shared with the
  /// caller (never closed by the server).
  template <class T, class = std::enable_if_t<std::is_base_of_v<TaskStore, T>>>
  StoreSpec(std::shared_ptr<T> s) : store(std::move(s)) {}
  /// resolve_store() selector; "" or "memory" is a new memory store.
  std::string selector = "memory";
  /// When set, used instead of the selector.
  std::shared_ptr<TaskStore> store;
};

/// Agent Card fields (A2A v0.3 section 5.5 AgentCard).
struct AgentCardOptions {
  std::string name = "toolnexus";
  std::string description = "A2A agent served by toolnexus; Tasks persist in a pluggable store.";
  /// The agent's version ("" = the toolnexus version).
  std::string version;
  /// provider.organization / provider.url; the provider is left out of the
  /// card unless organization is set.
  std::string provider_organization;
  std::string provider_url;
  /// documentationUrl ("" = left out).
  std::string documentation_url;
  // provider_url, documentation_url and public_url, when set, must be
  // absolute http(s) URLs with a host, no user name, no fragment, only
  // printable ASCII and at most 2048 bytes: serve() throws
  // std::invalid_argument naming the field and what is wrong, and writes
  // their scheme and host in lower case.
  /// The card's "url", used as is whatever a request says. "" = derived
  /// from each card request, but only from what names this server (the
  /// card is cacheable: a client's forged Host or X-Forwarded-Host must not
  /// make it point other clients at an attacker): forwarded headers when
  /// trust_forwarded, the Host header when it is one of allowed_hosts, this
  /// connection's own local ADDR:PORT or (on a loopback connection) a
  /// loopback name; else the local address the request arrived on. See
  /// docs/configuration.md ("The card's url").
  std::string public_url;
  /// A reverse proxy in front sets Forwarded (RFC 7239 proto=, host=) or
  /// X-Forwarded-Proto / X-Forwarded-Host, and strips what clients send:
  /// the card's url follows them (limited to allowed_hosts when that is not
  /// empty). Off by default: clients that reach the server directly could
  /// send anything there.
  bool trust_forwarded = false;
  /// Host names the card's url may take from the Host header (and, when not
  /// empty, the only ones it may take from forwarded headers): "name" (any
  /// port) or "name:port", compared without case ("agents.example.com",
  /// "[2001:db8::1]:8443"). They are also the names an API request's Host
  /// may give besides this server's own address (and, on a loopback
  /// connection, a loopback name) and public_url's host: any other is
  /// refused 421, so that a web page on a rebound DNS name cannot read or
  /// change Tasks. "*" turns that check off (the card still takes only the
  /// names above). A name is a DNS name (letters, digits, '-', '.', '_'),
  /// an IPv4 address or a bracketed IPv6 address, a port 1..65535: serve()
  /// throws std::invalid_argument naming any other entry (a URL, a path,
  /// "*.example", "").
  std::vector<std::string> allowed_hosts;
  /// Origins (RFC 6454: "https://console.example.com", scheme://host[:port])
  /// whose web pages may call the API from a browser, besides this server's
  /// own origin; "*" allows any. A request with an Origin header that is
  /// neither is refused 403 (a page on another site could otherwise cancel
  /// Tasks blind: with authentication off nothing else stops a browser's
  /// simple cross-site POST). Origins compare by scheme, host and port
  /// (RFC 6454 section 5; "https://h" is "https://h:443"); this server's own
  /// origin is http and the Host, or with trust_forwarded the forwarded
  /// scheme and host, or public_url's. Answers to an allowed origin carry
  /// the CORS fields (Fetch standard; Access-Control-Allow-Origin echoes
  /// the origin) and OPTIONS preflights are answered 204. An entry is "*"
  /// or "http(s)://host[:port]" without a path: serve() throws
  /// std::invalid_argument naming any other.
  std::vector<std::string> allowed_origins;
  /// Seconds a client or cache may keep the card without asking again: the
  /// card is served with "Cache-Control: public, max-age=N" and a strong
  /// ETag (SHA-256 of its bytes), and a conditional GET whose If-None-Match
  /// matches is answered 304 (A2A v1.0 section 8.6.1; RFC 9110 section
  /// 13.1.2). 0..31536000; 0 makes clients revalidate every time.
  int cache_max_age_s = 300;
};

/// Limits on what a client may send and how long it may take. Connections
/// are served by one event loop (server/src/wire/http_reactor.hpp): a connection
/// costs a thread only while a complete request is being handled, so slow or
/// idle clients never hold the request threads.
struct ServerLimits {
  /// Largest request body; larger gets 413 (announced by Content-Length:
  /// answered before the body is read; chunked: as soon as it passes).
  std::size_t max_body_bytes = 1 << 20;
  /// Largest request header (request line and fields); larger gets 431.
  std::size_t max_header_bytes = 32 * 1024;
  /// Deepest JSON nesting (objects + arrays) accepted; checked by a linear,
  /// non-recursive scan before parsing. At most 64 (Task::parse's limit).
  int max_json_depth = 64;
  /// A client silent this long is dropped: a new connection that sends
  /// nothing, a request whose header or body stops arriving (408), a
  /// response the client does not read.
  int read_timeout_ms = 10000;
  /// Idle time after a response (no byte of a next request) after which a
  /// keep-alive connection is closed.
  int keep_alive_timeout_ms = 10000;
  /// The whole request header must arrive within this many ms of its first
  /// byte, else 408 (a client trickling header bytes is cut off; slowloris).
  int header_timeout_ms = 10000;
  /// Whole-body deadline, from the end of the header: a body not fully
  /// received by then gets 408.
  int body_deadline_ms = 30000;
  /// Request threads: requests handled at once (a blocking SendMessage holds
  /// one while it waits). Idle, slow and streaming connections hold none.
  unsigned max_connections = 128;
  /// Complete requests waiting for a request thread; beyond that 503.
  unsigned max_queued_connections = 512;
  /// Open sockets (idle, reading, handled, streaming); connections beyond
  /// it are closed at once. The server raises its open-file limit to fit.
  std::size_t max_open_connections = 20000;
  /// An SSE stream whose client reads nothing for this long is dropped (the
  /// client can reconnect with Last-Event-ID).
  int stream_stall_ms = 60000;
  /// Tasks waiting for a worker. A SendMessage that finds the queue full
  /// waits (up to queue_wait_ms) for room before its Task is created, so
  /// clients are slowed to the rate the workers sustain; after that it
  /// answers -32603 "server busy" and creates nothing.
  std::size_t max_queued_tasks = 4096;
  /// How long a SendMessage waits for room in a full queue.
  int queue_wait_ms = 10000;
  /// Longest a blocking SendMessage (the default; v0.3
  /// configuration.blocking: false and v1.0 returnImmediately: true do not
  /// block) waits for a terminal or interrupted state; then it answers with
  /// the Task as it is.
  int blocking_timeout_ms = 60000;
  /// Messages a Task's history may hold once a client's message is added:
  /// a SendMessage continuing a Task whose history already holds this many
  /// is refused (JSON-RPC -32602 invalid params, HTTP+JSON 400
  /// INVALID_ARGUMENT; the error names limits.max_task_history, the limit
  /// and the size) and the Task is left exactly as it was. The agent's own
  /// messages (its replies, status updates) count toward it but are never
  /// refused; they are bounded by max_task_bytes. At least 1.
  std::size_t max_task_history = 1000;
  /// Parts one message may have (A2A Message.parts); a message with more is
  /// refused (-32602 / 400, field params.message.parts), whatever the Task.
  /// At least 1.
  std::size_t max_message_parts = 100;
  /// Largest stored Task: its JSON as the store saves it (history,
  /// artifacts, metadata, the server's bookkeeping), in bytes. A client's
  /// message (new Task or continuation) or push notification config that
  /// would make a Task larger is refused (-32602 / 400, naming
  /// limits.max_task_bytes, the limit and the size) and nothing is saved.
  /// An agent's output (artifacts, status updates, its outcome) that would
  /// is not saved: the run is asked to stop (cancel_requested) and the
  /// Task fails with a status message giving the sizes; what was saved
  /// before is kept. The server's own records that end a Task (a cancel,
  /// that failure, a settled lease) are always saved, and may take it past
  /// the limit by their status message. At least 4096.
  std::size_t max_task_bytes = std::size_t{8} << 20;
};

/// Idempotent SendMessage retries (docs/a2a.md, "Idempotent retries";
/// issue 22 item 2). A SendMessage sent again with the same messageId by
/// the same principal (and tenant) gets the outcome of the first: the same
/// Task, no second Task and no second turn, on any server sharing the store
/// and after a restart. A new Task's id is a version 5 UUID of (tenant,
/// principal, message.contextId or "", messageId), saved create-only before
/// it runs; every Task keeps metadata["toolnexus/recentMessages"]: its last
/// `recent_messages` client messages as {messageId, digest (SHA-256 of the
/// message body), at}, for `window_ms`. The same messageId with a different
/// body is refused: JSON-RPC -32602, HTTP+JSON 400 INVALID_ARGUMENT, field
/// params.message.messageId; nothing changes.
struct IdempotencyOptions {
  /// Off: a new Task gets a random id (a retry makes another Task) and a
  /// blocking SendMessage may save its new Task once, with its outcome,
  /// instead of twice (see docs/a2a.md for the cost measured).
  bool enabled = true;
  /// Entries kept per Task, 1..4096; the oldest is dropped first.
  std::size_t recent_messages = 32;
  /// How long (ms, at least 1) an entry is kept and matched. A retry of a
  /// first message after it, with the same body, still finds its Task (the
  /// id is derived from it); a retry of a later message is a new message.
  int64_t window_ms = 86400000;
};

/// Leases of running Tasks (see TaskLifecycle in server/src): a Task in
/// submitted/working records metadata["toolnexus/lease"] =
/// {"instance", "expiresAt"} (the server logs its instance id with its host
/// and pid at start; clients see only the id); the instance renews it while the
/// Task runs; any server settles (fails) Tasks whose lease expired. A server
/// also settles at once, at start, the Tasks leased by its own instance id
/// before it started (it crashed or was killed while they ran; see
/// ServerOptions::instance_file), without waiting for the lease to expire.
struct LeaseOptions {
  /// Lease length.
  int lease_ms = 30000;
  /// How often a running Task's lease is renewed; must be well under
  /// lease_ms (serve() refuses renew_interval_ms * 2 > lease_ms).
  int renew_interval_ms = 10000;
  /// How often this server looks for expired leases (also once at start).
  /// On a store with a due index (capability due-index) such a look reads
  /// only the Tasks due; see full_settle_interval_ms.
  int settle_interval_ms = 10000;
  /// On a store with a due index: how often the look for expired leases
  /// reads every submitted and working Task instead of only the due ones
  /// (always at start), to find Tasks saved without a due time: by an older
  /// server sharing the store, or by `toolnexus store put`. 0 = only at
  /// start.
  int full_settle_interval_ms = 3600000;
  /// How often each Task running here is re-read from the store to notice a
  /// cancel made by another server sharing the store (0 = renew_interval_ms;
  /// a renewal re-reads the Task too). When the Task is found canceled (or
  /// otherwise terminal, settled, removed or leased by another instance), the
  /// executor's ExecutionContext::cancel_requested becomes true and its result
  /// is discarded. Bound: a cancel on another server is seen here within
  /// cancel_poll_ms + max(5, min(cancel_poll_ms, renew_interval_ms) / 4) ms
  /// (plus one store read), after which the executor stops as soon as it next
  /// polls cancel_requested. Must not exceed renew_interval_ms.
  int cancel_poll_ms = 0;
};

/// Server-sent-event streams: SendStreamingMessage and SubscribeToTask (A2A
/// v1.0 sections 3.1.2, 3.1.6, 11.7; v0.3 message/stream, tasks/resubscribe).
/// Each frame's SSE id is the Task's event sequence number, stored with the
/// Task: a client reconnecting with Last-Event-ID gets every event after it,
/// from any server sharing the store, or the Task snapshot when the Task's
/// timeline (its last 64 events) no longer holds them.
struct StreamOptions {
  /// Streams open at once, at most; past it the request is answered
  /// "too many open streams" (JSON-RPC -32603; HTTP+JSON 503).
  std::size_t max_streams = 10000;
  /// An idle stream gets an SSE comment ": keep-alive" this often.
  int keepalive_ms = 15000;
  /// Stores without a change feed (ABI 1.4, TaskStore::watch_changes)
  /// only: a Task someone streams or waits for that did not change on this
  /// server is re-read from the store this often, so a change made by
  /// another server sharing the store reaches this server's streams within
  /// poll_ms (plus one store read). With a feed nothing is polled: the
  /// changes it reports are read at once.
  int poll_ms = 200;
};

/// Push notifications (A2A v1.0 sections 3.1.7-3.1.10, 4.3, 13.2; v0.3
/// tasks/pushNotificationConfig/*): configs are stored with their Task;
/// every event of the Task is POSTed to each config's webhook, at least
/// once, retried with exponential backoff, by whichever server moves the
/// Task (a sweep catches up after a restart). See server/src/push.hpp.
struct PushOptions {
  /// false: the card says pushNotifications: false and the config methods
  /// answer -32003 PushNotificationNotSupported.
  bool enabled = true;
  /// Webhook addresses that the IANA IPv4/IPv6 special-purpose registries
  /// say are not globally reachable (loopback, private, link-local, ...;
  /// an IPv6 form carrying an IPv4 address is judged by that address) are
  /// refused (SSRF; A2A v1.0 section 13.2) unless one of these CIDR ranges
  /// holds them ("127.0.0.0/8", "10.1.0.0/16", "::1/128"); "*" allows every
  /// address. See docs/streaming.md, "Targets (SSRF)".
  std::vector<std::string> allow_targets;
  /// Per POST: connect, send and receive timeout.
  int timeout_ms = 10000;
  /// Failed POSTs of one event before the config gives up (until the Task's
  /// next event).
  int max_attempts = 10;
  /// Backoff after the first failure; doubles each time, at most
  /// backoff_max_ms (plus or minus 10% jitter).
  int backoff_initial_ms = 1000;
  int backoff_max_ms = 300000;
  /// A config failing this long gives up too.
  int give_up_after_ms = 24 * 3600 * 1000;
  /// How often the store is swept for deliveries left unfinished (by a
  /// restart, or another server); also once at start. On a store with a due
  /// index (capability due-index) a sweep reads only the Tasks whose
  /// delivery is due; see full_sweep_interval_ms.
  int sweep_interval_ms = 60000;
  /// On a store with a due index: how often the sweep reads every Task
  /// changed within give_up_after_ms and every running one instead of only
  /// the due ones (always at start), to find deliveries saved without a due
  /// time, by an older server sharing the store. 0 = only at start.
  int full_sweep_interval_ms = 3600000;
  /// Delivery threads kept running when idle. Deliveries are queued per
  /// target (a webhook's scheme://host:port) and taken round robin over
  /// targets; more threads are started on demand, up to max_in_flight, so a
  /// target that hangs until timeout_ms holds one thread, not the queue.
  unsigned workers = 2;
  /// POSTs in flight at once, in all (the most delivery threads). Targets
  /// whose last delivery failed together hold at most
  /// max_in_flight - max(1, max_in_flight / 4) of them, and one each.
  unsigned max_in_flight = 64;
  /// POSTs in flight at once to one target (each for a different Task; one
  /// Task's events to a config go one at a time, in order).
  unsigned max_in_flight_per_target = 2;
  /// Configs one Task may have.
  std::size_t max_configs_per_task = 10;
};

/// Receives every log line the server writes (level, text without newline).
/// Called from any thread; must be thread-safe.
using LogSink = std::function<void(LogLevel, std::string_view)>;

/// Everything serve() needs. Plain value type.
struct ServerOptions {
  /// "HOST:PORT" ("[::1]:PORT" for IPv6). Port 0 picks a free port.
  std::string listen = "127.0.0.1:8080";
  /// HOST:PORT of the admin listener ("" = none): GET /healthz, /readyz and
  /// /metrics (Prometheus text format 0.0.4), no authentication, kept
  /// answering through the whole stop (/readyz 503 from its first moment).
  /// The API listener serves /healthz and /readyz too, never /metrics.
  /// See docs/operations.md, "Running replicas".
  std::string admin_listen;
  /// The store; default a new memory store.
  StoreSpec store;
  /// The executor; when null, the built-in called `agent` is used.
  std::shared_ptr<AgentExecutor> executor;
  /// Built-in executor name ("echo", "approval") used when `executor` is null.
  std::string agent = "echo";
  AgentCardOptions card;
  ServerLimits limits;
  LeaseOptions lease;
  /// Bearer tokens -> principal names. Empty = authentication off (every
  /// caller is the anonymous principal ""). See load_auth_tokens().
  std::map<std::string, std::string> auth_tokens;
  /// Bearer JWTs (OAuth 2 / OIDC access tokens), validated against an
  /// issuer's keys; off unless jwt.enabled() (a JWKS file or URL set).
  /// With auth_tokens too, a bearer credential the token file knows is its
  /// principal, any other is validated as a JWT: both kinds of caller are
  /// served, in one principal namespace (docs/configuration.md, "JWT
  /// bearer tokens"). serve() throws std::invalid_argument on bad options
  /// or an unusable JWKS file.
  JwtOptions jwt;
  /// Worker threads running executors. 0 = by the store: 64 on a store with
  /// TNX_CAP_DURABLE (file:, sqlite:, postgres), whose executors mostly
  /// wait for their saves to reach the disk, so the workers bound the saves
  /// in flight that can share one fsync; 4 otherwise (memory).
  unsigned workers = 0;
  /// Streams.
  StreamOptions streams;
  /// Push notifications.
  PushOptions push;
  /// Idempotent SendMessage retries.
  IdempotencyOptions idempotency;
  /// How long Tasks are kept in each terminal state and may wait in
  /// input-required/auth-required (toolnexus/retention.hpp; empty = all
  /// kept, none expires). Swept with the leases (every
  /// lease.settle_interval_ms, reading only what is due on a store with a
  /// due index; every Task a rule matches at start and every
  /// lease.full_settle_interval_ms). Servers sharing a store should share
  /// the policy: each records its own deadlines in the due times it saves.
  RetentionOptions retention;
  /// An executor's progress reports (TaskProgress) are saved at most this
  /// often; a run still going after this long has "working" saved.
  int progress_interval_ms = 100;
  /// The built-in echo agent's pause between the chunks of its reply.
  int echo_chunk_delay_ms = 0;
  /// On stop, how long running executors may take to finish. The SSE
  /// streams of their Tasks stay open meanwhile and end with the Task; a
  /// stream whose Task does not run here, or outlives this, ends with a
  /// frame telling the client to resubscribe elsewhere (docs/streaming.md,
  /// "Server stop").
  int drain_timeout_ms = 10000;
  /// The approval console (docs/console.md): a web page under /console/
  /// that lists, opens, approves, denies and cancels Tasks through this
  /// server's own HTTP+JSON API with the user's bearer token. Off = /console/
  /// answers 404 like any unknown path.
  bool console = false;
  /// The directory whose files the console serves (index.html, *.js, *.css;
  /// read once at serve(), so a change needs a restart). Only its regular
  /// files are served, by exact name; a symlink that leads outside it is
  /// skipped. Required when `console` is on (the CLI defaults it to
  /// <exe>/../share/toolnexus/console, the installed and build-tree copy);
  /// a missing directory or one without index.html makes serve() throw
  /// std::invalid_argument naming it.
  std::string console_dir;
  /// Lines below this level are not written (errors always are).
  LogLevel log_level = LogLevel::info;
  /// Where log lines go (default: stderr, one line each).
  LogSink log_sink;
  /// This server's instance id in leases. Must be unique among servers
  /// sharing a store (and the same across restarts of one server, for the
  /// restart to settle what it left: see instance_file). "" = the id kept in
  /// instance_file, or a new UUID when there is no such file.
  std::string instance_id;
  /// Where the instance id is kept across restarts when instance_id is "":
  /// files "<instance_file>-0", "-1", ..., each holding one id; the server
  /// takes the first one no running server holds (an OFD lock held while it
  /// runs, dropped by the kernel however the process ends), creating it
  /// when missing. So replicas on one store get different ids, and a server
  /// restarted after a crash gets its own back and settles the Tasks it
  /// left running at once (see LeaseOptions). "" = derived from the store
  /// selector: file:DIR -> DIR/.toolnexus-instance, sqlite:PATH ->
  /// PATH.toolnexus-instance, none for other stores; "-" = none (a new UUID
  /// each start). A file that cannot be created or locked stops serve()
  /// (std::runtime_error naming it).
  std::string instance_file;
};

/// What a running server holds right now.
struct ServerStats {
  /// Open client sockets (idle, reading, handled, writing, streaming).
  std::size_t open_connections = 0;
  /// Open SSE streams.
  std::size_t open_streams = 0;
  /// Tasks queued for a worker.
  std::size_t queued_tasks = 0;
};

/// A running server. Move-only. Destroying it stops the server.
/// Thread-safe: url()/port()/instance_id()/store() may be called from any
/// thread; stop() is idempotent and may be called from any thread but the
/// server's own request threads.
class ServerHandle {
 public:
  ServerHandle(ServerHandle &&) noexcept;
  ServerHandle &operator=(ServerHandle &&) noexcept;
  ~ServerHandle();

  /// The JSON-RPC endpoint, "http://HOST:PORT/" (HOST as given in listen).
  const std::string &url() const noexcept;
  /// The bound port.
  uint16_t port() const noexcept;
  /// "http://HOST:PORT/" of the admin listener ("" when there is none).
  const std::string &admin_url() const noexcept;
  /// The lease instance id of this server.
  const std::string &instance_id() const noexcept;
  /// The store the server uses.
  std::shared_ptr<TaskStore> store() const;
  /// Counts of what the server holds now (each read atomically; together
  /// a moment's picture).
  ServerStats stats() const;
  /// Stops accepting connections, lets in-flight requests and saves finish
  /// (executors get drain_timeout_ms; the streams of their Tasks stay open
  /// until the Task ends, every other stream, and those left when the drain
  /// timeout passes, end with a reconnect frame), fails Tasks still queued
  /// ("the server stopped before running it"), then closes the store if the
  /// server opened it. Errors while closing are logged, not thrown.
  void stop();

  /// Internal: the running server's parts (server/src/server.cpp).
  struct Impl;
  /// Internal: made by serve().
  explicit ServerHandle(std::unique_ptr<Impl> impl);

 private:
  std::unique_ptr<Impl> impl_;
};

/// Starts a server. Returns once it accepts connections. The server's
/// threads (HTTP connections: limits.max_connections; workers; one lease
/// renewer; one settler) are created here; the first lease sweep runs at
/// once. Sets SIGPIPE to ignored (a client closing mid-response must not end
/// the process). Thread-safe: several servers may run in one process, also
/// on one store object (that is how replicas sharing a store are tested).
/// Throws std::invalid_argument (bad listen address, unknown agent, unknown
/// store selector, inconsistent limits/leases), StoreError (the store's
/// plugin could not open it), std::runtime_error (cannot bind).
ServerHandle serve(ServerOptions options);

/// When a server would want `task` back from its store's due index (ABI
/// 1.5, SaveOptions::due_us), in µs since the epoch: the earlier of its
/// lease's expiry (a submitted or working Task with a server's
/// metadata["toolnexus/lease"]) and its next push delivery (a config with
/// events it has not delivered nor given up on); kNoTime when nothing is
/// due. What `toolnexus store put` and `store copy` record, so that a Task
/// written by hand is swept like one a server saved. Pure; thread-safe;
/// never throws except std::bad_alloc.
int64_t task_due_us(const Task &task);

/// task_due_us() for a server with the retention policy `retention`: also
/// the Task's retention deadline (retention_due_us) when it is earlier.
/// What `store put`, `store copy` and `store gc` record when given the
/// server's config. Pure; thread-safe.
int64_t task_due_us(const Task &task, const RetentionOptions &retention);

/// Reads a token file: a JSON object mapping bearer tokens to principal
/// names, {"<token>": "<principal>", ...}. Throws std::runtime_error naming
/// the file and the problem (unreadable, not JSON, a value not a non-empty
/// string, an empty token). Never puts a token in a message.
std::map<std::string, std::string> load_auth_tokens(const std::filesystem::path &file);

/// The version of toolnexus (e.g. "0.1.0").
const char *server_version() noexcept;

}  // namespace toolnexus

#endif  // TOOLNEXUS_SERVER_HPP

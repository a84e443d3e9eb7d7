// server/src/delivery/push.hpp: push notifications (A2A v1.0 sections 3.1.7-3.1.10,
// 4.3, 13.2; v0.3 section 7.5-7.8, 9.5).
//
// Configs live in the Task record itself, in server-private metadata,
//   metadata["toolnexus/push"] = {"configs": [<config>, ...]}
//   config = {"id", "url", "token"?, "authentication"?: {"scheme",
//             "credentials"?}, "dialect": "1.0" | "0.3", "delivered": <seq>,
//             "attempts"?, "nextAttemptAt"?, "failingSince"?, "lastError"?,
//             "gaveUp"?}
// so they survive restarts, are shared by replicas, are owner-scoped like
// the Task, and go with it when it is deleted. "delivered" is the event
// sequence number (task_events.hpp) up to which the webhook has
// acknowledged (2xx) the Task's events.
//
// Delivery (at least once): after every save, the server that made it
// queues the Task for delivery to each target (webhook origin) it has a
// delivery due for, in that target's own queue (push_scheduler.hpp: round
// robin over targets, bounded in flight per target and in all, so one
// target's timeouts delay no other); a delivery POSTs, per config and in order,
// every event after "delivered" (v1.0: one StreamResponse per event, as
// application/a2a+json; when events have left the timeline, the Task
// snapshot; v0.3: the Task, as application/json), with the config's
// credentials in Authorization ("<scheme> <credentials>") and its token in
// X-A2A-Notification-Token, then saves the new "delivered" with
// compare-and-set. A failed POST (connection error, timeout, non-2xx) is
// retried with exponential backoff (attempts, nextAttemptAt saved in the
// config, so a restart or another replica carries on); after max_attempts
// or give_up_after_ms of failures the config is marked "gaveUp" (logged)
// until its next new event. A delivery that the store failed under (reading
// the Task or saving "delivered") is queued again after a pause, doubling
// per Task while the store keeps failing (store_failed). A sweep at start
// and every sweep_interval_ms
// picks up deliveries that another process left unfinished: on a store
// with a due index (TNX_CAP_DUE_INDEX) every save records when the Task's
// next delivery is due (push_due_us, through LifecycleOptions::due_of), and
// the sweeps after the first read only what is due; the first sweep, and
// every sweep on a store without the index, lists the Tasks changed within
// give_up_after_ms and the running ones.
//
// Targets (SSRF, section 13.2): a webhook URL must be http or https; its
// host is resolved at config time and again at each delivery, and the POST
// goes to a resolved address that is allowed: what the IANA special-purpose
// registries say is not globally reachable is refused unless
// PushOptions::allow_targets lists it (CIDR, or "*"); see push_targets.hpp.
#ifndef TOOLNEXUS_SERVER_PUSH_HPP
#define TOOLNEXUS_SERVER_PUSH_HPP

#include "delivery/push_scheduler.hpp"
#include "delivery/push_targets.hpp"
#include "wire/dialect.hpp"
#include "common/log.hpp"
#include "domain/task_lifecycle.hpp"
#include "domain/task_watch.hpp"
#include "toolnexus/server.hpp"

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace toolnexus::server_detail {


/// metadata key of the push configs.
inline constexpr const char *kPushKey = "toolnexus/push";

/// One push notification config, as a client sets it.
struct PushConfig {
  std::string id;
  std::string url;
  std::string token;
  /// AuthenticationInfo.scheme ("" = none) and credentials.
  std::string scheme;
  std::string credentials;
  /// The dialect of the method that created it: deliveries use its shapes.
  Dialect dialect = Dialect::v1_0;
};

/// Reads a config from a request: v1.0 TaskPushNotificationConfig ({"url",
/// "id"?, "token"?, "authentication"?: {"scheme", "credentials"?}}; the
/// older "schemes": [..] is read too) or v0.3 PushNotificationConfig
/// ({"url", "id"?, "token"?, "authentication"?: {"schemes": [...],
/// "credentials"?}}), checking the URL (http/https, a host) and the target
/// policy. A missing id gets a UUID. Throws RpcError(-32602) naming the
/// member under `field`.
PushConfig read_push_config(const rapidjson::Value &v, Dialect d, const std::string &field,
                            const TargetPolicy &policy);

/// Adds (or, same id, replaces) `cfg` in the Task's stored configs, with
/// "delivered" = `delivered_seq` (the events the webhook will not be sent).
/// Throws RpcError(-32602) when the Task already has `max_configs` others.
void put_push_config(Task &task, const PushConfig &cfg, uint64_t delivered_seq, std::size_t max_configs);

/// The Task's configs (in stored order).
std::vector<PushConfig> push_configs(const Task &task);

/// Removes config `id`; returns whether it was there.
bool remove_push_config(Task &task, std::string_view id);

/// Writes `cfg` of Task `task_id` as the dialect shows a config:
/// v1.0 TaskPushNotificationConfig {"id", "taskId", "url", "token"?,
/// "authentication"?: {"scheme"}} (tenant when set); v0.3
/// TaskPushNotificationConfig {"taskId", "pushNotificationConfig": {"id",
/// "url", "token"?, "authentication"?: {"schemes": [...]}}}. Credentials are
/// never shown back.
void write_push_config(JsonWriter &w, const PushConfig &cfg, std::string_view task_id, std::string_view tenant,
                       Dialect d);

/// When the Task's next push delivery is due, in µs since the epoch: the
/// earliest "nextAttemptAt" of a config with events it has not delivered
/// and has not given up on, the Task's status time (or 1) for such a config
/// without one (due now); kNoTime when no delivery is pending. Pure; the
/// value a save records as the Task's due time (SaveOptions::due_us).
int64_t push_due_us(const Task &task);

/// The target a webhook URL's deliveries are scheduled under: its origin,
/// "scheme://host:port" in lower case ("" for a URL that does not parse).
std::string target_of(std::string_view url);

/// Delivers the Tasks' events to their webhooks (see the file comment),
/// each target's deliveries queued apart (PushScheduler). Thread-safe.
class PushDeliverer {
 public:
  PushDeliverer(TaskLifecycle &lifecycle, PushOptions options, const Logger &log);
  ~PushDeliverer();
  PushDeliverer(const PushDeliverer &) = delete;
  PushDeliverer &operator=(const PushDeliverer &) = delete;

  /// Starts the delivery threads and the sweeper (whose first sweep runs
  /// at once).
  void start();
  /// Stops them (a POST in flight ends by its timeout). Idempotent.
  void stop();

  /// News of a save (from the TaskWatch): queues the Task when it has a
  /// delivery due. Cheap; never blocks on I/O.
  void notify(const Snapshot &snap);

  /// The target policy (for config validation).
  const TargetPolicy &policy() const noexcept { return policy_; }
  const PushOptions &options() const noexcept { return options_; }

 private:
  using Clock = std::chrono::steady_clock;
  void sweep_loop();
  /// One sweep: `full` lists every candidate (the first sweep), otherwise
  /// only what is due when the store has a due index.
  void sweep(bool full);
  void add_full_sweep(std::vector<ListQuery> &queries) const;
  void run_sweep(std::vector<ListQuery> &queries);
  /// Delivers Task `id`'s due events to the configs whose webhook is
  /// `target` (target_of()); returns whether every POST succeeded.
  bool deliver(const std::string &target, const std::string &id);
  /// POSTs `body`; returns "" on a 2xx, else what went wrong.
  std::string post(const PushConfig &cfg, std::string_view task_id, const std::string &body);
  /// The store failed while delivering Task `id` to `target` (not the
  /// webhook's fault): the job runs again after a pause that doubles from
  /// backoff_initial_ms to backoff_max_ms per Task while the store keeps
  /// failing, not only at the next sweep.
  void store_failed(const std::string &target, const std::string &id, const std::string &what);

  TaskLifecycle &lifecycle_;
  PushOptions options_;
  const Logger &log_;
  TargetPolicy policy_;
  PushScheduler scheduler_;

  std::mutex store_retry_mu_;
  std::map<std::string, int> store_retries_;  // Task id -> deliveries in a row the store failed

  std::mutex mu_;
  std::condition_variable sweep_cv_;  // the sweeper
  bool stopping_ = false;
  std::thread sweeper_;
  bool started_ = false;
};

}  // namespace toolnexus::server_detail

#endif  // TOOLNEXUS_SERVER_PUSH_HPP

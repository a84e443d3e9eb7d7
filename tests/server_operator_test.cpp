// The operator endpoints (issue 20 item 4): /healthz and /readyz on the API
// listener before its checks, the admin listener's /metrics and what its
// numbers say after known calls, /readyz when the store fails or hangs, and
// the lock-free counters under threads. (The drain's 503 after SIGTERM:
// server_cli_test; the whole page through a real Prometheus parser:
// metrics_exposition_test.py.)
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include "server_test_support.hpp"

#include "common/metrics.hpp"
#include "toolnexus/retention.hpp"
#include "common/server_metrics.hpp"
#include "domain/metered_store.hpp"

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <regex>

using namespace tnxtest;

namespace {

using namespace toolnexus;

// The value of the sample line `series` ("name{labels}") in an exposition,
// or -1 when the page has no such line.
double sample(const std::string &page, const std::string &series) {
  std::size_t pos = 0;
  while ((pos = page.find(series + " ", pos)) != std::string::npos) {
    if (pos == 0 || page[pos - 1] == '\n') return std::strtod(page.c_str() + pos + series.size() + 1, nullptr);
    pos += series.size();
  }
  return -1;
}

std::string metrics_page(const std::string &admin_url) {
  Connection c(port_of(admin_url));
  HttpResponse r = c.get("/metrics");
  REQUIRE(r.status == 200);
  CHECK(r.header("content-type") == "text/plain; version=0.0.4; charset=utf-8");
  return r.body;
}

// A memory store whose get() can be made to fail or to hang until released.
class GatedStore final : public TaskStore {
 public:
  enum class Mode { pass, fail, hang };
  GatedStore() : inner_(resolve_store("memory")) {}
  void set(Mode m) {
    std::lock_guard<std::mutex> lock(mu_);
    mode_ = m;
    cv_.notify_all();
  }
  std::optional<TaskRecord> get(std::string_view id) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (mode_ == Mode::fail) throw StoreError(Status::io, "the disk went away (test)");
    cv_.wait(lock, [this] { return mode_ != Mode::hang; });
    lock.unlock();
    return inner_->get(id);
  }
  void remove(std::string_view id, uint64_t expected) override { inner_->remove(id, expected); }
  ListPage list(const ListQuery &q) override { return inner_->list(q); }
  StoreInfo info() const override { return inner_->info(); }

 protected:
  uint64_t do_save(const TaskRecord &rec, uint64_t expected) override {
    SaveOptions so;
    so.expected_version = expected;
    so.owner = rec.owner;
    so.tenant = rec.tenant;
    return inner_->save(rec.task(), so);
  }

 private:
  std::shared_ptr<TaskStore> inner_;
  std::mutex mu_;
  std::condition_variable cv_;
  Mode mode_ = Mode::pass;
};

}  // namespace

TEST_CASE("/healthz and /readyz on the API listener: no authentication, no Host/Origin checks, GET and HEAD only") {
  auto o = test_options();
  o.auth_tokens = {{"secret", "alice"}};
  auto server = serve(o);
  CHECK(server.admin_url().empty());
  Connection c(server.port());
  // A request naming another host, from another site's page.
  const auto foreign = [](Connection &conn, const std::string &path) {
    REQUIRE(conn.send_raw("GET " + path + " HTTP/1.1\r\nHost: evil.example\r\nOrigin: https://evil.example\r\n\r\n"));
    return conn.read_response();
  };

  // What a browser on another site could not get from the API, a probe gets.
  HttpResponse api = foreign(c, "/tasks");
  CHECK(api.status == 421);
  Connection c2(server.port());
  HttpResponse h = foreign(c2, "/healthz");
  CHECK(h.status == 200);
  CHECK(h.body == "ok\n");
  CHECK(h.header("content-type") == "text/plain; charset=utf-8");
  CHECK(h.header("cache-control") == "no-store");
  HttpResponse r = foreign(c2, "/readyz");
  CHECK(r.status == 200);
  CHECK(r.body == "ready\n");

  HttpResponse post = c2.post("{}", "", "/readyz");
  CHECK(post.status == 405);
  CHECK(post.header("allow") == "GET, HEAD");
  CHECK(post.body.find("POST is not allowed here; /readyz takes GET or HEAD") != std::string::npos);

  // HEAD: the header block only (Content-Length of the GET's body).
  REQUIRE(c2.send_raw("HEAD /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"));
  REQUIRE(c2.closed_within(1500ms) == false);
  const std::string head = c2.take_received();
  CHECK(head.rfind("HTTP/1.1 200", 0) == 0);
  CHECK(head.find("Content-Length: 3\r\n") != std::string::npos);
  CHECK(head.substr(head.size() - 4) == "\r\n\r\n");

  // /metrics is never on the API listener.
  HttpResponse m = c2.get("/metrics");
  CHECK(m.status == 404);
  CHECK(m.body.find("--admin-listen") != std::string::npos);
}

TEST_CASE("/metrics on the admin listener: 3 GetTask add exactly 3 requests, 3 store reads and 3 latencies") {
  auto o = test_options();
  o.admin_listen = "127.0.0.1:0";
  auto server = serve(o);
  REQUIRE(std::regex_match(server.admin_url(), std::regex(R"(http://127\.0\.0\.1:[0-9]+/)")));
  REQUIRE(server.admin_url() != server.url());
  Client c(server.url());
  const std::string id = task_id(c.send("hello"));
  REQUIRE(state_of(c.wait_settled(id)) == "completed");

  const std::string rpc_get = R"(toolnexus_a2a_requests_total{method="GetTask",dialect="0.3",transport="jsonrpc",code="200"})";
  const std::string get_latency = R"(toolnexus_a2a_request_duration_seconds_count{method="GetTask",transport="jsonrpc"})";
  const std::string store_get = R"(toolnexus_store_operations_total{op="get"})";
  const std::string before = metrics_page(server.admin_url());
  REQUIRE(sample(before, rpc_get) >= 1);  // wait_settled asked at least once
  c.get_task(id);
  c.call("tasks/get", R"({"id":)" + q(id) + "}");  // the v0.3 name is the same method
  c.get_task(id);
  const std::string after = metrics_page(server.admin_url());
  CHECK(sample(after, rpc_get) == sample(before, rpc_get) + 3);
  CHECK(sample(after, get_latency) == sample(before, get_latency) + 3);
  CHECK(sample(after, store_get) == sample(before, store_get) + 3);
  CHECK(sample(after, R"(toolnexus_store_operation_duration_seconds_count{op="get"})") == sample(after, store_get));
  CHECK(sample(after, R"(toolnexus_a2a_requests_total{method="SendMessage",dialect="0.3",transport="jsonrpc",code="200"})") == 1);

  // HTTP+JSON: dialect 1.0, transport rest, the HTTP status; a method A2A
  // does not have is "other"; the probes are not A2A requests.
  Connection rest(server.port());
  CHECK(rest.get("/tasks/" + id).status == 200);
  CHECK(rest.get("/tasks/no-such-task").status == 404);
  c.call("Frobnicate", "{}");
  Connection probe(server.port());
  CHECK(probe.get("/healthz").status == 200);
  const std::string page = metrics_page(server.admin_url());
  CHECK(sample(page, R"(toolnexus_a2a_requests_total{method="GetTask",dialect="1.0",transport="rest",code="200"})") == 1);
  CHECK(sample(page, R"(toolnexus_a2a_requests_total{method="GetTask",dialect="1.0",transport="rest",code="404"})") == 1);
  CHECK(sample(page, R"(toolnexus_a2a_requests_total{method="other",dialect="0.3",transport="jsonrpc",code="200"})") == 1);
  CHECK(page.find("healthz") == std::string::npos);
  CHECK(sample(page, R"(toolnexus_store_errors_total{op="get",error="not_found"})") == -1);  // none is an answer, not an error
  CHECK(sample(page, "toolnexus_tasks_running") == 0);
  CHECK(sample(page, "toolnexus_streams_open") == 0);
  CHECK(sample(page, "toolnexus_ready") == 1);
  CHECK(sample(page, "toolnexus_leases_settled_total") == 0);
  CHECK(sample(page, "toolnexus_retention_records_read_total") == 0);
  CHECK(sample(page, "toolnexus_retention_deleted_total") == 0);
  CHECK(sample(page, "toolnexus_retention_expired_total") == 0);
  // The memory store has a change feed (ABI 1.4): nothing polled, no gap.
  CHECK(sample(page, "toolnexus_change_feed") == 1);
  CHECK(sample(page, "toolnexus_change_feed_gaps_total") == 0);
  // Present; not asserted 0: a save made here whose feed event outruns its
  // publish() on a loaded machine is read once more (harmless, counted).
  CHECK(sample(page, "toolnexus_watch_rereads_total") >= 0);
  CHECK(sample(page, "toolnexus_push_give_ups_total") == 0);

  // The admin listener serves nothing else.
  Connection admin(port_of(server.admin_url()));
  HttpResponse other = admin.get("/tasks/" + id);
  CHECK(other.status == 404);
  CHECK(other.body.find("admin listener") != std::string::npos);
}

TEST_CASE("/readyz: 503 naming the cause when the store fails a read or does not answer in time; 200 once it does") {
  auto store = std::make_shared<GatedStore>();
  auto o = test_options();
  o.store = store;
  o.admin_listen = "127.0.0.1:0";
  auto server = serve(o);
  Connection c(port_of(server.admin_url()));
  CHECK(c.get("/readyz").status == 200);

  store->set(GatedStore::Mode::fail);
  HttpResponse failed = c.get("/readyz");
  CHECK(failed.status == 503);
  CHECK(failed.body.find("not ready: the task store failed a read: ") == 0);
  CHECK(failed.body.find("the disk went away (test)") != std::string::npos);
  CHECK(sample(metrics_page(server.admin_url()), R"(toolnexus_store_errors_total{op="get",error="io"})") == 1);
  CHECK(sample(metrics_page(server.admin_url()), "toolnexus_ready") == 1);  // the drain alone sets it to 0

  store->set(GatedStore::Mode::hang);
  HttpResponse hung = c.get("/readyz");
  CHECK(hung.status == 503);
  CHECK(hung.body == "not ready: the task store did not answer a read within 1000 ms\n");
  // /healthz never touches the store.
  CHECK(c.get("/healthz").status == 200);
  store->set(GatedStore::Mode::pass);
  CHECK(eventually([&] { return c.get("/readyz").status == 200; }));
}

TEST_CASE("counters and histograms count every add from many threads (atomics, no lost update)") {
  using namespace toolnexus::server_detail;
  ServerMetrics m;
  constexpr int kThreads = 4, kEach = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&m, t] {
      for (int i = 0; i < kEach; ++i) {
        // Half the threads share a label set, the others each have their own.
        m.observe_request(t % 2 == 0 ? "GetTask" : "ListTasks", t < 2 ? "0.3" : "1.0", "jsonrpc", 200,
                          static_cast<uint64_t>(i) * 1000);
        m.observe_store(StoreOp::save, 2'000'000, i % 10 == 0 ? "conflict" : nullptr);
      }
    });
  for (auto &t : threads) t.join();
  CHECK(m.requests("GetTask") == 2 * kEach);
  CHECK(m.requests("ListTasks") == 2 * kEach);
  CHECK(m.store_calls(StoreOp::save) == kThreads * kEach);
  const std::string page = m.render(GaugeValues{});
  CHECK(sample(page, "toolnexus_store_cas_conflicts_total") == kThreads * kEach / 10);
  CHECK(sample(page, R"(toolnexus_store_errors_total{op="save",error="conflict"})") == kThreads * kEach / 10);
  // 2 ms: in the 0.0025 bucket and every one above, not in 0.001.
  CHECK(sample(page, R"(toolnexus_store_operation_duration_seconds_bucket{op="save",le="0.001"})") == 0);
  CHECK(sample(page, R"(toolnexus_store_operation_duration_seconds_bucket{op="save",le="0.0025"})") == kThreads * kEach);
  CHECK(sample(page, R"(toolnexus_store_operation_duration_seconds_bucket{op="save",le="+Inf"})") == kThreads * kEach);
  CHECK(sample(page, R"(toolnexus_store_operation_duration_seconds_sum{op="save"})") ==
        doctest::Approx(kThreads * kEach * 0.002));
}

TEST_CASE("label values are escaped as the text format requires") {
  using namespace toolnexus::server_detail;
  std::string l;
  append_label(l, "a", "x\"y\\z\nw");
  append_label(l, "b", "");
  CHECK(l == R"(a="x\"y\\z\nw",b="")");
}

TEST_CASE("the metered store the server uses keeps the inner store's change feed and times each call once") {
  using namespace toolnexus::server_detail;
  ServerMetrics m;
  auto inner = resolve_store("memory");
  MeteredStore store(inner, m);
  std::mutex mu;
  std::vector<StoreChange> seen;
  auto sub = store.watch_changes([&](const StoreChange &c) {
    std::lock_guard<std::mutex> lock(mu);
    seen.push_back(c);
  });
  REQUIRE(sub != nullptr);  // memory has the feed (TNX_CAP_CHANGE_FEED): the wrapper must not hide it
  Task t = Task::parse(R"({"id":"t1","contextId":"c1","status":{"state":"submitted"},"kind":"task"})");
  const uint64_t v = store.save(t);
  REQUIRE(eventually([&] {
    std::lock_guard<std::mutex> lock(mu);
    return !seen.empty();
  }));
  {
    std::lock_guard<std::mutex> lock(mu);
    CHECK(seen[0].kind == StoreChange::Kind::saved);
    CHECK(seen[0].id == "t1");
    CHECK(seen[0].version == v);
  }
  SaveOptions stale;
  stale.expected_version = v + 7;
  CHECK_THROWS_AS(store.save(t, stale), StoreError);  // not the stored version
  CHECK(store.get("t1").has_value());
  CHECK(m.store_calls(StoreOp::save) == 2);
  CHECK(m.store_calls(StoreOp::get) == 1);
  const std::string page = m.render(GaugeValues{});
  CHECK(sample(page, "toolnexus_store_cas_conflicts_total") == 1);
  CHECK(sample(page, R"(toolnexus_store_errors_total{op="save",error="conflict"})") == 1);
}

TEST_CASE("/metrics counts the retention sweeps: records read, Tasks deleted, waits expired") {
  auto o = test_options();
  o.admin_listen = "127.0.0.1:0";
  o.agent = "approval";
  o.lease.settle_interval_ms = 20;
  o.idempotency.window_ms = 100;  // else no terminal Task goes sooner than the window (a day)
  toolnexus::add_retention_rule(o.retention, "canceled", "200ms", {}, "test");
  toolnexus::add_retention_flag(o.retention, "input-required=300ms:failed", "test");
  auto server = serve(o);
  Client c(server.url());
  std::vector<std::string> canceled, waiting;
  for (int i = 0; i < 3; ++i) {
    canceled.push_back(task_id(c.send("a" + std::to_string(i), {}, R"({"blocking":true})")));
    REQUIRE(error_code(c.call("CancelTask", R"({"id":)" + q(canceled.back()) + "}")) == 0);
  }
  for (int i = 0; i < 2; ++i) waiting.push_back(task_id(c.send("b" + std::to_string(i), {}, R"({"blocking":true})")));
  // The 3 canceled Tasks leave the store, the 2 waiting ones end failed.
  REQUIRE(eventually([&] {
    for (const auto &id : canceled)
      if (server.store()->get(id)) return false;
    for (const auto &id : waiting)
      if (state_of(c.get_task(id)) != "failed") return false;
    return true;
  }, 30000ms));
  const std::string page = metrics_page(server.admin_url());
  CHECK(sample(page, "toolnexus_retention_deleted_total") == 3);
  CHECK(sample(page, "toolnexus_retention_expired_total") == 2);
  CHECK(sample(page, "toolnexus_retention_records_read_total") >= 5);
}

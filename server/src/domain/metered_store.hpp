// server/src/domain/metered_store.hpp: a TaskStore that times every call of
// the store it wraps and counts its failures (ServerMetrics::observe_store),
// so that every store call a server makes is measured once, wherever it is
// made from.
#ifndef TOOLNEXUS_SERVER_METERED_STORE_HPP
#define TOOLNEXUS_SERVER_METERED_STORE_HPP

#include "common/server_metrics.hpp"

#include "toolnexus/task_store.hpp"

#include <memory>

namespace toolnexus::server_detail {

/// Forwards every call to `inner` unchanged (results, exceptions) and
/// records its duration and failure in `metrics`, which must outlive it.
/// close() and watch_changes() are forwarded too (the server closes the
/// store it opened; the change feed is the inner store's).
/// Thread-safe as `inner` is.
class MeteredStore final : public TaskStore {
 public:
  MeteredStore(std::shared_ptr<TaskStore> inner, ServerMetrics &metrics)
      : inner_(std::move(inner)), metrics_(metrics) {}

  std::optional<TaskRecord> get(std::string_view id) override;
  void remove(std::string_view id, uint64_t expected_version = kAnyVersion) override;
  ListPage list(const ListQuery &query) override;
  uint64_t count(const ListQuery &query) override;
  StoreInfo info() const override { return inner_->info(); }
  /// The inner store's change feed, unchanged (not timed: it is no call
  /// per change).
  std::unique_ptr<ChangeSubscription> watch_changes(ChangeListener listener) override {
    return inner_->watch_changes(std::move(listener));
  }
  void close() override { inner_->close(); }

 protected:
  uint64_t do_save(const TaskRecord &record, uint64_t expected_version) override;
  std::vector<uint64_t> do_save_batch(const std::vector<TaskRecord> &records,
                                      const std::vector<uint64_t> &expected_versions) override;
  /// Forwarded to the inner store, timed as one save_batch.
  uint64_t do_save_stream(const RecordSource &source, bool one_transaction) override;

 private:
  std::shared_ptr<TaskStore> inner_;
  ServerMetrics &metrics_;
};

}  // namespace toolnexus::server_detail

#endif  // TOOLNEXUS_SERVER_METERED_STORE_HPP

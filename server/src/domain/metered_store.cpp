// Times and counts the calls of a wrapped TaskStore (metered_store.hpp).
#include "domain/metered_store.hpp"

#include <chrono>

namespace toolnexus::server_detail {

namespace {

using Clock = std::chrono::steady_clock;

// The wrapped store's protected do_save/do_save_batch, reached through a
// class derived from TaskStore (a member pointer named through the derived
// class is allowed to it), so that a record goes to the inner store as it
// came, without being parsed into a Task again.
struct Forward : TaskStore {
  static uint64_t save(TaskStore &s, const TaskRecord &r, uint64_t expected) {
    return (s.*(&Forward::do_save))(r, expected);
  }
  static std::vector<uint64_t> save_batch(TaskStore &s, const std::vector<TaskRecord> &r,
                                          const std::vector<uint64_t> &expected) {
    return (s.*(&Forward::do_save_batch))(r, expected);
  }
  static uint64_t save_stream(TaskStore &s, const RecordSource &source, bool one_transaction) {
    return (s.*(&Forward::do_save_stream))(source, one_transaction);
  }
};

// Runs `call`, recording its time and, when it throws, its status name.
template <class Call>
auto timed(ServerMetrics &m, StoreOp op, Call &&call) -> decltype(call()) {
  const auto start = Clock::now();
  const auto ns = [&] {
    return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count());
  };
  try {
    if constexpr (std::is_void_v<decltype(call())>) {
      call();
      m.observe_store(op, ns(), nullptr);
    } else {
      auto r = call();
      m.observe_store(op, ns(), nullptr);
      return r;
    }
  } catch (const StoreError &e) {
    m.observe_store(op, ns(), status_name(e.code()));
    throw;
  } catch (...) {
    m.observe_store(op, ns(), "internal");
    throw;
  }
}

}  // namespace

std::optional<TaskRecord> MeteredStore::get(std::string_view id) {
  return timed(metrics_, StoreOp::get, [&] { return inner_->get(id); });
}

void MeteredStore::remove(std::string_view id, uint64_t expected_version) {
  timed(metrics_, StoreOp::remove, [&] { inner_->remove(id, expected_version); });
}

ListPage MeteredStore::list(const ListQuery &query) {
  return timed(metrics_, StoreOp::list, [&] { return inner_->list(query); });
}

uint64_t MeteredStore::count(const ListQuery &query) {
  return timed(metrics_, StoreOp::count, [&] { return inner_->count(query); });
}

uint64_t MeteredStore::do_save(const TaskRecord &record, uint64_t expected_version) {
  return timed(metrics_, StoreOp::save, [&] { return Forward::save(*inner_, record, expected_version); });
}

std::vector<uint64_t> MeteredStore::do_save_batch(const std::vector<TaskRecord> &records,
                                                  const std::vector<uint64_t> &expected_versions) {
  return timed(metrics_, StoreOp::save_batch,
               [&] { return Forward::save_batch(*inner_, records, expected_versions); });
}

uint64_t MeteredStore::do_save_stream(const RecordSource &source, bool one_transaction) {
  return timed(metrics_, StoreOp::save_batch, [&] { return Forward::save_stream(*inner_, source, one_transaction); });
}

}  // namespace toolnexus::server_detail

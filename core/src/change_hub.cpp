// core/src/change_hub.cpp: see change_hub.hpp.
#include "change_hub.hpp"

namespace toolnexus::detail {
namespace {

class HubSubscription final : public ChangeSubscription {
 public:
  HubSubscription(std::shared_ptr<ChangeHub> hub, uint64_t key, void (ChangeHub::*remove)(uint64_t))
      : hub_(std::move(hub)), key_(key), remove_(remove) {}
  ~HubSubscription() override { ((*hub_).*remove_)(key_); }

 private:
  std::shared_ptr<ChangeHub> hub_;
  uint64_t key_;
  void (ChangeHub::*remove_)(uint64_t);
};

}  // namespace

std::unique_ptr<ChangeSubscription> ChangeHub::add(ChangeListener listener) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t key = next_++;
  listeners_.emplace(key, std::move(listener));
  return std::make_unique<HubSubscription>(shared_from_this(), key, &ChangeHub::remove);
}

void ChangeHub::dispatch(const StoreChange &change) noexcept {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto &kv : listeners_) {
    try {
      kv.second(change);
    } catch (...) {
      // A listener's failure is its own; the others still hear of it.
    }
  }
}

std::size_t ChangeHub::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return listeners_.size();
}

void ChangeHub::remove(uint64_t key) {
  std::lock_guard<std::mutex> lock(mu_);
  listeners_.erase(key);
}

}  // namespace toolnexus::detail

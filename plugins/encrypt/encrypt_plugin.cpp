// plugins/encrypt: the "encrypt" decorator (ABI 1.6; docs/encryption.md).
//
//   encrypt:key=<key file>;<inner selector>
//   encrypt:env=<VARIABLE>;<inner selector>
//   option plaintext=accept: a Task stored unsealed (a store encrypted
//   after the fact) is read as it is, until `toolnexus store rekey` seals it
//
// Every record goes to the inner store (opened by the host through
// tnx_host_services.open_inner) with its index fields as they are (id,
// contextId, state, status time, owner, tenant, due time: lists, counts and
// due sweeps work unchanged) and its Task JSON sealed (envelope.hpp). The
// change feed, counts and cursors are the inner store's.
//
// Versions. The record is bound to the version the inner store gives it, so
// old bytes put back under a newer version fail to open. The built-in
// persistent stores (file:, sqlite:, postgresql:) number each id 1, 2, 3,
// ... and continue after a delete, so a save replacing version C gets C+1:
// encrypt seals for C+1 and saves with compare-and-set on C (reading C
// first when the caller sets no expected version). When the store numbers
// otherwise (a re-created id continuing an old numbering), the record is
// sealed again for the version it got (compare-and-set on it). Over a store
// that keeps nothing at rest (no TNX_CAP_PERSISTENT: memory) the version is
// not bound (there is no rest to roll back) and saves cost no extra read.
#include "envelope.hpp"
#include "keys.hpp"

#include "toolnexus/decorator.hpp"
#include "toolnexus/plugin.hpp"

#include <sodium.h>

#include <chrono>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace toolnexus::encrypt {
namespace {

using sdk::Error;
using sdk::quote;
using sdk::view;

IndexFields fields_of(const tnx_task_record &r) {
  IndexFields f;
  f.id = view(r.id);
  f.context_id = view(r.context_id);
  f.state = view(r.state);
  f.owner = view(r.owner);
  f.tenant = view(r.tenant);
  f.time_us = r.status_time_us;
  return f;
}

// A copy of `r` (as the inner plugin wrote it) with task_json `json`.
tnx_task_record with_json(const tnx_task_record &r, std::string_view json) {
  tnx_task_record o{};
  o.header = tnx_header(sizeof o);
  o.id = r.id;
  o.context_id = r.context_id;
  o.state = r.state;
  o.status_time_us = r.status_time_us;
  o.owner = r.owner;
  o.tenant = r.tenant;
  o.task_json = sdk::str(json);
  o.version = r.version;
  if (TNX_HAS_FIELD(&r, tnx_task_record, problem)) o.problem = r.problem;
  o.due_us = sdk::due_of(r);
  return o;
}

// Retries of a save that sets no expected version (TNX_VERSION_ANY) and lost
// the race between reading the version it seals for and its compare-and-set:
// the caller asked for a save that cannot conflict, so it is tried again,
// after a random pause that doubles from 50 us to 5 ms (writers of one id
// fall out of step), for up to 10 s; then the conflict is the caller's.
class RaceRetry {
 public:
  /// True (after the pause) while another attempt is allowed.
  bool again() {
    const auto now = std::chrono::steady_clock::now();
    if (attempts_++ == 0) deadline_ = now + std::chrono::seconds(10);
    else if (now >= deadline_) return false;
    if (attempts_ > 1) {
      std::uniform_int_distribution<long> pick(0, pause_us_);
      std::this_thread::sleep_for(std::chrono::microseconds(pick(rng_)));
      pause_us_ = std::min(pause_us_ * 2, 5000L);
    }
    return true;
  }

 private:
  int attempts_ = 0;
  long pause_us_ = 50;
  std::chrono::steady_clock::time_point deadline_{};
  std::minstd_rand rng_{std::random_device{}()};
};

class EncryptStore final : public sdk::Store {
 public:
  EncryptStore(const tnx_open_args &args, const sdk::DecoratorLocation &loc)
      : accept_plain_(accept_plaintext(loc)),
        keys_(KeyRing::load(loc.find("key"), loc.find("env"))),
        inner_(args, loc.inner, "encrypt") {
    const uint64_t caps = inner_.capabilities();
    bind_version_ = (caps & TNX_CAP_PERSISTENT) != 0;
    keeps_due_ = (caps & TNX_CAP_DUE_INDEX) != 0;
    sdk::clear_capabilities(args, ~caps);
    check_keys();
  }

  bool keeps_due() const noexcept override { return keeps_due_; }

  bool get(std::string_view id, const sdk::RecordOut &out) override {
    return inner_.get(id, [&](const tnx_task_record &r) {
      if (TNX_HAS_FIELD(&r, tnx_task_record, problem) && r.problem.len != 0) {
        out(r);
        return;
      }
      const std::string json = unseal(r);
      out(with_json(r, json));
    });
  }

  uint64_t save(const tnx_task_record &rec, uint64_t expected) override {
    tnx_task_record r = rec;
    r.header = tnx_header(sizeof r);
    r.due_us = sdk::due_of(rec);
    r.problem = tnx_str{};
    const IndexFields f = fields_of(rec);
    const std::string_view id = view(rec.id);
    if (!bind_version_) {
      const std::string env = seal(keys_.newest(), f, 0, view(rec.task_json));
      r.task_json = sdk::str(env);
      return inner_.save(r, expected);
    }
    for (RaceRetry race;;) {
      uint64_t cur = expected;
      if (expected == TNX_VERSION_ANY) cur = current_version(id);
      const uint64_t inner_expected = cur;  // 0 is TNX_VERSION_NONE: must not exist
      std::string env = seal(keys_.newest(), f, cur + 1, view(rec.task_json));
      r.task_json = sdk::str(env);
      uint64_t v = 0;
      try {
        v = inner_.save(r, inner_expected);
      } catch (const Error &e) {
        // Another writer came between the read and the save: read again.
        if (e.code == TNX_ECONFLICT && expected == TNX_VERSION_ANY && race.again()) continue;
        throw;
      }
      for (int fix = 0; v != cur + 1 && fix < 4; ++fix) {
        // Numbered otherwise (an id re-created after a delete): seal for
        // the version it got, under compare-and-set on it.
        cur = v;
        env = seal(keys_.newest(), f, cur + 1, view(rec.task_json));
        r.task_json = sdk::str(env);
        try {
          v = inner_.save(r, cur);
        } catch (const Error &e) {
          if (e.code == TNX_ECONFLICT) return cur;  // a later save replaced it already
          throw;
        }
      }
      if (v != cur + 1)
        throw Error(TNX_EIO, "encrypt: save of task " + quote(id) + ": the inner store numbers versions in a way "
                             "encrypt cannot bind (expected " + std::to_string(cur + 1) + ", got " +
                             std::to_string(v) + "); the task is stored but will read as corrupt");
      return v;
    }
  }

  // All or none, as the inner store's save_batch: each record sealed for
  // the version it will get (a later record of an id in the batch follows
  // the earlier one), then any record the store numbered otherwise sealed
  // again for the version it got (as save does).
  void save_batch(const tnx_task_record *const *recs, const uint64_t *expected, uint64_t n,
                  uint64_t *out_versions) override {
    if (n == 0) {
      inner_.save_batch(recs, expected, 0, out_versions);  // TNX_EUNSUPPORTED if the inner store has none
      return;
    }
    for (RaceRetry race;;) {
      try {
        seal_and_save_batch(recs, expected, n, out_versions);
        return;
      } catch (const sdk::BatchError &e) {
        // A record saved without an expected version lost a race between
        // the read of its version and the batch: read again.
        if (e.code != TNX_ECONFLICT || e.index >= n || expected[e.index] != TNX_VERSION_ANY || !race.again()) throw;
      }
    }
  }

  void del(std::string_view id, uint64_t expected) override { inner_.del(id, expected); }

 private:
  void seal_and_save_batch(const tnx_task_record *const *recs, const uint64_t *expected, uint64_t n,
                           uint64_t *out_versions) {
    std::vector<std::string> envs(n);
    std::vector<tnx_task_record> sealed(n);
    std::vector<const tnx_task_record *> ptrs(n);
    std::vector<uint64_t> exp(expected, expected + n), bound(n, 0);
    std::unordered_map<std::string_view, uint64_t> next;  // id -> the version its next save gets
    for (uint64_t i = 0; i < n; ++i) {
      const tnx_task_record &rec = *recs[i];
      const std::string_view id = view(rec.id);
      if (bind_version_) {
        auto it = next.find(id);
        uint64_t cur = exp[i];
        if (cur == TNX_VERSION_ANY) {
          cur = it != next.end() ? it->second - 1 : current_version(id);
          exp[i] = cur;  // compare-and-set on what was read: no save comes between
        }
        bound[i] = cur + 1;
        next[id] = cur + 2;
      }
      envs[i] = seal(keys_.newest(), fields_of(rec), bound[i], view(rec.task_json));
      sealed[i] = rec;
      sealed[i].header = tnx_header(sizeof sealed[i]);
      sealed[i].due_us = sdk::due_of(rec);
      sealed[i].problem = tnx_str{};
      sealed[i].task_json = sdk::str(envs[i]);
      ptrs[i] = &sealed[i];
    }
    inner_.save_batch(ptrs.data(), exp.data(), n, out_versions);
    if (!bind_version_) return;
    for (uint64_t i = 0; i < n; ++i) {
      if (out_versions[i] == bound[i]) continue;
      // Re-sealed only while it is the id's last record of the batch.
      bool last = true;
      for (uint64_t j = i + 1; j < n && last; ++j) last = view(recs[j]->id) != view(recs[i]->id);
      if (!last) continue;
      try {
        out_versions[i] = save(*recs[i], out_versions[i]);
      } catch (const Error &e) {
        if (e.code != TNX_ECONFLICT) throw;  // a later save replaced it already
      }
    }
  }

 public:

  std::string list(const tnx_list_query &q, const sdk::RecordOut &out) override {
    const bool omit = q.omit_json != 0;
    const bool deliver_corrupt = q.deliver_corrupt != 0;
    return inner_.list(q, [&](const tnx_task_record &r) -> bool {
      if (TNX_HAS_FIELD(&r, tnx_task_record, problem) && r.problem.len != 0) return out(r);
      if (omit) return out(with_json(r, std::string_view()));
      std::string json;
      try {
        json = unseal(r);
      } catch (const Error &e) {
        // Corrupt, or sealed with a key not held / not the one named
        // (TNX_EINVAL): this record's problem, told with it when the
        // caller asks for such records, not the end of the list.
        if (!deliver_corrupt || (e.code != TNX_ECORRUPT && e.code != TNX_EINVAL)) throw;
        tnx_task_record c = with_json(r, view(r.task_json));
        c.problem = sdk::str(e.message);
        c.context_id = c.state = tnx_str{};
        c.status_time_us = TNX_TIME_NONE;
        c.version = 0;
        return out(c);
      }
      return out(with_json(r, json));
    });
  }

  uint64_t count(const tnx_list_query &q) override { return inner_.count(q); }

  void watch(tnx_change_sink sink, void *ctx) override { inner_.watch(sink, ctx); }
  void unwatch() override { inner_.unwatch(); }
  void close() override { inner_.close(); }

 private:
  // Checks the options (before anything is opened); whether plaintext=accept.
  static bool accept_plaintext(const sdk::DecoratorLocation &loc) {
    for (const auto &o : loc.options)
      if (o.first != "key" && o.first != "env" && o.first != "plaintext")
        throw Error(TNX_EINVAL, "encrypt: unknown option " + quote(o.first) + " (key, env, plaintext)");
    const std::string *p = loc.find("plaintext");
    if (p != nullptr && *p != "accept" && *p != "refuse")
      throw Error(TNX_EINVAL, "encrypt: option plaintext=" + quote(*p) + ": expected accept or refuse");
    return p != nullptr && *p == "accept";
  }

  std::string unseal(const tnx_task_record &r) const {
    const std::string_view stored = view(r.task_json);
    Sealed s;
    if (!find_sealed(stored, view(r.id), s)) {
      const size_t first = stored.find_first_not_of(" \t\r\n");
      if (first == std::string_view::npos || stored[first] != '{')
        throw Error(TNX_ECORRUPT, "encrypt: task " + quote(view(r.id)) +
                                      " is corrupt: its stored bytes are neither a sealed record nor a Task's JSON");
      if (accept_plain_) return std::string(stored);
      throw Error(TNX_ECORRUPT, "encrypt: task " + quote(view(r.id)) +
                                    " is corrupt: it is stored unsealed in an encrypted store (open with "
                                    "plaintext=accept to read it, then `toolnexus store rekey` seals it)");
    }
    return open(keys_, fields_of(r), bind_version_ ? r.version : 0, s);
  }

  uint64_t current_version(std::string_view id) {
    uint64_t v = 0;
    if (!inner_.get(id, [&](const tnx_task_record &r) { v = r.version; })) return 0;
    return v;
  }

  // A wrong or missing key is an error at open, naming the key id: the
  // first records of the store say which keys sealed them.
  void check_keys() {
    tnx_list_query q{};
    q.header = tnx_header(sizeof q);
    q.page_size = 16;
    q.deliver_corrupt = 1;
    std::string error;
    inner_.list(q, [&](const tnx_task_record &r) -> bool {
      if (TNX_HAS_FIELD(&r, tnx_task_record, problem) && r.problem.len != 0) return true;
      Sealed s;
      try {
        if (!find_sealed(view(r.task_json), view(r.id), s)) return true;
      } catch (const Error &) {
        return true;  // a damaged record is reported when read
      }
      const Key *k = keys_.find(s.kid);
      if (k == nullptr) {
        error = "encrypt: the store holds tasks sealed with key " + quote(s.kid) + ", which " + keys_.source() +
                " lacks (it has " + keys_.ids() + ")";
        return false;
      }
      static const char *h = "0123456789abcdef";
      std::string hex;
      for (unsigned char c : k->check) hex.append({h[c >> 4], h[c & 15]});
      if (s.check_hex != hex) {
        error = "encrypt: key " + quote(s.kid) + " of " + keys_.source() +
                " is not the key the store's tasks were sealed with (wrong key for id " + quote(s.kid) + ")";
        return false;
      }
      return true;
    });
    if (!error.empty()) throw Error(TNX_EINVAL, error);
  }

  const bool accept_plain_;
  KeyRing keys_;
  sdk::InnerStore inner_;
  bool bind_version_ = true;
  bool keeps_due_ = false;
};

sdk::Store *open_store(const tnx_open_args &args) {
  if (sodium_init() < 0) throw Error(TNX_EINTERNAL, "encrypt: libsodium failed to initialise");
  const sdk::DecoratorLocation loc = sdk::parse_decorator_location("encrypt", view(args.location));
  return new EncryptStore(args, loc);
}

const char *const kSchemes[] = {"encrypt", nullptr};

const tnx_plugin_descriptor kDescriptor = {
    TNX_HEADER_INIT(tnx_plugin_descriptor),
    "toolnexus-encrypt",
    "1.0.0",
    "decorator: seals each Task's JSON with XChaCha20-Poly1305 over any store; index fields stay readable",
    kSchemes,
    TNX_CAP_THREAD_SAFE | TNX_CAP_PAGINATED_LIST | TNX_CAP_COMPARE_AND_SET | TNX_CAP_DURABLE |
        TNX_CAP_MULTI_PROCESS | TNX_CAP_PERSISTENT | TNX_CAP_CHANGE_FEED | TNX_CAP_DUE_INDEX,
    &sdk::open_trampoline<open_store>,
    nullptr,  // set by sdk::entry
    "encrypt:key=<key file>|env=<VARIABLE>[,plaintext=accept];<inner selector>",
};

}  // namespace
}  // namespace toolnexus::encrypt

extern "C" TNX_PLUGIN_EXPORT const tnx_plugin_descriptor *toolnexus_plugin_entry(const tnx_host_info *host) {
  return toolnexus::sdk::entry<toolnexus::encrypt::kDescriptor>(host);
}

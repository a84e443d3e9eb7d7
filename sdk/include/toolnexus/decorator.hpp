// toolnexus/decorator.hpp: optional header-only C++17 helper for decorator
// plugins (ABI 1.6): a store that wraps another store the host opens for it
// (tnx_host_services.open_inner), like an SQLite VFS shim.
//
// Selector syntax of every decorator (docs/selectors.md):
//
//     <scheme>:<options>;<inner selector>
//     encrypt:key=/etc/tnx/key;sqlite:/var/lib/tnx/tasks.db
//     encrypt:env=TNX_KEY;faults:rate=0.1;file:/srv/tasks
//
// The location is cut at its first ';': everything after it is the inner
// selector, verbatim (any path or URL, itself possibly a decorator: no
// escaping). The options before it are name=value pairs separated by ',';
// a value may hold ',', ';' or '%' only percent-encoded (%2C, %3B, %25).
#ifndef TOOLNEXUS_DECORATOR_HPP
#define TOOLNEXUS_DECORATOR_HPP

#include "toolnexus/plugin.hpp"

#include <exception>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace toolnexus::sdk {

/// A decorator's location, split: its options in the order written, and the
/// inner selector.
struct DecoratorLocation {
  std::vector<std::pair<std::string, std::string>> options;  ///< (name, percent-decoded value)
  std::string inner;                                          ///< the inner selector, verbatim

  /// The value of option `name`, or nullptr when absent.
  const std::string *find(std::string_view name) const noexcept {
    for (const auto &o : options)
      if (o.first == name) return &o.second;
    return nullptr;
  }
};

/// Splits `location` (of a selector of `scheme`) as the syntax above says.
/// Throws Error(TNX_EINVAL) naming the scheme and what is wrong: no ';', an
/// empty inner selector, an option without '=', a bad percent escape, an
/// option given twice.
inline DecoratorLocation parse_decorator_location(std::string_view scheme, std::string_view location) {
  const std::string who(scheme);
  const size_t semi = location.find(';');
  if (semi == std::string_view::npos)
    throw Error(TNX_EINVAL, who + ": the selector has no ';' before the inner store (expected " + who +
                                ":<options>;<inner selector>, e.g. " + who + ":key=/etc/tnx/key;sqlite:/var/lib/tnx/tasks.db)");
  DecoratorLocation out;
  out.inner = std::string(location.substr(semi + 1));
  if (out.inner.empty()) throw Error(TNX_EINVAL, who + ": the inner store selector after ';' is empty");
  std::string_view opts = location.substr(0, semi);
  while (!opts.empty()) {
    const size_t comma = opts.find(',');
    const std::string_view item = opts.substr(0, comma);
    opts = comma == std::string_view::npos ? std::string_view() : opts.substr(comma + 1);
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    if (eq == std::string_view::npos || eq == 0)
      throw Error(TNX_EINVAL, who + ": option " + quote(item) + " is not name=value");
    std::string value;
    const std::string_view raw = item.substr(eq + 1);
    for (size_t i = 0; i < raw.size(); ++i) {
      if (raw[i] != '%') {
        value.push_back(raw[i]);
        continue;
      }
      auto hex = [](char c) -> int {
        if (c >= '0' && c <= '9') return c - '0';
        if (c >= 'a' && c <= 'f') return c - 'a' + 10;
        if (c >= 'A' && c <= 'F') return c - 'A' + 10;
        return -1;
      };
      if (i + 2 >= raw.size() || hex(raw[i + 1]) < 0 || hex(raw[i + 2]) < 0)
        throw Error(TNX_EINVAL, who + ": option " + quote(item.substr(0, eq)) +
                                    " has a bad percent escape (write ',' as %2C, ';' as %3B, '%' as %25)");
      value.push_back(static_cast<char>(hex(raw[i + 1]) * 16 + hex(raw[i + 2])));
      i += 2;
    }
    std::string name(item.substr(0, eq));
    if (out.find(name) != nullptr) throw Error(TNX_EINVAL, who + ": option " + quote(name) + " given twice");
    out.options.emplace_back(std::move(name), std::move(value));
  }
  return out;
}

/// The store a decorator wraps, opened through the host services. Calls
/// throw sdk::Error with the inner store's status and message. The
/// callbacks of get and list may throw: the exception is held while the
/// inner plugin returns (it never crosses the C ABI) and rethrown after.
/// Thread-safety: as the inner store (the host serialises for it when it
/// lacks TNX_CAP_THREAD_SAFE); close() once, after every other call.
class InnerStore {
 public:
  /// Opens `selector` through args.services with args' TNX_OPEN_* flags.
  /// `who` names the decorator in messages ("encrypt"). Throws
  /// Error(TNX_EUNSUPPORTED) when the host offers no services (a host older
  /// than ABI 1.6), else the inner open's status and message.
  InnerStore(const tnx_open_args &args, const std::string &selector, const std::string &who) {
    const tnx_host_services *sv =
        TNX_HAS_FIELD(&args, tnx_open_args, services) ? args.services : nullptr;
    if (sv == nullptr || sv->header.abi_major != TNX_ABI_MAJOR ||
        !TNX_HAS_FIELD(sv, tnx_host_services, open_inner) || sv->open_inner == nullptr)
      throw Error(TNX_EUNSUPPORTED, who + ": this decorator needs a host of ABI 1.6 or later that offers host "
                                          "services (open_inner); this host speaks ABI " +
                                          std::to_string(args.header.abi_major) + "." +
                                          std::to_string(args.header.abi_minor) + " and offers none");
    char err[4096] = {0};  // room for the messages of nested decorators
    const tnx_status rc = sv->open_inner(sv->host_ctx, str(selector), open_flags(args), &vt_, &h_, &caps_,
                                         err, sizeof err);
    if (rc != TNX_OK || vt_ == nullptr || h_ == nullptr) {
      h_ = nullptr;
      throw Error(rc == TNX_OK ? TNX_EINTERNAL : rc, who + ": cannot open the inner store: " + std::string(err));
    }
  }
  ~InnerStore() {
    if (h_ != nullptr) {
      char err[256];
      (void)vt_->close(h_, err, sizeof err);
    }
  }
  InnerStore(const InnerStore &) = delete;
  InnerStore &operator=(const InnerStore &) = delete;

  /// The inner store's TNX_CAP_* bits.
  uint64_t capabilities() const noexcept { return caps_; }

  /// Delivers the inner record of `id` to `f(const tnx_task_record&)`;
  /// false when there is none.
  template <class F>
  bool get(std::string_view id, F &&f) {
    Sink<F> s{&f, nullptr, nullptr};
    char err[1024] = {0};
    const tnx_status rc = vt_->get(h_, str(id), &Sink<F>::on, &s, err, sizeof err);
    if (s.error) std::rethrow_exception(s.error);
    if (rc == TNX_ENOTFOUND) return false;
    check(rc, err);
    return true;
  }

  /// Saves `rec` with compare-and-set `expected`; returns the new version.
  uint64_t save(const tnx_task_record &rec, uint64_t expected) {
    uint64_t v = 0;
    char err[1024] = {0};
    check(vt_->save(h_, &rec, expected, &v, err, sizeof err), err);
    return v;
  }

  /// Saves recs[0..n) all or none (the inner save_batch; ABI 1.3), each
  /// new version into out_versions[i]. Throws BatchError naming the record
  /// that failed (index n: the whole), Error(TNX_EUNSUPPORTED) when the
  /// inner store saves no batches.
  void save_batch(const tnx_task_record *const *recs, const uint64_t *expected, uint64_t n,
                  uint64_t *out_versions) {
    uint64_t failed = n;
    char err[1024] = {0};
    const tnx_status rc = vt_->save_batch(h_, recs, expected, n, out_versions, &failed, err, sizeof err);
    if (rc != TNX_OK)
      throw BatchError(failed, rc, err[0] != '\0' ? std::string(err) : std::string(tnx_strerror(rc)));
  }

  /// Deletes `id` (compare-and-set `expected`).
  void del(std::string_view id, uint64_t expected) {
    char err[1024] = {0};
    check(vt_->del(h_, str(id), expected, err, sizeof err), err);
  }

  /// One page of `q`: each record to `f(const tnx_task_record&)` (returns
  /// false to stop); returns the next cursor or "".
  template <class F>
  std::string list(const tnx_list_query &q, F &&f) {
    Sink<F> s{&f, nullptr, nullptr};
    std::string next;
    s.cursor = &next;
    char err[1024] = {0};
    const tnx_status rc = vt_->list(h_, &q, &Sink<F>::on_list, &Sink<F>::on_cursor, &s, err, sizeof err);
    if (s.error) std::rethrow_exception(s.error);
    check(rc, err);
    return next;
  }

  /// The inner count of `q`.
  uint64_t count(const tnx_list_query &q) {
    uint64_t n = 0;
    char err[1024] = {0};
    check(vt_->count(h_, &q, &n, err, sizeof err), err);
    return n;
  }

  /// Starts the inner change feed, straight to the host's sink (changes
  /// name ids and versions only, so a decorator passes them through).
  void watch(tnx_change_sink sink, void *ctx) {
    char err[1024] = {0};
    check(vt_->watch(h_, sink, ctx, err, sizeof err), err);
  }
  /// Stops the inner change feed.
  void unwatch() {
    char err[1024] = {0};
    check(vt_->unwatch(h_, err, sizeof err), err);
  }

  /// Closes the inner store (once); throws its failure.
  void close() {
    if (h_ == nullptr) return;
    char err[1024] = {0};
    tnx_store *h = h_;
    h_ = nullptr;
    check(vt_->close(h, err, sizeof err), err);
  }

 private:
  template <class F>
  struct Sink {
    F *f;
    std::string *cursor;
    std::exception_ptr error;
    static int32_t on(void *c, const tnx_task_record *r) noexcept {
      auto *s = static_cast<Sink *>(c);
      try {
        (*s->f)(*r);
      } catch (...) {
        s->error = std::current_exception();
        return 1;
      }
      return 0;
    }
    static int32_t on_list(void *c, const tnx_task_record *r) noexcept {
      auto *s = static_cast<Sink *>(c);
      try {
        return (*s->f)(*r) ? 0 : 1;
      } catch (...) {
        s->error = std::current_exception();
        return 1;
      }
    }
    static void on_cursor(void *c, tnx_str cur) noexcept {
      auto *s = static_cast<Sink *>(c);
      try {
        s->cursor->assign(view(cur));
      } catch (...) {
        s->error = std::current_exception();
      }
    }
  };

  static void check(tnx_status rc, const char *err) {
    if (rc != TNX_OK) throw Error(rc, err[0] != '\0' ? std::string(err) : std::string(tnx_strerror(rc)));
  }

  const tnx_store_vtable *vt_ = nullptr;
  tnx_store *h_ = nullptr;
  uint64_t caps_ = 0;
};

}  // namespace toolnexus::sdk

#endif  // TOOLNEXUS_DECORATOR_HPP

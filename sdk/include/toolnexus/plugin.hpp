// toolnexus/plugin.hpp: optional header-only C++17 helper for plugin authors.
//
// Turns a C++ class derived from toolnexus::sdk::Store into the C vtable of
// task_store.h, catching every exception at the boundary so that none crosses
// the C ABI. Also offers the list helpers every simple backend needs: the
// filter predicate, the order (newest status time first, ties by id), and an
// opaque keyset cursor (ListKey; a due list's, DueKey).
//
// Nothing here is needed by the host; a plugin written in C ignores it.
#ifndef TOOLNEXUS_PLUGIN_HPP
#define TOOLNEXUS_PLUGIN_HPP

#include "toolnexus/task_store.h"

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <new>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <utility>

namespace toolnexus::sdk {

/// Views a borrowed tnx_str. The view lives as long as the tnx_str's bytes.
inline std::string_view view(tnx_str s) noexcept {
  return s.len == 0 ? std::string_view() : std::string_view(s.data, static_cast<size_t>(s.len));
}

/// Makes a tnx_str borrowing `s` (which must outlive the tnx_str's use).
inline tnx_str str(std::string_view s) noexcept { return tnx_str{s.data(), s.size()}; }

/// Smallest tnx_task_record a host may pass (ABI 1.0's, up to `version`).
inline constexpr size_t kRecordV10Size = offsetof(tnx_task_record, version) + sizeof(uint64_t);
/// Smallest tnx_list_query a host may pass (ABI 1.0's: up to the field that
/// 1.0 called reserved0 and 1.1 deliver_corrupt).
inline constexpr size_t kQueryV10Size = offsetof(tnx_list_query, omit_json) + 2 * sizeof(uint32_t);

/// Caller text (an id, an option value) for a message: in single quotes, cut
/// to at most `max` bytes with "..." so a hostile input cannot flood a log,
/// never inside a UTF-8 sequence; control bytes (NUL, newline, ...) appear
/// as \xHH so they can neither end the C message nor forge log lines.
inline std::string quote(std::string_view s, size_t max = 128) {
  std::string out = "'";
  size_t n = s.size() > max ? max : s.size();
  // Never cut a UTF-8 sequence in two: back off to the start of the
  // sequence that the cut would split.
  if (n < s.size())
    while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  static const char kHex[] = "0123456789abcdef";
  for (size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f) {
      // Control bytes (NUL above all: it would end the C error message).
      out.append("\\x").push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  if (n < s.size()) out.append("...");
  out.push_back('\'');
  return out;
}

/// The exception a Store method throws to return a status other than TNX_OK.
/// `message` reaches the host's error buffer (truncated to fit).
struct Error : std::exception {
  Error(tnx_status c, std::string m) : code(c), message(std::move(m)) {}
  const char *what() const noexcept override { return message.c_str(); }
  tnx_status code;
  std::string message;
};

/// Thrown by Store::save_batch for a failure of one record: `index` is its
/// position in the batch (reported to the host as out_failed).
struct BatchError : Error {
  BatchError(uint64_t i, tnx_status c, std::string m) : Error(c, std::move(m)), index(i) {}
  uint64_t index;
};

/// Thrown by RecordSource::next when the host's source stopped a
/// save_stream (ABI 1.5) with `code`: the store undoes or finishes what it
/// holds and lets it pass (the trampoline returns that status).
struct SourceStopped : Error {
  explicit SourceStopped(tnx_status c) : Error(c, "save_stream: stopped by the host's record source") {}
};

/// The records of a save_stream (ABI 1.5), pulled from the host's
/// tnx_record_source one at a time. Not thread-safe (one caller at a time,
/// as the ABI allows). The record next() returns is borrowed until the
/// next call.
class RecordSource {
 public:
  RecordSource(tnx_record_source source, void *ctx) noexcept : source_(source), ctx_(ctx) {}
  /// The next record, its expected version in `expected`; nullptr at the
  /// end. Throws SourceStopped when the host stopped, Error(TNX_EINVAL)
  /// naming the record's index when the host handed over a record save
  /// would refuse (missing, another ABI major, empty id or task_json).
  const tnx_task_record *next(uint64_t &expected);
  /// How many records next() has returned.
  uint64_t delivered() const noexcept { return n_; }

 private:
  tnx_record_source source_;
  void *ctx_;
  uint64_t n_ = 0;
};

/// Delivers records to the host's sink. Callable on the calling thread only,
/// during the store call it was given to.
class RecordOut {
 public:
  RecordOut(tnx_record_sink sink, void *ctx) noexcept : sink_(sink), ctx_(ctx) {}
  /// Passes `rec` (borrowed for the call) to the host. Returns false when the
  /// host asked to stop.
  bool operator()(const tnx_task_record &rec) const { return sink_(ctx_, &rec) == 0; }

 private:
  tnx_record_sink sink_;
  void *ctx_;
};

/// The sending end of a store's change feed (ABI 1.4; tnx_store_vtable.watch):
/// holds the host's sink between start() and stop(). saved(), deleted() and
/// gap() may be called from any thread, also concurrently, and do nothing
/// while no feed runs. Call them after the change is committed (so a get
/// already returns it) and without holding a lock that stop()'s caller may
/// hold. Thread-safe.
class ChangeFeed {
 public:
  /// Starts the feed; Error(TNX_EINVAL) when one runs already.
  void start(tnx_change_sink sink, void *ctx) {
    std::unique_lock<std::shared_mutex> lock(mu_);
    if (sink_ != nullptr) throw Error(TNX_EINVAL, "watch: the store's change feed runs already (one per store)");
    sink_ = sink;
    ctx_ = ctx;
  }
  /// Stops the feed: when it returns no call of the sink runs or will run.
  /// Returns false when none ran.
  bool stop() noexcept {
    std::unique_lock<std::shared_mutex> lock(mu_);
    const bool was = sink_ != nullptr;
    sink_ = nullptr;
    ctx_ = nullptr;
    return was;
  }
  /// True between start() and stop().
  bool running() const noexcept {
    std::shared_lock<std::shared_mutex> lock(mu_);
    return sink_ != nullptr;
  }
  /// Task `id` was saved and now has `version`.
  void saved(std::string_view id, uint64_t version) const noexcept { send(TNX_CHANGE_SAVED, id, version); }
  /// Task `id` was deleted; it had `version` (0 = unknown).
  void deleted(std::string_view id, uint64_t version) const noexcept { send(TNX_CHANGE_DELETED, id, version); }
  /// Changes may have been missed: the host re-reads.
  void gap() const noexcept { send(TNX_CHANGE_GAP, std::string_view(), 0); }

 private:
  void send(uint32_t kind, std::string_view id, uint64_t version) const noexcept {
    std::shared_lock<std::shared_mutex> lock(mu_);
    if (sink_ == nullptr) return;
    tnx_change c{};
    c.header = tnx_header(sizeof c);
    c.kind = kind;
    c.id = tnx_str{id.data(), id.size()};
    c.version = version;
    sink_(ctx_, &c);
  }
  mutable std::shared_mutex mu_;
  tnx_change_sink sink_ = nullptr;
  void *ctx_ = nullptr;
};

/// A store implemented in C++. One object per open store. Methods report
/// failure by throwing sdk::Error (any other exception becomes
/// TNX_EINTERNAL). Thread-safety is the implementer's, as declared by the
/// descriptor's TNX_CAP_THREAD_SAFE.
class Store {
 public:
  virtual ~Store() = default;
  /// Delivers the Task `id` through `out`; returns false if there is none.
  virtual bool get(std::string_view id, const RecordOut &out) = 0;
  /// Saves `rec` under the CAS rule of task_store.h; returns the new version.
  virtual uint64_t save(const tnx_task_record &rec, uint64_t expected_version) = 0;
  /// Deletes `id`; throws Error(TNX_ENOTFOUND) when absent.
  virtual void del(std::string_view id, uint64_t expected_version) = 0;
  /// Delivers one page; returns the next cursor or "" on the last page.
  virtual std::string list(const tnx_list_query &q, const RecordOut &out) = 0;
  /// Flushes; called once before destruction. Throw Error(TNX_EIO) on loss.
  virtual void close() {}
  /// ABI 1.3 count: how many records list would deliver for the filters of
  /// `q` over all pages (cursor, page_size, omit_json, deliver_corrupt
  /// ignored); see tnx_store_vtable.count for the contract. The default
  /// throws Error(TNX_EUNSUPPORTED), and the host then counts by listing.
  virtual uint64_t count(const tnx_list_query &q) {
    (void)q;
    throw Error(TNX_EUNSUPPORTED, "count: not offered by this store (the host counts by listing)");
  }
  /// ABI 1.3 save_batch: saves recs[0..n) all or none, writing each new
  /// version to out_versions[i]; see tnx_store_vtable.save_batch. Throw
  /// BatchError(i, ...) for the record that fails, Error(...) for a failure
  /// of the whole (it is reported as index n). The records were checked
  /// like save's (non-empty id and task_json) before the call. The default
  /// throws Error(TNX_EUNSUPPORTED): the host then saves one by one.
  virtual void save_batch(const tnx_task_record *const *recs, const uint64_t *expected, uint64_t n,
                          uint64_t *out_versions) {
    (void)recs; (void)expected; (void)n; (void)out_versions;
    throw Error(TNX_EUNSUPPORTED, "save_batch: not offered by this store (the host saves one by one)");
  }
  /// ABI 1.5 save_stream: saves the records of `source` in order until it
  /// ends; returns how many were saved. `flags` holds known
  /// TNX_SAVE_STREAM_* bits only (the trampoline refuses others). With
  /// TNX_SAVE_STREAM_ONE_TRANSACTION all or none; without, each record
  /// atomically and durably by return. Throw BatchError(i, ...) for
  /// record i that fails (without the flag: after making records 0..i-1
  /// durable), let SourceStopped pass, Error(...) for a failure of the
  /// whole. See tnx_store_vtable.save_stream. The default throws
  /// Error(TNX_EUNSUPPORTED) without touching `source`: the host then uses
  /// save_batch or save.
  virtual uint64_t save_stream(RecordSource &source, uint32_t flags) {
    (void)source; (void)flags;
    throw Error(TNX_EUNSUPPORTED, "save_stream: not offered by this store");
  }
  /// ABI 1.4 watch: starts reporting every change of the location to
  /// `sink` (see tnx_store_vtable.watch for the promises; a ChangeFeed
  /// member does the bookkeeping). The default throws
  /// Error(TNX_EUNSUPPORTED): the host then polls. Not called on a store
  /// opened read-only (the trampoline refuses).
  virtual void watch(tnx_change_sink sink, void *ctx) {
    (void)sink; (void)ctx;
    throw Error(TNX_EUNSUPPORTED, "watch: this store has no change feed (the host polls)");
  }
  /// ABI 1.4 unwatch: stops the feed; when it returns the sink is not
  /// running and will not be called again. Throw Error(TNX_EINVAL) when no
  /// feed runs. close() must stop a running feed too.
  virtual void unwatch() { throw Error(TNX_EINVAL, "unwatch: no change feed runs"); }
  /// ABI 1.5: true when this store keeps tnx_task_record.due_us and
  /// answers TNX_FILTER_DUE_BEFORE (pass the record's due_us to matches()),
  /// from an index (the descriptor then claims TNX_CAP_DUE_INDEX). The
  /// default, false, has the list and count trampolines refuse a due filter
  /// with TNX_EUNSUPPORTED. Thread-safe; constant for the store's life.
  virtual bool keeps_due() const noexcept { return false; }

  /// True when the host opened this store with TNX_OPEN_READ_ONLY. Set by
  /// open_trampoline before the store is handed out; save and del are then
  /// refused with TNX_EUNSUPPORTED before they reach the subclass.
  bool read_only() const noexcept { return read_only_; }

 private:
  template <Store *(*Open)(const tnx_open_args &)>
  friend tnx_status open_trampoline(const tnx_open_args *, tnx_store **, char *, uint32_t) noexcept;
  bool read_only_ = false;
};

/// The TNX_OPEN_* flags the host sent (0 from a host older than ABI 1.2,
/// which never asks for a read-only open).
inline uint32_t open_flags(const tnx_open_args &a) noexcept {
  return TNX_HAS_FIELD(&a, tnx_open_args, flags) ? a.flags : 0u;
}

/// True when the host asked for TNX_OPEN_READ_ONLY: create, migrate and
/// repair nothing; TNX_ENOTFOUND when nothing is stored at the location.
inline bool open_read_only(const tnx_open_args &a) noexcept {
  return (open_flags(a) & TNX_OPEN_READ_ONLY) != 0;
}

/// Clears capability `bits` for the store being opened (for example
/// TNX_CAP_DURABLE under synchronous=off). No-op when the host (older than
/// ABI 1.2, or not interested) passed no capabilities pointer.
inline void clear_capabilities(const tnx_open_args &a, uint64_t bits) noexcept {
  if (TNX_HAS_FIELD(&a, tnx_open_args, capabilities) && a.capabilities != nullptr)
    *a.capabilities &= ~bits;
}

namespace detail {
template <class F>
tnx_status guarded(char *err, uint32_t cap, F &&f) noexcept {
  try {
    return f();
  } catch (const Error &e) {
    tnx_set_error(err, cap, e.message.c_str());
    return e.code;
  } catch (const std::bad_alloc &) {
    tnx_set_error(err, cap, "out of memory");
    return TNX_EINTERNAL;
  } catch (const std::exception &e) {
    tnx_set_error(err, cap, e.what());
    return TNX_EINTERNAL;
  } catch (...) {
    tnx_set_error(err, cap, "unknown exception in plugin");
    return TNX_EINTERNAL;
  }
}

inline Store *as_store(tnx_store *s) noexcept { return reinterpret_cast<Store *>(s); }

inline void check_str(tnx_str s, const char *what) {
  if (s.data == nullptr && s.len != 0) throw Error(TNX_EINVAL, std::string(what) + ": NULL data with a non-zero length");
}

// A due filter (ABI 1.5) only for a store that keeps due times, in a query
// long enough to carry the bound.
inline void check_due_filter(const tnx_list_query &q, const Store &s, const char *op) {
  if ((q.filter_flags & TNX_FILTER_DUE_BEFORE) == 0) return;
  if (!s.keeps_due())
    throw Error(TNX_EUNSUPPORTED, std::string(op) + ": this store keeps no due times (TNX_FILTER_DUE_BEFORE)");
  if (!TNX_HAS_FIELD(&q, tnx_list_query, due_before_us))
    throw Error(TNX_EINVAL, std::string(op) + ": TNX_FILTER_DUE_BEFORE in a query without due_before_us (ABI 1.5)");
}
}  // namespace detail

inline const tnx_task_record *RecordSource::next(uint64_t &expected) {
  const tnx_task_record *rec = nullptr;
  expected = TNX_VERSION_ANY;
  const tnx_status st = source_(ctx_, &rec, &expected);
  if (st != TNX_OK) throw SourceStopped(st);
  if (rec == nullptr) return nullptr;
  const std::string where = "save_stream: record " + std::to_string(n_);
  if (rec->header.abi_major != TNX_ABI_MAJOR || rec->header.struct_size < kRecordV10Size)
    throw BatchError(n_, TNX_EINVAL, where + " is of another ABI major, or smaller than ABI 1.0's");
  if (rec->id.len == 0) throw BatchError(n_, TNX_EINVAL, where + ": empty task id");
  for (tnx_str f : {rec->id, rec->context_id, rec->state, rec->owner, rec->tenant, rec->task_json})
    if (f.data == nullptr && f.len != 0) throw BatchError(n_, TNX_EINVAL, where + ": a field has NULL data with a non-zero length");
  if (rec->task_json.len == 0) throw BatchError(n_, TNX_EINVAL, where + ": empty task_json");
  ++n_;
  return rec;
}

/// The vtable whose functions forward to sdk::Store's virtual methods.
/// Static storage; thread-safe to take.
inline const tnx_store_vtable *store_vtable() noexcept {
  static const tnx_store_vtable vt = {
      TNX_HEADER_INIT(tnx_store_vtable),
      // get
      [](tnx_store *s, tnx_str id, tnx_record_sink sink, void *ctx, char *err,
         uint32_t cap) noexcept -> tnx_status {
        return detail::guarded(err, cap, [&] {
          detail::check_str(id, "get: id");
          if (id.len == 0) throw Error(TNX_EINVAL, "get: empty task id");
          if (!detail::as_store(s)->get(view(id), RecordOut(sink, ctx)))
            throw Error(TNX_ENOTFOUND, "no task with id " + quote(view(id)));
          return TNX_OK;
        });
      },
      // save
      [](tnx_store *s, const tnx_task_record *rec, uint64_t expected, uint64_t *out,
         char *err, uint32_t cap) noexcept -> tnx_status {
        return detail::guarded(err, cap, [&] {
          if (rec == nullptr || rec->header.abi_major != TNX_ABI_MAJOR || rec->header.struct_size < kRecordV10Size)
            throw Error(TNX_EINVAL, "save: record missing, of another ABI major, or smaller than ABI 1.0's");
          if (rec->id.len == 0) throw Error(TNX_EINVAL, "save: empty task id");
          for (tnx_str f : {rec->id, rec->context_id, rec->state, rec->owner, rec->tenant, rec->task_json})
            detail::check_str(f, "save: a record field");
          if (rec->task_json.len == 0) throw Error(TNX_EINVAL, "save: empty task_json");
          if (detail::as_store(s)->read_only())
            throw Error(TNX_EUNSUPPORTED, "save: the store was opened read-only");
          *out = detail::as_store(s)->save(*rec, expected);
          return TNX_OK;
        });
      },
      // del
      [](tnx_store *s, tnx_str id, uint64_t expected, char *err, uint32_t cap) noexcept
      -> tnx_status {
        return detail::guarded(err, cap, [&] {
          detail::check_str(id, "delete: id");
          if (id.len == 0) throw Error(TNX_EINVAL, "delete: empty task id");
          if (detail::as_store(s)->read_only())
            throw Error(TNX_EUNSUPPORTED, "delete: the store was opened read-only");
          detail::as_store(s)->del(view(id), expected);
          return TNX_OK;
        });
      },
      // list
      [](tnx_store *s, const tnx_list_query *q, tnx_record_sink rs, tnx_cursor_sink cs,
         void *ctx, char *err, uint32_t cap) noexcept -> tnx_status {
        return detail::guarded(err, cap, [&] {
          if (q == nullptr || q->header.abi_major != TNX_ABI_MAJOR || q->header.struct_size < kQueryV10Size)
            throw Error(TNX_EINVAL, "list: query missing, of another ABI major, or smaller than ABI 1.0's");
          if (q->page_size == 0) throw Error(TNX_EINVAL, "list: page_size is 0");
          if ((q->filter_flags & ~TNX_FILTER_ALL) != 0)
            throw Error(TNX_EUNSUPPORTED, "list: unknown filter_flags bits " + std::to_string(q->filter_flags & ~TNX_FILTER_ALL));
          detail::check_due_filter(*q, *detail::as_store(s), "list");
          for (tnx_str f : {q->context_id, q->state, q->owner, q->tenant, q->cursor}) detail::check_str(f, "list: a query field");
          std::string next = detail::as_store(s)->list(*q, RecordOut(rs, ctx));
          if (!next.empty()) cs(ctx, str(next));
          return TNX_OK;
        });
      },
      // close
      [](tnx_store *s, char *err, uint32_t cap) noexcept -> tnx_status {
        Store *st = detail::as_store(s);
        tnx_status rc = detail::guarded(err, cap, [&] {
          st->close();
          return TNX_OK;
        });
        delete st;
        return rc;
      },
      // count (ABI 1.3)
      [](tnx_store *s, const tnx_list_query *q, uint64_t *out, char *err, uint32_t cap) noexcept
      -> tnx_status {
        return detail::guarded(err, cap, [&] {
          if (q == nullptr || q->header.abi_major != TNX_ABI_MAJOR || q->header.struct_size < kQueryV10Size)
            throw Error(TNX_EINVAL, "count: query missing, of another ABI major, or smaller than ABI 1.0's");
          if (out == nullptr) throw Error(TNX_EINVAL, "count: out_count is NULL");
          if ((q->filter_flags & ~TNX_FILTER_ALL) != 0)
            throw Error(TNX_EUNSUPPORTED, "count: unknown filter_flags bits " + std::to_string(q->filter_flags & ~TNX_FILTER_ALL));
          detail::check_due_filter(*q, *detail::as_store(s), "count");
          for (tnx_str f : {q->context_id, q->state, q->owner, q->tenant}) detail::check_str(f, "count: a query field");
          *out = detail::as_store(s)->count(*q);
          return TNX_OK;
        });
      },
      // save_batch (ABI 1.3)
      [](tnx_store *s, const tnx_task_record *const *recs, const uint64_t *expected, uint64_t n,
         uint64_t *out, uint64_t *failed, char *err, uint32_t cap) noexcept -> tnx_status {
        uint64_t at = n;
        tnx_status rc = detail::guarded(err, cap, [&] {
          if (n != 0 && (recs == nullptr || expected == nullptr || out == nullptr))
            throw Error(TNX_EINVAL, "save_batch: recs, expected or out_versions is NULL");
          for (uint64_t i = 0; i < n; ++i) {
            const tnx_task_record *rec = recs[i];
            at = i;
            if (rec == nullptr || rec->header.abi_major != TNX_ABI_MAJOR || rec->header.struct_size < kRecordV10Size)
              throw Error(TNX_EINVAL, "save_batch: record " + std::to_string(i) +
                                          " missing, of another ABI major, or smaller than ABI 1.0's");
            if (rec->id.len == 0) throw Error(TNX_EINVAL, "save_batch: record " + std::to_string(i) + ": empty task id");
            for (tnx_str f : {rec->id, rec->context_id, rec->state, rec->owner, rec->tenant, rec->task_json})
              detail::check_str(f, "save_batch: a record field");
            if (rec->task_json.len == 0)
              throw Error(TNX_EINVAL, "save_batch: record " + std::to_string(i) + ": empty task_json");
          }
          at = n;
          if (detail::as_store(s)->read_only())
            throw Error(TNX_EUNSUPPORTED, "save_batch: the store was opened read-only");
          try {
            detail::as_store(s)->save_batch(recs, expected, n, out);
          } catch (const BatchError &e) {
            at = e.index < n ? e.index : n;
            throw;
          }
          return TNX_OK;
        });
        if (rc != TNX_OK && failed != nullptr) *failed = at;
        return rc;
      },
      // watch (ABI 1.4)
      [](tnx_store *s, tnx_change_sink sink, void *ctx, char *err, uint32_t cap) noexcept -> tnx_status {
        return detail::guarded(err, cap, [&] {
          if (sink == nullptr) throw Error(TNX_EINVAL, "watch: sink is NULL");
          if (detail::as_store(s)->read_only())
            throw Error(TNX_EUNSUPPORTED, "watch: the store was opened read-only (no change feed)");
          detail::as_store(s)->watch(sink, ctx);
          return TNX_OK;
        });
      },
      // unwatch (ABI 1.4)
      [](tnx_store *s, char *err, uint32_t cap) noexcept -> tnx_status {
        return detail::guarded(err, cap, [&] {
          detail::as_store(s)->unwatch();
          return TNX_OK;
        });
      },
      // save_stream (ABI 1.5)
      [](tnx_store *s, tnx_record_source source, void *ctx, uint32_t flags, uint64_t *done, char *err,
         uint32_t cap) noexcept -> tnx_status {
        RecordSource src(source, ctx);
        uint64_t at = 0;
        tnx_status rc = detail::guarded(err, cap, [&] {
          if (source == nullptr || done == nullptr) throw Error(TNX_EINVAL, "save_stream: source or out_done is NULL");
          if ((flags & ~TNX_SAVE_STREAM_ALL) != 0)
            throw Error(TNX_EUNSUPPORTED, "save_stream: unknown flag bits " + std::to_string(flags & ~TNX_SAVE_STREAM_ALL));
          if (detail::as_store(s)->read_only())
            throw Error(TNX_EUNSUPPORTED, "save_stream: the store was opened read-only");
          try {
            at = detail::as_store(s)->save_stream(src, flags);
          } catch (const BatchError &e) {
            at = e.index;
            throw;
          } catch (...) {
            at = src.delivered();
            throw;
          }
          return TNX_OK;
        });
        if (done != nullptr) *done = at;
        return rc;
      },
  };
  return &vt;
}

/// Adapts `Open` (a callable `Store*(const tnx_open_args&)` that throws
/// sdk::Error on failure) to a tnx_open_fn.
template <Store *(*Open)(const tnx_open_args &)>
tnx_status open_trampoline(const tnx_open_args *args, tnx_store **out, char *err,
                           uint32_t cap) noexcept {
  return detail::guarded(err, cap, [&] {
    if (args == nullptr || args->header.abi_major != TNX_ABI_MAJOR)
      throw Error(TNX_EINVAL, "open: missing arguments or different ABI major");
    const uint32_t unknown = open_flags(*args) & ~TNX_OPEN_ALL;
    if (unknown != 0)
      throw Error(TNX_EUNSUPPORTED, "open: unknown TNX_OPEN_* flag bits " + std::to_string(unknown) +
                                        " (this plugin knows ABI " + std::to_string(TNX_ABI_MAJOR) +
                                        "." + std::to_string(TNX_ABI_MINOR) + ")");
    Store *st = Open(*args);
    st->read_only_ = open_read_only(*args);
    *out = reinterpret_cast<tnx_store *>(st);
    return TNX_OK;
  });
}

/// The body of a C++ plugin's entry function: refuses a host of another ABI
/// major (NULL), else returns a static copy of `D` whose vtable is
/// store_vtable(). Use:
///   extern "C" TNX_PLUGIN_EXPORT const tnx_plugin_descriptor *
///   toolnexus_plugin_entry(const tnx_host_info *host) { return sdk::entry<kDescriptor>(host); }
template <const tnx_plugin_descriptor &D>
const tnx_plugin_descriptor *entry(const tnx_host_info *host) noexcept {
  if (host == nullptr || host->header.abi_major != TNX_ABI_MAJOR) return nullptr;
  static const tnx_plugin_descriptor d = [] {
    tnx_plugin_descriptor x = D;
    x.vtable = store_vtable();
    return x;
  }();
  return &d;
}

// ---------------------------------------------------------------------------
// list helpers for backends that sort in memory
// ---------------------------------------------------------------------------

/// Position of a record in list order: newest status time first, ties by id
/// ascending. A cursor names the last record of a page; the next page starts
/// strictly after it.
struct ListKey {
  int64_t time_us = TNX_TIME_NONE;
  std::string id;

  /// True when *this comes before `o` in list order.
  bool before(int64_t o_time, std::string_view o_id) const noexcept {
    if (time_us != o_time) return time_us > o_time;
    return std::string_view(id) < o_id;
  }

  /// Opaque printable cursor: "<time>.<hex of id>" (2 bytes per id byte;
  /// the ABI sets no cursor length limit).
  std::string encode() const {
    std::string out = std::to_string(time_us);
    out.push_back('.');
    static const char *hex = "0123456789abcdef";
    for (unsigned char c : id) {
      out.push_back(hex[c >> 4]);
      out.push_back(hex[c & 15]);
    }
    return out;
  }

  /// Parses encode()'s output; throws Error(TNX_EINVAL) on anything else.
  static ListKey decode(std::string_view c) {
    ListKey k;
    size_t dot = c.find('.');
    auto bad = [&] { return Error(TNX_EINVAL, "list: malformed cursor '" + std::string(c.substr(0, 64)) + "'"); };
    if (dot == std::string_view::npos || dot == 0 || (c.size() - dot - 1) % 2 != 0) throw bad();
    std::string t(c.substr(0, dot));
    char *end = nullptr;
    errno = 0;
    long long v = std::strtoll(t.c_str(), &end, 10);
    if (errno != 0 || end == nullptr || *end != '\0') throw bad();
    k.time_us = static_cast<int64_t>(v);
    auto nib = [&](char h) -> int {
      if (h >= '0' && h <= '9') return h - '0';
      if (h >= 'a' && h <= 'f') return h - 'a' + 10;
      throw bad();
    };
    for (size_t i = dot + 1; i < c.size(); i += 2)
      k.id.push_back(static_cast<char>(nib(c[i]) * 16 + nib(c[i + 1])));
    return k;
  }
};

/// Position of a record in a due list (ABI 1.5, TNX_FILTER_DUE_BEFORE; see
/// tnx_list_query.due_before_us): due time ascending (earliest first), ties
/// by id ascending (bytewise). A due list's cursor names the last record of
/// a page; the next page starts strictly after it. Every built-in store
/// uses this one form, so a due list's cursor means the same everywhere
/// (the host still treats it as opaque).
struct DueKey {
  int64_t due_us = TNX_TIME_NONE;  ///< µs since the epoch
  std::string id;                  ///< the id's bytes

  /// True when *this comes before (o_due, o_id) in due order.
  bool before(int64_t o_due, std::string_view o_id) const noexcept {
    if (due_us != o_due) return due_us < o_due;
    return std::string_view(id) < o_id;
  }

  /// Opaque printable cursor: "d<due_us decimal>.<hex of id>" (lowercase,
  /// 2 bytes per id byte; the ABI sets no cursor length limit). The leading
  /// 'd' keeps it apart from a ListKey cursor of the same store.
  std::string encode() const {
    std::string out = "d" + std::to_string(due_us);
    out.push_back('.');
    static const char *hex = "0123456789abcdef";
    for (unsigned char c : id) {
      out.push_back(hex[c >> 4]);
      out.push_back(hex[c & 15]);
    }
    return out;
  }

  /// Parses encode()'s output. Anything else (a ListKey cursor, a missing
  /// 'd' or '.', a due time that is not a decimal int64, an odd number of
  /// hex digits or one that is not lowercase hex) throws Error(TNX_EINVAL)
  /// naming the cursor (its first 64 bytes).
  static DueKey decode(std::string_view c) {
    auto bad = [&] {
      return Error(TNX_EINVAL, "list: malformed due-list cursor '" + std::string(c.substr(0, 64)) +
                                   "' (expected d<due_us>.<hex id>, from the previous page of the same due list)");
    };
    const size_t dot = c.find('.');
    if (c.size() < 3 || c[0] != 'd' || dot == std::string_view::npos || dot < 2 || (c.size() - dot - 1) % 2 != 0)
      throw bad();
    const std::string t(c.substr(1, dot - 1));
    if (!(t[0] == '-' || (t[0] >= '0' && t[0] <= '9'))) throw bad();
    char *end = nullptr;
    errno = 0;
    const long long v = std::strtoll(t.c_str(), &end, 10);
    if (errno != 0 || end == nullptr || *end != '\0') throw bad();
    DueKey k;
    k.due_us = static_cast<int64_t>(v);
    auto nib = [&](char h) -> int {
      if (h >= '0' && h <= '9') return h - '0';
      if (h >= 'a' && h <= 'f') return h - 'a' + 10;
      throw bad();
    };
    k.id.reserve((c.size() - dot - 1) / 2);
    for (size_t i = dot + 1; i < c.size(); i += 2) k.id.push_back(static_cast<char>(nib(c[i]) * 16 + nib(c[i + 1])));
    return k;
  }
};

/// The due time of a record from the host (ABI 1.5 tnx_task_record.due_us),
/// TNX_TIME_NONE from a host built for 1.4 or older.
inline int64_t due_of(const tnx_task_record &rec) noexcept {
  return TNX_HAS_FIELD(&rec, tnx_task_record, due_us) ? rec.due_us : TNX_TIME_NONE;
}

/// True when a record with these index fields passes every filter enabled in
/// `q` (cursor not included). `due_us`: the record's due time (ABI 1.5),
/// checked by TNX_FILTER_DUE_BEFORE (which the trampolines let through only
/// to a store whose keeps_due() is true).
inline bool matches(const tnx_list_query &q, std::string_view context_id, std::string_view state,
                    std::string_view owner, std::string_view tenant, int64_t time_us,
                    int64_t due_us = TNX_TIME_NONE) noexcept {
  const uint32_t f = q.filter_flags;
  if ((f & TNX_FILTER_DUE_BEFORE) && (due_us == TNX_TIME_NONE || !(due_us < q.due_before_us))) return false;
  if ((f & TNX_FILTER_CONTEXT_ID) && context_id != view(q.context_id)) return false;
  if ((f & TNX_FILTER_STATE) && state != view(q.state)) return false;
  if ((f & TNX_FILTER_OWNER) && owner != view(q.owner)) return false;
  if ((f & TNX_FILTER_TENANT) && tenant != view(q.tenant)) return false;
  if ((f & TNX_FILTER_AFTER) && !(time_us > q.after_us)) return false;
  if ((f & TNX_FILTER_BEFORE) && !(time_us < q.before_us)) return false;
  return true;
}

/// Clamped page size of a query (1..TNX_LIST_MAX_PAGE).
inline uint32_t page_size(const tnx_list_query &q) noexcept {
  return q.page_size > TNX_LIST_MAX_PAGE ? TNX_LIST_MAX_PAGE : q.page_size;
}

}  // namespace toolnexus::sdk

#endif  // TOOLNEXUS_PLUGIN_HPP

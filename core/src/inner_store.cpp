// The host services of ABI 1.6: open_inner, which opens the store a
// decorator plugin wraps, and the forwarding vtable the decorator calls it
// through. The forwarding layer keeps the inner plugin's library loaded,
// serialises calls when the inner store is not thread-safe, answers
// TNX_EUNSUPPORTED for a function an older inner plugin lacks, and refuses
// writes on a read-only inner store whose plugin predates TNX_OPEN_READ_ONLY.
#include "plugin_store.hpp"

#include <mutex>
#include <new>
#include <stdexcept>

namespace toolnexus::detail {
namespace {

// One inner store: what the decorator holds as a tnx_store*.
struct Inner {
  std::shared_ptr<LoadedPlugin> plugin;  // keeps the library loaded
  const tnx_store_vtable *vt = nullptr;
  tnx_store *h = nullptr;
  uint64_t caps = 0;
  bool read_only = false;
  std::mutex mu;  // taken around every call when the inner store is not thread-safe

  bool has(size_t end) const noexcept { return vt->header.struct_size >= end; }
};

Inner *as_inner(tnx_store *s) noexcept { return reinterpret_cast<Inner *>(s); }

// Runs `f` under the inner store's threading rule.
template <class F>
tnx_status call(Inner *in, F &&f) noexcept {
  if ((in->caps & TNX_CAP_THREAD_SAFE) != 0) return f();
  std::lock_guard<std::mutex> l(in->mu);
  return f();
}

tnx_status unsupported(char *err, uint32_t cap, const char *what) noexcept {
  tnx_set_error(err, cap, what);
  return TNX_EUNSUPPORTED;
}

#define TNX_INNER_HAS(in, m) ((in)->has(offsetof(tnx_store_vtable, m) + sizeof(void *)) && (in)->vt->m != nullptr)

tnx_status f_get(tnx_store *s, tnx_str id, tnx_record_sink sink, void *ctx, char *err, uint32_t cap) {
  Inner *in = as_inner(s);
  return call(in, [&] { return in->vt->get(in->h, id, sink, ctx, err, cap); });
}

tnx_status f_save(tnx_store *s, const tnx_task_record *rec, uint64_t expected, uint64_t *out, char *err,
                  uint32_t cap) {
  Inner *in = as_inner(s);
  if (in->read_only) return unsupported(err, cap, "save: the inner store was opened read-only");
  return call(in, [&] { return in->vt->save(in->h, rec, expected, out, err, cap); });
}

tnx_status f_del(tnx_store *s, tnx_str id, uint64_t expected, char *err, uint32_t cap) {
  Inner *in = as_inner(s);
  if (in->read_only) return unsupported(err, cap, "delete: the inner store was opened read-only");
  return call(in, [&] { return in->vt->del(in->h, id, expected, err, cap); });
}

tnx_status f_list(tnx_store *s, const tnx_list_query *q, tnx_record_sink rs, tnx_cursor_sink cs, void *ctx,
                  char *err, uint32_t cap) {
  Inner *in = as_inner(s);
  if (q != nullptr && (q->filter_flags & TNX_FILTER_DUE_BEFORE) != 0 && (in->caps & TNX_CAP_DUE_INDEX) == 0)
    return unsupported(err, cap, "list: the inner store keeps no due times (no TNX_CAP_DUE_INDEX)");
  return call(in, [&] { return in->vt->list(in->h, q, rs, cs, ctx, err, cap); });
}

tnx_status f_close(tnx_store *s, char *err, uint32_t cap) {
  Inner *in = as_inner(s);
  const tnx_status rc = in->vt->close(in->h, err, cap);
  delete in;
  return rc;
}

tnx_status f_count(tnx_store *s, const tnx_list_query *q, uint64_t *out, char *err, uint32_t cap) {
  Inner *in = as_inner(s);
  if (!TNX_INNER_HAS(in, count)) return unsupported(err, cap, "count: the inner store does not count (ABI 1.3)");
  if (q != nullptr && (q->filter_flags & TNX_FILTER_DUE_BEFORE) != 0 && (in->caps & TNX_CAP_DUE_INDEX) == 0)
    return unsupported(err, cap, "count: the inner store keeps no due times (no TNX_CAP_DUE_INDEX)");
  return call(in, [&] { return in->vt->count(in->h, q, out, err, cap); });
}

tnx_status f_save_batch(tnx_store *s, const tnx_task_record *const *recs, const uint64_t *expected, uint64_t n,
                        uint64_t *out, uint64_t *failed, char *err, uint32_t cap) {
  Inner *in = as_inner(s);
  if (!TNX_INNER_HAS(in, save_batch) || in->read_only) {
    if (failed != nullptr) *failed = n;
    return unsupported(err, cap, "save_batch: not offered by the inner store");
  }
  return call(in, [&] { return in->vt->save_batch(in->h, recs, expected, n, out, failed, err, cap); });
}

tnx_status f_watch(tnx_store *s, tnx_change_sink sink, void *ctx, char *err, uint32_t cap) {
  Inner *in = as_inner(s);
  if (!TNX_INNER_HAS(in, unwatch) || in->vt->watch == nullptr || (in->caps & TNX_CAP_CHANGE_FEED) == 0 ||
      in->read_only)
    return unsupported(err, cap, "watch: the inner store has no change feed");
  // Not serialised: a feed may run beside the other calls (ABI 1.4).
  return in->vt->watch(in->h, sink, ctx, err, cap);
}

tnx_status f_unwatch(tnx_store *s, char *err, uint32_t cap) {
  Inner *in = as_inner(s);
  if (!TNX_INNER_HAS(in, unwatch)) {
    tnx_set_error(err, cap, "unwatch: no change feed runs");
    return TNX_EINVAL;
  }
  return in->vt->unwatch(in->h, err, cap);
}

tnx_status f_save_stream(tnx_store *s, tnx_record_source source, void *ctx, uint32_t flags, uint64_t *done,
                         char *err, uint32_t cap) {
  Inner *in = as_inner(s);
  if (!TNX_INNER_HAS(in, save_stream) || in->read_only) {
    if (done != nullptr) *done = 0;
    return unsupported(err, cap, "save_stream: not offered by the inner store");
  }
  return call(in, [&] { return in->vt->save_stream(in->h, source, ctx, flags, done, err, cap); });
}

const tnx_store_vtable kForward = {
    TNX_HEADER_INIT(tnx_store_vtable), f_get, f_save, f_del, f_list, f_close, f_count, f_save_batch,
    f_watch, f_unwatch, f_save_stream,
};

tnx_status open_inner(void *host_ctx, tnx_str selector, uint32_t flags, const tnx_store_vtable **out_vtable,
                      tnx_store **out_store, uint64_t *out_caps, char *err, uint32_t cap) noexcept {
  auto *ctx = static_cast<ServicesCtx *>(host_ctx);
  if (ctx == nullptr || out_vtable == nullptr || out_store == nullptr ||
      (selector.data == nullptr && selector.len != 0)) {
    tnx_set_error(err, cap, "open_inner: a NULL argument");
    return TNX_EINVAL;
  }
  const std::string_view sel(selector.data == nullptr ? "" : selector.data, static_cast<size_t>(selector.len));
  if (ctx->depth + 1 >= kMaxDecoratorDepth) {
    tnx_set_error(err, cap, ("open_inner: more than " + std::to_string(kMaxDecoratorDepth) +
                             " decorators nested in one selector")
                                .c_str());
    return TNX_EINVAL;
  }
  try {
    const ResolvedSelector r = (*ctx->resolver)(sel.empty() || sel == "memory" ? std::string_view("memory:") : sel);
    const RawStore raw = open_raw(r, sel, flags, *ctx->resolver, ctx->depth + 1);
    auto in = std::make_unique<Inner>();
    in->plugin = r.plugin;
    in->vt = r.plugin->descriptor->vtable;
    in->h = raw.handle;
    in->caps = raw.capabilities;
    // A plugin older than ABI 1.2 never saw TNX_OPEN_READ_ONLY: refuse its writes here.
    in->read_only = (flags & TNX_OPEN_READ_ONLY) != 0;
    ctx->inner_caps &= raw.capabilities;
    if (out_caps != nullptr) *out_caps = raw.capabilities;
    *out_vtable = &kForward;
    *out_store = reinterpret_cast<tnx_store *>(in.release());
    return TNX_OK;
  } catch (const std::invalid_argument &e) {
    tnx_set_error(err, cap, e.what());
    return TNX_EINVAL;
  } catch (const StoreError &e) {
    tnx_set_error(err, cap, e.what());
    const int c = static_cast<int>(e.code());
    return (c <= TNX_ENOTFOUND && c >= TNX_EINTERNAL) ? static_cast<tnx_status>(c) : TNX_EINTERNAL;
  } catch (const std::bad_alloc &) {
    tnx_set_error(err, cap, "open_inner: out of memory");
    return TNX_EINTERNAL;
  } catch (const std::exception &e) {
    tnx_set_error(err, cap, e.what());
    return TNX_EINTERNAL;
  }
}

}  // namespace

tnx_host_services make_services(ServicesCtx &ctx) {
  tnx_host_services s{};
  s.header = tnx_header(sizeof s);
  s.host_ctx = &ctx;
  s.open_inner = &open_inner;
  return s;
}

}  // namespace toolnexus::detail

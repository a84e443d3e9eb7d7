// The adapter from a plugin's C vtable to the C++ TaskStore interface: the
// one place where C++ calls cross into a plugin.
#include "plugin_store.hpp"

#include "change_hub.hpp"

#include <atomic>
#include <exception>
#include <mutex>
#include <shared_mutex>
#include <stdexcept>

namespace toolnexus::detail {
namespace {

constexpr uint32_t kErrCap = 4096;  // room for the messages of nested decorators

tnx_str cstr(std::string_view s) noexcept { return tnx_str{s.data(), s.size()}; }
std::string_view sv(tnx_str s) noexcept {
  return s.len == 0 ? std::string_view() : std::string_view(s.data, static_cast<size_t>(s.len));
}

// Smallest record a 1.0 plugin may hand back: up to and including `version`.
constexpr uint32_t kMinRecordSize = static_cast<uint32_t>(offsetof(tnx_task_record, version) + sizeof(uint64_t));

bool copy_record(const tnx_task_record *r, TaskRecord &out) noexcept {
  if (r == nullptr || r->header.struct_size < kMinRecordSize || r->header.abi_major != TNX_ABI_MAJOR)
    return false;
  try {
    out.id.assign(sv(r->id));
    out.context_id.assign(sv(r->context_id));
    out.state.assign(sv(r->state));
    out.status_time_us = r->status_time_us;
    out.owner.assign(sv(r->owner));
    out.tenant.assign(sv(r->tenant));
    out.json.assign(sv(r->task_json));
    out.version = r->version;
    if (TNX_HAS_FIELD(r, tnx_task_record, problem)) out.problem.assign(sv(r->problem));
    out.due_us = TNX_HAS_FIELD(r, tnx_task_record, due_us) ? r->due_us : kNoTime;
    return true;
  } catch (...) {
    return false;
  }
}

struct GetCtx {
  TaskRecord rec;
  bool got = false;
  bool bad = false;
};

struct ListCtx {
  ListPage page;
  bool bad = false;
};

class PluginStore final : public TaskStore {
 public:
  PluginStore(std::shared_ptr<LoadedPlugin> plugin, tnx_store *handle, std::string scheme,
              std::string display, uint64_t capabilities, bool read_only)
      : plugin_(std::move(plugin)),
        vt_(plugin_->descriptor->vtable),
        handle_(handle),
        has_count_(TNX_HAS_FIELD(vt_, tnx_store_vtable, count) && vt_->count != nullptr),
        has_batch_(TNX_HAS_FIELD(vt_, tnx_store_vtable, save_batch) && vt_->save_batch != nullptr),
        has_stream_(TNX_HAS_FIELD(vt_, tnx_store_vtable, save_stream) && vt_->save_stream != nullptr),
        has_watch_(TNX_HAS_FIELD(vt_, tnx_store_vtable, unwatch) && vt_->watch != nullptr &&
                   vt_->unwatch != nullptr),
        serialize_((capabilities & TNX_CAP_THREAD_SAFE) == 0),
        capabilities_(capabilities),
        read_only_(read_only),
        scheme_(std::move(scheme)),
        display_(std::move(display)) {}

  ~PluginStore() override {
    try {
      close();
    } catch (...) {
    }
  }

  std::optional<TaskRecord> get(std::string_view id) override {
    GetCtx ctx;
    char err[kErrCap] = {0};
    tnx_status rc;
    {
      Guard g(*this);
      rc = vt_->get(handle_, cstr(id), &on_get, &ctx, err, kErrCap);
    }
    if (rc == TNX_ENOTFOUND) return std::nullopt;
    check(rc, err, "get");
    if (ctx.bad || !ctx.got) fail_protocol("get delivered no valid record");
    return std::move(ctx.rec);
  }

  void remove(std::string_view id, uint64_t expected_version) override {
    refuse_if_read_only("delete");
    char err[kErrCap] = {0};
    tnx_status rc;
    {
      Guard g(*this);
      rc = vt_->del(handle_, cstr(id), expected_version, err, kErrCap);
    }
    check(rc, err, "delete");
  }

  ListPage list(const ListQuery &q) override {
    refuse_due_unless_indexed(q, "list");
    tnx_list_query cq = c_query(q);
    if (q.page_size == 0 || q.page_size > TNX_LIST_MAX_PAGE)
      throw StoreError(Status::invalid_argument,
                       "list: page size must be 1.." + std::to_string(TNX_LIST_MAX_PAGE) + ", got " +
                           std::to_string(q.page_size));
    cq.page_size = q.page_size;
    cq.cursor = cstr(q.cursor);
    cq.omit_json = q.omit_json ? 1u : 0u;
    cq.deliver_corrupt = q.deliver_corrupt ? 1u : 0u;
    ListCtx ctx;
    ctx.page.records.reserve(q.page_size < 512 ? q.page_size : 512);
    char err[kErrCap] = {0};
    tnx_status rc;
    {
      Guard g(*this);
      rc = vt_->list(handle_, &cq, &on_list, &on_cursor, &ctx, err, kErrCap);
    }
    check(rc, err, "list");
    if (ctx.bad) fail_protocol("list delivered an invalid record");
    return std::move(ctx.page);
  }

  // The plugin's count (ABI 1.3) when its vtable has one and it does not
  // answer unsupported; otherwise TaskStore's counting by list.
  uint64_t count(const ListQuery &q) override {
    refuse_due_unless_indexed(q, "count");
    if (!has_count_) return TaskStore::count(q);
    tnx_list_query cq = c_query(q);
    uint64_t n = 0;
    char err[kErrCap] = {0};
    tnx_status rc;
    {
      Guard g(*this);
      rc = vt_->count(handle_, &cq, &n, err, kErrCap);
    }
    if (rc == TNX_EUNSUPPORTED && (cq.filter_flags & ~TNX_FILTER_ALL) == 0) return TaskStore::count(q);
    check(rc, err, "count");
    return n;
  }

  StoreInfo info() const override {
    StoreInfo i;
    i.scheme = scheme_;
    i.plugin_name = plugin_->info.name;
    i.plugin_version = plugin_->info.version;
    i.plugin_path = plugin_->info.path;
    i.capabilities = capabilities_;
    i.read_only = read_only_;
    return i;
  }

  // The plugin's feed (ABI 1.4) is started with the first listener and
  // runs until close, which stops it (no sink call after close returns), so
  // the hub, the sink's context, outlives every call of the sink.
  std::unique_ptr<ChangeSubscription> watch_changes(ChangeListener listener) override {
    if ((capabilities_ & TNX_CAP_CHANGE_FEED) == 0 || !has_watch_ || read_only_) return nullptr;
    std::lock_guard<std::mutex> feed_lock(feed_mu_);
    if (!feed_started_) {
      char err[kErrCap] = {0};
      tnx_status rc;
      {
        Guard g(*this);
        rc = vt_->watch(handle_, &on_change, hub_.get(), err, kErrCap);
      }
      if (rc == TNX_EUNSUPPORTED) return nullptr;
      check(rc, err, "watch");
      feed_started_ = true;
    }
    return hub_->add(std::move(listener));
  }

  void close() override {
    std::unique_lock lock(mu_);
    if (handle_ == nullptr) return;
    char err[kErrCap] = {0};
    tnx_status rc = vt_->close(handle_, err, kErrCap);
    handle_ = nullptr;
    check(rc, err, "close");
  }

 protected:
  uint64_t do_save(const TaskRecord &r, uint64_t expected_version) override {
    refuse_if_read_only("save");
    tnx_task_record cr{};
    cr.header = tnx_header(sizeof cr);
    cr.id = cstr(r.id);
    cr.context_id = cstr(r.context_id);
    cr.state = cstr(r.state);
    cr.status_time_us = r.status_time_us;
    cr.owner = cstr(r.owner);
    cr.tenant = cstr(r.tenant);
    cr.task_json = cstr(r.json);
    cr.version = 0;
    cr.due_us = r.due_us;
    uint64_t version = 0;
    char err[kErrCap] = {0};
    tnx_status rc;
    {
      Guard g(*this);
      rc = vt_->save(handle_, &cr, expected_version, &version, err, kErrCap);
    }
    check(rc, err, "save");
    return version;
  }

  std::vector<uint64_t> do_save_batch(const std::vector<TaskRecord> &recs,
                                      const std::vector<uint64_t> &expected) override {
    if (!has_batch_) return TaskStore::do_save_batch(recs, expected);
    refuse_if_read_only("save");
    std::vector<tnx_task_record> crs(recs.size());
    std::vector<const tnx_task_record *> ptrs(recs.size());
    for (size_t i = 0; i < recs.size(); ++i) {
      const TaskRecord &r = recs[i];
      tnx_task_record &cr = crs[i];
      cr.header = tnx_header(sizeof cr);
      cr.id = cstr(r.id);
      cr.context_id = cstr(r.context_id);
      cr.state = cstr(r.state);
      cr.status_time_us = r.status_time_us;
      cr.owner = cstr(r.owner);
      cr.tenant = cstr(r.tenant);
      cr.task_json = cstr(r.json);
      cr.due_us = r.due_us;
      ptrs[i] = &cr;
    }
    std::vector<uint64_t> versions(recs.size(), 0);
    uint64_t failed = recs.size();
    char err[kErrCap] = {0};
    tnx_status rc;
    {
      Guard g(*this);
      rc = vt_->save_batch(handle_, ptrs.data(), expected.data(), recs.size(), versions.data(), &failed, err,
                           kErrCap);
    }
    if (rc == TNX_OK) return versions;
    // Not offered (a C++ plugin without it): the caller saves one by one.
    if (rc == TNX_EUNSUPPORTED && failed >= recs.size()) check(rc, err, "save of a batch");
    try {
      check(rc, err, "save of a batch");
    } catch (const StoreError &e) {
      throw BatchError(e.code(), e.what(), failed < recs.size() ? static_cast<size_t>(failed) : recs.size());
    }
    return versions;
  }

  uint64_t do_save_stream(const RecordSource &source, bool one_transaction) override {
    refuse_if_read_only("save");
    if (has_stream_) {
      StreamCtx ctx;
      ctx.source = &source;
      uint64_t done = 0;
      char err[kErrCap] = {0};
      tnx_status rc;
      {
        Guard g(*this);
        rc = vt_->save_stream(handle_, &on_source, &ctx, one_transaction ? TNX_SAVE_STREAM_ONE_TRANSACTION : 0u,
                              &done, err, kErrCap);
      }
      if (ctx.error) std::rethrow_exception(ctx.error);  // the source stopped it: its own reason
      if (rc == TNX_OK) return done;
      if (rc != TNX_EUNSUPPORTED || ctx.taken != 0) {
        try {
          check(rc, err, "save of a stream");
        } catch (const StoreError &e) {
          throw BatchError(e.code(), e.what(), static_cast<size_t>(done));
        }
      }
      // Not offered for these flags, and nothing taken yet: as a plugin
      // without save_stream (a store whose save_batch saves nothing either
      // has no transactions: unsupported, and the caller asks again).
      if (!one_transaction) return TaskStore::do_save_stream(source, one_transaction);
    }
    if (one_transaction && batch_offered()) {
      // A plugin of ABI 1.3/1.4 (or one whose store streams nothing, as
      // memory): one save_batch of everything, so memory grows with the
      // input (the price of keeping it one transaction).
      std::vector<TaskRecord> recs;
      std::vector<uint64_t> expected;
      uint64_t e = kAnyVersion;
      while (const TaskRecord *r = source(e)) {
        recs.push_back(*r);
        expected.push_back(e);
      }
      if (recs.empty()) return 0;
      return do_save_batch(recs, expected).size();
    }
    return TaskStore::do_save_stream(source, one_transaction);
  }

 private:
  // Whether save_batch saves batches: an empty one (TNX_OK by the ABI)
  // tells a plugin whose save_batch only says TNX_EUNSUPPORTED, before a
  // stream is read into memory for it.
  bool batch_offered() {
    if (!has_batch_) return false;
    uint64_t failed = 0;
    char err[kErrCap] = {0};
    Guard g(*this);
    return vt_->save_batch(handle_, nullptr, nullptr, 0, nullptr, &failed, err, kErrCap) == TNX_OK;
  }

  // What the tnx_record_source of do_save_stream works with.
  struct StreamCtx {
    const RecordSource *source = nullptr;
    tnx_task_record rec{};
    uint64_t taken = 0;
    std::exception_ptr error;  // the source's exception, rethrown once the plugin returned
  };
  // The tnx_record_source: never lets an exception into the plugin.
  static tnx_status on_source(void *c, const tnx_task_record **out, uint64_t *expected) noexcept {
    auto *ctx = static_cast<StreamCtx *>(c);
    *out = nullptr;
    if (ctx->error) return TNX_EINVAL;  // stopped already (a plugin that asks again)
    try {
      uint64_t e = kAnyVersion;
      const TaskRecord *r = (*ctx->source)(e);
      if (r == nullptr) return TNX_OK;
      tnx_task_record &cr = ctx->rec;
      cr = tnx_task_record{};
      cr.header = tnx_header(sizeof cr);
      cr.id = cstr(r->id);
      cr.context_id = cstr(r->context_id);
      cr.state = cstr(r->state);
      cr.status_time_us = r->status_time_us;
      cr.owner = cstr(r->owner);
      cr.tenant = cstr(r->tenant);
      cr.task_json = cstr(r->json);
      cr.due_us = r->due_us;
      *expected = e;
      *out = &cr;
      ++ctx->taken;
      return TNX_OK;
    } catch (...) {
      ctx->error = std::current_exception();
      return TNX_EINVAL;
    }
  }

  // Shared lock for calls (exclusive when the plugin is not thread-safe), so
  // close() never runs concurrently with a call.
  class Guard {
   public:
    explicit Guard(PluginStore &s) : s_(s) {
      if (s_.serialize_) s_.mu_.lock();
      else s_.mu_.lock_shared();
      if (s_.handle_ == nullptr) {
        unlock();
        throw StoreError(Status::invalid_argument, "store " + s_.display_ + " is closed");
      }
    }
    ~Guard() { unlock(); }
    Guard(const Guard &) = delete;
    Guard &operator=(const Guard &) = delete;

   private:
    void unlock() {
      if (done_) return;
      done_ = true;
      if (s_.serialize_) s_.mu_.unlock();
      else s_.mu_.unlock_shared();
    }
    PluginStore &s_;
    bool done_ = false;
  };

  // The C query of `q`'s filters (cursor, paging and flags left to the
  // caller); borrows q's strings.
  // A due filter goes only to a store that keeps due times (ABI 1.5): an
  // older plugin would not know the bit (or worse, ignore it).
  void refuse_due_unless_indexed(const ListQuery &q, const char *op) const {
    if (q.due_before_us && (capabilities_ & TNX_CAP_DUE_INDEX) == 0)
      throw StoreError(Status::unsupported, std::string(op) + ": store '" + display_ +
                                                "' keeps no due times (no TNX_CAP_DUE_INDEX, ABI 1.5)");
  }

  static tnx_list_query c_query(const ListQuery &q) {
    tnx_list_query cq{};
    cq.header = tnx_header(sizeof cq);
    if (q.context_id) { cq.filter_flags |= TNX_FILTER_CONTEXT_ID; cq.context_id = cstr(*q.context_id); }
    if (q.state) { cq.filter_flags |= TNX_FILTER_STATE; cq.state = cstr(*q.state); }
    if (q.owner) { cq.filter_flags |= TNX_FILTER_OWNER; cq.owner = cstr(*q.owner); }
    if (q.tenant) { cq.filter_flags |= TNX_FILTER_TENANT; cq.tenant = cstr(*q.tenant); }
    if (q.after_us) { cq.filter_flags |= TNX_FILTER_AFTER; cq.after_us = *q.after_us; }
    if (q.before_us) { cq.filter_flags |= TNX_FILTER_BEFORE; cq.before_us = *q.before_us; }
    if (q.due_before_us) { cq.filter_flags |= TNX_FILTER_DUE_BEFORE; cq.due_before_us = *q.due_before_us; }
    return cq;
  }

  static int32_t on_get(void *c, const tnx_task_record *r) {
    auto *ctx = static_cast<GetCtx *>(c);
    if (ctx->got) return 1;
    if (!copy_record(r, ctx->rec)) ctx->bad = true;
    ctx->got = true;
    return 0;
  }
  static int32_t on_list(void *c, const tnx_task_record *r) {
    auto *ctx = static_cast<ListCtx *>(c);
    try {
      ctx->page.records.emplace_back();
    } catch (...) {
      ctx->bad = true;
      return 1;
    }
    if (!copy_record(r, ctx->page.records.back())) {
      ctx->bad = true;
      return 1;
    }
    return 0;
  }
  // The tnx_change_sink: a plugin's thread, so nothing may escape.
  static void on_change(void *c, const tnx_change *change) noexcept {
    if (change == nullptr || change->header.abi_major != TNX_ABI_MAJOR ||
        !TNX_HAS_FIELD(change, tnx_change, version))
      return;
    StoreChange out;
    switch (change->kind) {
      case TNX_CHANGE_SAVED: out.kind = StoreChange::Kind::saved; break;
      case TNX_CHANGE_DELETED: out.kind = StoreChange::Kind::deleted; break;
      case TNX_CHANGE_GAP: out.kind = StoreChange::Kind::gap; break;
      default: return;  // a kind of a newer ABI
    }
    try {
      if (out.kind != StoreChange::Kind::gap) {
        if (change->id.len == 0 || change->id.data == nullptr) return;
        out.id.assign(sv(change->id));
      }
    } catch (...) {
      // Out of memory: what the listeners get instead is a gap.
      out.kind = StoreChange::Kind::gap;
      out.id.clear();
    }
    out.version = out.kind == StoreChange::Kind::gap ? 0 : change->version;
    static_cast<ChangeHub *>(c)->dispatch(out);
  }

  static void on_cursor(void *c, tnx_str cursor) {
    auto *ctx = static_cast<ListCtx *>(c);
    try {
      ctx->page.next_cursor.assign(sv(cursor));
    } catch (...) {
      ctx->bad = true;
    }
  }

  void check(tnx_status rc, const char *err, const char *op) const {
    if (rc == TNX_OK) return;
    std::string msg = std::string(op) + " on " + display_ + " failed: " + tnx_strerror(rc);
    if (err != nullptr && err[0] != '\0') msg += std::string(": ") + err;
    Status st = Status::internal;
    if (rc <= TNX_ENOTFOUND && rc >= TNX_EINTERNAL) st = static_cast<Status>(rc);
    else msg += " (plugin returned unknown status " + std::to_string(rc) + ")";
    throw StoreError(st, msg);
  }

  // The host's own check, so that a plugin older than ABI 1.2 (which never
  // saw TNX_OPEN_READ_ONLY) cannot be written through a read-only store.
  void refuse_if_read_only(const char *op) const {
    if (read_only_)
      throw StoreError(Status::unsupported,
                       op + std::string(" refused: store ") + display_ + " was opened read-only");
  }

  [[noreturn]] void fail_protocol(const char *what) const {
    throw StoreError(Status::internal, "plugin " + plugin_->info.path + " broke the ABI: " + what);
  }

  std::shared_ptr<LoadedPlugin> plugin_;
  const tnx_store_vtable *vt_;
  tnx_store *handle_;
  const bool has_count_;  // the vtable has a count function (ABI 1.3)
  const bool has_batch_;  // the vtable has a save_batch function (ABI 1.3)
  const bool has_stream_;  // the vtable has a save_stream function (ABI 1.5)
  const bool has_watch_;  // the vtable has watch and unwatch (ABI 1.4)
  const bool serialize_;
  const uint64_t capabilities_;
  const bool read_only_;
  std::string scheme_;
  std::string display_;
  std::shared_mutex mu_;
  std::mutex feed_mu_;
  bool feed_started_ = false;  // under feed_mu_
  std::shared_ptr<ChangeHub> hub_ = std::make_shared<ChangeHub>();
};

}  // namespace

RawStore open_raw(const ResolvedSelector &r, std::string_view selector, uint32_t flags,
                  const SelectorResolver &resolver, int depth) {
  const std::shared_ptr<LoadedPlugin> &plugin = r.plugin;
  const uint64_t declared = plugin->descriptor->capabilities;
  uint64_t caps = declared;
  ServicesCtx sctx;
  sctx.resolver = &resolver;
  sctx.depth = depth;
  const tnx_host_services services = make_services(sctx);
  tnx_open_args args{};
  args.header = tnx_header(sizeof args);
  args.scheme = cstr(r.scheme);
  args.location = cstr(r.location);
  args.selector = cstr(selector);
  args.flags = flags;
  args.capabilities = &caps;
  args.services = &services;
  tnx_store *handle = nullptr;
  char err[kErrCap] = {0};
  tnx_status rc = plugin->descriptor->open(&args, &handle, err, kErrCap);
  const std::string &display = r.display;
  if (rc != TNX_OK || handle == nullptr) {
    std::string msg = "cannot open store " + display + " with plugin " + plugin->info.name + " (" +
                      plugin->info.path + "): " +
                      (err[0] != '\0' ? std::string(err)
                                       : std::string(tnx_strerror(rc)) + " (the plugin gave no message)");
    if (rc == TNX_EINVAL) throw std::invalid_argument(msg);
    Status st = (rc <= TNX_ENOTFOUND && rc >= TNX_EINTERNAL) ? static_cast<Status>(rc) : Status::internal;
    if (rc == TNX_OK) st = Status::internal;
    throw StoreError(st, msg);
  }
  if ((caps & ~declared) != 0) {
    // Closing is still owed to the plugin; its result does not matter here.
    char ignored[kErrCap] = {0};
    (void)plugin->descriptor->vtable->close(handle, ignored, kErrCap);
    throw StoreError(Status::internal,
                     "plugin " + plugin->info.path + " broke the ABI: open of " + display +
                         " claimed capabilities its descriptor lacks (" +
                         capability_names(caps & ~declared) + ")");
  }
  // A decorated store keeps only what both layers keep (ABI 1.6).
  return RawStore{handle, caps & sctx.inner_caps};
}

std::shared_ptr<TaskStore> open_plugin_store(const ResolvedSelector &r, std::string_view selector,
                                             const OpenOptions &options, const SelectorResolver &resolver) {
  const RawStore raw = open_raw(r, selector, options.read_only ? TNX_OPEN_READ_ONLY : 0u, resolver, 0);
  return std::make_shared<PluginStore>(r.plugin, raw.handle, r.scheme, r.display, raw.capabilities,
                                       options.read_only);
}

}  // namespace toolnexus::detail

// plugins/file/index.hpp: the in-memory index of the file plugin: every
// task file's index fields, version and identity by key, in list order,
// with counters, as read from .tnx-index (index_format.hpp) or built from
// the directory. FileStore (file_store.hpp) owns one behind a unique_ptr
// and guards it with its imu_; nothing here locks or does I/O (beyond the
// memory mappings of IndexMemory).
#ifndef TOOLNEXUS_FILE_INDEX_HPP
#define TOOLNEXUS_FILE_INDEX_HPP

#include "basics.hpp"
#include "index_format.hpp"

#include "../common/task_counts.hpp"

#include "toolnexus/task_store.h"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory_resource>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>

namespace toolnexus::file_plugin {

/// The index fields of one task file. A corrupt one has no fields (time
/// TNX_TIME_NONE) and the reason in `problem`. EntryView views them (in an
/// IEntry, an index slot or an index record being read); IEntry owns them:
/// what is built before it goes into the index, and a copy taken out of it
/// to use without its lock.
template <class Str>
struct EntryFields {
  Str context_id, state, owner, tenant;
  int64_t time_us = TNX_TIME_NONE;
  /// The host's due time (ABI 1.5 tnx_task_record.due_us), TNX_TIME_NONE
  /// when none; kept in the index records only (see Index::due).
  int64_t due_us = TNX_TIME_NONE;
  uint64_t version = 0;
  FileId file;
  bool corrupt = false;
  bool unreadable = false;  // corrupt because it cannot be read (TNX_EIO), not decoded
  Str problem;
};
/// Entry fields viewing strings owned elsewhere (see EntryFields).
using EntryView = EntryFields<std::string_view>;

/// Entry fields owning their strings (see EntryFields).
struct IEntry : EntryFields<std::string> {
  /// Views this entry (valid while it lives unchanged).
  EntryView view() const noexcept {
    return EntryView{context_id, state, owner, tenant, time_us, due_us, version, file, corrupt, unreadable, problem};
  }
  /// A copy of `v`.
  static IEntry of(const EntryView &v) {
    IEntry e;
    e.context_id.assign(v.context_id);
    e.state.assign(v.state);
    e.owner.assign(v.owner);
    e.tenant.assign(v.tenant);
    e.time_us = v.time_us;
    e.due_us = v.due_us;
    e.version = v.version;
    e.file = v.file;
    e.corrupt = v.corrupt;
    e.unreadable = v.unreadable;
    e.problem.assign(v.problem);
    return e;
  }
};

/// Where the index's nodes and strings live: a pool (fast, no per-block
/// header) over this resource, which gives the pool's large chunks (1 MiB
/// and up) as anonymous mappings aligned to 2 MiB and advised for
/// transparent huge pages, and anything smaller from the heap. A 50,000-Task
/// index is ~15 MB of small blocks: from malloc, every 4 KiB page of it was
/// a page fault and every lookup a TLB miss (expensive in a VM); in huge
/// pages a `toolnexus store list` of it ran 20% faster. Not thread-safe
/// (the index is used under FileStore::imu_).
class IndexMemory final : public std::pmr::memory_resource {
  static constexpr size_t kHuge = size_t{2} << 20;
  static constexpr size_t kBig = size_t{1} << 20;
  static size_t mapped_size(size_t bytes) noexcept { return (bytes + kHuge - 1) & ~(kHuge - 1); }

  void *do_allocate(size_t bytes, size_t align) override;
  void do_deallocate(void *p, size_t bytes, size_t align) override;
  bool do_is_equal(const std::pmr::memory_resource &o) const noexcept override { return this == &o; }
};
/// The in-memory index: every task file of the directory by key (the Task
/// id; for a corrupt file whose id is not known, '\0' + its file name), in
/// list order, with counters. Guarded by FileStore::imu_. Not copyable or
/// movable: its containers allocate from its own pool (replace it whole
/// through a unique_ptr).
struct Index {
  /// One entry as the index keeps it: its strings back to back in one block
  /// of the pool (key, contextId, state, owner, tenant, problem), so an
  /// entry costs two small blocks (this node and its text) instead of five
  /// heap strings; the map's key views the text's first part.
  struct Slot {
    int64_t time_us = TNX_TIME_NONE;
    int64_t due_us = TNX_TIME_NONE;
    uint64_t version = 0;
    FileId file;
    char *text = nullptr;
    uint32_t len[6] = {};  // key, context_id, state, owner, tenant, problem
    bool corrupt = false, unreadable = false;

    /// Bytes of `text`.
    size_t text_size() const noexcept {
      return size_t{len[0]} + len[1] + len[2] + len[3] + len[4] + len[5];
    }
    /// Views the entry (valid until it is replaced or erased).
    EntryView view() const noexcept {
      size_t off = len[0];
      auto next = [&](int i) {
        std::string_view s(text + off, len[i]);
        off += len[i];
        return s;
      };
      EntryView v;
      v.context_id = next(1);
      v.state = next(2);
      v.owner = next(3);
      v.tenant = next(4);
      v.problem = next(5);
      v.time_us = time_us;
      v.due_us = due_us;
      v.version = version;
      v.file = file;
      v.corrupt = corrupt;
      v.unreadable = unreadable;
      return v;
    }
  };
  /// Entries by key (the key views the Slot's text).
  using Map = std::pmr::unordered_map<std::string_view, Slot>;
  /// One (key, Slot) of `entries`.
  using Node = Map::value_type;
  /// A place in list order: (time, delivered id, keyed by name), then names
  /// last, and the entry it stands for. `id` views the key inside `node`'s
  /// text, which stays put until the entry is replaced or erased (put and
  /// erase take its OKey out of `order` first), so the order holds no copy
  /// of any id and list reaches an entry without a hash lookup. A probe key
  /// (a lookup bound) has no node; its `id` need only outlive the lookup.
  struct OKey {
    int64_t time;
    std::string_view id;
    bool named;
    const Node *node;
  };
  /// List order: newest time first, then by id; for the same time and id,
  /// the key of an id before the key of a file name.
  struct OOrder {
    bool operator()(const OKey &a, const OKey &b) const noexcept {
      if (a.time != b.time) return a.time > b.time;
      const int c = a.id.compare(b.id);
      if (c != 0) return c < 0;
      return a.named < b.named;
    }
  };
  /// Every entry in list order.
  using Order = std::pmr::set<OKey, OOrder>;

  /// An empty index (epoch 0, no header seen).
  Index() = default;
  Index(const Index &) = delete;
  Index &operator=(const Index &) = delete;
  /// The containers are not destroyed one node at a time: their every block
  /// is the pool's, which `pool_`'s destructor returns at once (a 50,000-Task
  /// index took 3 ms to free node by node). No destructor of theirs has any
  /// other effect.
  ~Index() { store_.destroy(); }

 private:
  IndexMemory chunks_;
  std::pmr::unsynchronized_pool_resource pool_{[] {
                                                 std::pmr::pool_options o;
                                                 o.max_blocks_per_chunk = 1 << 14;
                                                 o.largest_required_pool_block = 512;
                                                 return o;
                                               }(),
                                               &chunks_};
  /// The containers, in storage whose destructor does nothing (see ~Index).
  struct Containers {
    Map entries;
    Order order;
    explicit Containers(std::pmr::memory_resource *r) : entries(r), order(r) {}
  };
  struct Store {
    alignas(Containers) unsigned char raw[sizeof(Containers)];
    Containers *c = nullptr;
    void create(std::pmr::memory_resource *r) { c = new (raw) Containers(r); }
    void destroy() noexcept {}  // left to the pool: see ~Index
  } store_;
  bool made_ = (store_.create(&pool_), true);

 public:
  /// Every entry by key.
  Map &entries = store_.c->entries;
  /// Every entry in list order (built by end_bulk after a bulk read).
  Order &order = store_.c->order;
  /// Built on first use (build_counts, from count()), then kept up to date
  /// by put and erase: a process that only lists (`toolnexus store list`)
  /// never pays for them, nor an open for their ~750 instructions per Task.
  toolnexus::plugins::TaskCounts counts;
  bool counts_ready = false;  // `counts` is built
  std::unordered_map<std::string, uint64_t> tombs;  // last version of each deleted key
  /// (due time, key) of every entry with one (ABI 1.5), earliest first:
  /// what a TNX_FILTER_DUE_BEFORE list visits. Kept by put and erase, in
  /// bulk mode too. Due times live in the index records only: a rebuild
  /// from the directory (a lost or untrusted index) starts without any,
  /// which the host's full sweep at start makes good (task_store.h).
  std::set<std::pair<int64_t, std::string>> due;
  /// The bytes a compacted .tnx-index takes for `entries` and `tombs` (what
  /// compaction compares the file with: estimating 128 bytes an entry made
  /// an index of large entries, or of tombstones, rewrite itself on every
  /// save).
  uint64_t live_bytes = 0;
  uint64_t epoch = 0;  // versions given now are above epoch << 32
  int64_t live = 0;  // processes that appended OPEN and not CLOSE, since RESET
  /// The last record applied was a CLOSE; that CLOSE was the last process's,
  /// and `last_stamp` is the directory's stamp it recorded.
  bool last_is_close = false, last_close_was_last = false;
  Stamp last_stamp;
  bool header_ok = false;  // a header record of this format was applied

  /// True for the key of a corrupt file known by name only ('\0' + name).
  static bool named(std::string_view key) noexcept { return !key.empty() && key[0] == '\0'; }
  /// The id a record of `key` shows (a named key: the file name).
  static std::string shown(std::string_view key) {
    return std::string(named(key) ? key.substr(1) : key);
  }
  /// The OKey of `n` with the time `time_us` (the entry's, or the one it is
  /// about to get).
  static OKey okey(const Node &n, int64_t time_us) noexcept {
    const bool nm = named(n.first);
    return OKey{time_us, nm ? n.first.substr(1) : n.first, nm, &n};
  }

  /// The entry of `key`, or null.
  const Slot *find(std::string_view key) const {
    auto it = entries.find(key);
    return it == entries.end() ? nullptr : &it->second;
  }

  /// Bulk mode (a whole index file read from its start): records update
  /// `entries` and `tombs` only; end_bulk() then builds `order` from one
  /// sort (counts wait for their first use: build_counts). Updating the tree
  /// and the counters per record made opening a 50,000-Task store twice as
  /// slow; inserting unsorted left the tree's nodes scattered in memory, so
  /// every list walked it through cache misses.
  bool bulk = false;
  void end_bulk();

  /// Counts every sound entry once; then put and erase keep the counters.
  void build_counts();

  /// Drops the entry of `key` (no tombstone: see remove).
  void erase(std::string_view key);
  /// Adds or replaces the entry of `key`.
  void put(std::string_view key, const EntryView &e);
  /// The version the next save of `key` gets: above its entry, its
  /// tombstone and everything of earlier epochs.
  uint64_t next_version(std::string_view key) const;
  /// Drops `key`, keeping its last version as a tombstone.
  void remove(std::string_view key);

  /// Applies one record; false when its payload is malformed.
  bool apply(uint8_t type, std::string_view payload);

  /// The store's change feed (ABI 1.4, store_feed.cpp): called by apply()
  /// for every Task and delete record outside bulk mode, with the id, its
  /// version (a delete: the last one) and whether it was a delete; not for
  /// named keys (corrupt files known by name only). Empty when nobody
  /// watches. Called with the store's imu_ held: must not block.
  std::function<void(std::string_view id, uint64_t version, bool deleted)> on_change;

  /// Appends the framed kRecTask record of entry `e` of `key` to `out`.
  static void task_record(std::string &out, std::string_view key, const EntryView &e);

 private:
  /// What the record of `s` (a task record) or of a tombstone of `key` (a
  /// delete record) takes in .tnx-index: framing 8, type 1, then the fields.
  static uint64_t record_bytes(const Slot &s) noexcept { return 8 + 1 + 6 * 4 + 6 * 8 + 1 + s.text_size(); }
  static uint64_t tomb_bytes(std::string_view key) noexcept { return 8 + 1 + 4 + key.size() + 8; }
  /// Keeps `v` as the last version of deleted `key` (the larger one wins).
  void tomb(std::string_view key, uint64_t v) {
    auto [t, fresh] = tombs.try_emplace(std::string(key), v);
    if (fresh) live_bytes += tomb_bytes(key);
    else if (v > t->second) t->second = v;
  }
  void untomb(std::string_view key) {
    if (tombs.erase(std::string(key)) != 0) live_bytes -= tomb_bytes(key);
  }
  void count(const Slot &s, int64_t delta) {
    const EntryView v = s.view();
    counts.add(v.context_id, v.state, v.owner, v.tenant, delta);
  }
  void free_text(char *text, size_t size) {
    if (text != nullptr) pool_.deallocate(text, size, 1);
  }
};

}  // namespace toolnexus::file_plugin

#endif  // TOOLNEXUS_FILE_INDEX_HPP

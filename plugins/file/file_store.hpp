// plugins/file/file_store.hpp: the file plugin's sdk::Store: a Task store
// in one directory (layout comment of file_plugin.cpp). It puts the layers
// together: record I/O (TaskFiles, task_files.hpp), the index in memory
// (Index, index.hpp) and on disk (.tnx-index, index_format.hpp), and the
// locks (locks.hpp). Its members are defined in two files:
//   store_index.cpp  open and close, loading and following .tnx-index,
//                    appends, compaction, rebuild, and making an entry
//                    agree with its file;
//   store_ops.cpp    get, save, del, list and count, list cursors.
//
// Thread-safety: every public method may be called from any thread at any
// time (TNX_CAP_THREAD_SAFE), and by several processes on one directory
// (TNX_CAP_MULTI_PROCESS). Inside: imu_ (shared for readers) guards the
// in-memory index, offset_ and the reopening of index_fd_; append_mu_ with
// the index lock serialises appends; SlotGuard serialises saves and deletes
// of one id. Errors: sdk::Error with a TNX_* code and a message naming the
// file (see the layout comment, "Errors").
#ifndef TOOLNEXUS_FILE_FILE_STORE_HPP
#define TOOLNEXUS_FILE_FILE_STORE_HPP

#include "index.hpp"
#include "locks.hpp"
#include "names.hpp"
#include "task_files.hpp"

#include "toolnexus/plugin.hpp"

#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace toolnexus::file_plugin {

/// The store of file:<dir>. Made by open_file (file_plugin.cpp), which calls
/// open_index() and, read-write, probe_writable() before handing it to the
/// host; the host owns it (deleted through sdk::Store) and calls close()
/// before deleting it.
class FileStore final : public toolnexus::sdk::Store, private TaskFiles {
 public:
  /// A store of the directory open as `dir` at absolute `path`; changes
  /// nothing when `read_only` (TNX_OPEN_READ_ONLY). Not usable before
  /// open_index().
  FileStore(Fd dir, std::string path, bool read_only)
      : TaskFiles(std::move(dir), std::move(path)), ro_(read_only), slots_(new std::mutex[kIdSlots]) {}

  ~FileStore() override {
    stop_feed();
    if (index_fd_ >= 0) ::close(index_fd_);
    if (lock_fd_ >= 0) ::close(lock_fd_);
  }

  /// Opens the index (see the layout comment): takes this process's slot,
  /// loads .tnx-index, checks it can be trusted, rebuilds it otherwise,
  /// cleans up when no other process has the store open, and records the
  /// open. Read-only: creates and changes nothing; an index that cannot be
  /// trusted (or none) is rebuilt in memory only.
  /// The directory's stamp is taken under the index lock (shared for a
  /// read-only open), so that it and the index describe one moment: taken
  /// before waiting for the lock, a process that saved and closed meanwhile
  /// made the stamp disagree with its close record, and a sound index was
  /// rebuilt with a new epoch (found by a fresh-user pass).
  void open_index();

  using TaskFiles::probe_writable;

  /// sdk::Store::get: the Task `idv` with the version the index names for
  /// the very bytes read (never old bytes with a newer version).
  bool get(std::string_view idv, const toolnexus::sdk::RecordOut &out) override;
  /// sdk::Store::save: checks, compare-and-set under the id's lock, writes
  /// (layout comment, "Atomicity"), appends the new entry; returns the
  /// new version.
  uint64_t save(const tnx_task_record &rec, uint64_t expected) override;
  /// ABI 1.5 sdk::Store::save_stream (store_stream.cpp): Task by Task
  /// (TNX_SAVE_STREAM_ONE_TRANSACTION is TNX_EUNSUPPORTED: no transactions
  /// across files), the durability work done once per group of up to
  /// kStreamGroup Tasks / kStreamGroupBytes: every Task file of the group
  /// written to its temp file, one syncfs(2) of the file system, the
  /// renames (each a save's compare-and-set under the id's lock), one
  /// fsync of <dir>. A crash leaves each Task of the group old or new,
  /// whole; temp files are removed by the next lone open.
  uint64_t save_stream(toolnexus::sdk::RecordSource &source, uint32_t flags) override;
  /// Tasks per group of save_stream.
  static constexpr size_t kStreamGroup = 1000;
  /// Task JSON bytes per group of save_stream (a group ends at either).
  static constexpr size_t kStreamGroupBytes = size_t(16) << 20;
  /// sdk::Store::del: compare-and-set under the id's lock, unlinks the Task
  /// file and its sidecar, appends a tombstone.
  void del(std::string_view idv, uint64_t expected) override;
  /// sdk::Store::list: a page from the index in list order, reading only
  /// the files it delivers (none with omit_json); returns the next cursor.
  std::string list(const tnx_list_query &q, const toolnexus::sdk::RecordOut &out) override;
  /// ABI 1.3: from the index's counters; a time window walks that window.
  uint64_t count(const tnx_list_query &q) override;
  /// Records the close (with the directory's stamp when this is the last
  /// process), so that the next lone open can trust the index.
  void close() override;
  /// ABI 1.4 (store_feed.cpp): reports every Task and delete record applied
  /// to the index: this process's at once, other processes' when a thread
  /// of this store finds .tnx-index grown (an fstat every kFeedPollMs); a
  /// reload of the whole index (compaction by another process, a rebuild)
  /// is a gap.
  void watch(tnx_change_sink sink, void *ctx) override;
  // ABI 1.5: due times are kept in the index records (Index::due).
  bool keeps_due() const noexcept override { return true; }
  void unwatch() override;

  /// How often the feed's thread looks for other processes' records.
  static constexpr int kFeedPollMs = 20;

 private:
  // ---- store_feed.cpp -----------------------------------------------------

  // The feed's thread: catch_up() every kFeedPollMs until stopped.
  void feed_loop() noexcept;
  // Stops the thread, unhooks the index, stops the feed. Idempotent.
  void stop_feed() noexcept;
  // Points index_->on_change at the feed (imu_ held exclusively).
  void hook_index_locked();
  // index_ was replaced or rebuilt (imu_ held exclusively): hooks the
  // feed to it and reports a gap, when watched. (A move found by
  // read_new_locked says its gap only after the new file is read.)
  void index_reloaded_locked();

  toolnexus::sdk::ChangeFeed feed_;
  std::mutex feed_start_mu_;  // serialises watch and unwatch
  std::mutex feed_mu_;  // guards feed_stop_
  std::condition_variable feed_cv_;
  bool feed_stop_ = false;
  std::thread feed_thread_;

  // The stored state of an id, after reconciling the index with the disk.
  struct Current {
    bool present = false;
    uint64_t version = 0;
    FileId file;
  };

  // A match of a list page taken from the index: its key, the id shown
  // and a copy of its entry.
  struct Cand {
    std::string key, shown;
    IEntry e;
  };

  // A record of a list page, ready to deliver.
  struct Item {
    int64_t time_us;
    std::string id;
    uint64_t version;
    std::string context_id, state, owner, tenant, json;
    std::string problem;  // deliver_corrupt: why the record is unreadable
    int64_t due_us;       // ABI 1.5: the host's due time (TNX_TIME_NONE: none)
    // Its place in a due list (the index's due time, also of a record
    // delivered corrupt, and its key): what that list's cursor names.
    int64_t pos_due;
    std::string key;
  };

  // A decoded cursor. Ids whose plain ListKey cursor would exceed 1024 bytes
  // use "<ListKey of (time, first 460 id bytes)>.<sha256 of the id>".
  struct Cursor {
    ListKey key;
    bool long_form = false;
    std::string sha;
  };

  // ---- store_index.cpp ----------------------------------------------------

  // Removes stray temporary files, a stray .tnx-index.new and orphan
  // sidecars. Only called when no other process has the store open (the
  // process slots of .tnx-lock say so): what a live process is writing is
  // never touched.
  void recover();

  // Process slots of .tnx-lock held by other open stores.
  int live_slots() const;

  // The index can be used as it is: with other processes open, when the
  // opens it records match them; alone, when the last process closed it
  // cleanly and the directory has not changed since.
  bool trusted(const Stamp &now, int others) const;

  // Opens and reads .tnx-index (imu_ held exclusively); false when there is
  // none or it is not an index.
  bool load_file_locked();

  // Applies the records of .tnx-index from offset_ up to `size` (imu_ held
  // exclusively). Stops before a torn or damaged record (a write under way
  // in another process, or a crash's: the next appender truncates it).
  void read_new_locked(uint64_t size);

  // Brings the in-memory index up to what other processes appended.
  void catch_up();

  // catch_up() with the index lock held: a tail that does not parse is a
  // crashed writer's and is cut off, so that appends stay readable.
  void catch_up_locked();

  // Appends framed records and applies them to the in-memory index. The
  // caller holds append_mu_ and the index lock and has caught up
  // (catch_up_locked), so the file ends at offset_ and nobody else appends:
  // what is written is applied as written, not read back (that took 4
  // fstat and a pread per save). imu_ is held from before the write until
  // offset_ is past it: a catch_up() of another thread of this process
  // would otherwise read the new records in between, and they would be
  // applied twice (offset_ then ran past the file's end, and this process
  // missed or cut off other processes' records).
  void append_raw_locked(const std::string &records);

  // Records `e` (its version assigned here) for `key` in the index; returns
  // the version. The caller holds the id's SlotGuard.
  uint64_t index_put(const std::string &key, IEntry e);

  // Records the delete of `key` (a tombstone with its last version).
  void index_del(const std::string &key);

  // The index file (offset_ bytes: called caught up, the index lock held)
  // is past 8 MiB and 4 times what its live entries take.
  bool big_locked() const;

  // Writes the whole index to .tnx-index.new and renames it over
  // .tnx-index (imu_ exclusive, the index lock held); followers of the old
  // file see its last record "moved" and read the new one. `live`: the
  // processes open now.
  void compact_locked(int64_t live);

  // Makes the index match the directory (imu_ exclusive): every canonical
  // task file whose identity differs from its entry (or that has none) is
  // read again with a new version; entries without a file are dropped.
  // `loaded`: the current index is a base worth keeping.
  void rebuild_locked(bool loaded, std::string *);

  // The entry of task file `name` read from disk; `key` receives its key.
  IEntry read_entry(const std::string &name, const std::optional<StemInfo> &info, std::string &key);

  // The stored state of `id`, after making the index agree with its file
  // (the caller holds the id's SlotGuard): a file that changed behind the
  // index (another program, a crashed writer) is read again and gets a new
  // version; a file gone is dropped.
  Current current(const std::string &id, const std::string &stem);

  // Re-reads the file of `key` into the index (list found it changed).
  void reindex(const std::string &key);

  // A copy of the entry of `key` (taken under imu_), or nullopt.
  std::optional<IEntry> entry_of(const std::string &key) const;

  // ---- store_ops.cpp ------------------------------------------------------

  // A Task of a save_stream group, its file written to temp file `tmp`
  // (not yet synced or renamed), with copies of its record's fields.
  struct Staged {
    std::string id, context_id, state, owner, tenant, json;
    int64_t time_us = 0;
    int64_t due_us = TNX_TIME_NONE;  // ABI 1.5
    uint64_t expected = 0;
    std::string tmp;  // name of the temp file in <dir>
    FileId file;      // its identity (a rename keeps it)
    tnx_task_record record() const;  // borrowing the strings above
  };

  // save() after validate(): compare-and-set under the id's lock, write,
  // index. `staged` (a stream's): its temp file becomes the Task file on
  // the fast path, and <dir> is not synced (the stream does it once).
  uint64_t save_valid(const tnx_task_record &rec, const std::string &id, uint64_t expected,
                      const Staged *staged);

  // ---- store_stream.cpp ---------------------------------------------------

  // Writes `rec`'s JSON to a new temp file, unsynced; the Staged of it.
  Staged stage(const tnx_task_record &rec, uint64_t expected);
  // Renames staged.tmp to `jname`; its identity. TNX_EIO naming both.
  FileId put_staged(const Staged &staged, const std::string &jname, const std::string &id);
  // Makes a group durable and in place: syncfs, each Task saved
  // (save_valid), one fsync of <dir>; `saved` counts the Tasks saved.
  // Throws sdk::BatchError naming the Task that failed (`first` is the
  // index of group[0] in the stream); the Tasks before it stay saved and
  // durable, the temp files of the rest are removed.
  void commit_group(std::vector<Staged> &group, uint64_t first, uint64_t &saved);
  // Removes the temp files of group[from..].
  void drop_staged(std::vector<Staged> &group, size_t from) noexcept;

  // Where a page after `cursor` starts in the index order (imu_ held).
  std::set<Index::OKey, Index::OOrder>::const_iterator start_of(const std::optional<Cursor> &cursor) const;

  // The cursor of a page whose last record is (time_us, id).
  static std::string encode_cursor(int64_t time_us, const std::string &id);

  // Decodes a cursor of encode_cursor; TNX_EINVAL when it is not one.
  static Cursor decode_cursor(std::string_view c);

  // Save input check: the JSON must be a Task whose index fields are the
  // record's (what we write must read back as what was saved).
  void validate(const tnx_task_record &rec, const std::string &id, std::string_view json) const;

  const bool ro_;
  int lock_fd_ = -1;   // .tnx-lock (read-only: O_RDONLY, may be -1)
  int index_fd_ = -1;  // .tnx-index being followed (-1: an in-memory snapshot)
  int my_slot_ = -1;   // process slot held in .tnx-lock (read-write)
  uint64_t offset_ = 0;  // bytes of .tnx-index applied; guarded by imu_
  mutable std::shared_mutex imu_;  // guards index_, offset_, index_fd_ reopening
  std::unique_ptr<Index> index_ = std::make_unique<Index>();
  bool indexed_before_ = false;  // .tnx-lock was there at open: a toolnexus store had opened <dir>
  std::mutex append_mu_;  // this process's holder of the index lock
  std::unique_ptr<std::mutex[]> slots_;  // per id slot, with the OFD id locks
};

}  // namespace toolnexus::file_plugin

#endif  // TOOLNEXUS_FILE_FILE_STORE_HPP

// plugins/file/store_index.cpp: FileStore's side of the index (see
// file_store.hpp): open and close (process slots, open/close records,
// trusting or rebuilding the index, cleaning up), loading and following
// .tnx-index, appends, compaction, rebuild from the directory, and making
// an entry agree with its Task file.
#include "file_store.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <unordered_map>
#include <vector>

namespace toolnexus::file_plugin {

void FileStore::open_index() {
  if (ro_) {
    lock_fd_ = open_own(kLockName, O_RDONLY);
    indexed_before_ = lock_fd_ >= 0;
    std::optional<IndexLock> il;
    if (lock_fd_ >= 0) il.emplace(lock_fd_, path(kLockName), F_RDLCK);
    const Stamp now = dir_stamp();
    const int others = lock_fd_ >= 0 ? live_slots() : 0;
    std::unique_lock<std::shared_mutex> l(imu_);
    const bool loaded = lock_fd_ >= 0 && load_file_locked();
    if (!(loaded && trusted(now, others))) {
      if (index_fd_ >= 0) ::close(index_fd_);
      index_fd_ = -1;  // a snapshot of the directory, not followed
      rebuild_locked(loaded, nullptr);
    }
    return;
  }
  struct stat lst;
  indexed_before_ = ::fstatat(dir_.get(), kLockName, &lst, AT_SYMLINK_NOFOLLOW) == 0;
  lock_fd_ = open_own(kLockName, O_RDWR | O_CREAT, 0666);
  if (lock_fd_ < 0)
    throw Error(TNX_EIO, "file: cannot create task files in '" + path_ + "' (its lock file '" + path(kLockName) +
                             "'): " + errtext(errno));
  std::lock_guard<std::mutex> am(append_mu_);
  IndexLock il(lock_fd_, path(kLockName));
  const Stamp before = dir_stamp();
  const int others = live_slots();
  for (int k = 0; k < kProcessSlots && my_slot_ < 0; ++k)
    if (ofd_lock(lock_fd_, F_WRLCK, kProcessSlotBase + k, false, path(kLockName))) my_slot_ = k;
  if (my_slot_ < 0)
    throw Error(TNX_EIO, "file: '" + path_ + "' is open in " + std::to_string(kProcessSlots) +
                             " processes already; no slot left in '" + path(kLockName) + "'");
  {
    std::unique_lock<std::shared_mutex> l(imu_);
    const bool loaded = load_file_locked();
    if (!(loaded && trusted(before, others))) {
      rebuild_locked(loaded, nullptr);
      compact_locked(others);
    }
  }
  if (others == 0) recover();  // nobody else is writing here: leftovers are a crash's
  std::string rec;
  RecWriter(kRecOpen).u64(static_cast<uint64_t>(::getpid())).frame_into(rec);
  catch_up_locked();
  append_raw_locked(rec);
}

void FileStore::recover() {
  std::vector<std::string> names = scan();
  std::vector<std::string> jsons;
  for (const auto &n : names)
    if (ends_with(n, kJsonExt)) jsons.push_back(n);
  std::sort(jsons.begin(), jsons.end());
  bool removed = false;
  for (const auto &n : names) {
    bool remove = is_temp_name(n) || n == kIndexNewName;
    if (!remove && ends_with(n, kMetaExt) && n[0] != '.') {
      const std::string stem = n.substr(0, n.size() - kMetaExt.size());
      remove = classify(stem).has_value() &&
               !std::binary_search(jsons.begin(), jsons.end(), stem + std::string(kJsonExt));
    }
    if (!remove) continue;
    if (::unlinkat(dir_.get(), n.c_str(), 0) != 0 && errno != ENOENT)
      throw Error(TNX_EIO, "cannot remove leftover '" + path(n) + "': " + errtext(errno));
    removed = true;
  }
  if (removed) durable(path_);
}

void FileStore::close() {
  stop_feed();
  if (ro_ || lock_fd_ < 0 || my_slot_ < 0) return;
  std::lock_guard<std::mutex> am(append_mu_);
  IndexLock il(lock_fd_, path(kLockName));
  catch_up_locked();
  bool others = false;
  for (int k = 0; k < kProcessSlots && !others; ++k) others = k != my_slot_ && ofd_held(lock_fd_, kProcessSlotBase + k);
  {
    std::unique_lock<std::shared_mutex> l(imu_);
    if (!others && big_locked()) compact_locked(index_->live);
  }
  const Stamp s = dir_stamp();
  std::string rec;
  RecWriter(kRecClose).i64(s.mtime_ns).i64(s.ctime_ns).u64(s.ino).u8(others ? 0 : 1).frame_into(rec);
  append_raw_locked(rec);
  ofd_lock(lock_fd_, F_UNLCK, kProcessSlotBase + my_slot_, true, path(kLockName));
  my_slot_ = -1;
}

int FileStore::live_slots() const {
  int n = 0;
  for (int k = 0; k < kProcessSlots; ++k)
    if (k != my_slot_ && ofd_held(lock_fd_, kProcessSlotBase + k)) ++n;
  return n;
}

bool FileStore::trusted(const Stamp &now, int others) const {
  if (!index_->header_ok) return false;
  if (others > 0) return index_->live == others;
  return index_->live == 0 && index_->last_is_close && index_->last_close_was_last && index_->last_stamp == now;
}

bool FileStore::load_file_locked() {
  if (index_fd_ >= 0) ::close(index_fd_);
  index_fd_ = open_own(kIndexName, ro_ ? O_RDONLY : O_RDWR | O_APPEND);
  index_ = std::make_unique<Index>();
  offset_ = 0;
  if (index_fd_ < 0) {
    if (errno == ENOENT) return false;
    throw Error(TNX_EIO, "cannot open '" + path(kIndexName) + "': " + errtext(errno));
  }
  struct stat st;
  if (::fstat(index_fd_, &st) != 0) throw Error(TNX_EIO, "cannot stat '" + path(kIndexName) + "': " + errtext(errno));
  // A sparse bucket array: most inserts of a new key find an empty bucket
  // and touch no other entry (each such touch is a cache miss).
  index_->entries.max_load_factor(0.5f);
  index_->entries.reserve(static_cast<size_t>(st.st_size) / 96);
  read_new_locked(static_cast<uint64_t>(st.st_size));
  return index_->header_ok;
}

void FileStore::read_new_locked(uint64_t size) {
  // After a move the whole new file is read in bulk (no record reported):
  // the gap is said once it is read, so what another process appends
  // after that (to a size this read did not reach) is reported record by
  // record, never lost between the gap and the host's re-read.
  bool reloaded = false;
  struct Gap {
    FileStore *store;
    bool &reloaded;
    ~Gap() {
      if (reloaded && store->feed_.running()) store->feed_.gap();
    }
  } gap{this, reloaded};
  for (int moves = 0; moves < 8; ++moves) {
    if (size <= offset_) return;
    index_->bulk = offset_ == 0;  // the whole file: see Index::bulk
    // Read in pieces of 256 KiB (grown only for a larger record): a whole
    // 6 MB index in one buffer cost more in page faults than parsing it.
    constexpr size_t kPiece = 256 * 1024;
    std::string data;
    size_t off = 0;         // parsed bytes of `data`
    uint64_t read_to = offset_;  // file offset just past `data`
    bool moved = false, stop = false, eof = false;
    while (!stop) {
      // Keep the unparsed tail, then fetch enough for the next record.
      data.erase(0, off);
      off = 0;
      const size_t want = std::max(kPiece, record_extent(data, 0));
      if (!eof && data.size() < want && read_to < size) {
        const size_t keep = data.size();
        const size_t ask = static_cast<size_t>(std::min<uint64_t>(want - keep, size - read_to));
        data.resize(keep + ask);
        size_t got = 0;
        while (got < ask) {
          const ssize_t n = ::pread(index_fd_, &data[keep + got], ask - got, static_cast<off_t>(read_to + got));
          if (n < 0) {
            if (errno == EINTR) continue;
            throw Error(TNX_EIO, "cannot read '" + path(kIndexName) + "': " + errtext(errno));
          }
          if (n == 0) {
            eof = true;
            break;
          }
          got += static_cast<size_t>(n);
        }
        data.resize(keep + got);
        read_to += got;
      }
      const bool last_piece = eof || read_to >= size;
      for (;;) {
        uint8_t type = 0;
        std::string_view payload;
        const size_t n = next_record(data, off, type, payload);
        if (n == 0) {
          // Incomplete here: fetch more, unless this is all there is (a
          // torn or damaged tail, or a record still being appended).
          if (last_piece || record_extent(data, off) > (size_t{1} << 28) + 8 ||
              (record_extent(data, off) != 0 && data.size() - off >= record_extent(data, off)))
            stop = true;
          break;
        }
        if (type == kRecMoved) {
          moved = true;
          stop = true;
          break;
        }
        if (!index_->apply(type, payload)) {
          stop = true;
          break;
        }
        off += n;
        offset_ += n;
      }
      if (!stop && last_piece) stop = true;
    }
    if (index_->bulk) index_->end_bulk();
    if (!moved) return;
    // A compacted index replaced this file: read it from the start.
    ::close(index_fd_);
    index_fd_ = open_own(kIndexName, ro_ ? O_RDONLY : O_RDWR | O_APPEND);
    if (index_fd_ < 0) throw Error(TNX_EIO, "cannot open '" + path(kIndexName) + "': " + errtext(errno));
    index_ = std::make_unique<Index>();
    offset_ = 0;
    if (feed_.running()) hook_index_locked();
    reloaded = true;
    struct stat st;
    if (::fstat(index_fd_, &st) != 0) throw Error(TNX_EIO, "cannot stat '" + path(kIndexName) + "': " + errtext(errno));
    size = static_cast<uint64_t>(st.st_size);
  }
}

void FileStore::catch_up() {
  if (index_fd_ < 0) return;
  struct stat st;
  if (::fstat(index_fd_, &st) != 0) throw Error(TNX_EIO, "cannot stat '" + path(kIndexName) + "': " + errtext(errno));
  {
    std::shared_lock<std::shared_mutex> l(imu_);
    if (static_cast<uint64_t>(st.st_size) == offset_) return;
  }
  std::unique_lock<std::shared_mutex> l(imu_);
  read_new_locked(static_cast<uint64_t>(st.st_size));
}

void FileStore::catch_up_locked() {
  catch_up();
  struct stat st;
  if (::fstat(index_fd_, &st) != 0) throw Error(TNX_EIO, "cannot stat '" + path(kIndexName) + "': " + errtext(errno));
  std::unique_lock<std::shared_mutex> l(imu_);
  if (static_cast<uint64_t>(st.st_size) > offset_ && ::ftruncate(index_fd_, static_cast<off_t>(offset_)) != 0)
    throw Error(TNX_EIO, "cannot repair '" + path(kIndexName) + "': " + errtext(errno));
}

void FileStore::append_raw_locked(const std::string &records) {
  std::unique_lock<std::shared_mutex> l(imu_);
  write_all_fd(index_fd_, records, path(kIndexName));
  for (size_t off = 0; off < records.size();) {
    uint8_t type = 0;
    std::string_view payload;
    const size_t n = next_record(records, off, type, payload);
    if (n == 0 || !index_->apply(type, payload))
      throw Error(TNX_EINTERNAL, "an index record written to '" + path(kIndexName) + "' does not apply");
    off += n;
    offset_ += n;
  }
  if (big_locked()) compact_locked(index_->live);
}

uint64_t FileStore::index_put(const std::string &key, IEntry e) {
  std::lock_guard<std::mutex> am(append_mu_);
  IndexLock il(lock_fd_, path(kLockName));
  catch_up_locked();
  std::string rec;
  {
    std::unique_lock<std::shared_mutex> l(imu_);
    e.version = index_->next_version(key);
    Index::task_record(rec, key, e.view());
  }
  append_raw_locked(rec);
  return e.version;
}

void FileStore::index_del(const std::string &key) {
  std::lock_guard<std::mutex> am(append_mu_);
  IndexLock il(lock_fd_, path(kLockName));
  catch_up_locked();
  uint64_t last = 0;
  if (std::optional<IEntry> e = entry_of(key)) last = e->version;
  std::string rec;
  RecWriter(kRecDel).str(key).u64(last).frame_into(rec);
  append_raw_locked(rec);
}

bool FileStore::big_locked() const {
  if (index_fd_ < 0) return false;
  const uint64_t live_bytes = index_->live_bytes + 4096;  // + header, epoch and reset records
  return offset_ > (8u << 20) && offset_ > 4 * live_bytes;
}

void FileStore::compact_locked(int64_t live) {
  std::string data;
  RecWriter(kRecHeader).str(kIndexMagic).u64(kIndexFormat).frame_into(data);
  RecWriter(kRecEpoch).u64(index_->epoch).frame_into(data);
  RecWriter(kRecReset).i64(live).frame_into(data);
  // In list order: the next load allocates the entries in that order, so
  // a listing walks memory forwards (in hash order, `store list` of
  // 50,000 Tasks spent a quarter of its time on cache misses).
  for (const Index::OKey &k : index_->order) Index::task_record(data, k.node->first, k.node->second.view());
  for (const auto &[key, v] : index_->tombs) RecWriter(kRecDel).str(key).u64(v).frame_into(data);
  // A fresh file, never one found there: whatever has the name (a
  // crash's leftover, or a symlink someone put there to have the store
  // overwrite a file elsewhere) is removed, and O_EXCL | O_NOFOLLOW
  // refuse anything that appears meanwhile.
  if (::unlinkat(dir_.get(), kIndexNewName, 0) != 0 && errno != ENOENT)
    throw Error(TNX_EIO, "cannot remove '" + path(kIndexNewName) + "': " + errtext(errno));
  Fd fd(::openat(dir_.get(), kIndexNewName, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666));
  if (fd.get() < 0) throw Error(TNX_EIO, "cannot create '" + path(kIndexNewName) + "': " + errtext(errno));
  write_all_fd(fd.get(), data, path(kIndexNewName));
  while (::fdatasync(fd.get()) != 0)
    if (errno != EINTR) throw Error(TNX_EIO, "cannot sync '" + path(kIndexNewName) + "': " + errtext(errno));
  fd.reset();
  if (::renameat(dir_.get(), kIndexNewName, dir_.get(), kIndexName) != 0)
    throw Error(TNX_EIO, "cannot rename '" + path(kIndexNewName) + "': " + errtext(errno));
  durable(path(kIndexName));
  if (index_fd_ >= 0) {
    std::string moved;
    RecWriter(kRecMoved).frame_into(moved);
    (void)::write(index_fd_, moved.data(), moved.size());  // best effort: followers also check the name
    ::close(index_fd_);
  }
  index_fd_ = open_own(kIndexName, O_RDWR | O_APPEND);
  if (index_fd_ < 0) throw Error(TNX_EIO, "cannot open '" + path(kIndexName) + "': " + errtext(errno));
  offset_ = data.size();
  index_->live = live;
  index_->header_ok = true;
}

void FileStore::rebuild_locked(bool loaded, std::string *) {
  // An index that is there but cannot be trusted may have lost records
  // of versions handed out (a crash): a new epoch puts every version
  // given from now on above all of them. A directory never indexed (the
  // seed's) starts at epoch 0, version 1.
  //
  // A missing or unreadable index (no header) in a directory a toolnexus
  // store opened before (.tnx-lock was there) lost its versions with it:
  // starting again at epoch 0 gave version 1 back to Tasks saved many
  // times, and a client's stale --expect-version 1 then overwrote a newer
  // save (found by a fresh-user pass). Epochs are therefore never below
  // the seconds since 2000-01-01 at the rebuild: above every epoch an
  // earlier rebuild can have used, while the clock does not go back.
  const uint64_t clock = clock_epoch();
  if (!loaded) {
    index_ = std::make_unique<Index>();
    if (indexed_before_) index_->epoch = clock;
  } else {
    index_->epoch = std::max(index_->epoch + 1, clock);
  }
  index_->header_ok = true;
  std::unordered_map<std::string, bool> seen;
  std::vector<std::string> names = scan();
  std::sort(names.begin(), names.end());
  for (const auto &name : names) {
    if (name[0] == '.' || !ends_with(name, kJsonExt)) continue;
    const std::string stem = name.substr(0, name.size() - kJsonExt.size());
    std::optional<StemInfo> info = classify(stem);
    if (!info) continue;
    struct stat st;
    if (::fstatat(dir_.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (info->kind != StemKind::hashed) {
      const Index::Slot *have = index_->find(info->id);
      if (have != nullptr && have->file == FileId::of(st) && S_ISREG(st.st_mode)) {
        seen[info->id] = true;
        continue;
      }
    }
    std::string key;
    IEntry e = read_entry(name, info, key);
    e.version = index_->next_version(key);
    seen[key] = true;
    index_->put(key, e.view());
  }
  std::vector<std::string> gone;
  for (const auto &kv : index_->entries)
    if (seen.find(std::string(kv.first)) == seen.end()) gone.emplace_back(kv.first);
  for (const auto &k : gone) index_->remove(k);
  index_reloaded_locked();  // changes made here, not by applied records
}

IEntry FileStore::read_entry(const std::string &name, const std::optional<StemInfo> &info,
                             std::string &key) {
  const std::string stem = name.substr(0, name.size() - kJsonExt.size());
  IEntry e;
  try {
    std::optional<Loaded> l = load(stem);
    if (!l) throw Error(TNX_EIO, "'" + path(name) + "' disappeared");
    if (info->kind != StemKind::hashed && l->fields.id != info->id)
      throw Error(TNX_ECORRUPT, "'" + path(name) + "' holds task id " + quote(l->fields.id) + ", not " +
                                    quote(info->id) + " as its name says");
    if (info->kind == StemKind::hashed && stem_for(l->fields.id) != stem)
      throw Error(TNX_ECORRUPT, "'" + path(name) + "' holds task id " + quote(l->fields.id) +
                                    ", which is not stored under this name");
    key = l->fields.id;
    e.context_id = l->fields.context_id;
    e.state = l->fields.state;
    e.owner = l->owner;
    e.tenant = l->tenant;
    e.time_us = l->fields.time_us;
    e.file = l->file;
  } catch (const Error &err) {
    const bool this_file = err.code == TNX_ECORRUPT || dynamic_cast<const UnreadableFile *>(&err) != nullptr;
    if (!this_file) throw;
    key = info->kind != StemKind::hashed ? info->id : std::string(1, '\0') + name;
    e = IEntry();
    e.corrupt = true;
    e.unreadable = err.code != TNX_ECORRUPT;
    e.problem = err.message;
    struct stat st;
    if (::fstatat(dir_.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) e.file = FileId::of(st);
  }
  return e;
}

FileStore::Current FileStore::current(const std::string &id, const std::string &stem) {
  const std::string jname = stem + std::string(kJsonExt);
  struct stat st;
  bool on_disk = true;
  if (::fstatat(dir_.get(), jname.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno != ENOENT) throw Error(TNX_EIO, "cannot stat '" + path(jname) + "': " + errtext(errno));
    on_disk = false;
  }
  std::optional<IEntry> e = entry_of(id);
  if (!on_disk && !e) return Current{};
  if (on_disk && e && e->file == FileId::of(st)) return Current{true, e->version, e->file};
  if (!on_disk) {
    index_del(id);
    return Current{};
  }
  std::optional<StemInfo> info = classify(stem);
  if (!info) info = StemInfo{StemKind::plain, id};
  std::string key;
  IEntry fresh = read_entry(jname, info, key);
  if (key != id) key = id;  // the file of this id's name, whatever it holds
  const FileId file = fresh.file;
  const uint64_t v = index_put(key, std::move(fresh));
  return Current{true, v, file};
}

void FileStore::reindex(const std::string &key) {
  if (Index::named(key)) return;
  const std::string stem = stem_for(key);
  if (ro_) {
    std::optional<StemInfo> info = classify(stem);
    if (!info) info = StemInfo{StemKind::plain, key};
    struct stat st;
    std::unique_lock<std::shared_mutex> l(imu_);
    if (::fstatat(dir_.get(), (stem + std::string(kJsonExt)).c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      index_->remove(key);
      return;
    }
    std::string k;
    IEntry e = read_entry(stem + std::string(kJsonExt), info, k);
    e.version = index_->next_version(key);
    index_->put(key, e.view());
    return;
  }
  SlotGuard g(slots_.get(), lock_fd_, path(kLockName), key);
  catch_up();
  (void)current(key, stem);
}

std::optional<IEntry> FileStore::entry_of(const std::string &key) const {
  std::shared_lock<std::shared_mutex> l(imu_);
  const Index::Slot *s = index_->find(key);
  if (s == nullptr) return std::nullopt;
  return IEntry::of(s->view());
}

}  // namespace toolnexus::file_plugin

// plugins/file/index.cpp: the in-memory index (see index.hpp): its memory
// resource, updates in list order with counters, and the application of
// .tnx-index records.
#include "index.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <new>
#include <vector>

namespace toolnexus::file_plugin {

void *IndexMemory::do_allocate(size_t bytes, size_t align) {
  if (bytes < kBig || align > kHuge) return ::operator new(bytes, std::align_val_t(align));
  const size_t len = mapped_size(bytes);
  void *p = ::mmap(nullptr, len + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  const auto raw = reinterpret_cast<uintptr_t>(p);
  const uintptr_t at = (raw + kHuge - 1) & ~uintptr_t(kHuge - 1);
  if (at != raw) ::munmap(p, at - raw);
  if (at + len != raw + len + kHuge) ::munmap(reinterpret_cast<void *>(at + len), raw + kHuge - at);
#ifdef MADV_HUGEPAGE
  (void)::madvise(reinterpret_cast<void *>(at), len, MADV_HUGEPAGE);  // advice only
#endif
  return reinterpret_cast<void *>(at);
}

void IndexMemory::do_deallocate(void *p, size_t bytes, size_t align) {
  if (bytes < kBig || align > kHuge) return ::operator delete(p, bytes, std::align_val_t(align));
  ::munmap(p, mapped_size(bytes));
}

void Index::end_bulk() {
  bulk = false;
  std::pmr::vector<OKey> keys(&pool_);
  keys.reserve(entries.size());
  for (const Node &n : entries) keys.push_back(okey(n, n.second.time_us));
  std::sort(keys.begin(), keys.end(), OOrder());
  for (const OKey &k : keys) order.emplace_hint(order.end(), k);
}

void Index::build_counts() {
  if (counts_ready) return;
  counts.clear();
  for (const Node &n : entries)
    if (!n.second.corrupt) count(n.second, +1);
  counts_ready = true;
}

void Index::erase(std::string_view key) {
  auto it = entries.find(key);
  if (it == entries.end()) return;
  if (!bulk) {
    order.erase(okey(*it, it->second.time_us));
    if (counts_ready && !it->second.corrupt) count(it->second, -1);
  }
  char *old = it->second.text;
  const size_t old_size = it->second.text_size();
  if (it->second.due_us != TNX_TIME_NONE) due.erase({it->second.due_us, std::string(key)});
  live_bytes -= record_bytes(it->second);
  entries.erase(it);
  free_text(old, old_size);
}

void Index::put(std::string_view key, const EntryView &e) {
  const size_t size = key.size() + e.context_id.size() + e.state.size() + e.owner.size() + e.tenant.size() +
                      e.problem.size();
  char *text = size == 0 ? nullptr : static_cast<char *>(pool_.allocate(size, 1));
  Slot s;
  s.time_us = e.time_us;
  s.due_us = e.due_us;
  s.version = e.version;
  s.file = e.file;
  s.text = text;
  s.corrupt = e.corrupt;
  s.unreadable = e.unreadable;
  size_t off = 0;
  int i = 0;
  for (std::string_view f : {key, e.context_id, e.state, e.owner, e.tenant, e.problem}) {
    if (!f.empty()) std::memcpy(text + off, f.data(), f.size());
    s.len[i++] = static_cast<uint32_t>(f.size());
    off += f.size();
  }
  const std::string_view k(text, key.size());
  auto [it, fresh] = entries.try_emplace(k, s);
  if (!fresh) {
    if (!bulk) {
      order.erase(okey(*it, it->second.time_us));
      if (counts_ready && !it->second.corrupt) count(it->second, -1);
    }
    live_bytes -= record_bytes(it->second);
    if (it->second.due_us != TNX_TIME_NONE) due.erase({it->second.due_us, std::string(key)});
    // The node's key views the old text: give it the new one.
    auto nh = entries.extract(it);
    free_text(nh.mapped().text, nh.mapped().text_size());
    nh.key() = k;
    nh.mapped() = s;
    it = entries.insert(std::move(nh)).position;
  } else if (!tombs.empty()) {
    untomb(key);
  }
  live_bytes += record_bytes(s);
  if (s.due_us != TNX_TIME_NONE) due.emplace(s.due_us, std::string(key));
  if (!bulk) {
    order.insert(okey(*it, s.time_us));
    if (counts_ready && !s.corrupt) count(s, +1);
  }
}

uint64_t Index::next_version(std::string_view key) const {
  uint64_t base = epoch << 32;
  if (const Slot *s = find(key); s != nullptr && s->version > base) base = s->version;
  if (!tombs.empty()) {
    auto t = tombs.find(std::string(key));
    if (t != tombs.end() && t->second > base) base = t->second;
  }
  return base + 1;
}

void Index::remove(std::string_view key) {
  const Slot *s = find(key);
  if (s == nullptr) return;
  tomb(key, s->version);
  erase(key);
}

bool Index::apply(uint8_t type, std::string_view payload) {
  RecReader r(payload);
  last_is_close = false;
  switch (type) {
    case kRecHeader: {
      const std::string magic = r.str();
      const uint64_t format = r.u64();
      header_ok = r.ok() && magic == kIndexMagic && format == kIndexFormat;
      return r.ok();
    }
    case kRecTask: {
      const std::string_view key = r.view();
      EntryView e;
      e.context_id = r.view();
      e.state = r.view();
      e.owner = r.view();
      e.tenant = r.view();
      e.time_us = r.i64();
      e.version = r.u64();
      e.file.ino = r.u64();
      e.file.size = r.u64();
      e.file.mtime_ns = r.i64();
      const uint8_t flags = r.u8();
      e.corrupt = (flags & 1) != 0;
      e.unreadable = (flags & 2) != 0;
      e.problem = r.view();
      // Since ABI 1.5 the due time follows; older records end before it
      // (and older readers stop before it).
      e.due_us = r.left() >= 8 ? r.i64() : TNX_TIME_NONE;
      if (!r.ok() || key.empty()) return false;
      if (e.corrupt) e.time_us = TNX_TIME_NONE;
      put(key, e);
      if (!bulk && on_change && !named(key)) on_change(key, e.version, false);
      return true;
    }
    case kRecDel: {
      const std::string key = r.str();
      const uint64_t v = r.u64();
      if (!r.ok()) return false;
      remove(key);
      tomb(key, v);
      if (!bulk && on_change && !named(key)) on_change(key, v, true);
      return true;
    }
    case kRecEpoch: {
      const uint64_t v = r.u64();
      if (v > epoch) epoch = v;
      return r.ok();
    }
    case kRecOpen:
      (void)r.u64();
      ++live;
      return r.ok();
    case kRecClose:
      last_stamp.mtime_ns = r.i64();
      last_stamp.ctime_ns = r.i64();
      last_stamp.ino = r.u64();
      last_close_was_last = r.u8() != 0;
      --live;
      last_is_close = true;
      return r.ok();
    case kRecReset:
      live = r.i64();
      return r.ok();
    default:
      return true;  // kRecMoved (handled by the reader) and unknown types
  }
}

void Index::task_record(std::string &out, std::string_view key, const EntryView &e) {
  RecWriter(kRecTask)
      .str(key)
      .str(e.context_id)
      .str(e.state)
      .str(e.owner)
      .str(e.tenant)
      .i64(e.time_us)
      .u64(e.version)
      .u64(e.file.ino)
      .u64(e.file.size)
      .i64(e.file.mtime_ns)
      .u8(static_cast<uint8_t>((e.corrupt ? 1 : 0) | (e.unreadable ? 2 : 0)))
      .str(e.problem)
      .i64(e.due_us)
      .frame_into(out);
}

}  // namespace toolnexus::file_plugin

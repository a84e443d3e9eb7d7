// plugins/file/store_ops.cpp: FileStore's Store methods (see
// file_store.hpp): get, save, del, list and count, and list cursors.
#include "file_store.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <memory>
#include <vector>

namespace toolnexus::file_plugin {
namespace {

constexpr size_t kMaxCursor = 1024;
// Id bytes kept in a cursor for ids too long for the plain ListKey form.
constexpr size_t kCursorIdPrefix = 460;

}  // namespace

bool FileStore::get(std::string_view idv, const toolnexus::sdk::RecordOut &out) {
  const std::string id(idv);
  const std::string stem = stem_for(id);
  catch_up();
  for (int attempt = 0; attempt < 8; ++attempt) {
    std::optional<IEntry> e = entry_of(id);
    std::optional<Loaded> l = load(stem);
    if (!l && !e) return false;
    if (l && l->fields.id != id)
      throw Error(TNX_ECORRUPT, "'" + path(stem + std::string(kJsonExt)) + "' holds task id " +
                                    quote(l->fields.id) + ", not " + quote(id));
    // The bytes read belong to the version the index names: never old
    // bytes with a newer version.
    if (l && e && !e->corrupt && e->file == l->file) {
      tnx_task_record r = record(*l, e->version, false);
      r.due_us = e->due_us;
      out(r);
      return true;
    }
    if (ro_) {  // changed behind the index: a version this store has not seen
      if (!l) return false;
      out(record(*l, e ? e->version + 1 : 1, false));
      return true;
    }
    SlotGuard g(slots_.get(), lock_fd_, path(kLockName), id);
    catch_up();
    (void)current(id, stem);
  }
  throw Error(TNX_EIO, "'" + path(stem + std::string(kJsonExt)) + "' kept changing while being read");
}

uint64_t FileStore::save(const tnx_task_record &rec, uint64_t expected) {
  const std::string id(view(rec.id));
  validate(rec, id, view(rec.task_json));
  return save_valid(rec, id, expected, nullptr);
}

uint64_t FileStore::save_valid(const tnx_task_record &rec, const std::string &id, uint64_t expected,
                               const Staged *staged) {
  const std::string_view json = view(rec.task_json);
  const std::string stem = stem_for(id);
  const std::string jname = stem + std::string(kJsonExt), mname = stem + std::string(kMetaExt);
  const std::string owner(view(rec.owner)), tenant(view(rec.tenant));

  SlotGuard g(slots_.get(), lock_fd_, path(kLockName), id);
  catch_up();
  const Current cur = current(id, stem);
  const uint64_t cur_version = cur.present ? cur.version : 0;
  if (expected != TNX_VERSION_ANY && expected != cur_version)
    throw Error(TNX_ECONFLICT, "save of task " + quote(id) + ": expected version " +
                                   std::to_string(expected) + ", stored " + std::to_string(cur_version));

  // What the sidecar says now. A sidecar we cannot read is replaced.
  std::optional<std::string> meta_bytes;
  try {
    meta_bytes = read_file(mname);
  } catch (const Error &e) {
    if (e.code != TNX_ECORRUPT) throw;
    meta_bytes = std::string();  // present but unusable
  }
  Meta meta;
  const bool meta_ok = meta_bytes && parse_meta(*meta_bytes, meta).empty();
  const bool want_meta = !owner.empty() || !tenant.empty();
  const bool fast = (!meta_bytes && !want_meta) ||
                    (cur.present && meta_ok && !meta.has_prev && meta.owner == owner && meta.tenant == tenant);
  bool committed = false;
  FileId file = cur.file;
  IEntry e;
  e.context_id.assign(view(rec.context_id));
  e.state.assign(view(rec.state));
  e.owner = owner;
  e.tenant = tenant;
  e.time_us = rec.status_time_us;
  e.due_us = toolnexus::sdk::due_of(rec);
  uint64_t version = 0;
  try {
    if (fast && staged != nullptr) {
      file = put_staged(*staged, jname, id);
      committed = true;
    } else if (fast) {
      file = replace(jname, json, id);
      committed = true;
    } else {
      if (staged != nullptr) ::unlinkat(dir_.get(), staged->tmp.c_str(), 0);  // the slow path writes its own
      save_with_meta(id, jname, mname, json, cur.present, meta_bytes.has_value(), meta_ok, meta, owner, tenant,
                     committed, file);
    }
    e.file = file;
    version = index_put(id, std::move(e));
    if (staged == nullptr) durable(path(jname));  // a stream syncs <dir> once per group
  } catch (...) {
    if (committed && version == 0) {
      // The file is in place but the index was not told: the next reader
      // sees a file that changed behind the index and re-reads it.
    }
    throw;
  }
  return version;
}

void FileStore::del(std::string_view idv, uint64_t expected) {
  const std::string id(idv);
  const std::string stem = stem_for(id);
  const std::string jname = stem + std::string(kJsonExt), mname = stem + std::string(kMetaExt);
  SlotGuard g(slots_.get(), lock_fd_, path(kLockName), id);
  catch_up();
  const Current cur = current(id, stem);
  if (!cur.present) throw Error(TNX_ENOTFOUND, "no task with id " + quote(id));
  if (expected != TNX_VERSION_ANY && expected != cur.version)
    throw Error(TNX_ECONFLICT, "delete of task " + quote(id) + ": expected version " +
                                   std::to_string(expected) + ", stored " + std::to_string(cur.version));
  if (::unlinkat(dir_.get(), jname.c_str(), 0) != 0) {
    const int e = errno;
    if (e == ENOENT) throw Error(TNX_ENOTFOUND, "no task with id " + quote(id));
    throw Error(TNX_EIO, "cannot delete '" + path(jname) + "': " + errtext(e));
  }
  // The Task is gone; a sidecar left behind (unlink failure, crash) is an
  // orphan that saves overwrite and the next lone open removes.
  ::unlinkat(dir_.get(), mname.c_str(), 0);
  index_del(id);
  durable(path(jname));
}

std::string FileStore::list(const tnx_list_query &q, const toolnexus::sdk::RecordOut &out) {
  const size_t limit = toolnexus::sdk::page_size(q);
  // A due list (ABI 1.5) walks Index::due in (due time, key) order from a
  // sdk::DueKey cursor; every other list the index order from a Cursor.
  const bool due_list = (q.filter_flags & TNX_FILTER_DUE_BEFORE) != 0;
  std::optional<Cursor> cursor;
  std::optional<DueKey> due_from;
  if (q.cursor.len != 0) {
    if (due_list) due_from = DueKey::decode(view(q.cursor));
    else cursor = decode_cursor(view(q.cursor));
  }
  // The cursor of a page whose last record is at this place.
  auto cursor_at = [&](int64_t time_us, int64_t due_us, const std::string &key) {
    return due_list ? DueKey{due_us, key}.encode() : encode_cursor(time_us, key);
  };
  const bool omit = q.omit_json != 0;
  const bool deliver_corrupt = TNX_HAS_FIELD(&q, tnx_list_query, deliver_corrupt) && q.deliver_corrupt != 0;
  catch_up();
  for (int attempt = 0;; ++attempt) {
    // The page from the index: up to `limit` matches, and whether one more
    // exists (a next page). With omit_json every entry is delivered from
    // the index alone, in list order, at once, under the index lock: no
    // copy of its fields is made (the sink copies what it keeps;
    // task_store.h says a sink must not call back into the store). Such
    // a page never goes round again (no file is read, so nothing is
    // stale), so nothing is delivered twice.
    std::vector<Cand> cands;
    bool more = false;
    size_t delivered = 0;
    int64_t last_time = 0, last_due = TNX_TIME_NONE;
    std::string last_id;
    {
      std::shared_lock<std::shared_mutex> l(imu_);
      size_t found = 0;
      std::optional<Index::OKey> last;
      auto order_it = due_list ? index_->order.end() : start_of(cursor);
      auto due_it = !due_list ? index_->due.end()
                    : due_from ? index_->due.upper_bound(std::make_pair(due_from->due_us, due_from->id))
                               : index_->due.begin();
      Index::OKey due_key{};
      for (;;) {
        const Index::OKey *it = nullptr;
        if (due_list) {
          if (due_it == index_->due.end() || !(due_it->first < q.due_before_us)) break;
          auto node = index_->entries.find(std::string_view(due_it->second));
          ++due_it;
          if (node == index_->entries.end()) continue;
          due_key = Index::okey(*node, node->second.time_us);
          it = &due_key;
        } else {
          if (order_it == index_->order.end()) break;
          it = &*order_it++;
        }
        const EntryView e = it->node->second.view();
        if (!e.corrupt && !toolnexus::sdk::matches(q, e.context_id, e.state, e.owner, e.tenant, e.time_us, e.due_us))
          continue;
        if (found == limit) {
          more = true;
          break;
        }
        ++found;
        if (omit) {
          tnx_task_record r = empty_record();
          r.id = toolnexus::sdk::str(it->id);
          if (e.corrupt) {
            // Corrupt entries share the "no time" end of the order with
            // sound Tasks that have no timestamp: delivered in their place.
            if (!deliver_corrupt) throw Error(e.unreadable ? TNX_EIO : TNX_ECORRUPT, std::string(e.problem));
            r.status_time_us = TNX_TIME_NONE;
            r.problem = toolnexus::sdk::str(e.problem);
          } else {
            r.context_id = toolnexus::sdk::str(e.context_id);
            r.state = toolnexus::sdk::str(e.state);
            r.status_time_us = e.time_us;
            r.owner = toolnexus::sdk::str(e.owner);
            r.tenant = toolnexus::sdk::str(e.tenant);
            r.version = e.version;
          }
          r.due_us = e.due_us;
          if (!out(r)) return std::string();
          ++delivered;
          last = *it;
        } else {
          cands.push_back(Cand{std::string(it->node->first), std::string(it->id), IEntry::of(e)});
        }
      }
      if (last) {
        // The key, not the id shown (a named key's file name): what the
        // due index and the order are keyed by.
        last_time = last->time;
        last_due = last->node->second.due_us;
        last_id.assign(due_list ? std::string_view(last->node->first) : last->id);
      }
    }
    // Read what is delivered (only without omit_json, so nothing was
    // delivered above); a file that changed behind the index is
    // re-indexed and the page made again.
    std::vector<Item> items;
    std::vector<std::string> stale;
    for (Cand &c : cands) {
      if (c.e.corrupt) {
        if (!deliver_corrupt) throw Error(c.e.unreadable ? TNX_EIO : TNX_ECORRUPT, c.e.problem);
        std::optional<std::string> raw;
        try {
          raw = read_file(Index::named(c.key) ? c.shown : stem_for(c.key) + std::string(kJsonExt));
        } catch (const Error &) {
          raw = std::string();
        }
        items.push_back(Item{TNX_TIME_NONE, c.shown, 0, "", "", "", "", omit || !raw ? std::string() : std::move(*raw),
                             c.e.problem, TNX_TIME_NONE, c.e.due_us, c.key});
        continue;
      }
      std::optional<Loaded> l;
      std::optional<Error> bad;
      try {
        l = load(stem_for(c.key));
      } catch (const Error &err) {
        const bool this_file = err.code == TNX_ECORRUPT || dynamic_cast<const UnreadableFile *>(&err) != nullptr;
        if (!this_file) throw;
        bad = err;
      }
      if (bad && attempt == 0) {  // re-indexed: an edit in place turns the entry corrupt
        stale.push_back(c.key);
        continue;
      }
      if (bad) {  // e.g. a damaged sidecar beside an unchanged Task file
        if (!deliver_corrupt) throw *bad;
        std::optional<std::string> raw;
        try {
          raw = read_file(stem_for(c.key) + std::string(kJsonExt));
        } catch (const Error &) {
          raw = std::string();
        }
        items.push_back(Item{TNX_TIME_NONE, c.shown, 0, "", "", "", "", omit || !raw ? std::string() : std::move(*raw),
                             bad->message, TNX_TIME_NONE, c.e.due_us, c.key});
        continue;
      }
      if (!l || l->file != c.e.file || l->fields.id != c.key || l->owner != c.e.owner || l->tenant != c.e.tenant) {
        stale.push_back(c.key);
        continue;
      }
      items.push_back(Item{c.e.time_us, c.shown, c.e.version, c.e.context_id, c.e.state, c.e.owner, c.e.tenant,
                           std::move(l->json), std::string(), c.e.due_us, c.e.due_us, c.key});
    }
    if (!stale.empty() && attempt < 3) {
      for (const std::string &key : stale) reindex(key);
      continue;
    }
    if (!stale.empty()) {
      // Saves keep racing this page: take each such Task as it is now,
      // read while no save of it is under way (its SlotGuard), in its
      // place now. (A Task saved during a listing may be seen at its new
      // place or its old one, as with any keyset listing.)
      for (const std::string &key : stale) {
        if (Index::named(key)) continue;
        std::optional<Loaded> l;
        std::optional<IEntry> e;
        {
          std::unique_ptr<SlotGuard> g;
          if (!ro_) g = std::make_unique<SlotGuard>(slots_.get(), lock_fd_, path(kLockName), key);
          catch_up();
          if (!ro_) (void)current(key, stem_for(key));
          e = entry_of(key);
          try {
            l = load(stem_for(key));
          } catch (const Error &) {
            l.reset();
          }
        }
        if (!l || !e || e->corrupt || l->fields.id != key) continue;
        if (!toolnexus::sdk::matches(q, e->context_id, e->state, l->owner, l->tenant, e->time_us, e->due_us))
          continue;
        if (cursor && !cursor->long_form && !cursor->key.before(e->time_us, key)) continue;
        if (due_from && !due_from->before(e->due_us, key)) continue;
        items.push_back(Item{e->time_us, key, e->version, e->context_id, e->state, l->owner, l->tenant,
                             omit ? std::string() : std::move(l->json), std::string(), e->due_us, e->due_us, key});
      }
      std::sort(items.begin(), items.end(), [&](const Item &a, const Item &b) {
        if (due_list) return a.pos_due != b.pos_due ? a.pos_due < b.pos_due : a.key < b.key;
        if (a.time_us != b.time_us) return a.time_us > b.time_us;
        return a.id < b.id;
      });
      if (items.size() > limit) items.resize(limit);
    }
    for (const Item &item : items) {
      tnx_task_record r = empty_record();
      r.id = toolnexus::sdk::str(item.id);
      r.context_id = toolnexus::sdk::str(item.context_id);
      r.state = toolnexus::sdk::str(item.state);
      r.status_time_us = item.time_us;
      r.owner = toolnexus::sdk::str(item.owner);
      r.tenant = toolnexus::sdk::str(item.tenant);
      r.task_json = toolnexus::sdk::str(item.json);
      r.version = item.version;
      r.problem = toolnexus::sdk::str(item.problem);
      r.due_us = item.due_us;
      if (!out(r)) return std::string();
    }
    if (!more) return std::string();
    // With omit_json the page was delivered from the index: its cursor is
    // the last record delivered there.
    if (delivered != 0) return cursor_at(last_time, last_due, last_id);
    // Every candidate of the page was dropped (it kept changing, or went
    // away): the next page starts after them, not nowhere.
    if (items.empty()) {
      if (cands.empty()) return std::string();
      const Cand &c = cands.back();
      return cursor_at(c.e.time_us, c.e.due_us, due_list ? c.key : c.shown);
    }
    const Item &it = items.back();
    return cursor_at(it.time_us, it.pos_due, due_list ? it.key : it.id);
  }
}

uint64_t FileStore::count(const tnx_list_query &q) {
  catch_up();
  if (q.filter_flags & TNX_FILTER_DUE_BEFORE) {
    std::shared_lock<std::shared_mutex> l(imu_);
    uint64_t n = 0;
    for (auto d = index_->due.begin(); d != index_->due.end() && d->first < q.due_before_us; ++d) {
      auto node = index_->entries.find(std::string_view(d->second));
      if (node == index_->entries.end()) continue;
      const EntryView e = node->second.view();
      if (!e.corrupt && toolnexus::sdk::matches(q, e.context_id, e.state, e.owner, e.tenant, e.time_us, e.due_us)) ++n;
    }
    return n;
  }
  if (toolnexus::plugins::TaskCounts::answers(q)) {
    for (;;) {
      {
        std::shared_lock<std::shared_mutex> l(imu_);
        if (index_->counts_ready) return index_->counts.count(q);
      }
      // First count since the index was (re)loaded: build the counters.
      std::unique_lock<std::shared_mutex> l(imu_);
      index_->build_counts();
    }
  }
  std::shared_lock<std::shared_mutex> l(imu_);
  auto it = index_->order.begin();
  if (q.filter_flags & TNX_FILTER_BEFORE) {
    if (q.before_us == INT64_MIN) return 0;
    it = index_->order.lower_bound(Index::OKey{q.before_us - 1, std::string_view(), false, nullptr});
  }
  uint64_t n = 0;
  for (; it != index_->order.end(); ++it) {
    if ((q.filter_flags & TNX_FILTER_AFTER) && !(it->time > q.after_us)) break;
    const EntryView e = it->node->second.view();
    if (e.corrupt) continue;
    if (toolnexus::sdk::matches(q, e.context_id, e.state, e.owner, e.tenant, e.time_us)) ++n;
  }
  return n;
}

std::set<Index::OKey, Index::OOrder>::const_iterator FileStore::start_of(
    const std::optional<Cursor> &cursor) const {
  if (!cursor) return index_->order.begin();
  if (!cursor->long_form)
    return index_->order.upper_bound(Index::OKey{cursor->key.time_us, cursor->key.id, true, nullptr});
  // Long form: the id with that prefix and hash, if it still exists;
  // otherwise every id with the prefix again (a repeat beats a loss).
  const auto first = index_->order.lower_bound(Index::OKey{cursor->key.time_us, cursor->key.id, false, nullptr});
  for (auto it = first; it != index_->order.end() && it->time == cursor->key.time_us &&
                        starts_with(it->id, cursor->key.id);
       ++it)
    if (sha256_hex(it->id) == cursor->sha) return std::next(it);
  return first;
}

std::string FileStore::encode_cursor(int64_t time_us, const std::string &id) {
  std::string c = ListKey{time_us, id}.encode();
  if (c.size() <= kMaxCursor) return c;
  return ListKey{time_us, id.substr(0, kCursorIdPrefix)}.encode() + "." + sha256_hex(id);
}

FileStore::Cursor FileStore::decode_cursor(std::string_view c) {
  Cursor out;
  const size_t first = c.find('.');
  const size_t last = c.rfind('.');
  if (first != std::string_view::npos && first != last) {
    const std::string_view sha = c.substr(last + 1);
    bool ok = sha.size() == 64;
    for (char h : sha) ok = ok && hex_value(h, false) >= 0;
    if (!ok) throw Error(TNX_EINVAL, "list: malformed cursor '" + std::string(c.substr(0, 64)) + "'");
    out.key = ListKey::decode(c.substr(0, last));
    out.long_form = true;
    out.sha = std::string(sha);
    return out;
  }
  out.key = ListKey::decode(c);
  return out;
}

void FileStore::validate(const tnx_task_record &rec, const std::string &id, std::string_view json) const {
  TaskFields f;
  const std::string why = parse_task(json, f);
  if (!why.empty()) throw Error(TNX_EINVAL, "save of task " + quote(id) + ": task_json " + why);
  auto mismatch = [&](const char *field, const std::string &in_json, const std::string &in_rec) {
    return Error(TNX_EINVAL, "save of task " + quote(id) + ": the record's " + field + " " +
                                 quote(in_rec) + " differs from the task_json's " + quote(in_json));
  };
  if (f.id != id) throw mismatch("id", f.id, id);
  if (f.context_id != view(rec.context_id))
    throw mismatch("context_id", f.context_id, std::string(view(rec.context_id)));
  if (f.state != view(rec.state)) throw mismatch("state", f.state, std::string(view(rec.state)));
  if (f.time_us != rec.status_time_us)
    throw Error(TNX_EINVAL, "save of task " + quote(id) + ": the record's status_time_us " +
                                std::to_string(rec.status_time_us) +
                                " differs from the task_json's status.timestamp (" +
                                std::to_string(f.time_us) + ")");
}

}  // namespace toolnexus::file_plugin

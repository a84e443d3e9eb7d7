// plugins/file/store_stream.cpp: FileStore::save_stream (ABI 1.5), the
// bulk save of `toolnexus store put` and `store copy` (see file_store.hpp).
//
// A save costs two waits for the disk (the Task file's fdatasync before its
// rename, the directory's fsync after it): 829 Tasks/s on the disk it was
// measured on. A stream does that work once per group instead: it writes
// the Task files of a group to temp files without syncing them, makes them
// all durable with one syncfs(2), renames each over its Task file (the
// compare-and-set of a save, under the id's lock) and fsyncs <dir> once.
// The rule of a save is kept: a Task file is renamed into place only once
// its bytes are durable, so a crash leaves each Task old or new, whole,
// never torn; what it leaves is temp files, removed by the next lone open.
#include "file_store.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

namespace toolnexus::file_plugin {

using toolnexus::sdk::BatchError;

tnx_task_record FileStore::Staged::record() const {
  tnx_task_record r{};
  r.header = tnx_header(sizeof r);
  r.id = toolnexus::sdk::str(id);
  r.context_id = toolnexus::sdk::str(context_id);
  r.state = toolnexus::sdk::str(state);
  r.status_time_us = time_us;
  r.owner = toolnexus::sdk::str(owner);
  r.tenant = toolnexus::sdk::str(tenant);
  r.task_json = toolnexus::sdk::str(json);
  r.due_us = due_us;
  return r;
}

FileStore::Staged FileStore::stage(const tnx_task_record &rec, uint64_t expected) {
  Staged s;
  s.id.assign(view(rec.id));
  s.json.assign(view(rec.task_json));
  validate(rec, s.id, s.json);
  s.context_id.assign(view(rec.context_id));
  s.state.assign(view(rec.state));
  s.owner.assign(view(rec.owner));
  s.tenant.assign(view(rec.tenant));
  s.time_us = rec.status_time_us;
  s.due_us = toolnexus::sdk::due_of(rec);
  s.expected = expected;
  Fd fd = create_temp(s.tmp);
  if (fd.get() < 0) {
    const int e = errno;
    throw Error(TNX_EIO, "save of task " + quote(s.id) + ": cannot create '" + path(s.tmp) + "': " + errtext(e));
  }
  try {
    write_all_fd(fd.get(), s.json, path(s.tmp));
    struct stat st;
    if (::fstat(fd.get(), &st) != 0)
      throw Error(TNX_EIO, "save of task " + quote(s.id) + ": cannot stat '" + path(s.tmp) + "': " + errtext(errno));
    s.file = FileId::of(st);
    const int raw = fd.release();
    if (::close(raw) != 0 && errno != EINTR)
      throw Error(TNX_EIO, "save of task " + quote(s.id) + ": cannot close '" + path(s.tmp) + "': " + errtext(errno));
  } catch (...) {
    fd.reset();
    ::unlinkat(dir_.get(), s.tmp.c_str(), 0);
    throw;
  }
  return s;
}

FileId FileStore::put_staged(const Staged &staged, const std::string &jname, const std::string &id) {
  if (::renameat(dir_.get(), staged.tmp.c_str(), dir_.get(), jname.c_str()) != 0) {
    const int e = errno;
    ::unlinkat(dir_.get(), staged.tmp.c_str(), 0);
    throw Error(TNX_EIO, "save of task " + quote(id) + ": cannot rename '" + path(staged.tmp) + "' to '" +
                             path(jname) + "': " + errtext(e));
  }
  return staged.file;
}

void FileStore::drop_staged(std::vector<Staged> &group, size_t from) noexcept {
  for (size_t i = from; i < group.size(); ++i) ::unlinkat(dir_.get(), group[i].tmp.c_str(), 0);
  group.clear();
}

void FileStore::commit_group(std::vector<Staged> &group, uint64_t first, uint64_t &saved) {
  if (group.empty()) return;
  // The bytes of every temp file of the group, durable at once (one
  // journal commit instead of one per file).
  if (::syncfs(dir_.get()) != 0) {
    const int e = errno;
    drop_staged(group, 0);
    throw BatchError(first, TNX_EIO, "save of a group of Tasks: cannot sync the file system of '" + path_ +
                                         "': " + errtext(e) + "; no Task of the group was saved");
  }
  size_t i = 0;
  try {
    for (; i < group.size(); ++i) {
      const tnx_task_record rec = group[i].record();
      (void)save_valid(rec, group[i].id, group[i].expected, &group[i]);
      ++saved;
    }
  } catch (const Error &e) {
    drop_staged(group, i);  // group[i]'s too, unless renamed already (then the unlink finds nothing)
    if (i > 0) durable(path_);
    throw BatchError(first + i, e.code, e.message);
  }
  group.clear();
  durable(path_);
}

uint64_t FileStore::save_stream(toolnexus::sdk::RecordSource &source, uint32_t flags) {
  if ((flags & TNX_SAVE_STREAM_ONE_TRANSACTION) != 0)
    throw Error(TNX_EUNSUPPORTED, "save of a stream in one transaction: '" + path_ +
                                      "' keeps one file per Task, with no transaction across them");
  std::vector<Staged> group;
  group.reserve(kStreamGroup);
  size_t bytes = 0;
  uint64_t saved = 0;
  try {
    for (;;) {
      uint64_t expected = TNX_VERSION_ANY;
      const tnx_task_record *rec = source.next(expected);  // SourceStopped, BatchError
      if (rec == nullptr) break;
      try {
        group.push_back(stage(*rec, expected));
      } catch (const Error &e) {
        throw BatchError(source.delivered() - 1, e.code, e.message);
      }
      bytes += group.back().json.size();
      if (group.size() >= kStreamGroup || bytes >= kStreamGroupBytes) {
        commit_group(group, saved, saved);
        bytes = 0;
      }
    }
  } catch (...) {
    // What was delivered before the failure is saved, as the ABI says.
    if (!group.empty()) {
      try {
        commit_group(group, saved, saved);
      } catch (...) {
        drop_staged(group, 0);
        throw;  // that failure comes first (its index is earlier)
      }
    }
    throw;
  }
  commit_group(group, saved, saved);
  return saved;
}

}  // namespace toolnexus::file_plugin

// plugins/file/task_files.cpp: reading and writing the files of file:<dir>
// (see task_files.hpp).
#include "task_files.hpp"

#include "names.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <memory>

namespace toolnexus::file_plugin {
namespace {

// Process-wide counter for temporary file names.
std::atomic<uint64_t> g_temp_counter{0};

}  // namespace

int TaskFiles::open_own(const char *name, int flags, mode_t mode) const {
  const int fd = ::openat(dir_.get(), name, flags | O_NONBLOCK | O_CLOEXEC | O_NOFOLLOW, mode);
  if (fd < 0) {
    if (errno == ELOOP)
      throw Error(TNX_EIO, "'" + path(name) + "' is a symbolic link: refused (the store never follows one for "
                                              "its own files); move it away (the store makes a new one)");
    return -1;
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(TNX_EIO, "'" + path(name) + "' is not a regular file: move it away (the store makes a new one)");
  }
  return fd;
}

Stamp TaskFiles::dir_stamp() const {
  struct stat st;
  if (::fstat(dir_.get(), &st) != 0) throw Error(TNX_EIO, "cannot stat '" + path_ + "': " + errtext(errno));
  return Stamp{static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec,
               static_cast<int64_t>(st.st_ctim.tv_sec) * 1000000000 + st.st_ctim.tv_nsec,
               static_cast<uint64_t>(st.st_ino)};
}

std::string TaskFiles::path(std::string_view name) const {
  return (path_ == "/" ? path_ : path_ + "/") + std::string(name);
}

bool TaskFiles::exists(const std::string &name) const {
  struct stat st;
  if (::fstatat(dir_.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) return true;
  if (errno == ENOENT) return false;
  throw Error(TNX_EIO, "cannot stat '" + path(name) + "': " + errtext(errno));
}

std::vector<std::string> TaskFiles::scan() const {
  Fd fd(::openat(dir_.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0) throw Error(TNX_EIO, "cannot open directory '" + path_ + "': " + errtext(errno));
  DIR *d = ::fdopendir(fd.get());
  if (d == nullptr) throw Error(TNX_EIO, "cannot read directory '" + path_ + "': " + errtext(errno));
  fd.release();
  std::unique_ptr<DIR, int (*)(DIR *)> guard(d, &::closedir);
  std::vector<std::string> names;
  for (;;) {
    errno = 0;
    const dirent *e = ::readdir(d);
    if (e == nullptr) {
      if (errno != 0) throw Error(TNX_EIO, "cannot read directory '" + path_ + "': " + errtext(errno));
      break;
    }
    const std::string_view n(e->d_name);
    if (n == "." || n == "..") continue;
    names.emplace_back(n);
  }
  return names;
}

std::optional<std::string> TaskFiles::read_file(const std::string &name, FileId *id) const {
  Fd fd(::openat(dir_.get(), name.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
  if (fd.get() < 0) {
    const int e = errno;
    if (e == ENOENT) return std::nullopt;
    if (e == ELOOP)
      throw Error(TNX_ECORRUPT, "'" + path(name) + "' is a symbolic link, not a task file");
    if (e == EACCES || e == EPERM)
      throw UnreadableFile(TNX_EIO, "cannot open '" + path(name) + "': " + errtext(e));
    throw Error(TNX_EIO, "cannot open '" + path(name) + "': " + errtext(e));
  }
  struct stat st;
  if (::fstat(fd.get(), &st) != 0)
    throw Error(TNX_EIO, "cannot stat '" + path(name) + "': " + errtext(errno));
  if (!S_ISREG(st.st_mode)) throw Error(TNX_ECORRUPT, "'" + path(name) + "' is not a regular file");
  if (id != nullptr) *id = FileId::of(st);
  std::string data;
  data.resize(static_cast<size_t>(st.st_size) + 1);
  size_t got = 0;
  for (;;) {
    if (got == data.size()) data.resize(data.size() * 2);
    const ssize_t n = ::read(fd.get(), &data[got], data.size() - got);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw UnreadableFile(TNX_EIO, "cannot read '" + path(name) + "': " + errtext(errno));
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  data.resize(got);
  return std::optional<std::string>(std::move(data));
}

std::optional<Loaded> TaskFiles::load(const std::string &stem) const {
  const std::string jname = stem + std::string(kJsonExt), mname = stem + std::string(kMetaExt);
  for (int attempt = 0; attempt < 16; ++attempt) {
    Loaded l;
    std::optional<std::string> json = read_file(jname, &l.file);
    if (!json) return std::nullopt;
    l.json = std::move(*json);
    const std::string why = parse_task(l.json, l.fields);
    if (!why.empty()) throw Error(TNX_ECORRUPT, "task file '" + path(jname) + "' " + why);
    std::optional<std::string> meta_bytes = read_file(mname);
    if (!meta_bytes) return std::optional<Loaded>(std::move(l));
    const ino_t ino = static_cast<ino_t>(l.file.ino);
    Meta m;
    const std::string mwhy = parse_meta(*meta_bytes, m);
    if (!mwhy.empty()) throw Error(TNX_ECORRUPT, "owner/tenant file '" + path(mname) + "' " + mwhy);
    // The sidecar must belong to the Task bytes we read: if the Task was
    // replaced in between, read both again.
    struct stat now;
    if (::fstatat(dir_.get(), jname.c_str(), &now, AT_SYMLINK_NOFOLLOW) != 0 || now.st_ino != ino) continue;
    if (m.has_prev && sha256_hex(l.json) == m.prev_sha) {
      l.owner = std::move(m.prev_owner);
      l.tenant = std::move(m.prev_tenant);
    } else {
      l.owner = std::move(m.owner);
      l.tenant = std::move(m.tenant);
    }
    return std::optional<Loaded>(std::move(l));
  }
  throw Error(TNX_EIO, "'" + path(jname) + "' kept changing while being read");
}

tnx_task_record TaskFiles::record(const Loaded &l, uint64_t version, bool omit_json) const {
  tnx_task_record r = empty_record();
  r.id = toolnexus::sdk::str(l.fields.id);
  r.context_id = toolnexus::sdk::str(l.fields.context_id);
  r.state = toolnexus::sdk::str(l.fields.state);
  r.status_time_us = l.fields.time_us;
  r.owner = toolnexus::sdk::str(l.owner);
  r.tenant = toolnexus::sdk::str(l.tenant);
  if (!omit_json) r.task_json = toolnexus::sdk::str(l.json);
  r.version = version;
  return r;
}

Fd TaskFiles::create_temp(std::string &tmp) const {
  for (;;) {
    tmp = std::string(kTempPrefix) + std::to_string(::getpid()) + "-" +
          std::to_string(g_temp_counter.fetch_add(1, std::memory_order_relaxed)) + std::string(kTempSuffix);
    Fd fd(::openat(dir_.get(), tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666));
    if (fd.get() >= 0 || errno != EEXIST) return fd;
  }
}

void TaskFiles::probe_writable() {
  std::string tmp;
  Fd fd = create_temp(tmp);
  if (fd.get() < 0) {
    const int e = errno;
    throw Error(TNX_EIO, "file: cannot create task files in '" + path_ + "': " + errtext(e));
  }
  ::unlinkat(dir_.get(), tmp.c_str(), 0);
}

FileId TaskFiles::replace(const std::string &name, std::string_view data, const std::string &id) {
  std::string tmp;
  Fd fd = create_temp(tmp);
  if (fd.get() < 0) {
    const int e = errno;
    throw Error(TNX_EIO, "save of task " + quote(id) + ": cannot create '" + path(tmp) + "': " + errtext(e));
  }
  auto fail = [&](const char *what, int e) {
    fd.reset();
    ::unlinkat(dir_.get(), tmp.c_str(), 0);
    return Error(TNX_EIO, "save of task " + quote(id) + ": cannot " + what + " '" + path(tmp) +
                              "' (for '" + path(name) + "'): " + errtext(e));
  };
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd.get(), data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw fail("write", errno);
    }
    if (n == 0) throw fail("write", EIO);
    done += static_cast<size_t>(n);
  }
  while (::fdatasync(fd.get()) != 0)
    if (errno != EINTR) throw fail("sync", errno);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) throw fail("stat", errno);
  const int raw = fd.release();
  if (::close(raw) != 0 && errno != EINTR) throw fail("close", errno);
  if (::renameat(dir_.get(), tmp.c_str(), dir_.get(), name.c_str()) != 0) {
    const int e = errno;
    ::unlinkat(dir_.get(), tmp.c_str(), 0);
    throw Error(TNX_EIO, "save of task " + quote(id) + ": cannot rename '" + path(tmp) + "' to '" +
                             path(name) + "': " + errtext(e));
  }
  return FileId::of(st);  // a rename keeps the inode, size and mtime
}

void TaskFiles::durable(const std::string &what) {
  const int e = sync_.wait(sync_.changed());
  if (e != 0)
    throw Error(TNX_EIO, "'" + what + "' was changed but syncing directory '" + path_ +
                             "' failed: " + errtext(e) + "; the change may not survive a crash");
}

void TaskFiles::remove_meta(const std::string &mname) {
  if (::unlinkat(dir_.get(), mname.c_str(), 0) != 0 && errno != ENOENT)
    throw Error(TNX_EIO, "cannot remove '" + path(mname) + "': " + errtext(errno));
}

void TaskFiles::save_with_meta(const std::string &id, const std::string &jname, const std::string &mname,
                               std::string_view json, bool present, bool meta_exists, bool meta_ok,
                               const Meta &meta, const std::string &owner, const std::string &tenant,
                               bool &committed, FileId &file) {
  auto read_old = [&]() -> std::optional<std::string> {
    try {
      return read_file(jname);
    } catch (const Error &) {
      return std::nullopt;  // unreadable: it is being replaced anyway
    }
  };
  // Owner/tenant of the stored version, when they can be known.
  bool eff_known = false;
  std::string eff_owner, eff_tenant;
  std::optional<std::string> old;
  if (present) {
    if (!meta_exists) {
      eff_known = true;
    } else if (meta_ok) {
      if (meta.has_prev) old = read_old();
      if (!meta.has_prev || old) {
        eff_known = true;
        const bool use_prev = meta.has_prev && sha256_hex(*old) == meta.prev_sha;
        eff_owner = use_prev ? meta.prev_owner : meta.owner;
        eff_tenant = use_prev ? meta.prev_tenant : meta.tenant;
      }
    }
  }
  const bool want_meta = !owner.empty() || !tenant.empty();
  const bool changes = !eff_known || eff_owner != owner || eff_tenant != tenant;
  if (present && changes && !old) old = read_old();
  const bool same_bytes = old && *old == json;
  Meta clean;
  clean.owner = owner;
  clean.tenant = tenant;

  if (present && eff_known && changes && old && !same_bytes) {
    // Owner and bytes change: the sidecar keeps the old owner for the old
    // bytes until the Task file is replaced.
    Meta m = clean;
    m.has_prev = true;
    m.prev_owner = eff_owner;
    m.prev_tenant = eff_tenant;
    m.prev_sha = sha256_hex(*old);
    replace(mname, encode_meta(m), id);
    durable(path(mname));
    file = replace(jname, json, id);
    committed = true;
    durable(path(jname));
    try {  // drop "prev"; a later save does it if this fails
      if (want_meta) replace(mname, encode_meta(clean), id);
      else remove_meta(mname);
      durable(path(mname));
    } catch (const Error &) {
    }
    return;
  }
  // Otherwise the owner is the same for the old and the new bytes, or the
  // bytes do not change (the sidecar is then the commit), or there is no
  // stored Task (an orphan sidecar is overwritten).
  if (want_meta) replace(mname, encode_meta(clean), id);
  else if (meta_exists) remove_meta(mname);
  durable(path(mname));
  if (present && same_bytes) {
    committed = true;  // the Task file stays as it is: `file` is its identity
    return;
  }
  try {
    file = replace(jname, json, id);
  } catch (const Error &) {
    if (!present && want_meta) ::unlinkat(dir_.get(), mname.c_str(), 0);
    throw;
  }
  committed = true;
}

}  // namespace toolnexus::file_plugin

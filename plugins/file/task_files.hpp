// plugins/file/task_files.hpp: record I/O of the file plugin: reading and
// writing the files of file:<dir> (Task files, sidecars, the store's own
// files) atomically and durably, relative to one descriptor of <dir>.
// Knows nothing of the index or the locks: FileStore (file_store.hpp)
// decides what to read and write, and when.
//
// The rules (layout comment of file_plugin.cpp, "Atomicity and
// durability"): a file is replaced by writing a fresh .tnx-<pid>-<n>.tmp,
// fdatasync, rename over the name; durable() then fsyncs <dir> (group
// commit, dir_sync.hpp). Errors are Error(TNX_EIO) naming the path and the
// system error, Error(TNX_ECORRUPT) naming a file that cannot be decoded,
// UnreadableFile for a task file that alone cannot be read.
#ifndef TOOLNEXUS_FILE_TASK_FILES_HPP
#define TOOLNEXUS_FILE_TASK_FILES_HPP

#include "basics.hpp"
#include "dir_sync.hpp"
#include "task_codec.hpp"

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace toolnexus::file_plugin {

/// A TNX_EIO failure of one task file alone (permission, a read error), as
/// opposed to the directory or the process: list's deliver_corrupt hands the
/// record over with this message instead of failing the whole list.
struct UnreadableFile : Error {
  using Error::Error;
};

/// A Task file read and decoded, with its owner/tenant (from the sidecar).
struct Loaded {
  std::string json;
  TaskFields fields;
  std::string owner, tenant;
  FileId file;  // of the task file the bytes came from
};

/// The files of one store directory. Owns the directory's descriptor and
/// the group commit of its fsyncs. Thread-safe: no state changes after
/// construction (DirSync is thread-safe); concurrent saves of one Task file
/// are the caller's to exclude (SlotGuard, locks.hpp). Names are file names
/// directly inside <dir> (no '/').
class TaskFiles {
 public:
  /// Takes `dir` (an O_DIRECTORY descriptor of <dir>) and `path`, the
  /// directory's absolute path, for messages.
  TaskFiles(Fd dir, std::string path) : dir_(std::move(dir)), path_(std::move(path)), sync_(dir_.get()) {}

  /// Fails open, naming the directory and the reason, when no task file could
  /// be created in it (read-only mount, no permission, /proc): better than a
  /// server that starts and then fails every save. Creates and removes one
  /// empty temp file (named like a save's, so a crash leaves nothing that
  /// recover() would not remove).
  void probe_writable();

  /// Opens the store's own file `name` (.tnx-lock, .tnx-index) in <dir>,
  /// with O_NONBLOCK so that a FIFO put there cannot hang the open (it did,
  /// for every read-only command) and O_NOFOLLOW so that a symlink put there
  /// cannot make the store append to (or lock) a file elsewhere, as root
  /// perhaps (a hard link needs write access to its target already, under
  /// Linux's protected_hardlinks). Anything but a regular file is refused as
  /// TNX_EIO naming it. Returns -1 with errno when it cannot be opened.
  int open_own(const char *name, int flags, mode_t mode = 0) const;

  /// The directory's mtime, ctime and inode now.
  Stamp dir_stamp() const;

  /// The path of `name` in <dir>, for messages.
  std::string path(std::string_view name) const;

  /// True when `name` exists in <dir> (a symlink counts, unfollowed); TNX_EIO
  /// when that cannot be told.
  bool exists(const std::string &name) const;

  /// All names in the directory (except "." and "..").
  std::vector<std::string> scan() const;

  /// Reads a whole file of the directory; nullopt if it does not exist.
  /// `id` receives its identity (to detect replacement). A symlink or
  /// anything but a regular file is TNX_ECORRUPT; a permission or read
  /// error is UnreadableFile.
  std::optional<std::string> read_file(const std::string &name, FileId *id = nullptr) const;

  /// Reads and decodes the Task stored under `stem` with its owner/tenant;
  /// nullopt if there is none. Throws ECORRUPT naming the file.
  std::optional<Loaded> load(const std::string &stem) const;

  /// The record of `l` at `version` (borrowing `l`'s strings), without the
  /// Task JSON when `omit_json`.
  tnx_task_record record(const Loaded &l, uint64_t version, bool omit_json) const;

  /// Creates a new, empty .tnx-<pid>-<n>.tmp (O_EXCL; the next name on a
  /// clash) and sets `tmp` to its name. On failure returns an invalid Fd
  /// with errno set.
  Fd create_temp(std::string &tmp) const;

  /// Atomically replaces `name` with `data`: temp file, full write, fdatasync,
  /// rename. Not yet durable (see durable()). On failure nothing is left
  /// behind and `name` is untouched. `id` (the Task's) is for messages.
  /// Returns the identity of the new file.
  FileId replace(const std::string &name, std::string_view data, const std::string &id);

  /// Makes the directory's changes so far durable; `what` names the change.
  void durable(const std::string &what);

  /// Removes sidecar `mname`; gone already is fine.
  void remove_meta(const std::string &mname);

  /// The save path when the sidecar must change (see the layout comment):
  /// writes sidecar `mname` (owner/tenant, with a "prev" slot while the
  /// owner and the bytes of a stored Task change together) and Task file
  /// `jname`. `present`: a Task is stored; `meta_exists`/`meta_ok`/`meta`:
  /// its sidecar as read. Sets `committed` once the new Task (or, for
  /// unchanged bytes, the new owner) is in place, and `file` to the Task
  /// file's identity.
  void save_with_meta(const std::string &id, const std::string &jname, const std::string &mname,
                      std::string_view json, bool present, bool meta_exists, bool meta_ok, const Meta &meta,
                      const std::string &owner, const std::string &tenant, bool &committed, FileId &file);

 protected:
  Fd dir_;                  // <dir>, O_DIRECTORY
  const std::string path_;  // absolute path of the directory, for messages
  DirSync sync_;            // fsyncs of dir_
};

}  // namespace toolnexus::file_plugin

#endif  // TOOLNEXUS_FILE_TASK_FILES_HPP

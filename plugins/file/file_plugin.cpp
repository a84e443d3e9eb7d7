// plugins/file: the "file" scheme. One JSON file per Task in a directory,
// compatible with the original (Elixir) FileTaskStore. Built against the SDK
// header only (plus Poco::Foundation for SHA-256, RapidJSON for parsing and
// ISA-L for the index's CRC-32).
//
// This file is the plugin's C ABI glue (open_file, the descriptor, the
// entry function) and its design note below. The layers, each with a
// header saying what it offers the others:
//   basics.hpp        Fd, errno texts, SHA-256, full writes
//   names.hpp         Task id <-> file stem, file name kinds
//   task_codec.hpp    Task JSON index fields, RFC 3339, the sidecar
//   dir_sync.hpp      the directory fsync with group commit
//   task_files.hpp    record I/O: reading and writing files atomically,
//                     durably
//   index_format.hpp  .tnx-index on disk: records, CRC-32, identities
//   index.hpp         the index in memory: entries, list order, counters
//   locks.hpp         OFD locks on .tnx-lock: index lock, process slots,
//                     id locks
//   file_store.hpp    FileStore, the sdk::Store that puts them together
//                     (store_index.cpp: the index's upkeep; store_ops.cpp:
//                     get, save, del, list, count; store_feed.cpp: the
//                     change feed of ABI 1.4)
//
// ===========================================================================
// On-disk layout of file:<dir>
// ===========================================================================
//
// <dir> is the text after "file:", all of it (no ?options): a relative path
// is taken against the working directory at open; the directory and its
// missing parents are created (mode 0777 minus the umask, each new entry
// fsynced into its parent). The store only ever creates, replaces or removes
// names directly inside <dir>, always relative to a descriptor of <dir>
// opened once. Files are created 0666 minus the umask. Opened with the
// host's TNX_OPEN_READ_ONLY (ABI 1.2) the store changes nothing at all: a
// missing <dir> is TNX_ENOTFOUND (not created), stray files are left alone,
// save and del are TNX_EUNSUPPORTED.
//
//   <stem>.json   The Task: exactly the task_json bytes of the last save, as
//                 the seed wrote them. Nothing else is in it. contextId,
//                 status.state and status.timestamp are re-derived from it on
//                 every read.
//   <stem>.meta   Optional sidecar with the owner and tenant (which are not
//                 part of the Task JSON), a small JSON object:
//                   {"owner":"...","tenant":"..."}
//                 possibly with a "prev" slot (see "Atomicity" below):
//                   {"owner":..,"tenant":..,
//                    "prev":{"owner":..,"tenant":..,"sha256":"<64 hex>"}}
//                 Absent = owner and tenant empty, so a directory written by
//                 the seed (only <id>.json files) opens as is. A task saved
//                 with empty owner and tenant never gets a sidecar.
//   .tnx-<pid>-<n>.tmp
//                 Temporary file of a save in progress (name unique per
//                 process and store: pid plus a process-wide counter, created
//                 with O_EXCL). Stray ones left by a crash are removed when a
//                 store opens <dir> read-write and no other process has it
//                 open (the process slots of .tnx-lock, below, say so): what
//                 a live process is writing is never touched. Nothing else is
//                 removed then except orphan sidecars (a <stem>.meta without
//                 <stem>.json, left by a crash during the first save of a
//                 task) and a stray .tnx-index.new.
//   .tnx-lock     Empty; its bytes carry OFD record locks (fcntl
//                 F_OFD_SETLK, so they work between the threads of one
//                 process too): byte 0 the index lock (appending to or
//                 rewriting .tnx-index), bytes 16..271 one process slot per
//                 open read-write store (held while it is open: how many
//                 processes have the store open), bytes 1024..5119 the write
//                 lock of the ids hashing to that slot (held by a save or
//                 delete from its compare-and-set check until its change is
//                 in the index). Created by the first read-write open.
//   .tnx-index    The index: a derived cache of every task file's index
//                 fields, version and identity (inode, size, mtime), so that
//                 list and count read no task file they do not deliver. An
//                 append-only log of checksummed binary records (header,
//                 task, delete-with-last-version, open, close with the
//                 directory's stamp, epoch, reset), rewritten whole
//                 (.tnx-index.new, renamed over it) when it grows past 4x its
//                 live size; followers of the old file find a "moved" record
//                 at its end. A torn tail (a crash) is ignored and cut off by
//                 the next appender. Deleting it loses nothing: it is rebuilt.
//                 The directory stays the seed's: <id>.json files alone open
//                 as a store, and a directory written while no toolnexus
//                 process had it open is re-indexed at the next open.
//   anything else Ignored (README, the seed's own *.tmp files, files whose
//                 name is not a canonical task file name as defined below).
//
// The stem of a Task id:
//   - An id of 1..250 bytes made only of [A-Za-z0-9_-] is its own stem, so
//     "abc-1_Z" is stored as <dir>/abc-1_Z.json exactly (the seed's layout).
//   - Any other id: "~" followed by the id with every byte outside
//     [A-Za-z0-9_-] written as %XX (upper-case hex), if that fits in 250
//     bytes ("a/b" -> "~a%2Fb", ".." -> "~%2E%2E", "ü" -> "~%C3%BC").
//   - Otherwise (very long ids): "~sha256-" + the lower-case hex SHA-256 of
//     the id. The file's "id" member is checked against the requested id on
//     every read.
//   Plain stems never contain '~' and never start with '.', escaped stems
//   always contain '%', hashed stems never do: no two ids share a stem, no
//   stem is a temporary or a foreign name, and no stem contains '/' or NUL,
//   so nothing is ever created outside <dir>. Stems are at most 250 bytes, so
//   "<stem>.json" and "<stem>.meta" fit NAME_MAX (255). On read, a .json file
//   counts as a task file only if its stem is canonical (decoding and
//   re-encoding gives the same stem); then its "id" must be the id the name
//   stands for, or the file is reported corrupt.
//
// Atomicity and durability of a save (the usual fast path is the bare
// write-fsync-rename-fsync(dir) sequence):
//   1. write the new bytes to a fresh .tnx-*.tmp (all of them, retrying short
//      writes and EINTR), fdatasync, close, rename over <stem>.json,
//   2. fsync <dir> (concurrent saves share one directory fsync when it
//      started after all of their renames: a group commit), then report.
//   Any failed step removes the temporary file and reports TNX_EIO naming the
//   path and the system error; the previous <stem>.json is untouched.
//   The sidecar is written (same temp-fsync-rename-fsync(dir) steps) only
//   when owner/tenant change. It is written before the Task file, so a crash
//   in between must not pair the old Task with the new owner: when a stored
//   Task changes owner and bytes in one save, the sidecar first gets the new
//   owner plus a "prev" slot holding the old owner and the SHA-256 of the
//   old Task bytes; a reader whose Task file still has those bytes uses
//   "prev". After the Task file is in place, the sidecar is rewritten without
//   "prev" (best effort; any later save with a "prev" present cleans it).
//   A failure after the rename (directory fsync) cannot be undone: it is
//   reported as TNX_EIO saying the change may not survive a crash.
//
// Versions and compare-and-set: versions live in the index (first seen on
// disk = 1, every save +1, a deleted id's last version kept so a re-created
// id continues upwards). A save or delete takes its id's lock (a mutex per
// slot and the OFD lock of that slot in .tnx-lock), reads the index (catching
// up with what other processes appended), checks that the task file is the
// one the index describes (same inode, size, mtime; otherwise it changed
// behind the index, e.g. by another program or a writer that crashed between
// rename and index append, and is read again with a new version), compares,
// writes, appends the new entry, and releases. So compare-and-set holds
// between threads, stores and processes (TNX_CAP_MULTI_PROCESS); different
// ids save in parallel. Reads take no lock: get returns the bytes it read
// only with the version whose entry names that very file, else re-checks
// under the id's lock: never old bytes with a newer version.
// When the index cannot be trusted at open (see below) and is rebuilt, the
// epoch is raised to at least the seconds since 2000-01-01 (and above the
// last one): versions handed out from then on are above 2^32 x epoch, so a
// version lost with the index's tail in a crash, or with the whole index
// (deleted, emptied), is never given again. Only a directory no toolnexus
// store opened before (no .tnx-lock: the seed's) starts at epoch 0.
//
// Trusting the index at open: with other processes open (process slots
// held), when its open/close records match their number; alone, when the
// last process closed it cleanly and the directory's mtime/ctime/inode are
// what that close recorded. Otherwise (a crash, files changed while no
// process had the store open, a missing or damaged index) it is rebuilt:
// every task file whose identity differs from its entry is read again (a
// missing index: every file). Read-only opens trust it by the same rule and
// otherwise build it in memory only, changing nothing. Not seen until a
// read or the next untrusted open: a task file edited in place (not by
// rename) while processes have the store open; list notices it when it
// delivers the record (identity check) and re-reads it.
//
// Saves are checked first (TNX_EINVAL, nothing written): task_json must be a
// Task the host would accept (an object with a non-empty string "id", string
// contextId/status.state, RFC 3339 status.timestamp) whose id, contextId,
// state and timestamp equal the record's, since reads re-derive them.
//
// list walks the index in list order, takes the first page_size + 1 matches
// and reads only the task files (and sidecars) of the page_size it delivers
// (none with omit_json); a file found changed is re-indexed and the page
// made again. count (ABI 1.3) answers from counters kept with the index
// (per owner/tenant/state and per contextId); a time window walks that part
// of the order. Corrupt files sort last (TNX_TIME_NONE) and are not counted.
// The cursor is sdk::ListKey's "<time>.<hex id>"; for ids over ~500 bytes,
// whose ListKey would exceed the ABI's 1024-byte cursor limit, it is
// "<ListKey of time and the first 460 id bytes>.<sha256 hex of the id>".
// A due list (ABI 1.5, TNX_FILTER_DUE_BEFORE) walks the index's due set,
// (due time, key) ascending, from its cursor, sdk::DueKey's
// "d<due>.<hex key>" (whole, whatever the id's length), so a page visits
// the Tasks it delivers and those the other filters skip, nothing more.
//
// Errors: a task file that cannot be decoded (empty, truncated, not JSON, not
// an object, no string "id", a bad contextId/status, an "id" that is not the
// one its name stands for, not a regular file) and an unreadable sidecar are
// TNX_ECORRUPT naming the file; list stops on them when it reaches them
// (they sort last), unless deliver_corrupt asks for them.
#include "file_store.hpp"

#include "toolnexus/plugin.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>

namespace {

using toolnexus::file_plugin::Error;
using toolnexus::file_plugin::errtext;
using toolnexus::file_plugin::Fd;
using toolnexus::file_plugin::FileStore;
using toolnexus::sdk::view;

// ---------------------------------------------------------------------------
// open
// ---------------------------------------------------------------------------

void fsync_dir_path(const std::string &dir) {
  Fd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0 || ::fsync(fd.get()) != 0)
    throw Error(TNX_EIO, "cannot sync directory '" + dir + "': " + errtext(errno));
}

// mkdir -p, making each created entry durable in its parent.
void make_dirs(const std::string &dir) {
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = dir.find('/', pos + 1);
    const std::string prefix = dir.substr(0, pos);
    if (prefix.empty() || prefix == "." || prefix == "..") continue;
    if (::mkdir(prefix.c_str(), 0777) == 0) {
      const size_t slash = prefix.find_last_of('/');
      fsync_dir_path(slash == std::string::npos ? "." : slash == 0 ? "/" : prefix.substr(0, slash));
      continue;
    }
    const int e = errno;
    if (e == EEXIST) continue;
    throw Error(e == ENOTDIR ? TNX_EINVAL : TNX_EIO,
                "file: cannot create directory '" + prefix + "': " + errtext(e));
  }
}

toolnexus::sdk::Store *open_file(const tnx_open_args &args) {
  const std::string loc(view(args.location));
  if (loc.empty()) throw Error(TNX_EINVAL, "file: needs a directory, e.g. file:/var/lib/toolnexus/tasks");
  if (loc.find('\0') != std::string::npos)
    throw Error(TNX_EINVAL, "file: the directory name contains a NUL byte");
  std::string abs = loc;
  if (loc[0] != '/') {
    std::string cwd(4096, '\0');
    if (::getcwd(&cwd[0], cwd.size()) == nullptr)
      throw Error(TNX_EIO, "file: cannot get the working directory for '" + loc + "': " + errtext(errno));
    cwd.resize(std::strlen(cwd.c_str()));
    abs = (cwd == "/" ? cwd : cwd + "/") + loc;
  }
  // Drop "." segments and repeated slashes, so messages show the path
  // plainly ("/srv/./tasks/" -> "/srv/tasks"). ".." stays: through a
  // symlink it may mean something other than its text.
  {
    std::string clean;
    size_t i = 0;
    while (i < abs.size()) {
      const size_t j = abs.find('/', i + 1);
      const std::string seg = abs.substr(i, (j == std::string::npos ? abs.size() : j) - i);  // "/name"
      if (seg != "/" && seg != "/.") clean += seg;
      i = j == std::string::npos ? abs.size() : j;
    }
    abs = clean.empty() ? "/" : clean;
  }
  const bool read_only = toolnexus::sdk::open_read_only(args);
  if (!read_only) make_dirs(abs);
  Fd fd(::open(abs.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0) {
    const int e = errno;
    if (read_only && e == ENOENT)
      throw Error(TNX_ENOTFOUND, "file: no store at '" + abs + "': the directory does not exist "
                                 "(opened read-only, so it was not created)");
    throw Error(e == ENOTDIR ? TNX_EINVAL : TNX_EIO, "file: cannot open directory '" + abs + "': " +
                                                         (e == ENOTDIR ? "not a directory" : errtext(e)));
  }
  auto store = std::make_unique<FileStore>(std::move(fd), abs, read_only);
  store->open_index();  // read-write: also cleans up when no other process has it open
  if (!read_only) store->probe_writable();
  else toolnexus::sdk::clear_capabilities(args, TNX_CAP_CHANGE_FEED);
  return store.release();
}

const char *const kSchemes[] = {"file", nullptr};

const tnx_plugin_descriptor kDescriptor = {
    TNX_HEADER_INIT(tnx_plugin_descriptor),
    "toolnexus-file",
    "0.1.0",
    "One JSON file per Task in a directory (file:<dir>), atomic durable writes, an index for "
    "list and count; compare-and-set holds between processes (file locks)",
    kSchemes,
    TNX_CAP_THREAD_SAFE | TNX_CAP_PAGINATED_LIST | TNX_CAP_COMPARE_AND_SET | TNX_CAP_DURABLE |
        TNX_CAP_MULTI_PROCESS | TNX_CAP_PERSISTENT | TNX_CAP_CHANGE_FEED | TNX_CAP_DUE_INDEX,
    &toolnexus::sdk::open_trampoline<open_file>,
    nullptr,
    "file:<dir>",
};

}  // namespace

/// Entry point of the file plugin: returns the descriptor of the "file"
/// scheme (one JSON file per Task in file:<dir>; see the layout comment at
/// the top of this file), or NULL for a host of a different ABI major.
extern "C" TNX_PLUGIN_EXPORT const tnx_plugin_descriptor *toolnexus_plugin_entry(
    const tnx_host_info *host) {
  return toolnexus::sdk::entry<kDescriptor>(host);
}

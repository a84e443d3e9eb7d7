// server/src/domain/instance_id.hpp: a server instance identity kept on disk, so
// that a server restarted on the same store knows the leases it held before
// (TaskLifecycle settles them at start, at once, instead of after a lease).
//
// The identity lives in small files "<base>-0", "<base>-1", ..., each
// holding one instance id (a UUID). A server takes the first file that no
// running process holds: it keeps an OFD write lock (fcntl F_OFD_SETLK) on
// it while it runs, and the kernel drops that lock when the process ends,
// however it ends. So two live servers never share an id (replicas on one
// store take files -0 and -1), and a restarted server takes its own file
// back (the lowest free one). On NFS this needs NFSv4 with working locks,
// as the file: store does.
#ifndef TOOLNEXUS_SERVER_INSTANCE_ID_HPP
#define TOOLNEXUS_SERVER_INSTANCE_ID_HPP

#include <string>

namespace toolnexus::server_detail {

/// The default base of a store's identity files for `selector`:
/// "file:DIR" -> "DIR/.toolnexus-instance", "sqlite:PATH" (a query after
/// '?' ignored) -> "PATH.toolnexus-instance"; "" for every other store (a
/// memory store forgets its Tasks anyway; a database server has no place
/// of ours: configure instance_id or instance_file there).
std::string default_instance_base(const std::string &selector);

/// An identity claimed for this process: its id, and the lock that keeps it
/// this process's own until the claim is destroyed. Move-only.
class InstanceClaim {
 public:
  /// Takes the first of "<base>-0" .. "<base>-1023" that no process holds,
  /// creating it (with a new UUID) when it is missing or holds no valid id.
  /// Throws std::runtime_error naming the file and the system error when a
  /// file cannot be created, locked, read or written, or when all 1024 are
  /// held.
  explicit InstanceClaim(const std::string &base);
  ~InstanceClaim();
  InstanceClaim(const InstanceClaim &) = delete;
  InstanceClaim &operator=(const InstanceClaim &) = delete;

  /// The instance id read from (or written to) the file.
  const std::string &id() const noexcept { return id_; }
  /// The file held.
  const std::string &path() const noexcept { return path_; }

 private:
  int fd_ = -1;
  std::string id_;
  std::string path_;
};

}  // namespace toolnexus::server_detail

#endif  // TOOLNEXUS_SERVER_INSTANCE_ID_HPP

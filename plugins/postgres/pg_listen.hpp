// plugins/postgres/pg_listen.hpp: the listening half of the postgres
// plugin's change feed (ABI 1.4). The sending half is the row trigger of
// pg_sql.hpp (Sql::create_notify), which queues pg_notify(channel, payload)
// in the transaction of every write.
//
// A Listener owns one libpq connection of its own (not from the store's
// pool) that runs LISTEN on the table's channel, and one thread that waits
// for notifications with poll() on the connection's socket and on an
// eventfd that stop() signals, so that stopping never waits on the network.
// When the connection is lost (server restart, pg_terminate_backend, a
// network failure found by TCP keepalives, a connection that stops answering:
// a ping every 5 s must be answered within 5 s) the thread reconnects with a
// backoff of 50 ms doubling to 2 s, and once LISTEN runs again reports a
// gap: what was committed while no one listened is not known, so the host
// re-reads. Nothing of it ever blocks a get, save or list of the store.
#ifndef TOOLNEXUS_PG_LISTEN_HPP
#define TOOLNEXUS_PG_LISTEN_HPP

#include "toolnexus/plugin.hpp"

#include "pg_sql.hpp"

#include <libpq-fe.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <string_view>
#include <thread>

namespace toolnexus::pg {

/// One notification payload of the trigger (see Sql::create_notify),
/// decoded. kind is TNX_CHANGE_SAVED, TNX_CHANGE_DELETED or TNX_CHANGE_GAP;
/// `id` borrows the payload.
struct Notice {
  uint32_t kind = TNX_CHANGE_GAP;
  uint64_t version = 0;
  std::string_view id;
};

/// Decodes "s <version> <id>", "d <version> <id>" or "g". Anything else (a
/// payload of a later plugin, a NOTIFY sent by hand) decodes as a gap: the
/// host re-reads rather than missing a change.
inline Notice parse_notice(std::string_view p) {
  Notice n;
  if (p.size() < 5 || (p[0] != 's' && p[0] != 'd') || p[1] != ' ') return n;
  size_t i = 2;
  uint64_t v = 0;
  for (; i < p.size() && p[i] >= '0' && p[i] <= '9'; ++i) {
    if (v > (UINT64_MAX - 9) / 10) return n;
    v = v * 10 + static_cast<uint64_t>(p[i] - '0');
  }
  if (i == 2 || i + 1 >= p.size() || p[i] != ' ' || v == 0) return n;
  n.kind = p[0] == 's' ? TNX_CHANGE_SAVED : TNX_CHANGE_DELETED;
  n.version = v;
  n.id = p.substr(i + 1);
  return n;
}

/// The listening connection and its thread for one store's feed. start()
/// and stop() are called by the store under its feed mutex (never
/// concurrently); the thread is the only user of the connection after
/// start() returns and the only caller of the feed's sink.
class Listener {
 public:
  /// How the connection is made: libpq keywords and values (NULL-terminated
  /// arrays, borrowed for the listener's life, as for PQconnectdbParams with
  /// expand_dbname 1), the channel (from Sql::channel()), and `message`,
  /// which turns a libpq message into one line without secrets.
  struct Setup {
    const char *const *keys = nullptr;
    const char *const *values = nullptr;
    std::string channel;
    std::string target;
    std::function<std::string(const char *)> message;
  };

  /// Longest wait for a connection and its LISTEN (libpq's connect_timeout
  /// does not apply to PQconnectPoll).
  static constexpr std::chrono::milliseconds kConnectLimit{10000};
  /// Reconnect backoff: the first retry after kBackoffMin, doubling to
  /// kBackoffMax.
  static constexpr std::chrono::milliseconds kBackoffMin{50};
  static constexpr std::chrono::milliseconds kBackoffMax{2000};
  /// A quiet listening connection is asked to answer (it runs its LISTEN
  /// again, a no-op that keeps pg_stat_activity's text) every kPingEvery; no
  /// answer within kPingReply counts as a lost connection (reconnect, gap).
  /// TCP keepalives alone never fire while the peer's kernel still answers
  /// for a backend or proxy that stopped delivering (found by a fresh-user
  /// pass: a stopped backend kept other replicas' streams open for minutes).
  static constexpr std::chrono::milliseconds kPingEvery{5000};
  static constexpr std::chrono::milliseconds kPingReply{5000};

  /// `feed` is the store's; it outlives the listener.
  Listener(Setup setup, const sdk::ChangeFeed &feed) : s_(std::move(setup)), feed_(feed) {}
  ~Listener() { stop(); }
  Listener(const Listener &) = delete;
  Listener &operator=(const Listener &) = delete;

  /// Connects, runs LISTEN (so that every commit from now on is heard) and
  /// starts the thread. Throws sdk::Error(TNX_EIO) naming the cause when
  /// the server cannot be reached or refuses, TNX_EINTERNAL when no eventfd
  /// or thread can be made.
  void start() {
    wake_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_ < 0) throw sdk::Error(TNX_EINTERNAL, std::string("watch: eventfd: ") + std::strerror(errno));
    PGconn *pg = nullptr;
    try {
      pg = connect_and_listen();
      thread_ = std::thread([this, pg] { run(pg); });
    } catch (...) {
      if (pg != nullptr) PQfinish(pg);
      ::close(wake_);
      wake_ = -1;
      throw;
    }
  }

  /// Wakes the thread, waits for it to end (it never calls the sink
  /// afterwards) and closes the connection. Idempotent; never throws.
  void stop() noexcept {
    if (wake_ < 0) return;
    const uint64_t one = 1;
    while (::write(wake_, &one, sizeof one) < 0 && errno == EINTR) {
    }
    if (thread_.joinable()) thread_.join();
    ::close(wake_);
    wake_ = -1;
  }

 private:
  using clock = std::chrono::steady_clock;

  /// Waits until `fd` is ready for `events` (or has failed) or `deadline`
  /// passes; `fd` -1 only sleeps. Returns 1 when ready, 0 at the deadline,
  /// -1 when stop() was called.
  int wait(int fd, short events, clock::time_point deadline) const {
    for (;;) {
      int ms = -1;
      if (deadline != clock::time_point::max()) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock::now()).count();
        ms = left <= 0 ? 0 : static_cast<int>(std::min<long long>(left, INT32_MAX));
      }
      pollfd p[2] = {{wake_, POLLIN, 0}, {fd, events, 0}};
      int n = ::poll(p, fd < 0 ? 1 : 2, ms);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 || (p[0].revents & POLLIN) != 0) return -1;
      if (n == 0) return 0;
      return 1;
    }
  }

  [[noreturn]] void fail(PGconn *pg, const std::string &what) const {
    std::string msg = s_.message(PQerrorMessage(pg));
    PQfinish(pg);
    throw sdk::Error(TNX_EIO, "change feed of " + s_.target + ": " + what + ": " + msg);
  }

  /// A new connection listening on the channel; nullptr when stop() was
  /// called meanwhile. Throws sdk::Error(TNX_EIO) on failure.
  PGconn *connect_and_listen() const {
    const clock::time_point deadline = clock::now() + kConnectLimit;
    PGconn *pg = PQconnectStartParams(s_.keys, s_.values, 1);
    if (pg == nullptr) throw sdk::Error(TNX_EINTERNAL, "out of memory allocating a libpq connection");
    if (PQstatus(pg) == CONNECTION_BAD) fail(pg, "cannot connect");
    for (PostgresPollingStatusType st = PGRES_POLLING_WRITING; st != PGRES_POLLING_OK;) {
      if (st == PGRES_POLLING_FAILED || PQsocket(pg) < 0) fail(pg, "cannot connect");
      const int w = wait(PQsocket(pg), st == PGRES_POLLING_READING ? POLLIN : POLLOUT, deadline);
      if (w < 0) {
        PQfinish(pg);
        return nullptr;
      }
      if (w == 0) {
        PQfinish(pg);
        throw sdk::Error(TNX_EIO, "change feed of " + s_.target + ": cannot connect: no answer within " +
                                      std::to_string(kConnectLimit.count()) + " ms");
      }
      st = PQconnectPoll(pg);
    }
    PQsetNoticeProcessor(pg, [](void *, const char *) {}, nullptr);
    if (PQsetnonblocking(pg, 1) != 0) fail(pg, "cannot set up the listening connection");
    // The session idles by design: a server's idle_session_timeout (14 and
    // later) must not end it, or every timeout would cost a gap.
    const std::string listen = std::string(PQserverVersion(pg) >= 140000 ? "SET idle_session_timeout = 0; " : "") +
                               "LISTEN " + quote_ident(s_.channel);
    if (PQsendQuery(pg, listen.c_str()) == 0) fail(pg, "LISTEN");
    for (;;) {
      const int f = PQflush(pg);
      if (f < 0) fail(pg, "LISTEN");
      if (f == 0 && PQisBusy(pg) == 0) break;
      const short ev = f > 0 ? POLLIN | POLLOUT : POLLIN;
      const int w = wait(PQsocket(pg), ev, deadline);
      if (w < 0) {
        PQfinish(pg);
        return nullptr;
      }
      if (w == 0) {
        PQfinish(pg);
        throw sdk::Error(TNX_EIO, "change feed of " + s_.target + ": no answer to LISTEN within " +
                                      std::to_string(kConnectLimit.count()) + " ms");
      }
      if (PQconsumeInput(pg) == 0) fail(pg, "LISTEN");
    }
    bool ok = true;
    std::string error;
    while (PGresult *r = PQgetResult(pg)) {
      if (PQresultStatus(r) != PGRES_COMMAND_OK) {
        ok = false;
        error = s_.message(PQresultErrorMessage(r));
      }
      PQclear(r);
    }
    if (!ok) {
      PQfinish(pg);
      throw sdk::Error(TNX_EIO, "change feed of " + s_.target + ": LISTEN failed: " + error);
    }
    return pg;
  }

  /// Hands every notification that arrived to the feed.
  void deliver(PGconn *pg) const {
    while (PGnotify *n = PQnotifies(pg)) {
      const Notice c = parse_notice(n->extra == nullptr ? std::string_view() : std::string_view(n->extra));
      if (c.kind == TNX_CHANGE_SAVED) feed_.saved(c.id, c.version);
      else if (c.kind == TNX_CHANGE_DELETED) feed_.deleted(c.id, c.version);
      else feed_.gap();
      PQfreemem(n);
    }
  }

  /// Sends the ping (see kPingEvery); false when it cannot be sent.
  bool send_ping(PGconn *pg) const {
    const std::string ping = "LISTEN " + quote_ident(s_.channel);
    return PQsendQuery(pg, ping.c_str()) != 0 && PQflush(pg) >= 0;
  }

  /// The thread: listens on `pg` until stop(), reconnecting after a loss.
  void run(PGconn *pg) {
    auto backoff = kBackoffMin;
    clock::time_point next_ping = clock::now() + kPingEvery;
    bool pinging = false;  // a ping is out; next_ping is then its reply's deadline
    for (;;) {
      if (pg == nullptr) {
        try {
          pg = connect_and_listen();
          if (pg == nullptr) return;  // stopped
        } catch (const sdk::Error &) {
          if (wait(-1, 0, clock::now() + backoff) < 0) return;
          backoff = std::min(backoff * 2, kBackoffMax);
          continue;
        }
        backoff = kBackoffMin;
        next_ping = clock::now() + kPingEvery;
        pinging = false;
        // LISTEN runs again: whatever committed while no one listened is
        // unknown. The host re-reads; everything later is heard.
        feed_.gap();
      }
      const int w = PQsocket(pg) < 0 ? 1 : wait(PQsocket(pg), POLLIN, next_ping);
      if (w < 0) break;
      bool lost = false;
      if (w == 0) {
        // Quiet until the deadline: ping, or the ping went unanswered.
        if (pinging || !send_ping(pg)) lost = true;
        else {
          pinging = true;
          next_ping = clock::now() + kPingReply;
        }
      } else {
        const bool read = PQconsumeInput(pg) != 0;
        deliver(pg);  // what arrived before a loss still counts
        lost = !read;
        if (read && pinging && PQisBusy(pg) == 0) {
          while (PGresult *r = PQgetResult(pg)) PQclear(r);
          pinging = false;
          next_ping = clock::now() + kPingEvery;
        }
      }
      if (lost || PQstatus(pg) != CONNECTION_OK || PQsocket(pg) < 0) {
        PQfinish(pg);
        pg = nullptr;
      }
    }
    if (pg != nullptr) PQfinish(pg);
  }

  const Setup s_;
  const sdk::ChangeFeed &feed_;
  int wake_ = -1;
  std::thread thread_;
};

}  // namespace toolnexus::pg

#endif  // TOOLNEXUS_PG_LISTEN_HPP

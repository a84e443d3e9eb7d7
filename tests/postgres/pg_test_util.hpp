// tests/postgres/pg_test_util.hpp: what the postgres plugin's tests share:
// the cluster's URI (from the file tests/postgres/pg_cluster.sh writes, named
// by $TNX_PG_URI_FILE), unique table names, an administrative libpq
// connection for setting the scene, Task builders and error expectations.
#ifndef TOOLNEXUS_TESTS_PG_TEST_UTIL_HPP
#define TOOLNEXUS_TESTS_PG_TEST_UTIL_HPP

#include <doctest/doctest.h>
#include <libpq-fe.h>
#include <unistd.h>

#include "toolnexus/registry.hpp"
#include "toolnexus/task.hpp"
#include "toolnexus/task_store.hpp"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace pgtest {

/// The first line of `path`; throws when unreadable or empty.
inline std::string read_line(const std::string &path) {
  std::ifstream f(path);
  std::string line;
  if (!f || !std::getline(f, line) || line.empty()) throw std::runtime_error("cannot read " + path);
  return line;
}

/// Environment variable `name`; throws when unset (the test runs outside CTest).
inline std::string env(const char *name) {
  const char *v = std::getenv(name);
  if (v == nullptr || *v == '\0')
    throw std::runtime_error(std::string(name) + " is not set: run through ctest (fixture postgres)");
  return v;
}

/// postgresql://USER@127.0.0.1:PORT/postgres?sslmode=disable of the test cluster.
inline std::string base_uri() { return read_line(env("TNX_PG_URI_FILE")); }

/// `uri` with more query parameters ("a=1&b=2").
inline std::string with(const std::string &uri, const std::string &params) {
  return uri + (uri.find('?') == std::string::npos ? "?" : "&") + params;
}

/// "127.0.0.1:PORT" of `uri`.
inline std::string host_port(const std::string &uri) {
  size_t at = uri.find('@');
  size_t slash = uri.find('/', at);
  return uri.substr(at + 1, slash - at - 1);
}

/// A table (or schema) name unique to this process and call: prefix_pid_n.
inline std::string unique(const std::string &prefix) {
  static std::atomic<int> n{0};
  return prefix + "_" + std::to_string(::getpid()) + "_" + std::to_string(++n);
}

/// Opens a store on the test cluster with tnx_table=`table` and `params`.
inline std::shared_ptr<toolnexus::TaskStore> open_store(const std::string &table, const std::string &params = "",
                                                        const toolnexus::OpenOptions &options = {}) {
  std::string uri = with(base_uri(), "tnx_table=" + table);
  if (!params.empty()) uri = with(uri, params);
  return toolnexus::resolve_store(uri, options);
}

/// An administrative libpq connection (blocking, text results).
class Admin {
 public:
  explicit Admin(const std::string &uri = base_uri()) : c_(PQconnectdb(uri.c_str())) {
    if (PQstatus(c_) != CONNECTION_OK) throw std::runtime_error(std::string("admin connect: ") + PQerrorMessage(c_));
    PQsetNoticeProcessor(c_, [](void *, const char *) {}, nullptr);
  }
  ~Admin() { PQfinish(c_); }
  Admin(const Admin &) = delete;
  Admin &operator=(const Admin &) = delete;

  /// Runs `sql` with text parameters; throws on failure. Returns the rows as
  /// strings (NULL as "<null>").
  std::vector<std::vector<std::string>> query(const std::string &sql, const std::vector<std::string> &params = {}) {
    std::vector<const char *> v;
    for (const auto &p : params) v.push_back(p.c_str());
    PGresult *r = PQexecParams(c_, sql.c_str(), static_cast<int>(v.size()), nullptr, v.data(), nullptr, nullptr, 0);
    const ExecStatusType st = PQresultStatus(r);
    if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK) {
      std::string msg = PQresultErrorMessage(r);
      PQclear(r);
      throw std::runtime_error("admin: " + sql.substr(0, 200) + ": " + msg);
    }
    std::vector<std::vector<std::string>> rows;
    for (int i = 0; i < PQntuples(r); ++i) {
      rows.emplace_back();
      for (int j = 0; j < PQnfields(r); ++j)
        rows.back().push_back(PQgetisnull(r, i, j) ? "<null>" : PQgetvalue(r, i, j));
    }
    PQclear(r);
    return rows;
  }

  /// Runs `sql` (any number of statements, no parameters); throws on failure.
  void exec(const std::string &sql) {
    PGresult *r = PQexec(c_, sql.c_str());
    const ExecStatusType st = PQresultStatus(r);
    std::string msg = PQresultErrorMessage(r);
    PQclear(r);
    if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK) throw std::runtime_error("admin: " + sql.substr(0, 200) + ": " + msg);
  }

  /// The single value of `sql`.
  std::string scalar(const std::string &sql, const std::vector<std::string> &params = {}) {
    auto rows = query(sql, params);
    if (rows.size() != 1 || rows[0].size() != 1) throw std::runtime_error("admin: not one value: " + sql);
    return rows[0][0];
  }

  PGconn *raw() const { return c_; }

 private:
  PGconn *c_;
};

/// Microseconds of `sec` seconds after 2026-01-01T00:00:00Z (0 = no time).
inline int64_t time_of(int64_t sec) { return sec == 0 ? toolnexus::kNoTime : (1767225600LL + sec) * 1000000LL; }

/// A Task; `sec` seconds after 2026-01-01 (0 = no timestamp); `extra` is
/// appended inside the object (",\"metadata\":{...}").
inline toolnexus::Task make_task(const std::string &id, const std::string &context, const std::string &state,
                                 int64_t sec, const std::string &extra = "") {
  std::string json = "{\"id\":\"" + id + "\",\"contextId\":\"" + context + "\",\"status\":{\"state\":\"" + state + "\"";
  if (sec != 0) json += ",\"timestamp\":\"" + toolnexus::format_timestamp(time_of(sec)) + "\"";
  json += "},\"kind\":\"task\"" + extra + "}";
  return toolnexus::Task::parse(json);
}

/// Runs `f`, which must throw StoreError with status `want`; returns what().
template <class F>
std::string expect_status(toolnexus::Status want, F &&f) {
  try {
    f();
  } catch (const toolnexus::StoreError &e) {
    INFO("message: " << e.what());
    CHECK(toolnexus::status_name(e.code()) == std::string(toolnexus::status_name(want)));
    return e.what();
  }
  FAIL("no StoreError, want " << toolnexus::status_name(want));
  return "";
}

/// Runs `f`, which must throw std::invalid_argument (a plugin's TNX_EINVAL at
/// open); returns what().
template <class F>
std::string expect_invalid(F &&f) {
  try {
    f();
  } catch (const std::invalid_argument &e) {
    return e.what();
  } catch (const std::exception &e) {
    FAIL("want invalid_argument, got: " << e.what());
  }
  FAIL("no error, want invalid_argument");
  return "";
}

/// Seconds since `t0`.
inline double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace pgtest

#endif

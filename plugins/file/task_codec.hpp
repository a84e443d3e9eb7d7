// plugins/file/task_codec.hpp: what the file plugin reads from and writes
// into the bytes of its files: the index fields of a Task file (id,
// contextId, status.state, status.timestamp as RFC 3339) and the
// owner/tenant sidecar (<stem>.meta) with its optional "prev" slot (layout
// comment of file_plugin.cpp, "Atomicity").
//
// Pure functions of their arguments: thread-safe, no I/O, nothing thrown
// for bad input (they return why it is bad); std::bad_alloc aside.
#ifndef TOOLNEXUS_FILE_TASK_CODEC_HPP
#define TOOLNEXUS_FILE_TASK_CODEC_HPP

#include "toolnexus/task_store.h"

#include <cstdint>
#include <string>
#include <string_view>

namespace toolnexus::file_plugin {

/// The index fields of a Task, derived from its JSON. `time_us`: the
/// status.timestamp in microseconds since 1970 (UTC), TNX_TIME_NONE if none.
struct TaskFields {
  std::string id, context_id, state;
  int64_t time_us = TNX_TIME_NONE;
};

/// Parses Task JSON into `f`; returns "" or why it is not a valid Task
/// ("is not valid JSON: ... at byte N", "has no string \"id\"", ...), to
/// follow a file name in a message. Mirrors the host's validation, so what
/// the host accepts decodes here and vice versa: timestamps as the host
/// takes them (Z/z or +HH:MM/-HH:MM, T or t, an optional fraction truncated
/// to microseconds, second 60 allowed).
std::string parse_task(std::string_view json, TaskFields &f);

/// Owner and tenant of a task, with the optional "prev" slot (layout
/// comment): when `has_prev`, a Task file whose SHA-256 (hex) is
/// `prev_sha` has the owner `prev_owner` and tenant `prev_tenant`.
struct Meta {
  std::string owner, tenant;
  bool has_prev = false;
  std::string prev_owner, prev_tenant, prev_sha;
};

/// Parses a sidecar into `m`; returns "" or why it is not one.
std::string parse_meta(std::string_view bytes, Meta &m);

/// The bytes of a sidecar holding `m` (a JSON object and a newline).
std::string encode_meta(const Meta &m);

}  // namespace toolnexus::file_plugin

#endif  // TOOLNEXUS_FILE_TASK_CODEC_HPP

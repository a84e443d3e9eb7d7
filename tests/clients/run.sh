#!/usr/bin/env bash
# Real A2A clients against `toolnexus serve` (issue 9). Installs the pinned
# official JS SDKs (package.json / package-lock.json here: @a2a-js/sdk 1.3.0
# and 0.3.14) with `npm ci` into BUILD_DIR/js-clients, then, for each of the
# memory, file: and sqlite: stores, starts `toolnexus serve --agent approval`
# on a free loopback port and runs a2a_clients.test.mjs under node's test
# runner. Then one Task is parked in input-required on a file: store, the
# server is killed with SIGKILL, a new server on the same store resumes it.
# Last, two servers on one sqlite: file: a stream opened on one ends with a
# cancel sent to the other.
#   usage: run.sh BUILD_DIR SOURCE_DIR
# Needs npm on PATH and the npm registry (CI reaches it), and node >= 20: the
# machine's node if it is 20 or newer, otherwise (Debian 12 ships node 18)
# the official Node.js 20 build published in the npm registry, pinned in
# node20/package-lock.json and installed once with `npm ci` into
# BUILD_DIR/node20 (nothing is installed outside the build directory).
set -euo pipefail
build="$(cd "$1" && pwd)"
src="$(cd "$2" && pwd)"
here="$src/tests/clients"
bin="$build/bin/toolnexus"

command -v npm >/dev/null ||
  { echo "run.sh: npm is required to install the pinned A2A JS clients (Debian: apt-get install npm)" >&2; exit 1; }
. "$here/node.sh"
find_node "$build"
major="$(node_major "$node")"
[ "$major" -ge 20 ] || { echo "run.sh: $node is node $("$node" --version); @a2a-js/sdk 1.x needs node >= 20" >&2; exit 1; }
echo "run.sh: node $("$node" --version) ($node)"

# 1. The pinned clients, installed once per lock file.
work="$build/js-clients"
mkdir -p "$work"
cp "$here/a2a_clients.test.mjs" "$work/"
if ! cmp -s "$here/package-lock.json" "$work/package-lock.json" || [ ! -d "$work/node_modules" ]; then
  cp "$here/package.json" "$here/package-lock.json" "$work/"
  (cd "$work" && npm ci --no-audit --no-fund --loglevel=error) >&2
fi

tmp="$(mktemp -d)"
server_pid=""
cleanup() {
  [ -n "$server_pid" ] && kill -9 "$server_pid" 2>/dev/null || true
  [ -n "${pid_a:-}" ] && kill -9 "$pid_a" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT

# start SELECTOR: starts a server, sets $url and $server_pid.
start() {
  local out="$tmp/serve.out"
  : >"$out"
  "$bin" serve --listen 127.0.0.1:0 --agent approval --store "$1" --allow-push-target 127.0.0.0/8 \
    >"$out" 2>"$tmp/serve.err" &
  server_pid=$!
  for _ in $(seq 1 200); do
    if grep -q "^listening on " "$out"; then
      url="$(sed -n 's|^listening on \(http://[^/]*\)/.*|\1|p' "$out" | head -n 1)"
      return 0
    fi
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.05
  done
  echo "run.sh: the server on '$1' did not start:" >&2
  cat "$tmp/serve.err" >&2
  exit 1
}

stop() {
  kill -TERM "$server_pid" 2>/dev/null || true
  wait "$server_pid" 2>/dev/null || true
  server_pid=""
}

passed=0
failed=0
# client_run LABEL PHASE: runs the client tests against $url.
client_run() {
  echo "== $1"
  if (cd "$work" && TNX_URL="$url" TNX_PHASE="$2" TNX_STATE_FILE="$tmp/parked-id" \
        "$node" --test --test-reporter=spec a2a_clients.test.mjs); then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    echo "-- server log:"
    tail -n 40 "$tmp/serve.err"
  fi
}

for store in memory "file:$tmp/file-store" "sqlite:$tmp/sqlite/tasks.db"; do
  start "$store"
  client_run "store $store" flows
  stop
done

# One Task carried across a server that is killed outright.
start "file:$tmp/restart-store"
client_run "park a Task on file: before SIGKILL" park
kill -9 "$server_pid"
wait "$server_pid" 2>/dev/null || true
server_pid=""
start "file:$tmp/restart-store"
client_run "resume it on a new server" resume
stop

# Two replicas on one store: the second one's pid and URL kept aside.
start "sqlite:$tmp/replicas/tasks.db"
url_a="$url"
pid_a="$server_pid"
start "sqlite:$tmp/replicas/tasks.db"
echo "== two replicas on one sqlite: store"
if (cd "$work" && TNX_URL="$url_a" TNX_URL_B="$url" TNX_PHASE=replicas \
      "$node" --test --test-reporter=spec a2a_clients.test.mjs); then
  passed=$((passed + 1))
else
  failed=$((failed + 1))
  echo "-- server log (second replica):"
  tail -n 40 "$tmp/serve.err"
fi
stop
server_pid="$pid_a"
pid_a=""
stop

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]

#!/usr/bin/env bash
# tests/install/install_test.sh: installs toolnexus, builds the installed
# examples out of tree against that install only (the third-party plugin
# examples/plugin-kv and the embedding program examples/embed-agent), and
# holds them to everything a plugin author or an embedder is promised:
#
#   1. `cmake --install BUILD --prefix $TMP/prefix` gives the documented tree
#      (libraries, headers, CMake package, pkg-config files, plugin.map, the
#      examples)
#   2. the installed examples/plugin-kv configures and builds with
#      find_package(toolnexus) from that prefix alone, with RapidJSON hidden
#      (a plugin needs the header only), and `cmake --install` puts it in the
#      plugin dir; COMPONENTS server without RapidJSON fails saying why;
#      pkg-config toolnexus-sdk needs no RapidJSON either
#   3. libtnx_kv.so exports toolnexus_plugin_entry and nothing else
#   4. the installed toolnexus-conformance passes it ("N passed, 0 failed"),
#      and kv_log_test (built with the installed header only) checks what
#      conformance cannot: reopen, torn tails, corruption, locks, compaction
#   5. the installed tree is relocatable: moved to $TMP/prefix2, it still runs,
#      finds its default plugin directory and still works as a CMake package
#   6. the installed examples/embed-agent builds with find_package(toolnexus
#      COMPONENTS server) and with pkg-config toolnexus-server; it serves its
#      own AgentExecutor on a file: store, and a Task it parked in
#      input-required is on disk after it stops, survives the restart, and
#      then completes
#   7. if bin/toolnexus is installed: the seed's example 2 over HTTP with the
#      kv store: a Task parked in input-required survives a server restart and
#      then completes; `toolnexus store check` reads the log, and reports a
#      damaged one
#
# usage: install_test.sh BUILD_DIR SOURCE_DIR
# Needs: cmake, ninja (ninja-build: every configure here uses -G Ninja, as
# ./dev does, so `make` is not needed), a C compiler (cc, or $CC), a C++
# compiler (c++, or $CXX), nm (binutils), pkg-config, python3.
set -euo pipefail

if [ $# -ne 2 ]; then
  echo "usage: $0 BUILD_DIR SOURCE_DIR" >&2
  exit 2
fi
build="$(cd "$1" && pwd)"
src="$(cd "$2" && pwd)"
TMP="$(mktemp -d "${TMPDIR:-/tmp}/tnx-install-test.XXXXXX")"
# The conformance suite's {tmp} directories go under $TMP too.
export TMPDIR="$TMP"
# Only what this test puts in front of the programs may be found.
unset TOOLNEXUS_PLUGIN_PATH
servers=()
logs=()

cleanup() {
  local rc=$?
  local pid
  for pid in "${servers[@]}"; do
    kill -KILL "$pid" 2>/dev/null || true
  done
  if [ "$rc" -ne 0 ]; then
    for f in "${logs[@]}"; do
      if [ -s "$f" ]; then
        echo "---- $f (last 30 lines)" >&2
        tail -n 30 "$f" >&2
      fi
    done
    echo "install_test: FAILED (exit $rc); temp dir removed: $TMP" >&2
  fi
  rm -rf "$TMP"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

step() { printf '\n== %s\n' "$*"; }
ok() { printf '   ok: %s\n' "$*"; }
fail() {
  printf 'install_test: FAIL: %s\n' "$*" >&2
  exit 1
}
# Runs a command with its output in a log file; on failure shows the log.
run_logged() {
  local log="$1"
  shift
  logs+=("$log")
  if ! "$@" >"$log" 2>&1; then
    cat "$log" >&2
    fail "command failed: $*"
  fi
}

for tool in cmake ninja python3 nm pkg-config "${CC:-cc}" "${CXX:-c++}"; do
  command -v "$tool" >/dev/null 2>&1 || fail "'$tool' is not installed (needed by this test)"
done
# Every configure uses Ninja, the generator ./dev installs (CMake's default,
# Unix Makefiles, needs `make`, which ./dev does not install).
gen=(-G Ninja)

# --------------------------------------------------------------------------
step "1. cmake --install $build --prefix \$TMP/prefix"
prefix="$TMP/prefix"
run_logged "$TMP/install.log" cmake --install "$build" --prefix "$prefix"
examples="$prefix/share/doc/toolnexus/examples"
for f in include/toolnexus/task_store.h include/toolnexus/plugin.hpp include/toolnexus/server.hpp \
  include/toolnexus/agent_executor.hpp include/toolnexus/llm_executor.hpp lib/libtoolnexus.so lib/libtoolnexus_server.so \
  lib/cmake/toolnexus/toolnexusConfig.cmake lib/cmake/toolnexus/toolnexusConfigVersion.cmake \
  lib/cmake/toolnexus/toolnexusSdkTargets.cmake lib/cmake/toolnexus/toolnexusCoreTargets.cmake \
  lib/cmake/toolnexus/toolnexusServerTargets.cmake lib/pkgconfig/toolnexus-sdk.pc \
  lib/pkgconfig/toolnexus.pc lib/pkgconfig/toolnexus-server.pc share/toolnexus/plugin.map \
  share/doc/toolnexus/plugin-guide.md share/toolnexus/console/index.html share/toolnexus/console/app.js \
  bin/toolnexus-conformance; do
  [ -e "$prefix/$f" ] || fail "the install has no $f"
done
for f in plugin-kv/CMakeLists.txt plugin-kv/kv_plugin.c plugin-kv/kv_plugin.map embed-agent/CMakeLists.txt \
  embed-agent/main.cpp embed-agent/embed-agent.json; do
  [ -f "$examples/$f" ] || fail "the install has no example file share/doc/toolnexus/examples/$f"
done
ok "installed: $(cd "$prefix" && find . -type f | sort | tr '\n' ' ')"

# --------------------------------------------------------------------------
step "2. build the installed examples/plugin-kv against the installed package only, without RapidJSON"
# No package registry, nothing but the prefix: a stray toolnexus build or
# install elsewhere must not be what gets found. RapidJSON is hidden: a C
# plugin needs the ABI header and nothing else.
no_registry=(-DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF)
run_logged "$TMP/kv-configure.log" cmake -S "$examples/plugin-kv" -B "$TMP/kv-build" "${gen[@]}" \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" "${no_registry[@]}" -DTNX_KV_WERROR=ON \
  -DCMAKE_DISABLE_FIND_PACKAGE_RapidJSON=ON
found_dir="$(sed -n 's/^toolnexus_DIR:PATH=//p' "$TMP/kv-build/CMakeCache.txt")"
[ "$found_dir" = "$prefix/lib/cmake/toolnexus" ] ||
  fail "find_package(toolnexus) found '$found_dir', not the install at $prefix/lib/cmake/toolnexus"
ok "find_package(toolnexus) -> $found_dir"
run_logged "$TMP/kv-build.log" cmake --build "$TMP/kv-build"
so="$TMP/kv-build/libtnx_kv.so"
[ -f "$so" ] || fail "the example built no libtnx_kv.so"
ok "built $so (-std=c11 -Wall -Wextra -Wpedantic -Wshadow -Wconversion -Werror)"
run_logged "$TMP/kv-install.log" cmake --install "$TMP/kv-build"
[ -f "$prefix/lib/toolnexus/plugins/libtnx_kv.so" ] ||
  fail "cmake --install of the example did not put libtnx_kv.so in \${TOOLNEXUS_PLUGIN_INSTALL_DIR} ($prefix/lib/toolnexus/plugins)"
ok "cmake --install -> $prefix/lib/toolnexus/plugins/libtnx_kv.so"

# Asking for the server without RapidJSON fails, and says what is missing.
mkdir "$TMP/needs-server"
cat >"$TMP/needs-server/CMakeLists.txt" <<'EOF'
cmake_minimum_required(VERSION 3.20)
project(needs_server LANGUAGES NONE)
find_package(toolnexus 0.1 REQUIRED COMPONENTS server)
EOF
rc=0
cmake -S "$TMP/needs-server" -B "$TMP/needs-server/build" "${gen[@]}" -DCMAKE_PREFIX_PATH="$prefix" \
  "${no_registry[@]}" -DCMAKE_DISABLE_FIND_PACKAGE_RapidJSON=ON >"$TMP/needs-server.log" 2>&1 || rc=$?
logs+=("$TMP/needs-server.log")
[ "$rc" -ne 0 ] || fail "find_package(toolnexus COMPONENTS server) succeeded without RapidJSON"
# It must fail for RapidJSON, naming the package; a configure that failed
# before find_package (no generator, no compiler) says what really is missing.
if ! grep -q "rapidjson-dev" "$TMP/needs-server.log"; then
  cat "$TMP/needs-server.log" >&2
  fail "configuring find_package(toolnexus COMPONENTS server) without RapidJSON failed, but not naming" \
    "rapidjson-dev; CMake said: $(grep -m 1 -A 3 'CMake Error' "$TMP/needs-server.log" | tr -s ' \n' ' ')"
fi
ok "COMPONENTS server without RapidJSON: refused, naming rapidjson-dev"
# pkg-config, with only the install's .pc files visible (no RapidJSON.pc):
# the SDK needs nothing; core names its RapidJSON requirement.
sdk_cflags="$(PKG_CONFIG_LIBDIR="$prefix/lib/pkgconfig" pkg-config --cflags toolnexus-sdk)" ||
  fail "pkg-config --cflags toolnexus-sdk failed"
sdk_inc="${sdk_cflags#-I}"
sdk_inc="${sdk_inc%% *}"
[ "$(realpath "$sdk_inc")" = "$prefix/include" ] || fail "pkg-config --cflags toolnexus-sdk is '$sdk_cflags'"
if PKG_CONFIG_LIBDIR="$prefix/lib/pkgconfig" pkg-config --cflags toolnexus >/dev/null 2>&1; then
  fail "pkg-config toolnexus (core) does not require RapidJSON"
fi
[ "$(realpath "$(PKG_CONFIG_LIBDIR="$prefix/lib/pkgconfig" pkg-config --variable=plugin_version_script \
  toolnexus-sdk)")" = "$prefix/share/toolnexus/plugin.map" ] || fail "pkg-config toolnexus-sdk: wrong plugin_version_script"
ok "pkg-config --cflags toolnexus-sdk: $sdk_cflags (no RapidJSON needed)"

# --------------------------------------------------------------------------
step "3. exported symbols; fresh plugin dir"
exported="$(nm -D --defined-only "$so" | awk '{print $NF}' | sort | tr '\n' ' ')"
[ "$exported" = "toolnexus_plugin_entry " ] ||
  fail "libtnx_kv.so must export only toolnexus_plugin_entry, exports: $exported"
ok "nm -D --defined-only: $exported"
mkdir "$TMP/plugins"
cp "$so" "$TMP/plugins/"
ok "copied to \$TMP/plugins"

# --------------------------------------------------------------------------
step "4. toolnexus-conformance --plugin-dir \$TMP/plugins 'kv:{tmp}'"
conformance() { # PREFIX LOG [ARGS...]
  local p="$1" log="$2"
  shift 2
  logs+=("$log")
  local rc=0
  "$p/bin/toolnexus-conformance" "$@" >"$log" 2>&1 || rc=$?
  cat "$log"
  [ "$rc" -eq 0 ] || fail "toolnexus-conformance $* exited $rc"
  # The kv example has no save_batch (optional, ABI 1.3), no change feed
  # (optional, ABI 1.4) and no due index (optional, ABI 1.5): those rules are
  # skipped, saying so; nothing may fail.
  grep -Eq '^[0-9]+ passed, 0 failed(, [123] skipped)?$' "$log" || fail "toolnexus-conformance did not print 'N passed, 0 failed'"
  [ "$(grep -Ec '^[0-9]+ passed, 0 failed(, [123] skipped)?$' "$log")" -eq 1 ] || fail "unexpected conformance summary"
  if grep -Eq '^SKIP' "$log"; then
    ! grep -E '^SKIP' "$log" | grep -Evq '^SKIP (save-batch|change-feed|due-index) ' ||
      fail "a conformance rule other than save-batch, change-feed and due-index was skipped"
  fi
}
conformance "$prefix" "$TMP/conformance.log" --plugin-dir "$TMP/plugins" 'kv:{tmp}'
ok "$(tail -n 1 "$TMP/conformance.log")"

step "4b. kv_log_test: reopen, versions, torn tail, corruption, ?salvage, lock, compaction, cursors, err_cap"
# Compiled with the installed header alone: it is all a C host or plugin needs.
run_logged "$TMP/kv_log_test-build.log" "${CC:-cc}" -std=c11 -Wall -Wextra -Wpedantic -Werror \
  -I"$prefix/include" "$src/tests/install/kv_log_test.c" -o "$TMP/kv_log_test" -ldl
mkdir "$TMP/kv-scratch"
run_logged "$TMP/kv_log_test.log" "$TMP/kv_log_test" "$TMP/plugins/libtnx_kv.so" "$TMP/kv-scratch"
ok "$(tail -n 1 "$TMP/kv_log_test.log")"

# --------------------------------------------------------------------------
step "5. relocate: mv \$TMP/prefix \$TMP/prefix2"
mv "$prefix" "$TMP/prefix2"
prefix="$TMP/prefix2"
# No installed text file may still name the old location.
stale="$(grep -rlF "$TMP/prefix/" "$prefix" --include='*.cmake' --include='*.pc' --include='*.h' \
  --include='*.hpp' --include='*.json' 2>/dev/null || true)"
[ -z "$stale" ] || fail "installed files still name the old prefix: $stale"
stale="$(grep -rlF "$build" "$prefix" --include='*.cmake' --include='*.pc' --include='*.h' --include='*.hpp' \
  2>/dev/null || true)"
[ -z "$stale" ] || fail "installed files name the build tree $build: $stale"
conformance "$prefix" "$TMP/conformance2.log" --plugin-dir "$TMP/plugins" 'kv:{tmp}'
ok "moved tree, --plugin-dir: $(tail -n 1 "$TMP/conformance2.log")"
# Its own default directory <bin>/../lib/toolnexus/plugins, where the
# example's `cmake --install` put the plugin, moved along with it.
conformance "$prefix" "$TMP/conformance3.log" 'kv:{tmp}'
ok "moved tree, default plugin dir: $(tail -n 1 "$TMP/conformance3.log")"
# Still a working CMake package.
examples="$prefix/share/doc/toolnexus/examples"
run_logged "$TMP/kv-configure2.log" cmake -S "$examples/plugin-kv" -B "$TMP/kv-build2" "${gen[@]}" \
  -DCMAKE_PREFIX_PATH="$prefix" "${no_registry[@]}"
plugin_dir="$(sed -n 's/^TNX_KV_PLUGIN_DIR:PATH=//p' "$TMP/kv-build2/CMakeCache.txt")"
[ "$plugin_dir" = "$prefix/lib/toolnexus/plugins" ] ||
  fail "TOOLNEXUS_PLUGIN_INSTALL_DIR of the moved package is '$plugin_dir', want $prefix/lib/toolnexus/plugins"
ok "find_package from the moved prefix; TOOLNEXUS_PLUGIN_INSTALL_DIR=$plugin_dir"

# --------------------------------------------------------------------------
# Helpers of steps 6 and 7: A2A over HTTP with python3 only.
# A JSON-RPC call: rpc.py URL METHOD PARAMS_JSON [FIELD.PATH...] prints each
# field of the response (e.g. result.status.state; a number indexes a list:
# result.artifacts.0.name) on a line.
cat >"$TMP/rpc.py" <<'EOF'
import json, sys, urllib.error, urllib.request
url, method, params = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
body = json.dumps({"jsonrpc": "2.0", "id": "1", "method": method, "params": params}).encode()
req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never an http_proxy for 127.0.0.1
try:
    with opener.open(req, timeout=30) as r:
        resp = json.load(r)
except urllib.error.HTTPError as e:
    sys.exit(f"{method}: HTTP {e.code}: {e.read().decode(errors='replace')[:2000]}")
except Exception as e:
    sys.exit(f"{method} to {url} failed: {e}")
if "error" in resp:
    sys.exit(f"{method} returned a JSON-RPC error: {json.dumps(resp['error'])}")
for path in sys.argv[4:]:
    v = resp
    for k in path.split("."):
        if isinstance(v, list) and k.isdigit() and int(k) < len(v):
            v = v[int(k)]
            continue
        if not isinstance(v, dict) or k not in v:
            sys.exit(f"{method}: no {path} in the response {json.dumps(resp)[:2000]}")
        v = v[k]
    print(v if isinstance(v, str) else json.dumps(v))
EOF
rpc() { python3 "$TMP/rpc.py" "$@"; }

url=""
server_pid=""
start_server() { # N COMMAND... (a server printing "listening on URL" first)
  local out="$TMP/server$1.out" err="$TMP/server$1.err" line="" _ n="$1"
  shift
  logs+=("$err")
  "$@" >"$out" 2>"$err" &
  server_pid=$!
  servers+=("$server_pid")
  for _ in $(seq 1 200); do
    line="$(head -n 1 "$out" 2>/dev/null || true)"
    case "$line" in
      "listening on http://"*/) break ;;
    esac
    kill -0 "$server_pid" 2>/dev/null || fail "server $n exited before listening; stderr: $(cat "$err")"
    sleep 0.05
  done
  [[ "$line" =~ ^listening\ on\ (http://[^/]+:[0-9]+/)$ ]] ||
    fail "server $n's first stdout line is '$line', want 'listening on http://HOST:PORT/'"
  url="${BASH_REMATCH[1]}"
  ok "server $n (pid $server_pid): $line"
}
stop_server() { # N
  local _ rc=0
  kill -TERM "$server_pid"
  for _ in $(seq 1 300); do
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.05
  done
  kill -0 "$server_pid" 2>/dev/null && fail "server $1 still running 15 s after SIGTERM"
  wait "$server_pid" || rc=$?
  [ "$rc" -eq 0 ] || fail "server $1 exited $rc after SIGTERM, want 0"
  ok "server $1 stopped by SIGTERM, exit 0"
}
wait_state() { # ID WANT
  local _ state=""
  for _ in $(seq 1 200); do
    state="$(rpc "$url" GetTask "{\"id\":\"$1\"}" result.status.state)" || fail "GetTask $1 failed"
    [ "$state" = "$2" ] && break
    case "$state" in
      completed | canceled | failed | rejected) fail "task $1 ended in '$state' while waiting for '$2'" ;;
    esac
    sleep 0.05
  done
  [ "$state" = "$2" ] || fail "task $1 is '$state' after 10 s, want '$2'"
  ok "GetTask $1: $state"
}

# A stored Task file's field, read straight from disk (no server running).
stored_field() { # FILE FIELD.PATH (list items by index)
  python3 - "$1" "$2" <<'EOF'
import json, sys
v = json.load(open(sys.argv[1]))
for k in sys.argv[2].split("."):
    v = v[int(k)] if isinstance(v, list) else v[k]
print(v if isinstance(v, str) else json.dumps(v, sort_keys=True))
EOF
}

# --------------------------------------------------------------------------
step "6. examples/embed-agent: its own AgentExecutor on the installed server library"
# A sanitizer build of toolnexus (CI's second run) installs libraries that
# need the sanitizer runtime first in the program: build the example with
# the same -fsanitize then.
san=()
san_libs="$(ldd "$prefix/lib/libtoolnexus_server.so" | { grep -Eo 'lib(asan|ubsan)' || true; } | sort -u | tr '\n' ' ')"
case "$san_libs" in
  *asan*ubsan* | *ubsan*asan*) san=(-fsanitize=address,undefined) ;;
  *asan*) san=(-fsanitize=address) ;;
  *ubsan*) san=(-fsanitize=undefined) ;;
esac
[ ${#san[@]} -eq 0 ] || echo "   (the install is built with ${san[*]}: so is the example)"
run_logged "$TMP/embed-configure.log" cmake -S "$examples/embed-agent" -B "$TMP/embed-build" "${gen[@]}" \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix" "${no_registry[@]}" -DTNX_EMBED_WERROR=ON \
  -DCMAKE_CXX_FLAGS="${san[*]}" -DCMAKE_EXE_LINKER_FLAGS="${san[*]}"
found_dir="$(sed -n 's/^toolnexus_DIR:PATH=//p' "$TMP/embed-build/CMakeCache.txt")"
[ "$found_dir" = "$prefix/lib/cmake/toolnexus" ] ||
  fail "find_package(toolnexus COMPONENTS server) found '$found_dir', not $prefix/lib/cmake/toolnexus"
run_logged "$TMP/embed-build.log" cmake --build "$TMP/embed-build"
agent="$TMP/embed-build/embed-agent"
[ -x "$agent" ] || fail "the example built no embed-agent"
ok "built $agent with find_package(toolnexus COMPONENTS server) -> $found_dir"
grep -q "$prefix/lib" <<<"$(ldd "$agent" | grep libtoolnexus_server)" ||
  fail "embed-agent does not load libtoolnexus_server from the install: $(ldd "$agent")"
# The same source with pkg-config alone: toolnexus-server requires toolnexus,
# which requires RapidJSON (the system's RapidJSON.pc).
pc_flags="$(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags --libs toolnexus-server)" ||
  fail "pkg-config --cflags --libs toolnexus-server failed"
# shellcheck disable=SC2086
run_logged "$TMP/embed-pc-build.log" "${CXX:-c++}" -std=c++17 -Wall -Wextra -Werror "${san[@]}" \
  "$examples/embed-agent/main.cpp" -o "$TMP/embed-agent-pc" $pc_flags -Wl,-rpath,"$prefix/lib"
rc=0
"$TMP/embed-agent-pc" "$TMP/no-such-config.json" >"$TMP/embed-pc.out" 2>&1 || rc=$?
[ "$rc" -eq 2 ] && grep -q "cannot read the config file" "$TMP/embed-pc.out" ||
  fail "the pkg-config build of embed-agent: exit $rc: $(cat "$TMP/embed-pc.out")"
ok "built and ran with pkg-config toolnexus-server: $pc_flags"

cat >"$TMP/embed.json" <<EOF
{"listen": "127.0.0.1:0", "store": "file:$TMP/orders", "name": "order-desk-test",
 "currency": "EUR", "catalog": {"widget": 250, "gadget": 1999}}
EOF
start_server e1 "$agent" "$TMP/embed.json"
card="$(python3 - "${url}.well-known/agent-card.json" <<'EOF'
import json, sys, urllib.request
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
card = json.load(opener.open(sys.argv[1], timeout=30))
print(card["name"], card["skills"][0]["id"])
EOF
)" || fail "no agent card"
[ "$card" = "order-desk-test order" ] || fail "agent card name and skill: '$card', want 'order-desk-test order'"
ok "agent card: $card"
out="$(rpc "$url" SendMessage \
  '{"message":{"role":"user","messageId":"o1","parts":[{"kind":"text","text":"order 3 widgets"}]}}' \
  result.id result.contextId)" || fail "SendMessage o1 failed"
order_id="$(sed -n 1p <<<"$out")"
order_ctx="$(sed -n 2p <<<"$out")"
wait_state "$order_id" input-required
stop_server e1
file="$TMP/orders/$order_id.json"
[ -f "$file" ] || fail "no $file after the embed-agent stopped"
[ "$(stored_field "$file" status.state)" = input-required ] ||
  fail "on disk the order is '$(stored_field "$file" status.state)', want input-required"
quote="$(stored_field "$file" status.message.parts.0.text)"
[ "$quote" = 'Quote: 3 x widget = 7.50 EUR. Reply "confirm" to place the order or "cancel".' ] ||
  fail "the stored prompt is '$quote'"
ok "stopped; on disk: input-required, '$quote'"

# The price changes before the confirmation: the saved quote holds.
sed -i 's/"widget": 250/"widget": 999/' "$TMP/embed.json"
start_server e2 "$agent" "$TMP/embed.json"
state="$(rpc "$url" GetTask "{\"id\":\"$order_id\"}" result.status.state)" || fail "GetTask after restart failed"
[ "$state" = input-required ] || fail "after the restart the order is '$state', want input-required"
rpc "$url" SendMessage "{\"message\":{\"taskId\":\"$order_id\",\"contextId\":\"$order_ctx\",\"role\":\"user\",\
\"messageId\":\"o2\",\"parts\":[{\"kind\":\"text\",\"text\":\"confirm\"}]}}" result.id >/dev/null ||
  fail "SendMessage o2 (confirm) failed"
wait_state "$order_id" completed
placed="$(rpc "$url" GetTask "{\"id\":\"$order_id\"}" result.artifacts.0.parts.0.text 2>&1)" ||
  fail "GetTask of the placed order failed: $placed"
[ "$placed" = "Order placed: 3 x widget = 7.50 EUR" ] || fail "GetTask: the order artifact's text is '$placed'"
stop_server e2
[ "$(stored_field "$file" status.state)" = completed ] || fail "on disk the order is not completed"
[ "$(stored_field "$file" artifacts.0.parts.0.text)" = "Order placed: 3 x widget = 7.50 EUR" ] ||
  fail "order artifact text: $(stored_field "$file" artifacts.0.parts.0.text)"
python3 - "$(stored_field "$file" artifacts.0.parts.1.data)" "$order_id" <<'EOF' || fail "the order artifact's data part"
import json, sys
d = json.loads(sys.argv[1])
want = {"item": "widget", "quantity": 3, "unitCents": 250, "totalCents": 750, "currency": "EUR",
        "orderId": sys.argv[2]}
sys.exit(0 if d == want else f"got {d}, want {want}")
EOF
ok "restarted, confirmed: completed at the quoted price: $(stored_field "$file" artifacts.0.parts.1.data)"

# --------------------------------------------------------------------------
step "7. toolnexus serve with the kv store: seed example 2 across a restart"
tnx="$prefix/bin/toolnexus"
if [ ! -x "$tnx" ]; then
  echo "   SKIPPED: $tnx is not installed (bin/toolnexus not built yet)"
  printf '\ninstall_test: PASS (steps 1-6; step 7 skipped: no bin/toolnexus)\n'
  exit 0
fi
kv_serve=("$tnx" serve --listen 127.0.0.1:0 --plugin-dir "$TMP/plugins" --store "kv:$TMP/kvdata" --agent approval)

start_server 1 "${kv_serve[@]}"
out="$(rpc "$url" SendMessage \
  '{"message":{"role":"user","messageId":"m1","parts":[{"kind":"text","text":"go"}]}}' result.id result.contextId)" ||
  fail "SendMessage m1 failed"
task_id="$(sed -n 1p <<<"$out")"
context_id="$(sed -n 2p <<<"$out")"
if [ -z "$task_id" ] || [ -z "$context_id" ]; then fail "SendMessage gave no task id / contextId: $out"; fi
ok "SendMessage m1 -> task $task_id, context $context_id"
wait_state "$task_id" input-required
stop_server 1
[ -s "$TMP/kvdata/tasks.kvlog" ] || fail "no $TMP/kvdata/tasks.kvlog after the first server"

start_server 2 "${kv_serve[@]}" --console
# The console's files, found by the moved program beside itself
# (<bin>/../share/toolnexus/console).
console_check="$(python3 - "${url}console/" <<'EOF'
import sys, urllib.request
with urllib.request.urlopen(sys.argv[1]) as r:
    print(r.status, "script-src 'self'" in r.headers.get("Content-Security-Policy", ""), b"app.js" in r.read())
EOF
)" || fail "GET ${url}console/ failed"
[ "$console_check" = "200 True True" ] || fail "GET ${url}console/: '$console_check', want '200 True True'"
ok "serve --console from the moved prefix: GET /console/ 200 with its CSP"
state="$(rpc "$url" GetTask "{\"id\":\"$task_id\"}" result.status.state)" || fail "GetTask after restart failed"
[ "$state" = input-required ] || fail "after the restart task $task_id is '$state', want input-required"
ok "after restart, GetTask $task_id: $state"
rpc "$url" SendMessage "{\"message\":{\"taskId\":\"$task_id\",\"contextId\":\"$context_id\",\"role\":\"user\",\
\"messageId\":\"m2\",\"parts\":[{\"kind\":\"text\",\"text\":\"approve\"}]}}" result.id >/dev/null ||
  fail "SendMessage m2 (approve) failed"
ok "SendMessage m2 approve"
wait_state "$task_id" completed
stop_server 2

if "$tnx" store --help >/dev/null 2>&1; then
  step "7b. toolnexus store check on the kv log, sound and damaged"
  logs+=("$TMP/check.out")
  "$tnx" store check --plugin-dir "$TMP/plugins" "kv:$TMP/kvdata" >"$TMP/check.out" 2>&1 ||
    fail "store check of the sound log failed: $(cat "$TMP/check.out")"
  grep -q ' 0 bad$' "$TMP/check.out" || fail "store check: $(cat "$TMP/check.out")"
  ok "store check kv:\$TMP/kvdata: $(tail -n 1 "$TMP/check.out")"
  # Damage the middle of the log: the first record's payload, with the
  # records after it intact. Open must refuse; ?salvage must report it.
  python3 - "$TMP/kvdata/tasks.kvlog" <<'EOF'
import sys
p = sys.argv[1]
b = bytearray(open(p, "rb").read())
b[32 + 56 + 2] ^= 0x20  # file header (32), first record's header (56), into its payload
open(p, "wb").write(b)
EOF
  rc=0
  "$tnx" store check --plugin-dir "$TMP/plugins" "kv:$TMP/kvdata" >"$TMP/check.out" 2>&1 || rc=$?
  [ "$rc" -ne 0 ] || fail "store check of a damaged log succeeded: $(cat "$TMP/check.out")"
  grep -q 'corrupt record at offset 32' "$TMP/check.out" ||
    fail "the damaged log's error does not name the offset: $(cat "$TMP/check.out")"
  ok "damaged log refused (exit $rc): $(grep -o "corrupt record at offset [0-9]*" "$TMP/check.out" | head -n 1)"
  rc=0
  "$tnx" store check --plugin-dir "$TMP/plugins" "kv:$TMP/kvdata?salvage" >"$TMP/check.out" 2>&1 || rc=$?
  if [ "$rc" -ne 1 ] || ! grep -q 'BAD tasks.kvlog@' "$TMP/check.out"; then
    fail "store check with ?salvage should exit 1 listing the damaged stretch: exit $rc: $(cat "$TMP/check.out")"
  fi
  ok "?salvage: $(grep 'BAD' "$TMP/check.out" | head -n 1 | cut -c1-100)"
fi

printf '\ninstall_test: PASS\n'

#!/usr/bin/env bash
# tests/dev_test.sh: what `./dev` installs and how it configures, on a machine
# where no package is installed, with apt-get, dpkg-query, sudo, cmake, ctest
# and the built server replaced by stand-ins that record their arguments:
#
#   ./dev serve  installs exactly the serving packages (curl among them, for
#                the README's first request; no PostgreSQL server, no
#                doctest, no Node.js), configures with
#                -DTOOLNEXUS_BUILD_TESTS=OFF and runs `toolnexus serve ARGS`
#   ./dev test   installs the serving and the test packages, configures with
#                -DTOOLNEXUS_BUILD_TESTS=ON and runs ctest; adds Debian's
#                nodejs and npm only where node or npm is missing
#   ./dev serve  once the test packages are there: no OFF (a test build stays)
#   as a user other than root, apt-get runs through sudo
#
# usage: dev_test.sh SOURCE_DIR
set -euo pipefail
src="$(cd "$1" && pwd)"
TMP="$(mktemp -d "${TMPDIR:-/tmp}/tnx-dev-test.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT
fail() {
  echo "dev_test: FAIL: $*" >&2
  exit 1
}

shims="$TMP/shims"
mkdir -p "$shims" "$TMP/build/bin"
log="$TMP/log"
# dpkg-query: the packages listed in $TMP/installed are installed.
cat >"$shims/dpkg-query" <<EOF
#!/usr/bin/env bash
pkg="\${@: -1}"
if grep -qx "\$pkg" "$TMP/installed" 2>/dev/null; then printf 'install ok installed'; exit 0; fi
exit 1
EOF
for tool in apt-get cmake ctest; do
  printf '#!/usr/bin/env bash\necho "%s $*" >>"%s"\n' "$tool" "$log" >"$shims/$tool"
done
printf '#!/usr/bin/env bash\necho "sudo $1" >>"%s"\nexec "$@"\n' "$log" >"$shims/sudo"
printf '#!/usr/bin/env bash\necho "toolnexus $*" >>"%s"\n' "$log" >"$TMP/build/bin/toolnexus"
# id -u: the user given in $TMP/uid (default root).
printf '#!/usr/bin/env bash\nif [ "$1" = -u ]; then cat "%s/uid" 2>/dev/null || echo 0; else exec /usr/bin/id "$@"; fi\n' \
  "$TMP" >"$shims/id"
chmod +x "$shims"/* "$TMP/build/bin/toolnexus"

# PATH holds no node and npm (./dev decides on them by PATH), only the tools
# ./dev and the stand-ins use; tests put stand-ins for node and npm in
# $node_dir when a machine should have them.
rest="$TMP/rest"
node_dir="$TMP/node"
mkdir -p "$rest" "$node_dir"
for tool in bash env dirname nproc grep sed cat; do
  ln -s "$(command -v "$tool")" "$rest/$tool" || fail "no $tool on PATH"
done

run_dev() { # ARGS...
  : >"$log"
  PATH="$shims:$node_dir:$rest" BUILD_DIR="$TMP/build" TOOLNEXUS_JOBS=1 "$src/dev" "$@" >"$TMP/out" 2>&1 ||
    fail "./dev $* exited non-zero: $(cat "$TMP/out")"
}
installs() { sed -n 's/^apt-get install -y -q --no-install-recommends //p' "$log"; }

serve_pkgs="g++ cmake ninja-build pkg-config libisal-dev libsodium-dev libboost-dev libpoco-dev rapidjson-dev libsqlite3-dev libpq-dev curl"
test_pkgs="binutils doctest-dev sqlite3 postgresql python3 chromium python3-prometheus-client"

# 1. serve on a fresh machine.
: >"$TMP/installed"
run_dev serve --listen 127.0.0.1:9999
[ "$(installs)" = "$serve_pkgs" ] || fail "./dev serve installs '$(installs)', want '$serve_pkgs'"
grep -q '^cmake -S .* -G Ninja -DTOOLNEXUS_BUILD_TESTS=OFF' "$log" ||
  fail "./dev serve without the test packages must configure with TOOLNEXUS_BUILD_TESTS=OFF: $(cat "$log")"
grep -q '^cmake --build .* --target toolnexus --target tnx_memory' "$log" || fail "./dev serve builds: $(cat "$log")"
tail -n 1 "$log" | grep -qx 'toolnexus serve --listen 127.0.0.1:9999' || fail "./dev serve runs: $(tail -n 1 "$log")"
echo "ok: ./dev serve installs only: $(installs)"

# 2. test: everything, tests on; on a machine without node and npm, Debian's.
tr ' ' '\n' <<<"$serve_pkgs" >"$TMP/installed"
run_dev test
want="$test_pkgs nodejs npm"
[ "$(installs)" = "$want" ] || fail "./dev test without node installs '$(installs)', want '$want'"
grep -q '^cmake -S .* -G Ninja -DTOOLNEXUS_BUILD_TESTS=ON' "$log" || fail "./dev test configures: $(cat "$log")"
grep -q '^ctest --output-on-failure' "$log" || fail "./dev test does not run ctest: $(cat "$log")"
echo "ok: ./dev test adds: $(installs)"

# 2b. a machine's own node and npm are kept (whatever their version: the
# client tests bring node 20 themselves when it is older); node without npm
# is not enough.
printf '#!/bin/sh\nexit 0\n' >"$node_dir/node"
chmod +x "$node_dir/node"
run_dev test
want="$test_pkgs nodejs npm"
[ "$(installs)" = "$want" ] || fail "./dev test with node but no npm installs '$(installs)', want '$want'"
cp "$node_dir/node" "$node_dir/npm"
run_dev test
[ "$(installs)" = "$test_pkgs" ] || fail "./dev test with node and npm installs '$(installs)', want '$test_pkgs'"
echo "ok: ./dev test keeps the machine's node and npm"
rm -f "$node_dir/node" "$node_dir/npm"

# 3. serve once everything is installed: nothing to install, the tests stay
# configured (no OFF).
tr ' ' '\n' <<<"$serve_pkgs $test_pkgs" >"$TMP/installed"
run_dev serve
[ -z "$(installs)" ] || fail "./dev serve with everything installed still installs '$(installs)'"
if grep -q 'TOOLNEXUS_BUILD_TESTS=OFF' "$log"; then fail "./dev serve turned the tests off: $(cat "$log")"; fi
echo "ok: ./dev serve with the test packages installed keeps the test build"

# 4. not root: through sudo.
: >"$TMP/installed"
echo 1000 >"$TMP/uid"
run_dev serve
grep -q '^sudo apt-get$' "$log" || fail "as uid 1000, apt-get must run through sudo: $(cat "$log")"
echo "ok: as a user, apt-get runs through sudo"
echo "dev_test: PASS"

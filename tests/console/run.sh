#!/usr/bin/env bash
# The approval console in a real browser (issue 24 part 1): installs the
# pinned puppeteer-core (package.json / package-lock.json here) with `npm ci`
# into BUILD_DIR/console-test, then runs console.test.mjs under node's test
# runner. The test starts its own fake model and `toolnexus serve --console
# --agent llm`, drives Debian's chromium (headless) through the page, and
# writes the screenshots docs/console.md shows into SOURCE_DIR/docs/console/.
#   usage: run.sh BUILD_DIR SOURCE_DIR
# Needs npm on PATH and the npm registry, node >= 20 (see ../clients/node.sh)
# and chromium (CHROMIUM overrides /usr/bin/chromium).
set -euo pipefail
build="$(cd "$1" && pwd)"
src="$(cd "$2" && pwd)"
here="$src/tests/console"

command -v npm >/dev/null ||
  { echo "run.sh: npm is required to install the pinned puppeteer-core (Debian: apt-get install npm)" >&2; exit 1; }
chromium="${CHROMIUM:-/usr/bin/chromium}"
[ -x "$chromium" ] ||
  { echo "run.sh: $chromium is missing: the console test drives Debian's chromium (apt-get install chromium)" >&2; exit 1; }
. "$src/tests/clients/node.sh"
find_node "$build"
echo "run.sh: node $("$node" --version) ($node), $("$chromium" --version 2>/dev/null)"

work="$build/console-test"
mkdir -p "$work"
cp "$here/console.test.mjs" "$here/console_jwt.test.mjs" "$here/serve.mjs" "$here/fake_model.mjs" "$here/sse.test.mjs" "$work/"
if ! cmp -s "$here/package-lock.json" "$work/package-lock.json" || [ ! -d "$work/node_modules" ]; then
  cp "$here/package.json" "$here/package-lock.json" "$work/"
  (cd "$work" && npm ci --no-audit --no-fund --loglevel=error) >&2
fi
cd "$work"
TNX_BIN="$build/bin/toolnexus" TNX_CHROMIUM="$chromium" TNX_SHOTS="$src/docs/console" TNX_CONSOLE_DIR="$src/console" \
  exec "$node" --test --test-reporter=spec sse.test.mjs console.test.mjs console_jwt.test.mjs

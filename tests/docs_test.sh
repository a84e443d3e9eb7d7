#!/usr/bin/env bash
# Runs every ```sh block of docs/*.md, so the docs cannot rot: the blocks of
# one page run in order in one bash (variables carry over), in a fresh
# directory, with the build's bin/ first on PATH, PREFIX a fresh install of
# the build (`cmake --install BUILD --prefix $PREFIX`, for the blocks that
# build against an installed toolnexus), set -euo pipefail, and
# 127.0.0.1:8080 replaced by a free port. Blocks tagged otherwise (```shell,
# ```json, ```cmake, ```c) are not run.
#   usage: docs_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build="$1"
src="$2"
export PATH="$build/bin:$PATH"
unset TOOLNEXUS_PLUGIN_PATH
install_dir="$(mktemp -d)"
trap 'rm -rf "$install_dir"' EXIT
export PREFIX="$install_dir/prefix"
cmake --install "$build" --prefix "$PREFIX" >"$install_dir/install.log" 2>&1 ||
  { cat "$install_dir/install.log"; echo "docs_test: cmake --install failed"; exit 1; }
failed=0
ran=0
for doc in "$src"/docs/*.md; do
  script="$(awk '/^```sh$/{f=1;next} /^```/{f=0} f' "$doc")"
  [ -n "$script" ] || continue
  port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
  script="${script//127.0.0.1:8080/127.0.0.1:$port}"
  work="$(mktemp -d)"
  echo "== $(basename "$doc") (port $port, in $work)"
  if (cd "$work" && timeout 120 bash -c "set -euo pipefail; trap 'kill \$(jobs -p) 2>/dev/null || true' EXIT
$script" >"$work/.out" 2>&1); then
    echo "   ok"
  else
    echo "   FAILED; output:"
    sed 's/^/   | /' "$work/.out"
    failed=$((failed + 1))
  fi
  ran=$((ran + 1))
  rm -rf "$work"
done
echo "$((ran - failed)) passed, $failed failed"
[ "$failed" -eq 0 ] && [ "$ran" -gt 0 ]

#!/usr/bin/env bash
# The docs test: runs the ```sh blocks of docs/*.md, README.md and
# examples/*/README.md and compares what they print with the ```output block
# that follows them; checks the numbers in prose that no block prints (the
# ABI version). The convention for writing pages is in tests/docs_test.py.
# This script installs the build into a fresh PREFIX (for the blocks that
# build against an installed toolnexus), then runs docs_test.py.
#   usage: docs_test.sh BUILD_DIR SOURCE_DIR   (by hand: bash tests/docs_test.sh build .)
set -euo pipefail
build="$(cd "$1" && pwd)"
src="$(cd "$2" && pwd)"
install_dir="$(mktemp -d)"
trap 'rm -rf "$install_dir"' EXIT
cmake --install "$build" --prefix "$install_dir/prefix" >"$install_dir/install.log" 2>&1 ||
  { cat "$install_dir/install.log"; echo "docs_test: cmake --install failed"; exit 1; }
python3 "$src/tests/docs_test.py" "$build" "$src" "$install_dir/prefix"

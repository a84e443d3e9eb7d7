# tests/clients/node.sh: sourced by the node test drivers (clients/run.sh,
# console/run.sh). find_node BUILD_DIR sets $node to a node >= 20: the
# machine's node if it is 20 or newer, otherwise (Debian 12 ships node 18)
# the official Node.js 20 build published in the npm registry, pinned in
# tests/clients/node20/package-lock.json and installed once with `npm ci`
# into BUILD_DIR/node20 (nothing is installed outside the build directory).
# Exits 1, saying why, when neither can be had. Needs npm on PATH.
node_lock_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/node20"

node_major() { "$1" -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0; }

find_node() {
  local build="$1" here
  here="$(dirname "$node_lock_dir")"

  # 0. node >= 20. npm itself keeps running on the machine's node (Debian's npm
  # is built for Debian's node); only the tests run on $node.
  sys_node="$(command -v node || true)"
  node="$sys_node"
  if [ -z "$node" ] || [ "$(node_major "$node")" -lt 20 ]; then
    case "$(uname -m)" in
      x86_64) cpu=x64 ;;
      aarch64 | arm64) cpu=arm64 ;;
      *) echo "run.sh: tests/clients/node20 pins node 20 for x86_64 and arm64; this machine is $(uname -m):" \
        "install node >= 20 on it" >&2; exit 1 ;;
    esac
    n20="$build/node20"
    node="$n20/node_modules/node-linux-$cpu/bin/node"
    # Installed once per lock file: the stamp is written after a whole install.
    if ! cmp -s "$here/node20/package-lock.json" "$n20/installed.lock" || [ ! -x "$node" ]; then
      have="missing"
      [ -z "$sys_node" ] || have="$("$sys_node" --version)"
      echo "run.sh: the machine's node is $have; installing node 20 from the npm registry into $n20" >&2
      rm -rf "$n20"
      mkdir -p "$n20"
      cp "$here/node20/package.json" "$here/node20/package-lock.json" "$n20/"
      (cd "$n20" && npm ci --no-audit --no-fund --loglevel=error) >&2
      if [ ! -x "$node" ]; then
        # npm skips an optional dependency it could not fetch without saying
        # why: ask for that one package again, so that npm shows its error.
        want="$(sed -n "s/.*\"node-linux-$cpu\": \"\([0-9.]*\)\".*/\1/p" "$here/node20/package.json")"
        (cd "$n20" && npm install --no-save --no-audit --no-fund --loglevel=error "node-linux-$cpu@$want") >&2 ||
          { echo "run.sh: npm could not install node-linux-$cpu@$want (node 20) from the npm registry: npm's" \
            "error is above" >&2; exit 1; }
      fi
      [ -x "$node" ] || { echo "run.sh: npm installed no $node" >&2; exit 1; }
      cp "$here/node20/package-lock.json" "$n20/installed.lock"
    fi
  fi
}

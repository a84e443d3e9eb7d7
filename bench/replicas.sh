#!/bin/sh
# bench/replicas.sh: blocking SendMessage throughput of 1, 2 and 3
# `toolnexus serve` replicas on one store (issue 20's numbers), each replica a
# process of its own, loaded together by server_load (connection i goes to
# replica i mod N).
#
#   bench/replicas.sh BUILD_DIR [SELECTOR] [SECONDS]
#
# SELECTOR defaults to a throwaway PostgreSQL cluster started with
# tests/postgres/pg_cluster.sh (needs the postgresql package) and stopped at
# the end; every run uses a table of its own. Prints server_load's lines for
# SendMessage per replica count, then the ratios to one replica.
set -eu
build=${1:?usage: bench/replicas.sh BUILD_DIR [SELECTOR] [SECONDS]}
selector=${2:-}
seconds=${3:-5}
here=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/tnx-replicas-XXXXXX")
pids=""
cleanup() {
  for p in $pids; do kill "$p" 2>/dev/null || true; done
  for p in $pids; do wait "$p" 2>/dev/null || true; done
  if [ -f "$work/pg/uri" ]; then sh "$here/tests/postgres/pg_cluster.sh" stop "$work/pg" >/dev/null 2>&1 || true; fi
  rm -rf "$work"
}
trap cleanup EXIT INT TERM
if [ -z "$selector" ]; then
  sh "$here/tests/postgres/pg_cluster.sh" start "$work/pg" >/dev/null
  selector=$(cat "$work/pg/uri")
fi
case $selector in
  *\?*) sep='&' ;;
  *) sep='?' ;;
esac

for n in 1 2 3; do
  case $selector in
    postgres*) sel="${selector}${sep}tnx_table=replicas_$n" ;;
    *) sel=$selector ;;
  esac
  urls=""
  pids=""
  for i in $(seq 1 "$n"); do
    "$build/bin/toolnexus" serve --listen 127.0.0.1:0 --store "$sel" >"$work/out.$n.$i" 2>"$work/err.$n.$i" &
    pids="$pids $!"
    for _ in $(seq 1 200); do grep -qs '^listening on' "$work/out.$n.$i" && break; sleep 0.05; done
    url=$(sed -n 's#^listening on \(http://[^ ]*\)#\1#p' "$work/out.$n.$i")
    [ -n "$url" ] || { echo "replica $i did not start:" >&2; cat "$work/err.$n.$i" >&2; exit 1; }
    urls="$urls --url $url"
  done
  # shellcheck disable=SC2086
  line=$("$build/bin/server_load" $urls --method send --blocking --dialect 1.0 --seconds "$seconds" \
         --connections 64 | grep 'req/s' | head -1)
  echo "$n replica(s): $line"
  echo "$line" | sed -n 's/.* \([0-9][0-9.]*\) req\/s.*/\1/p' >"$work/rate.$n"
  for p in $pids; do kill "$p"; done
  for p in $pids; do wait "$p" 2>/dev/null || true; done
  pids=""
done
r1=$(cat "$work/rate.1")
for n in 2 3; do
  rn=$(cat "$work/rate.$n")
  [ -n "$r1" ] && [ -n "$rn" ] && awk -v a="$rn" -v b="$r1" -v n="$n" 'BEGIN { printf "%d replicas: %.2fx the throughput of one\n", n, a / b }'
done

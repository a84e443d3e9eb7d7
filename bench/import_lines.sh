#!/bin/sh
# bench/import_lines.sh: `toolnexus store put` of N Tasks as JSON lines into
# each SELECTOR given: Tasks/s and the peak RSS (GNU time's "Maximum
# resident set size"). The input (about 600 bytes a Task: a status message,
# one history message, one artifact) is written to $TMPDIR first.
#   bench/import_lines.sh BUILD N SELECTOR...
#   bench/import_lines.sh build 1000000 file:/var/tmp/imp/f sqlite:/var/tmp/imp/t.db
# Each SELECTOR should name a store that does not exist yet; a store put
# into is left as it is (remove it afterwards). Needs /usr/bin/time (Debian
# package `time`) and python3.
set -eu
build=$1
n=$2
shift 2
input=$(mktemp "${TMPDIR:-/tmp}/tnx-import-XXXXXX.jsonl")
trap 'rm -f "$input" "$input.time"' EXIT
python3 - "$n" >"$input" <<'EOF'
import sys
n = int(sys.argv[1])
out = sys.stdout
for i in range(n):
    s = 1767225600 + i
    ts = "2026-%02d-%02dT%02d:%02d:%02dZ" % (1 + (s // 2419200) % 12, 1 + (s // 86400) % 28, (s // 3600) % 24, (s // 60) % 60, s % 60)
    out.write('{"id":"task-%07d","contextId":"ctx-%05d","kind":"task","status":{"state":"completed",'
              '"timestamp":"%s","message":{"role":"agent","parts":[{"kind":"text","text":"done"}],'
              '"messageId":"m-%07d-2","kind":"message"}},"history":[{"role":"user","parts":[{"kind":"text",'
              '"text":"please summarise document %d"}],"messageId":"m-%07d-1","kind":"message"}],'
              '"artifacts":[{"artifactId":"a-%07d","parts":[{"kind":"text","text":"summary of document %d: '
              'lorem ipsum dolor sit amet"}]}]}\n' % (i, i % 50000, ts, i, i, i, i, i))
EOF
echo "input: $n Tasks, $(du -h "$input" | cut -f1)"
for sel in "$@"; do
  start=$(date +%s.%N)
  /usr/bin/time -v "$build/bin/toolnexus" store put "$sel" "$input" 2>"$input.time" >/dev/null || {
    cat "$input.time" >&2
    exit 1
  }
  end=$(date +%s.%N)
  rss=$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$input.time")
  user=$(sed -n 's/.*User time (seconds): //p' "$input.time")
  sys=$(sed -n 's/.*System time (seconds): //p' "$input.time")
  # CPU seconds too: on a shared machine the wall time says more about the
  # neighbours than about the put.
  awk -v n="$n" -v a="$start" -v b="$end" -v rss="$rss" -v sel="$sel" -v u="$user" -v s="$sys" \
    'BEGIN { printf "%s: %d Tasks in %.1f s: %.0f Tasks/s, max RSS %.0f MiB; CPU %.1f s user + %.1f s sys (%.0f Tasks per CPU second)\n",
             sel, n, b - a, n / (b - a), rss / 1024, u, s, n / (u + s) }'
done

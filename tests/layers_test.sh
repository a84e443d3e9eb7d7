#!/usr/bin/env bash
# server/src is in layers (docs/architecture.md, "server/ in layers"): each
# folder may include only the folders below it. This test reads every
# `#include "<folder>/..."` of server/src and fails, naming file, line and
# rule, on any include a folder's rule does not allow, and on a file in a
# folder it does not know (a new folder needs a rule here and in the docs).
# The Task domain (domain/) knows Tasks, events and the store, never the
# wire (HTTP, JSON-RPC, REST, SSE, dialect views).
#   usage: layers_test.sh SOURCE_DIR
set -euo pipefail
src="${1:?usage: layers_test.sh SOURCE_DIR}/server/src"

# folder -> the server/src folders its files may include (besides itself).
declare -A allowed=(
  [common]=""
  [domain]="common"
  [agents]="common"
  [wire]="common domain"
  [delivery]="common domain wire"
  [service]="common domain wire delivery"
  [bindings]="common domain wire delivery service"
)
failed=0
checked=0
while IFS= read -r -d '' file; do
  rel="${file#"$src"/}"
  folder="${rel%%/*}"
  [ "$folder" = "$rel" ] && continue  # server.cpp, at the top, assembles every layer
  if [ -z "${allowed[$folder]+set}" ]; then
    echo "layers_test: $rel: folder '$folder' has no rule (add it to tests/layers_test.sh and docs/architecture.md)"
    failed=$((failed + 1))
    continue
  fi
  while IFS=: read -r line target; do
    checked=$((checked + 1))
    dep="${target%%/*}"
    [ "$dep" = "$folder" ] && continue
    case " ${allowed[$folder]} " in
      *" $dep "*) ;;
      *)
        echo "layers_test: $rel:$line includes \"$target\": $folder/ may include only: ${allowed[$folder]:-nothing of server/src}"
        failed=$((failed + 1))
        ;;
    esac
  done < <(grep -n -o -E '^#include "[a-z_]+/[^"]+"' "$file" | sed -E 's/^([0-9]+):#include "([^"]+)"/\1:\2/' |
           grep -v -E '^[0-9]+:toolnexus/' || true)
done < <(find "$src" -type f \( -name '*.cpp' -o -name '*.hpp' \) -print0)
# Every include must name its folder: a bare "x.hpp" would hide a layer.
while IFS= read -r hit; do
  echo "layers_test: ${hit#"$src"/}: include without its folder"
  failed=$((failed + 1))
done < <(grep -rn -E '^#include "[^/"]+"' "$src" || true)
echo "layers_test: $checked includes checked, $failed violations"
[ "$failed" -eq 0 ]

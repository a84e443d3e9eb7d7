#!/usr/bin/env bash
# bench/chaos_run.sh: the chaos test (tests/server_chaos_test.cpp: the Task
# lifecycle over `faults:...;sqlite:FILE`) once per seed, longer than CTest's
# one fixed seed. Prints each seed's summary and the seeds that failed.
#   usage: bench/chaos_run.sh BUILD_DIR [SEEDS (default 20)] [TASKS per seed (default 200)]
set -euo pipefail
build="$(cd "${1:?usage: chaos_run.sh BUILD_DIR [SEEDS] [TASKS]}" && pwd)"
seeds="${2:-20}"
tasks="${3:-200}"
export TOOLNEXUS_PLUGIN_PATH="$build/lib/toolnexus/plugins"
failed=()
for seed in $(seq 1 "$seeds"); do
  out="$(TNX_CHAOS_SEED=$seed TNX_CHAOS_TASKS=$tasks "$build/bin/server_chaos_test" --success=false 2>&1)" || failed+=("$seed")
  printf '%s\n' "$out" | grep -E "requests,|  [0-9]+ x |push config" | sed "s/^/seed $seed: /" | sed 's/  */ /g'
  case " ${failed[*]-} " in *" $seed "*) printf '%s\n' "$out" | grep -E "ERROR|CHECK|REQUIRE" | head -20 ;; esac
done
echo "chaos_run: $seeds seeds x $tasks Tasks: ${#failed[@]} failed${failed:+ (seeds ${failed[*]})}"
[ ${#failed[@]} -eq 0 ]

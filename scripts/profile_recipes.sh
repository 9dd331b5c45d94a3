#!/usr/bin/env bash
# Profiles one training step (step 10, after warm-up) of each recipe on one GPU and summarizes where its time
# goes (scripts/profile_summary.py: wall, GPU busy, kernel count, top kernels, host time of the plugin's ops).
# Usage: bash scripts/profile_recipes.sh OUT_DIR configs/a.toml [configs/b.toml ...]   (extra trainer flags: ARGS)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=$1; shift
mkdir -p "$OUT"
for config in "$@"; do
  name=$(basename "$config" .toml)
  dump="${TMPDIR:-/tmp}/profile_recipes/$name"
  rm -rf "$dump"
  timeout "${RUN_TIMEOUT:-240}" python3 -m titan_fp4six.train --job.config_file "$config" --training.steps 11 \
    --profiling.enable_profiling --profiling.profile_freq 10 --profiling.profiler_warmup 2 \
    --profiling.profiler_active 1 --metrics.log_freq 1 --metrics.disable_color_printing \
    --job.dump_folder "$dump" ${ARGS:-} > "$OUT/$name.log" 2>&1 || { echo "$name failed"; tail -20 "$OUT/$name.log"; continue; }
  trace=$(ls "$dump"/profile_traces/iteration_10/rank0_trace.json)
  python3 scripts/profile_summary.py "$trace" --label "$name" --json "$OUT/$name.profile.json" | tee "$OUT/$name.profile.md"
done

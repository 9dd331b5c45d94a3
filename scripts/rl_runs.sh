#!/usr/bin/env bash
# GRPO on one GPU: the 4/6 recipe in consistent (batch-invariant) mode, the 4/6 recipe in fast mode and the
# bf16 twin, STEPS steps each (default 200), logs and per-step metrics (rl_metrics.jsonl) under OUT_DIR, then
# the figures and table of docs/results/rl.md (python -m scripts.report rl --docs). Run from the repository root:
#   bash scripts/rl_runs.sh OUT_DIR
# About 5 minutes on an H200 (three ~25 s start-ups; ~0.15 s a step fast, ~0.6 s a step consistent).
# PARALLEL=1 starts the three runs at once (the debug model leaves most of the GPU idle; tokens/s are then
# measured while the runs share the GPU); RUN_TIMEOUT (s) stops a run; NO_REPORT=1 skips the figures (e.g. on
# a machine without matplotlib: run `python -m scripts.report rl OUT_DIR --docs` on the logs elsewhere).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: bash scripts/rl_runs.sh OUT_DIR}
STEPS=${STEPS:-200}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
NVFP4=configs/rl_grpo_qwen3_moe_debug_nvfp4_four_over_six.toml
BF16=configs/rl_grpo_qwen3_moe_debug_bf16.toml
run() {  # name config extra-args...
  local name=$1 config=$2
  shift 2
  echo "== $name: $config $*"
  local start=$SECONDS
  timeout "${RUN_TIMEOUT:-900}" "$PY" -m titan_fp4six.rl --job.config_file "$config" --job.dump_folder "$OUT/$name" \
    --training.steps "$STEPS" --metrics.log_freq 10 --metrics.disable_color_printing "$@" > "$OUT/$name.log" 2>&1
  echo "$name exit $? after $((SECONDS - start)) s"
  mkdir -p "$OUT/$name" && echo "{\"wall_s\": $((SECONDS - start))}" > "$OUT/$name/wall.json"
}
if [ "${PARALLEL:-0}" = 1 ]; then
  run nvfp4_consistent "$NVFP4" --rl.consistent & run nvfp4_fast "$NVFP4" & run bf16_fast "$BF16" & wait
else
  run nvfp4_consistent "$NVFP4" --rl.consistent
  run nvfp4_fast "$NVFP4"
  run bf16_fast "$BF16"
fi
[ "${NO_REPORT:-0}" = 1 ] || "$PY" -m scripts.report rl "$OUT" --docs

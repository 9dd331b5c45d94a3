#!/usr/bin/env bash
# Runs the debug recipes and their bf16 twins one after another on one GPU with plain
# `torchrun -m torchtitan.train`, then prints final losses and tps/MFU as ratios to the bf16 twin, all from
# this one invocation. Usage: bash scripts/compare_recipes.sh [LOG_DIR]   (STEPS, RUN_TIMEOUT, RECIPES override)
set -uo pipefail
cd "$(dirname "$0")/.."
LOG_DIR=${1:-outputs/compare}
STEPS=${STEPS:-100}
RECIPES=${RECIPES:-"deepseek_v3_debugmodel_bf16 deepseek_v3_debugmodel_nvfp4_four_over_six deepseek_v3_debugmodel_nvfp4_four_over_six_all_linears qwen3_moe_debug_bf16 qwen3_moe_debug_nvfp4_four_over_six deepseek_v3_debugmodel_nvfp4_four_over_six_dequantized"}
mkdir -p "$LOG_DIR"
for name in $RECIPES; do
  echo "== $name"
  timeout "${RUN_TIMEOUT:-150}" python3 -m torch.distributed.run --standalone --nproc_per_node=1 -m torchtitan.train \
    --job.config_file "configs/$name.toml" --training.steps "$STEPS" --metrics.disable_color_printing \
    --job.dump_folder "${TMPDIR:-/tmp}/compare_recipes/$name" > "$LOG_DIR/$name.log" 2>&1 || echo "$name exited with $?"
  grep -E "step: *[0-9]+ " "$LOG_DIR/$name.log" | tail -n 2
done
python3 -m scripts.summarize_runs "$LOG_DIR"/*.log | tee "$LOG_DIR/summary.txt"

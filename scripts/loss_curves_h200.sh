#!/usr/bin/env bash
# Three-way loss curves, bf16 vs plain NVFP4 vs four-over-six, for both debug models from one invocation on one
# H200: 300 steps each, same seed (debug.seed 0), same data order (the loader does not shuffle), same batch.
#   DeepSeek-V3 debugmodel: bf16 twin | deepseek_v3_debugmodel_nvfp4_all_linears.toml (plain NVFP4: scope "none",
#                           map-to-6 only, E4M3 scales up to 448) | the all_linears 4/6 recipe it is the twin of
#   Qwen3 MoE debugmodel:   bf16 twin | qwen3_moe_debug_nvfp4.toml (plain NVFP4 experts) | the 4/6 experts recipe
# The three runs of one model train in parallel (small models leave most of the GPU idle), the models one after
# the other. Estimated wall time on an H200 with batch 8 x 512 tokens: ~2 min for DeepSeek-V3 (its all-linears
# 4/6 runs are the slowest: 114 s for three such runs in parallel, docs/results.md) + ~1.5 min for Qwen3 MoE,
# under 4 min in all; RUN_TIMEOUT (seconds per model) caps it at 2 x 170 s.
# Usage: bash scripts/loss_curves_h200.sh [OUT_DIR]
#   OUT_DIR (default outputs/loss_curves_h200): logs, <model>_3way_loss.json/.md/.png
#   DOCS_DIR (default docs): gets <model>_loss_3way.png and results/loss_3way.md (both tables)
#   STEPS=300 BATCH=8 SEQ=512 RUN_TIMEOUT=170 override the defaults (keep them equal across variants).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-outputs/loss_curves_h200}
DOCS_DIR=${DOCS_DIR:-docs}
STEPS=${STEPS:-300}
BATCH=${BATCH:-8}
SEQ=${SEQ:-512}
RUN_TIMEOUT=${RUN_TIMEOUT:-170}
DS=configs/deepseek_v3_debugmodel
QW=configs/qwen3_moe_debug
mkdir -p "$OUT" "$DOCS_DIR/results"
export PYTHONUNBUFFERED=1

COMMON=(-- --training.local_batch_size "$BATCH" --training.seq_len "$SEQ")
curves() {  # name bf16-recipe nvfp4-recipe four-over-six-recipe
  python3 -m scripts.loss_curves --name "${1}_3way" --out "$OUT" --steps "$STEPS" --parallel \
    --timeout "$RUN_TIMEOUT" --run "bf16=$2" --run "NVFP4=$3" --run "4/6=$4" "${COMMON[@]}"
}
start=$SECONDS
curves deepseek_v3 "${DS}_bf16.toml" "${DS}_nvfp4_all_linears.toml" "${DS}_nvfp4_four_over_six_all_linears.toml"
curves qwen3_moe "${QW}_bf16.toml" "${QW}_nvfp4.toml" "${QW}_nvfp4_four_over_six.toml"
echo "wall: $((SECONDS - start)) s"

{
  echo "# Three-way loss curves (bf16 / plain NVFP4 / 4/6), $STEPS steps, batch $BATCH x $SEQ tokens, seed 0"
  echo
  echo "Command: \`bash scripts/loss_curves_h200.sh\` (wall $((SECONDS - start)) s). NVFP4 = the same recipe with"
  echo "scale_bound 448 and scope \"none\". Gaps are to bf16, over the last 20 steps both runs reached."
  for name in deepseek_v3 qwen3_moe; do
    echo
    cat "$OUT/${name}_3way_loss.md"
    echo
    echo "![${name}](../${name}_loss_3way.png)"
  done
} > "$DOCS_DIR/results/loss_3way.md"
for name in deepseek_v3 qwen3_moe; do
  cp "$OUT/${name}_3way_loss.png" "$DOCS_DIR/${name}_loss_3way.png" 2>/dev/null || echo "no plot for $name"
done
cat "$DOCS_DIR/results/loss_3way.md"

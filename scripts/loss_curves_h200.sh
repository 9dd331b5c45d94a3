#!/usr/bin/env bash
# Three-way loss curves, bf16 vs plain NVFP4 vs four-over-six, for both debug models from one invocation on one
# H200: 300 steps each, same seed (debug.seed 0), same data order (the loader does not shuffle), same batch.
#   DeepSeek-V3 debugmodel: bf16 twin | all_linears recipe with scale_bound 448 and scope "none" (plain NVFP4:
#                           map-to-6 only, E4M3 scales up to 448) | the all_linears recipe as written (4/6)
#   Qwen3 MoE debugmodel:   bf16 twin | experts recipe with scale_bound 448, scope "none" | experts recipe (4/6)
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

nvfp4() {  # plain-NVFP4 overrides for the given sections (linear, grouped_mm)
  for s in "$@"; do
    printf -- '--quantize.%s.four_over_six.scale_bound 448 --quantize.%s.four_over_six.scope none ' "$s" "$s"
  done
}

# Plain NVFP4 needs the `scope` knob: refuse before training anything if this checkout's config lacks it.
if ! python3 - "${DS}_nvfp4_four_over_six_all_linears.toml" $(nvfp4 linear grouped_mm) > /dev/null 2>&1 <<'PY'
import sys
from torchtitan.config import ConfigManager
ConfigManager().parse_args(["--job.config_file", *sys.argv[1:]])
PY
then
  echo "this checkout's [quantize.*.four_over_six] sections reject scope = \"none\": plain NVFP4 cannot run" >&2
  exit 2
fi

COMMON=(-- --training.local_batch_size "$BATCH" --training.seq_len "$SEQ")
curves() {  # name bf16-recipe quantized-recipe sections...
  local name=$1 bf16=$2 quant=$3
  shift 3
  python3 scripts/loss_curves.py --name "${name}_3way" --out "$OUT" --steps "$STEPS" --parallel \
    --timeout "$RUN_TIMEOUT" --run "bf16=$bf16" --run "NVFP4=$quant $(nvfp4 "$@")" --run "4/6=$quant" "${COMMON[@]}"
}
start=$SECONDS
curves deepseek_v3 "${DS}_bf16.toml" "${DS}_nvfp4_four_over_six_all_linears.toml" linear grouped_mm
curves qwen3_moe "${QW}_bf16.toml" "${QW}_nvfp4_four_over_six.toml" grouped_mm
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

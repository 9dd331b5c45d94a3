#!/usr/bin/env bash
# The performance table of docs/performance.md (issue 18) in one sitting on one GPU, every ratio against a twin
# measured in the same invocation (about 12 minutes on an H200):
#   1. kernels: the GEMM epilogue and row amax against a copy of the same bytes (python -m scripts.bench kernels);
#   2. ops: 1024^3 four_over_six_linear fwd+bwd per backward mode vs bf16 F.linear, public quantize host time
#      (python -m scripts.bench ops);
#   3. recipes, eager, one after another: DeepSeek-V3 debug (all Linears + experts 4/6, quantized and dequantized
#      backward), then Qwen3 MoE debug 4/6, each against its bf16 twin in a table of its own, each list REPEAT
#      times over (default 2: these host-bound runs vary from run to run; scripts/throughput.py --repeat); then
#      the Qwen3-30B-A3B-shaped 4-layer flavor, experts 4/6 vs bf16, eager and (COMPILED=1) compiled
#      (scripts/throughput.py: median tps after warm-up, peak memory);
#   4. one profiled step of the DeepSeek-V3 and Qwen3 4/6 recipes (scripts/profile_recipes.sh);
# then issue 18's table from whatever parts OUT_DIR holds (scripts/perf_table.py: OUT_DIR/table.md, table.png).
# Usage, from the repository root with torchtitan importable:
#   bash scripts/perf_h200.sh OUT_DIR [kernels ops debug 30b profiles]   (the parts to run; default all)
# Where one call may run 10 minutes at most: `... OUT_DIR kernels ops debug`, then `... OUT_DIR 30b profiles`
# on the same machine (about 9 minutes each), then `python3 -m scripts.perf_table OUT_DIR` for the whole table.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: bash scripts/perf_h200.sh OUT_DIR [kernels ops debug 30b profiles]}
shift
PARTS=" ${*:-kernels ops debug 30b profiles} "
STEPS=${STEPS:-30}
mkdir -p "$OUT"
DS=configs/deepseek_v3_debugmodel
QW=configs/qwen3_moe_debug
part() { [[ "$PARTS" == *" $1 "* ]]; }

part kernels && python3 -m scripts.bench kernels --only epilogue --rounds 2 2>&1 | tee "$OUT/kernels.md"
part ops && python3 -m scripts.bench ops --json "$OUT/ops.json" 2>&1 | tee "$OUT/ops.txt"
# one table per model: throughput.py divides every run by the first of its invocation (the bf16 twin); the
# DeepSeek runs take 3/5 of DEBUG_BUDGET, the Qwen3 pair the rest
DEBUG_BUDGET=${DEBUG_BUDGET:-440}
part debug && python3 -m scripts.throughput --out "$OUT/debug" --modes eager --steps "$STEPS" --warmup 10 \
  --repeat "${REPEAT:-2}" --budget $((DEBUG_BUDGET * 3 / 5)) \
  --run "DeepSeek bf16=${DS}_bf16.toml" --run "DeepSeek 4/6 all Linears=${DS}_nvfp4_four_over_six_all_linears.toml" \
  --run "DeepSeek 4/6 dequantized=${DS}_nvfp4_four_over_six_dequantized.toml" 2>&1 | tee "$OUT/debug.txt"
part debug && python3 -m scripts.throughput --out "$OUT/debug_qwen3" --modes eager --steps "$STEPS" --warmup 10 \
  --repeat "${REPEAT:-2}" --budget $((DEBUG_BUDGET * 2 / 5)) \
  --run "Qwen3 MoE bf16=${QW}_bf16.toml" --run "Qwen3 MoE 4/6=${QW}_nvfp4_four_over_six.toml" 2>&1 | tee -a "$OUT/debug.txt"
part 30b && python3 -m scripts.throughput --out "$OUT/30b" --modes "eager${COMPILED:+,compiled}" --steps 20 --warmup 8 \
  --budget "${BIG_BUDGET:-420}" --run "bf16=${QW}_bf16.toml" --run "4/6 experts=${QW}_nvfp4_four_over_six.toml" \
  -- --model.flavor 30B-A3B-4layers --experimental.custom_import titan_fp4six.integration.flavors \
  --training.local_batch_size 4 --training.seq_len 2048 2>&1 | tee "$OUT/30b.txt"
# the bf16 twins' steps do not run the plugin: PROFILE_TWINS=1 profiles them too
part profiles && bash scripts/profile_recipes.sh "$OUT/profiles" "${DS}_nvfp4_four_over_six_all_linears.toml" \
  "${QW}_nvfp4_four_over_six.toml" ${PROFILE_TWINS:+"${DS}_bf16.toml" "${QW}_bf16.toml"} > "$OUT/profiles.txt" 2>&1 \
  && grep -h "wall" "$OUT"/profiles/*.profile.md
python3 -m scripts.perf_table "$OUT"
exit 0

#!/usr/bin/env bash
# The training-quality study behind docs/fidelity.md: `python -m titan_fp4six.compare` on the study setup for
# each slice named, the slices side by side on one GPU (each takes an equal share of the CPU cores: the debug
# models are host-bound). The finished runs' logs live in docs/fidelity/runs/<slice>.tar.gz: the script
# unpacks them into OUT_DIR first, trains only the runs not finished yet, and packs every finished run into
# OUT_DIR/<slice>.tar.gz (copy it over the one in docs/fidelity/runs/). So the study grows over machine
# sessions with the same command. Always use the same OUT_DIR (outputs/study): the logs record their paths.
#   bash scripts/fidelity_study.sh outputs/study SLICE...
# SLICE: qwen3_base (Qwen3 MoE debug, routed experts, the RL base point: row-scaled, high-precision backward),
#        deepseek_base (DeepSeek-V3 debug, the same knobs), deepseek_all (DeepSeek-V3 debug, every dense Linear
#        but the LM head and router plus the routed experts, quantized dense backward), qwen3_all (Qwen3 MoE debug,
#        the same knobs: the attention Linears and the routed experts), deepseek_full / qwen3_full
#        (the full NVFP4 recipe: every operand FP4 in both passes, stochastic gradients, RHT on the wgrad inputs).
# BOUNDS=1 adds the scale-bound variants (NVFP4 with B=256, 4/6 with B=448); BUDGET caps each slice's seconds;
# JOBS sets the runs at once per slice; REPORT_ONLY=1 trains nothing: it unpacks the archives and writes each
# slice's report (compare.md/.json/.png), e.g. on the CPU before `python3 -m scripts.report fidelity OUT_DIR --docs`.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: bash scripts/fidelity_study.sh OUT_DIR SLICE...}
shift
declare -A RECIPE=([qwen3_base]=configs/qwen3_moe_debug_nvfp4_four_over_six.toml
                   [deepseek_base]=configs/deepseek_v3_debugmodel_nvfp4_four_over_six.toml
                   [deepseek_all]=configs/deepseek_v3_debugmodel_nvfp4_four_over_six_all_linears.toml
                   [deepseek_full]=configs/deepseek_v3_debugmodel_nvfp4_four_over_six_full.toml
                   [qwen3_all]=configs/qwen3_moe_debug_nvfp4_four_over_six_all_linears.toml
                   [qwen3_full]=configs/qwen3_moe_debug_nvfp4_four_over_six_full.toml)
# The study setup (docs/fidelity.md says why): 400 steps of 8 x 512 tokens from the 4.4M-token code corpus
# (0.37 epoch: no sample repeats), the peak lr of each slice after 40 warm-up steps, final loss = mean of the
# last 100 steps.
[ $# -gt 0 ] || { echo "name at least one slice: ${!RECIPE[*]}" >&2; exit 2; }
# Slices whose bf16 twin is another slice's (the recipes differ only in what they quantize): their bf16 runs are
# that slice's (compare --bf16-from), trained once.
declare -A BF16_FROM=([deepseek_all]=deepseek_base [qwen3_all]=qwen3_base)
declare -A LR=([qwen3_base]=4e-4 [deepseek_base]=2e-4 [deepseek_all]=2e-4 [deepseek_full]=2e-4 [qwen3_all]=4e-4 [qwen3_full]=4e-4)
STUDY=(--seeds "${SEEDS:-5}" --steps 400 --tail 100 --training.dataset titan_fp4six_code
       --training.local_batch_size 8 --training.seq_len 512)
WARMUP=(--lr_scheduler.warmup_steps 40)
VARIANTS=()
if [ "${BOUNDS:-0}" = 1 ]; then
  VARIANTS=(--variant "nvfp4 B256=nvfp4 scale_bound=256" --variant "4/6 B448=4/6 scale_bound=448")
fi
# Runs at once per slice: JOBS, or an equal share of the CPU cores (before OMP_NUM_THREADS: nproc would count
# that instead). The runs are host-bound: 11 at once on 16 cores took 170-310 s each for the full recipes, 16 at
# once 355 s and more.
JOBS=${JOBS:-$(( $(getconf _NPROCESSORS_ONLN) / $# ))}
[ "$JOBS" -ge 1 ] || JOBS=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}  # one core per run: more threads only contend on the host
ARCHIVE=docs/fidelity/runs
declare -A SHARED=()  # every slice whose folder this study reads: the ones named and their bf16 sources
for slice in "$@"; do
  [ -n "${RECIPE[$slice]:-}" ] || { echo "unknown slice $slice; valid: ${!RECIPE[*]}" >&2; exit 2; }
  SHARED[$slice]=1
  [ -n "${BF16_FROM[$slice]:-}" ] && SHARED[${BF16_FROM[$slice]}]=1
done
for slice in "${!SHARED[@]}"; do
  mkdir -p "$OUT/$slice"
  [ -f "$ARCHIVE/$slice.tar.gz" ] && tar xzf "$ARCHIVE/$slice.tar.gz" -C "$OUT/$slice" --skip-old-files
done
compare_command() {  # CMD = the comparison of slice $1 on the study setup
  CMD=(python3 -m titan_fp4six.compare --job.config_file "${RECIPE[$1]}" --out "$OUT/$1" "${STUDY[@]}"
       --optimizer.lr "${LR[$1]}" "${WARMUP[@]}" "${VARIANTS[@]}")
  [ -n "${BF16_FROM[$1]:-}" ] && CMD+=(--bf16-from "$OUT/${BF16_FROM[$1]}")
}
if [ "${REPORT_ONLY:-0}" != 1 ]; then
  for slice in "$@"; do
    compare_command "$slice"
    timeout "${BUDGET:-7200}" "${CMD[@]}" --jobs "$JOBS" > "$OUT/$slice.txt" 2>&1 &
  done
  wait
fi
for slice in "$@"; do  # the report of what finished, also when BUDGET stopped a slice
  compare_command "$slice"
  "${CMD[@]}" --report-only > /dev/null 2>&1
  [ -f "$OUT/$slice.txt" ] && grep "^\[compare\]" "$OUT/$slice.txt" | tail -n 3
  [ -f "$OUT/$slice/compare.md" ] && cat "$OUT/$slice/compare.md"
done
for slice in "${!SHARED[@]}"; do  # bf16 runs trained for a slice may live in its source's folder
  (cd "$OUT/$slice" && tar czf "../$slice.tar.gz" $(for e in runs/*.exit; do echo "$e" "${e%.exit}.log"; done))
done

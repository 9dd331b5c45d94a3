#!/bin/bash
# The GPU evaluation behind docs/results.md, in one sitting on one H200 (about 4-4.5 minutes):
#   1. loss curves, in parallel: DeepSeek-V3 and Qwen3 MoE debug recipes vs their bf16 twins and vs the knob
#      setting closest to plain NVFP4 (scale_bound 448, 1x16 weights), same seed and data, STEPS steps;
#      alongside, the quantization-error report on tensors captured from a GPU training of both debug models;
#   2. then, alone on the GPU: the throughput benchmark on the Qwen3-30B-A3B-shaped 4-layer flavor.
# Results go to $RESULTS (default /tmp/eval) and, packed, to $OUT/eval.tgz when OUT is set.
# Run from the repository root with torchtitan importable (see docs/results.md for the device command).
set -u
RESULTS=${RESULTS:-/tmp/eval}
STEPS=${STEPS:-300}
LOSS_TIMEOUT=${LOSS_TIMEOUT:-100}   # seconds per loss-curve training (the curves keep the steps reached)
TP_BUDGET=${TP_BUDGET:-140}         # seconds for all throughput trainings together
LOSS_ARGS=(-- --training.local_batch_size 8 --training.seq_len 512)
mkdir -p "$RESULTS"
export PYTHONUNBUFFERED=1

{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
  python3 -c "import importlib.metadata as m; print('torchtitan', m.version('torchtitan'), 'torchao', m.version('torchao'))"
} > "$RESULTS/hardware.txt" 2>&1

DS=configs/deepseek_v3_debugmodel
QW=configs/qwen3_moe_debug
DS_448="--quantize.linear.four_over_six.scale_bound 448 --quantize.linear.four_over_six.weight_block 1x16"
DS_448="$DS_448 --quantize.grouped_mm.four_over_six.scale_bound 448 --quantize.grouped_mm.four_over_six.weight_block 1x16"
QW_448="--quantize.grouped_mm.four_over_six.scale_bound 448"

python3 -m scripts.loss_curves --name deepseek_v3 --out "$RESULTS/loss" --steps "$STEPS" --parallel \
  --timeout "$LOSS_TIMEOUT" --run "bf16=${DS}_bf16.toml" --run "4/6=${DS}_nvfp4_four_over_six_all_linears.toml" \
  --run "4/6 B448 1x16=${DS}_nvfp4_four_over_six_all_linears.toml $DS_448" "${LOSS_ARGS[@]}" > "$RESULTS/loss_deepseek.txt" 2>&1 &
python3 -m scripts.loss_curves --name qwen3_moe --out "$RESULTS/loss" --steps "$STEPS" --parallel \
  --timeout "$LOSS_TIMEOUT" --run "bf16=${QW}_bf16.toml" --run "4/6=${QW}_nvfp4_four_over_six.toml" \
  --run "4/6 B448=${QW}_nvfp4_four_over_six.toml $QW_448" "${LOSS_ARGS[@]}" > "$RESULTS/loss_qwen3.txt" 2>&1 &
timeout "$LOSS_TIMEOUT" python3 -m scripts.quant_error_report --out "$RESULTS/qerr" --steps 30 --capture-steps 1,15,30 --batch 4 \
  --seq-len 512 --max-rows 1024 > "$RESULTS/qerr.txt" 2>&1 &
wait

python3 -m scripts.throughput --out "$RESULTS/throughput" --steps 20 --warmup 8 --budget "$TP_BUDGET" \
  --run "bf16=${QW}_bf16.toml" --run "4/6 experts=${QW}_nvfp4_four_over_six.toml" \
  -- --model.flavor 30B-A3B-4layers --experimental.custom_import titan_fp4six.integration.flavors --training.local_batch_size 4 --training.seq_len 2048 \
  > "$RESULTS/throughput.txt" 2>&1

cat "$RESULTS"/*.txt | grep -v "^W1130\|^Failed to load" | tail -80
if [ -n "${OUT:-}" ]; then tar czf "$OUT/eval.tgz" -C "$RESULTS" .; fi

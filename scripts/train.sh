#!/usr/bin/env bash
# The main job: set up, then train the DeepSeek-V3 debugmodel NVFP4 four-over-six RL base recipe (routed experts,
# row-scaled activations, 1x16 weights, high-precision backward) on the embedded corpus.
# With a GPU: the recipe as written, on every visible GPU (NGPU overrides), through torchrun.
# Without one: the same recipe on the CPU with CPU-sized overrides (fp32 compute since these CPUs lack bf16
# matrix units, 4 x 128 tokens per step, CPU_STEPS steps, default 12: seconds a step on 2 idle cores, as the
# CPU quantizers re-quantize the routed experts' weights every step). Extra arguments go to the trainer (e.g. --training.steps 20).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PY=${PYTHON:-python3}
CONFIG=${CONFIG:-configs/deepseek_v3_debugmodel_nvfp4_four_over_six.toml}
if "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  NGPU=${NGPU:-$("$PY" -c "import torch; print(torch.cuda.device_count())")}
  exec "$PY" -m torch.distributed.run --standalone --nproc_per_node="$NGPU" -m titan_fp4six.train \
    --job.config_file "$CONFIG" "$@"
fi
exec "$PY" -m titan_fp4six.train --job.config_file "$CONFIG" \
  --training.mixed_precision_param float32 --training.local_batch_size 4 --training.seq_len 128 \
  --training.steps "${CPU_STEPS:-12}" --lr_scheduler.warmup_steps 2 --metrics.log_freq 1 "$@"

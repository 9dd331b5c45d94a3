#!/usr/bin/env bash
# The torchtitan 0.3 environment: a venv at .venv-tt03 on top of this Python's packages (torch, torchao and the
# plugin from scripts/setup.sh), with torchtitan 0.3.0 and its new dependencies (spmd_types, torch_checkpointing)
# installed into it. pip reports that titan_fp4six pins torchtitan==0.2.2: expected, the 0.3 integration is picked
# by the installed version.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv-tt03/bin/python ] || "$PY" -m venv --system-site-packages .venv-tt03
.venv-tt03/bin/python -c "import torchtitan, sys; sys.exit(torchtitan.__version__ != '0.3.0')" 2>/dev/null \
  || .venv-tt03/bin/python -m pip install -q torchtitan==0.3.0

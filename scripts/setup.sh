#!/usr/bin/env bash
# Installs titan_fp4six and its dependencies into the current Python. A CUDA build of torch that is already
# installed is kept; on a machine without one, the CPU build torch==2.13.0 is installed first (fast, and it
# keeps pip from pulling a multi-GB CUDA build to satisfy torch>=2.11).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c "import torch, sys; sys.exit(0 if tuple(map(int, torch.__version__.split('.')[:2])) >= (2, 11) else 1)" 2>/dev/null; then
  "$PY" -m pip install -q torch==2.13.0
fi
"$PY" -m pip install -q -e ".[test,plots]"  # plots: the report scripts and their tests

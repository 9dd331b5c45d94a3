#!/usr/bin/env bash
# The test command: set up, run the whole suite next to torchtitan 0.2.2 (GPU tests skip themselves without CUDA),
# then the torchtitan 0.3 tests in a second environment (.venv-tt03: this Python's packages plus torchtitan 0.3.0).
# Both stages spread over TEST_WORKERS pytest-xdist processes (default: one per core, at most 8; tests/conftest.py
# gives each an equal share of the cores). Works in a venv or the system's Python (PYTHON picks another).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WORKERS=${TEST_WORKERS:-$("$PY" -c "import os; print(min(8, len(os.sched_getaffinity(0))))")}
bash scripts/setup.sh
"$PY" -m pytest -q -n "$WORKERS" tests "$@"
bash scripts/setup_tt03.sh
exec .venv-tt03/bin/python -m pytest -q -n "$WORKERS" tests/test_tt03.py tests/test_tt03_parity.py \
  tests/test_integration_version.py "$@"

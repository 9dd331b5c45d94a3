#!/usr/bin/env bash
# The test command: set up, run the whole suite next to torchtitan 0.2.2 (GPU tests skip themselves without CUDA),
# then the torchtitan 0.3 tests in a second environment (.venv-tt03: this Python's packages plus torchtitan 0.3.0).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
"${PYTHON:-python3}" -m pytest -q tests "$@"
bash scripts/setup_tt03.sh
exec .venv-tt03/bin/python -m pytest -q tests/test_tt03.py tests/test_tt03_parity.py tests/test_integration_version.py "$@"

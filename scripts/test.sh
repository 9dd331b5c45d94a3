#!/usr/bin/env bash
# The test command: set up, then run the whole suite (GPU tests skip themselves without CUDA).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec "${PYTHON:-python3}" -m pytest -q tests "$@"

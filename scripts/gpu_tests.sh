#!/usr/bin/env bash
# The suite's GPU cases on one CUDA machine: every test file with CUDA cases (their CPU cases run too), spread
# over WORKERS processes (the CPU-side references dominate: serially the files take over 10 minutes on an H200
# host, with 8 workers under 4), each test stopped after TEST_TIMEOUT seconds so that one hang cannot take a whole
# device call. Output teed to OUT/gpu_tests.txt, one line per finished test (-v), so a call cut short still
# returns which tests ran and failed (the tracebacks come at the end). SHARD=k/n runs every n-th file from the k-th,
# so that the suite can be split over device calls that each have a time limit.
#   [WORKERS=8] [SHARD=1/2] bash scripts/gpu_tests.sh OUT_DIR [pytest args, e.g. -k rht]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: bash scripts/gpu_tests.sh OUT_DIR [pytest args]}
shift
mkdir -p "$OUT"
SHARD=${SHARD:-1/1}
[[ $SHARD =~ ^([0-9]+)/([0-9]+)$ ]] && (( BASH_REMATCH[1] >= 1 && BASH_REMATCH[1] <= BASH_REMATCH[2] )) \
  || { echo "SHARD must be k/n with 1 <= k <= n, got '$SHARD'" >&2; exit 2; }
K=${BASH_REMATCH[1]} N=${BASH_REMATCH[2]}
python3 -c "import torch, sys; sys.exit(not torch.cuda.is_available())" || { echo "no CUDA device" >&2; exit 2; }
FILES=$(grep -l "cuda.is_available\|needs CUDA\|needs a CUDA" tests/test_*.py)
FILES=$(echo "$FILES" | awk -v k="$K" -v n="$N" '(NR - 1) % n == k - 1')
python3 -m pytest -n "${WORKERS:-8}" --timeout "${TEST_TIMEOUT:-300}" -p no:cacheprovider -v --tb=short -rfs --durations=30 \
  $FILES "$@" 2>&1 | tee "$OUT/gpu_tests.txt"
exit "${PIPESTATUS[0]}"

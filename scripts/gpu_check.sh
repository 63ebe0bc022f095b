#!/usr/bin/env bash
# scripts/gpu_check.sh OUTDIR
#
# On a CUDA GPU (written for one H200): (1) checks triton_flash forward and backward against
# the float64 reference over a grid of shapes and every tuning candidate
# (scripts/gpu_correctness.py, which also fills Triton's kernel cache), (2) runs
# suites/h200.toml, (3) writes its report and a summary against the goals of docs/gpu.md.
# Everything lands in OUTDIR: log.txt, correctness.json, results/<run-id>/, report/,
# summary.md. Without a GPU it prints one line and exits 2.
#
# It uses the Python that holds torch and triton (PYTHON=..., else .venv/bin/python if the
# checkout has one, else python3) and installs nothing: this checkout's attnbench is put on
# PYTHONPATH through a temporary package of links, so the machine's own torch/triton are used.
#
# Time limits (seconds, overridable): CHECK_LIMIT_S=150 for the correctness step,
# RUN_LIMIT_S=360 for the suite (interrupted runs keep their records; report covers them).
set -uo pipefail

if [ $# -ne 1 ] || [ -z "$1" ]; then
    echo "usage: scripts/gpu_check.sh OUTDIR" >&2
    exit 2
fi
REPO=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-}
if [ -z "$PY" ]; then
    if [ -x "$REPO/.venv/bin/python" ]; then PY="$REPO/.venv/bin/python"; else PY=python3; fi
fi

why=$("$PY" - 2>&1 <<'EOF'
import sys
try:
    import torch
except Exception as exc:
    print(f"python cannot import torch ({type(exc).__name__})")
    sys.exit(1)
if not torch.cuda.is_available():
    print(f"torch {torch.__version__} sees no CUDA device")
    sys.exit(1)
EOF
)
if [ $? -ne 0 ]; then
    echo "gpu_check: no CUDA GPU on this machine (${why##*$'\n'}); nothing was run"
    exit 2
fi

mkdir -p "$1" || exit 2
OUT=$(cd "$1" && pwd)
exec > >(tee -a "$OUT/log.txt") 2>&1
T0=$(date +%s)
stamp() { echo "[gpu_check +$(( $(date +%s) - T0 ))s] $*"; }

# This checkout's attnbench, without installing it: attnbench/ = src/attnbench/* plus
# implementations/ and suites/ (the package-dir mapping of pyproject.toml).
SHIM=$(mktemp -d)
trap 'rm -rf "$SHIM"' EXIT
mkdir "$SHIM/attnbench"
for f in "$REPO"/src/attnbench/*; do
    [ "$(basename "$f")" = "__pycache__" ] || ln -s "$f" "$SHIM/attnbench/"
done
ln -s "$REPO/implementations" "$SHIM/attnbench/implementations"
ln -s "$REPO/suites" "$SHIM/attnbench/suites"
export PYTHONPATH="$SHIM${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=${TRITON_DEFAULT_FP_FUSION:-1}
unset TRITON_INTERPRET
cd "$REPO" || exit 2

stamp "repo $REPO ($(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo ', dirty')), output $OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>&1
"$PY" -c "import sys, torch, triton, attnbench; print('python', sys.version.split()[0], '| torch', torch.__version__, '| triton', triton.__version__, '| cuda', torch.version.cuda, '| attnbench from', attnbench.__file__)"

status=0
stamp "step 1/3: correctness of triton_flash against float64 (limit ${CHECK_LIMIT_S:-150} s)"
timeout -s INT -k 20 "${CHECK_LIMIT_S:-150}" \
    "$PY" scripts/gpu_correctness.py --out "$OUT/correctness.json"
rc=$?
stamp "correctness exit code $rc"
[ $rc -eq 0 ] || status=1

RUN_ID="h200-$(date +%Y%m%d-%H%M%S)"
stamp "step 2/3: attnbench run suites/h200.toml -> $OUT/results/$RUN_ID (limit ${RUN_LIMIT_S:-360} s)"
timeout -s INT -k 30 "${RUN_LIMIT_S:-360}" \
    "$PY" -m attnbench.cli run --suite suites/h200.toml --device cuda --out "$OUT/results" \
    --run-id "$RUN_ID" --no-report --no-progress
rc=$?
stamp "run exit code $rc$([ $rc -eq 124 ] || [ $rc -eq 130 ] && echo ' (time limit: the run is partial)')"
[ $rc -eq 0 ] || status=1

stamp "step 3/3: report and summary"
if [ -d "$OUT/results/$RUN_ID" ]; then
    "$PY" -m attnbench.cli report "$OUT/results/$RUN_ID" --out "$OUT/report" || status=1
    "$PY" scripts/gpu_summary.py "$OUT/results/$RUN_ID" --out "$OUT/summary.md" || status=1
else
    echo "no run directory was written"
    status=1
fi
stamp "done, exit code $status"
exit $status

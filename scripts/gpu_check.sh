#!/usr/bin/env bash
# scripts/gpu_check.sh OUTDIR
#
# On a CUDA GPU (written for one H200: ~3 minutes predicted with a cold Triton cache; the
# budget's arithmetic is in docs/gpu.md): (1) every GPU backend against the float64
# reference on awkward shapes, and every triton_flash tuning candidate
# (scripts/gpu_correctness.py, which also fills Triton's kernel cache), (2) suites/h200.toml,
# ordered so that a run cut anywhere holds the core comparison, (2b) four pairs under the
# three timing methods and their agreement (timing-methods.json), (3) its report and a summary
# of the suite's goals. At the top of OUTDIR: log.txt, summary.md, correctness.json and
# gpu-check.tar.gz (the run and its report: the GPU machine returns only a few files, so
# nothing else is left there). Without a GPU it prints one line and exits 2.
#
# It uses the first Python whose torch sees a GPU, of: $PYTHON, the checkout's
# .venv/bin/python, python3, python (the log says which), and installs nothing: this
# checkout's attnbench is put on PYTHONPATH through a temporary package of links, so the
# machine's own torch/triton are used.
#
# Time limits (seconds, overridable): CHECK_LIMIT_S=75 for the correctness step,
# RUN_LIMIT_S=130 for the suite, METHODS_LIMIT_S=30 for the timing methods,
# REPORT_LIMIT_S=45 for the report, SUMMARY_LIMIT_S=15 for the summary (interrupted steps
# keep what they finished; the report covers a partial run, and a report cut by its limit
# can be rendered offline from the tarball). Every other command has its own limit too (`bounded`), and a limit reached is logged as one (exit 124, or 137 after
# the grace period's SIGKILL). Steps 1 and 2 share one Triton and one inductor cache
# (TRITON_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR; set here unless already set), so step 1's
# compiles, flex's included, are step 2's cache hits.
#
# GPU_CHECK_REHEARSAL=SUITE rehearses the plumbing on a CPU (the tests do this, since the
# real check has to work the first time a GPU is lent): any Python with torch, step 1 as
# gpu_correctness.py --smoke (the Triton interpreter), step 2 runs SUITE on the CPU, and
# steps 2b, 3 and the packing as on a GPU (2b's methods all time by the wall clock
# there). GPU_CHECK_FAULTS (see gpu_correctness.py) injects faults into step 1's tasks, to
# rehearse a crashed or poisoned worker.
set -uo pipefail
REHEARSAL=${GPU_CHECK_REHEARSAL:-}

if [ $# -ne 1 ] || [ -z "$1" ]; then
    echo "usage: scripts/gpu_check.sh OUTDIR" >&2
    exit 2
fi
REPO=$(cd "$(dirname "$0")/.." && pwd)

# `bounded SECS CMD...`: CMD under a time limit (SIGINT, then SIGKILL 5 s later); exit
# code 124 or 137 when the limit was reached. `limit_note RC` names those codes.
bounded() {
    local secs=$1; shift
    timeout -s INT -k 5 "$secs" "$@"
}
limit_note() {
    case $1 in
        124) echo " (time limit reached: interrupted)";;
        137) echo " (time limit reached: killed after the grace period)";;
        130) echo " (interrupted)";;
    esac
}

sees_gpu() {  # prints why not on failure
    bounded 90 "$1" - "$REHEARSAL" 2>&1 <<'EOF_PY'
import sys
try:
    import torch
except Exception as exc:
    print(f"cannot import torch ({type(exc).__name__})")
    sys.exit(1)
if not torch.cuda.is_available() and not sys.argv[1]:
    print(f"torch {torch.__version__} sees no CUDA device")
    sys.exit(1)
EOF_PY
}
PY=""
why=""
for cand in ${PYTHON:-} "$REPO/.venv/bin/python" python3 python; do
    command -v "$cand" >/dev/null 2>&1 || continue
    if said=$(sees_gpu "$cand"); then PY=$(command -v "$cand"); break; fi
    why="${why:+$why; }$cand: ${said##*$'\n'}"
done
if [ -z "$PY" ]; then
    echo "gpu_check: no CUDA GPU on this machine (${why:-no python found}); nothing was run"
    exit 2
fi

if ! mkdir -p "$1" 2>/dev/null || ! touch "$1/log.txt" 2>/dev/null; then
    echo "gpu_check: OUTDIR $1 is not a writable folder; nothing was run"
    exit 2
fi
OUT=$(cd "$1" && pwd)
exec > >(tee -a "$OUT/log.txt") 2>&1
# From the first second: whatever happens next, correctness.json says how far step 1 got.
echo '{"tasks": null, "finished": 0, "results": [], "state": "not started"}' \
    > "$OUT/correctness.json"
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
CACHE_ROOT=${TMPDIR:-/tmp}/attnbench-gpu-check-$(id -u)
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$CACHE_ROOT/triton}
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$CACHE_ROOT/inductor}
mkdir -p "$TRITON_CACHE_DIR" "$TORCHINDUCTOR_CACHE_DIR"
unset TRITON_INTERPRET
cd "$REPO" || exit 2

if [ -n "$REHEARSAL" ]; then
    stamp "python $PY (a rehearsal: any Python with torch)"
else
    stamp "python $PY (the first whose torch sees a GPU${why:+; not: $why})"
fi
stamp "repo $REPO ($(bounded 10 git rev-parse --short HEAD 2>/dev/null || echo '?')$(bounded 20 git diff --quiet 2>/dev/null || echo ', dirty')), output $OUT"
stamp "caches: TRITON_CACHE_DIR=$TRITON_CACHE_DIR TORCHINDUCTOR_CACHE_DIR=$TORCHINDUCTOR_CACHE_DIR"
if [ -n "$REHEARSAL" ]; then
    stamp "REHEARSAL on the CPU: step 1 with --smoke, step 2 runs $REHEARSAL, step 2b on the CPU"
    SUITE=$REHEARSAL DEVICE=cpu CHECK_ARGS=(--smoke) RUN_PREFIX=rehearsal
else
    bounded 20 nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm \
        --format=csv,noheader 2>&1
    rc=$?; [ $rc -eq 0 ] || echo "nvidia-smi exit code $rc$(limit_note $rc)"
    SUITE=suites/h200.toml DEVICE=cuda CHECK_ARGS=() RUN_PREFIX=h200
fi
bounded 60 "$PY" -c "import sys, torch, triton, attnbench; print('python', sys.version.split()[0], '| torch', torch.__version__, '| triton', triton.__version__, '| cuda', torch.version.cuda, '| attnbench from', attnbench.__file__)"
rc=$?; [ $rc -eq 0 ] || echo "version print exit code $rc$(limit_note $rc)"

status=0
stamp "step 1/3: every GPU backend against float64 (limit ${CHECK_LIMIT_S:-75} s)"
bounded "${CHECK_LIMIT_S:-75}" "$PY" scripts/gpu_correctness.py \
    ${CHECK_ARGS[@]+"${CHECK_ARGS[@]}"} --suite "$SUITE" --out "$OUT/correctness.json"
rc=$?
stamp "correctness exit code $rc$(limit_note $rc)$([ $rc -ge 124 ] && echo '; partial, see correctness.json')"
[ $rc -eq 0 ] || status=1

RUN_ID="$RUN_PREFIX-$(date +%Y%m%d-%H%M%S)"
stamp "step 2/3: attnbench run $SUITE -> results/$RUN_ID (limit ${RUN_LIMIT_S:-130} s)"
timeout -s INT -k 10 "${RUN_LIMIT_S:-130}" \
    "$PY" -m attnbench.cli run --suite "$SUITE" --device "$DEVICE" --out "$OUT/all/results" \
    --run-id "$RUN_ID" --no-report --no-progress
rc=$?
stamp "run exit code $rc$(limit_note $rc)$([ $rc -ge 124 ] && echo '; the run is partial')"
[ $rc -eq 0 ] || status=1

# Step 2b: a few pairs under each [timing] method (events, cudagraph, profiler) and their
# agreement, into the tarball; after the suite, so a machine taken back early keeps it.
stamp "step 2b/3: timing methods on 4 pairs -> timing-methods.json (limit ${METHODS_LIMIT_S:-30} s)"
mkdir -p "$OUT/all"
bounded "${METHODS_LIMIT_S:-30}" "$PY" scripts/timing_methods_check.py --device "$DEVICE" \
    --out "$OUT/all/timing-methods.json"
rc=$?
stamp "timing methods exit code $rc$(limit_note $rc)"
[ $rc -eq 0 ] || status=1

stamp "step 3/3: summary (limit ${SUMMARY_LIMIT_S:-15} s) and report (limit ${REPORT_LIMIT_S:-45} s)"
if [ -d "$OUT/all/results/$RUN_ID" ]; then
    bounded "${SUMMARY_LIMIT_S:-15}" "$PY" scripts/gpu_summary.py \
        "$OUT/all/results/$RUN_ID" --out "$OUT/summary.md" >/dev/null
    rc=$?
    stamp "summary exit code $rc$(limit_note $rc)"
    [ $rc -eq 0 ] || status=1
    [ -s "$OUT/summary.md" ] || echo "gpu_summary did not finish (exit code $rc$(limit_note $rc))" > "$OUT/summary.md"
    bounded "${REPORT_LIMIT_S:-45}" "$PY" -m attnbench.cli report \
        "$OUT/all/results/$RUN_ID" --name "$RUN_ID" --out "$OUT/all/report"
    rc=$?
    stamp "report exit code $rc$(limit_note $rc)$([ $rc -ge 124 ] && echo "; render it offline from the tarball: attnbench report results/$RUN_ID --name $RUN_ID")"
    [ $rc -eq 0 ] || status=1
else
    echo "no run directory was written"
    echo "gpu_check: step 2 wrote no run directory; nothing to summarise" > "$OUT/summary.md"
    status=1
fi
stamp "done, exit code $status; packing $OUT/gpu-check.tar.gz"
# The run and its report are packed and then removed, so that OUTDIR ends with its four
# files alone (the GPU machine hands back at most 8, and would choose among more). log.txt
# stays out of the tarball: it is still being written, and it comes back on its own.
# The run's advisory .lock is left out: it only marks a writer, and none is left.
mkdir -p "$OUT/all" && bounded 30 cp "$OUT/correctness.json" "$OUT/summary.md" "$OUT/all/" 2>/dev/null
if bounded 60 tar -czf "$OUT/gpu-check.tar.gz" --exclude=.lock -C "$OUT/all" .; then
    bounded 60 rm -rf "$OUT/all"
else
    rc=$?
    echo "tar failed (exit code $rc$(limit_note $rc)): the run and report stay unpacked under $OUT/all"
fi
exit $status

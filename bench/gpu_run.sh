#!/bin/sh
# The prepared run for a lent GPU (docs/gpu.md): the checks docs/gpu.md lists, then a short training
# run of the one-GPU recipe and its validation. Every step runs under its own `timeout`, the check
# writes its figures after each case (runs/gpu-run/STEP/gpu_check.md), and the reports and logs are
# copied to $OUT (what the device tool brings back) whatever stopped.
#
# Three parts, one call each, in this order of need (the first GPU run, docs/results.md: a fresh
# machine's start, the 0.5B recipe's data and Qwen, and each compile take minutes):
#
#   sh bench/gpu_run.sh sizes     # what configs/gpu-*.toml are built from: micro-batches of the one-GPU
#                                 # recipe until one does not fit, K tasks adapted together (1 ... 16),
#                                 # the recipes' steps phase by phase                      (7 min at most)
#   sh bench/gpu_run.sh checks    # seeds; agents in fp32 at micro-batch 8 and 64; the CUDA-only tests;
#                                 # configs/gpu-1.toml trained on ARC-AGI-1 + RE-ARC (runs/re_arc.zip,
#                                 # carried) and validated on the first 50 evaluation tasks under
#                                 # --eval_minutes, with the largest K `sizes` fitted    (6 min at most)
#   sh bench/gpu_run.sh compiled  # the default agent with --compile and CUDA graphs     (7 min at most)
#
# Carry gpu-wheels/ (make gpu-wheels) and runs/re_arc.zip with the tree. EXTRA="--device cpu --tiny"
# runs it on a CPU at tiny sizes (PYTHON=.venv/bin/python), as tests/test_gpu_check.py does.
set -u
PYTHON=${PYTHON:-python3}
dest=runs/gpu-run
mkdir -p "$dest"
status=0

check() {  # STEP SECONDS ARGS...: one gpu-check call, its report in $dest/STEP, its output in $dest/STEP.log
    step=$1 seconds=$2
    shift 2
    timeout "$seconds" make gpu-check PYTHON="$PYTHON" OUT="$dest/$step" ARGS="$* ${EXTRA:-}" \
        >"$dest/$step.log" 2>&1 || status=1
}

keep() {  # reports and logs to $OUT, flat (the device tool returns few files, two folders down)
    [ -n "${OUT:-}" ] || return 0
    for f in "$@"; do [ -f "$dest/$f" ] && cp "$dest/$f" "$OUT/$(echo "$f" | tr / -)"; done
    return 0
}

case ${1:-} in
sizes)
    check sizes 420 --minutes 6 --sections batch,adaptation,recipes --budgets batch=60,adaptation=150,recipes=30 \
        --adapt_tasks 16 --adapt_steps 5
    keep sizes/gpu_check.md sizes/gpu_check.json sizes.log
    ;;
checks)
    check checks 150 --minutes 2 --sections seeds,agents --agent_variants fp32,context --agent_batches 8,64 \
        --budgets seeds=20,agents=60
    keep checks/gpu_check.md
    # the CUDA-only tests: a step's host synchronizations under torch.cuda.set_sync_debug_mode, the
    # prompt cache's entries on the GPU (skipped on a CPU)
    PYTHONPATH="$PWD/.gpu-site" timeout 60 "$PYTHON" -m pytest -p no:cacheprovider -q -k on_a_gpu \
        tests/test_host_syncs.py tests/test_prompt_cache.py >"$dest/pytest.log" 2>&1 || status=1
    keep pytest.log
    k=1  # the largest K the sizes part fitted on this machine, if it ran here
    [ -f "$dest/sizes/gpu_check.json" ] && k=$("$PYTHON" -c "import sys; from pathlib import Path; \
from bench.gpu_check.adaptation import largest_k; print(largest_k(Path(sys.argv[1])))" "$dest/sizes/gpu_check.json")
    check arc 190 --minutes 3 --sections arc --arc_eval_minutes 1 --arc_tasks 50 --re_arc runs/re_arc.zip \
        --arc_set adapt_tasks="$k"
    keep arc/gpu_check.md arc/arc_run.log arc.log checks.log
    ;;
compiled)
    check compiled 420 --minutes 5 --sections agents --agent_variants graphs,compile --agent_batches 8,64 \
        --budgets agents=240
    keep compiled/gpu_check.md compiled.log
    ;;
*)
    echo "bench/gpu_run.sh: unknown part '${1:-}': name sizes, checks or compiled" >&2
    exit 2
    ;;
esac
tail -n 3 "$dest"/*.log
exit $status

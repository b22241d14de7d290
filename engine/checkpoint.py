"""Checkpoints that are enough to resume, written atomically and checked before they are read.

    <run>/checkpoints/step_00000020/model.safetensors   trainable weights (20: the optimizer step)
    <run>/checkpoints/step_00000020/state.pt            optimizers, scaler, RNG states, counters,
                                                        config, prompt cache
    <run>/checkpoints/step_00000020/checksums.json      sha256 of the two files above
    <run>/checkpoints/latest                            name of the newest complete checkpoint

A checkpoint is written into a hidden temporary folder and renamed into place, and `latest` is
replaced atomically after it, so a run killed at any moment leaves only complete checkpoints. A
checkpoint damaged afterwards (a failed copy, a truncated file) fails its checksums: it is named
in one line and never read; resuming a run falls back to its newest intact checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from engine.config import ConfigError

MODEL_FILE = "model.safetensors"
STATE_FILE = "state.pt"
CHECKSUMS_FILE = "checksums.json"
LATEST = "latest"


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 24), b""):
            h.update(block)
    return h.hexdigest()


def write_checksums(folder: Path) -> None:
    """Record the sha256 of a checkpoint folder's model and state files (what `damage` checks)."""
    sums = {f: _sha256(folder / f) for f in (MODEL_FILE, STATE_FILE)}
    (folder / CHECKSUMS_FILE).write_text(json.dumps(sums, indent=1) + "\n")


def save_checkpoint(run_dir: Path, step: int, weights: dict[str, torch.Tensor], state: dict, keep: int) -> Path:
    """Write checkpoint `step` (the optimizer step) and point `latest` at it; keep the newest `keep`."""
    root = run_dir / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    name = f"step_{step:08d}"
    tmp, final = root / f".tmp-{name}", root / name
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_file({k: v.detach().contiguous().cpu() for k, v in weights.items()}, str(tmp / MODEL_FILE))
    torch.save(state, tmp / STATE_FILE)
    write_checksums(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    latest_tmp = root / ".latest.tmp"
    latest_tmp.write_text(name + "\n")
    os.replace(latest_tmp, root / LATEST)
    if keep > 0:
        for old in sorted(root.glob("step_*"))[:-keep]:
            shutil.rmtree(old)
    return final


def damage(folder: Path) -> str | None:
    """What is wrong with a checkpoint folder, in a few words naming the file; None if it is intact."""
    sums_file = folder / CHECKSUMS_FILE
    if not sums_file.is_file():
        return f"{sums_file} is missing"
    try:
        sums = json.loads(sums_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        return f"{sums_file} is not valid JSON"
    for name in (MODEL_FILE, STATE_FILE):
        path = folder / name
        if not path.is_file():
            return f"{path} is missing"
        if not isinstance(sums, dict) or _sha256(path) != sums.get(name):
            return f"{path} does not match its checksum (damaged or altered)"
    return None


def find_checkpoint(path: str) -> Path:
    """The checkpoint `--resume path` names, checked: a checkpoint folder (used only if intact), or a
    run folder, its `checkpoints/` folder or its `checkpoints/latest` file (the newest intact
    checkpoint there, saying so on stderr when a newer one is damaged)."""
    p = Path(path)
    if p.name == LATEST and p.is_file():
        p = p.parent
    if (p / MODEL_FILE).exists() or (p / CHECKSUMS_FILE).exists():
        problem = damage(p)
        if problem:
            raise ConfigError(f"--resume {path}: checkpoint damaged: {problem}")
        return p
    root = p if (p / LATEST).is_file() or p.name == "checkpoints" else p / "checkpoints"
    candidates = sorted(root.glob("step_*"), reverse=True)
    if (root / LATEST).is_file():  # the newest complete one first, then the others newest first
        latest = root / (root / LATEST).read_text().strip()
        candidates = [latest] + [c for c in candidates if c != latest]
    if not candidates:
        raise ConfigError(f"--resume {path}: no checkpoint there (a run folder, its checkpoints/ or "
                          f"checkpoints/latest, or a checkpoint folder)")
    problems = []
    for folder in candidates:
        problem = damage(folder)
        if problem is None:
            if problems:
                print(f"warning: --resume {path}: {'; '.join(problems)}; resuming from {folder.name}, the newest "
                      f"intact checkpoint", file=sys.stderr)
            return folder
        problems.append(f"{folder.name} is damaged ({problem})")
    raise ConfigError(f"--resume {path}: no intact checkpoint: {'; '.join(problems)}")


def load_checkpoint(folder: Path) -> tuple[dict[str, torch.Tensor], dict]:
    """Weights and state of a checkpoint that `find_checkpoint` has checked."""
    # weights_only=False: state.pt holds RNG states (numpy arrays, tuples) that this suite wrote itself,
    # and its checksum has just been verified.
    return load_file(str(folder / MODEL_FILE)), torch.load(folder / STATE_FILE, weights_only=False)

"""Checkpoints that are enough to resume, written atomically.

    <run>/checkpoints/step_00000020/model.safetensors   trainable weights
    <run>/checkpoints/step_00000020/state.pt            optimizers, scaler, RNG states, counters,
                                                        config, prompt cache
    <run>/checkpoints/latest                            name of the newest complete checkpoint

A checkpoint is written into a hidden temporary folder and renamed into place, and `latest` is
replaced atomically after it, so a run killed at any moment leaves only complete checkpoints.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from engine.config import ConfigError

MODEL_FILE = "model.safetensors"
STATE_FILE = "state.pt"


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


def save_checkpoint(run_dir: Path, step: int, weights: dict[str, torch.Tensor], state: dict, keep: int) -> Path:
    root = run_dir / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    name = f"step_{step:08d}"
    tmp, final = root / f".tmp-{name}", root / name
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_file({k: v.detach().contiguous().cpu() for k, v in weights.items()}, str(tmp / MODEL_FILE))
    torch.save(state, tmp / STATE_FILE)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    latest_tmp = root / ".latest.tmp"
    latest_tmp.write_text(name + "\n")
    os.replace(latest_tmp, root / "latest")
    if keep > 0:
        for old in sorted(root.glob("step_*"))[:-keep]:
            shutil.rmtree(old)
    return final


def resolve_checkpoint(path: str) -> Path:
    """A checkpoint folder, a run folder or its `checkpoints/` folder -> the checkpoint folder."""
    p = Path(path)
    for root in (p, p / "checkpoints"):
        if (root / "latest").is_file():
            p = root / (root / "latest").read_text().strip()
            break
    if not (p / MODEL_FILE).is_file() or not (p / STATE_FILE).is_file():
        raise ConfigError(f"--resume {path}: no complete checkpoint there ({MODEL_FILE} and {STATE_FILE})")
    return p


def load_checkpoint(folder: Path) -> tuple[dict[str, torch.Tensor], dict]:
    # weights_only=False: state.pt holds RNG states (numpy arrays, tuples) that this suite wrote itself.
    return load_file(str(folder / MODEL_FILE)), torch.load(folder / STATE_FILE, weights_only=False)

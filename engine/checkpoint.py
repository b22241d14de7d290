"""Checkpoints that are enough to resume, written atomically and checked before they are read.

    <run>/checkpoints/step_00000020/model.safetensors   trainable weights (20: the optimizer step)
    <run>/checkpoints/step_00000020/state.pt            optimizers, scaler, RNG states, counters,
                                                        config, prompt cache
    <run>/checkpoints/step_00000020/config.json         the run's flags (--resume builds its model from them)
    <run>/checkpoints/step_00000020/checksums.json      sha256 of every other file of the folder
    <run>/checkpoints/latest                            name of the newest complete checkpoint (for a reader:
                                                        a resume takes the newest intact step_* itself)

Under --fsdp `sharded/` (torch.distributed.checkpoint) replaces model.safetensors and state.pt holds
no main optimizer (docs/distributed.md). Atomic writes, checksums, resuming: docs/runs.md, "Faults and resuming".
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import random
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from engine.errors import ConfigError
from engine.files import write_atomic
from engine.sharded import code_in_shards

MODEL_FILE = "model.safetensors"
CONFIG_FILE = "config.json"  # the run's flags, also in state.pt: read without loading the optimizers
SHARDED_DIR = "sharded"
STATE_FILE = "state.pt"
STEPS_FILE = "steps.json"  # a weights-only checkpoint's optimizer steps: which weights a bundle scores
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


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and p.name != CHECKSUMS_FILE)


def write_checksums(folder: Path) -> None:
    """Record the sha256 of every file of a checkpoint folder (what `damage` checks)."""
    sums = {f: _sha256(folder / f) for f in _files(folder)}
    (folder / CHECKSUMS_FILE).write_text(json.dumps(sums, indent=1) + "\n")


def staging_folder(run_dir: Path, step: int) -> Path:
    """The hidden folder checkpoint `step` is written into before `commit_checkpoint` renames it."""
    return run_dir / "checkpoints" / f".tmp-step_{step:08d}"


def start_checkpoint(run_dir: Path, step: int) -> Path:
    """An empty staging folder for checkpoint `step` (main process; the others then write shards)."""
    tmp = staging_folder(run_dir, step)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def commit_checkpoint(run_dir: Path, step: int, weights: dict[str, torch.Tensor] | None, state: dict,
                      keep: int) -> Path:
    """Finish the staged checkpoint `step` (main process): the weights (None: sharded, already
    there), state.pt and the checksums; rename it into place, point `latest` at it, keep the newest
    `keep`."""
    root, name = run_dir / "checkpoints", f"step_{step:08d}"
    tmp, final = staging_folder(run_dir, step), root / name
    if weights is not None:
        save_file({k: v.detach().contiguous().cpu() for k, v in weights.items()}, str(tmp / MODEL_FILE))
    torch.save(state, tmp / STATE_FILE)
    (tmp / CONFIG_FILE).write_text(json.dumps(state["config"], indent=1) + "\n")
    write_checksums(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    write_atomic(root / LATEST, name + "\n")
    if keep > 0:
        for old in sorted(root.glob("step_*"))[:-keep]:
            shutil.rmtree(old)
    return final


def is_sharded_checkpoint(folder: Path) -> bool:
    return (folder / SHARDED_DIR).is_dir()


def _json_table(path: Path) -> dict | None:
    """A checkpoint's JSON file read as a table (checksums, flags, steps), or None when it is not one
    (its checksum may match: a folder handed on may have been written to match)."""
    try:
        table = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return table if isinstance(table, dict) else None


def damage(folder: Path) -> str | None:
    """What is wrong with a checkpoint folder, in a few words naming the file; None if it is intact."""
    sums_file = folder / CHECKSUMS_FILE
    if not sums_file.is_file():
        return f"{sums_file} is missing"
    sums = _json_table(sums_file)
    if sums is None:
        return f"{sums_file} is not a JSON table of checksums"
    weights = SHARDED_DIR + "/.metadata" if any(f.startswith(SHARDED_DIR + "/") for f in sums) else MODEL_FILE
    # a weights-only checkpoint (write_weights_only) has its flags and no state.pt in its checksums
    state = [] if CONFIG_FILE in sums and STATE_FILE not in sums else [STATE_FILE]
    for name in sorted({*state, weights, *sums}):
        path = folder / name
        if not path.is_file():
            return f"{path} is missing"
        if _sha256(path) != sums.get(name):
            return f"{path} does not match its checksum (damaged or altered)"
    return None


def find_checkpoint(path: str, quiet: bool = False) -> Path:
    """The checkpoint `--resume path` names, checked: a checkpoint folder (used only if intact), or a
    run folder, its `checkpoints/` folder or its `checkpoints/latest` file (the newest intact
    checkpoint there by step, saying so on stderr when a newer one is damaged, unless `quiet`)."""
    p = Path(path)
    if p.name == LATEST and p.is_file():
        p = p.parent
    if (p / MODEL_FILE).exists() or (p / SHARDED_DIR).exists() or (p / CHECKSUMS_FILE).exists():
        problem = damage(p)
        if problem:
            raise ConfigError(f"--resume {path}: checkpoint damaged: {problem}")
        planted = code_in_state(p) or code_in_shards(p, SHARDED_DIR)
        if planted:
            raise ConfigError(f"--resume {path}: {planted}")
        return p
    root = p if (p / LATEST).is_file() or p.name == "checkpoints" else p / "checkpoints"
    # newest first by step, whatever `latest` names: a run killed between a checkpoint's rename into place
    # and `latest`'s rewrite left that checkpoint complete, and a resume from the one before would be
    # refused there (training/run_folder.refuse_an_older_start)
    candidates = sorted(root.glob("step_*"), reverse=True)
    problems = []
    if (root / LATEST).is_file():
        name = (root / LATEST).read_text().strip()
        if not (name.startswith("step_") and Path(name).name == name):
            # a checkpoint of this folder only: a file a run folder was handed with may not point elsewhere
            problems.append(f"{LATEST} names {name[:80]!r}, not a checkpoint of {root}")
    if not candidates:
        raise ConfigError(f"--resume {path}: no checkpoint there (a run folder, its checkpoints/ or "
                          f"checkpoints/latest, or a checkpoint folder)")
    for folder in candidates:
        problem = damage(folder)
        planted = None if problem else code_in_state(folder) or code_in_shards(folder, SHARDED_DIR)
        if planted:  # not damage but a file written to run code: the folder is not to be trusted, no older one used
            raise ConfigError(f"--resume {path}: {planted}")
        if problem is None:
            if problems and not quiet:
                print(f"warning: --resume {path}: {'; '.join(problems)}; resuming from {folder.name}, the newest "
                      f"intact checkpoint", file=sys.stderr)
            return folder
        problems.append(f"{folder.name} is damaged ({problem})")
    raise ConfigError(f"--resume {path}: no intact checkpoint: {'; '.join(problems)}")


# What state.pt holds beyond tensors and plain containers: numpy's RNG state, one uint32 array
# (under numpy 1 its reconstruct function had another module). Nothing else is unpickled: a state.pt
# naming any other global would run code when read, and is refused before it is read.
STATE_GLOBALS = [np.ndarray, np.dtype, type(np.dtype(np.uint32)), np._core.multiarray._reconstruct,
                 (np._core.multiarray._reconstruct, "numpy.core.multiarray._reconstruct")]
_ALLOWED = {g[1] if isinstance(g, tuple) else f"{g.__module__}.{g.__qualname__}" for g in STATE_GLOBALS}  # their names


def code_in_state(folder: Path) -> str | None:
    """What in a checkpoint's state.pt would run code when unpickled (the globals it names beyond
    STATE_GLOBALS, read from the archive without unpickling it), in a few words; None if nothing."""
    path = folder / STATE_FILE
    try:
        named = set(torch.serialization.get_unsafe_globals_in_checkpoint(path)) - _ALLOWED if path.is_file() else ()
    except (RuntimeError, ValueError, OSError, EOFError) as err:  # not a torch archive
        return f"{path} is not a torch archive ({str(err).splitlines()[0]})"
    return f"{path} names {', '.join(sorted(named))}, which would run code when read: refused" if named else None


def load_state(folder: Path) -> dict:
    """state.pt of a checkpoint that `find_checkpoint` has checked, read by torch's weights-only
    unpickler with STATE_GLOBALS allowed (tensors, numbers, strings, containers, numpy's RNG array)."""
    with torch.serialization.safe_globals(STATE_GLOBALS):
        try:
            return torch.load(folder / STATE_FILE, weights_only=True)
        except pickle.UnpicklingError as err:  # torch's message: the refused global is on a line of its own
            why = next((line for line in str(err).splitlines() if "got" in line or "Unsupported" in line), "")
            raise ConfigError(f"{folder / STATE_FILE}: holds what a checkpoint never stores, refused "
                              f"({why.strip()})") from None


def is_weights_only(folder: Path) -> bool:
    """A checked checkpoint that holds weights and flags alone (write_weights_only): it evaluates."""
    return not (folder / STATE_FILE).exists() and (folder / CONFIG_FILE).exists()


def write_weights_only(checkpoint: Path, out: Path) -> Path:
    """What prediction reads of an unsharded checked `checkpoint`, into the new folder `out`: its
    weights, its flags and its optimizer steps, with their checksums (no optimizer state, RNG states
    or prompt cache: half the size). -> out."""
    out.mkdir(parents=True)
    shutil.copy2(checkpoint / MODEL_FILE, out / MODEL_FILE)
    (out / CONFIG_FILE).write_text(json.dumps(checkpoint_flags(checkpoint), indent=1) + "\n")
    steps = load_state(checkpoint)["counters"]["optimizer_steps"]
    (out / STEPS_FILE).write_text(json.dumps({"optimizer_steps": steps}) + "\n")
    write_checksums(out)
    return out


def weights_only_steps(folder: Path) -> int:
    """The optimizer steps that trained a weights-only checkpoint's weights (0 for one written before
    it said): what its validation is logged at."""
    path = folder / STEPS_FILE
    if not path.exists():
        return 0
    steps = (_json_table(path) or {}).get("optimizer_steps")
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0:
        raise ConfigError(f"{path}: not a JSON table whose optimizer_steps is a count")
    return steps


def checkpoint_flags(folder: Path) -> dict:
    """The flags of the run that wrote a checkpoint `find_checkpoint` has checked (config.json; a
    checkpoint written before it had one: state.pt's)."""
    path = folder / CONFIG_FILE
    if not path.exists():
        return load_state(folder)["config"]
    flags = _json_table(path)
    if flags is None:
        raise ConfigError(f"{path}: not a JSON table of flag names and values")
    return flags


def load_checkpoint(folder: Path) -> tuple[dict[str, torch.Tensor], dict]:
    """Weights and state of an unsharded checkpoint that `find_checkpoint` has checked."""
    return load_file(str(folder / MODEL_FILE)), load_state(folder)

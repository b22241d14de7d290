"""A sharded checkpoint (`--fsdp`, torch.distributed.checkpoint) read without running code.

torch.distributed.checkpoint reads a checkpoint's `.metadata` with plain `pickle.load` and every
entry that is not a tensor with `torch.load(weights_only=False)` (torch 2.11 to 2.13), so a sharded
folder handed on could run code when resumed. Its own extension points close both: `code_in_shards`
unpickles `.metadata` with only the classes DCP writes there allowed (refused before DCP reads it,
as engine/checkpoint.code_in_state refuses a state.pt), and `load_shards` loads with a planner that
checks each non-tensor entry with torch's weights-only unpickler before DCP's default one reads it.
"""

from __future__ import annotations

import inspect
import io
import pickle
from pathlib import Path, PurePath

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import CheckpointException, DefaultLoadPlanner
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint.metadata import Metadata

from engine.errors import ConfigError

METADATA_FILE = ".metadata"
# beyond the classes of torch.distributed.checkpoint.metadata, what DCP pickles into .metadata: its
# storage index, a tensor's layout (by name), sizes, and the path it was saved to (a pathlib class,
# `pathlib._local`'s from Python 3.13 on)
METADATA_GLOBALS = {("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("torch.serialization", "_get_layout"),
                    ("torch", "Size"), ("collections", "OrderedDict")}
PATH_MODULES = ("pathlib", "pathlib._local")
TORCH_VALUES = (torch.dtype, torch.layout, torch.memory_format)  # torch.float32 and the like, pickled by name


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles what DCP writes into .metadata and refuses any other global before it is looked up."""

    def find_class(self, module: str, name: str) -> object:
        ours = module == dcp_metadata.__name__ and inspect.isclass(getattr(dcp_metadata, name, None))
        torch_value = module == "torch" and isinstance(getattr(torch, name, None), TORCH_VALUES)
        if ours or torch_value or (module, name) in METADATA_GLOBALS:
            return super().find_class(module, name)
        if module in PATH_MODULES:
            found = super().find_class(module, name)  # the standard library's own module: importing it runs nothing
            if inspect.isclass(found) and issubclass(found, PurePath):
                return found
        raise pickle.UnpicklingError(f"{module}.{name}")


def sharded_metadata(shards: Path) -> Metadata:
    """The `.metadata` of a sharded checkpoint's folder (`sharded/`), unpickled with only DCP's own
    classes allowed; ConfigError naming the file and the global when it names anything else."""
    path = shards / METADATA_FILE
    try:
        with open(path, "rb") as f:
            found = _MetadataUnpickler(f).load()
    except pickle.UnpicklingError as err:
        raise ConfigError(f"{path} names {err}, which would run code when read: refused") from None
    except (EOFError, ValueError, TypeError, AttributeError, OSError) as err:  # damaged beyond its checksum's reach
        raise ConfigError(f"{path} is not torch.distributed.checkpoint's metadata ({err})") from None
    if not isinstance(found, Metadata):
        raise ConfigError(f"{path} is not torch.distributed.checkpoint's metadata (a {type(found).__name__})")
    return found


def code_in_shards(folder: Path, shards: str) -> str | None:
    """What in checkpoint `folder`'s `shards` subfolder's .metadata would run code when DCP reads it, in a
    few words; None when nothing would (or the checkpoint is not sharded)."""
    if not (folder / shards / METADATA_FILE).is_file():
        return None
    try:
        sharded_metadata(folder / shards)
    except ConfigError as err:
        return str(err)
    return None


class WeightsOnlyPlanner(DefaultLoadPlanner):
    """DCP's default load planner, each non-tensor entry (an optimizer's param groups, a counter) first
    read by torch's weights-only unpickler: one naming anything else is refused (ConfigError) before the
    default planner unpickles it."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        try:
            torch.load(value, weights_only=True)
        except pickle.UnpicklingError as err:
            why = next((line for line in str(err).splitlines() if "GLOBAL" in line or "Unsupported" in line), "")
            raise ConfigError(f"a sharded checkpoint's entry {read_item.dest_index.fqn} would run code when read: "
                              f"refused ({why.strip()})") from None
        value.seek(0)
        super().load_bytes(read_item, value)


def load_shards(state_dict: dict, shards: Path) -> None:
    """DCP's load of `state_dict` (its tensors filled in place, each process its own shards) from the
    folder `shards`, with `WeightsOnlyPlanner`. Collective. ConfigError when an entry would run code, or
    when the checkpoint lacks a key or holds another shape (DCP wraps every failure, on every process,
    in one CheckpointException: the first process's is said)."""
    try:
        dcp.load(state_dict, checkpoint_id=shards, planner=WeightsOnlyPlanner())
    except CheckpointException as wrapped:
        err = next(iter(wrapped.failures.values()))[0]
        if isinstance(err, ConfigError):
            raise ConfigError(f"{shards}: {err}") from None
        if isinstance(err, (RuntimeError, ValueError)):  # DCP's errors for a missing key or another shape
            raise ConfigError(f"{shards}: the checkpoint does not fit the model ({str(err).splitlines()[0]}): "
                              f"resume with the flags and data it was trained with") from None
        raise

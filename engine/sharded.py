"""A sharded checkpoint (`--fsdp`, torch.distributed.checkpoint) written, and read without running code.

torch.distributed.checkpoint (DCP) reads a checkpoint's `.metadata` with plain `pickle.load` (and,
when that fails, a rank's own `__R.metadata` the same way) and every entry that is not a tensor
with `torch.load(weights_only=False)` (torch 2.11 to 2.13), so a sharded folder handed on could run
code when resumed. Its own extension points close all three: `CheckedReader` (DCP's file reader)
reads `.metadata` by `sharded_metadata`, which unpickles only what DCP writes there, and asks for no
rank's own file; `WeightsOnlyPlanner` (DCP's default load planner) has each non-tensor entry read
by torch's weights-only unpickler first. `code_in_shards` refuses a planted `.metadata` before
anything is read, as engine/checkpoint.code_in_state refuses a planted state.pt. `save_shards`,
`restore_shards` and `shard_whole_state` are a sharded run's checkpoint (training/run_state.py).
"""

from __future__ import annotations

import inspect
import io
import pickle
from pathlib import Path, PurePath

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import CheckpointException, DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint import filesystem as dcp_filesystem
from torch.distributed.checkpoint import metadata as dcp_metadata
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
    set_state_dict,
)

from engine.errors import ConfigError

METADATA_FILE = ".metadata"
# beyond the classes torch.distributed.checkpoint.metadata defines, what DCP pickles into .metadata:
# its storage index, a tensor's layout (by name), sizes, and the path it was saved to (a pathlib
# class, `pathlib._local`'s from Python 3.13 on)
METADATA_GLOBALS = {(dcp_filesystem.__name__, "_StorageInfo"), ("torch.serialization", "_get_layout"),
                    ("torch", "Size"), ("collections", "OrderedDict")}
PATH_MODULES = ("pathlib", "pathlib._local")
TORCH_VALUES = (torch.dtype, torch.layout, torch.memory_format)  # torch.float32 and the like, pickled by name
# the only objects whose state a BUILD opcode may set: DCP's records (on a class, BUILD would set
# class attributes for the whole process)
BUILT = (*(c for c in vars(dcp_metadata).values() if inspect.isclass(c) and c.__module__ == dcp_metadata.__name__),
         dcp_filesystem._StorageInfo)


class _Refused(pickle.UnpicklingError):
    """A global or a BUILD that what DCP writes never holds."""


class _MetadataUnpickler(pickle._Unpickler):
    """Unpickles what DCP writes into .metadata and refuses any other global before it is looked up,
    and a BUILD on anything but DCP's records. Python's own unpickler, not the C one: only its
    dispatch table lets BUILD be checked (find_class never sees it)."""

    dispatch = dict(pickle._Unpickler.dispatch)

    def find_class(self, module: str, name: str) -> object:
        found = getattr(dcp_metadata, name, None) if module == dcp_metadata.__name__ else None
        ours = inspect.isclass(found) and found.__module__ == dcp_metadata.__name__
        torch_value = module == "torch" and isinstance(getattr(torch, name, None), TORCH_VALUES)
        if ours or torch_value or (module, name) in METADATA_GLOBALS:
            return super().find_class(module, name)
        if module in PATH_MODULES:
            try:
                found = super().find_class(module, name)  # the standard library's module: importing it runs nothing
            except (ImportError, AttributeError):  # pathlib._local before Python 3.13, a name it lacks
                found = None
            if inspect.isclass(found) and issubclass(found, PurePath):
                return found
        raise _Refused(f"names {module}.{name}, which would run code when read")

    def load_build(self) -> None:
        if not isinstance(self.stack[-2], BUILT):  # [-1]: the state, [-2]: what it is set on
            raise _Refused(f"sets the state of a {type(self.stack[-2]).__name__}, which DCP never writes")
        super().load_build()

    dispatch[pickle.BUILD[0]] = load_build


def sharded_metadata(shards: Path) -> Metadata:
    """The `.metadata` of a sharded checkpoint's folder `shards` (its `sharded/`), unpickled by
    `_MetadataUnpickler`, every shard it names a plain file of that folder. ConfigError naming the
    file: a global or state it may not hold, or not DCP's metadata."""
    path = shards / METADATA_FILE
    try:
        with open(path, "rb") as f:
            found = _MetadataUnpickler(f).load()
    except _Refused as err:
        raise ConfigError(f"{path} {err}: refused") from None
    except Exception as err:  # noqa: BLE001 - any failure to unpickle a file handed on: the file, not the suite
        raise ConfigError(f"{path} is not torch.distributed.checkpoint's metadata ({type(err).__name__}: "
                          f"{err})") from None
    problem = _metadata_problem(found, shards)
    if problem:
        raise ConfigError(f"{path} is not torch.distributed.checkpoint's metadata ({problem})")
    return found


def _metadata_problem(found: object, shards: Path) -> str | None:
    """What unpickled metadata lacks to be what DCP wrote for `shards`, or None: every entry's shard a
    plain file of the folder (not a link, a device or a path out of it, which DCP would read)."""
    if not isinstance(found, Metadata):
        return f"a {type(found).__name__}"
    if found.storage_meta is not None and not isinstance(found.storage_meta, StorageMeta):
        return f"its storage_meta is a {type(found.storage_meta).__name__}"
    if not isinstance(found.storage_data, dict):
        return "no storage index"
    for info in found.storage_data.values():
        rel = getattr(info, "relative_path", None)
        if not isinstance(info, dcp_filesystem._StorageInfo) or not isinstance(rel, str):
            return "an entry without its shard file"
        part = PurePath(rel)
        file = shards / part
        if part.is_absolute() or ".." in part.parts or file.is_symlink() or not file.is_file():
            return f"an entry read from {rel!r}, not a file of the folder"
    return None


def code_in_shards(folder: Path, shards: str) -> str | None:
    """What in checkpoint `folder`'s `shards` subfolder's .metadata would run code or read outside it
    when DCP reads it, in a few words; None when nothing would (or the checkpoint is not sharded)."""
    if not (folder / shards / METADATA_FILE).is_file():
        return None
    try:
        sharded_metadata(folder / shards)
    except ConfigError as err:
        return str(err)
    return None


class CheckedReader(FileSystemReader):
    """DCP's file reader of the folder `path`, its metadata `metadata` (read by `sharded_metadata`; None:
    read it here). Its read_metadata takes no keyword arguments, which is how DCP tells a reader that
    cannot read a rank's own `__R.metadata`: DCP falls back to that file, unpickled unrestricted, when
    reading `.metadata` fails."""

    def __init__(self, path: Path, metadata: Metadata | None = None) -> None:
        super().__init__(path)
        self.checked = metadata

    def read_metadata(self, *args: object) -> Metadata:
        found = self.checked or sharded_metadata(Path(self.path))
        found.storage_meta = found.storage_meta or StorageMeta()
        found.storage_meta.load_id = self.load_id  # as FileSystemReader's own read_metadata does
        return found


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


# DCP's planner errors for a key the checkpoint lacks and a tensor of another shape
DOES_NOT_FIT = ("Missing key in checkpoint state_dict", "Size mismatch")
# DCP's file reader's error for a shard whose tensor is not the shape its metadata gives (its sha256
# matched, so not damage: a .metadata rewritten with its checksums)
SHARD_OF_ANOTHER_SIZE = "mismatch sizes"


def load_shards(state_dict: dict, shards: Path, metadata: Metadata | None = None) -> None:
    """DCP's load of `state_dict` (its tensors filled in place, each process its own shards) from the
    folder `shards` whose metadata `sharded_metadata` read (None: read here), by `CheckedReader` and
    `WeightsOnlyPlanner`. Collective. ConfigError when the checkpoint holds what would run code, or
    lacks a key or holds another shape (DCP wraps a failure on any process, one process alone too, in
    one CheckpointException on every process: the first process's is said)."""
    # read before DCP's load, so a refusal is one line (inside the load it would come wrapped)
    metadata = metadata or sharded_metadata(shards)
    try:
        dcp.load(state_dict, storage_reader=CheckedReader(shards, metadata), planner=WeightsOnlyPlanner())
    except CheckpointException as wrapped:
        _refuse(next(iter(wrapped.failures.values()))[0], shards)
        raise


def _refuse(err: BaseException, shards: Path) -> None:
    """A ConfigError for a failure of `load_shards` that is the checkpoint's, not the suite's; else nothing."""
    if isinstance(err, ConfigError):
        raise ConfigError(f"{shards}: {err}") from None
    said = str(err).strip()
    if isinstance(err, (RuntimeError, ValueError)) and said.startswith(DOES_NOT_FIT):
        raise ConfigError(f"{shards}: the checkpoint does not fit the model ({said.splitlines()[0]}): resume with "
                          f"the flags and data it was trained with") from None
    if isinstance(err, AssertionError) and SHARD_OF_ANOTHER_SIZE in said:
        raise ConfigError(f"{shards}: a shard holds another shape than its {METADATA_FILE} says (altered, or not "
                          f"this model's sharding): {said.splitlines()[0][:200]}") from None


# Frozen weights (a frozen Qwen, LoRA's base) come from their source, never from a checkpoint.
TRAINABLE_ONLY = StateDictOptions(ignore_frozen_params=True)


def save_shards(model: nn.Module, optimizer: torch.optim.Optimizer, shards: Path) -> None:
    """Collective: each process writes its shards of `model`'s trainable weights and of `optimizer`'s
    state into the folder `shards`, whatever the processes' number."""
    model_state, optimizer_state = get_state_dict(model, optimizer, options=TRAINABLE_ONLY)
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=shards)


def restore_shards(model: nn.Module, optimizer: torch.optim.Optimizer, shards: Path) -> None:
    """Collective: `model`'s trainable weights and `optimizer`'s state (sharded or not) from the folder
    `shards`, each process reading the parts it holds, whatever sharding wrote them. ConfigError when
    the checkpoint does not fit the model or holds what would run code."""
    model_state, optimizer_state = get_state_dict(model, optimizer, options=TRAINABLE_ONLY)
    both = {"model": model_state, "optimizer": optimizer_state}
    metadata = sharded_metadata(shards)  # read once, by the reader that runs no code
    written = {k[len("model."):] for k in metadata.state_dict_metadata if k.startswith("model.")}
    unexpected = sorted(written - set(model_state))  # DCP reads only what is asked for: say what it would skip
    if unexpected:
        raise ConfigError(f"{shards}: the checkpoint does not fit the model (unexpected {unexpected[:3]}): "
                          f"resume with the flags it was trained with")
    load_shards(both, shards, metadata)
    # not strict: the frozen weights, left out on purpose, are the ones the model has
    set_state_dict(model, optimizer, model_state_dict=both["model"], optim_state_dict=both["optimizer"],
                   options=StateDictOptions(ignore_frozen_params=True, strict=False))


def shard_whole_state(model: nn.Module, optimizer: torch.optim.Optimizer, weights: dict[str, torch.Tensor],
                      optimizer_state: dict) -> None:
    """An unsharded checkpoint's `weights` (name -> whole tensor) and `optimizer_state` (its
    state_dict, parameters named by index) into sharded `model` and `optimizer`: each process keeps
    its shards."""
    full = StateDictOptions(full_state_dict=True, ignore_frozen_params=True)
    set_model_state_dict(model, weights, options=full)
    # the optimizer's state names parameters by index in the unsharded file, by name here
    names = {id(p): n for n, p in model.named_parameters()}
    order = [names[id(p)] for group in optimizer.param_groups for p in group["params"]]
    set_optimizer_state_dict(model, optimizer, options=full, optim_state_dict={
        "state": {order[i]: v for i, v in optimizer_state["state"].items()},
        "param_groups": [{**g, "params": [order[i] for i in g["params"]]} for g in optimizer_state["param_groups"]]})

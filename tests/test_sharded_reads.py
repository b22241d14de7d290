"""A sharded checkpoint (torch.distributed.checkpoint) read without running code: its .metadata and
its non-tensor entries, each a pickle that DCP itself would unpickle unrestricted (engine/sharded.py).
The checkpoints are written by DCP in this one process; tests/test_fsdp.py resumes real ones."""

import pickle

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import CheckpointException

from engine.checkpoint import (
    SHARDED_DIR,
    commit_checkpoint,
    find_checkpoint,
    staging_folder,
    start_checkpoint,
    write_checksums,
)
from engine.errors import ConfigError
from engine.sharded import METADATA_FILE, CheckedReader, load_shards, sharded_metadata

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


class Planted:
    """Unpickled, it creates the file `marker`: what a planted pickle could do with any other call."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


def state(w: torch.Tensor) -> dict:
    return {"model": {"w": w}, "optimizer": {"param_groups": [{"lr": 1e-3, "betas": (0.9, 0.99), "params": ["w"]}]}}


def sharded_checkpoint(run, step: int, saved: dict):
    """Checkpoint `step` of run folder `run` as a sharded run commits it: DCP's shards, then state.pt."""
    start_checkpoint(run, step)
    dcp.save(saved, checkpoint_id=staging_folder(run, step) / SHARDED_DIR)
    return commit_checkpoint(run, step, None, {"config": {}}, keep=0)


def test_a_round_trip_fills_the_tensors_and_plain_entries(tmp_path):
    w = torch.randn(3, 4)
    folder = sharded_checkpoint(tmp_path / "run", 1, state(w))
    assert find_checkpoint(str(tmp_path / "run")) == folder
    into = state(torch.zeros(3, 4))
    into["optimizer"]["param_groups"][0]["lr"] = 0.0
    load_shards(into, folder / SHARDED_DIR)
    assert torch.equal(into["model"]["w"], w) and into["optimizer"] == state(w)["optimizer"]
    assert "model.w" in sharded_metadata(folder / SHARDED_DIR).state_dict_metadata


def test_metadata_that_would_run_code_is_refused_before_it_is_read(tmp_path):
    """Its checksums rewritten to match (a folder handed on may be): refused in one line, nothing run,
    and no older checkpoint taken in its place. DCP's own read runs it (what the test guards against)."""
    run, marker = tmp_path / "run", tmp_path / "ran"
    sharded_checkpoint(run, 1, state(torch.randn(3, 4)))
    newest = sharded_checkpoint(run, 2, state(torch.randn(3, 4)))
    (newest / SHARDED_DIR / METADATA_FILE).write_bytes(pickle.dumps(Planted(marker)))
    write_checksums(newest)
    for form in (run, newest):
        with pytest.raises(ConfigError, match=r"\.metadata names io\.open, which would run code when read: refused"):
            find_checkpoint(str(form))
    assert not marker.exists()
    dcp.FileSystemReader(newest / SHARDED_DIR).read_metadata()  # DCP's own read runs it: why engine/sharded.py is
    assert marker.exists()


def test_an_entry_that_would_run_code_is_refused(tmp_path):
    """DCP's own load runs it (what the test guards against); load_shards refuses it, naming the entry."""
    marker = tmp_path / "ran"
    dcp.save({**state(torch.randn(3, 4)), "counter": Planted(marker)}, checkpoint_id=tmp_path / "shards")
    sharded_metadata(tmp_path / "shards")  # the metadata itself is DCP's own
    with pytest.raises(ConfigError, match=r"entry counter would run code when read: refused \(.*open"):
        load_shards({"counter": None}, tmp_path / "shards")
    assert not marker.exists()
    dcp.load({"counter": None}, checkpoint_id=tmp_path / "shards")
    assert marker.exists()


@pytest.mark.parametrize("into,why", [({"model": {"v": torch.zeros(3, 4)}}, "Missing key"),
                                      ({"model": {"w": torch.zeros(4, 4)}}, "Size mismatch")])
def test_a_checkpoint_that_does_not_fit_is_one_line(into, why, tmp_path):
    dcp.save(state(torch.randn(3, 4)), checkpoint_id=tmp_path / "shards")
    with pytest.raises(ConfigError, match=f"does not fit the model \\({why}") as err:
        load_shards(into, tmp_path / "shards")
    assert "\n" not in str(err.value)


def test_a_shard_of_another_shape_than_its_metadata_is_one_line(tmp_path):
    """A .metadata rewritten to give a tensor a larger shape than its shard holds (its checksums
    rewritten too: not damage): DCP's reader asserts; here one line naming the folder."""
    shards = tmp_path / "shards"
    dcp.save(state(torch.randn(3, 4)), checkpoint_id=shards)

    def larger(metadata):
        entry = metadata.state_dict_metadata["model.w"]
        entry.size = entry.chunks[0].sizes = torch.Size([4, 4])

    planted_metadata(shards, larger)
    with pytest.raises(ConfigError, match="a shard holds another shape than its .metadata says") as err:
        load_shards(state(torch.zeros(4, 4)), shards)
    assert "\n" not in str(err.value) and str(shards) in str(err.value)


def planted_metadata(shards, change) -> None:
    """Rewrite the .metadata DCP wrote in `shards` as `change(metadata)` leaves it (read here by DCP's
    own unpickler: the file is the test's)."""
    path = shards / METADATA_FILE
    metadata = pickle.loads(path.read_bytes())
    change(metadata)
    path.write_bytes(pickle.dumps(metadata))


def test_no_rank_file_is_read_when_the_metadata_fails(tmp_path):
    """DCP falls back to a rank's own __0.metadata, unpickled unrestricted, when reading .metadata
    fails (here its storage_meta is a number): refused, nothing run."""
    shards, marker = tmp_path / "shards", tmp_path / "ran"
    dcp.save(state(torch.randn(3, 4)), checkpoint_id=shards)
    planted_metadata(shards, lambda m: setattr(m, "storage_meta", 1))
    (shards / f"__0{METADATA_FILE}").write_bytes(pickle.dumps(Planted(marker)))
    with pytest.raises(ConfigError, match="not torch.distributed.checkpoint's metadata .its storage_meta is a int"):
        load_shards(state(torch.zeros(3, 4)), shards)
    with pytest.raises(CheckpointException, match="metadata is None"):  # past that check, DCP with our reader alone
        dcp.load(state(torch.zeros(3, 4)), storage_reader=CheckedReader(shards))
    assert not marker.exists()
    with pytest.raises(BaseException, match="metadata"):  # DCP's own reader runs the rank file
        dcp.load(state(torch.zeros(3, 4)), checkpoint_id=shards)
    assert marker.exists()


def test_a_shard_outside_the_folder_is_refused(tmp_path):
    shards = tmp_path / "shards"
    dcp.save(state(torch.randn(3, 4)), checkpoint_id=shards)
    (tmp_path / "outside.distcp").write_bytes(next(shards.glob("*.distcp")).read_bytes())

    def elsewhere(metadata):
        for info in metadata.storage_data.values():
            info.relative_path = "../outside.distcp"

    planted_metadata(shards, elsewhere)
    with pytest.raises(ConfigError, match=r"an entry read from '../outside.distcp', not a file of the folder"):
        load_shards(state(torch.zeros(3, 4)), shards)


def test_metadata_may_not_set_a_class_attribute(tmp_path):
    """A BUILD opcode on a class (which find_class never sees) would set the attribute for the whole
    process: refused, the class untouched; the C unpickler DCP uses sets it."""
    from pathlib import PurePath

    payload = b"\x80\x04cpathlib\nPurePath\nN}X\x07\x00\x00\x00plantedctorch\nSize\ns\x86b."
    (tmp_path / METADATA_FILE).write_bytes(payload)
    with pytest.raises(ConfigError, match="sets the state of a type, which DCP never writes: refused"):
        sharded_metadata(tmp_path)
    assert not hasattr(PurePath, "planted")
    try:
        assert pickle.loads(payload).planted is torch.Size
    finally:
        del PurePath.planted


@pytest.mark.parametrize("payload,why", [(b"not a pickle", "is not torch.distributed.checkpoint's metadata"),
                                         (pickle.dumps([1, 2]), r"metadata \(a list\)"),
                                         (b"\x80\x04cos\nsystem\n.", r"names os\.system, which would run code"),
                                         (b"\x80\x04cpathlib\nos\n.", r"names pathlib\.os, which would run code")])
def test_metadata_that_is_not_dcps_is_one_line(payload, why, tmp_path):
    (tmp_path / METADATA_FILE).write_bytes(payload)
    with pytest.raises(ConfigError, match=why) as err:
        sharded_metadata(tmp_path)
    assert "\n" not in str(err.value)

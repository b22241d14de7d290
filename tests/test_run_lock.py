"""One writer a run folder (training/run_folder.holding): the lock, its refusal, and a lock its
filesystem kept for a process that is gone. The run refused while another trains, and resumed after
a SIGKILL: tests/test_loop_faults.py."""

import fcntl
import os
import socket

import pytest
import torch

import training
from engine.distributed import Dist
from engine.errors import ConfigError
from training.run_folder import LOCK_FILE, holding


def held_by(run_dir, pid):
    """The folder's lock taken here, on another open file (flock excludes it even in this process),
    naming `pid` on this host as its holder."""
    run_dir.mkdir(exist_ok=True)
    handle = open(run_dir / LOCK_FILE, "w")  # noqa: SIM115 - the lock lasts while the test holds it
    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    handle.write(f"{socket.gethostname()} pid {pid}\n")
    handle.flush()
    return handle


def test_a_held_folder_is_refused_naming_its_holder_and_freed_when_it_ends(tmp_path):
    with holding(tmp_path / "run", Dist()):
        assert (tmp_path / "run" / LOCK_FILE).read_text() == f"{socket.gethostname()} pid {os.getpid()}\n"
        with pytest.raises(ConfigError, match=f"in use by pid {os.getpid()} on {socket.gethostname()}"):
            with holding(tmp_path / "run", Dist()):
                pass
    with holding(tmp_path / "run", Dist()):  # released on exit
        pass


def test_a_lock_kept_for_a_process_that_is_gone_says_how_to_clear_it(tmp_path):
    gone = 2 ** 22 + 12345  # above Linux's default pid_max: no such process
    handle = held_by(tmp_path / "run", gone)
    try:
        with pytest.raises(ConfigError, match=f"locked for pid {gone} .* which has ended.*delete .*{LOCK_FILE}"):
            with holding(tmp_path / "run", Dist()):
                pass
    finally:
        handle.close()


def test_a_second_run_on_a_held_folder_writes_nothing(small_cfg, tmp_path):
    """fixed.py refused on a folder in use: exit 2, and the folder as it was."""
    run = tmp_path / "run"
    handle = held_by(run, os.getpid())
    try:
        before = sorted(p.name for p in run.rglob("*"))
        with pytest.raises(ConfigError, match="in use by pid"):
            training.train(small_cfg(run_dir=str(run), max_batches=1), torch.device("cpu"))
        assert sorted(p.name for p in run.rglob("*")) == before
    finally:
        handle.close()


def test_a_failed_start_leaves_no_folder_made_for_its_lock(small_cfg, tmp_path):
    with pytest.raises(ConfigError):
        training.train(small_cfg(run_dir=str(tmp_path / "run"), max_batches=1, agent="no_such_agent"),
                       torch.device("cpu"))
    assert not (tmp_path / "run").exists()

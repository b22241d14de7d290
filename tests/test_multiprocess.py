"""Two processes on this CPU machine (gloo): the same step as one process with twice the batch."""

import json
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import ROOT
from tests.test_end_to_end import scalars

BIN = "/".join(sys.executable.split("/")[:-1])


def args(arc_folder, run_dir, batch):
    # Only the mean-refinement term: the RL noise differs per process by design.
    return ["fixed.py", "--data", str(arc_folder), "--batch_size", str(batch), "--max_batches", "1",
            "--agent_channels", "16", "--prompt_dim", "32", "--eval_tasks", "3", "--efe_weight", "0",
            "--mean_weight", "1", "--run_dir", str(run_dir), "--prompt_cache_dir", "none", "--log_every", "1"]


def weights(run_dir):
    return load_file(str(run_dir / "checkpoints" / "step_00000001" / "model.safetensors"))


@pytest.mark.slow
@pytest.mark.parametrize("launcher", [
    [f"{BIN}/torchrun", "--nproc_per_node", "2"],
    [f"{BIN}/accelerate", "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
     "--mixed_precision", "no", "--dynamo_backend", "no"],
])
def test_two_processes_equal_one_with_twice_the_batch(launcher, arc_folder, tmp_path):
    one = subprocess.run([sys.executable, *args(arc_folder, tmp_path / "one", 4)], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert one.returncode == 0, one.stderr[-1500:]
    two = subprocess.run([*launcher, *args(arc_folder, tmp_path / "two", 2)], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert two.returncode == 0, two.stderr[-3000:]
    assert "world_size=2" in two.stderr and two.stderr.count("world_size=") == 1, "start-up line from rank 0 only"
    assert two.stdout.count("done:") == 1
    # Adam's first step moves a weight by about lr * sign(gradient) whatever the gradient's size, so
    # the weights cannot tell a gradient averaged over 8 samples from one twice or half as large: the
    # gradient norm before clipping can, and is compared first.
    norms = [scalars(tmp_path / run)["grad/norm"] for run in ("one", "two")]
    assert norms[0][0][0] == norms[1][0][0] == 1
    assert norms[1][0][1] == pytest.approx(norms[0][0][1], rel=1e-4)
    a, b = weights(tmp_path / "one"), weights(tmp_path / "two")
    shared = [k for k in a if not k.startswith("policy.head.")]  # the RL head learns from per-process noise
    assert any(k.startswith("agent.") for k in shared) and any(k.startswith("prompt.") for k in shared)
    # a rounding difference in a near-zero gradient (summed in another order) can show as a fraction of lr
    for k in shared:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5)
    s1 = json.loads((tmp_path / "one" / "summary.json").read_text())
    s2 = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert s2["world_size"] == 2
    # Evaluation is gathered from both processes: the copy baseline is computed on the same pairs.
    assert s1["eval/copy_cell_acc"] == pytest.approx(s2["eval/copy_cell_acc"])

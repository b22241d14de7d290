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


NAN_ON_RANK_1 = """
import json, sys, torch
sys.path.insert(0, {root!r})
import fixed
from engine.config import Config
from engine.distributed import init_distributed, shutdown

cfg = Config.from_flags(data={data!r}, batch_size=2, agent_channels=16, prompt_dim=32, amp={amp!r},
                        fp16_init_scale=256.0, prompt_cache_dir="none")
dist, device = init_distributed("cpu")
fixed.seed_everything(0)
data = fixed.build_data(cfg, device, dist)
state = fixed.build_train_state(cfg, device, dist)
data.sampler.set_epoch(0)
first, second = [b for _, b in zip(range(2), data.loader)]
main = [p for g in state.optimizer.param_groups for p in g["params"]]
backward = state.amp.backward

def poison_rank_1(loss):
    backward(loss)
    if dist.rank == 1:
        state.model.agent.head.out.bias.grad[0] = float("nan")

state.amp.backward = poison_rank_1
before, scale = [p.detach().clone() for p in main], state.amp.scale
skipped = fixed.train_step(state, [first], cfg, dist)["amp/stepped"] == 0.0
unchanged = all(torch.equal(a, p) for a, p in zip(before, main))
state.amp.backward = backward
stepped = fixed.train_step(state, [second], cfg, dist)["amp/stepped"] == 1.0
json.dump(dict(skipped=skipped, unchanged=unchanged, scale_ratio=state.amp.scale / scale, stepped=stepped,
               skipped_steps=state.amp.skipped_steps, checksum=sum(float(p.double().sum()) for p in main)),
          open({out!r} + f"/rank{{dist.rank}}.json", "w"))
shutdown()
"""


@pytest.mark.slow
@pytest.mark.parametrize("amp", ["off", "fp16"])
def test_a_nan_gradient_on_one_process_skips_the_step_on_every_process(amp, arc_folder, tmp_path):
    """docs/invariants.md #3 over processes: rank 1 alone gets a NaN gradient; the reduction carries
    it to rank 0, both skip the step (fp16: both halve the scale), neither waits for the other
    (a timeout would say so), and the next step is taken by both, to the same weights."""
    script = tmp_path / "nan_on_rank_1.py"
    script.write_text(NAN_ON_RANK_1.format(root=str(ROOT), data=str(arc_folder), amp=amp, out=str(tmp_path)))
    out = subprocess.run([f"{BIN}/torchrun", "--nproc_per_node", "2", str(script)], cwd=ROOT, capture_output=True,
                         text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for r in ranks:
        assert r["skipped"] and r["unchanged"] and r["stepped"] and r["skipped_steps"] == 1, r
        # fp16: halved by the skip, then unchanged by one good step (growth needs 2000)
        assert r["scale_ratio"] == (0.5 if amp == "fp16" else 1.0)
    assert ranks[0]["checksum"] == ranks[1]["checksum"]

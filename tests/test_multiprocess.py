"""Two processes on this CPU machine (gloo): the same step as one process with twice the batch."""

import json
import socket

import pytest
import torch
from safetensors.torch import load_file

import training
from tests.conftest import (
    ROOT,
    TORCHRUN,
    TORCHRUN_MODULE,
    WARM_PYTHON_SCRIPT,
    accelerate_launch,
    run_command,
    start_command,
)
from tests.test_end_to_end import scalars

# each launcher's workers forked warm (tests/warm_python.py): its script is WARM_PYTHON_SCRIPT, then fixed.py
pytestmark = pytest.mark.usefixtures("warm_python")


def args(arc_folder, run_dir, batch, *extra):
    # Only the mean-refinement term, and an RL head that does not move: its noise differs per process by
    # design, and the mean refinement reads its mean. The final validation adapts each task 4 steps (as
    # small_cfg's): these tests compare what the processes gather, not what adaptation reaches.
    return ["fixed.py", "--data", str(arc_folder), "--batch_size", str(batch), "--agent_channels", "16",
            "--prompt_dim", "32", "--eval_tasks", "3", "--efe_weight", "0", "--mean_weight", "1", "--rl_lr", "0",
            "--ttt_steps", "4", "--ttt_small_steps", "0",
            "--run_dir", str(run_dir), "--prompt_cache_dir", "none", "--log_every", "1", *extra]


def weights(run_dir, step):
    return load_file(str(run_dir / "checkpoints" / f"step_{step:08d}" / "model.safetensors"))


# the repository's 8-GPU config with 2 processes (without a GPU, accelerate's multi-GPU launch uses gloo)
ACCELERATE = accelerate_launch("1x8-ddp.yaml")
# Two windows of two micro-batches; a trainable Qwen re-reads its prompts with gradients in every
# one (between refreshes each process's cache serves what that process saw, so one process with the
# whole batch would be served otherwise: test_refreshes_under_no_sync_keep_every_process_equal).
TWO_WINDOWS = ("--max_batches", "4", "--grad_accum", "2", "--prompt_refresh", "1")


@pytest.mark.slow
# (Qwen in full: tests/test_fsdp.py compares one process and two under DDP, and FSDP with both)
@pytest.mark.parametrize("launcher,qwen_train", [(TORCHRUN, "frozen"), (ACCELERATE, "lora")],
                         ids=["torchrun", "accelerate-lora"])
def test_two_processes_equal_one_with_twice_the_batch(launcher, qwen_train, arc_folder, tmp_path):
    extra = (*TWO_WINDOWS, "--qwen_train", qwen_train)
    assert training.main(args(arc_folder, tmp_path / "one", 4, *extra)[1:]) == 0  # one process: in this one
    two = run_command([*launcher, WARM_PYTHON_SCRIPT, *args(arc_folder, tmp_path / "two", 2, *extra)])
    assert two.returncode == 0, two.stderr[-3000:]
    assert "world_size=2" in two.stderr and two.stderr.count("world_size=") == 1, "start-up line from rank 0 only"
    assert two.stdout.count("done:") == 1
    # Adam's first step moves a weight by about lr * sign(gradient) whatever the gradient's size, so
    # the weights cannot tell a gradient averaged over 8 samples from one twice or half as large: the
    # gradient norms before clipping can, and are compared first (Qwen's on its refresh steps too). The
    # logged loss is every process's mean (engine/run_logger.IntervalMeans), so it reads as one process's.
    for tag in ("grad/norm", "grad/qwen_norm", "loss/combined"):
        # dict: run scalars are logged again at the epoch's end, at the same step
        (steps_1, values_1), (steps_2, values_2) = (zip(*dict(scalars(tmp_path / run)[tag]).items(), strict=True)
                                                  for run in ("one", "two"))
        assert steps_1 == steps_2 == (1, 2)
        assert values_2 == pytest.approx(values_1, rel=1e-4)
        assert tag != "grad/qwen_norm" or (values_1[0] > 0) == (qwen_train != "frozen")
    a, b = weights(tmp_path / "one", 2), weights(tmp_path / "two", 2)
    shared = [k for k in a if not k.startswith("policy.head.")]  # the RL head learns from per-process noise
    assert any(k.startswith("agent.") for k in shared) and any(k.startswith("prompt.") for k in shared)
    assert any(k.startswith("qwen.") for k in shared) == (qwen_train != "frozen")
    # a rounding difference in a near-zero gradient (summed in another order) can show as a fraction of lr
    for k in shared:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5)
    s1 = json.loads((tmp_path / "one" / "summary.json").read_text())
    s2 = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert s2["world_size"] == 2
    # Evaluation is gathered from both processes: the copy baseline is computed on the same pairs.
    assert s1["eval/copy_cell_acc"] == pytest.approx(s2["eval/copy_cell_acc"])


# The four cases in one launch: a launch's start-up (two interpreters importing torch and the suite)
# costs more than a case.
NAN_ON_RANK_1 = """
import gc, json, sys, torch
sys.path.insert(0, {root!r})
import training
from engine.config import Config
from engine.distributed import init_distributed, shutdown

def case(amp, fault, fsdp):
    cfg = Config.from_flags(data={data!r}, batch_size=2, agent_channels=16, prompt_dim=32, amp=amp,
                            fp16_init_scale=256.0, prompt_cache_dir="none", fsdp=fsdp)
    dist, device = init_distributed("cpu", cfg.optim.fsdp)
    training.seed_everything(0)
    data = training.build_data(cfg, device, dist)
    state = training.build_train_state(cfg, device, dist)
    data.sampler.set_epoch(0)
    first, second = [b for _, b in zip(range(2), data.loader)]
    main = [p for g in state.optimizer.param_groups for p in g["params"]]
    hook = None
    bias = state.model.agent.head.out.bias
    if dist.rank == 1 and fault == "gradient" and not fsdp:  # made inside backward, as an overflow would be
        hook = bias.register_hook(lambda g: torch.full_like(g, float("nan")))
    if dist.rank == 1 and fault == "gradient" and fsdp:
        # in rank 1's shard of the reduced gradient only: rank 0's shard is finite, and only a scaler
        # that agrees over the shards (ShardedGradScaler) skips on both
        step = state.amp.step
        def poisoned(*a, **k):
            bias.grad.to_local().fill_(float("nan"))
            return step(*a, **k)
        state.amp.step = poisoned
    if dist.rank == 1 and fault == "loss":  # NaN features: a NaN loss on this process only
        first = {{**first, "numeric": torch.full_like(first["numeric"], float("nan"))}}
    mine = lambda p: p.to_local() if hasattr(p, "to_local") else p  # this process's shard under FSDP
    whole = lambda p: p.full_tensor() if hasattr(p, "full_tensor") else p
    before, scale = [mine(p).detach().clone() for p in main], state.amp.scale
    skipped = training.train_step(state, [first], cfg, dist)["amp/stepped"] == 0.0
    unchanged = all(torch.equal(a, mine(p)) for a, p in zip(before, main))
    if hook is not None:
        hook.remove()
    state.amp.__dict__.pop("step", None)
    stepped = training.train_step(state, [second], cfg, dist)["amp/stepped"] == 1.0
    result = dict(skipped=skipped, unchanged=unchanged, scale_ratio=state.amp.scale / scale, stepped=stepped,
                  skipped_steps=state.amp.skipped_steps,
                  checksum=sum(float(whole(p).double().sum()) for p in main))
    # DDP's reducer and FSDP's units go before the next case (and the process group), as when
    # fixed.py's train() returns
    del state, main, bias, before, hook
    gc.collect()
    dist.barrier()
    return dist.rank, result

results = {{}}
for name, amp, fault, fsdp in {cases!r}:
    rank, results[name] = case(amp, fault, fsdp)
json.dump(results, open({out!r} + f"/rank{{rank}}.json", "w"))
shutdown()
"""

# (name, --amp, where rank 1's NaN comes from, --fsdp)
NAN_CASES = [("ddp-fp16-gradient", "fp16", "gradient", False), ("ddp-off-loss", "off", "loss", False),
             ("fsdp-fp16-shard", "fp16", "gradient", True), ("fsdp-bf16-loss", "bf16", "loss", True)]


@pytest.mark.slow
def test_a_nan_on_one_process_skips_the_step_on_every_process(arc_folder, tmp_path):
    """docs/invariants.md #3 over processes, in each of NAN_CASES: rank 1 alone gets a NaN gradient
    (made in its backward) or a NaN loss (in the window's last micro-batch, which under DDP still
    goes backward); the reduction carries it to rank 0, both skip the step (fp16: both halve the
    scale), neither waits for the other (a timeout would say so), and the next step is taken by both,
    to the same weights. Under FSDP the NaN sits in rank 1's gradient shard alone (or comes from its
    loss, which still goes backward: every backward is a collective there)."""
    script = tmp_path / "nan_on_rank_1.py"
    script.write_text(NAN_ON_RANK_1.format(root=str(ROOT), data=str(arc_folder), cases=NAN_CASES, out=str(tmp_path)))
    out = run_command([*TORCHRUN, WARM_PYTHON_SCRIPT, str(script)])
    assert out.returncode == 0, out.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for name, amp, _, _ in NAN_CASES:
        for r in ranks:
            case = r[name]
            assert case["skipped"] and case["unchanged"] and case["stepped"], (name, case)
            assert case["skipped_steps"] == 1, (name, case)
            # fp16: halved by the skip, then unchanged by one good step (growth needs 2000)
            assert case["scale_ratio"] == (0.5 if amp == "fp16" else 1.0), (name, case)
        assert ranks[0][name]["checksum"] == ranks[1][name]["checksum"], name


SAME_ON_EVERY_RANK = """
import json, sys, torch
sys.path.insert(0, {root!r})
import training
from engine.config import Config
from engine.distributed import init_distributed, shutdown
from engine.loop import epoch_windows

cfg = Config.from_flags(data={data!r}, batch_size=2, agent_channels=16, prompt_dim=32, qwen_train="lora",
                        prompt_refresh=3, grad_accum=2, prompt_cache_dir="none")
dist, device = init_distributed("cpu")
training.seed_everything(0)
data = training.build_data(cfg, device, dist)
state = training.build_train_state(cfg, device, dist)
data.sampler.set_epoch(0)
qwen = state.model.parameter_groups()["qwen"]
before = [p.detach().clone() for p in qwen]
windows = list(epoch_windows(data.loader, 6, 2, device))
for window in windows[:2]:
    training.train_step(state, window, cfg, dist)
moved = any(not torch.equal(a, p) for a, p in zip(before, qwen))
kept = [p.detach().clone() for p in qwen] + [v.clone() for p in qwen for v in state.optimizer.state[p].values()]
training.train_step(state, windows[2], cfg, dist)  # micro-batches 4 and 5: Qwen takes part in neither
now = [p for p in qwen] + [v for p in qwen for v in state.optimizer.state[p].values()]
untouched = all(torch.equal(a, b) for a, b in zip(kept, now))
main = [p for g in state.optimizer.param_groups for p in g["params"]]
json.dump(dict(qwen_moved=moved, qwen_untouched=untouched, weights=[float(p.double().sum()) for p in main]),
          open({out!r} + f"/rank{{dist.rank}}.json", "w"))
del state
shutdown()
"""


@pytest.mark.slow
def test_refreshes_under_no_sync_keep_every_process_equal(arc_folder, tmp_path):
    """Qwen (LoRA) re-reads its prompts at micro-batches 0 and 3 of three windows of two: its
    gradient of micro-batch 0 is made under no_sync, and micro-batch 1 (the window's last, when DDP
    reduces) does not touch Qwen. The gradient must still be reduced: every process ends with the
    same weights, Qwen's moved. In the third window no process touches Qwen: its weights and AdamW
    moments stay as they were (no zero gradient, which weight decay and the moments would act on)."""
    script = tmp_path / "same_on_every_rank.py"
    script.write_text(SAME_ON_EVERY_RANK.format(root=str(ROOT), data=str(arc_folder), out=str(tmp_path)))
    out = run_command([*TORCHRUN, WARM_PYTHON_SCRIPT, str(script)], timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert all(r["qwen_moved"] and r["qwen_untouched"] for r in ranks)
    assert ranks[0]["weights"] == ranks[1]["weights"]


@pytest.mark.slow
def test_two_nodes_train_together(arc_folder, tmp_path):
    """Two "machines" on this one: `torchrun --nnodes 2 --nproc_per_node 1`, each started apart
    with its --node_rank and a rendezvous on 127.0.0.1, train two steps as one run of world size 2."""
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    torchrun = [*TORCHRUN_MODULE, "--nnodes", "2", "--nproc_per_node", "1", "--master_addr", "127.0.0.1",
                "--master_port", str(port)]
    nodes = [start_command([*torchrun, "--node_rank", str(rank), WARM_PYTHON_SCRIPT,
                            *args(arc_folder, tmp_path / "run", 2, "--max_batches", "2")]) for rank in (0, 1)]
    outs = [node.communicate(timeout=300) for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], outs[0][1][-2000:] + outs[1][1][-2000:]
    assert "world_size=2" in outs[0][1] and outs[0][0].count("done: 2 steps") == 1
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["world_size"] == 2


def test_every_accelerate_config_is_one_accelerate_reads():
    from accelerate.commands.config.config_args import ClusterConfig

    files = sorted((ROOT / "configs" / "accelerate").glob("*.yaml"))
    assert files
    for path in files:
        config = ClusterConfig.from_yaml_file(str(path))
        machines, gpus = (int(n) for n in path.stem.split("-")[0].split("x"))
        assert (config.num_machines, config.num_processes) == (machines, machines * gpus), path.name
        assert config.mixed_precision == "no", f"{path.name}: precision is fixed.py's --amp"
        # an FSDP config is read by fixed.py as --fsdp, and only FSDP2 (engine/distributed.launcher_wants_fsdp)
        assert path.stem.endswith("-fsdp") == (config.distributed_type == "FSDP"), path.name
        assert config.distributed_type != "FSDP" or str(config.fsdp_config.get("fsdp_version")) == "2", path.name

"""Where a training step waits for the device: only where the invariants need the host to know (a
micro-batch's loss is finite, docs/invariants.md #1 and #3; the step's gradients are finite, #3),
never in the model, the loss or the RL update. Counted on the CPU as the operations that block
the host on a GPU: reading a tensor's value (`.item()`, `bool()`, `float()`, `.tolist()`:
`_local_scalar_dense`) and operations whose output shape depends on the values (`nonzero`, masks
used as indices), each with the line of the suite that asked for it."""

import collections
import linecache
import traceback
import warnings
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import agents.cells
import training
from data.enclosed import enclosed_map
from engine.loop import epoch_windows
from tests.conftest import ROOT
from training.step import train_step

VALUE_READS = {"_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique2", "unique_consecutive",
               "is_nonzero", "equal", "repeat_interleave", "masked_scatter", "bincount", "histc"}


class HostSyncs(TorchDispatchMode):
    """Counts, by the suite's line that asked, each operation that blocks the host on a GPU."""

    def __init__(self):
        super().__init__()
        self.sites: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        masked = name == "index" and any(torch.is_tensor(i) and i.dtype == torch.bool for i in args[1] or [])
        if name in VALUE_READS or masked:
            ours = [f for f in traceback.extract_stack() if f.filename.startswith(str(ROOT))
                    and "/tests/" not in f.filename and "/.venv/" not in f.filename]
            where = f"{ours[-1].filename[len(str(ROOT)) + 1:]}:{ours[-1].line}" if ours else "?"
            self.sites[where] += 1
        return func(*args, **(kwargs or {}))


# Where a warm step of two micro-batches may block the host, by the line that asks.
EXPECTED = {
    # one a micro-batch: a non-finite loss goes backward nowhere (#1, #3)
    "training/step.py:finite = bool(torch.isfinite(window_loss))": 2,
    # one a step: its gradients are finite (#3; the fp16 scaler's own check with the fused AdamW is on the device)
    'engine/precision.py:norm = float(torch.nn.utils.clip_grad_norm_(params, clip if clip > 0 else float("inf"), '
    'foreach=True))': 1}


# the one-lease recipe's model (configs/gpu-lease.toml) at a CPU's size
LEASE = {"agent": "rope", "agent_channels": 16, "task_embedding": True, "use_qwen": False, "canvas": "full"}


@pytest.mark.parametrize("amp,flags", [("off", {}), ("bf16", {}), ("fp16", {}), ("bf16", LEASE)],
                         ids=["off", "bf16", "fp16", "lease recipe"])
def test_a_step_waits_for_the_device_only_where_the_invariants_need_it(amp, flags, small_cfg,
                                                                        state_and_batches, monkeypatch):
    """Counted by the operations above, and one more: the enclosed background's flood fill runs on
    the host, so the agent must read the map its batch carries (data/enclosed.py), never compute it."""
    cfg = small_cfg(amp=amp, grad_accum=2, **flags)
    state, batches = state_and_batches(cfg, 2)
    train_step(state, batches, cfg)  # the prompt cache warm: Qwen (frozen) encodes nothing below
    computed = []
    monkeypatch.setattr(agents.cells, "enclosed_map", lambda canvas: computed.append(canvas) or enclosed_map(canvas))
    counter = HostSyncs()
    with counter:
        train_step(state, batches, cfg)
    assert dict(counter.sites) == EXPECTED
    assert not computed, "the agent computed the enclosed background of a batch that carries it"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("amp,flags", [("off", {}), ("bf16", {}), ("fp16", {}), ("bf16", LEASE)],
                         ids=["off", "bf16", "fp16", "lease recipe"])
def test_on_a_gpu_a_step_synchronizes_only_where_the_invariants_need_it(amp, flags, small_cfg):
    """The same on CUDA, as the driver sees it: torch.cuda.set_sync_debug_mode warns at each
    operation that synchronizes the host with the device (a value read, a blocking copy)."""
    cuda = torch.device("cuda")
    cfg = small_cfg(amp=amp, grad_accum=2, device="cuda", **flags)
    training.seed_everything(cfg.run.seed)
    data = training.build_data(cfg, cuda)
    state = training.build_train_state(cfg, cuda, tasks=len(data.task_ids))
    data.sampler.set_epoch(0)
    window = next(epoch_windows(data.loader, 2, 2, cuda))
    train_step(state, window, cfg)  # the prompt cache warm
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            train_step(state, window, cfg)
            # the step's warnings only: on an H200 the first case in its process saw one more,
            # reported inside the switch back to "default" (torch's line, no line of the suite's)
            in_step = list(caught)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    sites = collections.Counter(f"{site(w.filename)}:{linecache.getline(w.filename, w.lineno).strip()}"
                                for w in in_step if "synchronizing" in str(w.message))
    assert dict(sites) == EXPECTED


def site(filename: str) -> str:
    """A warning's file relative to the repository, or whole when outside it (torch's own)."""
    path = Path(filename)
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else filename


def test_encoding_demo_texts_reads_the_device_only_inside_the_qwen_trunk(small_cfg, state_and_batches):
    """A prompt cache miss or a trainable Qwen's refresh encodes texts inside a step: the suite's own
    lines read nothing back (the tokens are counted on the host); transformers' Qwen2 may, inside
    its forward (its attention mask checks), which is not the suite's to change."""
    state, (batch,) = state_and_batches(small_cfg(), 1)
    texts = [text for task in batch["demo_texts"] for text in task]
    counter = HostSyncs()
    with counter:
        state.model.qwen.encode(texts)
    trunk = 'prompt/qwen_encoder.py:hidden = self.trunk(input_ids=tokens["input_ids"], attention_mask=mask)'
    assert {site.removesuffix(".last_hidden_state") for site in counter.sites} <= {trunk}, dict(counter.sites)

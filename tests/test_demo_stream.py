"""The demo stream (prompt/demo_stream.py): it reads each sample's own demos, learns from the
training loss, and a sample without demos fuses the other streams only."""

import torch

import training
from data.canvas import PAD
from engine.checkpoint import find_checkpoint
from engine.config import Config
from loss_function import training_loss
from prompt.demo_stream import DemoStream
from prompt.hybrid import QwenHybridPrompt
from tests.conftest import CPU
from training.cli import model_flags_of


def demos(n: int, side: int = 6, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.full((n, side, side), PAD)
    y = torch.full((n, side, side), PAD)
    x[:, :4, :4] = torch.randint(0, 10, (n, 4, 4), generator=g)
    y[:, :4, :4] = torch.randint(0, 10, (n, 4, 4), generator=g)
    return x, y


def in_slots(x: torch.Tensor, y: torch.Tensor, counts: list[int],
             slots: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Demos [N, S, S] dealt out in order, counts[i] to sample i, in `slots` slots each, as
    data.episodes.collate carries them -> (input, output [B, slots, S, S] int64, present [B, slots] bool)."""
    side = x.shape[-1]
    xs, ys = (torch.full((len(counts), slots, side, side), PAD) for _ in range(2))
    present = torch.zeros(len(counts), slots, dtype=torch.bool)
    start = 0
    for i, n in enumerate(counts):
        xs[i, :n], ys[i, :n], present[i, :n] = x[start:start + n], y[start:start + n], True
        start += n
    return xs, ys, present


def test_each_sample_reads_its_own_demos_and_one_without_has_none():
    torch.manual_seed(0)
    stream = DemoStream(channels=16, prompt_dim=8, layers=2, side=6)
    x, y = demos(5)
    features, present = stream(*in_slots(x, y, [2, 0, 3], 3))  # sample 1 has no demo
    assert features.shape == (3, 8) and features.dtype == torch.float32
    assert present.tolist() == [True, False, True] and torch.equal(features[1], torch.zeros(8))
    # sample 0's features are the mean of its demos' and change with their cells only; empty slots add nothing
    alone, _ = stream(*in_slots(x[:2], y[:2], [2], 2))
    torch.testing.assert_close(alone[0], features[0])
    y2 = y.clone()
    y2[3, 0, 0] = (y2[3, 0, 0] + 1) % 10
    again, _ = stream(*in_slots(x, y2, [2, 0, 3], 3))
    assert torch.equal(again[0], features[0]) and not torch.equal(again[2], features[2])


def test_a_sample_without_demos_gets_the_prompt_of_its_other_streams():
    torch.manual_seed(0)
    with_stream = QwenHybridPrompt(prompt_dim=8, demo_channels=16, demo_side=6)
    without = QwenHybridPrompt(prompt_dim=8)
    without.load_state_dict(with_stream.state_dict(), strict=False)
    numeric, relation = torch.randn(2, 15), torch.randn(2, 129)
    x, y = demos(2)
    prompt = with_stream(numeric, relation, demos=in_slots(x, y, [2, 0], 2))
    assert torch.equal(prompt[1], without(numeric, relation)[1])
    assert not torch.allclose(prompt[0], without(numeric, relation)[0])


def test_the_training_loss_reaches_the_demo_stream(small_cfg, state_and_batches):
    cfg = small_cfg(demo_stream=16)
    assert cfg.prompt.context_demos == 4
    state, (batch,) = state_and_batches(cfg, 1)
    assert batch["context_present"].any()
    batch = state.model.encode_prompts(batch, state.prompts, 0, training=True)
    pred = state.model(batch, "sampled+mean")
    loss = training_loss(pred.logits, pred.refined, pred.prompt, batch["target"], batch["input"], cfg=cfg.loss)
    loss.per_sample.sum().backward()
    grads = [p.grad for p in state.model.prompt.demo_stream.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads) and any(g.abs().sum() > 0 for g in grads)


def test_a_run_with_the_demo_stream_trains_adapts_and_resumes(small_cfg, tmp_path):
    """End to end: training, validation with test-time training of several tasks, and --resume
    building the same stream from the checkpoint's flags."""
    cfg = small_cfg(demo_stream=16, demo_stream_demos=2, eval_tasks=0, run_dir=str(tmp_path / "run"))
    summary = training.train(cfg, CPU)  # 3 evaluation tasks, adapted together (task_batch.batches_shared_weights)
    assert summary["steps"] == 3 and summary["eval/tasks"] == 3
    checkpoint = find_checkpoint(str(tmp_path / "run"))
    flags = {**model_flags_of(checkpoint, {}), "data": cfg.data.data, "prompt_dim": 32, "agent_channels": 16}
    assert flags["demo_stream"] == 16 and flags["demo_stream_demos"] == 2
    data, state = training.load_run(Config.from_flags(**flags), checkpoint, CPU)
    assert state.model.prompt.demo_stream is not None and data.eval_set.context_demos == 2


def test_the_stream_reads_at_most_its_own_count_of_a_samples_demos():
    """The batch carries the most demos any reader takes (an agent reading 3 in context): a stream
    of --demo_stream_demos 1 reads each sample's first alone."""
    torch.manual_seed(0)
    capped = DemoStream(channels=16, prompt_dim=8, layers=2, side=6, demos=1)
    x, y = demos(5)
    features, present = capped(*in_slots(x, y, [3, 2], 3))
    first, _ = capped(*in_slots(x[[0, 3]], y[[0, 3]], [1, 1], 1))
    torch.testing.assert_close(features, first)
    assert present.tolist() == [True, True]

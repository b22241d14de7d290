"""In-context reading (agents/context.py, --agent_context_demos): each sample's demos carried in
slots (the loader's batches and a task's adaptation batches), each sample's cells reading only its
own demos, the agent as built equal to the agent
without the reads, gradients reaching them, and a run that trains, adapts and resumes with it."""

import pytest
import torch

import training
from agents import build_agent
from agents.context import ContextRead, DemoMemory, DemoSlots
from agents.conv_agent import FiLMConvAgent
from agents.transformer_agent import TransformerAgent
from data.canvas import PAD
from data.episodes import EpisodeDataset, collate
from engine.checkpoint import find_checkpoint
from engine.config import Config
from engine.errors import ConfigError
from loss_function import training_loss
from tests.conftest import CPU
from tests.test_demo_stream import demos, in_slots
from training.cli import model_flags_of


def test_each_sample_carries_its_own_demos_in_its_first_slots(small_cfg, state_and_batches):
    """collate: each sample's context demos (its episode's, as the dataset draws them) in its first
    slots, the rest PAD; as many slots as the batch's most with the "fit" canvas, a fixed count when
    asked (a task's adaptation batches) and with the other canvases (one shape for a compiled agent)."""
    cfg = small_cfg(agent_context_demos=3)
    data = training.build_data(cfg, CPU)
    train_set = data.loader.dataset
    samples = [train_set[(i, 0)] for i in range(8)]
    counts = [int(s["context_present"].sum()) for s in samples]
    batch = collate(samples)
    side = batch["input"].shape[-1]
    assert batch["context_input"].shape == (8, max(counts), side, side) and max(counts) <= 3
    for i, (s, n) in enumerate(zip(samples, counts, strict=True)):
        assert batch["context_present"][i].tolist() == [k < n for k in range(max(counts))]
        assert torch.equal(batch["context_target"][i, :n], s["context_target"][:n, :side, :side])
        assert (batch["context_input"][i, n:] == PAD).all() and not batch["context_enclosed"][i, n:].any()
    assert collate(samples, slots=5)["context_present"].shape == (8, 5)
    bucketed = EpisodeDataset(train_set.episodes, train_set.scale, canvas="bucket", context_demos=3,
                              scores=train_set.scores)
    assert all(len(bucketed[(i, 0)]["context_present"]) == 3 for i in range(8))


@pytest.mark.parametrize("agent_class", [FiLMConvAgent, TransformerAgent])
def test_a_sample_reads_only_its_own_demos(agent_class):
    torch.manual_seed(0)
    agent = agent_class(prompt_dim=8, channels=16, context_demos=2, canvas_side=6).eval()
    for read in agent.reads.values() if isinstance(agent.reads, torch.nn.ModuleDict) else agent.reads:
        torch.nn.init.normal_(read.out.weight)  # as built the reads add nothing: open them
    canvas, _ = demos(3, seed=1)
    prompt = torch.randn(3, 8)
    x, y = demos(4)
    logits = agent(canvas, prompt, context=DemoSlots(*in_slots(x, y, [2, 0, 2], 2)))  # sample 1 has none
    y2 = y.clone()
    y2[3, 1, 1] = (y2[3, 1, 1] + 1) % 10
    again = agent(canvas, prompt, context=DemoSlots(*in_slots(x, y2, [2, 0, 2], 2)))
    assert torch.equal(again[:2], logits[:2]) and not torch.allclose(again[2], logits[2])
    # a sample without demos reads the no-demo token alone: what its other samples' demos are does not matter
    alone = agent(canvas[1:2], prompt[1:2], context=DemoSlots(*in_slots(x[:0], y[:0], [0], 2)))
    torch.testing.assert_close(alone[0], logits[1])


def test_the_refinements_copies_read_their_samples_demos():
    """repeats = K: sample k*B + b reads b's demos, as if each copy were given them apart."""
    torch.manual_seed(0)
    memory_module, read = DemoMemory(16, 2), ContextRead(16, 4)
    torch.nn.init.normal_(read.out.weight)
    agent = FiLMConvAgent(prompt_dim=8, channels=16, canvas_side=6)
    x, y = demos(3)
    slots = DemoSlots(*in_slots(x, y, [1, 2], 2), repeats=2)
    memory, valid = memory_module(slots, agent.cells)
    cells = torch.randn(4, 36, 16)
    folded = read(cells, memory, valid, repeats=2)
    apart = torch.cat([read(cells[i:i + 2], memory, valid, repeats=1) for i in (0, 2)])
    torch.testing.assert_close(folded, apart)


def test_as_built_the_reads_change_nothing():
    torch.manual_seed(0)
    reading = FiLMConvAgent(prompt_dim=8, channels=16, context_demos=2, canvas_side=6)
    plain = FiLMConvAgent(prompt_dim=8, channels=16, canvas_side=6)
    plain.load_state_dict(reading.state_dict(), strict=False)
    canvas, _ = demos(2, seed=1)
    prompt = torch.randn(2, 8)
    x, y = demos(2)
    context = DemoSlots(*in_slots(x, y, [1, 1], 2))
    torch.testing.assert_close(reading(canvas, prompt, context=context), plain(canvas, prompt))


def test_the_training_loss_reaches_the_reads(small_cfg, state_and_batches):
    cfg = small_cfg(agent_context_demos=2)
    assert cfg.context_demos == 2
    state, (batch,) = state_and_batches(cfg, 1)
    batch = state.model.encode_prompts(batch, state.prompts, 0, training=True)
    pred = state.model(batch, "sampled+mean")
    loss = training_loss(pred.logits, pred.refined, pred.prompt, batch["target"], batch["input"], cfg=cfg.loss)
    loss.per_sample.sum().backward()
    agent = state.model.agent
    outs = [r.out.weight.grad for r in agent.reads.values()]
    assert all(g is not None and torch.isfinite(g).all() and g.abs().sum() > 0 for g in outs)
    assert agent.memory.embed_out.weight.grad is not None  # zero at the first step: the reads' outputs start at 0


def test_options_that_predict_the_demos_themselves_are_refused():
    with pytest.raises(ConfigError, match="--agent_context_demos does not take"):
        Config.from_flags(agent_context_demos=2, latent_step_lr=0.1)
    with pytest.raises(ConfigError, match="--agent loop_vit does not read --agent_context_demos"):
        build_agent(Config.from_flags(agent="loop_vit", agent_context_demos=2).agent, prompt_dim=8)


def test_a_run_reading_demos_in_context_trains_adapts_and_resumes(small_cfg, tmp_path):
    """End to end: training, validation with test-time training of the tasks together
    (task_batch.batches_shared_weights), and --resume building the reads from the checkpoint's flags."""
    cfg = small_cfg(agent_context_demos=2, eval_tasks=0, run_dir=str(tmp_path / "run"))
    summary = training.train(cfg, CPU)
    assert summary["steps"] == 3 and summary["eval/tasks"] == 3
    checkpoint = find_checkpoint(str(tmp_path / "run"))
    flags = {**model_flags_of(checkpoint, {}), "data": cfg.data.data, "prompt_dim": 32, "agent_channels": 16}
    assert flags["agent_context_demos"] == 2
    data, state = training.load_run(Config.from_flags(**flags), checkpoint, CPU)
    assert len(state.model.agent.reads) == 2 and data.eval_set.context_demos == 2

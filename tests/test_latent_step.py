"""LPN's latent step inside the model (--latent_step_lr, prompt/latent_step.py): what it reads, that it
descends, and that a run trains it, saves it and resumes it."""

import pytest
import torch
from safetensors.torch import load_file

import training
from engine.config import Config
from engine.errors import ConfigError
from evaluation.evaluate import evaluate
from prompt import with_qwen_features
from prompt.latent_step import MAX_STEP_RATIO, LatentStep
from tests.test_end_to_end import scalars

# numerically sensitive: `make test` runs these again under ATEN_CPU_CAPABILITY=avx2 and =default

CPU = torch.device("cpu")


def latent_model_and_batch(small_cfg, state_and_batches, **flags):
    cfg = small_cfg(latent_step_lr=10.0, **flags)
    state, (batch,) = state_and_batches(cfg, 1)
    return cfg, state.model, with_qwen_features(batch, state.prompts, 0, training=False)


def test_batches_carry_each_samples_context_demos(small_cfg, state_and_batches):
    cfg, _, batch = latent_model_and_batch(small_cfg, state_and_batches, latent_step_demos=2)
    present, (b, side) = batch["context_present"], batch["input"].shape[:2]
    slots = present.shape[1]
    assert batch["context_input"].shape == batch["context_target"].shape == (b, slots, side, side) and slots <= 2
    counts = present.sum(1)
    assert bool((counts >= 1).all())
    assert torch.equal(present, torch.arange(slots) < counts[:, None])  # a sample's demos fill its first slots
    assert "context_input" not in state_and_batches(small_cfg(), 1)[1][0]  # off: nothing extra carried


def context_losses(agent, prompt, batch):
    """Each sample's mean cross-entropy over its context demos' valid cells [B] (written out here
    apart from prompt/latent_step.py, to check it)."""
    present = batch["context_present"]
    losses = []
    for i in range(len(prompt)):
        n = int(present[i].sum())
        x, y = batch["context_input"][i, :n], batch["context_target"][i, :n]
        logits = agent(x, prompt[i:i + 1].expand(n, -1))
        ce = torch.nn.functional.cross_entropy(logits.permute(0, 3, 1, 2), y, reduction="none")
        valid = ((y != 10) | (x != 10)).to(ce.dtype)
        losses.append(((ce * valid).sum((1, 2)) / valid.sum((1, 2))).mean())
    return torch.stack(losses)


@pytest.mark.numeric
def test_the_step_is_minus_lr_times_the_context_demos_gradient_and_descends(small_cfg, state_and_batches):
    """z = -lr * d(each sample's context loss)/d(its prompt), and it lowers that loss for every
    sample; a long step is cut to MAX_STEP_RATIO of the prompt's norm; a sample's step is the one
    it gets alone in a batch."""
    _, model, batch = latent_model_and_batch(small_cfg, state_and_batches)
    agent = model.agent
    refined = torch.randn(len(batch["input"]), model.prompt.prompt_dim)
    step = LatentStep(0.5)
    z = step(agent, refined, batch["context_input"], batch["context_target"], batch["context_present"])

    prompt = refined.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(context_losses(agent, prompt, batch).sum(), prompt)
    torch.testing.assert_close(z, -0.5 * grad, rtol=1e-4, atol=1e-7)
    with torch.no_grad():
        assert bool((context_losses(agent, refined + z, batch) < context_losses(agent, refined, batch)).all())

    huge = LatentStep(1e6)(agent, refined, batch["context_input"], batch["context_target"], batch["context_present"])
    torch.testing.assert_close(huge.norm(dim=-1), MAX_STEP_RATIO * refined.norm(dim=-1))  # bounded, same direction
    torch.testing.assert_close(huge / huge.norm(dim=-1, keepdim=True), z / z.norm(dim=-1, keepdim=True))

    alone = step(agent, refined[:1], batch["context_input"][:1], batch["context_target"][:1],
                 batch["context_present"][:1])
    torch.testing.assert_close(alone[0], z[0], rtol=1e-4, atol=1e-7)


@pytest.mark.numeric
def test_the_step_reads_at_most_its_own_count_of_a_samples_demos(small_cfg, state_and_batches):
    """The batch may carry more demos than the step reads (a demo stream reading 4): a step of
    --latent_step_demos 1 is the step on each sample's first demo alone."""
    _, model, batch = latent_model_and_batch(small_cfg, state_and_batches, latent_step_demos=2)
    assert batch["context_present"][:, 1].any()  # some sample carries a second demo
    refined = torch.randn(len(batch["input"]), model.prompt.prompt_dim)
    demos = (batch["context_input"], batch["context_target"], batch["context_present"])
    capped = LatentStep(0.5, demos=1)(model.agent, refined, *demos)
    first = LatentStep(0.5)(model.agent, refined, *(t[:, :1] for t in demos))
    torch.testing.assert_close(capped, first)
    assert not torch.allclose(LatentStep(0.5)(model.agent, refined, *demos), first)


def test_the_query_output_never_enters_the_prediction(small_cfg, state_and_batches):
    """docs/invariants.md #8 with the latent step. Changing a query's target changes nothing;
    changing one of its context demos changes its prediction and no other sample's."""
    _, model, batch = latent_model_and_batch(small_cfg, state_and_batches)
    model.train(False)
    with torch.no_grad():
        before = model(batch).logits
        flipped = dict(batch, target=(batch["target"] + 1) % 10)
        assert torch.equal(model(flipped).logits, before)
        demos = batch["context_target"].clone()
        demos[1, 0] = (demos[1, 0] + 1) % 10  # sample 1's first demo
        after = model(dict(batch, context_target=demos)).logits
    changed = (after != before).flatten(2).any(-1)[0]
    assert changed.tolist() == [i == 1 for i in range(len(changed))]


def test_a_batch_without_context_demos_is_an_error(small_cfg, state_and_batches):
    _, model, batch = latent_model_and_batch(small_cfg, state_and_batches)
    with pytest.raises(ValueError, match="context_demos"):
        model({k: v for k, v in batch.items() if not k.startswith("context_")})


def test_flags_are_checked():
    with pytest.raises(ConfigError, match="--latent_step_lr must be >= 0"):
        Config.from_flags(latent_step_lr=-1.0)
    with pytest.raises(ConfigError, match="--latent_step_demos must be at least 1"):
        Config.from_flags(latent_step_demos=0)


@pytest.mark.slow
def test_a_run_learns_the_step_size_logs_it_and_resumes_it_bit_for_bit(small_cfg, tmp_path):
    """The step size is a trained weight: it moves, it is in TensorBoard and the checkpoint, and a
    resumed run continues it exactly; validation with test-time training runs on the same model."""
    flags = dict(latent_step_lr=10.0, max_batches=4, eval_tasks=2, ttt_steps=2)
    straight = training.train(small_cfg(run_dir=str(tmp_path / "a"), **flags), CPU)
    training.train(small_cfg(run_dir=str(tmp_path / "b"), save_every=2, **flags), CPU)
    training.train(small_cfg(run_dir=str(tmp_path / "c"), resume=str(tmp_path / "b" / "checkpoints" / "step_00000002"),
                          **flags), CPU)
    tags = scalars(straight["run_dir"])
    assert {"latent/step_norm", "latent/step_lr"} <= tags.keys()
    assert all(v > 0 for _, v in tags["latent/step_norm"])
    wa = load_file(str(tmp_path / "a" / "checkpoints" / "step_00000004" / "model.safetensors"))
    wc = load_file(str(tmp_path / "c" / "checkpoints" / "step_00000004" / "model.safetensors"))
    assert wa["latent_step.log_lr"] != torch.log(torch.tensor(10.0))
    assert wa.keys() == wc.keys() and all(torch.equal(wa[k], wc[k]) for k in wa)
    assert 0 <= straight["eval/cell_acc"] <= 1


def test_adaptation_runs_the_step_on_the_demo_episodes(small_cfg, state_and_batches):
    """Latent search and weight TTT read batches of demo episodes: they carry context demos too."""
    cfg = small_cfg(latent_step_lr=10.0, eval_tasks=2, ttt_steps=2, latent_steps=2, eval_augments=1)
    training.seed_everything(0)
    data = training.build_data(cfg, CPU)
    state = training.build_train_state(cfg, CPU)
    steps = []  # (samples, their context demos present) of every step the model took
    state.model.latent_step.register_forward_hook(
        lambda module, args, out: steps.append((args[1].shape[0], int(args[4].sum()))))
    result = evaluate(state.model.train(False), state.prompts, data.eval_set, cfg=cfg, device=CPU)
    assert 0 <= result.metrics["eval/cell_acc"] <= 1
    # the search's latent steps and TTT's steps each take the latent step, on batches of demo
    # episodes that carry their context demos, and so does the prediction
    assert len(steps) > cfg.eval.latent_steps + cfg.eval.ttt_steps and all(n > 0 and k > 0 for n, k in steps)

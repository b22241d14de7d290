"""The Qwen hybrid prompt: no target leakage, FP32 guarantee, the cache, gradients to Qwen, and
the from_pretrained path on a tiny checkpoint saved here."""

import dataclasses

import numpy as np
import pytest
import torch

import training
from data.arc import ArcPair
from data.episodes import DifficultyScale, EpisodeDataset, collate, episode_difficulty, training_episodes
from data.sources import load_folder_split
from engine.config import Config, QwenCfg
from engine.errors import ConfigError
from model import build_model
from prompt import PromptCache, QwenTextEncoder, with_qwen_features
from prompt.qwen_encoder import tiny_qwen2, tiny_tokenizer


def test_query_output_never_reaches_the_prompt(arc_folder):
    """docs/invariants.md #8: one pair of a training task gets another output, in the task itself,
    before its episodes are built; the episode whose query is that pair then has another target and
    nothing else changed, its prompt bit-identical (under the identity and an augmentation). Built
    from the changed task, a leave-one-out that kept the query among its own demos would show; the
    difficulty scale is the real one, so a leak into the controls would too. The agent's prediction
    is compared as well."""
    tasks = load_folder_split(arc_folder / "training")
    episodes = training_episodes(tasks)
    scale = DifficultyScale(np.array([episode_difficulty(e) for e in episodes]))
    assert len({scale.percentile(episode_difficulty(e)) for e in episodes}) > 3
    torch.manual_seed(0)
    cfg = Config.from_flags(prompt_dim=32, agent_channels=16)
    model = build_model(cfg).eval()
    cache = PromptCache(model.qwen, refresh=10)
    checked = 0
    for task in tasks:
        for where in [f"train[{i}]" for i in range(len(task.train))] + [f"test[{j}]" for j in range(len(task.test))]:
            split, index = where[:-1].split("[")
            pairs = list(getattr(task, split))
            out = pairs[int(index)].output  # one colour instead (its count changes too), same shape
            pairs[int(index)] = ArcPair(pairs[int(index)].input, np.full_like(out, 1 if (out == 0).all() else 0))
            changed = dataclasses.replace(task, **{split: tuple(pairs)})
            pick = [[e for e in training_episodes((t,)) if e.where == where] for t in (task, changed)]
            if not pick[0]:
                continue  # a task with one demo has no leave-one-out episode
            a, b = (EpisodeDataset(p, scale) for p in pick)
            for aug in (0, 1234):
                sa, sb = a[(0, aug)], b[(0, aug)]
                assert not torch.equal(sa["target"], sb["target"])
                assert {k for k in sa if k != "target" and not (sa[k] == sb[k] if not torch.is_tensor(sa[k])
                                                                 else torch.equal(sa[k], sb[k]))} == set(), where
                with torch.no_grad():
                    preds = [model(with_qwen_features(collate([x]), cache, 0, training=False)) for x in (sa, sb)]
                assert torch.equal(preds[0].prompt, preds[1].prompt), (task.task_id, where)
                assert torch.equal(preds[0].logits, preds[1].logits), (task.task_id, where)
                checked += 1
    assert checked >= 40


def test_trainable_fp16_weights_refused_at_startup():
    with pytest.raises(ConfigError, match="float32"):
        QwenCfg(qwen_dtype="float16", qwen_train="full")
    QwenCfg(qwen_dtype="float16", qwen_train="frozen")  # an explicit choice for a frozen encoder


def test_frozen_cache_serves_what_recomputing_gives(arc_folder):
    episodes = training_episodes(load_folder_split(arc_folder / "training"))
    dataset = EpisodeDataset(episodes, DifficultyScale(np.zeros(1)))
    batch = collate([dataset[(i, 0)] for i in range(4)])
    encoder = QwenTextEncoder.load(QwenCfg(), seed=0)
    cache = PromptCache(encoder, refresh=10)
    first, present = cache.features(batch["demo_texts"], 0, torch.device("cpu"))
    assert present.all()
    tokens = encoder.stats.tokens
    second, _ = cache.features(batch["demo_texts"], 1, torch.device("cpu"))
    assert encoder.stats.tokens == tokens, "a frozen cache must not encode a key twice"
    assert cache.stats.misses > 0 and cache.stats.hits == cache.stats.misses
    with torch.no_grad():
        direct = torch.stack([encoder.encode(list(texts)).mean(0) for texts in batch["demo_texts"]])
    assert torch.equal(first, second)
    torch.testing.assert_close(first, direct, rtol=1e-5, atol=1e-6)


def test_a_feature_does_not_depend_on_the_autocast_of_the_call_that_encoded_it(arc_folder):
    """The cache key names the trunk's dtype, not the caller's autocast: validation predicts under
    --amp bf16's autocast, training encodes outside it, and both must read the same feature."""
    episodes = training_episodes(load_folder_split(arc_folder / "training"))
    texts = list(collate([EpisodeDataset(episodes, DifficultyScale(np.zeros(1)))[(0, 0)]])["demo_texts"][0])
    encoder = QwenTextEncoder.load(QwenCfg(), seed=0)
    with torch.no_grad():
        plain = encoder.encode(texts)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            under_autocast = encoder.encode(texts)
    assert plain.dtype == under_autocast.dtype == torch.float32
    assert torch.equal(plain, under_autocast)


@pytest.mark.parametrize("mode", ["full", "lora"])
def test_trainable_qwen_with_cache_and_fp16(mode, small_cfg, state_and_batches):
    """docs/invariants.md #1 and #7: Qwen gets gradients on refresh micro-batches only, and the steps
    in between (no Qwen gradient) raise nothing under fp16."""
    cfg = small_cfg(qwen_train=mode, amp="fp16", prompt_refresh=2, qwen_lr=1e-3, fp16_init_scale=64.0)
    state, batches = state_and_batches(cfg, 4)
    assert state.amp.scaler.is_enabled()
    qwen_params = state.model.parameter_groups()["qwen"]
    assert qwen_params and all(p.dtype == torch.float32 for p in qwen_params)
    norms = [training.train_step(state, [batch], cfg)["grad/qwen_norm"] for batch in batches]
    assert 0 < norms[0] < float("inf") and 0 < norms[2] < float("inf"), f"refresh steps must reach Qwen: {norms}"
    assert norms[1] == 0 and norms[3] == 0, f"cached steps must not: {norms}"


def test_qwen_gets_gradients_through_the_refinement(small_cfg, state_and_batches):
    """docs/invariants.md #7: with the complexity term off (lambda_c = 0 differentiates the prompt
    directly), Qwen's only gradient path is prompt -> refinement -> agent -> EFE: a refinement under
    torch.no_grad (the earlier suite's fix) cuts it and Qwen gets none."""
    cfg = small_cfg(qwen_train="full", prompt_refresh=1, lambda_c=0.0)
    state, (batch,) = state_and_batches(cfg, 1)
    stats = training.train_step(state, [batch], cfg)
    assert stats["grad/qwen_norm"] > 0


def test_qwen_gets_gradients_in_fp32(small_cfg, state_and_batches):
    cfg = small_cfg(qwen_train="full", prompt_refresh=1)
    state, (batch,) = state_and_batches(cfg, 1)
    qwen = state.model.parameter_groups()["qwen"]
    before = [p.detach().clone() for p in qwen]
    stats = training.train_step(state, [batch], cfg)
    assert stats["grad/qwen_norm"] > 0 and stats["amp/stepped"] == 1.0
    assert any(not torch.equal(a, b) for a, b in zip(before, qwen, strict=True))


@pytest.mark.slow
def test_from_pretrained_folder_trains_offline(tmp_path, small_cfg, monkeypatch):
    """The real loading path: a Qwen2 model and tokenizer saved to a folder, loaded with
    from_pretrained (no network), trained for one batch."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    folder = tmp_path / "qwen2-tiny"
    tiny_qwen2(seed=3).save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    cfg = small_cfg(qwen_model=str(folder), qwen_train="full", max_batches=1, eval_tasks=1)
    assert "pretrained" in build_model(cfg).qwen.description
    summary = training.train(cfg, torch.device("cpu"))
    assert summary["steps"] == 1


def test_missing_model_is_a_one_line_config_error(tmp_path):
    with pytest.raises(ConfigError, match="--qwen_model"):
        QwenTextEncoder.load(QwenCfg(qwen_model=str(tmp_path / "nowhere")), seed=0)

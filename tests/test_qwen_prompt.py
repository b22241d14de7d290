"""The Qwen hybrid prompt: no target leakage, FP32 guarantee, the cache, gradients to Qwen, and
the from_pretrained path on a tiny checkpoint saved here."""

import dataclasses

import numpy as np
import pytest
import torch

import fixed
from agents import QwenCfg, QwenHybridPrompt
from agents.qwen_encoder import tiny_qwen2, tiny_tokenizer
from data.arc import ArcPair
from data.sources import load_folder_split
from data.episodes import DifficultyScale, EpisodeDataset, collate, training_episodes
from engine.config import ConfigError


def prompt_of(prompt: QwenHybridPrompt, dataset: EpisodeDataset, item) -> torch.Tensor:
    batch = collate([dataset[item]])
    with torch.no_grad():
        return prompt(batch["demo_texts"], batch["numeric"], batch["relation"], step=1)


def test_query_output_never_reaches_the_prompt(arc_folder):
    """Invariant 8: changing the query output leaves the prompt bit-identical."""
    episodes = training_episodes(load_folder_split(arc_folder / "training"))
    ep = episodes[0]
    changed_output = (ep.query.output + 1) % 10
    other = dataclasses.replace(ep, query=ArcPair(ep.query.input, changed_output))
    scale = DifficultyScale(np.zeros(1))
    a, b = EpisodeDataset([ep], scale), EpisodeDataset([other], scale)
    torch.manual_seed(0)
    prompt = QwenHybridPrompt(prompt_dim=32, qwen=QwenCfg())
    for item in ((0, 0), (0, 1234)):  # identity and a random augmentation
        assert not torch.equal(a[item]["target"], b[item]["target"])
        assert torch.equal(prompt_of(prompt, a, item), prompt_of(prompt, b, item))
        for key in ("numeric", "relation", "ctrl"):
            assert torch.equal(a[item][key], b[item][key])
        assert a[item]["demo_texts"] == b[item]["demo_texts"]


def test_trainable_fp16_weights_refused_at_startup():
    with pytest.raises(ConfigError, match="float32"):
        QwenCfg(dtype="float16", train_mode="full")
    QwenCfg(dtype="float16", train_mode="frozen")  # an explicit choice for a frozen encoder


def test_frozen_cache_serves_what_recomputing_gives(arc_folder):
    episodes = training_episodes(load_folder_split(arc_folder / "training"))
    dataset = EpisodeDataset(episodes, DifficultyScale(np.zeros(1)))
    batch = collate([dataset[(i, 0)] for i in range(4)])
    prompt = QwenHybridPrompt(prompt_dim=32, qwen=QwenCfg())
    first, present = prompt.cache.features(batch["demo_texts"], 0, torch.device("cpu"))
    assert present.all()
    tokens = prompt.qwen.tokens_encoded
    second, _ = prompt.cache.features(batch["demo_texts"], 1, torch.device("cpu"))
    assert prompt.qwen.tokens_encoded == tokens, "a frozen cache must not encode a key twice"
    assert prompt.cache.stats.misses > 0 and prompt.cache.stats.hits == prompt.cache.stats.misses
    with torch.no_grad():
        direct = torch.stack([prompt.qwen.encode(list(texts)).mean(0) for texts in batch["demo_texts"]])
    assert torch.equal(first, second)
    torch.testing.assert_close(first, direct, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["full", "lora"])
def test_trainable_qwen_with_cache_and_fp16(mode, small_cfg, parts_and_batches):
    """Invariants 1 and 7: Qwen gets gradients on refresh steps only, and the steps in between
    (no Qwen gradient) raise nothing under fp16."""
    cfg = small_cfg(qwen_train=mode, amp="fp16", prompt_refresh=2, qwen_lr=1e-3, fp16_init_scale=64.0)
    parts, batches = parts_and_batches(cfg, 4)
    assert parts.amp.scaler.is_enabled()
    qwen_params = parts.prompt.qwen_parameters()
    assert qwen_params and all(p.dtype == torch.float32 for p in qwen_params)
    norms = []
    for step, batch in enumerate(batches):
        norms.append(fixed.train_window(parts, [batch], step, cfg)["grad/qwen_norm"])
    assert 0 < norms[0] < float("inf") and 0 < norms[2] < float("inf"), f"refresh steps must reach Qwen: {norms}"
    assert norms[1] == 0 and norms[3] == 0, f"cached steps must not: {norms}"


def test_qwen_gets_gradients_in_fp32(small_cfg, parts_and_batches):
    cfg = small_cfg(qwen_train="full", prompt_refresh=1)
    parts, (batch,) = parts_and_batches(cfg, 1)
    before = [p.detach().clone() for p in parts.prompt.qwen_parameters()]
    stats = fixed.train_window(parts, [batch], 0, cfg)
    assert stats["grad/qwen_norm"] > 0 and stats["amp/stepped"] == 1.0
    assert any(not torch.equal(a, b) for a, b in zip(before, parts.prompt.qwen_parameters()))


@pytest.mark.slow
def test_from_pretrained_folder_trains_offline(tmp_path, small_cfg, monkeypatch):
    """The real loading path: a Qwen2 model and tokenizer saved to a folder, loaded with
    from_pretrained (no network), trained for one batch."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    folder = tmp_path / "qwen2-tiny"
    tiny_qwen2(seed=3).save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    cfg = small_cfg(qwen_model=str(folder), qwen_train="full", max_batches=1, eval_tasks=1)
    parts = fixed.build_parts(cfg, torch.device("cpu"))
    assert "pretrained" in parts.prompt.qwen.description
    summary = fixed.train(cfg, torch.device("cpu"))
    assert summary["steps"] == 1


def test_missing_model_is_a_one_line_config_error(tmp_path):
    with pytest.raises(ConfigError, match="--qwen_model"):
        QwenHybridPrompt(qwen=QwenCfg(model_name=str(tmp_path / "nowhere")))

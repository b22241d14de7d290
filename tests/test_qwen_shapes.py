"""Qwen2.5 at its published shapes, offline (`--qwen_model random:Qwen/Qwen2.5-0.5B`): the shapes
match the published parameter counts, every description says UNTRAINED, and the 0.5B shape
trains with LoRA."""

import pytest
import torch
from transformers import Qwen2Config, Qwen2Model

import training
from engine.config import QwenCfg
from engine.errors import ConfigError
from prompt import QwenTextEncoder
from prompt.qwen_encoder import QWEN25_COMMON, QWEN25_SHAPES


@pytest.mark.parametrize("name, published", [("Qwen/Qwen2.5-0.5B", (0.49e9, 0.36e9)),
                                             ("Qwen/Qwen2.5-1.5B", (1.54e9, 1.31e9))])
def test_shapes_have_the_published_parameter_counts(name, published):
    """The model cards' "Number of Parameters": total and non-embedding, to their two digits."""
    with torch.device("meta"):
        trunk = Qwen2Model(Qwen2Config(**QWEN25_SHAPES[name], **QWEN25_COMMON))
    total = sum(p.numel() for p in trunk.parameters())
    embedding = trunk.embed_tokens.weight.numel()
    assert (round(total / 1e7), round((total - embedding) / 1e7)) == tuple(round(x / 1e7) for x in published)


def test_unknown_shape_is_a_one_line_config_error():
    with pytest.raises(ConfigError, match=r"--qwen_model random:Qwen/Qwen2.5-7B: no published shape"):
        QwenTextEncoder.load(QwenCfg(qwen_model="random:Qwen/Qwen2.5-7B"), seed=0)


@pytest.mark.slow
def test_half_billion_shape_trains_two_steps_with_lora(small_cfg):
    """Two optimizer steps of the 0.5B shape with LoRA adapters on CPU, Qwen re-encoding with
    gradients (refresh every step); only the adapters train, and they move."""
    cfg = small_cfg(qwen_model="random:Qwen/Qwen2.5-0.5B", qwen_train="lora", max_prompt_tokens=64,
                    prompt_refresh=1, batch_size=2, max_batches=2, eval_tasks=1, qwen_lr=1e-3)
    training.seed_everything(cfg.run.seed)
    data = training.build_data(cfg, torch.device("cpu"))
    state = training.build_train_state(cfg, torch.device("cpu"))
    encoder = state.model.qwen
    assert "UNTRAINED" in encoder.description and "Qwen2.5-0.5B" in encoder.description
    assert encoder.hidden_size == 896
    trainable = {n: p.detach().clone() for n, p in encoder.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    data.sampler.set_epoch(0)
    for _, batch in zip(range(2), data.loader, strict=False):
        stats = training.train_step(state, [batch], cfg)
        assert stats["amp/stepped"] == 1.0 and stats["grad/qwen_norm"] > 0
    moved = [n for n, p in encoder.named_parameters() if n in trainable and not torch.equal(p, trainable[n])]
    assert moved
    assert encoder.stats.tokens_with_grad > 0

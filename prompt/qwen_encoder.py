"""The Qwen2 trunk that reads demo texts: loading (built-in tiny, `random:`, Hugging Face id, local
folder; docs/model.md, "Models"), the FP32 guarantee for trainable weights, and per-demo pooling."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from engine.config import QwenCfg
from engine.errors import ConfigError
from engine.loop import host_to_device

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
TINY = "tiny"
TINY_VOCAB = ("<pad>", "<unk>", *(str(d) for d in range(10)), "\n", "input", "output")
RANDOM = "random:"
# The published configurations (each model's config.json on the Hugging Face hub).
QWEN25_SHAPES = {
    "Qwen/Qwen2.5-0.5B": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                              num_key_value_heads=2, max_position_embeddings=32768),
    "Qwen/Qwen2.5-1.5B": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                              num_key_value_heads=2, max_position_embeddings=131072),
}
QWEN25_COMMON = dict(vocab_size=151936, rope_theta=1_000_000.0, tie_word_embeddings=True, rms_norm_eps=1e-6,
                     hidden_act="silu")


def tiny_tokenizer():
    """A word-level tokenizer for the digit-row text: one token per digit, newline and marker."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(TINY_VOCAB)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[0-9]|\n|[a-z]+"), behavior="isolated")
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>")


def tiny_qwen2(seed: int, hidden: int = 64, layers: int = 2):
    """A small Qwen2Model with random weights drawn from `seed` (the global RNG is left untouched)."""
    from transformers import Qwen2Config, Qwen2Model

    config = Qwen2Config(vocab_size=len(TINY_VOCAB), hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=4096, pad_token_id=0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Qwen2Model(config)


def random_qwen25(name: str, seed: int):
    """Qwen2.5 `name` at its published shape with random weights from `seed` (global RNG untouched).

    The tokenizer is the tiny one: Qwen2.5's own tokenizer also gives one token per digit, newline
    and marker word, so the token counts (and so the cost) of a demo text are those of the real
    model; the ids it uses are a few rows of the full-size embedding.
    """
    from transformers import Qwen2Config, Qwen2Model

    if name not in QWEN25_SHAPES:
        raise ConfigError(f"--qwen_model {RANDOM}{name}: no published shape for {name!r}; "
                          f"choose from {', '.join(RANDOM + n for n in QWEN25_SHAPES)}")
    config = Qwen2Config(**QWEN25_SHAPES[name], **QWEN25_COMMON, pad_token_id=0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Qwen2Model(config)


def _load_pretrained(cfg: QwenCfg):
    from transformers import AutoModel, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(cfg.qwen_model)
        model = AutoModel.from_pretrained(cfg.qwen_model, dtype=DTYPES[cfg.qwen_dtype])
    except OSError as err:
        where = "folder" if os.path.isdir(cfg.qwen_model) else "model id"
        raise ConfigError(f"--qwen_model {cfg.qwen_model}: cannot load this {where} ({str(err).splitlines()[0]}); "
                          f"without network, download it on a networked machine and pass its local folder, "
                          f"or use --qwen_model tiny") from None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer, model


def _weights_signature(folder: Path) -> str:
    """Names, sizes and the first and last MiB of every weights file: cheap, and changes whenever
    the weights do (a full hash of a 6 GB checkpoint would cost seconds at every start)."""
    h = hashlib.sha1()
    for f in sorted([*folder.glob("*.safetensors"), *folder.glob("*.bin")]):
        h.update(f"{f.name}:{f.stat().st_size}".encode())
        with open(f, "rb") as fh:
            h.update(fh.read(1 << 20))
            fh.seek(max(f.stat().st_size - (1 << 20), 0))
            h.update(fh.read(1 << 20))
    return h.hexdigest()


def _source_identity(cfg: QwenCfg, model: nn.Module, seed: int) -> str:
    """Names the weights a trunk was loaded from: part of the prompt-cache key."""
    if cfg.qwen_model == TINY:
        return f"tiny-qwen2:h{model.config.hidden_size}:l{model.config.num_hidden_layers}:seed{seed}"
    if cfg.qwen_model.startswith(RANDOM):
        return f"{cfg.qwen_model}:seed{seed}"
    if os.path.isdir(cfg.qwen_model):
        return f"folder:{_weights_signature(Path(cfg.qwen_model))}"
    return f"{cfg.qwen_model}@{getattr(model.config, '_commit_hash', None) or 'unknown-revision'}"


class EncodeStopped(Exception):
    """An encode left between two chunks: this process was asked to stop (QwenTextEncoder.stops_on)."""


@dataclass
class EncoderStats:
    """What the trunk has read: cumulative non-padding tokens (with gradients among them) and seconds."""

    tokens: int = 0
    tokens_with_grad: int = 0
    seconds: float = 0.0


class QwenTextEncoder(nn.Module):
    """Qwen2 trunk + tokenizer: demo texts -> pooled features, one vector per demo.

    Each demo is its own sequence, so the pooled state keeps that demo's input/output relation;
    the prompt cache averages a task's demos. `QwenTextEncoder.load(cfg, seed=...)` builds one from
    the flags; the constructor takes a tokenizer and trunk already made.
    """

    def __init__(self, cfg: QwenCfg, *, tokenizer, trunk: nn.Module, description: str, source: str):
        super().__init__()
        self.cfg, self.tokenizer, self.description = cfg, tokenizer, description
        self.tokenizer.padding_side = "right"  # pooling reads real tokens from the left
        trunk.to(DTYPES[cfg.qwen_dtype])
        trunk.requires_grad_(cfg.qwen_train == "full")
        if cfg.qwen_train == "lora":
            from peft import LoraConfig, get_peft_model

            # Adapters on the attention projections; the base weights stay frozen.
            lora = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha,
                              target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
            trunk = get_peft_model(trunk, lora)
        self.trunk = trunk
        self.hidden_size = trunk.config.hidden_size
        # Identifies the weights the features come from (a part of every prompt-cache key).
        self.fingerprint = hashlib.sha1(f"{source}:{cfg.qwen_dtype}:mean".encode()).hexdigest()[:16]
        self.stats = EncoderStats()
        # Under FSDP (engine/fsdp.py) every forward of the sharded trunk is a collective: given the
        # chunks this process encodes, `lockstep` returns the most any process encodes.
        self.lockstep: Callable[[int], int] | None = None
        # Read between the chunks of an encode (`stops_on`): a real-sized Qwen on the CPU takes a
        # minute for a batch of tasks' demos, longer than a scheduler's grace after its SIGTERM.
        self.stop: Callable[[], bool] | None = None
        self._token_counts: dict[str, int] = {}

    @classmethod
    def load(cls, cfg: QwenCfg, *, seed: int) -> QwenTextEncoder:
        """The built-in tiny model or a published Qwen2.5 shape (random weights from `seed`), or
        `from_pretrained` of an id or folder."""
        if cfg.qwen_model == TINY:
            tokenizer, trunk = tiny_tokenizer(), tiny_qwen2(seed)
            description = (f"tiny Qwen2 (built-in, UNTRAINED random weights, hidden {trunk.config.hidden_size}, "
                           f"{trunk.config.num_hidden_layers} layers)")
        elif cfg.qwen_model.startswith(RANDOM):
            tokenizer, trunk = tiny_tokenizer(), random_qwen25(cfg.qwen_model[len(RANDOM):], seed)
            description = (f"{cfg.qwen_model[len(RANDOM):]} shape (UNTRAINED random weights, hidden "
                           f"{trunk.config.hidden_size}, {trunk.config.num_hidden_layers} layers, "
                           f"{sum(p.numel() for p in trunk.parameters()) / 1e6:.0f}M params)")
        else:
            tokenizer, trunk = _load_pretrained(cfg)
            description = f"{cfg.qwen_model} (pretrained, {cfg.qwen_dtype} weights)"
        return cls(cfg, tokenizer=tokenizer, trunk=trunk, description=description,
                   source=_source_identity(cfg, trunk, seed))

    def token_count(self, text: str) -> int:
        """Tokens of one demo text, counted once per text (the budget check runs every step)."""
        if text not in self._token_counts:
            self._token_counts[text] = len(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        return self._token_counts[text]

    @property
    def device(self) -> torch.device:
        """Where the trunk's weights are, and so its features."""
        return next(self.trunk.parameters()).device

    def fit_budget(self, demos: tuple[str, ...]) -> tuple[tuple[str, ...], int]:
        """Drop whole demos from the end until the task fits `max_prompt_tokens` (a grid is never
        cut); the first demo is always kept. -> (kept demos, number dropped)."""
        budget = self.cfg.max_prompt_tokens
        if budget <= 0 or len(demos) <= 1:
            return demos, 0
        counts = [self.token_count(d) for d in demos]
        keep = len(demos)
        while keep > 1 and sum(counts[:keep]) > budget:
            keep -= 1
        return demos[:keep], len(demos) - keep

    def _pooled(self, texts: list[str], device: torch.device) -> torch.Tensor:
        """One trunk forward: texts -> pooled rows [len(texts), hidden] in the trunk's dtype."""
        tokens = self.tokenizer(texts, padding=True, return_tensors="pt")
        tokens_read = int(tokens["attention_mask"].numpy().sum())  # counted before the copy: on a GPU a read waits
        tokens = {k: host_to_device(v, device) for k, v in tokens.items()}
        mask = tokens["attention_mask"]
        # The trunk computes in its own dtype (--qwen_dtype) under any caller's autocast: the cache key
        # names that dtype, so a feature must not depend on which call encoded it first (training
        # encodes outside autocast, validation predicts inside --amp's).
        with torch.autocast(device.type, enabled=False):
            hidden = self.trunk(input_ids=tokens["input_ids"], attention_mask=mask).last_hidden_state
        self.stats.tokens += tokens_read
        if hidden.requires_grad:
            self.stats.tokens_with_grad += tokens_read
        weights = mask.unsqueeze(-1).to(hidden.dtype)  # the mean over a demo's real tokens
        return (hidden * weights).sum(1) / weights.sum(1)

    @contextmanager
    def stops_on(self, stop: Callable[[], bool] | None) -> Iterator[None]:
        """Within the block, `encode` reads `stop` before each chunk and raises `EncodeStopped` when it
        is true, so a stop waits for one forward of --qwen_encode_batch texts at most. Not under
        FSDP's lockstep, where every forward is a collective that all processes must run: there the
        caller's agreed stop between batches is the only one."""
        self.stop = stop
        try:
            yield
        finally:
            self.stop = None

    def encode(self, texts: list[str]) -> torch.Tensor:
        """N demo texts -> pooled features [N, hidden] float32, one row per text.

        Texts are length-sorted into batches of `encode_batch` to save padding; pooling reads only
        non-padding tokens. Gradients flow when the trunk is trainable and grad mode is on. Inside
        `stops_on`, raises `EncodeStopped` (nothing returned) when the stop turns true.
        """
        device = self.device
        pooled: list[torch.Tensor | None] = [None] * len(texts)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        size = self.cfg.qwen_encode_batch
        chunks = [order[start:start + size] for start in range(0, len(order), size)]
        padding = self.lockstep(len(chunks)) - len(chunks) if self.lockstep is not None else 0
        started = time.perf_counter()
        for chunk in chunks:
            if self.stop is not None and self.lockstep is None and self.stop():
                raise EncodeStopped
            rows = self._pooled([texts[i] for i in chunk], device)
            # float32 whatever the trunk's dtype: the cache and the projection above are float32.
            for j, i in enumerate(chunk):
                pooled[i] = rows[j].float()
        if padding:  # forwards matching the other processes'; in the graph (times 0) so backward matches too
            extra = sum(self._pooled(["0"], device).float().sum() for _ in range(padding))
            if pooled:
                pooled[0] = pooled[0] + 0 * extra
        self.stats.seconds += time.perf_counter() - started
        if not texts:
            return torch.zeros(0, self.hidden_size, device=device)
        return torch.stack(pooled)

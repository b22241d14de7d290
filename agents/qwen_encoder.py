"""The Qwen2 trunk that reads demo texts: loading (built-in tiny, Hugging Face id, local folder),
the FP32 guarantee for trainable weights, and per-demo pooling.

The built-in `tiny` model is a real `transformers` Qwen2 with random weights and a vocabulary of
digits, newline and the two markers; it exists so that every run and test works offline. It is
UNTRAINED and every log says so.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from engine.config import ConfigError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
TRAIN_MODES = ("frozen", "full", "lora")
POOLINGS = ("mean", "last")
TINY = "tiny"


@dataclass(frozen=True)
class QwenCfg:
    model_name: str = TINY  # "tiny", a Hugging Face id (e.g. Qwen/Qwen2.5-1.5B) or a local folder
    dtype: str = "float32"  # weight dtype; anything but float32 only for a frozen encoder
    use_qwen: bool = True
    train_mode: str = "frozen"  # frozen | full | lora
    lora_rank: int = 8
    lora_alpha: int = 16
    pooling: str = "mean"  # over a demo's non-padding tokens: "mean", or the "last" token's state
    max_prompt_tokens: int = 0  # per task; over it, whole demos are dropped from the end (0: no limit)
    encode_batch: int = 16  # demo texts per Qwen forward
    seed: int = 0  # initialises the tiny model's random weights

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ConfigError(f"QwenCfg.dtype={self.dtype!r}: choose one of {', '.join(DTYPES)}")
        if self.pooling not in POOLINGS:
            raise ConfigError(f"--qwen_pooling {self.pooling}: choose one of {', '.join(POOLINGS)}")
        if self.train_mode not in TRAIN_MODES:
            raise ConfigError(f"QwenCfg.train_mode={self.train_mode!r}: choose one of {', '.join(TRAIN_MODES)}")
        if self.use_qwen and self.train_mode != "frozen" and self.dtype != "float32":
            # fp16 master weights make GradScaler fail later with "Attempting to unscale FP16 gradients".
            raise ConfigError(f"trainable Qwen weights must be float32, got --qwen_dtype {self.dtype} with "
                              f"--qwen_train {self.train_mode}; use --qwen_dtype float32 (autocast still "
                              f"gives bf16/fp16 speed with --amp) or --qwen_train frozen")

    @property
    def trainable(self) -> bool:
        return self.use_qwen and self.train_mode != "frozen"


TINY_VOCAB = ("<pad>", "<unk>", *(str(d) for d in range(10)), "\n", "input", "output")


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


def _load_pretrained(cfg: QwenCfg):
    from transformers import AutoModel, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(cfg.model_name)
        model = AutoModel.from_pretrained(cfg.model_name, dtype=DTYPES[cfg.dtype])
    except OSError as err:
        where = "folder" if os.path.isdir(cfg.model_name) else "model id"
        raise ConfigError(f"--qwen_model {cfg.model_name}: cannot load this {where} ({str(err).splitlines()[0]}); "
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


def _fingerprint(cfg: QwenCfg, model: nn.Module) -> str:
    """Identifies the weights the features come from (a part of every prompt-cache key)."""
    if cfg.model_name == TINY:
        ident = f"tiny-qwen2:h{model.config.hidden_size}:l{model.config.num_hidden_layers}:seed{cfg.seed}"
    elif os.path.isdir(cfg.model_name):
        ident = f"folder:{_weights_signature(Path(cfg.model_name))}"
    else:
        ident = f"{cfg.model_name}@{getattr(model.config, '_commit_hash', None) or 'unknown-revision'}"
    return hashlib.sha1(f"{ident}:{cfg.dtype}:{cfg.pooling}".encode()).hexdigest()[:16]


class QwenTextEncoder(nn.Module):
    """Qwen2 trunk + tokenizer: demo texts -> pooled features, one vector per demo.

    Each demo is its own sequence, so the pooled state keeps that demo's input/output relation;
    the prompt cache averages a task's demos.
    """

    def __init__(self, cfg: QwenCfg):
        super().__init__()
        self.cfg = cfg
        if cfg.model_name == TINY:
            self.tokenizer, self.trunk = tiny_tokenizer(), tiny_qwen2(cfg.seed)
            self.description = (f"tiny Qwen2 (built-in, UNTRAINED random weights, hidden "
                                f"{self.trunk.config.hidden_size}, {self.trunk.config.num_hidden_layers} layers)")
        else:
            self.tokenizer, self.trunk = _load_pretrained(cfg)
            self.description = f"{cfg.model_name} (pretrained, {cfg.dtype} weights)"
        self.tokenizer.padding_side = "right"  # pooling reads real tokens from the left
        self.trunk.to(DTYPES[cfg.dtype])
        self.trunk.requires_grad_(cfg.train_mode == "full")
        if cfg.train_mode == "lora":
            from peft import LoraConfig, get_peft_model

            # Adapters on the attention projections; the base weights stay frozen.
            lora = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha,
                              target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
            self.trunk = get_peft_model(self.trunk, lora)
        self.hidden_size = self.trunk.config.hidden_size
        self.fingerprint = _fingerprint(cfg, self.trunk)
        self.tokens_encoded = 0  # cumulative non-padding tokens read by the trunk
        self._token_counts: dict[str, int] = {}

    def token_count(self, text: str) -> int:
        """Tokens of one demo text, counted once per text (the budget check runs every step)."""
        if text not in self._token_counts:
            self._token_counts[text] = len(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        return self._token_counts[text]

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

    def encode(self, texts: list[str]) -> torch.Tensor:
        """N demo texts -> pooled features [N, hidden] float32, one row per text.

        Texts are length-sorted into batches of `encode_batch` to save padding; pooling reads only
        non-padding tokens. Gradients flow when the trunk is trainable and grad mode is on.
        """
        device = next(self.trunk.parameters()).device
        pooled: list[torch.Tensor | None] = [None] * len(texts)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        for start in range(0, len(order), self.cfg.encode_batch):
            chunk = order[start:start + self.cfg.encode_batch]
            tokens = self.tokenizer([texts[i] for i in chunk], padding=True, return_tensors="pt").to(device)
            mask = tokens["attention_mask"]
            hidden = self.trunk(input_ids=tokens["input_ids"], attention_mask=mask).last_hidden_state
            if self.cfg.pooling == "mean":
                weights = mask.unsqueeze(-1).to(hidden.dtype)
                rows = (hidden * weights).sum(1) / weights.sum(1)
            else:  # right padding: the last real token sits at length - 1
                rows = hidden[torch.arange(len(chunk), device=device), mask.sum(1) - 1]
            self.tokens_encoded += int(mask.sum())
            # float32 whatever the trunk's dtype: the cache and the projection above are float32.
            for j, i in enumerate(chunk):
                pooled[i] = rows[j].float()
        if not texts:
            return torch.zeros(0, self.hidden_size, device=device)
        return torch.stack(pooled)

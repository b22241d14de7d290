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

import torch
from torch import nn

from engine.config import ConfigError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
TRAIN_MODES = ("frozen", "full", "lora")
TINY = "tiny"


@dataclass(frozen=True)
class QwenCfg:
    model_name: str = TINY  # "tiny", a Hugging Face id (e.g. Qwen/Qwen2.5-1.5B) or a local folder
    dtype: str = "float32"  # weight dtype; anything but float32 only for a frozen encoder
    use_qwen: bool = True
    train_mode: str = "frozen"  # frozen | full | lora
    lora_rank: int = 8
    lora_alpha: int = 16
    encode_batch: int = 16  # demo texts per Qwen forward
    seed: int = 0  # initialises the tiny model's random weights

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ConfigError(f"QwenCfg.dtype={self.dtype!r}: choose one of {', '.join(DTYPES)}")
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


def _fingerprint(cfg: QwenCfg, model: nn.Module) -> str:
    """Identifies the weights the features come from (a part of every prompt-cache key)."""
    if cfg.model_name == TINY:
        ident = f"tiny-qwen2:h{model.config.hidden_size}:l{model.config.num_hidden_layers}:seed{cfg.seed}"
    else:
        ident = f"{cfg.model_name}@{getattr(model.config, '_commit_hash', None) or 'local'}"
    return hashlib.sha1(f"{ident}:{cfg.dtype}".encode()).hexdigest()[:16]


class QwenTextEncoder(nn.Module):
    """Qwen2 trunk + tokenizer: demo texts -> pooled features, one vector per task.

    Each demo text is encoded on its own and mean-pooled over its non-padding tokens; a task's
    feature is the mean over its demos. Sequences are length-sorted into batches to save padding.
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

    def encode(self, demo_texts: list[tuple[str, ...]]) -> torch.Tensor:
        """demo_texts: B tuples of demo strings -> [B, hidden] float32 (zeros for a task with no demos).

        Gradients flow when the trunk is trainable and grad mode is on.
        """
        device = next(self.trunk.parameters()).device
        flat = [(b, text) for b, texts in enumerate(demo_texts) for text in texts]
        pooled = [None] * len(flat)
        order = sorted(range(len(flat)), key=lambda i: len(flat[i][1]))
        for start in range(0, len(order), self.cfg.encode_batch):
            chunk = order[start:start + self.cfg.encode_batch]
            tokens = self.tokenizer([flat[i][1] for i in chunk], padding=True, return_tensors="pt").to(device)
            hidden = self.trunk(input_ids=tokens["input_ids"], attention_mask=tokens["attention_mask"]).last_hidden_state
            mask = tokens["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            means = ((hidden * mask).sum(1) / mask.sum(1)).float()
            self.tokens_encoded += int(tokens["attention_mask"].sum())
            for j, i in enumerate(chunk):
                pooled[i] = means[j]
        out = []
        for b in range(len(demo_texts)):
            mine = [pooled[i] for i, (owner, _) in enumerate(flat) if owner == b]
            out.append(torch.stack(mine).mean(0) if mine else torch.zeros(self.hidden_size, device=device))
        # Pooled in float32 whatever the trunk's dtype: the cache and the projection above are float32.
        return torch.stack(out)

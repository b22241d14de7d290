"""The seeds' failures, on the device: `--amp off | bf16 | fp16` x a trainable Qwen (full, LoRA)
with the prompt cache, `--grad_accum 3` over 8 micro-batches (windows of 3, 3 and a partial 2),
and one non-finite gradient injected into the second window.

Each case passes when no scaler error or warning appears ("No inf checks were recorded",
"Attempting to unscale FP16 gradients"), the steps go 1, 0, 1 (the poisoned window skipped,
counted once, its weights untouched, the next window stepping), fp16's loss scale halves at the
skip (off and bf16 keep 1.0), and Qwen's trainable weights moved (the refresh steps reached them).
"""

from __future__ import annotations

import statistics
import warnings

import torch

import training
from bench.gpu_check.context import Check
from bench.gpu_check.report import Section, one_line
from engine.config import Config
from engine.loop import epoch_windows
from engine.precision import AMP_MODES

QWEN_MODES = ("full", "lora")
MICRO_BATCHES, GRAD_ACCUM, POISONED = 8, 3, 1  # windows 3 + 3 + 2; the second gets the non-finite gradient
SCALER_ERRORS = ("no inf checks", "unscale fp16")


def run(check: Check, section: Section) -> None:
    seen: dict[str, list[str]] = {}  # each warning's first line -> the cases that raised it
    for amp, qwen in check.budgeted(section, [(a, q) for q in QWEN_MODES for a in AMP_MODES]):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                row = one_case(check, amp, qwen)
            except Exception as err:  # recorded as this case's failure; the next case runs
                row = {"amp": amp, "qwen": qwen, "ok": False, "error": one_line(err)}
        messages = {str(w.message).splitlines()[0] for w in caught}
        for message in messages:
            seen.setdefault(message, []).append(f"{amp}/{qwen}")
        scaler = [m for m in messages if any(s in m.lower() for s in SCALER_ERRORS)]
        ok = row.pop("ok") and not scaler
        row = {**row, "scaler warnings": len(scaler), "ok": ok}
        section.rows.append(row)
    section.notes += [f"warning in {', '.join(cases)}: {message}" for message, cases in seen.items()]


def case_config(check: Check, amp: str, qwen: str) -> Config:
    sizes = dict(agent_channels=16, prompt_dim=32, synthetic_size="3-6") if check.tiny else {}
    return Config.from_flags(data="synthetic:32", batch_size=4, grad_accum=GRAD_ACCUM, amp=amp, qwen_train=qwen,
                             prompt_refresh=2, max_batches=MICRO_BATCHES, fp16_init_scale=2.0**10,
                             prompt_cache_dir="none", **sizes)


def one_case(check: Check, amp: str, qwen: str) -> dict:
    """Train the three windows, the second poisoned; -> the case's row."""
    cfg = case_config(check, amp, qwen)
    training.seed_everything(cfg.run.seed)
    data = training.build_data(cfg, check.device)
    state = training.build_train_state(cfg, check.device)
    data.sampler.set_epoch(0)
    windows = list(epoch_windows(data.loader, MICRO_BATCHES, GRAD_ACCUM, check.device))
    main = [p for g in state.optimizer.param_groups for p in g["params"]]
    qwen_params = state.model.parameter_groups()["qwen"]
    qwen_before = [p.detach().clone() for p in qwen_params]
    backward, poison = state.amp.backward, {"left": 0}

    def backward_then_poison(loss: torch.Tensor) -> None:
        backward(loss)
        if poison["left"]:
            poison["left"] -= 1
            next(p for p in main if p.grad is not None).grad.view(-1)[0] = float("nan")

    state.amp.backward = backward_then_poison
    stepped, scales, step_seconds, untouched = [], [state.amp.scale], [], None
    for i, window in enumerate(windows):
        poison["left"] = int(i == POISONED)
        before = [p.detach().clone() for p in main] if i == POISONED else None
        started = check.clock()
        stats = training.train_step(state, window, cfg)
        step_seconds.append(check.clock() - started)
        stepped.append(int(stats["amp/stepped"]))
        scales.append(state.amp.scale)
        if before is not None:
            untouched = all(torch.equal(a, p) for a, p in zip(before, main, strict=True))
    halved = scales[POISONED + 1] == scales[POISONED] / 2 if amp == "fp16" else set(scales) == {1.0}
    qwen_moved = any(not torch.equal(a, p) for a, p in zip(qwen_before, qwen_params, strict=True))
    cache = state.prompts.stats
    ok = (stepped == [1, 0, 1] and state.amp.skipped_steps == 1 and untouched and halved and qwen_moved)
    return {"amp": amp, "qwen": qwen, "windows": "+".join(str(len(w)) for w in windows),
            "stepped": ",".join(map(str, stepped)), "skipped": state.amp.skipped_steps,
            "loss scale": " > ".join(f"{s:g}" for s in scales), "scale right": halved,
            "poisoned window untouched": untouched, "qwen moved": qwen_moved,
            "cache": f"{cache.hits} hits, {cache.refreshed} refreshed, {cache.absent} absent",
            "step ms": round(1e3 * statistics.median(step_seconds), 1), "error": "", "ok": ok}

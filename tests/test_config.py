"""Each flag says what it is, once, where it is defined (engine.config.flag): whether it builds the
model (MODEL_FLAGS: --resume takes it from the checkpoint) and whether it can change a task's result
(RESULT_FREE: a journal ignores it). These tests hold the declarations to what the flags do; the
journal's own (tests/test_journal.py) walk RESULT_FREE."""

import dataclasses

import pytest

from engine.config import MODEL_FLAGS, RESULT_FREE, SECTIONS, Config, flag
from engine.errors import ConfigError
from model import build_model


def other_values(f: dataclasses.Field) -> list:
    """Values of a flag other than its default that may build a model: the next choice, the other
    boolean, a number doubled or moved by one."""
    default = f.default
    if f.metadata["choices"]:
        return [c for c in f.metadata["choices"] if c != default][:1]
    if isinstance(default, bool):
        return [not default]
    if isinstance(default, int):
        return [default * 2 or 1, default + 1]
    if isinstance(default, float):
        return [default * 2 or 0.5]
    return []


def checkpoint_shapes(cfg: Config) -> dict:
    """What a checkpoint of a fresh model holds: each tensor's name and shape."""
    return {name: tuple(t.shape) for name, t in build_model(cfg).trainable_state().items()}


def test_a_flag_that_changes_what_a_checkpoint_holds_says_it_builds_the_model():
    """Every flag, changed alone: where a fresh model's checkpoint then holds other tensors, the flag
    must be declared `model=True`, or --resume would build the model with the default, silently."""
    base = checkpoint_shapes(Config.from_flags(prompt_dim=32, agent_channels=16))
    undeclared, tried = [], 0
    for section in SECTIONS.values():
        for f in dataclasses.fields(section):
            for value in other_values(f):
                try:
                    cfg = Config.from_flags(**{"prompt_dim": 32, "agent_channels": 16, f.name: value})
                    shapes = checkpoint_shapes(cfg)
                except (ConfigError, ValueError):
                    continue  # not a value this flag takes (or takes with the others at their defaults)
                tried += 1
                if shapes is not None and shapes != base and f.name not in MODEL_FLAGS:
                    undeclared.append(f.name)
                break
    assert tried > 80 and not undeclared, f"these build the model: declare them flag(..., model=True): {undeclared}"


def test_the_two_declarations_name_real_flags_and_never_both():
    names = {f.name for c in SECTIONS.values() for f in dataclasses.fields(c)}
    assert MODEL_FLAGS <= names and RESULT_FREE <= names and not MODEL_FLAGS & RESULT_FREE
    assert {"agent", "agent_channels", "use_numeric", "qwen_model"} <= MODEL_FLAGS
    with pytest.raises(ValueError, match="changes a task's result"):
        flag(0, "a flag", model=True, result_free=True)

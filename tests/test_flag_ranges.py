"""Every numeric flag declares its range where it is declared (engine.config.flag's `within`), and the
sub-configs check each one in one place (engine.config._check): a value outside is one line naming the
flag, the value and the range, and fixed.py exits 2 with it before anything trains."""

import dataclasses
import typing

import pytest

import training.cli
from engine.config import SECTIONS, Config, Range, flag
from engine.errors import ConfigError
from training.cli import main

FLAGS = [(f, typing.get_type_hints(cls)[f.name]) for cls in SECTIONS.values() for f in dataclasses.fields(cls)]
NUMERIC = [(f, kind) for f, kind in FLAGS if kind in (int, float)]


def outside(within: Range, kind: type) -> tuple:
    """The values of type `kind` just outside each bound of `within`: the bound itself where it is open,
    else one past it (an int) or a billionth of it past (a float: a normal number, never a denormal,
    which a process that flushes denormals reads as zero)."""
    def beyond(bound, is_open, step):
        if is_open:
            return kind(bound)
        return bound + step if kind is int else bound + step * 1e-9 * max(1.0, abs(bound))
    return tuple(beyond(b, o, step) for b, o, step in ((within.lo, within.lo_open, -1), (within.hi, within.hi_open, 1))
                 if b is not None)


def test_every_numeric_flag_declares_its_range_and_no_other_flag_does():
    undeclared = [f.name for f, kind in NUMERIC if not isinstance(f.metadata["within"], Range)]
    misdeclared = [f.name for f, kind in FLAGS if kind not in (int, float) and f.metadata["within"] is not None]
    assert len(NUMERIC) > 50 and not undeclared and not misdeclared, (undeclared, misdeclared)
    for default, within in ((3, None), ("x", Range(0)), (-1, Range(0))):
        with pytest.raises(ValueError, match="declares the range its default is in"):
            flag(default, "a flag", within=within)


@pytest.mark.parametrize("f,kind", NUMERIC, ids=[f.name for f, _ in NUMERIC])
def test_a_value_just_outside_a_flags_range_is_one_line_naming_the_flag_the_value_and_the_range(f, kind):
    within = f.metadata["within"]
    assert within.holds(f.default) and Config.from_flags(**{f.name: f.default})
    beyond = outside(within, kind)
    assert beyond, f"--{f.name}: {within} has no bound"
    for value in (*beyond, *([float("nan"), float("inf")] if kind is float else [])):
        assert not within.holds(value)
        with pytest.raises(ConfigError) as refused:
            Config.from_flags(**{f.name: value})
        said = str(refused.value)
        assert "\n" not in said and said.startswith(f"--{f.name} {value}: must be ") and said.endswith(str(within))


def test_a_range_says_itself_in_plain_words_and_the_values_just_outside_are_outside():
    assert [str(r) for r in (Range(1), Range(0, lo_open=True), Range(0, 1, hi_open=True), Range(0, 1), Range(-1))] \
        == [">= 1", "> 0", "in [0, 1)", "in [0, 1]", ">= -1"]
    assert outside(Range(1), int) == (0,) and outside(Range(0, lo_open=True), float) == (0.0,)
    low, high = outside(Range(0, 1), float)
    assert -1e-8 < low < 0 and 1 < high < 1 + 1e-8


@pytest.mark.parametrize("args", [["--agent_lr", "-1"], ["--qwen_lr", "-0.1"], ["--ttt_lr", "-1"],
                                  ["--ttt_steps", "-5"], ["--eval_minutes", "-2"]])
def test_the_command_line_refuses_a_number_a_flag_cannot_mean(args, monkeypatch, capsys):
    """Through fixed.py's main(), in this process: exit 2 with one line naming the flag, before any training."""

    def no_training(*_args, **_kwargs):
        pytest.fail(f"{' '.join(args)} started training")

    monkeypatch.setattr(training.cli, "train", no_training)
    code = main(["--device", "cpu", *args])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("fixed.py: error: ") and "Traceback" not in err
    said = err.removeprefix("fixed.py: error: ").split()
    assert said[0] == args[0] and float(said[1].rstrip(":")) == float(args[1]) and "must be" in err

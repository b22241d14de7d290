"""The command line: flags and recipe files into a Config, and main(), which fixed.py runs.

    python fixed.py --config configs/smoke.toml --epochs 2

The flags are engine/config.py's fields, flattened and grouped by section in --help (`--agent`'s
choices: the agent registry's names, read when the parser is built). A recipe (`--config FILE`, TOML
or YAML) sets the defaults, the command line overrides them. Bad flags exit 2 with one line.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tomllib
import typing
from pathlib import Path

from agents import AGENTS
from data.arc import DataError
from engine.checkpoint import checkpoint_flags, find_checkpoint
from engine.config import MODEL_FLAGS, NOT_RESUMED, SECTION_OF, SECTIONS, Config, range_problem
from engine.distributed import init_distributed, launcher_wants_fsdp, shutdown
from engine.errors import ConfigError
from engine.loop import TrainingStopped, summary_line
from evaluation.adaptation import searches
from training.epochs import train


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _choices(name: str, f: dataclasses.Field) -> tuple | None:
    """A flag's choices: its own, or for --agent the registry's names as they are now."""
    return tuple(AGENTS) if name == "agent" else f.metadata.get("choices")


def build_parser(prog: str, description: str) -> OneLineParser:
    """Flat flags, shown in --help grouped by section."""
    # no abbreviations: `--epoch 2` read as --epochs would hide a typo, and a flag added later could change its meaning
    parser = OneLineParser(prog=prog, description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                           allow_abbrev=False)
    for section, cls in SECTIONS.items():
        group = parser.add_argument_group(section, (cls.__doc__ or "").strip().splitlines()[0])
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            kind, choices = hints[f.name], _choices(f.name, f)
            if kind is bool:
                group.add_argument(f"--{f.name}", action=argparse.BooleanOptionalAction, default=f.default,
                                   help=f.metadata["help"])
            else:
                within = f" ({f.metadata['within']})" if f.metadata["within"] else ""  # "(>= 1)"
                group.add_argument(f"--{f.name}", type=kind, default=f.default, choices=choices,
                                   help=f.metadata["help"] + within, metavar=None if choices else kind.__name__.upper())
    return parser


def _load_recipe_text(file: Path) -> object:
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"--config {file}: {err.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"--config {file}: not UTF-8 text") from None
    if file.suffix == ".toml":
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as err:
            raise ConfigError(f"--config {file}: not valid TOML: {err}") from None
    import yaml  # only YAML recipes need it

    try:
        return yaml.safe_load(text) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"--config {file}: not valid YAML: {' '.join(str(err).split())}") from None


def read_config_file(path: str) -> dict:
    """A recipe: a .toml or .yaml file whose keys are flag names (configs/). -> {flag: value}.
    An unreadable file, an unknown key, a value of the wrong type or outside a flag's choices is one
    ConfigError naming the file."""
    file = Path(path)
    if file.suffix not in (".toml", ".yaml", ".yml"):
        raise ConfigError(f"--config {path}: a recipe is a .toml or .yaml file")
    values = _load_recipe_text(file)
    if not isinstance(values, dict):
        raise ConfigError(f"--config {path}: a recipe is a table of flag names and values")
    unknown = sorted(set(values) - set(SECTION_OF))
    if unknown:
        raise ConfigError(f"--config {path}: unknown setting(s) {', '.join(unknown)} (keys are fixed.py's flag names)")
    return checked(values, f"--config {path}")


_FIELDS = {f.name: (f, typing.get_type_hints(cls)[f.name])
           for cls in SECTIONS.values() for f in dataclasses.fields(cls)}


def checked(values: dict, origin: str) -> dict:
    """Flag values a file gives (a recipe, a checkpoint's config.json), each of its flag's type, range
    and choices, else one ConfigError naming `origin` (the file), the flag and the value (where the
    command line's are typed by argparse). -> the values, ints given for floats as floats."""
    for name, value in values.items():
        f, kind = _FIELDS[name]
        fits = isinstance(value, kind) and not (kind is int and isinstance(value, bool)) or \
            (kind is float and isinstance(value, int) and not isinstance(value, bool))
        choices = _choices(name, f)
        problem = (f"expected {kind.__name__}" if not fits else
                   range_problem(f.metadata["within"], value) if kind in (int, float) else None)
        if problem is None and choices and value not in choices:
            problem = f"choose one of {', '.join(map(str, choices))}"
        if problem:
            raise ConfigError(f"{origin}: {name} = {value!r}: {problem}")
    return {name: float(v) if _FIELDS[name][1] is float else v for name, v in values.items()}


def parse(argv: list[str] | None, prog: str, description: str) -> Config:
    """The command line -> Config; bad flags exit 2 in argparse, impossible values raise ConfigError."""
    parser = build_parser(prog, description)
    parser.add_argument("--config", metavar="FILE", help="a recipe (configs/*.toml): flag names and values, "
                                                         "overridden by the flags given here")
    # only --config is looked for here; the full parser below refuses any unknown flag
    finder = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    finder.add_argument("--config")
    recipe = finder.parse_known_args(argv)[0].config
    from_recipe = read_config_file(recipe) if recipe else {}
    parser.set_defaults(**from_recipe)
    flags = vars(parser.parse_args(argv))
    flags.pop("config")
    typed = given_flags(argv)
    given = {**from_recipe, **typed}
    if flags["resume"]:
        checkpoint = find_checkpoint(flags["resume"], quiet=True)  # the run says which one it resumes
        flags.update(run_flags_of(checkpoint, given))
        flags.update(model_flags_of(checkpoint, given))
    if flags["compile"] and flags["canvas"] == "fit" and "canvas" not in given:
        # a compiled agent needs few canvas sides: the default canvas gives up to 29, the bucketed one a handful
        flags["canvas"] = "bucket"
        if os.environ.get("RANK", "0") == "0":
            print(f"{prog}: --compile runs on --canvas bucket (a handful of canvas sides, each compiled once; "
                  "--canvas full for one)", file=sys.stderr)
    cfg = Config.from_flags(**flags)
    refuse_idle(cfg, typed)
    return cfg


def _test_time_training(c: Config) -> bool:
    return c.eval.ttt_steps > 0 or c.eval.ttt_small_steps > 0


# flags that act only beside another setting -> (whether they act in a config, what they need). Typed on
# the command line without it they are refused: a flag that silently does nothing misleads whoever reads
# the command. A recipe may carry them (a recipe family shares its flags across sizes: configs/gpu-lease.toml
# keeps the family's --ttt_lr with no test-time training).
ACTS_ONLY_WITH = {
    "view_starts": (lambda c: not c.eval.view_starts or searches(c), "--input_views (its starts)"),
    **{name: (_test_time_training, "test-time training (--ttt_steps or --ttt_small_steps above 0)")
       for name in ("ttt_lr", "ttt_schedule", "ttt_warmup", "ttt_dropout", "ttt_view_rows", "ttt_views",
                    "ttt_batch_size")},
    "task_embedding_lr": (lambda c: c.prompt.task_embedding, "--task_embedding"),
    "lora_rank": (lambda c: c.qwen.qwen_train == "lora", "--qwen_train lora"),
    "lora_alpha": (lambda c: c.qwen.qwen_train == "lora", "--qwen_train lora"),
    "qwen_lr": (lambda c: c.qwen.trainable, "--qwen_train full or lora"),
    "fp16_init_scale": (lambda c: c.optim.amp == "fp16", "--amp fp16"),
    "heldout_tasks": (lambda c: c.eval.heldout_loss, "--heldout_loss"),
    "new_deadline": (lambda c: c.eval.eval_minutes > 0, "--eval_minutes"),
}


# idle flags said in a note, not refused: the earlier suite's commands type --qwen_lr beside the default frozen
# Qwen (shared/seeds: `--agent_lr 1e-5 --qwen_lr 5e-5`), and those commands must run as typed
NOTED = frozenset({"qwen_lr"})


def refuse_idle(cfg: Config, typed: dict) -> None:
    """A ConfigError naming every flag `typed` on the command line off its default that does nothing in `cfg`
    (ACTS_ONLY_WITH; a default typed out changes nothing either way); one in NOTED is a note on stderr instead."""
    flags, defaults = cfg.flags(), Config().flags()
    idle = {name: f"--{name} acts only with {needs}" for name, (acts, needs) in ACTS_ONLY_WITH.items()
            if name in typed and flags[name] != defaults[name] and not acts(cfg)}
    refused = [why for name, why in idle.items() if name not in NOTED]
    if refused:
        raise ConfigError(f"{'; '.join(refused)}: leave it out or add what it needs")
    for name in idle.keys() & NOTED:
        if os.environ.get("RANK", "0") == "0":
            print(f"note: {idle[name]}: it changes nothing in this run", file=sys.stderr)


def _flags_file(checkpoint: Path) -> str:
    """Where a checkpoint's flags are read from, as an error names it (a checkpoint written before
    config.json holds them in state.pt)."""
    return f"--resume {checkpoint}/{'config.json' if (checkpoint / 'config.json').exists() else 'state.pt'}"


def run_flags_of(checkpoint: Path, given: dict) -> dict:
    """The flags of the run that wrote the checkpoint, for every flag neither the command line nor --config
    gives (and not NOT_RESUMED), so `--resume RUN` continues RUN as it ran (its recipe, budget,
    validation) and `--eval_only` scores as RUN would have; flags retired since
    left out, those it predates absent (their defaults). Model flags: `model_flags_of`. Each value taken is
    checked as a recipe's are (`checked`: one line naming config.json), so a saved value refused now is
    refused unless one is given in its place."""
    taken = {name: value for name, value in checkpoint_flags(checkpoint).items()
             if name in SECTION_OF and name not in given and name not in NOT_RESUMED and name not in MODEL_FLAGS}
    return checked(taken, _flags_file(checkpoint))


def given_flags(argv: list[str] | None) -> dict:
    """The flags the command line itself gives, by name (not their defaults)."""
    parser = build_parser("", "")
    parser.add_argument("--config")
    for action in parser._actions:  # no defaults: a flag not given stays out of the namespace
        action.default = argparse.SUPPRESS
    given = vars(parser.parse_args(argv))
    given.pop("config", None)
    return given


def model_flags_of(checkpoint: Path, given: dict) -> dict:
    """The flags that build the model (MODEL_FLAGS) as the checkpoint's run had them, so the model
    it is resumed into is its own; a model flag given (on the command line or in --config) with
    another value is a ConfigError naming both."""
    saved = checked({name: v for name, v in checkpoint_flags(checkpoint).items() if name in MODEL_FLAGS},
                    _flags_file(checkpoint))
    defaults = Config().flags()  # a flag the suite gained after the checkpoint was written: its default then
    theirs = {name: saved.get(name, defaults[name]) for name in MODEL_FLAGS}
    # a Qwen given as a local folder may be the checkpoint's hub model saved there (a bundle's qwen/)
    local_qwen = "qwen_model" in given and Path(given["qwen_model"]).is_dir()
    clashes = [f"--{name} {given[name]} (the checkpoint's: {theirs[name]})" for name in sorted(MODEL_FLAGS)
               if name in given and given[name] != theirs[name] and not (name == "qwen_model" and local_qwen)]
    if local_qwen:
        theirs["qwen_model"] = given["qwen_model"]
    if clashes:
        raise ConfigError(f"--resume {checkpoint}: its model was built with other flags: {'; '.join(clashes)}; "
                          f"leave them out to take the checkpoint's")
    return theirs


def main(argv: list[str] | None = None) -> int:
    """fixed.py: parse, start the processes, train (or evaluate). -> the exit code: 0, 1 (bad
    data), 2 (a bad flag), 128 + a signal that stopped it, or what a stop gives (training/epochs.py)."""
    try:
        cfg = parse(argv, "fixed.py", "Train the Qwen-prompted ARC agent.")
        if launcher_wants_fsdp() and not cfg.optim.fsdp:  # an FSDP accelerate config
            cfg = cfg.replace(fsdp=True)
        dist, device = init_distributed(cfg.run.device, cfg.optim.fsdp)
        try:
            summary = train(cfg, device, dist)
            # no process closes its connections while another still uses them (gloo aborts the other)
            dist.barrier()
        finally:
            shutdown()
    except ConfigError as err:
        print(f"fixed.py: error: {err}", file=sys.stderr)
        return 2
    except DataError as err:
        print(f"fixed.py: data error: {err}", file=sys.stderr)
        return 1
    except TrainingStopped as err:
        if dist.is_main:  # every process stops together, for one reason
            print(f"fixed.py: {err}", file=sys.stderr)
        return err.exit_code
    if dist.is_main:
        print(summary_line(summary))
    return 0

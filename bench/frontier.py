"""The adaptation frontier: pass@2 against seconds a task, for a list of adaptation settings, from
the untrained weights and from a trained checkpoint, every setting paired with the default.

    python -m bench.frontier [--settings default,search,v64-s240,...] [--tasks 100] [--minutes 15]
                             [--size all|small|large] [--starts untrained,trained]
                             [--out runs/frontier] [--svg docs/frontier.svg] [--config RECIPE]
                             [--set NAME=VALUE ...]

`--size` scores the first `--tasks` of a size class (fixed.py's `--eval_size`): small, the
tasks whose every demo grid and test input is at most 10 a side (78 of ARC-AGI-1's 400), or large,
the rest; `v{V}-s{S}` is the grid of `--ttt_views` V by `--ttt_steps` S, every task alike
(`--ttt_small_steps 0`; v8-s60: the default on a large task).

A setting is a name and the adaptation flags it changes from today's default validation
(`SETTINGS`; `--set` adds flags to every row, the data included, e.g. `--set data=PATH` for a
folder of tasks); a setting that builds another model (`MODEL_SETTINGS`: other
widths) is scored from the untrained start only. `--config configs/gpu-1.toml` makes a recipe the base
of every row under `--set`'s flags (its adaptation is then the row `default`; its run's length and
what is scored stay the benchmark's: `OWN_FLAGS`), and its trained start is the recipe trained; rows
train and score on the run's `--device` (`--set device=cuda`; auto: CUDA where there is one). The
starts: `untrained` (the weights as built,
nothing trained) and the defaults trained each of `--minutes` (`--minutes 15,60`; `0`: the untrained
start alone), trained once into `--out` and found there again by a later run; a longer start goes on
from the longest shorter one (15 and 60 minutes cost 60 minutes of training, not 75: the defaults'
learning rate is constant and a resumed run keeps its data order, so the run resumed at 15 minutes
goes on as one 60-minute run would). Every row scores the first
`--tasks` ARC-AGI-1 evaluation tasks with its setting and prints, as it finishes: test-time-
training steps and samples a task (the steps applied times `--ttt_batch_size`: what was trained on,
not the budget), seconds a task on this machine (adaptation, prediction and the attempts), pass@2
with its 95% interval over tasks, the oracle, the held-out loss after adaptation (nats a cell of
the test outputs over the voted views, with its interval), and its paired difference from the first
setting listed (the default unless `--settings` starts with another) of the same start on the same
test pairs (pass@2 in points with its interval and McNemar's exact p, the loss with its interval;
`*` beyond noise, a tie otherwise). With several starts a second table pairs each start with the
first (the untrained one) at the same setting: what training buys once adaptation is as strong.

Rows are kept in `--out`/frontier.json as they finish: a rerun prints what is there and scores only
the rows it lacks (a row is its start, its setting's flags, the tasks and the device: "cpu" or the
GPU's name; a trained start on a GPU is trained into a folder of that name), so a long table survives
a stop. Inside a row each task's result is journaled as it finishes (`--out`/journal/, one file a
start and setting, evaluation/journal.py): a row stopped halfway goes on from its last task, and a
row of more tasks scores only the tasks a row of fewer, same start and setting, lacks (with
`adapt_tasks` above 1 a task whose group changes with the task count is scored again).

`--svg` draws pass@2 (bars: the 95% interval) against seconds a task on a log axis, each start's
points joined along its frontier (the best pass@2 at that cost or less).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
import shutil
from pathlib import Path

import torch

import training
from bench.heldout_curve import COLOURS
from bench.learnability import EVAL_DEFAULTS, device_of, parse_settings
from bench.recipe import train_until, with_interval
from engine.checkpoint import find_checkpoint
from engine.config import EVAL_SIZES, MODEL_FLAGS, RESUME_FREE, Config
from engine.errors import ConfigError
from evaluation.evaluate import first_tasks, score_tasks
from evaluation.heldout import by_pair
from evaluation.intervals import METHOD, beyond_noise, mcnemar, paired
from evaluation.journal import open_journal
from evaluation.ttt_policy import SMALL_SIDE
from training.cli import read_config_file

UNTRAINED = "untrained"
DEFAULT = "default"
# name (no commas: --settings lists them) -> the adaptation flags it changes from the default validation
SETTINGS: dict[str, dict] = {
    DEFAULT: {},  # 60 steps of all weights at 1e-3 on 8 views (a small task 120), 8 voted views
    "search": {"ttt_steps": 0, "view_starts": True},  # the view starts alone, no test-time training
    "steps-30": {"ttt_steps": 30},
    "steps-120-warmup-cosine": {"ttt_steps": 120, "ttt_schedule": "cosine", "ttt_warmup": 0.1, "ttt_views": 32},
    "view-rows": {"ttt_view_rows": True},
    "view-rows-120-warmup-cosine": {"ttt_view_rows": True, "ttt_steps": 120, "ttt_schedule": "cosine",
                                    "ttt_warmup": 0.1, "ttt_views": 32, "eval_augments": 32},
    "views-32": {"ttt_views": 32},
    "dropout-0.1": {"ttt_dropout": 0.1},
    # VARC's recipe at a CPU budget: auxiliary view rows, warm-up and cosine, dropout, many views and votes,
    # one task at a time (configs/adapt-varc.toml: on a CPU tasks adapted together cost more)
    "varc-60": {"ttt_view_rows": True, "ttt_steps": 60, "ttt_schedule": "cosine", "ttt_warmup": 0.1,
                "ttt_dropout": 0.1, "ttt_views": 64, "adapt_tasks": 1},  # the same at the default's steps and votes
    "varc-240": {"ttt_view_rows": True, "ttt_steps": 240, "ttt_schedule": "cosine", "ttt_warmup": 0.1,
                 "ttt_dropout": 0.1, "ttt_views": 64, "eval_augments": 32, "adapt_tasks": 1},
    "varc-600": {"ttt_view_rows": True, "ttt_steps": 600, "ttt_schedule": "cosine", "ttt_warmup": 0.1,
                 "ttt_dropout": 0.1, "ttt_views": 64, "eval_augments": 32, "adapt_tasks": 1},
}
# the default with one flag changed, the size rule kept
DEFAULT_VARIANTS = {"default-lr-3e-3": {"ttt_lr": 3e-3}, "default-views-16": {"ttt_views": 16},
                    "default-votes-32": {"eval_augments": 32}, "default-width-32": {"agent_channels": 32},
                    "default-width-32-s240": {"agent_channels": 32, "ttt_small_steps": 240},
                    "default-width-128": {"agent_channels": 128}, "default-lr-2e-3": {"ttt_lr": 2e-3},
                    "default-lr-5e-4": {"ttt_lr": 5e-4},
                    "default-batch-4-s240": {"ttt_batch_size": 4, "ttt_small_steps": 240},
                    "default-batch-4-s200": {"ttt_batch_size": 4, "ttt_small_steps": 200},
                    "default-cosine": {"ttt_schedule": "cosine"}, "default-cosine-lr-2e-3": {"ttt_schedule": "cosine",
                                                                                          "ttt_lr": 2e-3},
                    "default-dropout-0.1": {"ttt_dropout": 0.1}, "default-view-rows": {"ttt_view_rows": True},
                    "default-search": {"view_starts": True}, "default-no-input-views": {"input_views": False},
                    # the adaptation loss's coefficients (the training loss's: loss_function.adaptation_loss)
                    "default-smoothing-0": {"label_smoothing": 0.0}, "default-hard-4": {"hard_weight": 4.0},
                    # the prompt without the Qwen text stream (numeric and relation features only)
                    "default-no-qwen": {"use_qwen": False}}
SETTINGS.update(DEFAULT_VARIANTS)
# the grid of test-time training's views of the demos by its steps (v8-s60: the default's on large tasks)
SETTINGS.update({f"v{views}-s{steps}": {"ttt_views": views, "ttt_steps": steps}
                 for views in (8, 16, 32, 64) for steps in (60, 120, 240, 480)})
for _name in SETTINGS.keys() - {DEFAULT, *DEFAULT_VARIANTS}:  # the rest adapt every task alike: no size rule
    SETTINGS[_name].setdefault("ttt_small_steps", 0)
MODEL_SETTINGS = {name for name, flags in SETTINGS.items() if flags.keys() & MODEL_FLAGS}  # another model
# flags whose coming or going changed what a row measures, at the value a row kept before ran with:
# --ttt_small_steps came with the size rule (0: none); --ttt_check_every and --ttt_stop_views left with
# the early stop (5 and 8: their defaults; every row since takes every step, as check 0 did); --ttt_params
# left with its late half (all weights: what every row trains). NOW: what a row runs with today in the
# retired ones (a key's EVAL_DEFAULTS give the rest).
BEFORE = {"ttt_small_steps": 0, "ttt_check_every": 5, "ttt_stop_views": 8}
NOW = {"ttt_check_every": 0, "ttt_stop_views": 8, "ttt_params": "all"}
LEDGER = "frontier.json"
CPU = "cpu"  # a row's device before devices were named (every row ran on the CPU)

Pairs = dict[tuple[str, str], float]  # (task id, "test[j]") -> a pair's value


def score(start: Path | None, flags: dict, tasks: int, out: Path, name: str, size: str = "all") -> dict:
    """The checkpoint in `start` (None: the weights as built) validated with `flags` on the first
    `tasks` evaluation tasks of a size class (--eval_size), the prompts cached in `out`/cache, each
    task's result journaled in `out`/journal/`name`.rank0of1.jsonl (evaluation/journal.py) and read
    back from there when that holds it. -> {"metrics": eval/* figures, "pass2": per test pair, "loss":
    the held-out loss after adaptation per test pair}, the pairs as [task id, where, value] lists."""
    cache = out / "cache"
    cfg = Config.from_flags(run_dir=str(start or cache), eval_only=True,
                            **{**EVAL_DEFAULTS, "heldout_loss": True, **flags, "eval_tasks": tasks, "eval_size": size})
    checkpoint = find_checkpoint(str(start)) if start is not None else None
    device = device_of(cfg)
    data, state = training.load_run(cfg, checkpoint, device, cache_dir=cache)
    scores = score_tasks(state.model, state.prompts, data.eval_set, first_tasks(data.eval_set, tasks),
                         cfg=cfg,
                         device=device, desc="frontier",
                         journal=open_journal(out, name, state.model, cfg, 0, 1))
    pass2 = {key: m["pass2"] for key, m in by_pair(scores.records, data.eval_set).items()}
    loss = by_pair(scores.losses, data.eval_set)
    return {"metrics": scores.metrics("eval", cfg),
            "pass2": [[t, w, v] for (t, w), v in pass2.items()], "loss": [[t, w, v] for (t, w), v in loss.items()]}


def row_name(key: dict) -> str:
    """The name of a row's journal: its start, flags and device (not its tasks: a row of more tasks reads
    the tasks a row of fewer journaled), hashed (a CPU's rows as before devices were named)."""
    named = [key["start"], key["flags"]] + ([key["device"]] if key.get("device", CPU) != CPU else [])
    return hashlib.sha256(json.dumps(named, sort_keys=True).encode()).hexdigest()[:16]


def device_name(device: torch.device) -> str:
    """What a row's seconds were measured on, in its key: "cpu", or the GPU's name (seconds a task on a
    CPU and on a GPU, or on two GPUs, are not one row)."""
    return CPU if device.type == "cpu" else torch.cuda.get_device_name(device)


def same_row(row: dict, key: dict) -> bool:
    """Whether a kept row is the one `key` asks for: its start, its tasks and the flags it sets away
    from their defaults (a flag added to the suite since, at its default, changes nothing but those of
    BEFORE)."""
    defaults = Config().flags()
    changed = [{k: v for k, v in f.items() if v != defaults.get(k)} for f in ({**BEFORE, **row["flags"]}, key["flags"])]
    return row["start"] == key["start"] and row["tasks"] == key["tasks"] and changed[0] == changed[1] \
        and row.get("size", "all") == key.get("size", "all") and row.get("device", CPU) == key.get("device", CPU)


def pairs_of(row: dict, what: str) -> Pairs:
    return {(t, w): v for t, w, v in row[what]}


def samples(row: dict) -> float:
    """Test-time-training samples a task: the steps applied times the episodes a step."""
    return row["metrics"].get("eval/ttt_steps_per_task", 0.0) * row["flags"]["ttt_batch_size"]


def versus(base: dict, row: dict) -> list[str]:
    """The row's paired difference from `base` (the default of its start): pass@2 and the held-out
    loss after adaptation, each with its 95% interval, `*` when beyond noise."""
    cells = []
    for what, scale, unit in (("pass2", 100, " pt"), ("loss", 1, "")):
        a, b = pairs_of(base, what), pairs_of(row, what)
        if not a or not b:
            cells.append("-")
            continue
        d = paired(a, b)
        text = f"{scale * d['diff']:+.3g}{unit} ({scale * d['lo']:+.3g} to {scale * d['hi']:+.3g})"
        if what == "pass2":
            text += f", p = {mcnemar(a, b)['p']:.2g}"
        cells.append(text + (" *" if beyond_noise(d["lo"], d["hi"]) else ""))
    return cells


def table_line(row: dict, base: dict | None) -> str:
    m = row["metrics"]
    loss = "-" if "eval/adapted_nats_cell" not in m else \
        f"{m['eval/adapted_nats_cell']:.3f} ({m['eval/adapted_nats_cell_lo']:.3f}-{m['eval/adapted_nats_cell_hi']:.3f})"
    gains = versus(base, row) if base is not None and row is not base else ["(the base)", "(the base)"]
    steps = m.get("eval/ttt_steps_per_task", 0.0)
    return (f"| {row['start']} | {row['setting']} | {steps:.1f} | {samples(row):,.0f} | "
            f"{m['eval/seconds_per_task']:.2f} | {with_interval(m, 'eval/pass2')} | {100 * m['eval/oracle']:.1f}% | "
            f"{loss} | " + " | ".join(gains) + " |")


HEADER = ("| start | setting | TTT steps a task | samples a task | s/task | pass@2 (95%) | oracle | adapted loss, "
          "nats a cell (95%) | pass@2 - default (95%, McNemar p) | loss - default (95%) |\n"
          "|---|---|---|---|---|---|---|---|---|---|")


def frontier(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The points no cheaper point beats: sorted by cost, each better than every cheaper one."""
    out: list[tuple[float, float]] = []
    for x, y in sorted(points):
        if not out or y > out[-1][1]:
            out.append((x, y))
    return out


def svg(rows: list[dict], path: Path, title: str) -> None:
    """pass@2 (with its interval as a bar) against seconds a task (log axis), one colour per start,
    each start's frontier drawn as a line through its points; every point labelled with its setting."""
    width, height, pad = 760, 460, 64
    xs = [r["metrics"]["eval/seconds_per_task"] for r in rows]
    lo_x, hi_x = math.log10(min(xs) / 1.3), math.log10(max(xs) * 1.3)
    top = max(r["metrics"]["eval/pass2_hi"] for r in rows) * 100 * 1.1 or 1.0

    def xy(seconds: float, pass2: float) -> tuple[float, float]:
        return (pad + (width - 2 * pad) * (math.log10(seconds) - lo_x) / (hi_x - lo_x),
                height - pad - (height - 2 * pad) * 100 * pass2 / top)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
             'font-size="12">', '<rect width="100%" height="100%" fill="white"/>',
             f'<line x1="{pad}" y1="{height - pad}" x2="{width - pad}" y2="{height - pad}" stroke="black"/>',
             f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{height - pad}" stroke="black"/>',
             f'<text x="{width / 2}" y="{height - 20}" text-anchor="middle">seconds a task (log scale)</text>',
             f'<text x="16" y="{height / 2}" transform="rotate(-90 16 {height / 2})" text-anchor="middle">'
             'pass@2, %</text>', f'<text x="{pad}" y="{pad - 30}">{title}</text>']
    for k in range(math.floor(lo_x), math.ceil(hi_x) + 1):
        for m in (1, 2, 5):
            tick = m * 10 ** k
            if lo_x <= math.log10(tick) <= hi_x:
                x, _ = xy(tick, 0)
                parts.append(f'<text x="{x:.1f}" y="{height - pad + 16}" text-anchor="middle">{tick:g}</text>')
    for k in range(5):
        _, y = xy(10 ** lo_x, top * k / 4 / 100)
        parts.append(f'<text x="{pad - 6}" y="{y + 4:.1f}" text-anchor="end">{top * k / 4:.0f}</text>')
    starts = list(dict.fromkeys(r["start"] for r in rows))
    for i, start in enumerate(starts):
        colour = COLOURS[i % len(COLOURS)]
        mine = [r for r in rows if r["start"] == start]
        line = frontier([(r["metrics"]["eval/seconds_per_task"], r["metrics"]["eval/pass2"]) for r in mine])
        points = " ".join("{:.1f},{:.1f}".format(*xy(x, y)) for x, y in line)
        parts.append(f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="2"/>')
        for r in mine:
            m = r["metrics"]
            (x, y), (_, y0), (_, y1) = (xy(m["eval/seconds_per_task"], m[k])
                                        for k in ("eval/pass2", "eval/pass2_lo", "eval/pass2_hi"))
            parts += [f'<line x1="{x:.1f}" y1="{y0:.1f}" x2="{x:.1f}" y2="{y1:.1f}" stroke="{colour}" '
                      'stroke-opacity="0.4"/>', f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3.5" fill="{colour}"/>',
                      f'<text x="{x + 5:.1f}" y="{y - 5:.1f}" font-size="10" fill="{colour}">{r["setting"]}</text>']
        parts.append(f'<text x="{width - pad}" y="{pad + 16 * i}" fill="{colour}" text-anchor="end">{start}</text>')
    path.write_text("\n".join(parts + ["</svg>"]) + "\n")


def across_starts(rows: list[dict]) -> list[str]:
    """Each row of a later start paired with the first start's row of the same setting: pass@2 and
    the adapted loss, as `versus` gives them. -> markdown lines (none with one start)."""
    first = rows[0]["start"] if rows else None
    base = {r["setting"]: r for r in rows if r["start"] == first}
    lines = []
    for row in rows:
        if row["start"] != first and row["setting"] in base:
            m, b = row["metrics"], base[row["setting"]]["metrics"]
            lines.append(f"| {row['setting']} | {row['start']} | {with_interval(m, 'eval/pass2')} | "
                         f"{with_interval(b, 'eval/pass2')} | " + " | ".join(versus(base[row["setting"]], row)) + " |")
    if not lines:
        return []
    return [f"\neach start against the {first} start at the same setting:\n",
            f"| setting | start | pass@2 (95%) | {first} pass@2 | pass@2 - {first} (95%, McNemar p) | "
            f"loss - {first} (95%) |", "|---|---|---|---|---|---|", *lines]


def start_stem(recipe: str, common: dict) -> str:
    """A trained start's folder name before its minutes: the recipe's name, and where `common` holds
    flags that shape what training learns (a recipe's own, --set data=...), a hash of them, so a
    start trained with other flags is never the one these score (a start trained as long is reused
    without training, its flags unread)."""
    shaping = {k: v for k, v in common.items() if k not in RESUME_FREE}
    return f"{recipe}+{hashlib.sha256(json.dumps(shaping, sort_keys=True).encode()).hexdigest()[:8]}" \
        if shaping else recipe


def trained_start(minutes: float, out: Path, common: dict, recipe: str = "defaults") -> tuple[str, Path]:
    """The defaults (or the recipe named `recipe`, its flags in `common`) trained `minutes` minutes in
    `out/<start_stem>-<minutes>min`, trained there now if it holds less; under a constant lr a new
    folder starts from the longest shorter start of the same stem in `out` (its checkpoints and
    ledger: the training goes on from there). -> (the start's name in the tables, its folder)."""
    stem = start_stem(recipe, common)
    folder = out / f"{stem}-{minutes:g}min"
    # a run resumed at a larger --max_minutes goes on as one run of it only at a constant lr (a cosine
    # is drawn over the whole budget): each start of another schedule is trained from the start
    constant = common.get("lr_schedule", Config().optim.lr_schedule) == "constant"
    if constant and not folder.exists():
        length = re.compile(rf"{re.escape(stem)}-(\d+(?:\.\d+)?)min")
        named = ((length.fullmatch(f.name), f) for f in out.iterdir() if f.is_dir())
        trained = ((float(match[1]), f) for match, f in named if match)
        shorter = sorted((m, f) for m, f in trained if m < minutes)
        if shorter:
            partial = folder.with_name(folder.name + ".partial")
            shutil.rmtree(partial, ignore_errors=True)
            # its validation journal is the shorter start's: the longer start validates afresh
            shutil.copytree(shorter[-1][1], partial, ignore=shutil.ignore_patterns("journal"))
            partial.rename(folder)  # whole or not at all
    so_far = train_until(minutes, folder, common)
    return f"{recipe} {so_far['train_minutes']:.0f} min ({so_far['steps']:,} steps)", folder


# what the benchmark sets itself: how long a start trains and where, and what is scored (--minutes, --out, --tasks)
OWN_FLAGS = {"epochs", "max_minutes", "max_batches", "run_dir", "resume", "eval_only", "eval_tasks", "log_every",
             "prompt_cache_dir", "submission", "eval_size"}


def row_flags(config: str | None, pairs: list[str]) -> dict:
    """The flags every row adds to its setting's: a recipe's (`config`, but what the benchmark sets
    itself, said on stdout) under --set's `pairs`."""
    try:
        recipe = read_config_file(config) if config else {}
    except ConfigError as err:
        raise SystemExit(str(err)) from None
    dropped = sorted(recipe.keys() & OWN_FLAGS)
    if dropped:
        print(f"--config {config}: {', '.join(dropped)} left to the benchmark (--minutes, --out, --tasks)")
    given = parse_settings(pairs)
    refused = sorted(given.keys() & OWN_FLAGS)
    if refused:
        raise SystemExit(f"--set {', '.join(refused)}: the benchmark sets it (--minutes, --out, --tasks)")
    return {**{k: v for k, v in recipe.items() if k not in OWN_FLAGS}, **given}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--settings", default=",".join(SETTINGS), help=f"comma-separated names of {list(SETTINGS)} "
                                                                   "(the first: each start's pairing base)")
    ap.add_argument("--tasks", type=int, default=100, help="ARC-AGI-1 evaluation tasks scored (the first N)")
    ap.add_argument("--size", choices=EVAL_SIZES, default="all",
                    help=f"the tasks (--eval_size): all, or the first of a size class: small (every demo grid and "
                         f"test input at most {SMALL_SIDE} a side) or large (the rest)")
    ap.add_argument("--minutes", default="15", help="training minutes of each trained start, comma-separated "
                                                        "(0: none)")
    ap.add_argument("--starts", default="untrained,trained", help="which starts: untrained, trained or both")
    ap.add_argument("--out", type=Path, default=Path("runs/frontier"), help="the trained start and frontier.json")
    ap.add_argument("--svg", type=Path, help="draw the frontier here")
    ap.add_argument("--config", help="a recipe (configs/*.toml): its flags for every row under --set's, and the "
                                     "trained start is it trained (default: the defaults)")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="a fixed.py flag for every row (training the start too); --set device=cuda for a GPU")
    args = ap.parse_args(argv)
    names = list(dict.fromkeys(n for n in args.settings.split(",") if n))
    unknown = [n for n in names if n not in SETTINGS]
    if unknown:
        raise SystemExit(f"--settings: unknown setting(s) {unknown}; choose from {list(SETTINGS)}")
    if not names:
        raise SystemExit("--settings: name at least one setting")
    if args.tasks < 1:
        raise SystemExit(f"--tasks {args.tasks}: at least 1")
    try:
        minutes = sorted({float(m) for m in args.minutes.split(",") if m} - {0.0})
    except ValueError:
        raise SystemExit(f"--minutes {args.minutes}: comma-separated numbers of minutes") from None
    common = row_flags(args.config, args.set)
    device = device_name(device_of(Config.from_flags(**{k: v for k, v in common.items() if k == "device"})))
    args.out.mkdir(parents=True, exist_ok=True)
    ledger = args.out / LEDGER
    rows: list[dict] = json.loads(ledger.read_text()) if ledger.exists() else []
    wanted = set(args.starts.split(","))
    if not wanted or wanted - {UNTRAINED, "trained"}:
        raise SystemExit(f"--starts {args.starts}: untrained, trained or both (comma-separated)")
    starts: dict[str, Path | None] = {UNTRAINED: None} if UNTRAINED in wanted else {}
    if "trained" in wanted:
        recipe = Path(args.config).stem if args.config else "defaults"
        recipe += "" if device == CPU else "@" + re.sub(r"[^A-Za-z0-9]+", "-", device)  # its own start a device
        starts.update(trained_start(m, args.out, common, recipe) for m in minutes)
    size = args.size if args.size == "all" else f"{args.size}:{SMALL_SIDE}"
    print(f"the first {args.tasks} evaluation tasks ({size}); intervals: {METHOD}; s/task on this machine "
          f"({device}, {torch.get_num_threads()} threads)\n\n{HEADER}", flush=True)
    shown = []
    for start, folder in starts.items():
        base = None
        for name in names:
            if folder is not None and name in MODEL_SETTINGS:
                continue
            flags = {**EVAL_DEFAULTS, **common, **SETTINGS[name]}
            key = {"start": start, "flags": {**NOW, **flags}, "tasks": args.tasks, "size": size, "device": device}
            row = next((r for r in rows if same_row(r, key)), None)
            if row is None:
                row = {**key, "setting": name, **score(folder, flags, args.tasks, args.out, row_name(key), args.size)}
                rows.append(row)
                partial = ledger.with_suffix(".partial")
                partial.write_text(json.dumps(rows))
                partial.replace(ledger)  # whole or not at all
            row = {**row, "setting": name}  # a kept row shows the name asked for (v8-s120: once v8-s120-nostop)
            base = base or row
            shown.append(row)
            print(table_line(row, base), flush=True)
    print("\n".join(across_starts(shown)))
    if args.svg:
        svg(shown, args.svg, f"the adaptation frontier: the first {args.tasks} ARC-AGI-1 evaluation tasks")
        print(f"\npicture: {args.svg}")


if __name__ == "__main__":
    main()

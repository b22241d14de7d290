"""Compare two runs: the paired differences of their scores and held-out losses, with intervals and
exact tests, and the tasks one solves and the other does not (docs/runs.md, "The report of a validation").

    python -m evaluation.compare RUN_A RUN_B [--out PAGE]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from engine.files import write_atomic
from evaluation.intervals import METHOD, beyond_noise, mcnemar, paired, sign_test
from evaluation.report import page_html

SCORES = {"pass@2": lambda pair: any(pair["right"]), "exact": lambda pair: pair["right"][0],
          "oracle": lambda pair: pair["oracle"] or any(pair["right"])}


@dataclass
class Comparison:
    names: tuple[str, str]  # the runs' folder names
    cards: list[dict]  # the tasks both scored, each with two runs
    pass2: tuple[float, float]  # each run's pass@2 over the test pairs of those tasks
    gained: list[str]  # task ids solved by B, not by A
    lost: list[str]  # task ids solved by A, not by B
    differences: list[dict]  # per score and loss: {"name", "kind" (score|loss), paired()'s keys, the test's}


def read_report(run: Path) -> dict:
    """A run folder's report.json -> {"header", "cards"}; a missing or damaged file is one line."""
    path = run / "report.json"
    if not path.is_file():
        raise SystemExit(f"{path}: no report (a run writes it at each validation; --eval_only writes one too)")
    try:
        report = json.loads(path.read_text())
        return {"header": report["header"], "cards": report["cards"], "heldout": report.get("heldout", {})}
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise SystemExit(f"{path}: not a report ({err})") from None


def pass2(cards: list[dict], run: int) -> float:
    """Share of the cards' test pairs that run `run` solves with one of its two attempts."""
    pairs = [any(p["right"]) for c in cards for p in c["runs"][run]["pairs"]]
    return sum(pairs) / len(pairs) if pairs else 0.0


def compare(a: dict, b: dict) -> Comparison:
    """Two reports -> the cards of the tasks both scored (A's run first, then B's), in A's order."""
    theirs = {c["id"]: c for c in b["cards"]}
    cards = []
    for card in a["cards"]:
        other = theirs.get(card["id"])
        if other is None or card["runs"][0].get("unanswered") or other["runs"][0].get("unanswered"):
            continue  # not scored by both (a task to predict has no verdict to compare)
        if other["tests"] != card["tests"]:
            raise SystemExit(f"task {card['id']}: the two runs scored different test pairs (other evaluation data?)")
        cards.append({**card, "runs": [card["runs"][0], other["runs"][0]]})
    if not cards:
        raise SystemExit(f"{a['header']['run']} and {b['header']['run']}: no evaluated task in common")
    solved = [[c["runs"][r]["solved"] for c in cards] for r in (0, 1)]
    return Comparison((a["header"]["run"], b["header"]["run"]), cards, (pass2(cards, 0), pass2(cards, 1)),
                      gained=[c["id"] for c, x, y in zip(cards, *solved, strict=True) if y and not x],
                      lost=[c["id"] for c, x, y in zip(cards, *solved, strict=True) if x and not y],
                      differences=differences(cards, a["heldout"], b["heldout"]))


def per_pair(cards: list[dict], run: int, value) -> dict[tuple[str, str], float]:
    """{(task id, "test[j]"): value(pair)} of run `run` over the cards' test pairs (None values left out)."""
    out = {}
    for card in cards:
        for j, pair in enumerate(card["runs"][run]["pairs"]):
            v = value(pair)
            if v is not None:
                out[(card["id"], f"test[{j}]")] = float(v)
    return out


def differences(cards: list[dict], heldout_a: dict, heldout_b: dict) -> list[dict]:
    """The paired differences B - A: each score of SCORES with McNemar's test, then each held-out loss
    both runs measured (before adaptation per set, after adaptation on the scored pairs) with the sign
    test. A score's values are 0/1 a pair; a loss's nats a cell."""
    out = []
    for name, value in SCORES.items():
        a, b = per_pair(cards, 0, value), per_pair(cards, 1, value)
        out.append({"name": name, "kind": "score", **paired(a, b), **mcnemar(a, b)})
    losses = {f"held-out loss before adaptation: {name}": ({(t, w): n for t, w, n, _ in heldout_a[name]},
                                                             {(t, w): n for t, w, n, _ in heldout_b[name]})
              for name in heldout_a if name in heldout_b}
    losses["held-out loss after adaptation"] = tuple(per_pair(cards, r, lambda p: p.get("nats_cell")) for r in (0, 1))
    for name, (a, b) in losses.items():
        if set(a) & set(b):
            out.append({"name": name, "kind": "loss", **paired(a, b), **sign_test(a, b)})
    return out


def difference_line(d: dict) -> str:
    """One printed line of a paired difference, saying whether it is beyond noise."""
    verdict = "beyond noise" if beyond_noise(d["lo"], d["hi"]) else "a tie"
    if d["kind"] == "score":
        return (f"{d['name']:<8} A {100 * d['a']:.1f}%  B {100 * d['b']:.1f}%  B - A {100 * d['diff']:+.1f} points "
                f"(95%: {100 * d['lo']:+.1f} to {100 * d['hi']:+.1f}; {verdict})  gained {d['gained']}, lost "
                f"{d['lost']}, McNemar p = {d['p']:.3g}  [{d['pairs']} pairs]")
    return (f"{d['name']}: A {d['a']:.3f}  B {d['b']:.3f}  B - A {d['diff']:+.3f} nats a cell (95%: {d['lo']:+.3f} to "
            f"{d['hi']:+.3f}; {verdict})  lower in {d['lower']} tasks, higher in {d['higher']}, sign test p = "
            f"{d['p']:.3g}  [{d['pairs']} pairs, {d['tasks']} tasks]")


def table(result: Comparison) -> str:
    """The printed comparison: pass@2 of each run, the difference and its paired count, then one line
    per task solved by one run only (with each run's cells wrong)."""
    (a, b) = result.names
    pairs = sum(len(c["tests"]) for c in result.cards)
    lines = [f"A {a}, B {b}: {len(result.cards)} tasks ({pairs} test pairs) scored by both; intervals: {METHOD}",
             *map(difference_line, result.differences),
             f"tasks   gained (B solves, A does not): {len(result.gained)}   lost (A solves, B does not): "
             f"{len(result.lost)}"]
    differs = {t: "gained" for t in result.gained} | {t: "lost" for t in result.lost}
    if differs:
        width = max(len(t) for t in differs) + 2
        lines.append(f"\n{'task':<{width}}{'':<8}{'A':>16}{'B':>16}")

        def state(run: dict) -> str:
            if run["solved"]:
                return "solved"
            wrong = run["cells_wrong"]
            return "wrong shape" if wrong is None else f"{wrong} cell{'s' * (wrong != 1)} wrong"

        for card in result.cards:
            if card["id"] in differs:
                lines.append(f"{card['id']:<{width}}{differs[card['id']]:<8}{state(card['runs'][0]):>16}"
                             f"{state(card['runs'][1]):>16}")
    return "\n".join(lines)


def compare_page(result: Comparison, heads: tuple[dict, dict]) -> str:
    (a, b) = result.names
    rows = [("A", f"{a}: {heads[0]['weights']} (step {heads[0]['step']})"),
            ("B", f"{b}: {heads[1]['weights']} (step {heads[1]['step']})"),
            ("tasks scored by both", str(len(result.cards))),
            *((d["name"], difference_line(d).split(":", 1)[1].strip() if d["kind"] == "loss"
               else difference_line(d)[len(d["name"]):].strip()) for d in result.differences),
            ("intervals", METHOD),
            ("gained (B solves, A does not)", ", ".join(result.gained) or "none"),
            ("lost (A solves, B does not)", ", ".join(result.lost) or "none")]
    return page_html(f"{a} (A) against {b} (B)", rows, [f"A {a}", f"B {b}"], result.cards,
                     default_filter="differs" if result.gained or result.lost else "all")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_a", type=Path, help="a run folder (with report.json)")
    ap.add_argument("run_b", type=Path, help="another run folder")
    ap.add_argument("--out", type=Path, help="the page (default: RUN_B/compare.html)")
    args = ap.parse_args(argv)
    reports = read_report(args.run_a), read_report(args.run_b)
    result = compare(*reports)
    print(table(result))
    out = args.out or args.run_b / "compare.html"
    write_atomic(out, compare_page(result, (reports[0]["header"], reports[1]["header"])))
    print(f"\npage: {out}")


if __name__ == "__main__":
    main()

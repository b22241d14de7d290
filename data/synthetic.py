"""A seeded generator of ARC-format tasks from simple rule families (`synthetic:<n>`, README "Data").

Each task draws one rule family and its per-task parameters (a colour map, a direction, a factor, a
colour), then demo and test pairs that all follow that rule, so the rule can only be read from the demos.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from data.arc import MAX_SIDE, NUM_COLOURS, ArcPair, ArcTask, Grid
from data.features import crop_to_content

Rule = Callable[[Grid], Grid]
Family = Callable[[np.random.Generator], tuple[Rule, Callable[..., Grid], int]]  # rng -> (rule, inputs, max input side)


def _scatter(rng: np.random.Generator, h: int, w: int, density: float = 0.3,
             palette: np.ndarray | None = None) -> Grid:
    """Background 0 with cells of 2-3 random colours (or every colour of `palette`) scattered at
    `density`; the first colour (every palette colour) planted at least once."""
    colours = palette if palette is not None else \
        rng.choice(np.arange(1, NUM_COLOURS), size=int(rng.integers(2, 4)), replace=False)
    grid = np.where(rng.random((h, w)) < density, rng.choice(colours, size=(h, w)), 0)
    planted = colours if palette is not None else colours[:1]
    cells = rng.choice(h * w, size=min(len(planted), h * w), replace=False)
    grid.flat[cells] = planted[:len(cells)]
    return grid.astype(np.int64)


def gravity(grid: Grid, k: int) -> Grid:
    """Coloured cells fall to the bottom after k quarter turns (k picks the direction)."""
    g = np.rot90(grid, k)
    out = np.zeros_like(g)
    for c in range(g.shape[1]):
        column = g[:, c][g[:, c] != 0]
        out[g.shape[0] - len(column):, c] = column
    return np.ascontiguousarray(np.rot90(out, -k))


def _border(grid: Grid, colour: int) -> Grid:
    out = grid.copy()
    out[0, :] = out[-1, :] = out[:, 0] = out[:, -1] = colour
    return out


def _fill_enclosed(grid: Grid, colour: int) -> Grid:
    """Background cells not 4-connected to the edge through background get `colour`."""
    h, w = grid.shape
    outside = np.zeros((h, w), dtype=bool)
    stack = [(r, c) for r in range(h) for c in (0, w - 1)] + [(r, c) for r in (0, h - 1) for c in range(w)]
    while stack:
        r, c = stack.pop()
        if 0 <= r < h and 0 <= c < w and not outside[r, c] and grid[r, c] == 0:
            outside[r, c] = True
            stack.extend(((r + 1, c), (r - 1, c), (r, c + 1), (r, c - 1)))
    return np.where((grid == 0) & ~outside, colour, grid)


def _outlines(rng: np.random.Generator, h: int, w: int) -> Grid:
    """1-3 hollow rectangles of one colour: inputs for the fill rule."""
    grid = np.zeros((h, w), dtype=np.int64)
    colour = int(rng.integers(1, NUM_COLOURS))
    for _ in range(int(rng.integers(1, 4))):
        rh, rw = int(rng.integers(3, max(4, h // 2 + 2))), int(rng.integers(3, max(4, w // 2 + 2)))
        r, c = int(rng.integers(0, h - rh + 1)), int(rng.integers(0, w - rw + 1))
        grid[r, c:c + rw] = grid[r + rh - 1, c:c + rw] = colour
        grid[r:r + rh, c] = grid[r:r + rh, c + rw - 1] = colour
    return grid


def _patch(rng: np.random.Generator, h: int, w: int) -> Grid:
    """A small patch of content somewhere on a larger background: inputs for the crop rule."""
    ph, pw = int(rng.integers(1, max(2, h // 2 + 1))), int(rng.integers(1, max(2, w // 2 + 1)))
    grid = np.zeros((h, w), dtype=np.int64)
    r, c = int(rng.integers(0, h - ph + 1)), int(rng.integers(0, w - pw + 1))
    grid[r:r + ph, c:c + pw] = _scatter(rng, ph, pw, density=0.7)
    return grid


def _recolour(rng):
    """Every pair of the task uses one palette of 3-4 colours, each in every grid, so the demos
    show where each colour of the test input goes (with colours drawn per grid, a test colour was
    often in no demo and the task could not be solved)."""
    palette = rng.choice(np.arange(1, NUM_COLOURS), size=int(rng.integers(3, 5)), replace=False)
    mapping = np.arange(NUM_COLOURS)
    while (mapping[palette] == palette).all():  # a map that changes no palette colour shows nothing
        mapping[1:] = rng.permutation(np.arange(1, NUM_COLOURS))
    return (lambda g: mapping[g]), (lambda rng, h, w: _scatter(rng, h, w, palette=palette)), MAX_SIDE


def _scale(rng):
    k = int(rng.integers(2, 4))
    return (lambda g: np.kron(g, np.ones((k, k), dtype=g.dtype))), _scatter, MAX_SIDE // k


def _flip(rng):
    axis = int(rng.integers(2))
    return (lambda g: np.ascontiguousarray(np.flip(g, axis))), _scatter, MAX_SIDE


def _rotate(rng):
    k = int(rng.integers(1, 4))
    return (lambda g: np.ascontiguousarray(np.rot90(g, k))), _scatter, MAX_SIDE


def _gravity(rng):
    k = int(rng.integers(4))
    return (lambda g: gravity(g, k)), _scatter, MAX_SIDE


def _border_family(rng):
    colour = int(rng.integers(1, NUM_COLOURS))
    return (lambda g: _border(g, colour)), _scatter, MAX_SIDE


def _fill(rng):
    colour = int(rng.integers(1, NUM_COLOURS))
    return (lambda g: _fill_enclosed(g, colour)), _outlines, MAX_SIDE


FAMILIES: dict[str, Family] = {
    "recolour": _recolour,
    "flip": _flip,
    "rotate": _rotate,
    "transpose": lambda rng: ((lambda g: np.ascontiguousarray(g.T)), _scatter, MAX_SIDE),
    "gravity": _gravity,
    "crop": lambda rng: (crop_to_content, _patch, MAX_SIDE),
    "scale": _scale,
    "border": _border_family,
    "fill": _fill,
}


def make_task(family: str, rng: np.random.Generator, task_id: str, size: tuple[int, int] = (3, 10),
              n_demos: int = 3, n_test: int = 1) -> ArcTask:
    """One task of `family`: all pairs follow the same per-task rule; sides drawn in `size`."""
    rule, inputs, max_side = FAMILIES[family](rng)
    lo, hi = min(size[0], max_side), min(size[1], max_side)
    pairs = []
    for _ in range(1000 * (n_demos + n_test)):
        h, w = (int(rng.integers(lo, hi + 1)) for _ in range(2))
        x = inputs(rng, h, w)
        y = rule(x)
        if not np.array_equal(x, y):  # a pair that shows nothing of the rule is redrawn
            pairs.append(ArcPair(x, y.astype(np.int64)))
        if len(pairs) == n_demos + n_test:
            break
    else:
        raise ValueError(f"synthetic family {family!r} gave no informative pair for sizes {size}")
    return ArcTask(task_id, tuple(pairs[:n_demos]), tuple(pairs[n_demos:]))


def generate_tasks(n: int, seed: int, families: tuple[str, ...] = tuple(FAMILIES),
                   size: tuple[int, int] = (3, 10)) -> tuple[ArcTask, ...]:
    """`n` tasks, families drawn in turn, reproducible from `seed`."""
    unknown = set(families) - set(FAMILIES)
    if unknown:
        raise ValueError(f"unknown synthetic rule families {sorted(unknown)}; known: {', '.join(FAMILIES)}")
    rng = np.random.default_rng(seed)
    return tuple(make_task(families[i % len(families)], rng, f"syn{seed}-{i:05d}-{families[i % len(families)]}",
                           size) for i in range(n))

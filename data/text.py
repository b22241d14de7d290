"""Grids as text for the Qwen encoder: compact digit rows with explicit input/output markers.

Qwen2.5's tokenizer splits every digit into its own token, so one cell is one token; rows end in a
newline and the markers are whole words, so no separator merges with a digit. One demo is one text:
the encoder pools each demo on its own so the input/output relation is not averaged away.
"""

from __future__ import annotations

import numpy as np

from data.arc import ArcPair, Grid

TEXT_FORMAT_VERSION = 1  # part of the prompt-cache key: bump on any change below


def grid_text(grid: Grid) -> str:
    """Rows of digits, each ending in a newline (colours are 0-9: data/arc.py validates every grid)."""
    chars = np.full((grid.shape[0], grid.shape[1] + 1), ord("\n"), dtype=np.uint8)
    chars[:, :-1] = grid + ord("0")
    return chars.tobytes().decode("ascii")


def demo_text(pair: ArcPair) -> str:
    """One demonstration: `input\\n<rows>output\\n<rows>`."""
    return "input\n" + grid_text(pair.input) + "output\n" + grid_text(pair.output)

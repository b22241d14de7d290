"""ARC grids as an RGB image for TensorBoard: demos, test input, target and both attempts."""

from __future__ import annotations

import numpy as np

from data.arc import ArcPair, Grid

# The ARC colours, 0-9: black, blue, red, green, yellow, grey, magenta, orange, azure, maroon.
ARC_RGB = np.array([[0, 0, 0], [0, 116, 217], [255, 65, 54], [46, 204, 64], [255, 220, 0], [170, 170, 170],
                    [240, 18, 190], [255, 133, 27], [127, 219, 255], [135, 12, 37]], dtype=np.uint8)
CELL, GAP, BACKGROUND = 10, 8, 255


def grid_image(grid: Grid) -> np.ndarray:
    """[h, w] colours -> [h * CELL, w * CELL, 3] uint8 with 1-pixel grid lines."""
    img = np.repeat(np.repeat(ARC_RGB[np.clip(grid, 0, 9)], CELL, 0), CELL, 1)
    img[::CELL, :] = img[:, ::CELL] = 60
    return img


def row_image(grids: list[Grid]) -> np.ndarray:
    images = [grid_image(g) for g in grids]
    height = max(i.shape[0] for i in images)
    width = sum(i.shape[1] for i in images) + GAP * (len(images) - 1)
    row = np.full((height, width, 3), BACKGROUND, dtype=np.uint8)
    x = 0
    for img in images:
        row[:img.shape[0], x:x + img.shape[1]] = img
        x += img.shape[1] + GAP
    return row


def task_image(demos: tuple[ArcPair, ...], query: Grid, target: Grid, attempts: tuple[Grid, Grid]) -> np.ndarray:
    """One row per demo (input, output), then test input, target, attempt 1, attempt 2.
    -> [H, W, 3] uint8 (HWC)."""
    rows = [row_image([d.input, d.output]) for d in demos] + [row_image([query, target, *attempts])]
    width = max(r.shape[1] for r in rows)
    out = np.full((sum(r.shape[0] for r in rows) + GAP * (len(rows) - 1), width, 3), BACKGROUND, dtype=np.uint8)
    y = 0
    for r in rows:
        out[y:y + r.shape[0], :r.shape[1]] = r
        y += r.shape[0] + GAP
    return out

"""ARC grids as a labelled RGB image for TensorBoard: demos, test input, target and both attempts,
each under a caption saying which grid it is, the attempts framed green (right) or red (wrong)."""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from data.arc import ArcPair, Grid

# The ARC colours, 0-9: black, blue, red, green, yellow, grey, magenta, orange, azure, maroon.
ARC_RGB = np.array([[0, 0, 0], [0, 116, 217], [255, 65, 54], [46, 204, 64], [255, 220, 0], [170, 170, 170],
                    [240, 18, 190], [255, 133, 27], [127, 219, 255], [135, 12, 37]], dtype=np.uint8)
CELL, GAP, BACKGROUND = 10, 8, 255
CAPTION = 14  # pixels above each grid for its caption
FRAME = 3  # pixels of an attempt's frame
RIGHT, WRONG = (46, 125, 50), (198, 40, 40)


def grid_image(grid: Grid) -> np.ndarray:
    """[h, w] colours -> [h * CELL, w * CELL, 3] uint8 with 1-pixel grid lines."""
    img = np.repeat(np.repeat(ARC_RGB[np.clip(grid, 0, 9)], CELL, 0), CELL, 1)
    img[::CELL, :] = img[:, ::CELL] = 60
    return img


def tile(grid: Grid, caption: str, frame: tuple[int, int, int] | None = None) -> np.ndarray:
    """A grid under its caption, framed in `frame`'s colour when given -> [H, W, 3] uint8."""
    img = grid_image(grid)
    if frame is not None:
        framed = np.empty((img.shape[0] + 2 * FRAME, img.shape[1] + 2 * FRAME, 3), dtype=np.uint8)
        framed[:] = frame
        framed[FRAME:-FRAME, FRAME:-FRAME] = img
        img = framed
    font = ImageFont.load_default()
    width = max(img.shape[1], int(np.ceil(font.getlength(caption))) + 2)
    out = Image.new("RGB", (width, img.shape[0] + CAPTION), (BACKGROUND,) * 3)
    ImageDraw.Draw(out).text((0, 1), caption, fill=frame or (40, 40, 40), font=font)
    out.paste(Image.fromarray(img), (0, CAPTION))
    return np.asarray(out)


def _stack(images: list[np.ndarray], axis: int) -> np.ndarray:
    """Images side by side (axis 1) or one under another (axis 0), GAP apart, on the background."""
    across = 1 - axis
    length = sum(i.shape[axis] for i in images) + GAP * (len(images) - 1)
    size = [0, 0]
    size[axis], size[across] = length, max(i.shape[across] for i in images)
    out = np.full((*size, 3), BACKGROUND, dtype=np.uint8)
    at = 0
    for img in images:
        if axis:
            out[:img.shape[0], at:at + img.shape[1]] = img
        else:
            out[at:at + img.shape[0], :img.shape[1]] = img
        at += img.shape[axis] + GAP
    return out


def task_image(demos: tuple[ArcPair, ...], query: Grid, target: Grid | None, attempts: tuple[Grid, Grid]) -> np.ndarray:
    """One row per demo (input, output), then test input, target, attempt 1, attempt 2, each
    captioned; an attempt says and shows (its frame) whether it is right (target None: the output is
    not known, no target and no verdict). -> [H, W, 3] uint8 (HWC)."""
    rows = [_stack([tile(d.input, f"demo {k} input"), tile(d.output, f"demo {k} output")], 1)
            for k, d in enumerate(demos, 1)]
    last = [tile(query, "test input")] + ([tile(target, "target")] if target is not None else [])
    for k, attempt in enumerate(attempts, 1):
        if target is None:
            last.append(tile(attempt, f"attempt {k}"))
            continue
        right = attempt.shape == target.shape and bool((attempt == target).all())
        last.append(tile(attempt, f"attempt {k}: {'right' if right else 'wrong'}", RIGHT if right else WRONG))
    return _stack(rows + [_stack(last, 1)], 0)

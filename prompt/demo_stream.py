"""The demo stream: a prompt stream that reads each context demo as grids and learns end to end
(docs/model.md, "The demo stream": which demos, never the query pair).

    demo d of sample b: input canvas [S, S], output canvas [S, S] (the same cells: a demo's grids
    are placed alike, data/canvas.py)
      -> each cell: embed_in(input class) + embed_out(output class) + its position   [S, S, C]
      -> `layers` residual blocks (GroupNorm, GELU, 3 x 3 convolution, dilations 1, 2, 4, ...)
      -> mean and max over the cells either grid covers (not padding)                 [2C]
      -> mean over sample b's demos -> Linear                                          [P]
"""

from __future__ import annotations

import torch
from torch import nn

from agents.cells import CellPosition
from data.canvas import NUM_CLASSES, PAD


class DemoStream(nn.Module):
    def __init__(self, *, channels: int, prompt_dim: int, layers: int = 3, side: int = 30, demos: int | None = None):
        """`channels` C of the cells, `layers` residual blocks, `side`: the largest canvas side,
        `demos`: the demos of a sample it reads at most (`--demo_stream_demos`; the batch may carry
        more, for an agent that reads more in context; None: all)."""
        super().__init__()
        self.demos = demos
        if channels % 8:
            raise ValueError(f"demo stream channels {channels}: a multiple of 8 (its GroupNorm's groups)")
        self.embed_in = nn.Embedding(NUM_CLASSES, channels)
        self.embed_out = nn.Embedding(NUM_CLASSES, channels)
        self.position = CellPosition(channels, side)
        self.blocks = nn.ModuleList(nn.Sequential(nn.GroupNorm(8, channels), nn.GELU(),
                                                  nn.Conv2d(channels, channels, 3, padding=2 ** i, dilation=2 ** i))
                                    for i in range(layers))
        self.out = nn.Linear(2 * channels, prompt_dim)

    def forward(self, context_input: torch.Tensor, context_target: torch.Tensor,
                present: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """context_input, context_target [B, D, S, S] int64, present [B, D] bool (each sample's
        context demos in slots, data.episodes.collate; it reads the first `demos`). -> (features
        [B, P] float32 or the autocast dtype, present [B] bool: the sample has at least one demo)."""
        if self.demos is not None:
            context_input, context_target, present = (t[:, :self.demos] for t in (context_input, context_target,
                                                                                 present))
        b, d = present.shape
        x, y = context_input.flatten(0, 1), context_target.flatten(0, 1)  # [B*D, S, S]
        covered = (x != PAD) | (y != PAD)
        h = self.embed_in(x) + self.embed_out(y) + self.position(x, *_extent(covered))  # [B*D, S, S, C]
        h = h.permute(0, 3, 1, 2)  # [B*D, C, S, S]
        for block in self.blocks:
            h = h + block(h)
        mask = covered.unsqueeze(1).to(h.dtype)  # [B*D, 1, S, S]
        mean = (h * mask).sum((2, 3)) / mask.sum((2, 3)).clamp_min(1.0)
        top = h.masked_fill(mask == 0, torch.finfo(h.dtype).min).amax((2, 3))
        top = top.masked_fill(~covered.flatten(1).any(1, keepdim=True), 0.0)  # an empty slot's: not finfo.min
        per_demo = self.out(torch.cat([mean, top], dim=-1)).unflatten(0, (b, d))  # [B, D, P]
        read = present.to(per_demo.dtype)[..., None]  # an empty slot adds nothing
        count = read.sum(1)  # [B, 1]
        return (per_demo * read).sum(1) / count.clamp_min(1.0), count[:, 0] > 0


def _extent(covered: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each demo's covered height and width [N] int64 (rows and columns up to the last covered cell),
    what CellPosition measures the far edges from."""
    rows = covered.any(2)  # [N, S]
    cols = covered.any(1)
    index = torch.arange(1, covered.shape[1] + 1, device=covered.device)
    return (rows * index).amax(1), (cols * index).amax(1)

"""`--ttt_dropout`: test-time training drops a share of each residual block's change.

The agents run in eval mode during adaptation and have no dropout of their own, so a forward hook
on each of the agent's residual blocks returns x + mask * (its change). The masks come from a
stream of the adaptation's own (`DropoutMasks`, seeded by the tasks it adapts), never from torch's
global one: a task then adapts the same way whatever ran before it (a validation continued from its
journal included), and tasks adapted together (evaluation/task_batch.py) draw each task's masks
from the stream it would have alone, in the same order, outside vmap, which has no per-task stream.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import torch
from torch import nn

from model import ArcModel

MaskOf = Callable[[torch.Size], torch.Tensor]  # a change's shape -> its mask (0 or 1 / (1 - p) each)


class DropoutMasks:
    """The masks of one adaptation's steps: `draw(shape)` -> [*shape] float32 on `device`, each element
    0 with probability p and 1 / (1 - p) otherwise, from a generator seeded by `seed` (the adapted
    tasks' seed: data.demo_episodes.DemoEpisodes.seed)."""

    def __init__(self, p: float, seed: list[int], device: torch.device):
        if not 0 < p < 1:
            raise ValueError(f"dropout share {p}: in (0, 1)")
        self.p = p
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(int(np.random.SeedSequence(seed).generate_state(1)[0]))

    def draw(self, shape: torch.Size) -> torch.Tensor:
        kept = torch.empty(shape, device=self.generator.device).bernoulli_(1 - self.p, generator=self.generator)
        return kept / (1 - self.p)


@contextmanager
def dropped_changes(model: ArcModel, mask_of: MaskOf | None) -> Iterator[None]:
    """Inside, each call of one of the agent's residual blocks returns x + its change * mask_of(the
    change's shape) (the mask cast to the change's dtype); None: no dropout."""
    if mask_of is None:
        yield
        return

    def drop(_module: nn.Module, inputs: tuple, output: torch.Tensor) -> torch.Tensor:
        change = output - inputs[0]
        return inputs[0] + change * mask_of(change.shape).to(change.dtype)

    hooks = [block.register_forward_hook(drop) for block in model.agent.residual_blocks()]
    try:
        yield
    finally:
        for hook in hooks:
            hook.remove()


def change_shapes(model: ArcModel, forward: Callable[[], object]) -> list[torch.Size]:
    """The shape of every residual block's change, in call order, over one `forward()` (no gradient):
    what a step's masks must cover (a looped agent calls its blocks once a pass)."""
    shapes: list[torch.Size] = []

    def record(shape: torch.Size) -> torch.Tensor:
        shapes.append(shape)
        return torch.ones(())

    with torch.no_grad(), dropped_changes(model, record):
        forward()
    return shapes

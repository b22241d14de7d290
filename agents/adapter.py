"""Per-task adapters: a small state per task that batches over tasks, each sample reading its own
task's slice (evaluation/adaptation.py sets and trains them on a task's demos; the shared weights
never change).

    latent      [T, P]              added to the refined prompt (trained by --ttt_view_rows)
    gate_bias   [T, V]              added to the view gate's logits: a view start forces its view
                                    (a flip, when training showed only rotations)

`T` counts slots: a task may have several (the starts of the search), or one per view it is seen
under (`per_view`: VARC's auxiliary tasks, each augmentation of a task a task of its own with its own
row). Everything starts at zero, so an untrained adapter changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from agents.views import views_in_frame
from engine.loop import host_to_device


@dataclass
class AdapterSlice:
    """The adapter rows of each sample of a batch (B samples)."""

    latent: torch.Tensor  # [B, P]
    gate_bias: torch.Tensor  # [B, V]

    def repeat(self, k: int) -> AdapterSlice:
        """The slice of a batch repeated k times along the batch (K refinements in one call)."""
        return AdapterSlice(*(t.repeat(k, *([1] * (t.dim() - 1))) for t in vars(self).values()))

    def in_frames(self, dihedral: torch.Tensor) -> AdapterSlice:
        """The rows as each sample's augmented frame must read them: an adapter is trained and kept in
        its task's own frame, and a sample seen under dihedral transform d needs the view gate's biases
        moved to the views doing the same there (agents/views.VIEWS_IN_FRAME: a transpose start is an
        anti-transpose under a quarter turn). Without this a view start fits only the frames whose
        transform commutes with it, and votes over views split between two answers.
        dihedral [B] int64 in 0..7."""
        gate_bias = self.gate_bias
        if gate_bias.shape[1]:  # agents without views have no gate
            views = views_in_frame(dihedral.device)[dihedral]  # [B, V]
            gate_bias = torch.zeros_like(gate_bias).scatter(1, views, gate_bias)
        return AdapterSlice(self.latent, gate_bias)


class TaskAdapters(nn.Module):
    """`slots` adapters; `forward(slot [B] int64)` gathers the rows of each sample (gradients reach
    exactly the rows a batch used)."""

    def __init__(self, *, slots: int, prompt_dim: int, views: int):
        super().__init__()
        self.view_ids: tuple[int, ...] = ()  # augmentation ids with a row of their own per slot (per_view)
        self.latent = nn.Parameter(torch.zeros(slots, prompt_dim))
        self.gate_bias = nn.Parameter(torch.zeros(slots, views))

    def per_view(self, view_ids: list[int]) -> TaskAdapters:
        """A copy with a row per view of every slot: slot t's row for the k-th of `view_ids` (augmentation
        ids) is row t * len(view_ids) + k, each starting as slot t's row here. `forward` then reads a
        sample's row by its slot and its augmentation."""
        k = len(view_ids)
        out = TaskAdapters(slots=1, prompt_dim=self.latent.shape[1], views=self.gate_bias.shape[1])
        for name, value in self.named_parameters():
            setattr(out, name, nn.Parameter(value.detach().repeat_interleave(k, 0)))
        out.view_ids = tuple(view_ids)
        return out.to(self.latent.device)

    @classmethod
    def concat(cls, adapters: list[TaskAdapters]) -> TaskAdapters:
        """One adapter holding the slots of `adapters` in their order (with rows per view, the same
        views in each)."""
        first = adapters[0]
        if any(a.view_ids != first.view_ids for a in adapters):
            raise ValueError("concat: adapters with rows for different views")
        out = cls(slots=1, prompt_dim=first.latent.shape[1], views=first.gate_bias.shape[1])
        for name, _ in first.named_parameters():
            setattr(out, name, nn.Parameter(torch.cat([getattr(a, name).detach() for a in adapters])))
        out.view_ids = first.view_ids
        return out.to(first.latent.device)

    def forward(self, slot: torch.Tensor, aug_ids: list[int] | None = None) -> AdapterSlice:
        """The rows of samples of these slots (slot [B] int64); with rows per view, each sample's row of
        its augmentation (`rows`)."""
        return self.at(self.rows(slot, aug_ids))

    def at(self, row: torch.Tensor) -> AdapterSlice:
        """The adapter's rows `row` [B] int64 (`rows` names each sample's), one a sample."""
        return AdapterSlice(self.latent[row], self.gate_bias[row])

    def rows(self, slot: torch.Tensor, aug_ids: list[int] | None = None) -> torch.Tensor:
        """The row each sample reads -> [B] int64: its slot (slot [B] int64), or with rows per view its
        slot's row of its augmentation (`aug_ids`, B augmentation ids; a view without a row of its own
        reads the first view's, the identity's)."""
        if not self.view_ids:
            return slot
        if aug_ids is None:
            raise ValueError("an adapter with a row per view needs each sample's augmentation id")
        index = {a: k for k, a in enumerate(self.view_ids)}
        view = host_to_device(torch.tensor([index.get(a, 0) for a in aug_ids], dtype=slot.dtype), slot.device)
        return slot * len(self.view_ids) + view

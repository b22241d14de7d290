"""The held-out loss: how well the weights predict the outputs of pairs training never saw.

Its definition, and when and on what it is measured: docs/runs.md, "The held-out loss" (tests/test_heldout.py
works one example by hand). A canvas is cut on the side training would use (data.episodes.episode_extent with
the target). It reads test outputs as the scorer does, for its loss alone (never as an input), and changes
nothing: no weight, no random stream (the model's RL noise is not drawn: the mean refinement).
"""

from __future__ import annotations

import math
import signal
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader
from tqdm import tqdm

from data.augment import view_ids
from data.canvas import PAD
from data.episodes import EpisodeDataset, collate, pad_rows
from engine.config import Config
from engine.distributed import Dist
from engine.loop import Interrupted, to_device
from engine.precision import autocast
from evaluation.adaptation import AdaptedTasks
from evaluation.intervals import interval
from evaluation.scoring import Candidates
from model import ArcModel
from prompt import EncodeStopped, QwenFeatures

PairLoss = tuple[str, float, float]  # (task id, nats a cell, bits a grid) of one test pair


def target_fitted(dataset: EpisodeDataset) -> EpisodeDataset:
    """The same episodes and views on the canvas side training would use (fitted to each target as
    well), so every output lies on the canvas its loss is read from."""
    return EpisodeDataset(dataset.episodes, dataset.scale, scores=dataset.scores, canvas=dataset.canvas,
                          fit_target=True, task_rows=dataset.task_rows)


def grid_cells(shape: tuple[int, int]) -> int:
    """Cells of an h x w grid's canvas that the loss reads: h*w colours, h + w + 1 markers."""
    h, w = shape
    return h * w + h + w + 1


@torch.no_grad()
def pair_losses(model: ArcModel, prompts: QwenFeatures | None, fitted: EpisodeDataset, episodes: list[int], *,
                views: int, cfg: Config, device: torch.device, adapted: AdaptedTasks | None = None,
                stop: Callable[[], bool] | None = None, desc: str | None = None) -> dict[int, PairLoss]:
    """The held-out loss of each of `episodes` (indices into `fitted`, a `target_fitted` set), mean
    over its first `views` views, with `adapted`'s per-task adapters when given.
    -> {episode index: (task id, nats a cell, bits a grid)}; `stop` (read between batches and
    between Qwen's forwards): the pairs done when it turned true, the others left out. `desc`: a
    progress bar of the test pairs, with its expected time."""
    items = [(e, a) for e in episodes for a in view_ids(views)]
    loader = DataLoader(fitted, batch_size=cfg.eval.eval_batch_size, sampler=items, collate_fn=collate)
    nats_cell: dict[int, list[float]] = {e: [] for e in episodes}
    bar = tqdm(total=len(items), desc=desc, unit="pair", dynamic_ncols=True, mininterval=1.0, disable=desc is None)
    with autocast(cfg.optim.amp, device.type), model.qwen_stops_on(stop), bar:
        for batch in loader:
            if stop is not None and stop():
                break
            rows = batch["episode"]
            if cfg.agent.compile:  # one batch size for the compiled agent: the last batch is padded
                batch = pad_rows(batch, cfg.eval.eval_batch_size)
            try:
                batch = model.encode_prompts(to_device(batch, device), prompts, 0, training=False)
            except EncodeStopped:  # the batch's demos half encoded: left out like the batches after it
                break
            target = batch.pop("target")  # [B, S, S] int64: read by this loss only, never given to the model
            adapter = adapted.rows_of(batch, device) if adapted is not None else None
            logits = model(batch, "mean", adapter).of("mean")[0]
            logp = F.log_softmax(logits.float(), -1).gather(-1, target.unsqueeze(-1)).squeeze(-1)  # [B, S, S]
            cells = target != PAD
            per_cell = (-(logp * cells).sum((1, 2)) / cells.sum((1, 2)))[:len(rows)].cpu().tolist()
            for e, value in zip(rows, per_cell, strict=True):
                nats_cell[e].append(value)
            bar.update(len(per_cell))
    out = {}
    for e, values in nats_cell.items():
        if len(values) < views:  # stopped before all its views
            continue
        ep = fitted.episodes[e]
        mean = float(np.mean(values))
        out[e] = (ep.task.task_id, mean, mean * grid_cells(ep.query.output.shape) / math.log(2))
    return out


def adapted_losses(model: ArcModel, prompts: QwenFeatures | None, dataset: EpisodeDataset, fitted: EpisodeDataset,
                   cands: dict[int, Candidates], episodes: list[int], *, cfg: Config, device: torch.device,
                   adapted: AdaptedTasks | None) -> dict[int, PairLoss]:
    """The held-out loss after adaptation of `episodes` (indices into `dataset`, the evaluation set, and
    `fitted`, its `target_fitted` twin) over the voted views, inside the tasks' adaptation. A pair whose
    output lies within its predicted extent has the same canvases in both sets, so the views' own
    log-probabilities (`cands`, kept for ranking) give its loss at no cost; the others take one
    forward a view on the fitted canvases."""
    out, rest = {}, []
    for i in episodes:
        if not dataset.episodes[i].query.answered:  # a task to predict: no output to measure
            continue
        if fitted.extents[i] != dataset.extents[i]:
            rest.append(i)
            continue
        target = dataset.episodes[i].query.output  # read by this loss, as by the scorer
        logprob, cells = cands[i].logprobs([target])  # [1, V] each: one gather over the views
        mean = float(np.mean(-logprob[0] / cells[0]))
        out[i] = (dataset.episodes[i].task.task_id, mean, mean * grid_cells(target.shape) / math.log(2))
    if rest:
        out.update(pair_losses(model, prompts, fitted, rest, views=cfg.eval.eval_augments, cfg=cfg, device=device,
                               adapted=adapted))
    return out


def by_pair(values: dict[int, tuple], dataset: EpisodeDataset, column: int = 1) -> dict[tuple[str, str], float]:
    """{episode index: (task id, value, ...)} -> {(task id, "test[j]"): the `column`-th value}: what
    evaluation.intervals pairs two runs' values by."""
    return {(rec[0], dataset.episodes[i].where): rec[column] for i, rec in values.items()}


def loss_metrics(losses: dict[int, PairLoss], prefix: str) -> dict[str, float]:
    """`<prefix>_nats_cell`, `<prefix>_bits_grid` (means over test pairs), each with `_lo`, `_hi` (95%
    over tasks), and `<prefix>_pairs`."""
    if not losses:
        return {}
    out = {f"{prefix}_pairs": float(len(losses))}
    for i, name in ((1, "nats_cell"), (2, "bits_grid")):
        values = [(rec[0], rec[i]) for rec in losses.values()]
        lo, hi = interval(values)
        out.update({f"{prefix}_{name}": float(np.mean([v for _, v in values])), f"{prefix}_{name}_lo": lo,
                    f"{prefix}_{name}_hi": hi})
    return out


def heldout_losses(model: ArcModel, prompts: QwenFeatures | None, sets: dict[str, EpisodeDataset | None], *,
                   cfg: Config, device: torch.device, dist: Dist = Dist(), stop: Callable[[], bool] | None = None,
                   tasks: dict[str, set[str]] | None = None,
                   progress: bool = False) -> tuple[dict[str, float], dict[str, dict[int, PairLoss]]]:
    """The held-out loss before adaptation (identity view) of every test pair of each named set (None:
    left out; `tasks[name]`: of those tasks only), this process's share computed and all gathered.
    -> (`heldout/<name>_*` metrics, {name: pair losses}). `stop` (this process was asked to stop) is
    read between batches, and agreed by every process after each set: then `Interrupted` is raised
    (a validation stops within seconds). `progress`: a bar a set on the main process."""
    was_training = model.training
    model.train(False)
    metrics: dict[str, float] = {}
    pairs: dict[str, dict[int, PairLoss]] = {}
    try:
        for name, dataset in sets.items():
            if dataset is None:
                continue
            # the test inputs with a known output (a task to predict has none to measure)
            answered = [i for i, ep in enumerate(dataset.episodes) if ep.query.answered
                        and (tasks is None or name not in tasks or ep.task.task_id in tasks[name])]
            mine = answered[dist.rank::dist.world_size]
            desc = f"held-out loss, {name}" if progress and dist.is_main else None
            losses = pair_losses(model, prompts, target_fitted(dataset), mine, views=1, cfg=cfg, device=device,
                                 stop=stop, desc=desc)
            pairs[name] = {k: v for part in dist.gather(losses) for k, v in part.items()}
            metrics.update(loss_metrics(pairs[name], f"heldout/{name}"))
            if dist.any(stop is not None and stop()):  # the pairs measured so far travel with the stop
                raise Interrupted(getattr(stop, "signum", 0) or signal.SIGTERM, metrics)
    finally:
        model.train(was_training)
    return metrics, pairs


def pair_records(pairs: dict[str, dict[int, PairLoss]], datasets: dict[str, EpisodeDataset | None]) -> dict:
    """What report.json keeps of `heldout_losses`' pairs (evaluation/compare.py pairs two runs on them):
    {name: [[task id, "test[j]", nats a cell, bits a grid], ...]} in each set's order."""
    return {name: [[task, datasets[name].episodes[i].where, round(nats, 5), round(bits, 4)]
                   for i, (task, nats, bits) in sorted(losses.items())]
            for name, losses in pairs.items()}

"""Validation as ARC Prize scores it: per-task adaptation, views, two attempts, the metrics (docs/runs.md,
"Validation, test-time training, submission"). A task's test outputs are read to score its attempts and to
measure its held-out loss, never by the model or its adaptation; the scoring gives a TaskScores.
"""

from __future__ import annotations

import signal
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import reduce
from itertools import groupby

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from agents import compile_seconds
from data.arc import Grid
from data.demo_episodes import pool_side
from data.episodes import EpisodeDataset, pad_rows
from data.view_batch import ViewSet, view_batch
from engine.config import Config
from engine.distributed import Dist
from engine.loop import Interrupted, to_device
from engine.precision import autocast
from evaluation.adaptation import AdaptedTasks, adapted
from evaluation.deadline import Deadline, Work
from evaluation.heldout import adapted_losses, target_fitted
from evaluation.journal import Journal, record, restore
from evaluation.scores import TaskScores
from evaluation.scoring import Candidates, pair_metrics
from evaluation.submission import SubmissionFile, submission_of
from evaluation.task_batch import batches_shared_weights
from evaluation.ttt_policy import by_size, size_class
from evaluation.view_votes import ViewLogp, decode_views, task_frame
from model import ArcModel
from prompt import QwenFeatures


@torch.no_grad()
def candidates(model: ArcModel, prompts: QwenFeatures | None, dataset: EpisodeDataset, episodes: list[int], *,
               cfg: Config, device: torch.device, adapted: AdaptedTasks | None = None,
               timing: dict[str, float] | None = None) -> dict[int, Candidates]:
    """Predictions for `episodes` under every view, each mapped back to the original frame (with the
    per-task adapter of `adapted`, when there is one): `--eval_augments` views a test input, in
    batches of `--eval_batch_size` built, decoded, inverted and voted as tensors on `device`
    (data/view_batch.py, evaluation/view_votes.py). `timing`: seconds of each part are added to it
    (build, model, decode, vote; the device waited for after each: bench.view_scoring)."""
    tick = _Ticker(timing, device)
    views = cfg.eval.eval_augments
    sets = {e: dataset.view_set(e, views) for e in episodes}
    parts: dict[int, list[tuple]] = defaultdict(list)  # episode -> its views' (ViewLogp, grids, shapes, mean)
    flat = len(episodes) * views
    with autocast(cfg.optim.amp, device.type):
        for lo in range(0, flat, cfg.eval.eval_batch_size):
            hi = min(lo + cfg.eval.eval_batch_size, flat)
            segments = [(episodes[n], sets[episodes[n]].part(max(lo - n * views, 0), min(hi - n * views, views)))
                        for n in range(lo // views, (hi - 1) // views + 1)]
            batch = view_batch(dataset, segments, texts=prompts is not None)
            size = hi - lo
            if cfg.agent.compile:  # one batch size for the compiled agent: a last, short batch is padded
                batch = pad_rows(batch, cfg.eval.eval_batch_size)
            batch = to_device(batch, device)
            tick("build")
            batch = model.encode_prompts(batch, prompts, 0, training=False)
            adapter = adapted.rows_of(batch, device) if adapted is not None else None
            logits = model(batch, cfg.eval.eval_refinement, adapter).of(cfg.eval.eval_refinement)[0][:size].float()
            logp = F.log_softmax(logits, -1)  # [B, S, S, 12], kept on the device: decoded and voted there
            tick("model")
            batch_views = ViewSet.cat([v for _, v in segments])
            grids, shapes, mean = decode_views(logp)
            grids, shapes = task_frame(grids, shapes, batch_views)
            tick("decode")
            start = 0
            for e, part in segments:
                mine = slice(start, start + len(part))
                side = torch.full((len(part),), logp.shape[1], dtype=torch.int64)
                parts[e].append((ViewLogp(logp[mine], part, side), grids[mine], shapes[mine], mean[mine]))
                start += len(part)
    out = {e: Candidates.from_views(ViewLogp.cat([p[0] for p in parts[e]]),
                                    *(torch.cat([p[k] for p in parts[e]]) for k in (1, 2, 3))) for e in episodes}
    tick("vote")
    return out


class _Ticker:
    """Adds the seconds since its last call to `timing[part]`, once `device` has done what was queued
    (nothing, and no wait, without a `timing`)."""

    def __init__(self, timing: dict[str, float] | None, device: torch.device):
        self.timing, self.device = timing, device
        self.last = self.now() if timing is not None else 0.0

    def now(self) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def __call__(self, part: str) -> None:
        if self.timing is not None:
            now = self.now()
            self.timing[part] = self.timing.get(part, 0.0) + now - self.last
            self.last = now


@dataclass
class EvalResult:
    metrics: dict[str, float]  # eval/* incl. eval/copy_* and eval/seconds_per_task
    submission: dict[str, list[dict]]  # ARC Prize's: every task, every test input (evaluation/submission.py)
    images: list[tuple[str, np.ndarray]]  # (task_id, [H, W, 3] uint8) for the first IMAGES tasks

    @classmethod
    def of(cls, scores: TaskScores, dataset: EpisodeDataset, cfg: Config) -> EvalResult:
        return cls(scores.metrics("eval", cfg), submission_of(dataset, scores.attempts), scores.images(dataset))


def first_tasks(dataset: EpisodeDataset, n: int) -> list[str]:
    """The ids of the first `n` tasks of the evaluation set, in its order (n <= 0: all)."""
    ids = list(dict.fromkeys(ep.task.task_id for ep in dataset.episodes))
    return ids[:n] if n > 0 else ids


def task_groups(task_ids: list[str], side_of: Callable[[str], int], size: int, one_side: bool) -> list[list[str]]:
    """Tasks adapted together: `size` at a time, alike in canvas side (`side_of`; a batch is cut to
    its largest); with `one_side`, a group never mixes sides (evaluation/task_batch.py needs one)."""
    ordered = sorted(task_ids, key=lambda t: (side_of(t), t))
    runs = [list(run) for _, run in groupby(ordered, key=side_of)] if one_side else [ordered]
    return [run[i:i + size] for run in runs for i in range(0, len(run), size)]


def describe(cfg: Config) -> str:
    """How each task is adapted and predicted, in a few words (the line before a validation's bar)."""
    e = cfg.eval
    parts = []
    if e.view_starts:
        parts.append("search over starts (input views)")
    if e.ttt_steps:
        extras = [f"{e.ttt_views} views",
                  *[f"{e.ttt_warmup:g} warm-up"] * bool(e.ttt_warmup),
                  *[f"{e.ttt_schedule} lr"] * (e.ttt_schedule != "constant"),
                  *[f"dropout {e.ttt_dropout:g}"] * bool(e.ttt_dropout), *["a row per view"] * e.ttt_view_rows]
        small = f"; a small task's {e.ttt_small_steps}" if e.ttt_small_steps else ""
        parts.append(f"{e.ttt_steps} test-time-training steps{small} ({', '.join(extras)})")
    return f"{' + '.join(parts) or 'no adaptation'}, {e.eval_augments} views voted"


def episodes_by_task(dataset: EpisodeDataset) -> dict[str, list[int]]:
    """Each task's episode indices in `dataset` (a test input each)."""
    by_task: dict[str, list[int]] = defaultdict(list)
    for i, ep in enumerate(dataset.episodes):
        by_task[ep.task.task_id].append(i)
    return by_task


def process_groups(dataset: EpisodeDataset, by_task: dict[str, list[int]], task_ids: list[str], cfg: Config,
                   processes: int) -> list[list[list[str]]]:
    """The groups of tasks each process adapts and scores together, process by process: its share of
    `task_ids` (every `processes`-th), in groups of `--adapt_tasks` (one where tasks share weights
    and are not batched together), one size class a group (evaluation/ttt_policy.by_size) and one
    canvas side when batched together."""
    together = batches_shared_weights(cfg)
    size = 1 if cfg.eval.ttt_steps and not together else cfg.eval.adapt_tasks
    if together:  # one canvas side a group: its demo batches' (data.demo_episodes.pool_side)
        sides = {t: pool_side(dataset.episodes[by_task[t][0]].task, dataset) for t in task_ids}
        side_of = sides.__getitem__
    else:
        def side_of(t: str) -> int:
            return max(dataset.sides[i] for i in by_task[t])
    kind = {t: size_class(cfg.eval, dataset.episodes[by_task[t][0]].task) for t in task_ids}  # small ones first
    return [[g for k in ("", "small", "large") for g in task_groups([t for t in task_ids[r::processes] if kind[t] == k],
                                                                    side_of, size, together)] for r in range(processes)]


def group_work(dataset: EpisodeDataset, by_task: dict[str, list[int]], group: list[str], cfg: Config) -> Work:
    """What the deadline plans of one group of tasks: its size class, tasks, test inputs and steps."""
    tasks = [dataset.episodes[by_task[t][0]].task for t in group]
    steps = by_size(cfg.eval, tasks).get("ttt_steps", cfg.eval.ttt_steps)
    return Work(size_class(cfg.eval, tasks[0]), len(group), sum(len(by_task[t]) for t in group), steps)


def work_of(dataset: EpisodeDataset, task_ids: list[str], cfg: Config, dist: Dist) -> list[Work]:
    """The groups of `task_ids` this process would score: what a validation that scores them in a
    later call passes to the first as `work_after`, so one deadline is shared by both."""
    by_task = episodes_by_task(dataset)
    groups = process_groups(dataset, by_task, task_ids, cfg, dist.world_size)[dist.rank]
    return [group_work(dataset, by_task, g, cfg) for g in groups]


def score_tasks(model: ArcModel, prompts: QwenFeatures | None, dataset: EpisodeDataset, task_ids: list[str], *,
                cfg: Config, device: torch.device, dist: Dist = Dist(), stop: Callable[[], bool] | None = None,
                desc: str | None = None, on_candidates: Callable[[int, Candidates], None] | None = None,
                journal: Journal | None = None, deadline: Deadline | None = None,
                submission: SubmissionFile | None = None, work_after: Sequence[Work] = ()) -> TaskScores:
    """Adapt to and predict every test input of `task_ids` (this process's share; the scores are gathered,
    so every process returns them all). `stop` (this process was asked to stop) is read inside adaptation
    and, agreed by every process, between task groups: then `Interrupted` is raised. `desc`: a progress bar
    (main process). `on_candidates(episode index, candidates)`: for every test input
    this process scores, after its attempts. `journal`: a group whose tasks it holds is read, not scored
    again; each task scored is appended. `deadline` (--eval_minutes): each group's steps and views fitted to
    its share of the time left, shared with `work_after`, the groups of this process that a later call
    scores under the same deadline (`work_of`). `submission`: rewritten after each group."""
    by_task = episodes_by_task(dataset)
    # every process knows every process's groups, so all make the same number of agreement calls
    groups_of = process_groups(dataset, by_task, task_ids, cfg, dist.world_size)
    mine = groups_of[dist.rank]
    work = [group_work(dataset, by_task, g, cfg) for g in mine] + list(work_after) if deadline is not None else []
    stop = stop or (lambda: False)
    scorer = _GroupScorer(model, prompts, dataset, by_task, cfg=cfg, device=device, stop=stop,
                          on_candidates=on_candidates)
    scores = TaskScores()
    progress = _Progress(len(task_ids), desc, dist, cfg.eval.ttt_steps > 0)
    was_training = model.training
    model.train(False)
    try:
        for slot in range(max(map(len, groups_of)) + 1):
            if progress.agree(stop):
                if journal is not None:  # the time since its last task counts against a deadline too
                    journal.note_time()
                raise Interrupted(getattr(stop, "signum", 0) or signal.SIGTERM)
            if slot >= len(mine):
                continue
            group = mine[slot]
            if journal is not None and all(t in journal.done for t in group):  # scored before a stop
                for t in group:
                    restore(journal.done[t], scores)
            else:
                done = scorer.score(group, deadline, work[slot:])
                if done is None:  # stopped during its adaptation: nothing of it is kept
                    continue
                scores = scores.merged(done)
                for t in group if journal is not None else ():
                    journal.append(record(t, by_task[t], scores))
                if submission is not None:
                    submission.update(scores.attempts)
            progress.add(scores, group, by_task)
    finally:
        progress.close()
        model.train(was_training)
    return reduce(TaskScores.merged, dist.gather(scores))


class _Progress:
    """The progress bar (main process) and the counts every process agrees on between groups."""

    def __init__(self, tasks: int, desc: str | None, dist: Dist, test_time_training: bool):
        self.dist, self.test_time_training = dist, test_time_training
        self.pending = [0.0] * 4  # since the last agreement: tasks, test inputs scored, of them solved, TTT steps
        self.totals = [0.0] * 4
        self.bar = tqdm(total=tasks, desc=desc, unit="task", dynamic_ncols=True, mininterval=1.0,
                        disable=desc is None or not dist.is_main)
        self.started = time.perf_counter()

    def add(self, scores: TaskScores, group: list[str], by_task: dict[str, list[int]]) -> None:
        scored, solved = scores.solved([i for t in group for i in by_task[t]])
        steps = sum(scores.ttt_steps[t] for t in group)
        self.pending = [a + b for a, b in zip(self.pending, (len(group), scored, solved, steps), strict=True)]

    def agree(self, stop: Callable[[], bool]) -> bool:
        """One collective: whether any process was asked to stop, and every process's counts for the bar."""
        stopping, *done = self.dist.sum_floats([float(stop()), *self.pending])
        self.totals = [a + b for a, b in zip(self.totals, done, strict=True)]
        self.pending = [0.0] * 4
        if done[0]:
            self.bar.update(int(done[0]))
            self.bar.set_postfix(_postfix(self.totals, time.perf_counter() - self.started, self.test_time_training),
                                 refresh=False)
        return bool(stopping)

    def close(self) -> None:
        self.bar.close()


class _GroupTiming:
    """A group's times on the deadline's clock for `Deadline.measured`: the search (until the first
    adaptation step), the steps, the views' predictions (less a compile during them: paid once, not a
    view's pace) and the rest. `marks`: as the first step starts and after each; `at`: the clock and
    compile seconds as adaptation ends and as the predictions end."""

    def __init__(self, clock: Callable[[], float]):
        self.clock, self.began, self.marks, self.at = clock, clock(), [], []

    def stepped(self, steps: int, adaptation: AdaptedTasks) -> None:
        self.marks.append(self.clock())

    def mark(self) -> None:
        self.at.append((self.clock(), compile_seconds()))

    def report(self, deadline: Deadline, views: int, tasks: int, kind: str) -> None:
        (adapted_at, compiled), (predicted_at, compiled_after) = self.at
        first, last = (self.marks[0], self.marks[-1]) if self.marks else (adapted_at, adapted_at)
        deadline.measured(search=first - self.began, steps=(last - first, max(len(self.marks) - 1, 0)),
                          views=(max(predicted_at - adapted_at - (compiled_after - compiled), 0.0), views),
                          rest=adapted_at - last + self.clock() - predicted_at, tasks=tasks, kind=kind)


class _GroupScorer:
    """One group of tasks: adapt (with the deadline's plan), predict, rank the attempts, score them."""

    def __init__(self, model: ArcModel, prompts: QwenFeatures | None, dataset: EpisodeDataset,
                 by_task: dict[str, list[int]], *, cfg: Config, device: torch.device, stop: Callable[[], bool],
                 on_candidates: Callable[[int, Candidates], None] | None):
        self.model, self.prompts, self.dataset, self.by_task = model, prompts, dataset, by_task
        self.cfg, self.device, self.stop, self.on_candidates = cfg, device, stop, on_candidates
        # the held-out loss's canvases hold the output
        self.fitted = target_fitted(dataset) if cfg.eval.heldout_loss else None

    def score(self, group: list[str], deadline: Deadline | None, work: list[Work]) -> TaskScores | None:
        """The group's scores; None when `stop` cut its adaptation short. `work`: this group's and those
        after it, for the deadline's plan."""
        cfg, dataset = self.cfg, self.dataset
        start = time.perf_counter()
        tasks = [dataset.episodes[self.by_task[t][0]].task for t in group]
        episodes = [i for t in group for i in self.by_task[t]]
        cfg, kind = cfg.replace(**by_size(cfg.eval, tasks)), size_class(cfg.eval, tasks[0])
        planned = cfg if deadline is None else cfg.replace(**deadline.plan(work, cfg.eval.eval_augments))
        timing = _GroupTiming(deadline.clock if deadline is not None else time.perf_counter)
        out = TaskScores()
        with adapted(self.model, self.prompts, tasks, dataset, cfg=planned, device=self.device, stop=self.stop,
                     observe=timing.stepped if deadline is not None else None,
                     enough=deadline.group_over if deadline is not None else lambda: False) as adaptation:
            if self.stop():
                return None
            timing.mark()
            cands = self.predict(group, adaptation, planned, out)
            timing.mark()
        for i in episodes:
            out.attempts[i] = cands[i].attempts()
        for t in group:  # a task's seconds: its adaptation, predictions and attempts
            out.seconds[t] = (time.perf_counter() - start) / len(group)
            out.ttt_steps[t] = adaptation.steps[t]
        for i in episodes:
            if self.on_candidates is not None:
                self.on_candidates(i, cands[i])
            self.pair_scores(i, out.attempts[i], cands[i], out)
        if deadline is not None:
            timing.report(deadline, planned.eval.eval_augments * len(episodes), len(group), kind)
        return out

    def predict(self, group: list[str], adaptation: AdaptedTasks, planned: Config,
                out: TaskScores) -> dict[int, Candidates]:
        """Every test input's candidates under the group's adaptation, and its held-out loss as adapted
        into `out.losses` -> {episode index: candidates}. Tasks adapted together: each predicted with
        its own copy of the weights loaded."""
        parts = [group] if adaptation.weights is None else [[t] for t in group]
        cands: dict[int, Candidates] = {}
        for part in parts:
            adaptation.load(part[0])
            mine = [i for t in part for i in self.by_task[t]]
            cands.update(candidates(self.model, self.prompts, self.dataset, mine, cfg=planned, device=self.device,
                                    adapted=adaptation))
            if self.cfg.eval.heldout_loss:
                out.losses.update(adapted_losses(self.model, self.prompts, self.dataset, self.fitted, cands, mine,
                                                 cfg=planned, device=self.device, adapted=adaptation))
        return cands

    def pair_scores(self, i: int, attempts: tuple[Grid, Grid], cands: Candidates, out: TaskScores) -> None:
        """Test input `i`'s metrics, and the copy baseline's, into `out`, read from
        the task's outputs (an evaluation batch carries none: docs/invariants.md #8). One without a
        known output is only counted."""
        ep = self.dataset.episodes[i]
        if not ep.query.answered:  # a task to predict: its attempts, nothing to score
            out.unanswered.add(i)
            return
        metrics = pair_metrics(attempts, ep.query.output, ep.query.input, cands.contains(ep.query.output))
        out.records[i] = (ep.task.task_id, metrics)
        out.copy_records[i] = (ep.task.task_id, pair_metrics((ep.query.input,) * 2, ep.query.output, ep.query.input))


def _postfix(totals: list[float], elapsed: float, test_time_training: bool) -> dict[str, str]:
    tasks, pairs, solved, steps = totals
    out = {"pass@2": f"{solved / max(pairs, 1):.1%}", "s/task": f"{elapsed / max(tasks, 1):.2f}"}
    if test_time_training:
        out["ttt_steps"] = f"{steps / max(tasks, 1):.1f}"
    return out


def evaluate(model: ArcModel, prompts: QwenFeatures | None, dataset: EpisodeDataset, *, cfg: Config,
             device: torch.device, dist: Dist = Dist(), tasks: list[str] | None = None,
             stop: Callable[[], bool] | None = None, desc: str | None = None) -> EvalResult:
    """Score `tasks` (default: the first `--eval_tasks`, all when it is 0 or -1) as ARC Prize scores
    them. `stop`, `desc`: as `score_tasks`."""
    task_ids = tasks if tasks is not None else first_tasks(dataset, cfg.eval.eval_tasks)
    scores = score_tasks(model, prompts, dataset, task_ids, cfg=cfg, device=device, dist=dist, stop=stop, desc=desc)
    return EvalResult.of(scores, dataset, cfg)

"""Validation in a run: when it runs (`ValidationSchedule`), what it scores and logs (`validate`),
where its results go (scalars, task images, report.html, the submission), and `--eval_only`.
When and on which tasks (--val_every, --val_share, --eval_tasks): docs/runs.md#validation-test-time-training-submission.

Times are the main process's clock, agreed by every process (`Dist.from_main`), so every process
takes the same branch. Nothing here moves the training: validation never touches its random streams.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from data.episodes import EpisodeDataset
from engine.config import Config, EvalCfg
from engine.distributed import Dist
from engine.files import write_atomic
from engine.loop import Interrupted, StopRequest, TrainingStopped, duration, preserved_rng
from engine.run_logger import RunLogger
from evaluation.adaptation import searches
from evaluation.deadline import Deadline, Work
from evaluation.evaluate import EvalResult, describe, first_tasks, score_tasks, work_of
from evaluation.heldout import heldout_losses, pair_records
from evaluation.journal import Journal, open_journal
from evaluation.report import header as report_header
from evaluation.report import write_report
from evaluation.scores import TaskScores
from evaluation.submission import SubmissionFile
from model import ArcModel
from prompt import QwenFeatures
from training.build import TrainingData, evaluation_view, held_out_set, load_run, prompt_cache_dir
from training.run_folder import announce, finish_run, open_run
from training.run_state import TrainState


@dataclass
class ValidationSchedule:
    unit: str  # epoch | steps | minutes | end (--val_every)
    amount: float  # steps or minutes between validations
    share: float  # --val_share
    val_seconds: float = 0.0  # spent validating in this invocation (the final validation included)
    done: int = 0  # validations during training, this invocation
    skipped: int = 0  # validations due but skipped for --val_share
    last_at: float = 0.0  # training seconds at the last validation (or skip) due by minutes

    @classmethod
    def of(cls, cfg: EvalCfg) -> ValidationSchedule:
        unit, amount = cfg.validation_interval()
        return cls(unit, amount, cfg.val_share)

    def due(self, *, step: int, epoch_end: bool, train_seconds: float) -> bool:
        """Whether a validation during training is due after optimizer step `step` (the end of the
        run is not asked: the final validation follows it). Counts a skip when --val_share forbids it."""
        if self.unit == "epoch":
            hit = epoch_end
        elif self.unit == "steps":
            hit = step % int(self.amount) == 0
        elif self.unit == "minutes":
            hit = train_seconds - self.last_at >= 60 * self.amount
        else:
            hit = False
        if not hit:
            return False
        self.last_at = train_seconds
        if self.done and self.val_seconds > self.share * train_seconds:
            self.skipped += 1
            return False
        return True

    def describe(self, val_tasks: int, eval_tasks: int, n_tasks: int, epochs: int) -> str:
        """The start-up line's account of validation; `epochs`: those this invocation trains (a resumed
        run's last one gets no validation of its own before the final one)."""
        subset = f"the first {val_tasks}" if 0 < val_tasks < n_tasks else f"all {n_tasks}"
        when = {"epoch": "after each epoch" if epochs > 1 else "", "steps": f"every {int(self.amount)} steps",
                "minutes": f"every {self.amount:g} minutes of training", "end": ""}[self.unit]
        during = (f"{subset} evaluation tasks {when} (skipped while validation has taken over {self.share:.0%} of "
                  f"the training time)" if when else "none during training")
        if eval_tasks == -1 and subset != f"all {n_tasks}":
            final = f"all {n_tasks} if they take no longer than the training did, else {subset}"
        else:
            final = f"the first {eval_tasks}" if 0 < eval_tasks < n_tasks else f"all {n_tasks}"
        return f"validation: {during}; at the end {final} (--val_every, --val_tasks, --eval_tasks)"

    def report(self, train_seconds: float) -> dict[str, float]:
        """What validation cost this invocation: summary.json keys."""
        total = train_seconds + self.val_seconds
        return {"train_seconds": round(train_seconds, 1), "validation_seconds": round(self.val_seconds, 1),
                "validation_share": round(self.val_seconds / total, 3) if total else 0.0,
                "validations": self.done, "validations_skipped": self.skipped}


def final_tasks(e: EvalCfg) -> int:
    """--eval_tasks as the final validation reads it: under --eval_minutes, -1 is all (0), the deadline
    and not the training's time bounding the validation."""
    return 0 if e.eval_tasks == -1 and e.eval_minutes > 0 else e.eval_tasks


def fits_in_training(seconds_so_far: float, tasks_so_far: int, tasks_left: int, train_seconds: float) -> bool:
    """The final validation's `-1` rule: scoring `tasks_left` more tasks at the pace of the first
    `tasks_so_far` keeps the whole validation no longer than the training."""
    return seconds_so_far / max(tasks_so_far, 1) * (tasks_so_far + tasks_left) <= train_seconds


@dataclass(frozen=True)
class ValidationPass:
    """What one validation scores: during training the first --val_tasks; the final validation and
    --eval_only also journal, keep --eval_minutes and a submission, and publish eval/*."""
    what: str  # "validation", "final validation" or "evaluation": its start-up line and report title
    first: list[int]  # the evaluation tasks scored first
    rest: list[int]  # then these (the final validation's; under --eval_tasks -1 only if they fit: final_tasks)
    final: bool  # journal, deadline, submission, eval/*
    log_val: bool  # the first tasks' metrics are the whole --val_tasks subset: logged as val/*
    weights: str  # what the report says was scored
    journal: str = ""  # the journal's name in the run folder (a final pass)
    train_seconds: float | None = None  # the training's (the -1 rule and heldout/train_minutes)


def validate(state: TrainState, data: TrainingData, cfg: Config, device: torch.device, dist: Dist,
             logger: RunLogger | None, stop: StopRequest, schedule: ValidationSchedule, *, final: bool,
             train_seconds: float, run_dir: Path | None = None) -> dict[str, float]:
    """Score the first `--val_tasks` evaluation tasks and log `val/*`; the final validation then
    scores the rest of `--eval_tasks` (see `_rest_of_final`) and logs `eval/*`, task images and the
    submission, journaling each task in `run_dir` (evaluation/journal.py: a run resumed from the
    checkpoint written before it continues it). The training's random streams are left as they
    were, so how often a run validates never changes what it learns. -> val/* (during training) or
    eval/* (final)."""
    subset = first_tasks(data.eval_set, cfg.eval.val_tasks)
    chosen = first_tasks(data.eval_set, cfg.eval.eval_tasks) if final and cfg.eval.eval_tasks >= 0 \
        else first_tasks(data.eval_set, 0)
    step = state.counters.optimizer_steps
    plan = ValidationPass(f"{'final ' if final else ''}validation", chosen[:len(subset)],
                          chosen[len(subset):] if final else [], final, len(chosen) >= len(subset),
                          f"checkpoints/step_{step:08d}", f"final-step_{step:08d}", train_seconds)
    started = time.perf_counter()
    noise = state.model.rl_noise_state()
    with preserved_rng():
        metrics = run_validation(state, data, cfg, device, dist, logger, stop, plan, run_dir)
    state.model.set_rl_noise_state(noise)
    schedule.val_seconds += dist.from_main(time.perf_counter() - started)
    schedule.done += not final
    return metrics


def run_validation(state: TrainState, data: TrainingData, cfg: Config, device: torch.device, dist: Dist,
                   logger: RunLogger | None, stop: StopRequest, plan: ValidationPass,
                   run_dir: Path | None) -> dict[str, float]:
    """The one sequence of every validation: the model's evaluation view, the journal and budget of a
    final pass, the held-out loss, the scores of `plan.first` then `plan.rest`, the metrics and images
    logged, report.html. -> the metrics (val/* or eval/*, and heldout/*)."""
    started, step, every = time.perf_counter(), state.counters.optimizer_steps, first_tasks(data.eval_set, 0)
    model, prompts = evaluation_view(state, cfg, device)
    journal = open_journal(run_dir, plan.journal, model, cfg, dist.rank, dist.world_size) \
        if plan.final and run_dir is not None else None
    deadline, submission = final_budget(cfg, data, device, dist, len(plan.first) + len(plan.rest), journal) \
        if plan.final else (None, None)
    # the tasks sure to be scored: under --eval_tasks -1 the rest of a final validation waits on its pace
    planned = len(plan.first) + (0 if final_tasks(cfg.eval) == -1 else len(plan.rest))
    in_training = state.counters.train_seconds if plan.train_seconds is not None else None
    heldout, heldout_pairs = measure_heldout(model, prompts, data, cfg, device, dist, logger, step, stop,
                                             in_training, planned, journal)
    announce(dist, f"{plan.what} at step {step}: {len(plan.first)} of {len(every)} evaluation tasks, {describe(cfg)}")

    def score(tasks: list[int], desc: str, work_after: Sequence[Work] = ()) -> TaskScores:
        return score_tasks(model, prompts, data.eval_set, tasks, cfg=cfg, device=device, dist=dist, stop=stop,
                           desc=desc, journal=journal, deadline=deadline, submission=submission,
                           work_after=work_after)

    # one --eval_minutes over the whole final validation: the first tasks' plan counts the rest's groups
    scores = score(plan.first, plan.what, work_of(data.eval_set, plan.rest, cfg, dist) if deadline is not None else [])
    metrics = scores.metrics("val", cfg)
    if plan.log_val and logger is not None:
        logger.write(step, metrics)
    if plan.final:  # the first tasks' images and report are published with the rest of its tasks
        rest = _rest_of_final(plan.rest, len(plan.first), len(every), cfg.eval,
                              dist.from_main(time.perf_counter() - started), plan.train_seconds, dist)
        if rest:
            scores = scores.merged(score(rest, f"{plan.what}, the rest"))
        metrics = publish(scores, data.eval_set, deadline, step, cfg, dist, logger)
    else:
        log_images(logger, scores.images(data.eval_set), step)
    write_run_report(logger, f"{plan.what} at step {step}", plan.weights, step, cfg, {**metrics, **heldout},
                     "eval" if plan.final else "val", scores, data.eval_set, heldout_pairs)
    return {**metrics, **heldout}


def heldout_task_count(cfg: Config, device: torch.device, scored: int) -> int:
    """How many evaluation tasks (the first; 0: all) the held-out loss before adaptation covers:
    --heldout_tasks, or under -1 all of them where a forward is cheap (no Qwen, or a GPU) and the
    `scored` tasks of the validation elsewhere: any Qwen on a CPU spends most of the pass encoding
    the tasks' demo texts, whose attention grows with their squared length (all 400 took 26 s of a
    31 s smoke run with the tiny Qwen on one core; 25 minutes with a real-sized one)."""
    if cfg.eval.heldout_tasks >= 0:
        return cfg.eval.heldout_tasks
    cheap = not cfg.prompt.use_qwen or device.type == "cuda"
    return 0 if cheap else scored


def measure_heldout(model: ArcModel, prompts: QwenFeatures | None, data: TrainingData, cfg: Config,
                    device: torch.device, dist: Dist, logger: RunLogger | None, step: int,
                    stop: StopRequest | None = None, train_seconds: float | None = None,
                    scored: int = 0, journal: Journal | None = None) -> tuple[dict[str, float], dict]:
    """The held-out loss before adaptation (evaluation/heldout.py) on the first `heldout_task_count`
    evaluation tasks ("eval": on synthetic data the held-out families; `scored`: the tasks the
    validation scores) and on the test pairs training held out ("train_tests"), with a progress bar,
    logged as `heldout/*` at `step` with its seconds (and, in a training run, the training minutes so
    far over every invocation: `heldout/train_minutes`). With a final validation's `journal` it is
    measured once: written there, and read back by a continuation. -> (metrics, report.json's
    per-pair records)."""
    if not cfg.eval.heldout_loss:
        return {}, {}
    covers = heldout_task_count(cfg, device, scored)
    # A continued final validation keeps the loss its journal holds over as many tasks (--heldout_tasks
    # may change between starts), every process agreeing: each writes its line after the measurement's
    # last collective, so a kill can fall between two.
    kept = journal.heldout if journal is not None else None
    if journal is not None and not dist.any(kept is None or kept.get("covers") != covers):
        announce(dist, "held-out loss: as measured before the stop (from the journal)")
        return dict(kept["heldout"]), kept["pairs"]
    started = time.perf_counter()
    sets = {"eval": data.eval_set, "train_tests": held_out_set(data)}
    covered = {"eval": set(first_tasks(data.eval_set, covers))}
    try:
        metrics, pairs = heldout_losses(model, prompts, sets, cfg=cfg, device=device, dist=dist, stop=stop,
                                        tasks=covered, progress=True)
    except Interrupted as err:  # what was measured before the stop is logged (its heldout/*_pairs say how much)
        if logger is not None and err.partial:
            logger.write(step, err.partial)
        raise
    metrics["heldout/seconds"] = dist.from_main(time.perf_counter() - started)
    if train_seconds is not None:
        metrics["heldout/train_minutes"] = train_seconds / 60
    if logger is not None:
        logger.write(step, metrics)
    records = pair_records(pairs, sets)
    if journal is not None:
        journal.write_heldout(metrics, records, covers)
    return metrics, records


def _rest_of_final(rest: list[int], n_first: int, n_every: int, e: EvalCfg, seconds_so_far: float,
                   train_seconds: float, dist: Dist) -> list[int]:
    """The tasks the final validation scores after its first `n_first`: all of `rest`, but under
    `--eval_tasks -1` (`final_tasks`) none when they would make validation take longer than the training did."""
    if rest and final_tasks(e) == -1 and not fits_in_training(seconds_so_far, n_first, len(rest), train_seconds):
        announce(dist, f"final validation: these {n_first} tasks only; all {n_every} would take about "
                       f"{duration(seconds_so_far / n_first * n_every)}, longer than the "
                       f"{duration(train_seconds)} of training (--eval_tasks 0 scores them all)")
        return []
    if rest:
        announce(dist, f"final validation: {len(rest)} more tasks")
    return rest


def final_budget(cfg: Config, data: TrainingData, device: torch.device, dist: Dist, tasks: int,
                 journal: Journal | None) -> tuple[Deadline | None, SubmissionFile | None]:
    """A final validation's deadline (--eval_minutes less what its journal says was spent before a stop,
    unless --new_deadline; its start-up line printed) and its submission file (--submission; every
    process's tasks from the journals, evaluation/submission.py), written now with a fallback for
    every test input and what the journals hold."""
    spent = journal.spent if journal is not None and not cfg.eval.new_deadline else 0.0
    deadline = (Deadline.synchronized(cfg.eval.eval_minutes, device, spent, searches(cfg))
                if cfg.eval.eval_minutes > 0 else None)
    if deadline is not None:
        announce(dist, deadline.describe(tasks))
    # every process writes it from all the journals; without them the main process its own tasks
    submission = SubmissionFile(Path(cfg.eval.submission), data.eval_set, journal.family if journal else ()) \
        if cfg.eval.submission and (dist.is_main or journal is not None) else None
    return deadline, submission


def publish(scores: TaskScores, dataset: EpisodeDataset, deadline: Deadline | None, step: int, cfg: Config,
            dist: Dist, logger: RunLogger | None) -> dict[str, float]:
    """The final scores: eval/* scalars and task images at `step`, and the submission file; with
    --eval_minutes, `eval/deadline_{full,cut,late}`: tasks scored with the full settings, with fewer
    steps or views, and unadapted after the deadline, over every process. -> the eval/* metrics."""
    result = EvalResult.of(scores, dataset, cfg)
    if deadline is not None:
        counts = dist.sum_floats([float(v) for v in deadline.tasks.values()])
        result.metrics.update({f"eval/deadline_{k}": v for k, v in zip(deadline.tasks, counts, strict=True)})
    if logger is not None:
        logger.write(step, result.metrics)
        log_images(logger, result.images, step)
    if cfg.eval.submission and dist.is_main:  # every process's attempts, gathered
        path = Path(cfg.eval.submission)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(result.submission))
    return result.metrics


def log_images(logger: RunLogger | None, images: list[tuple[str, np.ndarray]], step: int) -> None:
    """Labelled task images at `step`, one tag per task: the same tasks at every validation, so
    TensorBoard's step slider shows one task over the run."""
    if logger is not None:
        for task_id, image in images:
            logger.writer.add_image(f"tasks/{task_id}", image, step, dataformats="HWC")


def write_run_report(logger: RunLogger | None, what: str, weights: str, step: int, cfg: Config,
                     metrics: dict[str, float], prefix: str, scores: TaskScores, dataset: EpisodeDataset,
                     heldout: dict | None = None) -> None:
    """report.html and report.json in the run folder (main process: the one with a logger), after
    a validation's scoring; the time it takes is printed (it is not part of the validation's)."""
    if logger is None:
        return
    started = time.perf_counter()
    cards = scores.cards(dataset)
    data = cfg.data.data + (f", evaluation: {cfg.data.eval_data}" if cfg.data.eval_data else "")
    head = report_header(run=logger.run_dir.name, what=what, weights=weights, step=step, data=data,
                         settings=describe(cfg), metrics=metrics, prefix=prefix)
    page = write_report(logger.run_dir, head, cards, heldout)
    tqdm.write(f"report: {page} ({len(cards)} tasks, {page.stat().st_size / 2**20:.1f} MiB, "
               f"{time.perf_counter() - started:.2f} s)", file=sys.stderr)


def evaluate_only(cfg: Config, device: torch.device, dist: Dist, stop: StopRequest, checkpoint: Path | None,
                  run_dir: Path) -> dict:
    """Validate the weights of `checkpoint` (--resume's; None: fresh ones) on `--eval_tasks` (-1: all)
    into the run folder `run_dir`; nothing trains and the resumed run's folder is only read. -> the summary."""
    data, state = load_run(cfg, checkpoint, device, dist, prompt_cache_dir(cfg, run_dir))
    weights = checkpoint or "fresh weights"
    logger = open_run(run_dir, cfg, state, data, dist, f"evaluating {weights}")
    started = time.time()
    step = state.counters.optimizer_steps
    plan = ValidationPass("evaluation", first_tasks(data.eval_set, cfg.eval.eval_tasks), [], True, False,
                          str(weights), "evaluate")  # --eval_tasks -1 and 0: all
    try:
        metrics = run_validation(state, data, cfg, device, dist, logger, stop, plan, run_dir)
        return finish_run(run_dir, logger, started, step, {"evaluated": str(weights), **metrics}, dist,
                          cfg.eval.submission)
    except Interrupted as err:
        kept = f"its finished tasks are journaled in {run_dir}: run the same command to continue" \
            if cfg.eval.journal else "nothing written as finished, run the same command to evaluate again"
        raise TrainingStopped.by_signal(err.signum, f"during the evaluation of {weights}; {kept}") from None
    finally:
        if logger is not None:
            logger.close()

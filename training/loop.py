"""The run: the epoch loop, validation, evaluation-only runs, the run folder and main()."""

from __future__ import annotations

import dataclasses
import json
import math
import signal
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from data.arc import DataError
from data.curriculum import easy_fraction
from data.episodes import EpisodeDataset
from engine.checkpoint import find_checkpoint, write_atomic
from engine.config import Config, ConfigError, parse
from engine.distributed import Dist, init_distributed, launcher_wants_fsdp, shutdown
from engine.loop import Interrupted, StopRequest, TrainingStopped, duration, epoch_windows, preserved_rng, \
    seed_everything, summary_line
from engine.precision import slow_precision
from engine.run_logger import RunLogger
from engine.schedule import TrainingSchedule
from evaluation.evaluate import EvalResult, TaskScores, describe, first_tasks, score_tasks
from evaluation.report import header as report_header
from evaluation.report import write_report
from evaluation.schedule import ValidationSchedule, fits_in_training
from training.build import TrainingData, build_data, build_train_state, evaluation_view, load_run, prompt_cache_dir
from training.run_state import TrainState, plan_run_dir, restore_run_state, save_run_state
from training.step import train_step



def train(cfg: Config, device: torch.device, dist: Dist = Dist()) -> dict:
    """Train for `--epochs` (or, with `--eval_only`, validate saved weights). SIGINT and SIGTERM stop
    it within seconds, training or validating, with a checkpoint. -> the run's summary."""
    with StopRequest(announce=dist.is_main) as stop:
        if cfg.run.eval_only:
            return evaluate_only(cfg, device, dist, stop)
        return train_epochs(cfg, device, dist, stop)


def train_epochs(cfg: Config, device: torch.device, dist: Dist, stop: StopRequest) -> dict:
    """The epoch loop: checkpoints at epoch ends (and every `--save_every`), validations during
    training as `--val_every` says, each after a checkpoint, and the final validation."""
    seed_everything(cfg.run.seed)
    data = build_data(cfg, device, dist)
    resumed_from = find_checkpoint(cfg.run.resume) if cfg.run.resume else None
    run_dir = plan_run_dir(cfg.run, resumed_from)
    state = build_train_state(cfg, device, dist, prompt_cache_dir(cfg, run_dir), len(data.task_ids))
    n_batches = data.batches_in_epoch(cfg.run.max_batches)
    schedule = TrainingSchedule(cfg.optim.lr_schedule, [state.optimizer, state.rl_optimizer],
                                total_steps=cfg.run.epochs * math.ceil(n_batches / cfg.optim.grad_accum),
                                budget_seconds=60 * cfg.run.max_minutes)
    if resumed_from is not None:
        restore_run_state(state, resumed_from, cfg.flags(), dist)
    counters = state.counters
    what = "training"
    if cfg.data.train_on_eval_demos:
        what += f", TRANSDUCTIVE: the demos of {len(data.splits.evaluation)} evaluation tasks join training"
    validation = ValidationSchedule.of(cfg.eval)
    logger = open_run(run_dir, cfg, state, data, dist, what,
                      validation.describe(cfg.eval.val_tasks, cfg.eval.eval_tasks, len(data.splits.evaluation),
                                         cfg.run.epochs))
    if logger is not None:
        logger.writer.add_text("transductive", str(cfg.data.train_on_eval_demos), 0)
    # the counters of the newest checkpoint in run_dir
    saved_at = dataclasses.astuple(counters) if resumed_from and resumed_from.parent.parent == run_dir else None

    def checkpoint() -> None:
        nonlocal saved_at
        if saved_at != dataclasses.astuple(counters):  # a validation right after a save saves nothing new
            save_run_state(state, cfg.flags(), run_dir, cfg.run.keep_checkpoints, dist)
            saved_at = dataclasses.astuple(counters)

    resume_hint = f"checkpoint saved, continue with --resume {run_dir}"
    started = time.time()
    seconds = 0.0  # this invocation's training clock, validation not counted, rank 0's on every rank

    def validate_here(final: bool) -> dict[str, float]:
        """A checkpoint, then a validation; a stop request during it ends the run, the checkpoint kept."""
        checkpoint()
        try:
            return validate(state, data, cfg, device, dist, logger, stop, validation, final=final,
                            train_seconds=seconds)
        except Interrupted as err:
            raise TrainingStopped.by_signal(err.signum, f"during {'the final ' if final else ''}validation at step "
                                            f"{counters.optimizer_steps}; {resume_hint}") from None

    qwen_norm = 0.0
    state.model.train(True)
    try:
        for epoch in range(counters.epoch, cfg.run.epochs):
            data.sampler.set_epoch(epoch, counters.micro_batches_in_epoch)
            bar = tqdm(total=n_batches, initial=counters.micro_batches_in_epoch, desc=f"epoch {epoch + 1}/"
                       f"{cfg.run.epochs}", unit="batch", dynamic_ncols=True, mininterval=1.0, disable=not dist.is_main)
            windows = epoch_windows(data.loader, n_batches - counters.micro_batches_in_epoch, cfg.optim.grad_accum,
                                    device)
            out_of_time = False
            for window in windows:
                lr_factor = schedule.apply(counters.optimizer_steps, seconds)
                stats = train_step(state, window, cfg, dist)
                stats["optim/lr_factor"] = lr_factor
                bar.update(len(window))
                qwen_norm = stats.pop("grad/qwen_norm", 0.0) or qwen_norm  # non-zero on refresh steps only
                if logger is not None:
                    logger.accumulate(stats)
                    if counters.optimizer_steps % cfg.run.log_every == 0:
                        values = logger.flush(counters.optimizer_steps, run_scalars(state, qwen_norm, epoch, cfg))
                        bar.set_postfix(loss=f"{values.get('loss/combined', float('nan')):.3f}")
                if counters.consecutive_skips >= cfg.run.max_consecutive_skips:
                    checkpoint()
                    raise TrainingStopped(f"stopped: {counters.consecutive_skips} steps in a row skipped for "
                                          f"non-finite loss or gradients (step {counters.optimizer_steps}); checkpoint "
                                          f"in {run_dir}; lower --agent_lr/--qwen_lr or use --amp bf16", 1)
                if dist.any(stop()):
                    checkpoint()
                    raise TrainingStopped.by_signal(stop.signum or signal.SIGTERM,
                                                    f"at step {counters.optimizer_steps}; {resume_hint}")
                if cfg.run.save_every and counters.optimizer_steps % cfg.run.save_every == 0:
                    checkpoint()
                seconds = dist.from_main(time.time() - started) - validation.val_seconds
                if cfg.run.max_minutes and seconds > 60 * cfg.run.max_minutes:
                    out_of_time = True
                    break
                if counters.micro_batches_in_epoch < n_batches and validation.due(
                        step=counters.optimizer_steps, epoch_end=False, train_seconds=seconds):
                    validate_here(final=False)
            bar.close()
            if logger is not None:
                logger.flush(counters.optimizer_steps, run_scalars(state, qwen_norm, epoch, cfg))
            if counters.micro_batches_in_epoch >= n_batches:  # else --max_minutes ran out mid-epoch
                counters.epoch, counters.micro_batches_in_epoch = epoch + 1, 0
            checkpoint()
            if out_of_time:
                break
            if epoch + 1 < cfg.run.epochs and validation.due(step=counters.optimizer_steps, epoch_end=True,
                                                              train_seconds=seconds):
                validate_here(final=False)
        metrics = validate_here(final=True)
        return finish_run(run_dir, logger, started, counters.optimizer_steps,
                          {"transductive": cfg.data.train_on_eval_demos, **metrics, **validation.report(seconds)},
                          dist)
    finally:
        if logger is not None:
            logger.close()


def evaluate_only(cfg: Config, device: torch.device, dist: Dist, stop: StopRequest) -> dict:
    """Validate the weights of `--resume` (or fresh ones) on `--eval_tasks` (-1: all) into a new run
    folder; nothing trains and the resumed run's folder is only read. -> the summary."""
    checkpoint = find_checkpoint(cfg.run.resume) if cfg.run.resume else None
    run_dir = plan_run_dir(cfg.run, checkpoint)
    data, state = load_run(cfg, checkpoint, device, dist, prompt_cache_dir(cfg, run_dir))
    weights = checkpoint or "fresh weights"
    logger = open_run(run_dir, cfg, state, data, dist, f"evaluating {weights}")
    started = time.time()
    tasks = first_tasks(data.eval_set, cfg.eval.eval_tasks)  # -1 and 0: all
    announce(dist, f"evaluation: {len(tasks)} of {len(data.splits.evaluation)} evaluation tasks, {describe(cfg)}")
    try:
        model, prompts = evaluation_view(state, cfg, device)
        scores = score_tasks(model, prompts, data.eval_set, tasks, cfg=cfg, device=device, dist=dist, stop=stop,
                             desc="evaluate")
        result = EvalResult.of(scores, data.eval_set, cfg)
        publish(result, state.counters.optimizer_steps, cfg, dist, logger)
        write_run_report(logger, "evaluation", str(weights), state.counters.optimizer_steps, cfg, result.metrics,
                         "eval", scores, data.eval_set)
        return finish_run(run_dir, logger, started, state.counters.optimizer_steps,
                          {"evaluated": str(weights), **result.metrics}, dist)
    except Interrupted as err:
        raise TrainingStopped.by_signal(err.signum, f"during the evaluation of {weights}; nothing written as "
                                                    f"finished, run the same command to evaluate again") from None
    finally:
        if logger is not None:
            logger.close()


def validate(state: TrainState, data: TrainingData, cfg: Config, device: torch.device, dist: Dist,
             logger: RunLogger | None, stop: StopRequest, schedule: ValidationSchedule, *, final: bool,
             train_seconds: float) -> dict[str, float]:
    """Score the first `--val_tasks` evaluation tasks and log `val/*`; the final validation then
    scores the rest of `--eval_tasks` (evaluation/schedule.py says which) and logs `eval/*`,
    task images and the submission. The training's random streams are left as they were, so how
    often a run validates never changes what it learns. -> val/* (during training) or eval/* (final)."""
    every = first_tasks(data.eval_set, 0)
    subset = first_tasks(data.eval_set, cfg.eval.val_tasks)
    chosen = first_tasks(data.eval_set, cfg.eval.eval_tasks) if final and cfg.eval.eval_tasks >= 0 else every
    first = chosen[:len(subset)]
    step = state.counters.optimizer_steps
    started = time.perf_counter()
    noise = state.model.rl_noise_state()
    model, prompts = evaluation_view(state, cfg, device)
    with preserved_rng():
        announce(dist, f"{'final ' if final else ''}validation at step {step}: {len(first)} of {len(every)} "
                       f"evaluation tasks, {describe(cfg)}")
        scores = score_tasks(model, prompts, data.eval_set, first, cfg=cfg, device=device, dist=dist, stop=stop,
                             desc="validate")
        metrics = scores.metrics("val", cfg)
        if logger is not None and len(first) == len(subset):
            logger.write(step, metrics)
        if not final:  # the final validation's are published with the rest of its tasks
            log_images(logger, scores.images(data.eval_set), step)
            write_run_report(logger, f"validation at step {step}", f"checkpoints/step_{step:08d}", step, cfg, metrics,
                             "val", scores, data.eval_set)
        if final:
            rest = chosen[len(first):]  # both are the first tasks of one list
            so_far = dist.from_main(time.perf_counter() - started)
            if rest and cfg.eval.eval_tasks == -1 and not fits_in_training(so_far, len(first), len(rest),
                                                                            train_seconds):
                announce(dist, f"final validation: these {len(first)} tasks only; all {len(every)} would take about "
                               f"{duration(so_far / len(first) * len(every))}, longer than the "
                               f"{duration(train_seconds)} of training (--eval_tasks 0 scores them all)")
                rest = []
            if rest:
                announce(dist, f"final validation: {len(rest)} more tasks")
                scores = scores.merged(score_tasks(model, prompts, data.eval_set, rest, cfg=cfg, device=device,
                                                   dist=dist, stop=stop, desc="final"))
            result = EvalResult.of(scores, data.eval_set, cfg)
            publish(result, step, cfg, dist, logger)
            write_run_report(logger, f"final validation at step {step}", f"checkpoints/step_{step:08d}", step, cfg,
                             result.metrics, "eval", scores, data.eval_set)
            metrics = result.metrics
    state.model.set_rl_noise_state(noise)
    schedule.val_seconds += dist.from_main(time.perf_counter() - started)
    schedule.done += not final
    return metrics


def publish(result: EvalResult, step: int, cfg: Config, dist: Dist, logger: RunLogger | None) -> None:
    """The final scores: eval/* scalars and task images at `step`, and the submission file."""
    if logger is not None:
        logger.write(step, result.metrics)
        log_images(logger, result.images, step)
    if cfg.eval.submission and dist.is_main:
        path = Path(cfg.eval.submission)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(result.submission))


def log_images(logger: RunLogger | None, images: list[tuple[str, np.ndarray]], step: int) -> None:
    """Labelled task images at `step`, one tag per task: the same tasks at every validation, so
    TensorBoard's step slider shows one task over the run."""
    if logger is not None:
        for task_id, image in images:
            logger.writer.add_image(f"tasks/{task_id}", image, step, dataformats="HWC")


def write_run_report(logger: RunLogger | None, what: str, weights: str, step: int, cfg: Config,
                     metrics: dict[str, float], prefix: str, scores: TaskScores, dataset: EpisodeDataset) -> None:
    """report.html and report.json in the run folder (main process: the one with a logger), after
    a validation's scoring; the time it takes is printed (it is not part of the validation's)."""
    if logger is None:
        return
    started = time.perf_counter()
    cards = scores.cards(dataset)
    data = cfg.data.data + (f", evaluation: {cfg.data.eval_data}" if cfg.data.eval_data else "")
    head = report_header(run=logger.run_dir.name, what=what, weights=weights, step=step, data=data,
                         settings=describe(cfg), metrics=metrics, prefix=prefix)
    page = write_report(logger.run_dir, head, cards)
    tqdm.write(f"report: {page} ({len(cards)} tasks, {page.stat().st_size / 2**20:.1f} MiB, "
               f"{time.perf_counter() - started:.2f} s)", file=sys.stderr)


def announce(dist: Dist, line: str) -> None:
    """One line on the console from the main process, above any progress bar."""
    if dist.is_main:
        tqdm.write(line, file=sys.stderr)


def run_scalars(state: TrainState, qwen_norm: float, epoch: int, cfg: Config) -> dict[str, float]:
    """Counters logged as they stand (not averaged): amp, cache, curriculum."""
    values = {"amp/scale": state.amp.scale, "amp/skipped_steps": state.amp.skipped_steps, "grad/qwen_norm": qwen_norm,
              "train/easy_fraction": easy_fraction(epoch, cfg.data.easy_warmup, cfg.data.easy_later)}
    if state.prompts is not None:
        values.update(state.prompts.scalars())
    return values


def open_run(run_dir: Path, cfg: Config, state: TrainState, data: TrainingData, dist: Dist,
             what: str, validation: str = "") -> RunLogger | None:
    """Create the run folder and its TensorBoard writer, and print the start-up lines (main process)."""
    if not dist.is_main:
        return None
    run_dir.mkdir(parents=True, exist_ok=True)
    print(f"run {run_dir} ({what}) | device={next(state.model.parameters()).device} amp={cfg.optim.amp} "
          f"world_size={dist.world_size}{' sharded (--fsdp)' if cfg.optim.fsdp else ''} | data {data.splits.name}: {len(data.splits.training)} training, "
          f"{len(data.splits.evaluation)} evaluation tasks | {state.model.description()} "
          f"[qwen {cfg.qwen.qwen_train}]", file=sys.stderr)
    if validation:
        print(validation, file=sys.stderr)
    slow = slow_precision(cfg.optim.amp, next(state.model.parameters()).device)
    if slow:
        print(slow, file=sys.stderr)
    # A resumed run rewrites the steps after its checkpoint: TensorBoard drops the old ones.
    steps = state.counters.optimizer_steps
    return RunLogger(run_dir, cfg.flags(), state.model.description(), purge_step=steps + 1 if steps else None)


def finish_run(run_dir: Path, logger: RunLogger | None, started: float, steps: int, metrics: dict,
               dist: Dist) -> dict:
    """Write summary.json (main process), the mark of a finished run; -> the summary."""
    summary = {"steps": steps, "seconds": round(time.time() - started, 1), "run_dir": str(run_dir),
               "world_size": dist.world_size, **metrics}
    if logger is not None:
        summary.update({k: logger.last[k] for k in ("loss/combined", "loss/efe", "rl/reward") if k in logger.last})
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def main(argv: list[str] | None = None) -> int:
    try:
        cfg = parse(argv, "fixed.py", "Train the Qwen-prompted ARC agent.")
        if launcher_wants_fsdp() and not cfg.optim.fsdp:  # an FSDP accelerate config
            cfg = cfg.replace(fsdp=True)
        dist, device = init_distributed(cfg.run.device, cfg.optim.fsdp)
        try:
            summary = train(cfg, device, dist)
            # no process closes its connections while another still uses them (gloo aborts the other)
            dist.barrier()
        finally:
            shutdown()
    except ConfigError as err:
        print(f"fixed.py: error: {err}", file=sys.stderr)
        return 2
    except DataError as err:
        print(f"fixed.py: data error: {err}", file=sys.stderr)
        return 1
    except TrainingStopped as err:
        if dist.is_main:  # every process stops together, for one reason
            print(f"fixed.py: {err}", file=sys.stderr)
        return err.exit_code
    if dist.is_main:
        print(summary_line(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())

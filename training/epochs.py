"""The epoch loop: `train()` runs a Config (or, with `--eval_only`, validates saved weights).

    loop = EpochLoop(cfg, device, dist, stop, resumed_from, run_dir)   # data, model, optimizers, resume
    summary = loop.run()                         # epochs of train_step, checkpoints, validations

Checkpoints, validations and stops (SIGINT, SIGTERM, skipped steps, --max_minutes): docs/runs.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import signal
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from agents import compile_seconds
from data.curriculum import easy_fraction
from engine.checkpoint import find_checkpoint
from engine.config import Config
from engine.distributed import Dist
from engine.loop import Interrupted, StopRequest, TrainingStopped, epoch_windows, seed_everything
from engine.run_logger import IntervalMeans
from engine.schedule import TrainingSchedule
from evaluation.evaluate import first_tasks
from evaluation.submission import check_submission_path
from training.build import build_data, build_train_state, prompt_cache_dir
from training.flops import TrainingFlops
from training.run_folder import agreed_run_dir, finish_run, holding, open_run, refuse_an_older_start
from training.run_state import restore_run_state, save_run_state
from training.step import train_step
from training.validation import ValidationSchedule, evaluate_only, final_tasks, validate


def train(cfg: Config, device: torch.device, dist: Dist = Dist()) -> dict:
    """Train for `--epochs` (or, with `--eval_only`, validate saved weights). SIGINT and SIGTERM stop
    it within seconds, training or validating, with a checkpoint. -> the run's summary."""
    resumed_from = find_checkpoint(cfg.run.resume) if cfg.run.resume else None
    run_dir = agreed_run_dir(cfg.run, resumed_from, dist)
    if cfg.eval.submission:
        check_submission_path(Path(cfg.eval.submission))
    with StopRequest(announce=dist.is_main) as stop, holding(run_dir, dist):
        if cfg.run.eval_only:
            return evaluate_only(cfg, device, dist, stop, resumed_from, run_dir)
        if resumed_from is not None:
            refuse_an_older_start(run_dir, resumed_from, cfg.run.resume)
        return EpochLoop(cfg, device, dist, stop, resumed_from, run_dir).run()


class EpochLoop:
    """One invocation of a training run, from its first (or resumed) step to its summary."""

    def __init__(self, cfg: Config, device: torch.device, dist: Dist, stop: StopRequest, resumed_from: Path | None,
                 run_dir: Path):
        self.cfg, self.device, self.dist, self.stop, self.run_dir = cfg, device, dist, stop, run_dir
        seed_everything(cfg.run.seed)
        self.data = build_data(cfg, device, dist)
        self.state = build_train_state(cfg, device, dist, prompt_cache_dir(cfg, self.run_dir), len(self.data.task_ids))
        self.n_batches = self.data.batches_in_epoch(cfg.run.max_batches)
        self.lr_schedule = TrainingSchedule(
            cfg.optim.lr_schedule, [self.state.optimizer, self.state.rl_optimizer],
            total_steps=cfg.run.epochs * math.ceil(self.n_batches / cfg.optim.grad_accum),
            budget_seconds=60 * cfg.run.max_minutes, warmup=cfg.optim.lr_warmup)
        if resumed_from is not None:
            restore_run_state(self.state, resumed_from, cfg.flags(), dist)
        self.counters = self.state.counters
        # the counters of the newest checkpoint in run_dir: a checkpoint asked for again saves nothing new
        resumed_here = resumed_from is not None and resumed_from.parent.parent.resolve() == self.run_dir.resolve()
        self.saved_at = dataclasses.astuple(self.counters) if resumed_here else None
        self.validation = ValidationSchedule.of(cfg.eval)
        what = "training" if resumed_from is None else \
            f"training on from {resumed_from} (step {self.counters.optimizer_steps})"
        if cfg.data.train_on_eval_demos:
            what += f", TRANSDUCTIVE: the demos of {len(self.data.splits.evaluation)} evaluation tasks join training"
        self.logger = open_run(self.run_dir, cfg, self.state, self.data, dist, what, self.validation.describe(
            cfg.eval.val_tasks, final_tasks(cfg.eval), len(first_tasks(self.data.eval_set, 0)),
            cfg.run.epochs - self.counters.epoch))
        if self.logger is not None:
            self.logger.writer.add_text("transductive", str(cfg.data.train_on_eval_demos), 0)
        self.started = time.time()
        self.seconds = 0.0  # this invocation's training clock, validation not counted, rank 0's on every rank
        self.saved_seconds = 0.0  # that clock at the last checkpoint (--save_minutes)
        self.outside_seconds = 0.0  # of it, checkpoints and logging (EpochLoop.outside_steps)
        # the earlier invocations' training and compile seconds: --max_minutes and the lr schedule count over
        # every invocation, so a stopped run resumed continues its own budget and schedule
        self.seconds_before, self.compile_before = self.counters.train_seconds, self.counters.compile_seconds
        self.qwen_norm = torch.zeros(())  # the trainable Qwen's gradient norm at its last refresh step
        self.flops = TrainingFlops(cfg, device)  # the agent's FLOPs this invocation trains (perf/*, train_*)
        self.interval = IntervalMeans()  # the step scalars since the last log step, on every process

    def run(self) -> dict:
        """Every epoch left, then the final validation. -> the summary (summary.json's)."""
        self.state.model.train(True)
        try:
            if self.budget_spent():  # resumed after its --max_minutes ran out: its final validation is what is left
                if self.dist.is_main:
                    print(f"--max_minutes {self.cfg.run.max_minutes:g}: spent before this start ("
                          f"{self.counters.train_seconds / 60:.2f} minutes trained); no training left", file=sys.stderr)
            else:
                for epoch in range(self.counters.epoch, self.cfg.run.epochs):
                    if not self.epoch(epoch):
                        break
            metrics = self.validate(final=True)
            return finish_run(self.run_dir, self.logger, self.started, self.counters.optimizer_steps,
                              {"transductive": self.cfg.data.train_on_eval_demos, **metrics,
                               **self.validation.report(self.seconds), **self.flops.since_start(self.seconds),
                               **self.outside_steps_figures(),
                               **({"compile_seconds": compile_seconds()} if self.cfg.agent.compile else {})}, self.dist,
                              self.cfg.eval.submission)
        finally:
            if self.logger is not None:
                self.logger.close()

    def epoch(self, epoch: int) -> bool:
        """The rest of one epoch (all of it unless resumed mid-epoch), its checkpoint and the
        validation after it. -> False when `--max_minutes` ran out."""
        cfg, counters = self.cfg, self.counters
        self.data.sampler.set_epoch(epoch, counters.micro_batches_in_epoch)
        bar = tqdm(total=self.n_batches, initial=counters.micro_batches_in_epoch, desc=f"epoch {epoch + 1}/"
                   f"{cfg.run.epochs}", unit="batch", dynamic_ncols=True, mininterval=1.0,
                   disable=not self.dist.is_main)
        windows = epoch_windows(self.data.loader, self.n_batches - counters.micro_batches_in_epoch,
                                cfg.optim.grad_accum, self.device)
        in_time = True
        for window in windows:
            self.step(window, epoch, bar)
            self.seconds = self.dist.from_main(time.time() - self.started) - self.validation.val_seconds
            counters.train_seconds = self.seconds_before + self.seconds
            if cfg.agent.compile:
                counters.compile_seconds = self.compile_before + compile_seconds()
            if self.budget_spent():
                in_time = False
                break
            if counters.micro_batches_in_epoch < self.n_batches and self.validation.due(
                    step=counters.optimizer_steps, epoch_end=False, train_seconds=self.seconds):
                self.validate(final=False)
        bar.close()
        self.log(epoch)
        if counters.micro_batches_in_epoch >= self.n_batches:  # else --max_minutes ran out mid-epoch
            counters.epoch, counters.micro_batches_in_epoch = epoch + 1, 0
        if not in_time or self.epoch_end_saves():
            self.checkpoint()
        if in_time and epoch + 1 < cfg.run.epochs and self.validation.due(
                step=counters.optimizer_steps, epoch_end=True, train_seconds=self.seconds):
            self.validate(final=False)
        return in_time

    def step(self, window: list[dict], epoch: int, bar: tqdm) -> None:
        """One optimizer step, its scalars, and what may follow it: a stop (with a checkpoint) on a
        stop request or too many skipped steps in a row, a checkpoint every `--save_every`."""
        cfg, counters = self.cfg, self.counters
        # the schedule's clock, over every invocation, leaves the compiles out: a warm-up by the clock would
        # pass during one
        clock = counters.train_seconds - counters.compile_seconds
        lr_factor = self.lr_schedule.apply(counters.optimizer_steps, clock)
        stats = train_step(self.state, window, cfg, self.dist)
        stats["optim/lr_factor"] = lr_factor
        self.flops.add(window)
        bar.update(len(window))
        qwen_norm = stats.pop("grad/qwen_norm", None)  # zero on steps without a Qwen gradient (not refreshed)
        if qwen_norm is not None:  # on the device: kept there until a log step reads it
            self.qwen_norm = torch.where(qwen_norm > 0, qwen_norm, self.qwen_norm)
        self.interval.add(stats)
        if counters.optimizer_steps % cfg.run.log_every == 0:
            values = self.log(epoch)
            bar.set_postfix(loss=f"{values.get('loss/combined', float('nan')):.3f}")
        if counters.consecutive_skips >= cfg.run.max_consecutive_skips:
            self.checkpoint()
            raise TrainingStopped(f"stopped: {counters.consecutive_skips} steps in a row skipped for non-finite loss "
                                  f"or gradients (step {counters.optimizer_steps}); checkpoint in {self.run_dir}; "
                                  f"lower --agent_lr/--qwen_lr or use --amp bf16", 1)
        if self.dist.any(self.stop()):
            self.checkpoint()
            raise TrainingStopped.by_signal(self.stop.signum or signal.SIGTERM,
                                            f"at step {counters.optimizer_steps}; {self.resume_hint}")
        if cfg.run.save_every and counters.optimizer_steps % cfg.run.save_every == 0:
            self.checkpoint()

    def budget_spent(self) -> bool:
        """--max_minutes of training ran out, counted over every invocation of the run."""
        minutes = self.cfg.run.max_minutes
        return bool(minutes) and self.counters.train_seconds > 60 * minutes

    def outside_steps_figures(self) -> dict[str, float]:
        """summary.json's: seconds of this invocation's training clock spent in checkpoints and logging, and
        their share of it (its checkpoint as training ends and the validations are not on that clock)."""
        return {"outside_steps_seconds": round(self.outside_seconds, 2),
                "outside_steps_share": round(self.outside_seconds / self.seconds, 4) if self.seconds else 0.0}

    def epoch_end_saves(self) -> bool:
        """Whether an epoch's end checkpoints: always, but in a time-bounded run with --save_every 0,
        where epochs may be seconds long (a checkpoint of a large model and its moments takes a second
        or more), only once --save_minutes of training passed since the last save."""
        run = self.cfg.run
        if not run.max_minutes or run.save_every or not run.save_minutes:
            return True
        return self.seconds - self.saved_seconds >= 60 * run.save_minutes

    @property
    def resume_hint(self) -> str:
        submission = f" --submission {self.cfg.eval.submission}" if self.cfg.eval.submission else ""
        return f"checkpoint saved, continue with --resume {self.run_dir}{submission}"

    def checkpoint(self) -> None:
        """Save the run's state, unless the newest checkpoint already holds these counters."""
        with self.outside_steps():
            self._checkpoint()

    @contextlib.contextmanager
    def outside_steps(self):
        """Time spent training but not in a step (checkpoints, logging): `outside_steps_seconds`."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.outside_seconds += time.perf_counter() - started

    def _checkpoint(self) -> None:
        if self.saved_at != dataclasses.astuple(self.counters):
            save_run_state(self.state, self.cfg.flags(), self.run_dir, self.cfg.run.keep_checkpoints, self.dist)
            self.saved_at = dataclasses.astuple(self.counters)
            self.saved_seconds = self.seconds

    def validate(self, final: bool) -> dict[str, float]:
        """A checkpoint, then a validation; a stop request during it ends the run, the checkpoint kept."""
        self.checkpoint()
        try:
            return validate(self.state, self.data, self.cfg, self.device, self.dist, self.logger, self.stop,
                            self.validation, final=final, train_seconds=self.seconds, run_dir=self.run_dir)
        except Interrupted as err:
            raise TrainingStopped.by_signal(err.signum, f"during {'the final ' if final else ''}validation at step "
                                            f"{self.counters.optimizer_steps}; {self.resume_hint}") from None
        finally:
            self.flops.restart_interval()  # the rates are training's: a validation's time is not counted

    def log(self, epoch: int) -> dict[str, float]:
        """Write the step scalars accumulated since the last write, averaged over every process, with
        the counters as they stand (amp, prompt cache, curriculum; rank 0's, not averaged). Every
        process calls it at the same steps. -> what was written (nothing on the other processes)."""
        with self.outside_steps():
            means = self.interval.means(self.dist)
            return {} if self.logger is None else self._log(epoch, means)

    def _log(self, epoch: int, means: dict[str, float]) -> dict[str, float]:
        state = self.state
        values = {"amp/scale": state.amp.scale, "amp/skipped_steps": state.amp.skipped_steps,
                  "grad/qwen_norm": float(self.qwen_norm),
                  "train/easy_fraction": easy_fraction(epoch, self.cfg.data.easy_warmup, self.cfg.data.easy_later)}
        if state.prompts is not None:
            values.update(state.prompts.scalars())
        if self.cfg.agent.compile:
            values["time/compile_seconds"] = compile_seconds()
        # this invocation's totals so far: what a run stopped before its summary is read from (bench.gpu_lease)
        values.update({"time/train_seconds": self.seconds, "time/outside_steps_seconds": self.outside_seconds,
                       "perf/train_episodes": float(self.flops.episodes), "perf/train_pflop": self.flops.total / 1e15})
        written = self.logger.write(self.counters.optimizer_steps, {**means, **values})
        # after the means, whose float() waits for the device: the interval's wall time covers the work queued in it
        return {**written, **self.logger.write(self.counters.optimizer_steps, self.flops.interval())}

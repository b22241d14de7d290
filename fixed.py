"""Train the Qwen-prompted ARC agent.

    python fixed.py --epochs 3 --max_batches 200            # CPU smoke run with the tiny Qwen2
    python fixed.py --qwen_model Qwen/Qwen2.5-1.5B --amp bf16 --device cuda

One optimizer step (`train_step`): for each micro-batch of the window, Qwen features from the
prompt cache -> the model: prompt -> refinement with a sampled RL delta and with the mean one, both
in one agent call -> logits -> EFE losses -> amp backward; then unscale, clip and step; then the
RL head's own update on detached tensors. Everything else here is orchestration: flags
(engine/config.py), building the parts, the epoch loop, validation and checkpoints.
"""

from __future__ import annotations

import dataclasses
import json
import math
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.profiler import record_function
from torch.utils.data import DataLoader
from tqdm import tqdm

from data.arc import ArcSplits, ArcTask, DataError
from data.curriculum import CurriculumBatches, easy_fraction
from data.episodes import DifficultyScale, EpisodeDataset, collate, episode_difficulty, evaluation_episodes, \
    training_episodes
from data.sources import SyntheticOptions, load_splits
from engine.checkpoint import find_checkpoint
from engine.config import Config, ConfigError, parse
from engine.distributed import Dist, data_parallel, gradient_sync, init_distributed, is_sharded, \
    launcher_wants_fsdp, shutdown, under_ddp
from engine.evaluation import EvalResult, describe, evaluate, first_tasks, score_tasks
from engine.fsdp import shard_model, unsharded_copy
from engine.loop import Interrupted, StopRequest, TrainingStopped, duration, epoch_windows, preserved_rng, \
    seed_everything, summary_line
from engine.precision import MixedPrecision, check_master_weights, slow_precision
from engine.run_logger import RunLogger
from engine.run_state import TrainState, plan_run_dir, restore_run_state, save_run_state
from engine.schedule import TrainingSchedule
from engine.validation_schedule import ValidationSchedule, fits_in_training
from loss_function import training_loss
from model import ArcModel, build_model
from policy_refined import RLInfo
from prompt import QwenFeatures

# ----------------------------------------------------------------------------------------------
# Building the parts
# ----------------------------------------------------------------------------------------------


@dataclass
class TrainingData:
    splits: ArcSplits
    task_ids: list[str]  # the tasks training draws episodes from (a task embedding row each), in order
    sampler: CurriculumBatches  # yields this process's slice of each global batch
    loader: DataLoader
    eval_set: EpisodeDataset  # the evaluation tasks' test pairs; their outputs are read by the scorer only

    def batches_in_epoch(self, max_batches: int) -> int:
        full = self.sampler.batches_per_epoch
        return min(full, max_batches) if max_batches else full


def build_data(cfg: Config, device: torch.device, dist: Dist = Dist()) -> TrainingData:
    """Load and validate every task (a bad file stops here, before anything is written)."""
    d = cfg.data
    synthetic = SyntheticOptions(seed=cfg.run.seed, rules=d.synthetic_families(True),
                                 eval_rules=d.synthetic_families(False), size=d.synthetic_sizes())
    splits = load_splits(d.data, d.eval_data, d.allow_overlap, synthetic, drop_overlap=d.drop_overlap)
    tasks = splits.training
    if d.train_on_eval_demos:  # transductive: the evaluation tasks' demos only, never their test pairs
        tasks = tasks + tuple(ArcTask(t.task_id, t.train, ()) for t in splits.evaluation)
    train_eps = training_episodes(tasks)
    if not train_eps:
        raise DataError(f"--data {d.data}: the training tasks give no training episodes")
    scores = np.array([episode_difficulty(e) for e in train_eps])
    scale = DifficultyScale(scores)
    task_index = {t.task_id: i for i, t in enumerate(tasks)}
    task_rows = task_index if cfg.prompt.task_embedding else None
    context_demos = cfg.prompt.latent_step_demos if cfg.prompt.latent_step_lr > 0 else 0
    train_set = EpisodeDataset(train_eps, scale, permute_background=d.permute_background, scores=scores,
                               canvas=d.canvas, task_rows=task_rows, context_demos=context_demos)
    sampler = CurriculumBatches(is_easy=np.array([scale.is_easy(s) for s in scores]), batch_size=d.batch_size,
                                seed=cfg.run.seed, augment=d.augment, warmup_fraction=d.easy_warmup,
                                later_fraction=d.easy_later, augment_pool=d.augment_pool,
                                task_of=np.array([task_index[e.task.task_id] for e in train_eps]), rank=dist.rank,
                                world_size=dist.world_size, sides=train_set.sides, bucket=d.size_buckets)
    # The sampler runs here and decides every (episode, augmentation): workers only compute samples,
    # so any --num_workers gives the same batches (a worker set lives as long as the loader).
    loader = DataLoader(train_set, batch_sampler=sampler, collate_fn=collate, num_workers=d.num_workers,
                        persistent_workers=d.num_workers > 0, pin_memory=device.type == "cuda")
    # every evaluation task (validation picks which it scores); the canvas side of a test input is
    # predicted without its output
    eval_set = EpisodeDataset(evaluation_episodes(splits.evaluation), scale, canvas=d.canvas, fit_target=False,
                              task_rows=task_rows, context_demos=context_demos)
    return TrainingData(splits, list(task_index), sampler, loader, eval_set)


def build_train_state(cfg: Config, device: torch.device, dist: Dist = Dist(), prompt_cache_dir: Path | None = None,
                      tasks: int = 0) -> TrainState:
    """The model (with `tasks` task embeddings under --task_embedding), its prompt cache, both
    optimizers and the mixed-precision step."""
    model = build_model(cfg, noise_seed=cfg.run.seed + 1000 * dist.rank, tasks=tasks).to(device)
    if cfg.optim.fsdp:  # before the optimizer is made: it holds the sharded parameters
        shard_model(model, dist, device, cfg.optim.amp)
    groups = model.parameter_groups()
    main = groups["prompt_heads"] + groups["refiner"] + groups["agent"]
    check_master_weights(main + groups["qwen"], "main optimizer")
    param_groups = [{"params": main, "lr": cfg.optim.agent_lr, "name": "main"}]
    if groups["qwen"]:
        param_groups.append({"params": groups["qwen"], "lr": cfg.optim.qwen_lr, "name": "qwen"})
    if groups["task_embedding"]:
        param_groups.append({"params": groups["task_embedding"], "lr": cfg.optim.task_embedding_lr,
                             "weight_decay": 0.0, "name": "task_embedding"})
    prompts = model.prompt_cache(cfg.qwen.prompt_refresh)
    if prompts is not None and prompt_cache_dir is not None:
        prompts.open_disk(prompt_cache_dir)
    # Under DDP with several processes (no-ops with one). The RL head learns from its own loss with its
    # own optimizer: its own DDP, left out of the model's. A trainable Qwen takes part on refresh steps
    # only: DDP must then look for unused parameters (a walk of the graph each step; off otherwise).
    trained = model if cfg.optim.fsdp else data_parallel(model, dist, device, bucket_mb=cfg.optim.grad_bucket_mb,
                                                         ignore=model.rl_head_names(), find_unused=cfg.qwen.trainable)
    rl_head = data_parallel(model.rl_head, dist, device, bucket_mb=cfg.optim.grad_bucket_mb)
    # fused: one kernel updates every tensor (CPU and CUDA); the per-tensor loop torch picks on a CPU
    # took 6-8 ms of a 90 ms step.
    return TrainState(model=model, prompts=prompts,
                      optimizer=torch.optim.AdamW(param_groups, weight_decay=cfg.optim.weight_decay, fused=True),
                      rl_optimizer=torch.optim.Adam(groups["rl_head"], lr=cfg.optim.rl_lr, fused=True),
                      amp=MixedPrecision(cfg.optim.amp, device, init_scale=cfg.optim.fp16_init_scale),
                      trained=trained, rl_head=rl_head)


def evaluation_view(state: TrainState, cfg: Config, device: torch.device) -> tuple[ArcModel, QwenFeatures | None]:
    """The model and the Qwen features validation scores with. Sharded weights: an unsharded copy
    (test-time training changes weights per task on each process), built for this validation and
    dropped after it, so training never holds both (collective). A trainable Qwen: a fresh prompt
    cache, so validation reads features of the weights as they are now (the training cache keeps
    each feature from the step that encoded it)."""
    model = state.model
    if is_sharded(model):
        model = unsharded_copy(model, model.fresh_copy(cfg).to(device))
    if model.trains_qwen:
        return model, model.prompt_cache(cfg.qwen.prompt_refresh)
    return model, state.prompts


def load_run(cfg: Config, checkpoint: Path | None, device: torch.device, dist: Dist = Dist(),
             cache_dir: Path | None = None) -> tuple[TrainingData, TrainState]:
    """A run's data and state as `checkpoint` (a folder find_checkpoint has checked; None: fresh
    weights) left them, to evaluate: seeded, the data built (its training episodes set the
    difficulty scale of the prompt's controls), the weights restored. The one way a bench, a test
    or --eval_only loads a run."""
    seed_everything(cfg.run.seed)
    data = build_data(cfg, device, dist)
    state = build_train_state(cfg, device, dist, cache_dir, len(data.task_ids))
    if checkpoint is not None:
        restore_run_state(state, checkpoint, cfg.flags(), dist, evaluating=True)
    return data, state


def prompt_cache_dir(cfg: Config, run_dir: Path) -> Path | None:
    if cfg.qwen.prompt_cache_dir == "none":
        return None
    return Path(cfg.qwen.prompt_cache_dir) if cfg.qwen.prompt_cache_dir else run_dir.parent / "prompt_cache"


# ----------------------------------------------------------------------------------------------
# The algorithm: one optimizer step
# ----------------------------------------------------------------------------------------------


def train_step(state: TrainState, window: list[dict], cfg: Config, dist: Dist = Dist()) -> dict:
    """One optimizer step over a window of micro-batches (grad_accum of them, or fewer at the end);
    advances the counters. -> stats for TensorBoard (tensors until the logger writes them).

    Each micro-batch's loss is summed over its samples and divided by the window's real sample
    count over all processes, so the step's gradient is the mean gradient of exactly the samples
    it saw. A micro-batch with a non-finite loss is counted and does not go backward, except where
    every process must take part in that backward: the window's last under DDP (DDP reduces in it),
    every micro-batch under FSDP (each backward gathers the sharded weights). It then goes backward,
    the non-finite value reaches every process's gradients and every process skips the step. The
    gradients are reduced in the window's last backward (the others run without gradient sync).
    Each phase is a `record_function` range ("step/..."), free unless a profiler records it.
    """
    model, amp, counters = state.model, state.amp, state.counters
    trained = state.trained if state.trained is not None else model
    ddp, sharded = under_ddp(trained), is_sharded(trained)
    n_samples = dist.sum_int(sum(b["input"].shape[0] for b in window))
    # DDP and FSDP average over processes; the loss is a share of the global batch, so the sum is wanted
    share = dist.world_size / n_samples if ddp or sharded else 1 / n_samples
    stats: dict = {"amp/nonfinite_losses": 0.0}
    infos, rewards = [], []
    for i, batch in enumerate(window):
        last = i == len(window) - 1
        with record_function("step/prompt"):
            batch = model.encode_prompts(batch, state.prompts, counters.micro_batches + i, training=True)
        with gradient_sync(trained, last):
            with record_function("step/forward"), amp.autocast():
                pred = trained(batch, "sampled+mean")
                loss = training_loss(pred.logits, pred.refined, pred.prompt, batch["target"], batch["input"],
                                     cfg=cfg.loss)
                window_loss = loss.per_sample.sum() * share
            finite = bool(torch.isfinite(window_loss))
            stats["amp/nonfinite_losses"] += not finite
            if not finite and not (sharded or (ddp and last)):
                continue
            with record_function("step/backward"):
                amp.backward(window_loss)
        if not finite:
            continue
        if pred.latent_step is not None:  # how far the demos moved the prompt, and the learned step size
            loss.stats["latent/step_norm"] = pred.latent_step.detach().norm(dim=-1).mean()
            loss.stats["latent/step_lr"] = model.latent_step_size()
        for k, v in loss.stats.items():
            stats[k] = stats.get(k, 0.0) + v / len(window)
        infos.append(pred.rl)
        rewards.append(loss.reward)
    with record_function("step/optimizer"):
        result = amp.step(state.optimizer, cfg.optim.clip, watch={"qwen": model.parameter_groups()["qwen"]})
    stats["amp/stepped"] = float(result is not None and result.stepped)
    if result is not None:
        stats.update({"grad/norm": result.grad_norm, "grad/qwen_norm": result.group_norms["qwen"]})
    # The RL head learns after the main step, from detached tensors, with its own optimizer.
    if dist.sum_int(bool(infos)) == dist.world_size:
        info = RLInfo(torch.cat([x.head_input for x in infos]), torch.cat([x.action for x in infos]))
        with record_function("step/rl"):
            stats.update(model.rl_update(info, torch.cat(rewards), state.rl_optimizer, dist, state.rl_head))
    counters.optimizer_steps += 1
    counters.micro_batches += len(window)
    counters.micro_batches_in_epoch += len(window)
    counters.consecutive_skips = 0 if stats["amp/stepped"] else counters.consecutive_skips + 1
    return stats


# ----------------------------------------------------------------------------------------------
# The loop
# ----------------------------------------------------------------------------------------------


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
        result = evaluate(model, prompts, data.eval_set, cfg=cfg, device=device, dist=dist, tasks=tasks, stop=stop,
                          desc="evaluate")
        publish(result, state.counters.optimizer_steps, cfg, dist, logger)
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
    scores the rest of `--eval_tasks` (engine/validation_schedule.py says which) and logs `eval/*`,
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
            metrics = result.metrics
    state.model.set_rl_noise_state(noise)
    schedule.val_seconds += dist.from_main(time.perf_counter() - started)
    schedule.done += not final
    return metrics


def publish(result: EvalResult, step: int, cfg: Config, dist: Dist, logger: RunLogger | None) -> None:
    """The final scores: eval/* scalars and task images at `step`, and the submission file."""
    if logger is not None:
        logger.write(step, result.metrics)
        for task_id, image in result.images:
            logger.writer.add_image(f"eval_tasks/{task_id}", image, step, dataformats="HWC")
    if cfg.eval.submission and dist.is_main:
        path = Path(cfg.eval.submission)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(result.submission))
        tmp.replace(path)


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
        cfg = parse(argv, "fixed.py", __doc__.splitlines()[0])
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

"""Building the parts of a run: the data, the model with its optimizers and prompt cache, and a
run loaded for evaluation."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader

from data.arc import ArcSplits, ArcTask, DataError
from data.curriculum import CurriculumBatches
from data.episodes import (
    DifficultyScale,
    EpisodeDataset,
    collate,
    episode_difficulty,
    evaluation_episodes,
    training_episodes,
)
from data.sources import ReArcOptions, SyntheticOptions, load_splits
from engine.config import Config
from engine.distributed import Dist, data_parallel, is_sharded
from engine.fsdp import shard_model, unsharded_copy
from engine.loop import seed_everything
from engine.precision import MixedPrecision, check_master_weights
from evaluation.ttt_policy import of_size
from model import ArcModel, build_model
from prompt import QwenFeatures
from training.run_state import TrainState, restore_run_state


@dataclass
class TrainingData:
    splits: ArcSplits
    task_ids: list[str]  # the tasks training draws episodes from, a task embedding row each, in order (a RE-ARC
    # demo set is its task's: data.arc.ArcTask.family_id)
    sampler: CurriculumBatches  # yields this process's slice of each global batch
    loader: DataLoader
    eval_set: EpisodeDataset  # the evaluation tasks' test pairs; their outputs are read by the scorer only
    held_out: tuple[ArcTask, ...] = ()  # training tasks whose test pairs training never saw (--hold_out_tests)
    evaluation: str = ""  # the evaluation tasks eval_set holds, in words: "400", or --eval_size's "78 small of 400"

    def batches_in_epoch(self, max_batches: int) -> int:
        full = self.sampler.batches_per_epoch
        return min(full, max_batches) if max_batches else full


def build_data(cfg: Config, device: torch.device, dist: Dist = Dist()) -> TrainingData:
    """Load and validate every task (a bad file stops here, before anything is written)."""
    d = cfg.data
    synthetic = SyntheticOptions(seed=cfg.run.seed, rules=d.synthetic_families(True),
                                 eval_rules=d.synthetic_families(False), size=d.synthetic_sizes())
    re_arc = ReArcOptions(seed=cfg.run.seed, sets=d.re_arc_sets, demos=d.re_arc_demos)
    splits = load_splits(d.data, d.eval_data, d.allow_overlap, synthetic, drop_overlap=d.drop_overlap, re_arc=re_arc)
    tasks = splits.training
    held_out = tasks[:d.hold_out_tests]
    if held_out:  # their demos train; their test pairs are left for scoring what training generalises to
        tasks = tuple(replace(t, test=()) for t in held_out) + tasks[len(held_out):]
    if d.train_on_eval_demos:  # transductive: the evaluation tasks' demos only, never their test pairs
        tasks = tasks + tuple(ArcTask(t.task_id, t.train, ()) for t in splits.evaluation)
    train_eps = training_episodes(tasks)
    if not train_eps:
        raise DataError(f"--data {d.data}: the training tasks give no training episodes")
    scores = np.array([episode_difficulty(e) for e in train_eps])
    scale = DifficultyScale(scores)
    task_index = {t.task_id: i for i, t in enumerate(tasks)}
    # a task embedding row per task; RE-ARC's demo sets of a task share its row (one rule, one embedding)
    families = list(dict.fromkeys(t.family_id for t in tasks))
    row_of = {f: i for i, f in enumerate(families)}
    task_rows = {t.task_id: row_of[t.family_id] for t in tasks} if cfg.prompt.task_embedding else None
    train_set = EpisodeDataset(train_eps, scale, scores=scores, canvas=d.canvas, task_rows=task_rows)
    sampler = CurriculumBatches(is_easy=np.array([scale.is_easy(s) for s in scores]), batch_size=d.batch_size,
                                seed=cfg.run.seed, augment=d.augment, warmup_fraction=d.easy_warmup,
                                later_fraction=d.easy_later, augment_pool=d.augment_pool,
                                task_of=np.array([task_index[e.task.task_id] for e in train_eps]), rank=dist.rank,
                                world_size=dist.world_size, sides=train_set.sides, bucket=d.size_buckets)
    # The sampler runs here and decides every (episode, augmentation): workers only compute samples,
    # so any --num_workers gives the same batches (a worker set lives as long as the loader).
    loader = DataLoader(train_set, batch_sampler=sampler, collate_fn=collate, num_workers=d.num_workers,
                        persistent_workers=d.num_workers > 0, pin_memory=device.type == "cuda")
    # every evaluation task of --eval_size (validation picks which it scores); the canvas side of a test
    # input is predicted without its output
    evaluated = of_size(splits.evaluation, cfg.eval.eval_size)
    if not evaluated:
        raise DataError(f"--eval_size {cfg.eval.eval_size}: none of the {len(splits.evaluation)} evaluation tasks of "
                        f"{splits.name} is {cfg.eval.eval_size}")
    eval_set = EpisodeDataset(evaluation_episodes(evaluated), scale, canvas=d.canvas, fit_target=False,
                              task_rows=task_rows)
    every = len(splits.evaluation)
    evaluation = str(every) if len(evaluated) == every else f"{len(evaluated)} {cfg.eval.eval_size} of {every}"
    return TrainingData(splits, families, sampler, loader, eval_set, held_out, evaluation)


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
                      trained=trained, rl_head=rl_head, sharded=is_sharded(model))


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


def held_out_set(data: TrainingData) -> EpisodeDataset | None:
    """The test pairs training held out (--hold_out_tests) as an evaluation set shaped like the run's
    own (canvas, scale); None when it held none out."""
    if not data.held_out:
        return None
    e = data.eval_set
    return EpisodeDataset(evaluation_episodes(data.held_out), e.scale, canvas=e.canvas,
                          fit_target=False, task_rows=e.task_rows)


def prompt_cache_dir(cfg: Config, run_dir: Path) -> Path | None:
    if cfg.qwen.prompt_cache_dir == "none":
        return None
    return Path(cfg.qwen.prompt_cache_dir) if cfg.qwen.prompt_cache_dir else run_dir.parent / "prompt_cache"

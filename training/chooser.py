"""`--train_chooser`: the attempt chooser, trained on the test pairs a run held out, saved into its checkpoint.
Commands, and validating with the views and --enumerate it was trained with: docs/adaptation.md, "The attempt chooser".

1. Gather. The checkpoint adapts to and predicts the test inputs of the training tasks its run held
   out of training (--hold_out_tests), under the validation flags given (views, adaptation,
   --enumerate), and each input's candidates become feature rows (evaluation/choice.py) with a mark
   on the one that is the test output. Those outputs may be read: they are training tasks' pairs
   that training never saw (pairs it trained on would teach the chooser nothing), and no evaluation
   task is read at all. With --chooser_re_arc, RE-ARC's generated pairs of the held-out tasks join
   them (--chooser_queries a task): more inputs, at little more cost, as a task adapts once for all.
   Tasks are saved as they are gathered: a stopped stage resumes where it was.
2. Train. REINFORCE (policy_refined.AttemptChooser.update) over the inputs whose candidates hold the
   output. An input without it rewards every choice alike, so its gradient is zero in expectation:
   it would add only noise, and is left out. Cross-validated over the tasks first (`fit`): how the
   choice does on inputs of tasks the chooser did not train on, beside the votes.
3. Save: chooser.safetensors into the checkpoint folder, its checksum recorded with the others
   (its header records the views and --enumerate its candidates were made with).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from data.arc import ArcTask
from data.re_arc import held_out_queries, load_pools
from engine.checkpoint import CHECKSUMS_FILE, CHOOSER_FILE, add_to_checkpoint, find_checkpoint, load_state
from engine.config import SECTION_OF, Config
from engine.distributed import Dist
from engine.errors import ConfigError
from engine.loop import Interrupted, TrainingStopped
from evaluation.choice import FEATURES, AttemptChooser, candidate_features
from evaluation.evaluate import first_tasks, score_tasks
from evaluation.scoring import CANDIDATE_RANKINGS, Candidates, pick_two
from training.build import held_out_set, load_run, prompt_cache_dir

TASKS_A_SAVE = 4  # tasks gathered between two saves of what is gathered
CV_FOLDS = 5  # folds of the tasks the chooser's figures are cross-validated over
# validation flags that do not change a test input's candidates
NOT_GATHERED = {"eval_tasks", "submission", "attempt_ranking", "chooser_epochs", "chooser_lr", "chooser_votes_prior",
                "val_every", "val_tasks", "val_share"}

Gathered = dict[str, list[tuple[np.ndarray, np.ndarray]]]  # task id -> per test input (features [N, F], hits [N])


def gathered_file(checkpoint: Path) -> Path:
    """Where the candidates gathered for `checkpoint` are kept, beside it (never inside a checkpoint
    folder, and never named like one)."""
    return checkpoint.parent / f"chooser-candidates-{checkpoint.name}.pt"


def held_out_count(cfg: Config, checkpoint: Path) -> int:
    """The --hold_out_tests to gather with: the run's own, or fewer when asked; ConfigError when the
    run held none out, or when asked for pairs it trained on."""
    trained = load_state(checkpoint)["config"]
    held = trained.get("hold_out_tests", 0)
    if not held:
        raise ConfigError(f"--train_chooser: {checkpoint} was trained with --hold_out_tests 0: no training test pair "
                          f"is left unseen to train the chooser on; train with --hold_out_tests N")
    if cfg.data.hold_out_tests > held:
        raise ConfigError(f"--hold_out_tests {cfg.data.hold_out_tests}: the run held out only {held} tasks' test "
                          f"pairs; the chooser never learns from pairs the run trained on")
    if trained.get("data", cfg.data.data) != cfg.data.data:
        raise ConfigError(f"--data {cfg.data.data}: the run trained on {trained['data']}, whose first tasks are the "
                          f"held-out ones: give the run's --data")
    return cfg.data.hold_out_tests or held


def with_generated_queries(tasks: tuple[ArcTask, ...], cfg: Config) -> tuple[ArcTask, ...]:
    """The held-out tasks, each with --chooser_queries of RE-ARC's generated pairs of it added to its test
    pairs (a task RE-ARC lacks keeps its own). ConfigError when the run trained on RE-ARC (its generated
    pairs are then no longer unseen) or when RE-ARC holds none of the tasks."""
    path = cfg.eval.chooser_re_arc
    if any(source.startswith("re-arc:") for source in cfg.data.data.split(",")):
        raise ConfigError(f"--chooser_re_arc {path}: the run trained on RE-ARC (--data {cfg.data.data}): its generated "
                          f"pairs of the held-out tasks are not unseen; the chooser learns from the test pairs alone")
    pools = {pool.task_id: pool for pool in load_pools(path)}
    if not any(t.task_id in pools for t in tasks):
        raise ConfigError(f"--chooser_re_arc {path}: none of the {len(tasks)} held-out tasks (e.g. {tasks[0].task_id}) "
                          f"is a RE-ARC task: RE-ARC generates ARC-AGI-1's training tasks")
    return tuple(held_out_queries(pools[t.task_id], t, count=cfg.eval.chooser_queries, seed=cfg.run.seed)
                 if t.task_id in pools else t for t in tasks)


def gather(cfg: Config, device: torch.device, dist: Dist, stop, checkpoint: Path) -> Gathered:
    """Every held-out test input's candidate features and hits, resuming what was gathered with the
    same flags (see the module docstring)."""
    run_dir = checkpoint.parent.parent  # <run>/checkpoints/step_N (or <run>/marks/30min): the run's cache beside it
    data, state = load_run(cfg, checkpoint, device, dist, prompt_cache_dir(cfg, run_dir))
    held = held_out_set(data, with_generated_queries(data.held_out, cfg) if cfg.eval.chooser_re_arc else None)
    weights = {k: v for k, v in json.loads((checkpoint / CHECKSUMS_FILE).read_text()).items() if k != CHOOSER_FILE}
    key = {"weights": weights, "hold_out_tests": cfg.data.hold_out_tests,
           **{k: v for k, v in cfg.flags().items() if SECTION_OF[k] == "eval" and k not in NOT_GATHERED}}
    path = gathered_file(checkpoint)
    saved = torch.load(path, weights_only=False) if path.exists() else None
    tasks: Gathered = saved["tasks"] if saved is not None and saved["key"] == key else {}
    if saved is not None and not tasks:
        print(f"{path}: gathered under other flags or weights; gathering again", flush=True)
    todo = [t for t in first_tasks(held, 0) if t not in tasks]
    rows: Gathered = {}

    def keep(i: int, cands: Candidates) -> None:
        ep = held.episodes[i]  # a held-out training pair: its output may be read
        grids, features = candidate_features(cands, ep.task.train, ep.query.input)
        hits = np.array([g.shape == ep.query.output.shape and (g == ep.query.output).all() for g in grids])
        rows.setdefault(ep.task.task_id, []).append((features, hits))

    model, prompts = state.model, state.prompts
    bar = tqdm(total=len(first_tasks(held, 0)), initial=len(tasks), desc="gather candidates", unit="task",
               dynamic_ncols=True, disable=not dist.is_main)
    try:
        for start in range(0, len(todo), TASKS_A_SAVE):
            chunk = todo[start: start + TASKS_A_SAVE]
            score_tasks(model, prompts, held, chunk, cfg=cfg, device=device, dist=dist, stop=stop, on_candidates=keep)
            tasks.update({t: rows.pop(t, []) for t in chunk})
            tmp = path.with_name(path.name + ".tmp")
            torch.save({"key": key, "tasks": tasks}, tmp)
            os.replace(tmp, path)  # whole or not at all
            bar.update(len(chunk))
    finally:
        bar.close()
    return tasks


def _trained(sets: list[tuple[torch.Tensor, torch.Tensor]], cfg: Config, bar: tqdm) -> AttemptChooser:
    """A chooser trained from the seed by --chooser_epochs REINFORCE steps over `sets`."""
    torch.manual_seed(cfg.run.seed)
    chooser = AttemptChooser(FEATURES, votes_prior=cfg.eval.chooser_votes_prior)
    optimizer = torch.optim.Adam(chooser.parameters(), lr=cfg.eval.chooser_lr)
    generator = torch.Generator().manual_seed(cfg.run.seed)
    for _ in range(cfg.eval.chooser_epochs):
        figures = chooser.update(sets, optimizer, generator)
        bar.update()
        bar.set_postfix(reward=f"{figures['reward']:.2f}", baseline=f"{figures['baseline']:.2f}", refresh=False)
    return chooser.eval()


def _hits(chooser: AttemptChooser, sets: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """How many of `sets` the chooser's two best hold the output in."""
    return float(sum(h[list(chooser.best_two(f))].any().item() for f, h in sets))


def ranking_hits(sets: list[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, float]:
    """How many of `sets` the two attempts of votes, logprob and hedged (scoring.pick_two, the rule
    Candidates.attempts applies) hold the output in, read from the features: rows come in the votes'
    order, `logprob_rank` gives the other."""
    by_logprob = FEATURES.index("logprob_rank")
    out = dict.fromkeys(CANDIDATE_RANKINGS, 0.0)
    for f, h in sets:
        votes = list(range(len(h)))
        logprob = torch.argsort(f[:, by_logprob], descending=True, stable=True).tolist()
        for name in CANDIDATE_RANKINGS:
            out[name] += float(h[list(pick_two(name, votes, logprob))].any())
    return out


def fit(tasks: Gathered, cfg: Config) -> tuple[AttemptChooser, dict[str, float]]:
    """REINFORCE over the inputs whose candidates hold the output. -> (the chooser, trained on them all;
    figures: pass@2 on those inputs of the votes, logprob and hedged rankings, of the chooser on its own
    training inputs (`pass2_fit`), and of CV_FOLDS choosers each trained without every CV_FOLDS-th task
    in id order, on those tasks (`pass2_cv`, with inputs of two tasks at least: does the choice carry
    to unseen tasks?))."""
    positive = {t: [(torch.from_numpy(f), torch.from_numpy(h)) for f, h in rows if h.any()]
                for t, rows in sorted(tasks.items())}
    positive = {t: sets for t, sets in positive.items() if sets}
    inputs = sum(map(len, tasks.values()))
    if not positive:
        raise ConfigError(f"--train_chooser: none of the {inputs} held-out test inputs has its output among the "
                          f"candidates: nothing to learn a choice from (hold more tasks out, or train longer)")
    folds = min(CV_FOLDS, len(positive)) if len(positive) > 1 else 0
    names = list(positive)
    everything = [s for sets in positive.values() for s in sets]
    figures = {"chooser/inputs": float(inputs), "chooser/with_output": float(len(everything)),
               **{f"chooser/pass2_{k}": v / len(everything) for k, v in ranking_hits(everything).items()}}
    with tqdm(total=cfg.eval.chooser_epochs * (1 + folds), desc="train the chooser", unit="step",
              dynamic_ncols=True) as bar:
        if folds:
            held = 0.0
            for k in range(folds):
                train = [s for i, t in enumerate(names) if i % folds != k for s in positive[t]]
                test = [s for i, t in enumerate(names) if i % folds == k for s in positive[t]]
                held += _hits(_trained(train, cfg, bar), test)
            figures["chooser/pass2_cv"] = held / len(everything)
        chooser = _trained(everything, cfg, bar)
    return chooser, {**figures, "chooser/pass2_fit": _hits(chooser, everything) / len(everything)}


def train_chooser(cfg: Config, device: torch.device, dist: Dist, stop) -> dict:
    """The stage (module docstring). -> its summary: steps (the chooser's), seconds, the checkpoint it
    wrote into (as `run_dir`) and the figures."""
    if not cfg.run.resume:
        raise ConfigError("--train_chooser needs --resume: the checkpoint whose chooser it trains")
    if dist.world_size > 1:
        raise ConfigError("--train_chooser runs in one process (it gathers a few hundred test inputs): launch it "
                          "without torchrun or accelerate")
    started = time.time()
    checkpoint = find_checkpoint(cfg.run.resume)
    cfg = cfg.replace(hold_out_tests=held_out_count(cfg, checkpoint))
    try:
        tasks = gather(cfg, device, dist, stop, checkpoint)
    except Interrupted as err:
        raise TrainingStopped.by_signal(err.signum, f"while gathering candidates for the chooser; what was gathered "
                                                    f"is kept in {gathered_file(checkpoint)}: run the same command "
                                                    f"to go on") from None
    chooser, figures = fit(tasks, cfg)
    trained_on = {"checkpoint": str(checkpoint), "eval_augments": cfg.eval.eval_augments,
                  "enumerate": cfg.eval.enumerate, "enumerate_floor": cfg.eval.enumerate_floor, **figures}
    path = add_to_checkpoint(checkpoint, CHOOSER_FILE, lambda p: chooser.save(p, trained_on))
    unseen = (f", {figures['chooser/pass2_cv']:.1%} on tasks it did not train on (cross-validated)"
              if "chooser/pass2_cv" in figures else "")
    print(f"chooser: {figures['chooser/with_output']:.0f} of {figures['chooser/inputs']:.0f} held-out test inputs "
          f"have the output among their candidates; on them pass@2 by votes {figures['chooser/pass2_votes']:.1%}, "
          f"logprob {figures['chooser/pass2_logprob']:.1%}, hedged {figures['chooser/pass2_hedged']:.1%}; the chooser "
          f"{figures['chooser/pass2_fit']:.1%} on the inputs it trained on{unseen}; "
          f"saved {path}", flush=True)
    return {"steps": cfg.eval.chooser_epochs, "seconds": time.time() - started, "run_dir": str(checkpoint),
            **figures}

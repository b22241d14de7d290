"""bench/prompt_reading.py: a pair's prompt streams taken from another task, nothing else."""

import torch

import training
from bench import prompt_reading
from bench.prompt_reading import STREAMS, SwappedPrompt, donors
from evaluation.heldout import pair_losses, target_fitted
from tests.conftest import CPU
from tests.test_evaluation import eval_setup
from tests.test_heldout import ColourZeroAgent


def test_a_swap_takes_the_prompt_streams_of_another_task_and_keeps_the_query(small_cfg, tmp_path):
    cfg, state, eval_set = eval_setup(small_cfg, tmp_path)
    fitted = target_fitted(eval_set)
    donor = donors(fitted)
    assert all(fitted.episodes[i].task.task_id != fitted.episodes[j].task.task_id for i, j in enumerate(donor))
    swapped = SwappedPrompt(fitted, donor, STREAMS["all three"])
    for i in range(len(fitted)):
        own, other, got = fitted[(i, 0)], fitted[(donor[i], 0)], swapped[(i, 0)]
        assert torch.equal(got["input"], own["input"]) and torch.equal(got["target"], own["target"])
        assert torch.equal(got["relation"], other["relation"]) and got["demo_texts"] == other["demo_texts"]
    episodes = list(range(len(fitted)))
    losses = {name: pair_losses(state.model, state.prompts, SwappedPrompt(fitted, donor, fields), episodes, views=1,
                                cfg=cfg, device=CPU) for name, fields in STREAMS.items()}
    own = pair_losses(state.model, state.prompts, fitted, episodes, views=1, cfg=cfg, device=CPU)
    assert losses["all three"] != own, "the agent reads its prompt"
    state.model.agent = ColourZeroAgent()  # reads no prompt: every swap leaves the loss as it was
    blind = pair_losses(state.model, state.prompts, fitted, episodes, views=1, cfg=cfg, device=CPU)
    assert blind == pair_losses(state.model, state.prompts, swapped, episodes, views=1, cfg=cfg, device=CPU)


def test_the_bench_prints_each_swap_paired_with_the_pair_s_own_prompt(small_cfg, tmp_path, capsys):
    run = training.train(small_cfg(run_dir=str(tmp_path / "run"), max_batches=2, val_every="end", eval_tasks=1,
                                   ttt_steps=1, hold_out_tests=3), CPU)["run_dir"]
    prompt_reading.main([run])
    rows = [line.split("|")[1:-1] for line in capsys.readouterr().out.splitlines() if line.startswith("| ")][1:]
    assert len(rows) == 2 * (1 + len(STREAMS))
    assert all("(" in r[3] for r in rows if "own" not in r[1])

"""bench/recipe.py, the side-by-side table's bench, on the small ARC folder: a row trains, is scored
beside the untrained start, with its paired gain over it, and a rerun on the same folder scores the
run it finds without training it again; with --seeds each row runs once a seed and a last table gives
the mean and spread."""

import pytest

from bench.recipe import refuse_other_training
from tests.conftest import WARM_PYTHON, run_command

pytestmark = pytest.mark.usefixtures("warm_python")  # each bench a process of its own

SMALL = ("agent_channels=16", "prompt_dim=32", "batch_size=4", "ttt_steps=2", "ttt_small_steps=0")


COLUMNS = 14  # the first table's: row, seed, train min, steps, s/step, ARC loss, exact, pass@2, oracle, s/task,
#              held-out pairs' loss and pass@2, unseen pass@2 and s/task


def tables(stdout: str, row: str = "defaults") -> list[list[list[str]]]:
    """Each printed table's lines of `row`, each a list of its cells, table by table."""
    out: list[list[list[str]]] = []
    for line in stdout.splitlines():
        if line.startswith("| row "):
            out.append([])
        elif line.startswith(f"| {row} "):
            out[-1].append([c.strip() for c in line.strip("|").split("|")])
    return out


def bench(arc_folder, out, *args) -> str:
    """The bench's printed output."""
    sets = [a for s in (f"data={arc_folder}", *SMALL) for a in ("--set", s)]
    proc = run_command([*WARM_PYTHON, "-m", "bench.recipe", "--rows", "defaults", "--tasks", "1", "--held", "2",
                        "--unseen", "0", "--out", str(out), *sets, *args], timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


@pytest.mark.slow
def test_a_row_is_scored_beside_the_untrained_start_and_a_rerun_trains_nothing(arc_folder, tmp_path):
    out = bench(arc_folder, tmp_path, "--minutes", "0.02")
    (first,), gains = tables(out)
    assert len(first) == COLUMNS
    steps = first[3]
    assert int(steps.replace(",", "")) > 0
    assert first[11] != "-" and "(" in first[7], "held-out pairs scored, pass@2 with its interval"
    assert first[5] != "-" and first[10] != "-", "the held-out losses"
    assert len(gains) == 1 and all("(" in c for c in gains[0][3:]), "a paired gain with its interval"
    (untrained,) = tables(out, "untrained")[0]
    assert untrained[3] == "0" and untrained[5] != first[5], "weights as built"
    (again,) = tables(bench(arc_folder, tmp_path, "--minutes", "0.02", "--set", "eval_augments=2"))[0]
    assert again[3] == steps and again[9] != "-", "the run found is scored, not trained"
    # a run trained with other training flags is not this row's: refused in one line, not scored as it
    refuse_other_training(tmp_path / "defaults", {"agent_channels": 16, "eval_augments": 2, "num_workers": 1})
    with pytest.raises(SystemExit, match=r"defaults: trained with --agent_channels 16 \(here: 32\), --seed 0 "
                                         r"\(here: 1\): another --out, or remove it$"):
        refuse_other_training(tmp_path / "defaults", {"agent_channels": 32, "seed": 1, "eval_augments": 2})


@pytest.mark.slow
def test_seeds_run_each_row_once_a_seed_and_give_mean_and_spread(arc_folder, tmp_path):
    runs, gains, spread = tables(bench(arc_folder, tmp_path, "--minutes", "0.02", "--seeds", "2"))
    assert [row[1] for row in runs] == ["0", "1"] and [row[1] for row in gains] == ["0", "1"]
    assert runs[0][5] != runs[1][5], "two seeds, two runs"
    assert len(spread) == 1 and spread[0][2] == "2" and "(" in spread[0][3]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("defaults")) == ["defaults", "defaults-seed1"]


@pytest.mark.slow
def test_a_curve_keeps_a_checkpoint_at_each_mark_that_validation_can_name(arc_folder, tmp_path):
    # the marks 1.2 s and 6 s apart: a first step slower than the first mark (a loaded machine) still
    # leaves the second one steps to train
    rows = tables(bench(arc_folder, tmp_path, "--curve", "0.02,0.1", "--no_untrained"))[0]
    assert len(rows) == 2 and int(rows[1][3].replace(",", "")) > int(rows[0][3].replace(",", ""))
    from engine.checkpoint import find_checkpoint

    marks = tmp_path / "defaults" / "marks"
    assert sorted(p.name for p in marks.iterdir()) == ["0.02min", "0.1min"]
    assert find_checkpoint(str(marks / "0.02min")) == marks / "0.02min"  # intact, and a checkpoint folder


def test_a_start_validates_cheaply_whatever_its_rows_score_with(tmp_path, monkeypatch):
    """train_until's own final validation: no test-time training and one view, over a recipe's or
    --set's scoring flags (a recipe's 256 views and 240 steps a small task would cost the start's
    time for a validation the bench throws away); the rest of the flags are the row's."""
    from bench.recipe import train_until

    trained = []
    monkeypatch.setattr("training.train", lambda cfg, device: trained.append(cfg) or {"train_seconds": 6.0,
                                                                                     "steps": 3})
    flags = {"ttt_steps": 60, "ttt_small_steps": 240, "eval_augments": 256, "agent_channels": 16}
    (tmp_path / "run").mkdir()  # what the run makes
    assert train_until(0.5, tmp_path / "run", flags) == {"train_minutes": 0.1, "steps": 3}
    (cfg,) = trained
    assert (cfg.eval.ttt_steps, cfg.eval.ttt_small_steps, cfg.eval.eval_augments) == (0, 0, 1)
    assert cfg.agent.agent_channels == 16 and cfg.run.max_minutes == 0.5

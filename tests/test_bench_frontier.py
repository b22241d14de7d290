"""bench/frontier.py on the small ARC folder: each setting is scored from the untrained start and
trained ones, paired with the first setting of its start and with the untrained start at the same
setting; a longer start goes on from a shorter one; the rows are kept as they finish, so a rerun
scores only the rows it lacks; the picture draws each start's frontier."""

import json

import pytest
import torch

from bench.frontier import NOW, device_name, frontier, row_flags, row_name, same_row, start_stem, trained_start
from bench.recipe import LEDGER as RECIPE_LEDGER
from tests.conftest import WARM_PYTHON, run_command

pytestmark = pytest.mark.usefixtures("warm_python")  # each bench a process of its own

SMALL = ("agent_channels=16", "prompt_dim=32", "batch_size=4", "ttt_steps=3", "ttt_small_steps=3")


def rows(stdout: str) -> list[list[str]]:
    """The table's rows, each a list of its cells."""
    first = stdout.split("\neach start against")[0]
    return [[c.strip() for c in line.strip("|").split("|")] for line in first.splitlines()
            if line.startswith("| ") and not line.startswith("| start ")]


def across(stdout: str) -> list[list[str]]:
    """The second table's rows: each start against the untrained one at the same setting."""
    _, _, second = stdout.partition("\neach start against")
    return [[c.strip() for c in line.strip("|").split("|")] for line in second.splitlines()
            if line.startswith("| ") and not line.startswith("| setting ")]


def bench(arc_folder, out, *args) -> str:
    sets = [a for s in (f"data={arc_folder}", *SMALL) for a in ("--set", s)]
    proc = run_command([*WARM_PYTHON, "-m", "bench.frontier", "--tasks", "2", "--out", str(out), *sets, *args],
                       timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_the_frontier_keeps_the_points_no_cheaper_point_beats():
    assert frontier([(3.0, 0.1), (1.0, 0.05), (2.0, 0.04), (5.0, 0.2), (4.0, 0.2)]) == [(1.0, 0.05), (3.0, 0.1),
                                                                                      (4.0, 0.2)]


def test_a_kept_row_is_found_by_the_flags_it_sets_away_from_their_defaults():
    """A row kept before a flag joined the suite (the flag absent, or at its default) is the same row,
    but for a flag of BEFORE (read at the value such a row ran with); another value of any flag,
    another start or other tasks is not."""
    kept = {"start": "untrained", "tasks": 30,  # kept with the early stop off, its views flag at its default
            "flags": {"ttt_steps": 120, "ttt_lr": 1e-3, "ttt_check_every": 0, "ttt_stop_views": 8, "ttt_params": "all"}}
    asked = {"start": "untrained", "tasks": 30,  # a key names NOW's flags: here the size rule off
             "flags": {**NOW, "ttt_steps": 120, "ttt_lr": 1e-3, "ttt_dropout": 0.0, "ttt_small_steps": 0}}
    assert same_row(kept, asked)
    assert not same_row(kept, {**asked, "flags": {**asked["flags"], "ttt_dropout": 0.1}})
    assert not same_row(kept, {**asked, "tasks": 100}) and not same_row(kept, {**asked, "start": "trained"})
    assert not same_row(kept, {**asked, "flags": {**asked["flags"], "ttt_small_steps": 120}})  # ran without the rule
    stopped = {**kept, "flags": {"ttt_steps": 120, "ttt_lr": 1e-3}}  # kept under the early stop's default
    assert not same_row({**kept, "flags": {**kept["flags"], "ttt_stop_views": 1}}, asked)  # retired, off its default
    assert not same_row({**kept, "flags": {**kept["flags"], "ttt_params": "late"}}, asked)  # retired, not what runs
    assert not same_row(stopped, asked)


@pytest.mark.slow
def test_every_setting_is_scored_from_both_starts_paired_with_the_default_and_a_rerun_scores_only_what_is_new(
        arc_folder, tmp_path):
    out = bench(arc_folder, tmp_path, "--settings", "default,search", "--minutes", "0.02", "--svg",
                str(tmp_path / "f.svg"))
    table = rows(out)
    assert [(r[0].split()[0], r[1]) for r in table] == [("untrained", "default"), ("untrained", "search"),
                                                         ("defaults", "default"), ("defaults", "search")]
    default, search = table[0], table[1]
    assert float(default[2]) == 3.0 and default[3] == "24", "3 steps of 8 episodes a task"
    assert float(search[2]) == 0.0 and search[3] == "0", "the search alone trains nothing"
    assert "(" in default[5] and default[8] == "(the base)"
    assert "p =" in search[8] and "(" in search[9], "paired with the default: pass@2 with McNemar's p, the loss"
    assert table[0][7] != table[2][7], "the trained start's adapted loss is its own"
    assert [(r[0], r[1].split()[0]) for r in across(out)] == [("default", "defaults"), ("search", "defaults")]
    assert across(out)[0][3] == default[5] and "p =" in across(out)[0][4], "paired with the untrained start"
    svg = (tmp_path / "f.svg").read_text()
    assert svg.count("<polyline") == 2 and svg.count("<circle") == 4
    kept = json.loads((tmp_path / "frontier.json").read_text())
    assert len(kept) == 4
    again = bench(arc_folder, tmp_path, "--settings", "default,search,steps-30", "--minutes", "0.02")
    assert [r[1] for r in rows(again)] == ["default", "search", "steps-30"] * 2
    assert rows(again)[:2] == table[:2], "rows found in frontier.json are printed, not scored again"
    assert len(json.loads((tmp_path / "frontier.json").read_text())) == 6


@pytest.mark.slow
def test_a_longer_start_goes_on_from_the_shorter_one_and_the_first_setting_is_the_base(arc_folder, tmp_path):
    out = bench(arc_folder, tmp_path, "--settings", "search", "--minutes", "0.02,0.04", "--starts", "trained")
    table = rows(out)
    assert [r[1] for r in table] == ["search", "search"] and table[0][8] == "(the base)", "no default asked for"
    # the folders' names hash the --set flags that shape training (the data, the small sizes)
    (short_folder,), (long_folder,) = (list(tmp_path.glob(f"defaults+*-{m}min")) for m in ("0.02", "0.04"))
    shorter, longer = (json.loads((f / "recipe.json").read_text()) for f in (short_folder, long_folder))
    assert longer["steps"] > shorter["steps"] and longer["train_minutes"] > shorter["train_minutes"]
    assert (long_folder / "checkpoints").is_dir() and not list(tmp_path.glob("*.partial"))
    (row,) = across(out)
    assert row[0] == "search" and f"({longer['steps']:,} steps)" in row[1], "the longer start against the shorter"


def kept_pairs(out) -> tuple[list, list]:
    """The one row of `out`/frontier.json: its pass@2 and loss per test pair, in pair order."""
    (row,) = json.loads((out / "frontier.json").read_text())
    return sorted(row["pass2"]), sorted(row["loss"])


@pytest.mark.slow
def test_a_row_of_more_tasks_scores_only_the_tasks_a_row_of_fewer_lacks_and_scores_them_as_a_fresh_row(
        arc_folder, tmp_path):
    """Each row journals its tasks (one file a start and setting): the 3-task row reads the 2-task
    row's tasks back and scores the third alone, and its pairs are those of a 3-task row scored afresh."""
    alone = ("--starts", "untrained", "--minutes", "0", "--settings", "default", "--set", "adapt_tasks=1")
    bench(arc_folder, tmp_path / "grown", *alone)
    (journal,) = (tmp_path / "grown" / "journal").iterdir()
    tasks_in = lambda: [json.loads(line)["task"] for line in journal.read_text().splitlines()[1:]]  # noqa: E731
    first_two = tasks_in()
    assert len(first_two) == 2
    (tmp_path / "grown" / "frontier.json").unlink()  # the 3-task row is a new row anyway; one row to read
    bench(arc_folder, tmp_path / "grown", *alone, "--tasks", "3")
    assert tasks_in()[:2] == first_two and len(tasks_in()) == 3, "the first two tasks were read, not scored again"
    bench(arc_folder, tmp_path / "fresh", *alone, "--tasks", "3")
    assert kept_pairs(tmp_path / "grown") == kept_pairs(tmp_path / "fresh")


def test_a_recipe_sets_every_rows_flags_and_what_the_benchmark_sets_is_left_to_it(arc_folder, tmp_path):
    """--config: a recipe's flags join every row (under --set's); what the benchmark sets itself is
    left to it and said, and refused from --set."""
    recipe = tmp_path / "lean.toml"
    recipe.write_text("ttt_lr = 2e-3\nttt_batch_size = 4\nttt_steps = 9\nmax_minutes = 600\neval_tasks = 0\n")
    out = bench(arc_folder, tmp_path / "out", "--config", str(recipe), "--settings", "default", "--starts",
                "untrained", "--minutes", "0")
    assert f"--config {recipe}: eval_tasks, max_minutes left to the benchmark" in out
    assert rows(out)[0][3] == "12", "3 steps of the recipe's 4 episodes a task"
    (row,) = json.loads((tmp_path / "out" / "frontier.json").read_text())
    assert row["flags"]["ttt_lr"] == 2e-3 and row["flags"]["ttt_steps"] == 3  # --set's (SMALL) over the recipe's
    with pytest.raises(SystemExit, match="--set max_minutes: the benchmark sets it"):
        row_flags(str(recipe), ["max_minutes=1"])


def test_a_recipes_trained_start_is_named_by_it_and_goes_on_from_its_own_shorter_start(tmp_path, monkeypatch):
    """The trained start of `--config lean.toml` lives in lean-<minutes>min and grows from the longest
    shorter lean start, never from the defaults' or lean-big's (each holds enough training: nothing trains)."""
    monkeypatch.setattr("bench.recipe.refuse_other_training", lambda run_dir, flags: None)  # ledgers, no runs
    for name, steps in (("defaults-0.01min", 7), ("lean-0.01min", 5), ("lean-big-0.015min", 9)):
        (tmp_path / name).mkdir()
        (tmp_path / name / RECIPE_LEDGER).write_text(json.dumps({"train_minutes": 1.0, "steps": steps}))
    name, folder = trained_start(0.02, tmp_path, {}, "lean")
    assert folder == tmp_path / "lean-0.02min" and name == "lean 1 min (5 steps)"
    # under a cosine (drawn over the whole budget) a longer start is trained from the start, not resumed
    cosine = {"lr_schedule": "cosine"}
    shorter = tmp_path / f"{start_stem('fresh', cosine)}-0.01min"
    shorter.mkdir()
    (shorter / RECIPE_LEDGER).write_text(json.dumps({"train_minutes": 1.0, "steps": 5}))
    monkeypatch.setattr("bench.frontier.train_until", lambda minutes, folder, flags: {
        "train_minutes": minutes, "steps": len(list(folder.glob("*")))})
    assert trained_start(0.02, tmp_path, cosine, "fresh")[0] == "fresh 0 min (0 steps)"


def test_a_start_trained_with_other_flags_is_never_reused(tmp_path, monkeypatch):
    """A start's folder names the flags that shaped its training: --set data=... or a model flag
    gives a start of its own (the 15 minutes of the defaults are not the transductive start's), where
    a flag that cannot change what is learned (the device, a validation flag) keeps the start."""
    monkeypatch.setattr("bench.recipe.refuse_other_training", lambda run_dir, flags: None)  # a ledger, no run
    (tmp_path / "defaults-1min").mkdir()
    (tmp_path / "defaults-1min" / RECIPE_LEDGER).write_text(json.dumps({"train_minutes": 1.0, "steps": 7}))
    for same in ({}, {"num_workers": 2, "ttt_lr": 3e-3, "eval_augments": 32}):
        assert trained_start(1, tmp_path, same, "defaults") == ("defaults 1 min (7 steps)", tmp_path / "defaults-1min")
    stems = {start_stem("defaults", flags) for flags in ({"train_on_eval_demos": True}, {"agent_channels": 32},
                                                         {"agent_channels": 32, "ttt_lr": 3e-3}, {})}
    assert len(stems) == 3 and "defaults" in stems and all(s.startswith("defaults+") for s in stems - {"defaults"})


def test_a_row_measured_on_another_device_is_another_row():
    """Seconds a task on a CPU and on a GPU are not one row: a kept row (and its journal) is found
    again on its own device only; a row kept before devices were named is a CPU's."""
    cpu = {"start": "untrained", "flags": {**NOW, "ttt_steps": 3, "ttt_small_steps": 120}, "tasks": 2, "size": "all",
           "device": "cpu"}
    gpu = {**cpu, "device": "NVIDIA H200"}
    before = {k: v for k, v in cpu.items() if k != "device"}
    assert same_row(before, cpu) and same_row(cpu, cpu) and not same_row(cpu, gpu) and not same_row(before, gpu)
    assert row_name(before) == row_name(cpu) != row_name(gpu)
    assert device_name(torch.device("cpu")) == "cpu"

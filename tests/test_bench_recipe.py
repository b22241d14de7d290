"""bench/recipe.py, the side-by-side table's bench, on the small ARC folder: a row trains, is scored
at each number of views asked for, and a rerun on the same folder scores the run it finds without
training it again."""

import subprocess
import sys

import pytest

from tests.conftest import ROOT

SMALL = ("agent_channels=16", "prompt_dim=32", "batch_size=4", "ttt_steps=2")


def bench(arc_folder, out, *args) -> list[list[str]]:
    """The table's rows, each a list of its cells."""
    sets = [a for s in (f"data={arc_folder}", *SMALL) for a in ("--set", s)]
    proc = subprocess.run([sys.executable, "-m", "bench.recipe", "--rows", "defaults", "--tasks", "1", "--held", "2",
                           "--unseen", "0", "--out", str(out), *sets, *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [[c.strip() for c in line.strip("|").split("|")] for line in proc.stdout.splitlines()
            if line.startswith("| defaults")]


@pytest.mark.slow
def test_a_row_is_scored_at_each_view_count_and_a_rerun_trains_nothing(arc_folder, tmp_path):
    first = bench(arc_folder, tmp_path, "--minutes", "0.1", "--views", "1,3")
    assert [row[4] for row in first] == ["1", "3"]  # the views column
    steps = first[0][2]
    assert int(steps.replace(",", "")) > 0 and first[1][2] == steps, "one run, scored twice"
    assert all(row[9] != "-" for row in first), "held-out test pairs are scored"
    again = bench(arc_folder, tmp_path, "--minutes", "0.1", "--views", "2")
    assert len(again) == 1 and again[0][2] == steps and again[0][4] == "2", "the run found is scored, not trained"


@pytest.mark.slow
def test_a_curve_keeps_a_checkpoint_at_each_mark_that_validation_can_name(arc_folder, tmp_path):
    rows = bench(arc_folder, tmp_path, "--curve", "0.05,0.1")
    assert len(rows) == 2 and int(rows[1][2].replace(",", "")) > int(rows[0][2].replace(",", ""))
    from engine.checkpoint import find_checkpoint

    marks = tmp_path / "defaults" / "marks"
    assert sorted(p.name for p in marks.iterdir()) == ["0.05min", "0.1min"]
    assert find_checkpoint(str(marks / "0.05min")) == marks / "0.05min"  # intact, and a checkpoint folder

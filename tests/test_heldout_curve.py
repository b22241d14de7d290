"""bench/heldout_curve.py: the held-out loss a run's validations logged, as a table, a fitted power
law and a picture."""

import math
import xml.etree.ElementTree as ET

import training
from bench import heldout_curve
from tests.conftest import CPU


def test_the_fit_recovers_an_exact_power_law_and_leaves_out_step_zero():
    rows = [{"step": s, "eval": 2.0 * s ** -0.3} for s in (100, 200, 400, 800)] + [{"step": 0, "eval": 9.0}]
    f = heldout_curve.fit(rows)
    assert math.isclose(f["b"], 0.3, rel_tol=1e-9) and math.isclose(f["a"], 2.0, rel_tol=1e-9)
    assert math.isclose(f["b_lo"], f["b_hi"], abs_tol=1e-9)
    noisy = [{"step": r["step"], "eval": r["eval"] * (1.05 if i % 2 else 0.95)} for i, r in enumerate(rows[:4])]
    g = heldout_curve.fit(noisy)
    assert g["b_lo"] < 0.3 < g["b_hi"]
    assert heldout_curve.fit(rows[:2]) is None


def test_a_run_and_its_untrained_start_make_a_table_and_a_picture(small_cfg, tmp_path, capsys):
    run = training.train(small_cfg(run_dir=str(tmp_path / "run"), max_batches=4, val_every="2", val_share=1e9,
                                   val_tasks=1, eval_tasks=1, ttt_steps=1, hold_out_tests=3), CPU)["run_dir"]
    start = tmp_path / "untrained"
    training.main(["--eval_only", "--run_dir", str(start), "--data", str(small_cfg().data.data), "--eval_tasks", "1",
                   "--ttt_steps", "1", "--ttt_small_steps", "0",
                   "--agent_channels", "16", "--prompt_dim", "32", "--hold_out_tests", "3"])
    picture = tmp_path / "curve.svg"
    heldout_curve.main([run, "--untrained", str(start), "--svg", str(picture)])
    out = capsys.readouterr().out
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| run ")][1:]  # the header first
    assert [r[1].strip() for r in rows] == ["0", "2", "4"]  # the untrained start, then each validation
    assert all("(" in r[3] and "(" in r[4] for r in rows), "both held-out losses with their intervals"
    ET.parse(picture)  # well-formed
    assert picture.read_text().count("<polyline") >= 3

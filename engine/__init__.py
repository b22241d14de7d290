"""The ground the model and the loop stand on: flags (config), mixed precision, several processes
(distributed, fsdp), checkpoint files, learning-rate schedules, the loop's plumbing and logging.
Nothing here imports the model, evaluation or training (tests/test_imports.py)."""

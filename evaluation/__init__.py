"""The evaluation side, above the model: validation (evaluate.py), per-task adaptation
(adaptation.py), ARC's metrics and the ranking of attempts (scoring.py), task images (render.py),
and when a run validates (schedule.py)."""

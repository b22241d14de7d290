"""Training mechanics that are neither model nor orchestration: flags, mixed precision,
checkpoints, scoring, logging."""

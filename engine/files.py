"""Writing a file so that no reader ever sees half of it: summary.json (the mark of a finished
run), the submission, reports, a checkpoint's `latest`, the GPU check's report."""

from __future__ import annotations

import os
from pathlib import Path


def write_atomic(path: Path, text: str) -> None:
    """Write `text` to `path` through a temporary file beside it, flushed to disk and renamed over
    `path`: a reader, or a run killed meanwhile, finds the old file or the new one, never half of
    one. A write that fails leaves `path` as it was and no temporary file."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise

"""The check's report: `gpu_check.json` and `gpu_check.md` in the output folder, both rewritten
(atomically) as a section starts, after each of its cases and as it ends, so a check cut short
still leaves every finished case."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from engine.files import write_atomic


@dataclass
class Section:
    """One section's outcome: its rows (one dict each, the same keys), notes under its table, and
    the one-line error that ended it early (its rows so far are kept)."""

    name: str
    title: str
    rows: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    error: str | None = None
    seconds: float = 0.0
    finished: bool = False  # False while it runs, and in the report of a check stopped from outside

    @property
    def failed(self) -> bool:
        return self.error is not None or any(row.get("ok") is False for row in self.rows)


def one_line(err: BaseException) -> str:
    """`Type: first line of the message`: what a failing section records."""
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}".rstrip(": ")


def markdown_table(rows: list[dict]) -> list[str]:
    """Rows of dicts -> a Markdown table whose columns are every key, in first-seen order."""
    if not rows:
        return []
    columns = list(dict.fromkeys(k for row in rows for k in row))
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(row.get(c, "")) for c in columns) + " |" for row in rows]
    return lines


def _cell(value) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value).replace("|", "/")


class Report:
    def __init__(self, out: Path, header: dict):
        self.out, self.header, self.sections = out, header, []
        out.mkdir(parents=True, exist_ok=True)

    def add(self, section: Section) -> None:
        self.sections.append(section)
        self.write()

    def write(self) -> None:
        doc = {**self.header, "sections": [asdict(s) for s in self.sections]}
        write_atomic(self.out / "gpu_check.json", json.dumps(doc, indent=1) + "\n")
        lines = [f"# GPU check: {self.header['device']}", "",
                 ", ".join(f"{k} {v}" for k, v in self.header.items() if k != "device"), ""]
        for s in self.sections:
            lines += [f"## {s.title} ({f'{s.seconds:.0f} s' if s.finished else 'unfinished'})", ""]
            lines += markdown_table(s.rows)
            lines += [""] + [f"{note}  " for note in s.notes]
            if s.error:
                lines.append(f"**failed:** {s.error}")
            lines.append("")
        write_atomic(self.out / "gpu_check.md", "\n".join(lines))



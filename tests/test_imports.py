"""One direction of imports: each part of the suite imports only from its own floor or below, so a
reader can learn it from the ground up (the ground knows nothing of the model, the model nothing
of evaluation or training), and nothing imports fixed.py, the entry point. Type-only imports count
too: there is no cycle to hide."""

import ast
import importlib
import re

import pytest

from engine.config import Config
from tests.conftest import ROOT

# floor of each part, lowest first; a module may import from its own floor and those below
FLOORS = {
    "data": 0,  # ARC tasks, canvases, features, episodes
    "engine": 1,  # flags, precision, processes, checkpoints, the loop's plumbing
    "agents": 2, "loss_function": 2,  # the grid agents and their adapters; the loss
    "prompt": 3, "policy_refined": 3, "model": 3,  # the model
    "evaluation": 4,  # validation, per-task adaptation, scoring
    "training": 5,  # building a run, the step, the loop
    "fixed": 6, "bench": 6,  # the entry point and the benchmarks
}


def modules():
    for path in sorted(ROOT.rglob("*.py")):
        part = path.relative_to(ROOT).parts[0].removesuffix(".py")
        if part in FLOORS:
            yield path, part


def imported(tree: ast.Module):
    """Top-level parts this module imports, anywhere in it (type-only imports too)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module.split(".")[0]


def test_every_module_imports_only_from_its_floor_or_below():
    upward = [f"{path.relative_to(ROOT)} imports {name} (floor {FLOORS[name]} above {FLOORS[part]})"
              for path, part in modules() for name in imported(ast.parse(path.read_text()))
              if name in FLOORS and FLOORS[name] > FLOORS[part]]
    assert not upward, "\n".join(upward)


@pytest.mark.parametrize("folder", ["tests", "bench", "training", "evaluation", "engine"])
def test_nothing_imports_the_entry_point(folder):
    for path in (ROOT / folder).rglob("*.py"):
        assert "fixed" not in set(imported(ast.parse(path.read_text()))), path


def test_only_the_registry_names_the_agents():
    """A new agent is one file and one registry line: no module outside agents/ names an agent
    (the flags hold only the default's name), and no agent names another."""
    from agents import AGENTS

    default = Config().agent.agent
    for path, part in modules():
        text = path.read_text()
        inside = path.parent == ROOT / "agents"
        for name, cls in AGENTS.items():
            own = inside and path.stem == cls.__module__.split(".")[-1]
            if part == "bench" or own or path.name == "__init__.py" and inside:
                continue
            named = re.findall(rf"[\"']{name}[\"']", text)
            allowed = 1 if name == default and path == ROOT / "engine" / "config.py" else 0
            assert len(named) <= allowed, f"{path.relative_to(ROOT)} names the agent {name!r}"


def test_no_function_of_the_core_runs_over_60_lines():
    """The core (every part but bench/ and tests/) reads in an afternoon: a function longer than 60
    lines is split where its steps are (docstring and comments count)."""
    long = []
    for path, part in modules():
        if part == "bench":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 60:
                long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} "
                            f"({node.end_lineno - node.lineno + 1} lines)")
    assert not long, long


@pytest.mark.parametrize("module", sorted(".".join(p.relative_to(ROOT).with_suffix("").parts)
                                          for p in (ROOT / "bench").rglob("*.py") if p.stem != "__init__"))
def test_every_benchmark_imports(module):
    """A benchmark no test runs still imports: a name moved out of the module it imports from fails here;
    and the summary its --help prints (its docstring's first paragraph) is whole sentences."""
    summary = (importlib.import_module(module).__doc__ or "").split("\n\n")[0].strip()
    assert summary.endswith((".", "?")), f"{module}'s --help would end mid-sentence: ...{summary[-60:]!r}"

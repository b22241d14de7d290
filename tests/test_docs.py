"""Every reference between the docs and the tests points at something that exists, and `make test`'s numeric
reruns (Makefile) reach every numeric test."""

import os
import re

import pytest
import torch

from tests import conftest
from tests.conftest import ROOT

INVARIANTS = ROOT / "docs" / "invariants.md"


def test_every_test_named_by_the_invariants_page_exists():
    text = INVARIANTS.read_text()
    named = 0
    for block in re.findall(r"\*\*Tests\.\*\*(.*?)(?:\n\n|\Z)", text, flags=re.S):
        current = None
        for ref in re.findall(r"`([\w./]*?(?:\.py)?(?:::\w+)?)`", block):
            file, _, test = ref.partition("::")
            current = file or current
            assert (ROOT / "tests" / current).is_file(), ref
            source = (ROOT / "tests" / current).read_text()
            if test:
                assert re.search(rf"^def {test}\(", source, flags=re.M), f"{current}::{test} is not a test"
                named += 1
    assert named >= 20


def test_every_invariant_a_test_cites_is_on_the_page():
    headings = set(re.findall(r"^## (\d+)\. ", INVARIANTS.read_text(), flags=re.M))
    cited = {n for f in (ROOT / "tests").glob("*.py") for n in re.findall(r"docs/invariants\.md #(\d+)", f.read_text())}
    assert cited and cited <= headings, cited - headings


def test_the_numeric_reruns_collect_every_file_holding_a_numeric_test(request):
    """`make test` runs the -m numeric tests again under other kernels, collecting only the files
    `grep -lw numeric` names (Makefile, NUMERIC): a file whose numeric tests it did not name would
    not run there. Read from this pytest run's collected tests, whatever marked them."""
    makefile = (ROOT / "Makefile").read_text()
    assert "-m numeric -q $$(grep -lw numeric tests/test_*.py)" in makefile
    files = {item.path for item in request.session.items if item.get_closest_marker("numeric")}
    if not files:
        pytest.skip("no numeric test collected in this pytest run")
    unnamed = [f.name for f in files if not (f.parent == ROOT / "tests" and f.name.startswith("test_")
                                            and re.search(r"\bnumeric\b", f.read_text()))]
    assert not unnamed, f"numeric tests in files the reruns do not collect: {unnamed}"


def test_the_numeric_reruns_skip_the_kernels_the_suite_ran_on(request, monkeypatch):
    """A rerun under this machine's own kernels (the suite's: torch's pick when not told) ends before
    collecting; under any other it runs."""
    if "ATEN_CPU_CAPABILITY" not in os.environ:
        assert conftest.own_kernels() == torch.backends.cpu.get_cpu_capability().lower()
    monkeypatch.setenv("SUITE_NUMERIC_RERUN", "1")
    for kernels in ("avx512", "avx2", "default"):
        monkeypatch.setenv("ATEN_CPU_CAPABILITY", kernels)
        if kernels == conftest.own_kernels():
            with pytest.raises(pytest.exit.Exception, match="this machine's own"):
                conftest.pytest_configure(request.config)
        else:
            assert conftest.pytest_configure(request.config) is None

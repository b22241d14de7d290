"""What requirements.txt promises: its ranges admit the versions CI tests (constraints.txt), and
torch's floor is no older than the newest torch API the suite calls.

torch's floor cannot be installed here (no CUDA-free wheel of an old torch on this machine), so the
floor is held to the release that brought in each API the suite uses, from torch's release notes;
a new call into torch goes into NEWEST_TORCH_APIS, and the table must follow the code."""

import re

from packaging.requirements import Requirement
from packaging.version import Version

from tests.conftest import ROOT

# API -> the torch release that made it public (torch's release notes), for the APIs whose release
# sets the floor; every one must still be called by the suite (checked below).
NEWEST_TORCH_APIS = {
    "torch.nn.utils.get_total_norm": "2.6",  # engine/precision.py: gradient norms of sharded gradients
    "from torch.distributed.fsdp import FSDPModule": "2.6",  # FSDP2 in its public module (it was _composable)
    "from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard": "2.6",
    "from torch.distributed.tensor import DTensor": "2.5",  # DTensor public (it was torch.distributed._tensor)
    "fused=True": "2.4",  # fused Adam/AdamW on the CPU
}
SUITE = ["agents", "data", "engine", "evaluation", "training", "prompt", "model.py", "policy_refined.py",
         "loss_function.py"]


def requirements(name: str) -> dict[str, Requirement]:
    lines = (ROOT / name).read_text().splitlines()
    reqs = [Requirement(line.split("#")[0]) for line in lines if line.split("#")[0].strip() and
            not line.startswith("-r")]
    return {r.name.lower(): r for r in reqs}


def pins() -> dict[str, Version]:
    found = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==")
            found[name.strip().lower()] = Version(version.strip())
    return found


def test_every_range_admits_the_tested_pin():
    pinned = pins()
    for file in ("requirements.txt", "requirements-dev.txt"):
        for name, req in requirements(file).items():
            assert name in pinned, f"{file}: {name} has no tested version in constraints.txt"
            assert req.specifier.contains(pinned[name]), f"{file}: {req} does not admit the tested {pinned[name]}"


def test_the_torch_floor_is_the_release_of_the_newest_api_the_suite_calls():
    floor = min(Version(s.version) for s in requirements("requirements.txt")["torch"].specifier
                if s.operator == ">=")
    code = "\n".join(p.read_text() for part in SUITE for p in
                     ((ROOT / part).rglob("*.py") if (ROOT / part).is_dir() else [ROOT / part]))
    for api, release in NEWEST_TORCH_APIS.items():
        assert api in code, f"{api} is no longer called: drop it from NEWEST_TORCH_APIS (and maybe the floor)"
        assert floor >= Version(release), f"requirements.txt: torch>={floor}, but {api} is new in torch {release}"
    assert floor == max(Version(v) for v in NEWEST_TORCH_APIS.values()), "the floor is higher than any API needs"
    assert re.search(r"^torch>=[\d.]+,<3$", (ROOT / "requirements.txt").read_text(), flags=re.M)

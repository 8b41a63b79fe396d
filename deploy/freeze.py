"""Print exact pins of the job's runtime dependencies as installed in this environment.

Why: the launcher builds and pickles the job's graph, the workers unpickle and run it,
so both images must hold the same versions of Beam, numpy, pyarrow, protobuf, pydantic,
... as the environment the tests passed in. Both Dockerfiles install with
``-c constraints.txt -c deploy/constraints.txt``. torch is left out: constraints.txt
pins its version, and the build differs (CPU launcher, CUDA workers).

    python deploy/freeze.py > deploy/constraints.txt
"""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

import tomllib
from packaging.requirements import Requirement

# The job's own dependencies (from pyproject.toml: the installed metadata can be stale)
# and the Dataflow client it launches with.
PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
ROOTS = [*tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"],
         "google-cloud-dataflow-client", "google-cloud-storage", "google-auth"]


def _name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(roots: list[str]) -> dict[str, str]:
    """name -> installed version of the roots and everything they require (no extras)."""
    seen: dict[str, str] = {}
    todo = [_name(Requirement(r).name) for r in roots]
    while todo:
        name = todo.pop()
        if name in seen or name == "torch":  # torch's own dependencies follow its build
            continue
        dist = metadata.distribution(name)
        seen[name] = dist.version
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(_name(req.name))
    return seen


if __name__ == "__main__":
    print(__doc__.split("\n\n")[0].replace("Print e", "# E", 1))
    print("# Regenerate: python deploy/freeze.py > deploy/constraints.txt")
    for name, version in sorted(closure(ROOTS).items()):
        print(f"{name}=={version}")

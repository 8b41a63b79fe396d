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

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
PROJECT = tomllib.loads(PYPROJECT.read_text())["project"]


def _name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(extra: str) -> list[str]:
    """The package's requirements with ``extra`` installed: the base dependencies and the
    extra's, with extras that name other extras (``tensordedup[job,tf]``) expanded."""
    optional = PROJECT["optional-dependencies"]
    out, todo, seen = list(PROJECT["dependencies"]), [extra], set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for line in optional[name]:
            req = Requirement(line)
            if _name(req.name) == "tensordedup":
                todo += sorted(req.extras)
            else:
                out.append(line)
    return out


# What the images install (the dataflow extra, from pyproject.toml: the installed metadata
# can be stale) and the Dataflow client the launcher uses (apache-beam[gcp]'s part of it).
ROOTS = [*requirements("dataflow"), "google-cloud-dataflow-client", "google-cloud-storage",
         "google-auth"]


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

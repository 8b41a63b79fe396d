"""The lean installs work: each training filter and kernel imports and runs with only what
its install set brings (pyproject's base dependencies plus its own extra).

How, inside the README's full environment: a child interpreter gets a ``sys.meta_path``
finder that makes every module unimportable whose distributions are all outside the set
(the requirement closure of the set, read from pyproject.toml and the installed
metadata): so Beam and pydantic always, TensorFlow for the torch filters, torch for the
tf.data filters, h5py, FAISS and matplotlib except where the set brings them. The child
checks that the blocker refuses the modules named above, then imports the module and
does a small real operation with it. scripts/bench_install.py installs the sets into
fresh venvs for real (docs/install.md); this test is what .ci/run runs every time.
"""

from __future__ import annotations

import functools
import json
import re
import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from packaging.requirements import Requirement

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[1]
ALWAYS = {"pip", "setuptools", "wheel", "tensordedup"}  # in every venv / the package itself


def canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@functools.cache
def project() -> tuple[list[str], dict[str, list[str]]]:
    p = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return p["dependencies"], p["optional-dependencies"]


def closure(extras: tuple[str, ...]) -> set[str]:
    """Distributions (canonical names) that ``pip install tensordedup[extras]`` brings, as
    resolved in this environment: the requirements and theirs, markers evaluated."""
    base, optional = project()
    todo = [Requirement(r) for r in base] + [Requirement(f"tensordedup[{','.join(extras)}]")]
    seen: set[tuple[str, frozenset]] = set()
    while todo:
        req = todo.pop()
        name = canon(req.name)
        if name == "tensordedup":
            todo += [Requirement(r) for e in req.extras for r in optional[e]]
            continue
        if (name, frozenset(req.extras)) in seen:
            continue
        seen.add((name, frozenset(req.extras)))
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        for line in dist.requires or []:
            r = Requirement(line)
            if r.marker is None or any(r.marker.evaluate({"extra": e})
                                       for e in ("", *req.extras)):
                todo.append(r)
    return {n for n, _ in seen} | ALWAYS


@functools.cache
def module_owners() -> dict[str, frozenset[str]]:
    """Import name (top level, and second level for namespace packages) -> the installed
    distributions with files there."""
    owners: dict[str, set[str]] = {}
    for dist in metadata.distributions():
        name = canon(dist.metadata["Name"])
        for f in dist.files or ():
            parts = f.parts
            if parts[0] in ("..", "bin") or parts[0].endswith((".dist-info", ".egg-info",
                                                                ".data", ".pth")):
                continue
            if len(parts) == 1:
                if f.name.endswith((".py", ".so")):
                    owners.setdefault(f.name.split(".")[0], set()).add(name)
                continue
            owners.setdefault(parts[0], set()).add(name)
            owners.setdefault(f"{parts[0]}.{parts[1].split('.')[0]}", set()).add(name)
    return {k: frozenset(v) for k, v in owners.items()}


def foreign_modules(allowed: set[str]) -> list[str]:
    """Import names that no distribution of ``allowed`` provides: what the lean install
    would not have."""
    owners = module_owners()
    blocked = {m for m, dists in owners.items() if not dists & allowed}
    # a blocked top level covers its submodules
    return sorted(m for m in blocked if "." not in m or m.split(".")[0] not in blocked)


CHILD = '''
import importlib.abc, json, sys

BLOCKED = {blocked!r}
MUST_FAIL = {must_fail!r}


class LeanInstall(importlib.abc.MetaPathFinder):
    """Refuses the modules a lean install would not have."""

    def find_spec(self, name, path=None, target=None):
        if name in BLOCKED or name.split(".")[0] in BLOCKED or \\
                ".".join(name.split(".")[:2]) in BLOCKED:
            raise ImportError(f"{{name}}: not in this install set (tests/test_lean_install.py)")
        return None


already = [m for m in MUST_FAIL if m in sys.modules]
assert not already, f"imported before the blocker: {{already}}"
sys.meta_path.insert(0, LeanInstall())
for name in MUST_FAIL:
    try:
        __import__(name)
    except ImportError:
        pass
    else:
        raise SystemExit(f"the blocker let {{name}} import")

{body}
loaded = sorted({{m.split(".")[0] for m in sys.modules}})
print(json.dumps(loaded))
'''

# what the lean paths must do without: always, and per set
NEVER = ["apache_beam", "pydantic", "yaml", "faiss", "matplotlib"]
SETS = {  # module: (extras of its install set, modules that must be unimportable)
    "filters.manifest": ((), NEVER + ["tensorflow", "torch", "h5py"]),
    "transforms.fingerprint": ((), NEVER + ["tensorflow", "torch", "h5py"]),
    "transforms.keys": ((), NEVER + ["tensorflow", "torch", "h5py"]),
    "filters.online": ((), NEVER + ["tensorflow", "torch", "h5py"]),
    "filters.torch": (("torch",), NEVER + ["tensorflow", "h5py"]),
    "filters.tf": (("tf",), NEVER + ["torch"]),
}


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> tuple[Path, list[str], list[int]]:
    """A finished run's report, as the job writes it (the parts a manifest reads)."""
    root = tmp_path_factory.mktemp("report")
    ids = [f"r{i}" for i in range(12)]
    removed, invalid = ["r2", "r5", "r9"], ["r7"]
    pq.write_table(pa.table({"record_id": removed, "kind": ["exact"] * 3}),
                   root / "duplicates.parquet")
    pq.write_table(pa.table({"record_id": invalid, "reason": ["crc"]}), root / "invalid.parquet")
    (root / "summary.json").write_text(json.dumps({
        "config": {"input": {"id": "id"}}, "working_dir": str(root),
        "files": [{"input": "in/part-0.parquet", "read": 12, "kept": 8}]}))
    kept = [i for i, r in enumerate(ids) if r not in removed + invalid]
    return root, ids, kept


BODIES = {
    "filters.manifest": '''
from filters.manifest import Manifest, ManifestError
for where in ({report!r}, {uri!r}):
    m = Manifest.load(where)
    assert m.kept_indices({ids!r}).tolist() == {kept!r}, m.kept_indices({ids!r})
try:  # a scheme pyarrow.fs does not know: Beam's filesystems might, but it is not here
    Manifest.load("nosuchscheme://bucket/report")
except ManifestError as e:
    assert "Beam, whose filesystems might, is not installed" in str(e), e
else:
    raise AssertionError("loaded a report from nowhere")
''',
    "transforms.fingerprint": '''
import numpy as np
from transforms.fingerprint import fingerprint, fingerprint_batch
x = np.arange(24, dtype=np.float32).reshape(6, 4)
x[3] = x[1]
d = fingerprint_batch(x)
assert len(d) == 6 and d[3] == d[1] and d[0] != d[1]
assert fingerprint(np.float32([0.0])) == fingerprint(np.float32([-0.0]))
''',
    "transforms.keys": '''
import numpy as np
from transforms.keys import TensorDict
t = TensorDict()
t[np.ones((2, 3), np.float32)] = "a"
assert t[np.ones((2, 3), np.float32)] == "a" and len(t) == 1
''',
    "filters.online": '''
import numpy as np
from filters.online import OnlineDedup
x = np.arange(20, dtype=np.float32).reshape(10, 2)
x[5] = x[0]
for dedup in (OnlineDedup(), OnlineDedup(bloom=1e-3, bloom_capacity=100)):
    assert dedup.keep_mask(x).tolist() == [i != 5 for i in range(10)]
''',
    "filters.torch": '''
import torch
from filters.manifest import Manifest
from filters.torch import OnlineDedupDataset, keep_mask_on_device, manifest_sampler
from filters.online import OnlineDedup
sampler = manifest_sampler(Manifest.load({report!r}), {ids!r}, shuffle=True, seed=1)
assert sorted(sampler) == {kept!r}
batch = torch.tensor([[1.0, 2.0], [3.0, 4.0], [1.0, 2.0]])
assert keep_mask_on_device(batch).tolist() == [True, True, False]
rows = list(OnlineDedupDataset(list(batch), OnlineDedup()))
assert len(rows) == 2
''',
    "filters.tf": '''
import os
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"
import tensorflow as tf
from filters.manifest import Manifest
from filters.online import OnlineDedup
from filters.tf import online_filter, skip_removed
ids = {ids!r}
x = tf.constant([[float(i % 5)] * 3 for i in range(len(ids))])
ds = tf.data.Dataset.from_tensor_slices({{"id": ids, "x": x}}).batch(4)
ds = ds.apply(skip_removed(Manifest.load({report!r}), "id", batched=True))
ds = ds.apply(online_filter(OnlineDedup(), "x", "id", batched=True))
got = [i.decode() for b in ds.as_numpy_iterator() for i in b["id"]]
assert got == ["r0", "r1", "r3", "r4"], got
''',
}


@pytest.mark.parametrize("module", list(SETS))
def test_lean_module_works_without_the_rest(module, report):
    extras, must_fail = SETS[module]
    allowed = closure(extras)
    # the install set itself is lean: pyproject does not pull what must be missing
    heavy = {"apache-beam", "pydantic", "faiss-cpu", "matplotlib",
             "tensorflow" if "tf" not in extras else "torch",
             "torch" if "torch" not in extras else "tensorflow"}
    assert not heavy & allowed, f"tensordedup[{','.join(extras)}] brings {heavy & allowed}"
    blocked = foreign_modules(allowed)
    assert set(must_fail) <= set(blocked) | {m for m in must_fail
                                             if m not in module_owners()}, must_fail

    root, ids, kept = report
    body = textwrap.dedent(BODIES[module]).format(report=str(root), uri=root.as_uri(),
                                                  ids=ids, kept=kept)
    source = CHILD.format(blocked=blocked, must_fail=must_fail, body=body)
    r = subprocess.run([sys.executable, "-c", source], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, f"{module} in tensordedup[{','.join(extras)}]:\n{r.stderr[-3000:]}"
    loaded = set(json.loads(r.stdout.strip().splitlines()[-1]))
    assert not loaded & set(must_fail)


def test_the_blocker_blocks(report):
    """The child fails when the module under test needs what is blocked (so the test
    above can fail): filters.tf with TensorFlow blocked, the manifest with pyarrow."""
    for module, blocked in (("filters.tf", ["tensorflow"]), ("filters.manifest", ["pyarrow"])):
        root, ids, kept = report
        body = textwrap.dedent(BODIES[module]).format(report=str(root), uri=root.as_uri(),
                                                      ids=ids, kept=kept)
        r = subprocess.run([sys.executable, "-c", CHILD.format(
            blocked=blocked, must_fail=blocked, body=body)], cwd=ROOT, capture_output=True,
            text=True, timeout=300)
        assert r.returncode != 0 and "not in this install set" in r.stderr, r.stderr[-2000:]


def test_lean_sets_in_pyproject():
    """The extras the README names exist, `all` is everything the README's install
    gives, and the job's set holds neither training framework."""
    _, optional = project()
    assert {"job", "tf", "torch", "gpu", "dataflow", "dask", "all", "dev"} <= set(optional)
    everything = closure(("all",))
    assert {"apache-beam", "tensorflow", "torch", "pydantic", "faiss-cpu", "matplotlib",
            "h5py", "dask", "distributed"} <= everything
    assert not {"tensorflow", "torch"} & closure(("job",))
    assert all(canon(Requirement(r).name) != "apache-beam" for r in project()[0])

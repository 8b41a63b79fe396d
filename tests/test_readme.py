"""The README's code runs as written: every ```python block of README.md and docs/*.md.

What a python block may assume (write new blocks to this; they are picked up by
themselves):

- The blocks of one file run in the file's order in one fresh Python interpreter, one
  namespace, as if pasted into ``python`` one after another: a block may use what an
  earlier block of the same file defined, and nothing else (no names are injected, so
  define ``batch``, ``ds``, ``ids``... in the README itself).
- The working directory is a fresh copy of the checkout (tracked and untracked files that
  git does not ignore: ``configs/``, ``data/sample/``, ``scripts/``, the packages; no
  ``out/``), like a fresh clone after the README's install. ``python`` on PATH is this
  test's interpreter. Before any python block runs, the shell blocks of README.md marked

      <!-- run by tests/test_readme.py -->

  on the line before their fence have run there, in order (``bash -e``); so the sample
  job's outputs (``out/report``, ``out/clean``, ...) exist. A docs file may mark shell
  blocks the same way; they run in the same directory just before that file's python
  blocks. Other fenced blocks (bash, yaml, output) are documentation and never run.
- A python block that cannot run here (cloud credentials, a GPU, a package the install
  does not have, minutes of run time, a fragment quoted from another project) is marked
  on the line before its fence, with the reason (the marker is one line):

      <!-- not run by tests/test_readme.py: needs gs:// credentials -->

  Each marked block is reported as a skipped test with that reason; no other block is
  skipped. A marker that is not followed by a fence of the right kind fails the test.
- A top-level expression statement whose comment starts with ``True`` or ``False``
  (``fingerprint(a) == fingerprint(b)  # True: ...``) is checked to be that value.
- A block that raises fails its file's test; the message names FILE:LINE of the block and
  the traceback points at the markdown file's own lines.

``python tests/test_readme.py FILE.md`` runs one file's python blocks in the current
directory (what the test does in its prepared copy).
"""

from __future__ import annotations

import ast
import io
import os
import re
import shutil
import subprocess
import sys
import time
import tokenize
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FILES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
PYTHON = {"python", "py"}
SHELL = {"bash", "sh", "shell"}
RUN = re.compile(r"^<!--\s*run by tests/test_readme\.py\s*-->$")
NOT_RUN = re.compile(r"^<!--\s*not run by tests/test_readme\.py\s*:?\s*(?P<why>.*?)\s*-->$")
MARKER = re.compile(r"^<!--\s*(not )?run by tests/test_readme\.py")
FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})\s*(?P<lang>[^\s`]*)")
CLAIM = re.compile(r"#\s*(True|False)\b")
TIMEOUT_S = 600


@dataclass(frozen=True)
class Block:
    path: str  # relative to the checkout, e.g. "README.md"
    line: int  # 1-based line of the block's first code line
    end: int  # line of the closing fence
    lang: str
    code: str
    marker: str | None  # "run", "not run" or None
    why: str = ""  # the not-run reason

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"


def blocks(path: str, root: Path = ROOT) -> list[Block]:
    """The fenced code blocks of a markdown file, with the marker on the line before each
    (blank lines between the marker and the fence are allowed)."""
    lines = (root / path).read_text(encoding="utf-8").splitlines()
    out, i, previous = [], 0, ""
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            if lines[i].strip():
                previous = lines[i].strip()
            i += 1
            continue
        fence, indent = m["fence"], len(m["indent"])
        j = i + 1
        while j < len(lines) and not re.match(rf"^ {{0,3}}{fence[0]}{{{len(fence)},}}\s*$",
                                               lines[j]):
            j += 1
        code = "\n".join(ln[indent:] if not ln[:indent].strip() else ln
                         for ln in lines[i + 1:j])
        marker, why = None, ""
        if (nr := NOT_RUN.search(previous)) is not None:
            marker, why = "not run", nr["why"]
        elif RUN.search(previous):
            marker = "run"
        out.append(Block(path, i + 2, j + 1, m["lang"].lower(), code, marker, why))
        previous, i = "", j + 1
    return out


def markers(path: str, root: Path = ROOT) -> list[tuple[int, str]]:
    """(line, text) of every marker comment in a markdown file."""
    lines = (root / path).read_text(encoding="utf-8").splitlines()
    return [(k + 1, ln.strip()) for k, ln in enumerate(lines) if MARKER.match(ln.strip())]


# ------------------------------------------------------------------- in the subprocess


def _claim(value: object, expected: bool, where: str) -> None:
    if bool(value) is not expected:
        raise AssertionError(f"{where}: the comment says {expected}, the value is {value!r}")


def _compile(block: Block):
    """The block as code whose line numbers are the markdown file's; expression statements
    commented ``# True`` / ``# False`` become checks."""
    source = "\n" * (block.line - 1) + block.code + "\n"
    claims = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT and (c := CLAIM.match(tok.string)):
            claims[tok.start[0]] = c[1] == "True"
    tree = ast.parse(source, block.path)
    for k, node in enumerate(tree.body):
        if isinstance(node, ast.Expr) and node.end_lineno in claims:
            call = ast.Call(ast.Name("__readme_claim__", ast.Load()),
                            [node.value, ast.Constant(claims[node.end_lineno]),
                             ast.Constant(f"{block.path}:{node.lineno}")], [])
            tree.body[k] = ast.copy_location(ast.Expr(ast.copy_location(call, node)), node)
    return compile(ast.fix_missing_locations(tree), block.path, "exec")


def run_file(path: str) -> int:
    """Run one markdown file's python blocks in order, in this process and directory."""
    import traceback

    sys.path.insert(0, os.getcwd())  # as `python` started in the checkout
    namespace = {"__name__": "__main__", "__readme_claim__": _claim}
    for block in blocks(path, Path.cwd()):
        if block.lang not in PYTHON:
            continue
        if block.marker == "not run":
            print(f"--- {block.where}: not run ({block.why})", flush=True)
            continue
        print(f"--- {block.where} (lines {block.line}-{block.end - 1})", flush=True)
        start = time.perf_counter()
        try:
            exec(_compile(block), namespace)
        except BaseException as e:  # noqa: BLE001 (SystemExit from a block is a failure too)
            traceback.print_exc()
            print(f"FAILED: the python block at {block.where} (lines {block.line}-{block.end - 1})"
                  f": {type(e).__name__}: {e}", flush=True)
            return 1
        print(f"--- {block.where} ok in {time.perf_counter() - start:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run_file(sys.argv[1]))


# ------------------------------------------------------------------------- the tests

import pytest  # noqa: E402 (the subprocess above needs no pytest)


def _env() -> dict:
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    return env


def _tail(text: str, n: int = 6000) -> str:
    return text if len(text) <= n else "...\n" + text[-n:]


def _run_shell(block: Block, cwd: Path) -> None:
    r = subprocess.run(["bash", "-e", "-c", block.code], cwd=cwd, env=_env(),
                       capture_output=True, text=True, timeout=TIMEOUT_S)
    if r.returncode != 0:
        pytest.fail(f"the shell block at {block.where} (run by its marker) exited "
                    f"{r.returncode}:\n{_tail(r.stdout + r.stderr)}", pytrace=False)


def _setup(path: str, cwd: Path) -> None:
    for block in blocks(path, cwd):
        if block.marker == "run" and block.lang in SHELL:
            _run_shell(block, cwd)


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    """A copy of the checkout (files git does not ignore) with README.md's marked shell
    blocks run in it."""
    dest = tmp_path_factory.mktemp("readme") / "checkout"
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], cwd=ROOT, capture_output=True, check=True)
    for name in sorted(set(listed.stdout.decode().split("\0")) - {""}):
        src = ROOT / name
        if src.is_file():  # a tracked file deleted in the work tree is skipped
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    _setup("README.md", dest)
    return dest


def _runnable(path: str) -> bool:
    return any(b.lang in PYTHON and b.marker != "not run" for b in blocks(path))


@pytest.mark.parametrize("path", [p for p in FILES if _runnable(p)])
def test_python_blocks_run(checkout, path):
    """Every unmarked python block of the file runs, in order, in the prepared checkout."""
    if path != "README.md":
        _setup(path, checkout)
    r = subprocess.run([sys.executable, str(Path(__file__).resolve()), path], cwd=checkout,
                       env=_env(), capture_output=True, text=True, timeout=TIMEOUT_S)
    if r.returncode != 0:
        failed = re.findall(r"^FAILED: .*$", r.stdout, re.M)
        pytest.fail((failed[0] if failed else f"{path}: exit {r.returncode}") + "\n"
                    + _tail(r.stdout + r.stderr), pytrace=False)


NOT_RUN_BLOCKS = [b for p in FILES for b in blocks(p) if b.marker == "not run"]


@pytest.mark.parametrize("block", NOT_RUN_BLOCKS, ids=[b.where for b in NOT_RUN_BLOCKS])
def test_marked_not_run(block):
    """The blocks marked as not run, one skip each, with the marker's reason."""
    pytest.skip(f"{block.where}: {block.why}")


@pytest.mark.parametrize("path", FILES)
def test_markers_are_placed(path):
    """Each marker has a reason where it needs one and sits right before a block it can
    apply to (a marker on anything else would silently do nothing)."""
    attached = {b.line - 1: b for b in blocks(path)}  # fence line -> block
    lines = (ROOT / path).read_text(encoding="utf-8").splitlines()
    for line, text in markers(path):
        fence = next((k + 1 for k in range(line, len(lines)) if lines[k].strip()), None)
        block = attached.get(fence)
        if NOT_RUN.search(text):
            assert block is not None and block.lang in PYTHON, \
                f"{path}:{line}: a not-run marker must be right before a ```python block"
            assert block.why, f"{path}:{line}: say why the block is not run"
        else:
            assert RUN.search(text), f"{path}:{line}: unknown marker {text!r}"
            assert block is not None and block.lang in SHELL, \
                f"{path}:{line}: a run marker must be right before a ```bash block"

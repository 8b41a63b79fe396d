"""report/index.html in a real headless browser (Debian's Chromium): the page a run
writes loads from file:// without a JavaScript error or a console message, shows the
run's counts (its script computes the share removed), its largest groups and borderline
pairs with every tensor inline (images as thumbnails, vectors as sparklines), and filters
by record id from a link.

Chromium is required, not optional: without it this test fails and says how to install
it (``apt-get install -y chromium``; .ci/run does that)."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from pipeline import report_pick
from tests.jobkit import EXT, run_job, write_input

T = 0.5


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None and os.path.exists("/usr/bin/chromium"):
        path = "/usr/bin/chromium"
    if path is None:
        pytest.fail("Chromium is needed to test report/index.html in a real browser and is "
                    "not installed: run `apt-get install -y chromium` (Debian/Ubuntu, as root; "
                    ".ci/run does it), then rerun the tests")
    return path


def load(page: Path, fragment: str = "") -> tuple[str, list[str]]:
    """(the DOM after the page's scripts ran, console lines) of ``page`` in headless
    Chromium, from a file:// URL."""
    url = page.resolve().as_uri() + fragment
    r = subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu",
                        "--no-first-run", "--disable-extensions", "--enable-logging=stderr",
                        "--v=0", "--virtual-time-budget=3000", "--dump-dom", url],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    console = [line for line in r.stderr.splitlines() if ":CONSOLE" in line]
    return r.stdout, console


def digits(seed: int, n: int) -> np.ndarray:
    """n 8x8 uint8 images with strokes (digit-like), all different."""
    rng = np.random.default_rng(seed)
    img = np.zeros((n, 8, 8), np.float32)
    for i in range(n):
        for _ in range(3):
            r, c = rng.integers(1, 7, 2)
            img[i, r - 1:r + 2, c] += 6
            img[i, r, c - 1:c + 2] += 6
        img[i] += rng.uniform(0, 3, (8, 8))
    return img


def with_copies(x: np.ndarray, seed: int) -> np.ndarray:
    """x plus exact copies (one record copied 5 times: the largest group), near copies at
    L2 0.3 and decoys at L2 0.6, shuffled (the big group's copies stay last)."""
    rng = np.random.default_rng(seed)
    k = len(x) // 8
    unit = rng.normal(size=(2 * k, *x.shape[1:]))
    unit /= np.linalg.norm(unit.reshape(2 * k, -1), axis=1).reshape(-1, *[1] * (x.ndim - 1))
    src = x[rng.choice(len(x), 3 * k)]
    out = np.concatenate([x, src[:k], src[k:2 * k] + 0.3 * unit[:k],
                          src[2 * k:] + 0.6 * unit[k:]]).astype(np.float32)
    out = out[rng.permutation(len(out))]
    return np.concatenate([out, np.repeat(x[:1], 5, axis=0)])


CASES = {"hdf5-images": ("hdf5", digits(1, 160)),
         "parquet-vectors": ("parquet", np.random.default_rng(2).normal(size=(160, 24)))}


@pytest.fixture(scope="module", params=list(CASES))
def run(request, tmp_path_factory) -> tuple[Path, str]:
    fmt, x = CASES[request.param]
    tmp = tmp_path_factory.mktemp(request.param)
    x = with_copies(x.astype(np.float32), 3)
    for f, rows in enumerate(np.array_split(np.arange(len(x)), 2)):
        write_input(fmt, tmp / "in" / f"part-{f}.{EXT[fmt]}", [f"id-{f}-{i}" for i in rows],
                    x[rows], np.zeros(len(rows), int))
    assert run_job(tmp, fmt, str(tmp / "in" / f"*.{EXT[fmt]}"),
                   near={"metric": "l2", "threshold": T, "borderline_pairs": 20}) == 0
    return tmp / "out" / "report", request.param


def test_page_loads_and_shows_the_run(run):
    rep, case = run
    dom, console = load(rep / "index.html")
    assert console == [], console  # no JavaScript error, no console output at all
    root = re.search(r"<html[^>]*>", dom).group(0)  # what the page's scripts set on <html>
    assert root == '<html lang="en" data-ready="1">'  # no data-js-errors, no data-page-error
    summary = json.loads((rep / "summary.json").read_text())
    for key in ("read", "kept", "removed_exact", "removed_near", "invalid"):
        assert f'data-count="{key}">{summary[key]:,}<' in dom, key
    removed = sum(v for k, v in summary.items() if k.startswith("removed_"))
    share = f"{100 * removed / summary['read']:.1f}% removed ({removed:,} of {summary['read']:,})"
    assert f'id="removed-share">{share}<' in dom  # written by the page's script
    assert f'data-near="pairs within tolerance">{summary["near"]["pairs_within_tolerance"]:,}<' \
        in dom

    dups = pq.read_table(rep / "duplicates.parquet").to_pylist()
    sizes: dict[str, int] = {}
    for r in dups:
        sizes[r["group"]] = sizes.get(r["group"], 1) + 1
    shown = re.findall(r'<h3>group <code>(\w+)</code>: <span class="size">([\d,]+)</span>', dom)
    want = sorted(sizes.items(), key=lambda g: (-g[1], g[0]))[:report_pick.MAX_GROUPS]
    assert [(g, int(n.replace(",", ""))) for g, n in shown] == [(g[:12], n) for g, n in want]
    assert want[0][1] == 6  # the planted group: one record and its 5 copies

    pairs = dom.split('id="borderline"')[1]
    assert pairs.count('class="pair"') == 2 * report_pick.MAX_PAIRS  # inside and outside
    # every tensor shown is inline: images as PNG thumbnails, vectors as sparklines
    srcs = re.findall(r'src="([^"]*)"', dom)
    assert srcs and all(s.startswith("data:image/png;base64,") for s in srcs)
    assert "not read back" not in dom
    cards = dom.count('<figure class="rec')
    if case == "hdf5-images":
        assert dom.count('<img class="t"') == cards > 40
    else:
        assert dom.count('<svg class="spark"') == cards > 40 and '<img class="t"' not in dom
    assert dom.count('<img class="hist"') == 1


def test_page_filters_by_record_id_from_a_link(run):
    rep, _ = run
    dups = pq.read_table(rep / "duplicates.parquet").to_pylist()
    page = (rep / "index.html").read_text()
    blocks = re.findall(r'<div class="(group|pair)" data-ids="([^"]*)"', page)
    every = {i for _, ids in blocks for i in ids.split()}
    # an id on the page that is no part of another id (the filter matches parts of ids)
    target = next(r["record_id"] for r in dups if html.escape(r["record_id"]) in every
                  and not any(r["record_id"] in i for i in every - {r["record_id"]}))
    dom, console = load(rep / "index.html", f"#q={target}")
    assert console == [] and re.search(r"<html[^>]*>", dom).group(0) == (
        '<html lang="en" data-ready="1">')
    visible = re.findall(r'<div class="(group|pair)" data-ids="([^"]*)">', dom)
    hidden = re.findall(r'<div class="(group|pair) hidden" data-ids="([^"]*)">', dom)
    assert visible and hidden and len(visible) + len(hidden) == len(blocks)
    assert all(target in ids.split() for _, ids in visible)  # the blocks that show it
    assert not any(target in ids.split() for _, ids in hidden)


def test_largest_groups_are_the_biggest_with_ties_by_group_id():
    """The page's groups against a plain sort over every group: size descending, ties by
    id, among 50k groups (one of 3,000 members, many tied sizes), and each group's kept
    record the one its members name."""
    import pyarrow as pa

    rng = np.random.default_rng(3)
    sizes = np.concatenate([[3000], rng.integers(1, 6, 50_000)])
    groups = [f"g{rng.integers(1 << 40):012x}" for _ in sizes]
    rows = {"record_id": [], "duplicate_of": [], "kind": [], "distance": [],
            "duplicate_of_run": [], "file": [], "row": [], "duplicate_of_file": [],
            "duplicate_of_row": [], "group": []}
    pos = 0
    for g, m in zip(groups, sizes.tolist(), strict=True):
        keeper = pos
        for j in range(1, m + 1):
            for k, v in (("record_id", f"r{pos + j}"), ("duplicate_of", f"r{keeper}"),
                         ("kind", "exact"), ("distance", 0.0), ("duplicate_of_run", None),
                         ("file", 0), ("row", pos + j), ("duplicate_of_file", 0),
                         ("duplicate_of_row", keeper), ("group", g)):
                rows[k].append(v)
        pos += m + 1
    rows["distance"][:3000] = rng.uniform(0, 1, 3000).tolist()  # the big group: near
    rows["kind"][:3000] = ["near"] * 3000
    table = pa.table(rows)
    got = report_pick.largest_groups(table, k=10, members=4)
    far = np.argsort(-np.array(rows["distance"][:3000]), kind="stable")[:3]
    assert [m.id for m in got[0].members] == [rows["record_id"][i] for i in far]
    counts: dict[str, int] = {}
    for g in rows["group"]:
        counts[g] = counts.get(g, 0) + 1
    want = sorted(counts, key=lambda g: (-counts[g], g))[:10]
    assert [g.group for g in got] == want
    assert [g.size for g in got] == [counts[g] + 1 for g in want]
    starts = np.cumsum(np.concatenate([[0], sizes[:-1] + 1])).tolist()
    first = dict(zip(groups, starts, strict=True))
    assert all(g.kept.row == first[g.group] and len(g.members) == 3 for g in got)

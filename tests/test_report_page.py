"""report/index.html in a real headless browser (Debian's Chromium): the page a run
writes loads from file:// without a JavaScript error or a console message, shows the
run's counts (its script computes the share removed), its largest groups and borderline
pairs with every tensor inline (images as thumbnails, vectors as sparklines), and filters
by record id from a link.

Chromium is required, not optional: without it this test fails and says how to install
it (``apt-get install -y chromium``; .ci/run does that)."""

from __future__ import annotations

import csv
import glob
import html
import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.report import near as near_report
from pipeline.report import pick as report_pick
from pipeline.steps.near_grid import pair_histogram
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


def load(page: Path, fragment: str = "", width: int | None = None) -> tuple[str, list[str]]:
    """(the DOM after the page's scripts ran, console lines) of ``page`` in headless
    Chromium, from a file:// URL; ``width``: the window's, in CSS pixels."""
    url = page.resolve().as_uri() + fragment
    size = [f"--window-size={width},900"] if width else []
    r = subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu",
                        "--no-first-run", "--disable-extensions", "--enable-logging=stderr",
                        "--v=0", "--virtual-time-budget=3000", *size, "--dump-dom", url],
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

    # the job's way (pipeline.report.parts): sizes summed over pieces of the table (each
    # a file's rows), the top groups' rows trimmed per piece and merged in any order
    from pipeline.report.parts import DUPLICATES_SCHEMA, _PickRows, top_groups, trim

    table = table.cast(DUPLICATES_SCHEMA)

    removed = set(zip(rows["file"], rows["row"], strict=True))
    names_root = np.array([w not in removed for w in zip(
        rows["duplicate_of_file"], rows["duplicate_of_row"], strict=True)])
    cuts = [0, *np.sort(rng.choice(table.num_rows, 7, replace=False)).tolist(), table.num_rows]
    pieces = [(table.slice(a, b - a), names_root[a:b])
              for a, b in zip(cuts, cuts[1:], strict=False)]
    top = top_groups(np.unique(p.column("group").to_numpy(zero_copy_only=False).astype("S32"),
                               return_counts=True) for p, _ in pieces)
    fn = _PickRows()
    accs = []
    for piece, roots in pieces:
        mask = np.isin(piece.column("group").to_numpy(zero_copy_only=False), list(top))
        accs.append(fn.add_input(fn.create_accumulator(),
                                 trim(piece.filter(pa.array(mask)), roots[mask])))
    while len(accs) > 1:  # merged pairwise in a random order
        i, j = sorted(rng.choice(len(accs), 2, replace=False).tolist())
        accs.append(fn.merge_accumulators([accs.pop(j), accs.pop(i)]))
    picked = report_pick.largest_groups(report_pick.Pick(*fn.extract_output(accs[0]), top),
                                        k=10, members=4)

    def seen(groups):
        return [(g.group, g.size, g.kept, [m.id for m in g.members], [m.id for m in g.listed])
                for g in groups]
    assert seen(picked) == seen(got)


# ---------------------------------------------------------------------------- text records


def probe(page: Path, script: str, fragment: str = "", width: int = 1280) -> object:
    """What ``script`` leaves in ``window.probe`` (JSON), run in ``page`` in Chromium after
    the page's own scripts: a copy of the page with the script appended, in a folder
    beside the report (the page is self-contained). No JavaScript error on the way."""
    copy = page.parent.parent / "probe" / page.name
    copy.parent.mkdir(exist_ok=True)
    out = ("\nvar el = document.createElement('pre'); el.id = 'probe';"
           "el.textContent = JSON.stringify(window.probe); document.body.appendChild(el);")
    copy.write_text(page.read_text().replace("</body></html>",
                                             f"<script>{script}{out}</script></body></html>"))
    dom, console = load(copy, fragment, width)
    assert console == [] and "data-js-errors" not in re.search(r"<html[^>]*>", dom)[0], console
    return json.loads(html.unescape(re.search(r'<pre id="probe">(.*?)</pre>', dom, re.S)[1]))


def run_shown(command: str, folder: Path) -> list[dict]:
    """The rows a command the page shows prints as CSV, run by bash in ``folder`` with
    this interpreter's python3 first on PATH."""
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}
    r = subprocess.run(["bash", "-c", command], cwd=folder, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith('"record_id"'), r.stderr[-2000:]
    return list(csv.DictReader(io.StringIO(r.stdout)))


def paragraphs() -> tuple[list[str], list[str]]:
    """(ids, texts): the paragraphs of the LICENSE files the installed packages ship, one
    record each, ids by package, file and paragraph (40-70 characters, no spaces)."""
    site = os.path.dirname(os.path.dirname(np.__file__))
    ids, texts = [], []
    for d in sorted(glob.glob(os.path.join(site, "*.dist-info"))):
        for f in sorted(glob.glob(d + "/LICENSE*") + glob.glob(d + "/licenses/*")):
            try:
                text = Path(f).read_text(encoding="utf-8")
            except (UnicodeDecodeError, IsADirectoryError):
                continue
            for i, p in enumerate(re.split(r"\n\s*\n", text)):
                if p.strip():
                    ids.append(f"{os.path.basename(d)}/{os.path.basename(f)}#paragraph-{i}")
                    texts.append(p.strip())
    return ids, texts


@pytest.fixture(scope="module")
def texts(tmp_path_factory) -> Path:
    """Two snapshots of one corpus (the LICENSE paragraphs, each snapshot a Parquet file),
    exact dedup on the raw text: the MIT and BSD paragraphs make groups of 100+ records."""
    tmp = tmp_path_factory.mktemp("texts")
    ids, body = paragraphs()
    assert len(ids) > 2000
    (tmp / "in").mkdir()
    for snap in ("2024-06", "2025-01"):
        pq.write_table(pa.table({"id": [f"{snap}/{i}" for i in ids], "text": body}),
                       tmp / "in" / f"{snap}.parquet")
    assert run_job(tmp, "parquet", str(tmp / "in" / "*.parquet"),
                   input={"tensor": "text", "decode": "text"}) == 0
    return tmp / "out" / "report"


def groups_by_size(rep: Path) -> list[tuple[str, list[dict]]]:
    """Oracle: every group's removed records, the farthest first then by (file, row); the
    groups by size descending, ties by id."""
    members: dict[str, list[dict]] = {}
    for r in pq.read_table(rep / "duplicates.parquet").to_pylist():
        members.setdefault(r["group"], []).append(r)
    for rows in members.values():
        rows.sort(key=lambda r: (-r["distance"], r["file"], r["row"]))
    return sorted(members.items(), key=lambda g: (-len(g[1]), g[0]))


OPEN_MORE = """
window.probe = Array.from(document.querySelectorAll('div.group')).map(function (g) {
  var d = g.querySelector('details.more');
  var got = {group: g.querySelector('h3 code').textContent,
             cards: Array.from(g.querySelectorAll('figure.rec')).map(function (f) {
               return f.getAttribute('data-id'); })};
  if (!d) { return got; }
  var table = d.querySelector('table');
  got.closed = !d.open && !table.checkVisibility();  // a closed details' content is laid out
  d.querySelector('summary').click();  // what a reader does
  got.summary = d.querySelector('summary').textContent;
  got.rows = Array.from(d.querySelectorAll('tr[data-id]')).filter(function (r) {
    return r.checkVisibility() && r.getBoundingClientRect().height > 0;
  }).map(function (r) {
    return Array.from(r.cells).map(function (c) { return c.textContent; });
  });
  got.text = d.querySelector('p').textContent;
  got.cmd = d.querySelector('pre.cmd').textContent;
  return got;
});
"""


def test_more_in_a_group_opens_to_its_members(texts):
    """"+N more" opens (a click in Chromium) to the group's next removed records, by id,
    kind, survivor, file and row, in the page's order; a group larger than the page holds
    says how many are left out and gives the line that prints them all, which does."""
    rep = texts
    want = groups_by_size(rep)[:report_pick.MAX_GROUPS]
    got = probe(rep / "index.html", OPEN_MORE)
    assert [g["group"] for g in got] == [g[:12] for g, _ in want]
    cut = report_pick.MAX_MEMBERS - 1
    big = 0
    for g, (_, rows) in zip(got, want, strict=True):
        assert g["cards"][1:] == [r["record_id"] for r in rows[:cut]]
        rest = rows[cut:]
        if not rest:
            assert "rows" not in g
            continue
        listed = rest[:report_pick.MAX_LISTED]
        assert g["closed"] and g["summary"] == f"+{len(rest):,} more"
        assert g["rows"] == [[r["record_id"], r["kind"], r["duplicate_of"], str(r["file"]),
                              str(r["row"])] for r in listed]
        printed = run_shown(g["cmd"], rep)
        assert [r["record_id"] for r in printed] == [r["record_id"] for r in
                                                      sorted(rows, key=lambda r: (r["file"],
                                                                                  r["row"]))]
        if len(rest) > len(listed):
            big += 1
            assert f"the other {len(rest) - len(listed):,} are not on this page" in g["text"]
        else:
            assert f"all {len(rest):,}" in g["text"]
    assert big >= 1 and any(len(r) - cut <= report_pick.MAX_LISTED for _, r in want[:len(got)]
                            if len(r) > cut)
    # bounded: at most MAX_LISTED rows a group; and the same bytes from a rerun
    page = (rep / "index.html").read_bytes()
    assert page.count(b"<tr data-id=") <= report_pick.MAX_GROUPS * report_pick.MAX_LISTED
    again = rep.parent.parent / "again"
    again.mkdir()
    assert run_job(again, "parquet", str(rep.parent.parent / "in" / "*.parquet"),
                   input={"tensor": "text", "decode": "text"}) == 0
    assert (again / "out" / "report" / "index.html").read_bytes() == page


FIND_NOTICE = """
var box = document.getElementById('nomatch').getBoundingClientRect();
window.probe = {
  shown: !document.getElementById('nomatch').classList.contains('hidden') &&
         box.height > 0 && box.top < window.innerHeight,
  text: document.getElementById('nomatch').textContent,
  cmd: (document.querySelector('#nomatch pre.cmd') || {}).textContent,
  blocks: document.querySelectorAll('[data-ids]:not(.hidden)').length,
  rows: Array.from(document.querySelectorAll('tr.hit')).map(function (r) {
    return r.getAttribute('data-id'); })
};
"""


def test_a_link_to_an_id_not_on_the_page_says_how_to_look_it_up(texts):
    """index.html#q=<id> for a record the page does not hold: a notice in the first screen
    names it and gives the line that prints its rows of duplicates.parquet (where it was
    removed, and what was removed as its duplicate), which does; an id on the page only
    in a group's list opens that list at it; an id of no record prints a header only."""
    rep = texts
    dups = pq.read_table(rep / "duplicates.parquet").to_pylist()
    on_page = set(re.findall(r'data-id="([^"]*)"', (rep / "index.html").read_text()))
    on_page = {html.unescape(i) for i in on_page}
    removed = next(r["record_id"] for r in dups if r["record_id"] not in on_page)
    kept = next(r["duplicate_of"] for r in dups if r["duplicate_of"] not in on_page)
    nowhere = "2025-01/O'Brien notes/LICENSE \"draft\" #1"  # quotes, spaces, a hash
    for rid in (removed, kept, nowhere):
        got = probe(rep / "index.html", FIND_NOTICE, "#q=" + quote(rid, safe=""))
        assert got["shown"] and f"\u201c{rid}\u201d" in got["text"], got["text"]
        assert got["blocks"] == 0
        want = sorted(r["record_id"] for r in dups if rid in (r["record_id"], r["duplicate_of"]))
        assert sorted(r["record_id"] for r in run_shown(got["cmd"], rep)) == want
        assert bool(want) == (rid != nowhere)
    listed = re.findall(r'<tr data-id="([^"]*)">', (rep / "index.html").read_text())
    got = probe(rep / "index.html", FIND_NOTICE, "#q=" + quote(html.unescape(listed[-1])))
    assert not got["shown"] and got["blocks"] >= 1 and got["rows"] == [
        html.unescape(listed[-1])]


TEXT_CARDS = """
function box(r) { return [r.left, r.top, r.right, r.bottom]; }
window.probe = Array.from(document.querySelectorAll('figure.rec')).filter(function (f) {
  return f.querySelector('.text');
}).map(function (f) {
  var t = f.querySelector('.text'), range = document.createRange();
  range.selectNodeContents(t);
  return {id: f.getAttribute('data-id'), figure: box(f.getBoundingClientRect()),
          text: box(t.getBoundingClientRect()), scrolls: t.scrollHeight > t.clientHeight,
          caption: box(f.querySelector('figcaption').getBoundingClientRect()),
          ids: Array.from(f.querySelector('figcaption b').getClientRects()).map(box),
          lines: Array.from(range.getClientRects()).map(box)};
});
"""


@pytest.mark.parametrize("width", [1280, 600])
def test_text_cards_keep_the_record_id_clear_of_the_text(texts, width):
    """Every text card in Chromium: the id (long, wrapped) sits below the text with a
    visible gap, inside the card, and the text box ends between two lines, never across
    one (a line cut in half read as text running into the id)."""
    cards = probe(texts / "index.html", TEXT_CARDS, width=width)
    assert len(cards) >= 40 and sum(c["scrolls"] for c in cards) >= 10
    assert max(len(c["id"]) for c in cards) >= 60
    for c in cards:
        left, top, right, bottom = c["text"]
        assert c["caption"][1] >= bottom + 4, c
        for i in c["ids"]:
            assert i[1] >= bottom + 4 and c["figure"][0] <= i[0] and i[2] <= c["figure"][2], c
        assert c["figure"][0] <= left and right <= c["figure"][2]
        cut = [ln for ln in c["lines"] if ln[1] < bottom - 0.5 and ln[3] > bottom + 0.5]
        assert not cut, (c["id"], cut, bottom)


PAIR_DISTANCES = """
function box(r) { return [r.left, r.top, r.right, r.bottom]; }
window.probe = Array.from(document.querySelectorAll('div.pair')).map(function (p) {
  var d = p.querySelector('.dist'), range = document.createRange();
  range.selectNodeContents(d);
  return {dist: d.textContent, box: box(d.getBoundingClientRect()),
          clipped: d.scrollWidth > d.clientWidth, lines: range.getClientRects().length,
          card: box(p.querySelector('figure.rec').getBoundingClientRect())};
});
"""


@pytest.mark.parametrize("data", ["vectors", "texts"])
def test_borderline_distances_are_shown_whole_beside_their_cards(tmp_path, data):
    """Borderline pairs at tiny distances, in Chromium: each distance on one line, whole,
    its box ending before the pair's first card begins. In a column of 70 px a bold
    "0.0060925" (the shipped text sample's) ran under the first card and "9.0474e-07"
    broke after its "e-"."""
    if data == "vectors":
        x = near_copies(7)
        write_input("parquet", tmp_path / "in" / "v.parquet",
                    [f"r{i}" for i in range(len(x))], x, np.zeros(len(x), int))
        assert run_job(tmp_path, "parquet", str(tmp_path / "in" / "*.parquet"),
                       near={"metric": "l2", "threshold": 1e-6}) == 0
    else:
        r = subprocess.run([sys.executable, "-m", "pipeline.run", "--config",
                            "configs/dedupe-text.yaml", "--quiet",
                            "--set", f"output.path={tmp_path / 'out' / 'clean'}",
                            "--set", f"report={tmp_path / 'out' / 'report'}"],
                           cwd=Path(__file__).resolve().parents[1], capture_output=True,
                           text=True)
        assert r.returncode == 0, r.stderr
    pairs = probe(tmp_path / "out" / "report" / "index.html", PAIR_DISTANCES)
    assert len(pairs) >= 5 and max(len(p["dist"]) for p in pairs) >= 9
    for p in pairs:
        assert p["lines"] == 1 and not p["clipped"] and p["box"][2] <= p["card"][0], p


# ---------------------------------------------------------------------------- histogram


def near_copies(seed: int) -> np.ndarray:
    """1,500 vectors and 300 near copies at every scale from float round-off (1e-12) to
    well past a threshold (10): the distances a histogram of a real run spans."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(1500, 16))
    noise = rng.normal(size=(300, 16))
    noise /= np.linalg.norm(noise, axis=1, keepdims=True)
    return np.concatenate([x, x[rng.choice(1500, 300)]
                           + np.logspace(-12, 1, 300)[:, None] * noise])


@pytest.mark.parametrize("threshold", [1e-6, 1e-4, 0.05, 0.5, 3.0])
def test_histogram_tick_labels_stay_apart(threshold):
    """The near stage's histogram, drawn: along the x axes of both panels no two tick
    labels touch (on a range from 1e-12 up, "1e-05" and "0.0001" ran together), each
    label reads as its tick's value, at least 3 in each panel, the threshold one of the
    zoomed panel's."""
    x = near_copies(7)
    nn = np.full(len(x), np.inf)
    within, outside = [], []
    for a in range(0, len(x), 100):  # brute force, the differences themselves (no round-off)
        d = np.sqrt(((x[a:a + 100, None] - x[None]) ** 2).sum(-1))
        d[np.arange(len(d)), np.arange(a, a + len(d))] = np.inf
        nn[a:a + 100] = d.min(1)
        upper = d[np.arange(a, a + len(d))[:, None] < np.arange(len(x))]
        within.append(upper[upper <= threshold])
        outside.append(upper[(upper > threshold) & (upper < 2 * threshold)])
    within, outside = np.concatenate(within), np.concatenate(outside)
    hist = near_report.distance_histogram(nn, threshold, pair_histogram(within, threshold),
                                          np.sort(outside)[:200])
    assert hist["edges"][0] < 1e-10 and hist["pairs"]["n"] == len(within) > 0
    fig = near_report.histogram_figure(hist, "l2", "a note", len(within), 1)
    fig.canvas.draw()
    boxes = []
    for ax in fig.axes[:2]:
        shown = [(tick, label) for tick, label in zip(ax.get_xticks(), ax.get_xticklabels(),
                                                      strict=True)
                 if label.get_visible() and label.get_text()
                 and ax.get_xlim()[0] <= tick <= ax.get_xlim()[1]]
        names = [label.get_text() for _, label in shown]
        assert len(names) >= 3 and len(set(names)) == len(names), names
        for tick, label in shown:
            assert abs(float(label.get_text()) / tick - 1) < 0.006, (tick, label.get_text())
        boxes += [label.get_window_extent() for _, label in shown]
    assert any(abs(t / threshold - 1) < 1e-9 for t in fig.axes[1].get_xticks())
    boxes.sort(key=lambda b: b.x0)
    gaps = [b.x0 - a.x1 for a, b in zip(boxes[:-1], boxes[1:], strict=True)]
    assert min(gaps) >= 4, gaps


@pytest.mark.parametrize("top", [0, 1, 6, 40, 16_000, 3_000_000])
def test_count_axes_are_labelled_with_plain_counts(top):
    """A histogram's count axis, drawn: at least two labels inside the axis, each the
    count its tick stands for written as a number ("2", "1,000"), never "6 x 10^0" or
    "1e+05" (matplotlib's own, on the small samples a first run shows)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure()
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.bar([0, 1], [1, top])
    near_report.count_axis(ax, top)
    fig.canvas.draw()
    lo, hi = ax.get_ylim()
    shown = [(t, label.get_text()) for ticks, labels in (
        (ax.get_yticks(), ax.get_yticklabels()),
        (ax.get_yticks(minor=True), ax.get_yticklabels(minor=True)))
        for t, label in zip(ticks, labels, strict=True) if label.get_text() and lo <= t <= hi]
    assert len(shown) >= 2, shown
    for t, text in shown:
        assert re.fullmatch(r"\d{1,3}(,\d{3})*", text) and int(text.replace(",", "")) == t, text

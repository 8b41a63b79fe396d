"""report/index.html: one self-contained page to look at what a run removed.

Why a page: the Parquet reports say what was removed; whether the removals are right
is seen faster than read. The page shows the counts, the near stage's histogram, the
largest duplicate groups and the pairs just inside and just outside the tolerance,
with the tensors themselves: those that look like images (2-D, or 3-D with 1, 3 or 4
channels) as thumbnails, others as sparklines with their first values. Which records,
and their tensors (at most ``MAX_ROWS``, so the page stays small whatever the run's
size), come from ``report_pick``: taken by the clean copy from its pass over the
inputs, or read back from the input (and reference) files by (file, row).

Everything is inline (CSS, a little JavaScript, images as data: URIs): the page works
from a file:// URL, offline, copied anywhere. It is deterministic (no dates, no
output paths), so two runs of one input give the same bytes. Plain functions, no Beam.
"""

from __future__ import annotations

import base64
import difflib
import html
import json
import math
import os
import shlex
import struct
import zlib
from collections.abc import Iterable
from concurrent.futures import Future

import numpy as np
import pyarrow as pa

from pipeline.report.pick import READ_ROWS, Group, Pair, Rec, fetch, page_records
from transforms.io import layout
from transforms.near.recall import recall_line
from transforms.near.sets import word_keys

THUMB_PX = 72  # thumbnails' longer side on the page
MAX_IMAGE_PX = 128  # images larger than this are subsampled before encoding
SPARK_POINTS = 240  # values drawn per sparkline at most
TEXT_CHARS = 280  # characters of a text record shown

# ---------------------------------------------------------------------------- tensors


def png(img: np.ndarray) -> bytes:
    """uint8 (h, w) gray, (h, w, 3) RGB or (h, w, 4) RGBA -> PNG bytes (zlib, no deps)."""
    img = np.ascontiguousarray(img, np.uint8)
    h, w = img.shape[:2]
    color = {2: 0, 3: {3: 2, 4: 6}.get(img.shape[-1])}[img.ndim] if img.ndim in (2, 3) else None
    if color is None:
        raise ValueError(f"not an image: shape {img.shape}")
    raw = b"".join(b"\x00" + img[y].tobytes() for y in range(h))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, color, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def image_layout(shape: tuple[int, ...]) -> str | None:
    """"hw", "hwc" or "chw" for tensors that look like images, else None."""
    if len(shape) == 2 and min(shape) >= 2:
        return "hw"
    if len(shape) == 3:
        if shape[2] in (1, 3, 4) and min(shape[:2]) >= 2:
            return "hwc"
        if shape[0] in (1, 3, 4) and min(shape[1:]) >= 2:
            return "chw"
    return None


def _real(t: np.ndarray) -> np.ndarray:
    """Values as float64 for display (complex: magnitude)."""
    t = np.asarray(t)
    if t.dtype.kind == "c":
        t = np.abs(t)
    return t.astype(np.float64)


def _as_image(t: np.ndarray, layout: str, lo: float, hi: float) -> np.ndarray:
    x = _real(t)
    if layout == "chw":
        x = np.moveaxis(x, 0, -1)
    if x.ndim == 3 and x.shape[-1] == 1:
        x = x[..., 0]
    step = max(1, math.ceil(max(x.shape[:2]) / MAX_IMAGE_PX))
    x = x[::step, ::step]
    if t.dtype == np.uint8:
        scaled = x
    else:
        scaled = (x - lo) / (hi - lo) * 255 if hi > lo else np.zeros_like(x)
    return np.clip(np.nan_to_num(scaled, nan=0.0, posinf=255, neginf=0), 0, 255).round(
        ).astype(np.uint8)


def _range(tensors: list[np.ndarray]) -> tuple[float, float]:
    """One value range for a group or pair, so differences between its members show."""
    vals = [v for v in (_real(t) for t in tensors if not _is_text(t)) if v.size]
    finite = [v[np.isfinite(v)] for v in vals]
    finite = [v for v in finite if v.size]
    if not finite:
        return 0.0, 1.0
    return float(min(v.min() for v in finite)), float(max(v.max() for v in finite))


def _sparkline(t: np.ndarray, lo: float, hi: float) -> str:
    v = _real(t).ravel()
    if v.size > SPARK_POINTS:
        v = v[np.linspace(0, v.size - 1, SPARK_POINTS).round().astype(int)]
    w, h = 120, 32
    if v.size == 0:
        return ""
    xs = np.linspace(1, w - 1, v.size) if v.size > 1 else np.array([w / 2])
    span = hi - lo if hi > lo else 1.0
    ys = h - 2 - (np.nan_to_num(v, nan=lo, posinf=hi, neginf=lo) - lo) / span * (h - 4)
    pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in zip(xs, ys, strict=True))
    return (f'<svg class="spark" viewBox="0 0 {w} {h}" width="{w}" height="{h}" '
            f'xmlns="http://www.w3.org/2000/svg" role="img"><polyline points="{pts}" '
            'fill="none" stroke="#1f6fb2" stroke-width="1.2"/></svg>')


def _value(x: float | int | complex) -> str:
    """A value as a card shows it: integers whole (token ids, pixel levels: 11790, not
    1.179e+04), floats to 4 significant digits."""
    if isinstance(x, int):
        return str(x)
    return f"{x:.4g}" if isinstance(x, float) else f"{x:.3g}"


def _preview(t: np.ndarray) -> str:
    v = np.asarray(t).ravel()
    head = ", ".join(_value(x) for x in v[:6].tolist())
    more = ", ..." if v.size > 6 else ""
    return f"[{head}{more}] {tuple(np.asarray(t).shape)} {np.asarray(t).dtype}"


def _is_sequence(t: np.ndarray | None) -> bool:
    """A record of integers in one dimension (token ids)."""
    return t is not None and np.asarray(t).ndim == 1 and np.asarray(t).dtype.kind in "iu"


def _is_text(t: np.ndarray) -> bool:
    return np.asarray(t).dtype.kind in "US" or (
        np.asarray(t).dtype == object and np.asarray(t).ndim == 0)


def tensor_html(t: np.ndarray | None, lo: float, hi: float) -> str:
    """A thumbnail (image-like tensors), the text (text records, ``input.decode: text``)
    or a sparkline and the first values (others). Decoded images come at full resolution:
    the picture as stored, not the resized pixels the near stage compared."""
    if t is None:
        return '<div class="none">not read back</div>'
    if _is_text(t):
        text = str(np.asarray(t).item())
        more = "..." if len(text) > TEXT_CHARS else ""
        return f'<div class="text">{html.escape(text[:TEXT_CHARS])}{more}</div>'
    layout = image_layout(tuple(np.shape(t)))
    if layout is not None:
        img = _as_image(t, layout, lo, hi)
        h, w = img.shape[:2]
        scale = THUMB_PX / max(h, w)
        src = "data:image/png;base64," + base64.b64encode(png(img)).decode()
        return (f'<img class="t" src="{src}" width="{max(1, round(w * scale))}" '
                f'height="{max(1, round(h * scale))}" alt="tensor {h}x{w}" '
                f'title="{html.escape(_preview(t))}">')
    return (_sparkline(t, lo, hi) + f'<div class="vals">{html.escape(_preview(t))}</div>')


# ---------------------------------------------------------------------------- the page


def _card(r: Rec, lo: float, hi: float, cls: str = "", body: str | None = None) -> str:
    where = "earlier run" if r.where is None else f"file {r.file}, row {r.row}"
    return (f'<figure class="rec {cls}" data-id="{html.escape(r.id)}">'
            f"{tensor_html(r.tensor, lo, hi) if body is None else body}"
            f'<figcaption><b>{html.escape(r.id)}</b><br>{html.escape(where)}'
            f'<br><span class="note">{html.escape(r.note)}</span></figcaption></figure>')


def lookup_command(filters: str) -> str:
    """A shell line that prints, as CSV, the rows of duplicates.parquet that ``filters``
    (pyarrow's filter list, as Python source) selects: for what the page does not hold."""
    return "python3 -c " + shlex.quote(FIND.replace("FILTERS", filters))


# the page's script fills FILTERS for an id it does not show (index.html#q=<id>)
FIND = ('import sys, pyarrow.csv as c, pyarrow.parquet as pq; c.write_csv(pq.read_table('
        '"duplicates.parquet", filters=FILTERS), sys.stdout.buffer)')


def _more_html(g: Group, more: int) -> str:
    """The group's removed records beyond its cards: the next ``len(g.listed)`` as a table,
    and the line that prints them all (a crowd's group can hold 1e5+)."""
    rows = "".join(
        f'<tr data-id="{html.escape(r.id)}"><td>{html.escape(r.id)}</td>'
        f"<td>{html.escape(r.note)}</td><td>{html.escape(r.duplicate_of or '')}</td>"
        f"<td>{r.file}</td><td>{r.row}</td></tr>" for r in g.listed)
    which = (f"all {more:,}" if len(g.listed) == more
             else f"the next {len(g.listed):,} of {more:,} (farthest first); the other "
                  f"{more - len(g.listed):,} are not on this page")
    cmd = lookup_command(f'[("group", "==", {json.dumps(g.group)})]')
    return (f'<details class="more"><summary>+{more:,} more</summary><p class="cap">The '
            f"removed records not shown above: {which}. Every removed record of the group, "
            "as CSV (run where duplicates.parquet is, beside this page):</p>"
            f'<pre class="cmd">{html.escape(cmd)}</pre>'
            '<table class="members"><tr><th>record</th><th>removed as</th>'
            f"<th>duplicate of</th><th>file</th><th>row</th></tr>{rows}</table></details>")


def _groups_html(groups: list[Group]) -> str:
    if not groups:
        return "<p>No duplicates were removed.</p>"
    parts = []
    for g in groups:
        recs = [g.kept, *g.members]
        lo, hi = _range([r.tensor for r in recs if r.tensor is not None])
        more = g.size - len(recs)
        ids = " ".join(html.escape(r.id) for r in [*recs, *g.listed])
        parts.append(
            f'<div class="group" data-ids="{ids}"><h3>group <code>{g.group[:12]}</code>: '
            f'<span class="size">{g.size:,}</span> records</h3><div class="recs">'
            + _card(g.kept, lo, hi, "kept") + "".join(_card(r, lo, hi) for r in g.members)
            + "</div>" + (_more_html(g, more) if more > 0 else "") + "</div>")
    return "\n".join(parts)


DIFF_WORDS = 3000  # words of each text compared for the marks (a quadratic worst case)
DIFF_CONTEXT = 8  # words shown before the first difference


def word_diff(a: str, b: str, normalize: bool = False) -> tuple[str, str]:
    """Two texts as HTML from a few words before their first difference, the words each
    has and the other lacks marked (``<mark>``): what a near copy changed. ``normalize``:
    words compared as jaccard's normalised word unit compares them (``word_keys``: case,
    punctuation and Unicode forms are no change), shown as stored."""
    wa, wb = a.split()[:DIFF_WORDS], b.split()[:DIFF_WORDS]
    ka, kb = (word_keys(wa), word_keys(wb)) if normalize else (wa, wb)
    ops = difflib.SequenceMatcher(None, ka, kb, autojunk=False).get_opcodes()
    first = next((o for o in ops if o[0] != "equal"), None)
    starts = (0, 0) if first is None else (max(0, first[1] - DIFF_CONTEXT),
                                           max(0, first[3] - DIFF_CONTEXT))

    def side(words: list[str], lo: int, spans: list[tuple[int, int]]) -> str:
        marked = np.zeros(len(words), bool)
        for x, y in spans:
            marked[x:y] = True
        out, chars = ["..."] if lo else [], 0
        for i in range(lo, len(words)):
            w = html.escape(words[i])
            out.append(f"<mark>{w}</mark>" if marked[i] else w)
            chars += len(words[i]) + 1
            if chars > TEXT_CHARS:
                out.append("...")
                break
        return f'<div class="text">{" ".join(out)}</div>'

    changed = [o for o in ops if o[0] != "equal"]
    return (side(wa, starts[0], [(o[1], o[2]) for o in changed]),
            side(wb, starts[1], [(o[3], o[4]) for o in changed]))


def _pairs_html(pairs: list[Pair], title: str, sets: bool = False, normalize: bool = False
                ) -> str:
    """A side of the borderline pairs. ``sets`` (jaccard): texts and token sequences
    are shown from their first difference with the changed words or ids marked,
    ``normalize``: as the metric normalises words."""
    rows = []
    for p in pairs:
        pair = [r.tensor for r in (p.record, p.neighbour)]
        lo, hi = _range([t for t in pair if t is not None])
        ids = f"{html.escape(p.record.id)} {html.escape(p.neighbour.id)}"
        bodies = (None, None)
        if all(t is not None and _is_text(t) for t in pair):
            bodies = word_diff(*(str(np.asarray(t).item()) for t in pair), normalize)
        elif sets and all(_is_sequence(t) for t in pair):  # token ids: as words, marked
            bodies = word_diff(*(" ".join(map(str, np.asarray(t).tolist())) for t in pair))
        rows.append(f'<div class="pair" data-ids="{ids}"><div class="dist">{p.distance:.5g}'
                    f"</div>{_card(p.record, lo, hi, body=bodies[0])}"
                    f"{_card(p.neighbour, lo, hi, body=bodies[1])}</div>")
    body = "\n".join(rows) or "<p>none</p>"
    return f'<div class="side"><h3>{title}</h3>{body}</div>'


def _counts_html(counts: dict) -> str:
    rows = [("read", "records read"), ("kept", "kept"),
            *[(k, k.removeprefix("removed_").replace("_", " ") + " duplicates removed")
              for k in counts if k.startswith("removed_") and counts[k]],
            ("invalid", "invalid (see invalid.parquet)")]
    return "".join(f'<tr><th>{html.escape(label)}</th><td data-count="{k}">{counts[k]:,}</td></tr>'
                   for k, label in rows)


def _near_html(near: dict | None, png_bytes: bytes | None) -> str:
    if near is None:
        return ""
    s, h = near.get("stats") or {}, near.get("histogram") or {}
    if near["metric"] == "jaccard":
        t = near["threshold"]
        facts = [("metric", f"jaccard over {s.get('unit', '')} {s.get('size', '')}-grams"),
                 ("threshold", f"J >= {t:g} (distance 1 - J <= {round(1 - t, 12):g})"),
                 ("mode", s.get("mode", ""))]
        if h:
            facts += [("near duplicates removed", f"{h['removed']['n']:,}"),
                      ("candidate pairs verified", f"{h['verified']['n']:,}")]
    else:
        facts = [("metric", near["metric"]), ("threshold", f"{near['threshold']:g}"),
                 ("mode", s.get("mode", "")),
                 ("cells", f"{s.get('cells', s.get('partitions', 0)):,}")]
        if h:
            facts.append(("pairs within tolerance", f"{h['pairs']['n']:,}"))
    if s:
        facts.append(("recall", recall_line(s.get("recall"), s.get("mode"))))
    table = "".join(f'<tr><th>{html.escape(k)}</th><td data-near="{html.escape(k)}">'
                    f"{html.escape(str(v))}</td></tr>" for k, v in facts)
    img = ""
    if png_bytes:
        img = (f'<img class="hist" alt="distance histogram" src="data:image/png;base64,'
               f'{base64.b64encode(png_bytes).decode()}">')
    cap = ("Jaccard J on a linear axis. Grey: every candidate pair whose J was computed; "
           "blue: each removed record's J with the record it duplicates; red: the threshold. "
           "Right: the threshold +- 0.1; orange: near misses (below it) that the borderline "
           "sample kept." if near["metric"] == "jaccard" else
           "Blue: every verified pair within tolerance, each once (exact counts). Black line: "
           "nearest-neighbour distance of sampled records (the bulk). Right: half a decade "
           "either side of the threshold; orange: pairs just outside it that the borderline "
           "sample kept.")
    return (f'<section id="near"><h2>Near-duplicates</h2><table class="facts">{table}</table>'
            f'{img}<p class="cap">{cap} near_distances.json / .csv hold the numbers.</p>'
            "</section>")


def _files_html(files: pa.Table, limit: int = 50) -> str:
    rows = files.to_pylist()
    body = "".join(f"<tr><td>{r['file']}</td><td>{html.escape(r['role'])}</td>"
                   f"<td>{html.escape(r['path'])}</td></tr>" for r in rows[:limit])
    more = f"<p>and {len(rows) - limit:,} more in files.parquet</p>" if len(rows) > limit else ""
    return ("<table class=\"files\"><tr><th>file</th><th>role</th><th>path</th></tr>"
            f"{body}</table>{more}")


CSS = """
body{font:14px/1.4 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#222;
background:#f6f7f9}
header{background:#24323f;color:#fff;padding:14px 24px}header h1{margin:0;font-size:20px}
main{padding:8px 24px 40px;max-width:1500px}
section{background:#fff;border:1px solid #dde1e6;border-radius:6px;padding:12px 16px;
margin:14px 0}
h2{font-size:17px;margin:4px 0 10px}h3{font-size:14px;margin:6px 0}
table{border-collapse:collapse}th,td{padding:2px 10px;text-align:left;vertical-align:top}
td[data-count]{text-align:right;font-variant-numeric:tabular-nums}
.summary{display:flex;gap:32px;align-items:flex-start;flex-wrap:wrap}
.share{font-size:26px;font-weight:600;color:#1f6fb2}
img.hist{max-width:100%;height:auto;border:1px solid #eee}
.cap{color:#555;font-size:12px;max-width:1100px}
.group{border-top:1px solid #eee;padding:6px 0}
.recs{display:flex;flex-wrap:wrap;gap:8px;align-items:flex-start}
figure.rec{margin:0;padding:6px;border:1px solid #e3e6ea;border-radius:4px;width:150px;
background:#fcfcfd;font-size:11px;overflow-wrap:anywhere}
figure.kept{border:2px solid #2e8b57}
figcaption .note{color:#a33}figure.kept .note{color:#2e8b57}
img.t{image-rendering:pixelated;background:#000;cursor:zoom-in;display:block}
img.t.big{width:216px;height:auto;cursor:zoom-out}
.vals{font-family:ui-monospace,monospace;font-size:10px;color:#444}
.text{font-size:12px;line-height:1.25;white-space:pre-wrap;max-height:12.5em;overflow:auto}
.text mark{background:#ffe08a}
figcaption{margin-top:6px;padding-top:4px;border-top:1px solid #e3e6ea}
.none{color:#999;font-style:italic}
details.more{margin:6px 0 0}details.more summary{cursor:pointer;color:#1f6fb2;width:max-content}
table.members{font-size:12px}table.members td:nth-child(n+4){text-align:right}
table.members tr.hit{background:#fff3bf}
pre.cmd{font-size:11px;background:#f1f3f5;padding:6px 8px;white-space:pre-wrap;
overflow-wrap:anywhere;margin:4px 0}
#nomatch{background:#fff3bf;border-color:#e0c36a}
.pairs{display:grid;grid-template-columns:1fr 1fr;gap:16px}
.pair{display:flex;gap:6px;align-items:center;border-top:1px solid #eee;padding:6px 0}
.dist{flex:none;min-width:70px;font-variant-numeric:tabular-nums;font-weight:600}
input#filter{padding:4px 8px;width:260px}.hidden{display:none}
code{font-size:12px}
"""

JS = r"""
(function () {
  var data = JSON.parse(document.getElementById('report-data').textContent);
  var removed = 0;
  Object.keys(data.counts).forEach(function (k) {
    if (k.indexOf('removed_') === 0) { removed += data.counts[k]; }
  });
  var share = data.counts.read ? 100 * removed / data.counts.read : 0;
  document.getElementById('removed-share').textContent =
    share.toFixed(1) + '% removed (' + removed.toLocaleString('en-US') + ' of ' +
    data.counts.read.toLocaleString('en-US') + ')';
  document.querySelectorAll('img.t').forEach(function (img) {
    img.addEventListener('click', function () { img.classList.toggle('big'); });
  });
  var box = document.getElementById('filter');
  var none = document.getElementById('nomatch');
  function lookup(id) {  // the shell line that prints id's rows of duplicates.parquet
    var s = JSON.stringify(id);
    var py = data.find.replace('FILTERS', '[[("record_id", "==", ' + s + ')], ' +
                               '[("duplicate_of", "==", ' + s + ')]]');
    return "python3 -c '" + py.split("'").join("'\"'\"'") + "'";
  }
  function say(q) {  // an id no block on the page holds: say so, and how to look it up
    var parts = [
      ['p', 'No record on this page matches \u201c' + q + '\u201d: the page holds only ' +
       'the largest duplicate groups and the pairs nearest the threshold, and ' +
       'duplicates.parquet every removal. To look the record up, run this where ' +
       'duplicates.parquet is (beside this page):'],
      ['pre', lookup(q)],
      ['p', 'It prints, as CSV, the rows where the record was removed (record_id) and ' +
       'those of the records removed as its duplicates (duplicate_of). Only a header: ' +
       'the run kept it and removed nothing as its duplicate, or it is no record of ' +
       'this run.']];
    none.textContent = '';
    parts.forEach(function (p) {
      var el = document.createElement(p[0]);
      el.textContent = p[1];
      if (p[0] === 'pre') { el.className = 'cmd'; }
      none.appendChild(el);
    });
  }
  function filter() {
    var q = box.value.trim().toLowerCase();
    var found = false;
    document.querySelectorAll('[data-ids]').forEach(function (el) {
      var hit = false;
      el.querySelectorAll('[data-id]').forEach(function (r) {
        var match = !!q && r.getAttribute('data-id').toLowerCase().indexOf(q) >= 0;
        if (r.tagName === 'TR') { r.classList.toggle('hit', match); }
        if (match && r.tagName === 'TR') { r.closest('details').open = true; }
        hit = hit || match;
      });
      el.classList.toggle('hidden', !!q && !hit);
      found = found || hit;
    });
    none.classList.toggle('hidden', !q || found);
    if (q && !found) { say(box.value.trim()); }
  }
  box.addEventListener('input', filter);
  function fromLink() {  // index.html#q=<id>: a filtered link
    var m = /^#q=(.*)$/.exec(window.location.hash);
    if (!m) { return; }
    try { box.value = decodeURIComponent(m[1]); } catch (e) { box.value = m[1]; }
    filter();
  }
  window.addEventListener('hashchange', fromLink);
  fromLink();
  document.documentElement.setAttribute('data-ready', '1');
})();
"""

# installed first, so an error in any later script is recorded on the page itself
ERRORS_JS = """
window.addEventListener('error', function (e) {
  var el = document.documentElement;
  var was = el.getAttribute('data-js-errors');
  el.setAttribute('data-js-errors', (was ? was + ' | ' : '') + e.message);
});
"""


def render(counts: dict, groups: list[Group], inside: list[Pair], outside: list[Pair],
           files: pa.Table, near: dict | None = None, histogram_png: bytes | None = None,
           reference: dict | None = None, shown: int = 0) -> str:
    """The page as one string."""
    data = json.dumps({"counts": counts, "groups": len(groups), "tensors_shown": shown,
                       "find": FIND}, sort_keys=True).replace("</", "<\\/")
    removed = sum(v for k, v in counts.items() if k.startswith("removed_"))
    ref = ""
    if reference:
        ref = (f"<p>Reference set: {reference['read']:,} records in {reference['files']} "
               f"file(s), {reference['invalid']:,} unreadable (never removed).</p>")
    pairs = ""
    if near is not None:
        sets = near["metric"] == "jaccard"  # a minimum similarity: the other way round
        folded = sets and bool((near.get("stats") or {}).get("normalize"))  # marks ignore it
        advice = ("if those just below it look like duplicates, lower it; if those just "
                  "above it do not, raise it" if sets else "if those just outside look like "
                  "duplicates, raise it; if those just inside do not, lower it")
        pairs = ('<section id="borderline"><h2>Borderline pairs</h2><p class="cap">The '
                 f"verified pairs nearest the threshold: {advice} "
                 "(borderline_pairs.parquet has them all).</p><div class=\"pairs\">"
                 + _pairs_html(inside, "just above the threshold (duplicates)" if sets else
                               "just inside the tolerance (duplicates)", sets, folded)
                 + _pairs_html(outside, "just below it (not duplicates)" if sets else
                               "just outside (not duplicates)", sets, folded)
                 + "</div></section>")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>tensordedup report</title>
<script>{ERRORS_JS}</script>
<style>{CSS}</style></head>
<body>
<header><h1>tensordedup report</h1></header>
<main>
<section id="nomatch" class="hidden" role="status"></section>
<section id="summary"><h2>Summary</h2><div class="summary">
<table class="counts">{_counts_html(counts)}</table>
<div><div class="share" id="removed-share">{removed:,} removed</div>{ref}
<p>duplicates.parquet: one row per removed record (where it is, what it duplicates, its
group); files.parquet: file index to path; invalid.parquet: unreadable records.</p>
</div></div></section>
{_near_html(near, histogram_png)}
{pairs}
<section id="groups"><h2>Largest duplicate groups</h2>
<p class="cap">Each group: the record it keeps (green) and the removed records, the
farthest first. Filter the groups and pairs by record id: <input id="filter"
type="search" placeholder="record id"> (or open index.html#q=&lt;id&gt;). Click a
thumbnail to enlarge it.</p>
{_groups_html(groups)}</section>
<section id="files"><h2>Files</h2>{_files_html(files)}</section>
</main>
<script type="application/json" id="report-data">{data}</script>
<script>{JS}</script>
</body></html>
"""


def write_page(folder: str, *, counts: dict, duplicates: pa.Table, files: pa.Table,
               near: dict | None = None, borderline: pa.Table | None = None,
               read_rows: READ_ROWS | None = None, reference: dict | None = None,
               drawing: Iterable[Future] = ()) -> dict:
    """Write ``folder/index.html`` (after near_distances.png, which it embeds); returns
    what it shows (for tests). ``read_rows(file, rows)``: {row: tensor} of one file.
    ``drawing``: plots still being drawn into ``folder``, waited for once the rows are
    read back."""
    groups, inside, outside, recs = page_records(duplicates, borderline)
    shown = fetch(recs, read_rows)
    for plot in drawing:
        plot.result()
    hist_png = None
    if near is not None and os.path.exists(os.path.join(folder, layout.NEAR_DISTANCES + ".png")):
        with open(os.path.join(folder, layout.NEAR_DISTANCES + ".png"), "rb") as f:
            hist_png = f.read()
    page = render(counts, groups, inside, outside, files, near, hist_png, reference, shown)
    _write(folder, page)
    return {"groups": len(groups), "pairs": len(inside) + len(outside), "tensors": shown}


def write_fallback(folder: str, counts: dict, error: str) -> None:
    """A page with the counts and why the full page could not be built: the page is a
    view of the run, so a problem building it never fails the run."""
    body = _counts_html(counts)
    _write(folder, f"""<!doctype html>
<html lang="en" data-page-error="{html.escape(error)}"><head><meta charset="utf-8">
<title>tensordedup report</title><style>{CSS}</style></head><body>
<header><h1>tensordedup report</h1></header><main><section id="summary"><h2>Summary</h2>
<table class="counts">{body}</table><p>The full page could not be built:
{html.escape(error)}. The Parquet reports and summary.json are complete.</p></section>
</main></body></html>
""")


def _write(folder: str, page: str) -> None:
    with open(os.path.join(folder, layout.INDEX), "w", encoding="utf-8") as f:
        f.write(page)

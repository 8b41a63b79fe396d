"""The capacity plan of ``--dry-run`` for a jaccard job (``near.metric: jaccard``): its
stages with their time, memory and bytes, the mode it would pick, and counts that are
the job's own (the dry run runs the job's kernels on the input's first records: on an
input that small, all of it). Real texts: paragraphs of the licence and METADATA files
the installed packages ship and of Python's help pages, with edited copies and a crowd.
No timings are asserted (scripts/bench_plan_jaccard.py checks them against real runs)."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from pipeline.api import run_job, to_config
from pipeline.capacity.plan import DEFAULT_RATES, Rates, cluster, plan_lines, predict_sets
from pipeline.capacity.workload import workload
from pipeline.preflight import prepare
from pipeline.run import main
from tests import slowfs  # noqa: F401  (registers deniedfs://)
from tests.textkit import edited, package_texts
from transforms.io.formats import get_format

STAGES = ("read, digests, exact dedup", "shingles (+ spill)", "key shuffle (GroupByKey)",
          "candidate groups", "components (one worker)", "verification and decisions",
          "merge, report (one worker)", "plan sample, recall", "write", "framework")


def paragraphs() -> list[str]:
    """Distinct real paragraphs of 300 characters or more (about 1,260)."""
    from pydoc_data.topics import topics

    texts = package_texts(300) + [topics[k] for k in sorted(topics)]
    return list(dict.fromkeys(p.strip() for t in texts for p in t.split("\n\n")
                              if len(p.strip()) >= 300))


def pages(base: list[str], seed: int) -> list[str]:
    """``base`` with a fifth of them copied with 0-15% of words edited, a crowd (a twentieth
    of the pages: one paragraph with 1% edits) and two exact copies, shuffled."""
    rng = np.random.default_rng(seed)
    vocab = sorted({w for t in base for w in t.split()})
    docs = list(base)
    docs += [edited(base[i], rng.uniform(0, 0.15), rng, vocab)
             for i in rng.choice(len(base), len(base) // 5, replace=False)]
    docs += [edited(base[0], 0.01, rng, vocab) for _ in range(len(base) // 20)]
    docs += [docs[3], docs[5]]
    return [docs[i] for i in rng.permutation(len(docs))]


@pytest.fixture(scope="module")
def corpora(tmp_path_factory) -> dict[str, tuple[str, int]]:
    """A small and a larger corpus (two Parquet files each): name -> (glob, pages)."""
    paras = paragraphs()
    out = {}
    for name, count in (("small", 300), ("large", 1200)):
        folder = tmp_path_factory.mktemp(name)
        docs = pages(paras[:count], seed=count)
        for i, part in enumerate(np.array_split(np.arange(len(docs)), 2)):
            pq.write_table(pa.table({"url": [f"p{j}" for j in part],
                                     "text": [docs[j] for j in part]}),
                           folder / f"part-{i}.parquet")
        out[name] = (str(folder / "*.parquet"), len(docs))
    return out


def config(tmp_path: Path, data: str, **near) -> dict:
    return {"input": {"format": "parquet", "path": data, "tensor": "text", "id": "url",
                      "decode": "text"},
            "output": {"path": str(tmp_path / "out" / "clean")},
            "report": str(tmp_path / "out" / "report"),
            "runner": {"name": "local", "workers": 1},
            "near": {"metric": "jaccard", "threshold": 0.8, **near}}


def dry_run(tmp_path: Path, cfg: dict, *extra: str) -> int:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return main(["--config", str(path), "--dry-run", *extra])


def stage(out: str, name: str) -> str:
    found = re.search(rf"^    {re.escape(name)}: (.*)$", out, re.M)
    assert found, f"no stage {name!r} in:\n{out}"
    return found.group(1)


def count(text: str, what: str) -> int:
    return int(re.search(rf"([\d,]+) {what}", text).group(1).replace(",", ""))


def test_dry_run_plans_the_stages_and_the_job_does_what_it_said(tmp_path, corpora, capsys):
    """The dry run of a jaccard job (mode auto) prints each stage with its time, memory
    and bytes and the mode it picks; run, the job picks that mode, verifies that many
    pairs and removes that many records."""
    data, n = corpora["large"]
    cfg = config(tmp_path, data)
    assert dry_run(tmp_path, cfg) == 0
    out = capsys.readouterr().out
    assert "does not model" not in out and "not computed" not in out
    plan = re.search(r"^  near: jaccard >= 0.8 over word 5-grams, mode (exact|bounded) "
                     r"\(auto: ", out, re.M)
    assert plan, out
    mode = plan.group(1)
    for name in STAGES:
        assert re.match(r"[\d.]+ (s|min|h); ", stage(out, name)), name
    keys = re.search(r"^    (prefix tokens|signatures \+ band keys \(\d+ x \d+\)): [\d.]+ s; ",
                     out, re.M)
    assert keys and keys.group(1).startswith("prefix" if mode == "exact" else "signatures")
    assert re.search(r"^  input: [\d,]+ records of [\d.]+ (B|kB) each \(text: the Parquet "
                     r"column's size over every record\)", out, re.M)
    assert re.search(r"[\d.]+ (kB|MB) moved, 64 key shards$",
                     stage(out, "key shuffle (GroupByKey)"))
    verify = stage(out, "verification and decisions")
    summary = run_job(cfg, overwrite=True, quiet=True)
    near = json.loads((tmp_path / "out" / "report" / "summary.json").read_text())["near"]
    assert summary.read == n and near["mode"] == mode
    assert count(verify, "pairs verified") == near["compared"] > 0
    assert count(verify, "removed") == near["removed"] == summary.removed["near"] > 0


def test_a_larger_corpus_costs_more_and_memory_is_planned(tmp_path, corpora):
    """In both modes: the larger corpus, and more records planned from it, cost more
    time, shuffle, spill and memory; the input is counted exactly."""
    rates = Rates.load().jaccard
    for mode in ("exact", "bounded"):
        caps = []
        for name in ("small", "large"):
            data, n = corpora[name]
            job = prepare(to_config(config(tmp_path, data, mode=mode)))
            w = workload(job)
            assert w.records == n and w.sets.mode == mode and w.sets.shingles > 10
            caps.append(predict_sets(w, cluster(job.cfg.runner, rates), rates))
        for records in (10**6, 10**7, 10**8):
            w = workload(job, records)
            caps.append(predict_sets(w, cluster(job.cfg.runner, rates), rates))
        for a, b in zip(caps, caps[1:], strict=False):
            assert b.wall_s > a.wall_s and b.shuffled > a.shuffled > 0
            assert b.spilled > a.spilled > 0 and b.peak_memory > a.peak_memory > 0
        out = "\n".join(plan_lines(job, 10**8))
        assert re.search(r"^  peak memory per worker: [\d.]+ (MB|GB|TB) of [\d.]+ GB$", out,
                         re.M)  # (one local worker: this machine's memory)
        assert "warning: the peak exceeds this machine's memory" in out  # 100M pages
        assert re.search(r"candidate groups: [\d.]+ (s|min|h); [\d.]+ (kB|MB|GB); ", out)
        assert ("signatures + band keys" if mode == "bounded" else "prefix tokens") in out


def test_dataflow_plan_of_a_billion_pages_names_its_limits(tmp_path, corpora):
    """On 100 Dataflow workers of 16 vCPUs: the worker's memory, vCPU-hours, the 64
    shards of the groups and decisions, and the assumption that the full set is
    duplicated like its sample."""
    cfg = config(tmp_path, corpora["large"][0])
    cfg["runner"] = {"name": "dataflow", "project": "my-project", "region": "us-central1",
                     "temp_location": "gs://my-bucket/tmp", "machine_type": "n1-standard-16",
                     "max_workers": 100, "worker_image": "us-docker.pkg.dev/my-project/w:1"}
    out = "\n".join(plan_lines(prepare(to_config(cfg)), 1_000_000_000))
    assert "capacity plan (dataflow, 100 worker(s) x 16 core(s);" in out
    assert re.search(r"^  input: 1,000,000,000 records", out, re.M)
    assert re.search(r"^  peak memory per worker: .* of 64.4 GB", out, re.M)
    assert re.search(r"^  worker-hours: .*vCPU-hours", out, re.M)
    assert "warning: candidate groups and decisions run in 64 shards: 64 of the 1,600 " in out
    assert "assumed: the input is duplicated throughout as in its sample" in out


def test_missing_jaccard_rates_and_an_unreadable_input_name_what_is_lacking(
        tmp_path, corpora, capsys, monkeypatch):
    """A rates file without the jaccard section plans nothing and says where the rates
    come from; an input the dry run cannot read names the jaccard figures it lacks."""
    raw = json.loads(DEFAULT_RATES.read_text())
    raw.pop("jaccard")
    rates = tmp_path / "rates.json"
    rates.write_text(json.dumps(raw))
    monkeypatch.setenv("TENSORDEDUP_RATES", str(rates))
    assert dry_run(tmp_path, config(tmp_path, corpora["small"][0])) == 0
    out = capsys.readouterr().out
    assert "capacity plan: not computed; the model lacks:" in out
    assert "the rates file has no 'jaccard' section (scripts/bench_rates.py --jaccard" in out
    monkeypatch.delenv("TENSORDEDUP_RATES")
    assert dry_run(tmp_path, config(tmp_path, "deniedfs://bucket/data/*.parquet")) == 2
    out = capsys.readouterr().out
    assert "near jaccard: shingles, keys and candidate groups per record" in out
    assert "near cells per record" not in out


def test_records_in_groups_and_removed_never_pass_the_records():
    """Overlapping token windows (consecutive ones near each other) in input order: the
    sample's random subsets hold fewer neighbours, so the fit grows as s^2 and, past the
    sample, gave more records in candidate groups (131%) and removed (155%) than the input
    has."""
    from pipeline.capacity.jaccard import sets_cost
    from transforms.near.sets import Shingles
    from transforms.near.spec import NearSpec

    vocab: dict[str, int] = {}
    toks = np.array([vocab.setdefault(w, len(vocab)) for t in package_texts(300)
                     for w in t.split()], np.int64)
    wins = [toks[i:i + 64] for i in range(0, 6 * 6000, 6)]
    c = sets_cost(NearSpec("jaccard", 0.8, shingles=Shingles("token")), wins, 4 * len(wins),
                  4 * len(wins))
    records = c.valid * c.distinct  # ~0.9: licence texts repeat across packages, by version
    assert 0.5 < records and c.grouped <= records + 1e-12 and c.removed <= records + 1e-12


def test_ordered_input_is_planned_from_a_sample_across_it(tmp_path, monkeypatch):
    """Overlapping token windows in input order (consecutive ones near each other), more
    than the plan samples (a smaller sample than the job's, for time): the first records
    of each file held every neighbour of each other, so the plan predicted 34% more
    removals (30,000 windows, the job's sample). Drawn across the input, it predicts the
    job's mode and removals (the oracle: the kernels on every record)."""
    from pipeline.capacity import workload as model
    from pipeline.capacity.jaccard import sets_cost

    monkeypatch.setattr(model, "SAMPLE", SAMPLE := 3_000)
    vocab: dict[str, int] = {}
    toks = np.array([vocab.setdefault(w, len(vocab)) for t in package_texts(300)
                     for w in t.split()], np.int64)
    wins = [toks[i:i + 64] for i in range(0, 6 * int(1.5 * SAMPLE), 6)]
    assert len(toks) >= 6 * len(wins) + 64
    (tmp_path / "data").mkdir()
    for i, part in enumerate(np.array_split(np.arange(len(wins)), 2)):
        pq.write_table(pa.table({"id": [f"w{j}" for j in part],
                                 "tokens": pa.array([wins[j] for j in part],
                                                    pa.list_(pa.int64()))}),
                       tmp_path / "data" / f"part-{i}.parquet")
    cfg = config(tmp_path, "")
    cfg["input"] = {"format": "parquet", "path": str(tmp_path / "data" / "*.parquet"),
                    "tensor": "tokens", "id": "id"}
    job = prepare(to_config(cfg))
    planned = workload(job).sets
    truth = sets_cost(job.near, wins, len(wins), len(wins))
    assert "drawn uniformly from every record" in planned.source
    assert planned.mode == truth.mode
    assert abs(planned.removed / truth.removed - 1) < 0.15, (planned.removed, truth.removed)


def test_plan_of_a_store_run_counts_the_stored_sets(tmp_path, corpora):
    """A jaccard job with a fingerprint store searches every stored shingle set with the
    new records: the plan says how many, reads them on one worker, and keys and groups
    them with the input's (the input line and --plan-records stay the new input's)."""
    data, n = corpora["small"]
    cfg = {**config(tmp_path, data), "store": {"path": str(tmp_path / "store")},
           "output": {"path": str(tmp_path / "out/{run_id}/clean")},
           "report": str(tmp_path / "out/{run_id}/report")}
    kept = run_job(cfg, run_id="a", quiet=True).kept
    rates = Rates.load().jaccard
    job = prepare(to_config(cfg, run_id="b"))
    w = workload(job)
    assert w.records == n and w.stored.values == kept and w.stored.sets
    assert round(w.sets.stored * n) == kept
    alone = workload(dataclasses.replace(job, store=None))
    out = "\n".join(plan_lines(job))
    assert re.search(rf"^  input: {n:,} records ", out, re.M)
    assert re.search(rf"^  store: {kept:,} records of 1 earlier run\(s\), searched with this "
                     r"run's \(shingle sets: ", out, re.M), out
    assert count(stage(out, "store: sets read (one worker), lookups"), "stored sets") == kept
    keys = int(re.search(r"([\d,]+) key lines", out).group(1).replace(",", ""))
    assert alone.sets.valid == w.sets.valid and alone.sets.lines == w.sets.lines
    assert keys == round((n * w.sets.valid + kept) * w.sets.lines)
    mine = predict_sets(w, cluster(job.cfg.runner, rates), rates)
    without = predict_sets(alone, cluster(job.cfg.runner, rates), rates)
    assert mine.wall_s > without.wall_s and mine.spilled > without.spilled
    assert workload(job, 10 * n).sets.stored * 10 * n == pytest.approx(kept)


def test_an_input_of_many_copies_is_planned_from_its_distinct_records(tmp_path, monkeypatch,
                                                                       capsys):
    """More records than the dry run samples, fewer distinct ones (each page copied 0-3
    times): the sample is the distinct records, all of them, as the job's plan samples
    after exact dedup, and the plan's pairs and removals are the job's. A uniform draw over
    every record held fewer distinct records, and its fit planned 36% more removals (a
    sweep's 29,272 records, 19,237 distinct; here the dry run's sample is made small)."""
    from pipeline.capacity import jaccard
    from pipeline.capacity import workload as wl

    monkeypatch.setattr(jaccard, "SAMPLE", 600)
    monkeypatch.setattr(wl, "SAMPLE", 600)
    docs = pages(paragraphs()[:400], seed=7)  # about 500 distinct pages
    copies = np.random.default_rng(7).integers(0, 4, len(docs))
    rows = [d for d, c in zip(docs, copies, strict=True) for _ in range(c + 1)]
    rows = [rows[i] for i in np.random.default_rng(8).permutation(len(rows))]
    assert len(set(docs)) <= 600 < len(rows) <= 5 * 600
    pq.write_table(pa.table({"url": [f"p{i}" for i in range(len(rows))], "text": rows}),
                   tmp_path / "pages.parquet")
    cfg = config(tmp_path, str(tmp_path / "pages.parquet"), mode="bounded")
    assert dry_run(tmp_path, cfg) == 0
    out = capsys.readouterr().out
    assert f"candidates: the job's kernels on all {len(set(docs)):,} distinct records" in out
    verify = stage(out, "verification and decisions")
    run_job(cfg, overwrite=True, quiet=True)
    near = json.loads((tmp_path / "out" / "report" / "summary.json").read_text())["near"]
    assert count(verify, "pairs verified") == near["compared"] > 0
    assert count(verify, "removed") == near["removed"] > 0


@pytest.mark.parametrize("groups", [[100] * 30, [100] * 7 + [2_500] + [100] * 6, [3_000]])
def test_the_plan_counts_the_chunks_the_job_reads(tmp_path, groups):
    """The recall's probes are per chunk: the plan counts chunks as the reader makes them,
    small row groups (Hugging Face's) joined, a large one cut, in every read unit."""
    from pipeline.capacity.workload import count_chunks
    from transforms.io.formats.base import record_nbytes

    texts = [p for p in paragraphs() if p.strip()]
    rng = np.random.default_rng(0)
    for f in range(2):
        path = tmp_path / "data" / f"part-{f}.parquet"
        path.parent.mkdir(exist_ok=True)
        with pq.ParquetWriter(path, pa.schema([("url", pa.string()), ("text", pa.string())])
                              ) as w:
            for g, n in enumerate(groups):
                w.write_table(pa.table({"url": [f"f{f}-{g}-{i}" for i in range(n)],
                                        "text": list(rng.choice(texts, n))}))
    cfg = config(tmp_path, str(tmp_path / "data" / "*.parquet"))
    job = prepare(to_config(cfg))
    fmt = get_format("parquet", job.spec)
    for rows in (250, 1_000, 65_536):
        read = sum(1 for i, path in enumerate(job.files) for u in fmt.plan(
            path, i, job.chunking.unit_rows_for(record_nbytes(job.spec)), job.spec)
            for _ in fmt.read(u, job.spec, rows, 1 << 40))
        assert count_chunks(job, rows) == read, rows

"""The capacity plan of ``--dry-run``: on real small inputs its figures are present and
sane, it follows the input and the runner, and a dry run that cannot read its input
names what the model lacks. No timings are asserted (docs/scale.md checks the model
against real runs)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from pipeline.api import to_config
from pipeline.capacity.plan import Rates, cluster, lines, plan_lines, predict, slice_reads
from pipeline.capacity.workload import workload
from pipeline.preflight import prepare
from pipeline.run import main
from tests import slowfs  # noqa: F401  (registers deniedfs://)
from tests.embeddings import embeddings

ROWS, DIM = 30_000, 16
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def vectors(tmp_path_factory) -> str:
    """30k embedding-like 16-d vectors in two Parquet files (the near stage plans 30
    cells for them, so the planner runs on a sample)."""
    folder = tmp_path_factory.mktemp("capacity")
    x = embeddings(ROWS, dim=DIM, clusters=200)
    for i, part in enumerate(np.array_split(np.arange(ROWS), 2)):
        emb = pa.FixedSizeListArray.from_arrays(pa.array(x[part].reshape(-1)), DIM)
        pq.write_table(pa.table({"id": [f"r{j}" for j in part], "emb": emb}),
                       folder / f"part-{i}.parquet")
    return str(folder / "*.parquet")


def config(tmp_path: Path, data: str, near: bool = True, **runner) -> dict:
    cfg = {"input": {"format": "parquet", "path": data, "tensor": "emb", "id": "id"},
           "output": {"path": str(tmp_path / "out" / "clean")},
           "report": str(tmp_path / "out" / "report"),
           "runner": {"name": "local", "workers": 1, **runner}}
    if near:
        cfg["near"] = {"metric": "cosine", "threshold": 0.01}
    return cfg


def dry_run(tmp_path: Path, cfg: dict, *extra: str) -> tuple[int, str, str]:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(cfg))
    code = main(["--config", str(path), "--dry-run", *extra])
    return code, path.read_text(), str(path)


def figure(out: str, label: str) -> str:
    found = re.search(rf"^  {label}: (.*)$", out, re.M)
    assert found, f"no {label!r} line in:\n{out}"
    return found.group(1)


def seconds(text: str) -> float:
    value, unit = re.match(r"([\d.]+) (s|min|h)", text).groups()
    return float(value) * {"s": 1, "min": 60, "h": 3600}[unit]


def test_dry_run_prints_a_plan_of_the_input(tmp_path, vectors, capsys):
    code, _, _ = dry_run(tmp_path, config(tmp_path, vectors))
    out = capsys.readouterr().out
    assert code == 0 and "steps: " in out  # the graph is still built and described
    assert re.search(r"^capacity plan \(local, 1 worker\(s\) x 1 core\(s\); rates: ", out, re.M)
    assert figure(out, "input").startswith(f"{ROWS:,} records of {DIM} values (64 B each)")
    near = figure(out, "near")
    cells = int(re.match(r"(exact|bounded) search in ([\d,]+) cell\(s\)", near).group(2))
    assert cells == 30 and "the job's planner on" in near
    wall = figure(out, "wall time")
    assert 1 < seconds(wall) < 600 and "start-up" in wall
    assert re.match(r"[\d.]+ [kMG]?B; spilled: [\d.]+ [kMG]?B", figure(out, "shuffled"))
    machine = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    assert re.match(rf"[\d.]+ (MB|GB) of {machine:.3g} GB$", figure(out, "peak memory per worker"))
    assert "warning: the peak exceeds" not in out
    assert 0 < float(figure(out, "worker-hours")) < 1
    assert not (tmp_path / "out").exists()  # a dry run writes nothing


def test_plan_follows_records_workers_and_the_near_stage(tmp_path, vectors):
    """More records cost more; the job's input is counted exactly; a second worker
    shortens the wall time; no near section, no spill."""
    rates = Rates.load()
    job = prepare(to_config(config(tmp_path, vectors)))
    w = workload(job)
    assert w.records == ROWS and w.record_bytes == 4 * DIM and w.dim == DIM
    assert w.file_bytes == sum(p.stat().st_size for p in Path(vectors).parent.iterdir())
    one = predict(w, cluster(job.cfg.runner, rates), rates, remote_spill=False)
    big = predict(workload(job, 10 * ROWS), cluster(job.cfg.runner, rates), rates, False)
    assert big.wall_s > one.wall_s and big.shuffled > 9 * one.shuffled
    assert big.spilled > 9 * one.spilled > 0
    two = job.cfg.runner.model_copy(update={"name": "dask", "workers": 2})
    assert predict(w, cluster(two, rates), rates, False).wall_s < one.wall_s
    exact = prepare(to_config(config(tmp_path, vectors, near=False)))
    plain = predict(workload(exact), cluster(exact.cfg.runner, rates), rates, False)
    assert plain.spilled == 0 and plain.wall_s < one.wall_s


def test_plan_counts_the_spill_reads_on_an_object_store(tmp_path, vectors):
    """With the spill on an object store the plan names the cells' ranged reads, one per
    (chunk, cell) pair that holds rows: checked by dealing each chunk's joins to cells at
    random; locally there is no such line."""
    rates = Rates.load()
    job = prepare(to_config(config(tmp_path, vectors)))
    c = cluster(job.cfg.runner, rates)
    w = workload(job, 20_000_000)
    assert not [ln for ln in lines(w, c, rates, remote_spill=False) if "object store" in ln]
    (line,) = [ln for ln in lines(w, c, rates, remote_spill=True) if "object store" in ln]
    assert f"about {slice_reads(w):.3g} ranged reads" in line
    rows = min(w.chunking.chunk_rows, w.chunking.chunk_bytes // w.record_bytes)
    rng = np.random.default_rng(0)
    dealt = [len(np.unique(rng.integers(0, w.near.cells, round(rows * w.near.joins))))
             for _ in range(20)]
    by_hand = np.mean(dealt) * np.ceil(w.records / rows)
    assert w.near.cells > 1_000 and abs(slice_reads(w) / by_hand - 1) < 0.02
    # Dataflow carries the cells' rows in its shuffle: no ranged reads, the copies of the
    # values shuffled and not spilled
    flow = dataclasses.replace(c, runner="dataflow")
    said = lines(w, flow, rates, remote_spill=True)
    assert not [ln for ln in said if "object store" in ln]
    (line,) = [ln for ln in said if ln.startswith("  shuffle: ")]
    assert f"{w.near.joins:.2f} copies of each record" in line
    spilled, carried = predict(w, c, rates, True), predict(w, flow, rates, True)
    moved = w.records * w.near.joins * w.record_bytes
    assert carried.spilled < spilled.spilled - 0.9 * moved
    assert carried.shuffled == pytest.approx(spilled.shuffled)


def test_plan_records_scales_a_sample_to_the_full_set(tmp_path, vectors, capsys):
    """N as people write large numbers (1e8 was refused as "invalid int value")."""
    code, _, _ = dry_run(tmp_path, config(tmp_path, vectors, near=False),
                         "--plan-records", "1e8")
    out = capsys.readouterr().out
    assert code == 0 and figure(out, "input").startswith("100,000,000 records")
    assert seconds(figure(out, "wall time")) > 60
    with pytest.raises(SystemExit) as e:
        dry_run(tmp_path, config(tmp_path, vectors, near=False), "--plan-records", "2.5")
    assert e.value.code == 2
    assert "'2.5' is not a whole number of records" in capsys.readouterr().err


def test_dataflow_plan_names_workers_and_assumptions(tmp_path, vectors):
    """A Dataflow config's plan: its machine type's vCPUs and memory, its GPU, and the
    assumptions the plan makes about them, in words."""
    cfg = config(tmp_path, vectors)
    cfg["runner"] = {"name": "dataflow", "project": "my-project", "region": "us-central1",
                     "temp_location": "gs://my-bucket/tmp", "machine_type": "n1-standard-8",
                     "max_workers": 4, "worker_image": "us-docker.pkg.dev/my-project/w:1",
                     "accelerator": {"type": "nvidia-tesla-t4", "count": 1}}
    job = prepare(to_config(cfg))
    out = "\n".join(plan_lines(job, 1_000_000_000))
    assert "(dataflow, 4 worker(s) x 8 core(s) + nvidia-tesla-t4;" in out
    assert "of 32.2 GB" in figure(out, "peak memory per worker")
    assert "vCPU-hours" in figure(out, "worker-hours")
    assert "assumed: nvidia-tesla-t4: " in out and "closed form" in figure(out, "near")


def test_offline_dry_run_names_what_the_model_lacks(tmp_path, capsys):
    """An input the dry run cannot read (a filesystem that refuses every call, as GCS
    does without credentials): exit 2, the error in one line, and the plan's missing
    inputs instead of numbers."""
    cfg = config(tmp_path, "deniedfs://bucket/data/*.parquet")
    code, _, _ = dry_run(tmp_path, cfg)
    out, err = capsys.readouterr()
    assert code == 2 and err.startswith("error: input.path: ") and len(err.splitlines()) == 1
    assert "capacity plan: not computed; the model lacks:" in out
    assert "records and file bytes: the input could not be read" in out
    assert "record size: input.shape and input.dtype are not both set" in out
    assert "near cells per record" in out and "--plan-records N" in out
    assert "wall time" not in out


def test_bad_rates_file_and_plan_records_are_one_line(tmp_path, vectors, capsys,
                                                       monkeypatch):
    bad = tmp_path / "rates.json"
    bad.write_text(json.dumps({"steps": {}}))
    monkeypatch.setenv("TENSORDEDUP_RATES", str(bad))
    code, _, _ = dry_run(tmp_path, config(tmp_path, vectors))
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: TENSORDEDUP_RATES: ")
    assert len(err.splitlines()) == 1
    monkeypatch.delenv("TENSORDEDUP_RATES")
    path = tmp_path / "job.yaml"
    assert main(["--config", str(path), "--plan-records", "10"]) == 2
    assert capsys.readouterr().err == ("error: --plan-records: give a number of records >= 1, "
                                       "with --dry-run\n")


def test_hdf5_input_is_counted_from_its_shapes(tmp_path, capsys, monkeypatch):
    """HDF5 datasets say their length: the dry run plans without --plan-records (the last
    unit of a file had no stop, so the plan said HDF5 files have no index)."""
    monkeypatch.chdir(ROOT)
    sets = ["--set", f"output.path={tmp_path / 'clean'}", "--set", f"report={tmp_path / 'r'}"]
    assert main(["--config", "configs/dedupe-hdf5.yaml", "--dry-run", *sets]) == 0
    out = capsys.readouterr().out
    assert "not computed" not in out
    assert figure(out, "input").startswith("4,500 records of 64 values (256 B each)")


def test_tfrecord_input_is_counted_by_reading_it_when_small(tmp_path, capsys, monkeypatch):
    """TFRecord files have no index: a small input (at most WHOLE_BYTES, which the
    dry run's sample reads whole anyway) is counted by reading it, so the plan needs no
    --plan-records (it named what it lacked), and plans for a count it is given."""
    monkeypatch.chdir(ROOT)
    sets = ["--set", f"output.path={tmp_path / 'clean'}", "--set", f"report={tmp_path / 'r'}"]
    assert main(["--config", "configs/dedupe-tfrecord.yaml", "--dry-run", *sets]) == 0
    out = capsys.readouterr().out
    assert "not computed" not in out
    assert figure(out, "input").startswith("4,500 records of 64 values (256 B each)")
    assert main(["--config", "configs/dedupe-tfrecord.yaml", "--dry-run", *sets,
                 "--plan-records", "5000000"]) == 0
    stored = sum(p.stat().st_size for p in (ROOT / "data" / "sample" / "tfrecord").iterdir())
    assert figure(capsys.readouterr().out, "input") == (  # the files' bytes in proportion
        f"5,000,000 records of 64 values (256 B each), {stored * 5e6 / 4500 / 1e9:.2f} GB "
        "in files")


def test_a_large_json_lines_input_needs_a_record_count(tmp_path, capsys):
    """JSON lines above WHOLE_BYTES cannot be counted without reading them all: the plan
    names what it lacks, and plans once it is given the count."""
    from pipeline.capacity.workload import WHOLE_BYTES

    row = json.dumps({"id": "x" * 8, "v": [0.5] * 64})
    n = WHOLE_BYTES // len(row) + 1000
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text("".join(
        row.replace("x" * 8, f"{i:08d}") + "\n" for i in range(n)))
    cfg = {"input": {"format": "jsonl", "path": str(tmp_path / "in" / "*.jsonl"),
                     "tensor": "v", "id": "id"},
           "output": {"path": str(tmp_path / "clean")}, "report": str(tmp_path / "r")}
    assert dry_run(tmp_path, cfg)[0] == 0
    out = capsys.readouterr().out
    assert "capacity plan: not computed; the model lacks:" in out
    assert "records: jsonl files have no index to count them from: give --plan-records N" \
        in out
    assert dry_run(tmp_path, cfg, "--plan-records", "5000000")[0] == 0
    assert figure(capsys.readouterr().out, "input").startswith(
        "5,000,000 records of 64 values (512 B each)")


def test_plan_of_a_store_run_counts_the_stored_values_the_job_searches(tmp_path):
    """With a fingerprint store and near on, the job searches every stored value with the
    new records (docs/runs.md): the plan's near stage has the records and cells the job
    then reports, while --plan-records and the input line stay the new input's.

    Two earlier runs of 1,500 records put about 3,000 values in the store; the third
    run's 1,500 new records alone would plan 6 cells (partition_rows 250), with the store
    the job searches about 4,500 in 18. Records must match exactly (the store's commits
    say how many values it holds; the job's planner counts every record it receives).
    Cells: the count follows from the records (``NearSpec.cells``), so within one of the
    job's (k-means on another sample could leave a cell empty). Pairs compared come
    from a sample of another draw than the job's: within a factor 1.5 (the old plan was
    about 9x low)."""
    from pipeline.api import run_job

    dim, n = 16, 1_500
    x = embeddings(3 * n, dim=dim, clusters=60, seed=3)
    x[2 * n:2 * n + 150] = x[:150]  # the third day repeats some of the first
    for day in range(3):
        part = np.arange(day * n, (day + 1) * n)
        emb = pa.FixedSizeListArray.from_arrays(pa.array(x[part].reshape(-1)), dim)
        (tmp_path / "in" / f"d{day}").mkdir(parents=True)
        pq.write_table(pa.table({"id": [f"r{j}" for j in part], "emb": emb}),
                       tmp_path / "in" / f"d{day}" / "part.parquet")
    cfg = {"input": {"format": "parquet", "path": str(tmp_path / "in/{run_id}/*.parquet"),
                     "tensor": "emb", "id": "id"},
           "near": {"metric": "cosine", "threshold": 0.02, "partition_rows": 250,
                    "single_index_rows": 500},
           "store": {"path": str(tmp_path / "store")},
           "output": {"path": str(tmp_path / "out/{run_id}/clean")},
           "report": str(tmp_path / "out/{run_id}/report"),
           "runner": {"name": "local", "workers": 1, "processes": False}}
    kept = [run_job(cfg, run_id=f"d{day}", quiet=True).kept for day in range(2)]

    job = prepare(to_config(cfg, run_id="d2"))
    w = workload(job)
    assert w.records == n and w.stored.runs == 2 and w.stored.values == sum(kept)
    out = "\n".join(plan_lines(job))
    assert figure(out, "input").startswith(f"{n:,} records")
    assert figure(out, "store").startswith(f"{sum(kept):,} records of 2 earlier run(s), "
                                           "searched with this run's")
    near = figure(out, "near")
    planned = re.match(r"(exact|bounded) search in ([\d,]+) cell\(s\) of ([\d,]+) records "
                       rf"\({n:,} new \+ ([\d,]+) stored\)", near)
    assert planned, near
    cells, records = int(planned.group(2).replace(",", "")), int(planned.group(3).replace(",", ""))
    bigger = workload(job, 10 * n)  # --plan-records: the new input's records, store kept
    assert bigger.records == 10 * n and bigger.searched == 10 * n + sum(kept)

    run_job(cfg, run_id="d2", quiet=True)
    report = json.loads((tmp_path / "out/d2/report/summary.json").read_text())["near"]
    assert records == report["prediction"]["rows"] == n + sum(kept)
    assert abs(cells - report["cells"]) <= 1 and cells >= 15
    assert 1 / 1.5 <= w.near.work / report["pairs_compared"] <= 1.5, (w.near.work, report)


def test_plan_of_an_image_job_counts_its_decoding(tmp_path, vectors, capsys):
    """Decoding stored images is not in the rates: the dry run times it on the first
    file's images (decoded, then read as bytes) and adds it on every core (Pillow decodes
    in a pool, past the GIL). Left out, a job of 200k 28 x 28 PNGs took 27 s where the
    plan said 19 s; a job of numbers has no decode figure."""
    from tests.imagekit import HF_IMAGE, crops, encode

    pics = crops(600, 96, 128)
    pq.write_table(pa.table({"id": [f"p{i}" for i in range(len(pics))],
                             "image": pa.array([{"bytes": encode(p, "JPEG", quality=90),
                                                 "path": None} for p in pics], HF_IMAGE)}),
                   tmp_path / "train.parquet")
    cfg = config(tmp_path, str(tmp_path / "train.parquet"), near=False)
    cfg["input"].update({"tensor": "image", "decode": "image", "resize": [32, 32],
                         "channels": 3})
    assert dry_run(tmp_path, cfg)[0] == 0
    out = capsys.readouterr().out
    timed = re.match(r"([\d,]+) us of one core per image, timed here on ([\d,]+) of the "
                     r"first file's images \(not in the rates\)$", figure(out, "decode"))
    assert timed and int(timed.group(1).replace(",", "")) > 0
    assert 0 < int(timed.group(2).replace(",", "")) <= len(pics)
    assert "decode " in figure(out, "wall time")  # among the longest steps
    rates = Rates.load()
    job = prepare(to_config(cfg))
    w = workload(job)
    c = cluster(job.cfg.runner, rates)
    with_decode = predict(w, c, rates, False)
    without = predict(dataclasses.replace(w, decode_s=0.0), c, rates, False)
    assert with_decode.steps["decode"] == pytest.approx(w.records * w.decode_s)
    assert with_decode.wall_s == pytest.approx(without.wall_s + w.records * w.decode_s)
    numbers = workload(prepare(to_config(config(tmp_path, vectors, near=False))))
    assert numbers.decode_timed == 0 and "decode" not in predict(numbers, c, rates, False).steps


def test_a_large_arrow_input_is_counted_from_its_batches(tmp_path, capsys):
    """A saved dataset above WHOLE_BYTES: a local Arrow stream's records are counted from
    its batches' headers (no --plan-records needed, unlike JSON lines of that size)."""
    import pyarrow as pa

    from pipeline.capacity.workload import WHOLE_BYTES

    n = WHOLE_BYTES // (64 * 8) + 1000
    table = pa.table({"id": [f"{i:08d}" for i in range(n)],
                      "v": pa.FixedSizeListArray.from_arrays(pa.array(np.full(n * 64, 0.5)), 64)})
    (tmp_path / "in").mkdir()
    with pa.ipc.new_stream(str(tmp_path / "in" / "data-00000-of-00001.arrow"),
                           table.schema) as w:
        for batch in table.to_batches(max_chunksize=1000):
            w.write_batch(batch)
    assert (tmp_path / "in" / "data-00000-of-00001.arrow").stat().st_size > WHOLE_BYTES
    cfg = {"input": {"format": "arrow", "path": str(tmp_path / "in" / "*.arrow"),
                     "tensor": "v", "id": "id"},
           "output": {"path": str(tmp_path / "clean")}, "report": str(tmp_path / "r")}
    assert dry_run(tmp_path, cfg)[0] == 0
    assert figure(capsys.readouterr().out, "input").startswith(
        f"{n:,} records of 64 values (512 B each)")

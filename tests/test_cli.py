"""The command line: one-line errors with exit code 2 before any work, --help, atomic outputs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from pipeline.config import describe_keys
from pipeline.run import main
from tests.jobkit import run_job, write_input

ROOT = Path(__file__).resolve().parents[1]


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "Traceback" not in err[0]
    return err[0]


@pytest.mark.parametrize("sets,overrides,words", [
    ((), {"input": {"tensor": "embedding"}}, "input.tensor: no column 'embedding'"),
    ((), {"input": {"id": "key"}}, "input.id: no column 'key'"),
    ((), {"input": {"dtype": "float64"}}, "input.dtype: column 'emb' holds float32"),
    ((), {"input": {"shape": [5]}}, "input.shape"),
    (("keep={max: nope}",), {}, "keep: no column 'nope'"),
    (("keep=middle",), {}, "config key 'keep'"),
    (("tuning.shards=0",), {}, "tuning.shards"),
    (("runner.options.direct_running_mode=multi_threading",), {}, "loses shuffle elements"),
    (("near.metric=l2",), {}, "config key 'near': metric l2 needs a threshold > 0"),
    (("near.metric=cosine", "near.threshold=-1"), {}, "config key 'near.threshold'"),
    (("near.metric=hamming",), {}, "config key 'near.metric'"),
    (("near.metric=jacard", "near.threshold=0.8"), {},
     "'jacard' is not one of allclose, l2, cosine, correlation, jaccard: did you mean jaccard?"),
    (("near.metric=allclose", "near.probe=3"), {},
     "unknown key near.probe: did you mean near.probes?"),
    ((), {"input": {"tensr": "emb"}}, "unknown key input.tensr: did you mean input.tensor?"),
    (("input.format=ndjson",), {}, "'input.format': 'ndjson' is not one of parquet, tfrecord, "
     "hdf5, jsonl, arrow, csv, npy, npz, megatron: JSON lines (one object per line) are read "
     "with input.format: jsonl"),
    (("input.format=CSV",), {}, "'CSV' is not one of parquet, tfrecord, hdf5, jsonl, arrow, "
     "csv, npy, npz, megatron: delimited text with a header line (comma or tab) is read with "
     "input.format: csv"),
    (("input.format=jpg",), {}, "'jpg' is not read (the job reads parquet, tfrecord, hdf5, "
     "jsonl, arrow, csv, npy, npz, megatron): image files are read through a Parquet index of "
     "their paths"),
    (("near.metric=allclose", "near.mode=fast"), {}, "config key 'near.mode'"),
    (("near.metric=allclose", "near.probes=0"), {}, "config key 'near.probes'"),
    (("near.metric=allclose", "near.device=tpu"), {}, "config key 'near.device'"),
    (("near.metric=allclose", "near.recall_sample=-1"), {}, "config key 'near.recall_sample'"),
    (("near.metric=allclose", "exact=false"), {}, "set exact: true or remove near"),
    (("near.metric=cosine", "near.threshold=.inf"), {},
     "config key 'near.threshold': inf is not a finite number"),
    (("near.metric=cosine", "near.threshold=.nan"), {}, "'near.threshold': nan is not a finite"),
    (("near.metric=l2", "near.threshold=1.0e+300"), {}, "'near.threshold': 1e+300 is out of range"),
    (("near.metric=cosine", "near.threshold=3"), {}, "cosine distance is at most 2"),
    (("near.metric=l2", "near.threshold=true"), {},  # it was taken as 1.0
     "config key 'near.threshold': a number is needed, not true"),
    (("near.metric=l2", "near.threshold=5e-324"), {},  # the job failed in its Report step
     "near.threshold 4.94066e-324 is below the smallest normal float64 (2.225e-308)"),
    (("near.metric=cosine", "near.threshold=0.1", "near.index=hnsw", "near.device=cuda"), {},
     "near.index hnsw searches each cell with a FAISS index on the CPU"),
    (("near.metric=allclose", "near.atol=-1"), {}, "'near.atol': -1 is out of range"),
    pytest.param(("near.metric=cosine", "near.threshold=0.1", "near.device=cuda"), {},
                 "near.device: cuda, but torch sees no CUDA device on this machine",
                 marks=pytest.mark.skipif(os.path.exists("/dev/nvidiactl"), reason="a GPU")),
    (("near.metric=allclose", "near.threshold=1.0"), {},
     "near.threshold 1 applies to l2, cosine, correlation and jaccard; allclose compares"),
    (("near.metric=l2", "near.threshold=1.0", "near.atol=0.5"), {},
     "near.atol applies to metric allclose only; l2 compares with near.threshold"),
    (("near.metric=cosine", "near.threshold=0.1", "near.rtol=0.1"), {},
     "near.rtol applies to metric allclose only"),
    (("max_invalid_fraction=1.5",), {}, "'max_invalid_fraction': 1.5 is out of range"),
    (("tuning.remote_timeout_s=0",), {}, "'tuning.remote_timeout_s': 0 is out of range"),
    (("threshold=!!python/object:os.system x",), {}, "--set threshold: '!!python/object:os.system"
                                                     " x' is not a YAML value"),
    (("keep={",), {}, "--set keep: '{' is not a YAML value"),
    (("runner.name=daks",), {}, "config key 'runner.name': 'daks' is not a runner: did you "
                                "mean dask?"),
])
def test_bad_config_or_input_exits_2_with_one_line(tmp_path, parquet_in, capsys, sets,
                                                   overrides, words):
    assert run_job(tmp_path, "parquet", parquet_in, *sets, **overrides) == 2
    assert words in one_error_line(capsys)
    assert not (tmp_path / "out").exists()  # stopped before any work


def test_near_on_complex_tensors_is_refused(tmp_path, capsys):
    x = (np.arange(80) + 1j).astype(np.complex64).reshape(20, 4)
    write_input("hdf5", tmp_path / "in" / "c.h5", [f"r{i}" for i in range(20)], x,
                np.zeros(20, int))
    assert run_job(tmp_path, "hdf5", str(tmp_path / "in" / "*.h5"),
                   "near.metric=allclose") == 2
    assert "near: the tensors are complex64" in one_error_line(capsys)


@pytest.mark.parametrize("where", ["dir", "under_a_file"])
def test_unreadable_config_path_is_one_line(tmp_path, capsys, where):
    (tmp_path / "f").write_text("x")
    path = tmp_path if where == "dir" else tmp_path / "f" / "job.yaml"
    assert main(["--config", str(path)]) == 2
    assert "cannot be read" in one_error_line(capsys)


def test_missing_input_files(tmp_path, capsys):
    assert run_job(tmp_path, "parquet", str(tmp_path / "nothing" / "*.parquet")) == 2
    assert "input.path: no files match" in one_error_line(capsys)


def test_output_inside_input_is_refused(tmp_path, parquet_in, capsys):
    assert run_job(tmp_path, "parquet", parquet_in,
                   f"output.path={tmp_path / 'in'}") == 2
    assert "contains input or reference files" in one_error_line(capsys)
    assert run_job(tmp_path, "parquet", str(tmp_path / "**" / "*.parquet"),
                   f"output.path={tmp_path / 'in' / 'clean'}") == 2
    assert "matched by input.path" in one_error_line(capsys)


def test_an_output_beside_the_inputs_that_the_glob_does_not_reach_is_taken(tmp_path,
                                                                              parquet_in):
    """``in/*.parquet`` names no file of ``in/clean/`` (``*`` stays within a folder, as
    the input's glob reads it): the commonest layout was refused as "matched by
    input.path" (the check used fnmatch, whose ``*`` crosses "/"). The rerun reads the
    inputs only, not the first run's output."""
    for run in (1, 2):
        assert run_job(tmp_path, "parquet", parquet_in, f"output.path={tmp_path / 'in' / 'clean'}",
                       f"report={tmp_path / 'in' / 'report'}", "output.overwrite=true") == 0
        s = json.loads((tmp_path / "in" / "report" / "summary.json").read_text())
        assert (s["read"], s["kept"], s["removed_exact"]) == (10, 5, 5), (run, s)


def test_a_cosine_threshold_below_float64s_resolution_is_warned_of(tmp_path, parquet_in,
                                                                    capsys):
    """1 - cos of 4 float64 values is rounded by about 12 x 2^-52 (2.7e-15): at 1e-16 a
    removal can be beyond the threshold in exact arithmetic (Sweep J: 8 of 80), silently;
    at 1e-6 no word."""
    assert run_job(tmp_path, "parquet", parquet_in, "near.metric=cosine",
                   "near.threshold=1e-16") == 0
    err = capsys.readouterr().err
    assert ("warning: near.threshold 1e-16 is below what float64 resolves of 1 - cos over 4 "
            "values (about 2.7e-15)") in err, err
    assert run_job(tmp_path, "parquet", parquet_in, "near.metric=cosine",
                   "near.threshold=1e-6", "output.overwrite=true") == 0
    assert "warning" not in capsys.readouterr().err


def test_an_input_file_this_user_cannot_read_is_one_line_before_any_work(tmp_path,
                                                                          parquet_in):
    """A file of the glob without read permission: a 38-line traceback from the checks
    (Sweep K). Root reads it anyway, so as root the command runs without the capability
    that lets it (setpriv), as another user would."""
    import shutil

    blocked = tmp_path / "in" / "b.parquet"
    shutil.copy(tmp_path / "in" / "a.parquet", blocked)
    blocked.chmod(0)
    cfg = tmp_path / "job.yaml"
    cfg.write_text(json.dumps({"input": {"format": "parquet", "path": parquet_in,
                                         "tensor": "emb", "id": "id"},
                               "output": {"path": str(tmp_path / "out")},
                               "report": str(tmp_path / "rep")}))
    argv = [sys.executable, "-m", "pipeline.run", "--config", str(cfg), "--quiet"]
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("root without setpriv: root reads any file")
        caps = "-dac_override,-dac_read_search"
        argv = ["setpriv", f"--inh-caps={caps}", f"--bounding-set={caps}", *argv]
    done = subprocess.run(argv, cwd=Path(__file__).parent.parent, capture_output=True,
                          text=True, timeout=300)
    assert (done.returncode, done.stderr.splitlines()) == (2, [
        f"error: input.path: {blocked} cannot be read (Permission denied): give this user "
        "read access, or leave the file out of the glob"]), done.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "rep").exists()


def test_existing_output_needs_overwrite(tmp_path, parquet_in, capsys):
    assert run_job(tmp_path, "parquet", parquet_in) == 0
    first = json.loads((tmp_path / "out" / "report" / "summary.json").read_text())
    capsys.readouterr()
    assert run_job(tmp_path, "parquet", parquet_in) == 2
    assert "already exists" in one_error_line(capsys)
    assert run_job(tmp_path, "parquet", parquet_in, "output.overwrite=true") == 0
    again = json.loads((tmp_path / "out" / "report" / "summary.json").read_text())
    assert again["kept"] == first["kept"] == 5
    leftovers = [p.name for p in (tmp_path / "out").iterdir() if p.name.startswith(".")]
    assert leftovers == []


def test_on_invalid_fail_stops_and_publishes_nothing(tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"id": ["a", "b"], "emb": pa.array([[1.0], None],
                                                                pa.list_(pa.float32()))}),
                   tmp_path / "in" / "a.parquet")
    assert run_job(tmp_path, "parquet", str(tmp_path / "in" / "*.parquet"),
                   "on_invalid=fail") == 1
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "invalid record b" in line and "on_invalid" in line
    # what is true of the outputs, not a summary.json that reads as if it was deleted
    assert line.startswith("error: the job failed; nothing was published (the previous "
                           "output, if any, is unchanged): ") and "summary.json" not in line
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_flags_are_not_abbreviated(tmp_path, capsys):
    """--overwrit is refused, not taken as --overwrite (argparse's prefix matching)."""
    with pytest.raises(SystemExit) as e:
        main(["--config", str(tmp_path / "job.yaml"), "--quiet", "--overwrit"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "unknown flag '--overwrit': did you mean --overwrite?" in err and err.count("\n") == 1


def test_help_documents_every_key():
    out = subprocess.run([sys.executable, "-m", "pipeline.run", "--help"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout
    for line in describe_keys():
        assert line.split()[0] in out
    for key in ("input.format", "input.path", "keep", "on_invalid", "runner.options",
                "output.overwrite", "--set"):
        assert key in out


def test_subprocess_bad_config_has_no_traceback(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("input: {format: excel, path: x, tensor: t}\noutput: {path: o}\nreport: r\n")
    r = subprocess.run([sys.executable, "-m", "pipeline.run", "--config", str(cfg)], cwd=ROOT,
                       capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [r.stderr.strip()] and "input.format" in r.stderr


@pytest.mark.parametrize("config", ["dedupe.yaml", "dedupe-near.yaml", "dedupe-npy.yaml"])
def test_shipped_sample_jobs_match_expected(tmp_path, config):
    """configs/dedupe*.yaml on the shipped sample data, as a user runs them (paths redirected)."""
    r = subprocess.run([sys.executable, "-m", "pipeline.run", "--config", f"configs/{config}",
                        "--set", f"output.path={tmp_path / 'clean'}",
                        "--set", f"report={tmp_path / 'report'}"],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    expected = json.loads((ROOT / "data" / "sample" / "EXPECTED.json").read_text())
    near = expected.pop("near")
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    assert {k: summary[k] for k in ("read", "removed_exact")} == {
        k: expected[k] for k in ("read", "removed_exact")}
    assert "[read]" in r.stderr
    if config != "dedupe-near.yaml":
        assert summary["kept"] == expected["kept"] and summary["removed_near"] == 0
        assert f"kept {expected['kept']:,}" in r.stdout
    else:
        assert summary["near"]["settings"]["threshold"] == near["threshold"]
        assert (summary["removed_near"], summary["kept"]) == (near["removed_near"], near["kept"])
        assert (tmp_path / "report" / "near_distances.png").exists()


def _shipped(config: str, tmp_path: Path, data: str) -> tuple[subprocess.CompletedProcess,
                                                            dict, dict]:
    """configs/``config`` run as a user runs it (outputs redirected under ``tmp_path``):
    the process, its summary.json and data/``data``/EXPECTED.json."""
    r = subprocess.run([sys.executable, "-m", "pipeline.run", "--config", f"configs/{config}",
                        "--set", f"output.path={tmp_path / 'clean'}",
                        "--set", f"report={tmp_path / 'report'}"],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return (r, json.loads((tmp_path / "report" / "summary.json").read_text()),
            json.loads((ROOT / "data" / data / "EXPECTED.json").read_text()))


def test_shipped_feature_job_removes_the_planted_copies_and_no_other_row(tmp_path):
    """configs/dedupe-features.yaml on data/features/cancer.csv as a user runs it: the
    counts of EXPECTED.json; each removal pairs a row with the copy planted from it
    (the id before '-again' / '-remeasured'; whichever comes first is kept), the rows
    with a missing value are invalid, and the clean CSV (read back by pandas, every
    column kept) holds every other row."""
    import pandas as pd

    r, summary, expected = _shipped("dedupe-features.yaml", tmp_path, "features")
    assert "RuntimeWarning" not in r.stderr, r.stderr
    assert {k: summary[k] for k in expected} == expected
    dups = pq_rows(tmp_path / "report" / "duplicates.parquet")
    for d in dups:
        a, b = d["record_id"].split("-"), d["duplicate_of"].split("-")
        assert a[0] == b[0] and {*a[1:], *b[1:]} == {"again" if d["kind"] == "exact"
                                                    else "remeasured"}, d
    source = pd.read_csv(ROOT / "data" / "features" / "cancer.csv")
    clean = pd.read_csv(tmp_path / "clean" / "cancer.csv")
    assert list(clean.columns) == list(source.columns)
    gone = {d["record_id"] for d in dups}
    assert sorted(clean["patient"]) == sorted(
        p for p in source["patient"] if p not in gone and not p.endswith("-incomplete"))


def test_shipped_text_job_removes_the_planted_copies_and_no_other_page(tmp_path):
    """configs/dedupe-text.yaml on data/text/ as a user runs it: the counts of
    EXPECTED.json; each near removal names the page its note says it was made from;
    the clean shards (read back by pyarrow, with their extra column) hold every other
    record, no two of them at Jaccard >= the threshold (all pairs, word 5-grams computed
    here in plain Python), and each near removal is that near its kept page."""
    import re
    import unicodedata

    import pyarrow.parquet as pq

    _, summary, expected = _shipped("dedupe-text.yaml", tmp_path, "text")
    assert (summary["read"], summary["removed_exact"], summary["removed_near"],
            summary["invalid"], summary["kept"]) == (
        expected["records"], expected["exact"], expected["near"], expected["invalid"],
        expected["kept"])
    source = pq.read_table(ROOT / "data" / "text" / "parquet").to_pylist()
    text = {s["url"]: s["text"] for s in source}
    dups = pq_rows(tmp_path / "report" / "duplicates.parquet")
    page = "https://docs.python.org/3/reference/{}.html"
    near = [d for d in dups if d["kind"] == "near"]
    notes = {s["url"]: s["note"] for s in source}
    assert sorted(notes[d["record_id"]] for d in near) == sorted(
        n for n in notes.values() if n.startswith("near"))
    for d in near:
        assert d["duplicate_of"] == page.format(notes[d["record_id"]][6:].split(",")[0])

    def shingles(t: str) -> set:
        w = re.findall(r"[^\W_]+", unicodedata.normalize("NFKC", t).lower())
        return {tuple(w[i:i + 5]) for i in range(max(1, len(w) - 4))}

    clean = pq.read_table(tmp_path / "clean").to_pylist()
    assert set(clean[0]) == {"url", "text", "note"}
    gone = {d["record_id"] for d in dups} | {s["url"] for s in source if not s["text"]}
    assert sorted(c["url"] for c in clean) == sorted(set(text) - gone)
    sets = [shingles(c["text"]) for c in clean]
    t = expected["threshold"]
    assert all(len(a & b) < t * len(a | b) for i, a in enumerate(sets) for b in sets[:i])
    for d in near:
        a, b = shingles(text[d["record_id"]]), shingles(text[d["duplicate_of"]])
        j = len(a & b) / len(a | b)
        assert j >= t and j == pytest.approx(1 - d["distance"], abs=1e-12)


def test_shipped_json_lines_text_job_gives_the_parquet_jobs_removals(tmp_path):
    """configs/dedupe-text-jsonl.yaml (the sample's rows as one gzip JSON lines file) as
    a user runs it, beside configs/dedupe-text.yaml: the same removals and invalid
    records; its clean copy, read back by Python's gzip and json, is the kept lines of
    the input in order, and holds the rows of the Parquet job's clean shards."""
    import gzip

    import pyarrow.parquet as pq

    got = {}
    for name in ("dedupe-text.yaml", "dedupe-text-jsonl.yaml"):
        r = subprocess.run([sys.executable, "-m", "pipeline.run", "--config", f"configs/{name}",
                            "--set", f"output.path={tmp_path / name / 'clean'}", "--set",
                            f"report={tmp_path / name / 'report'}"],
                           cwd=ROOT, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        got[name] = [pq_rows(tmp_path / name / "report" / f) for f in (
            "duplicates.parquet", "invalid.parquet")]
    dups, invalid = got["dedupe-text-jsonl.yaml"]
    assert [(d["record_id"], d["duplicate_of"], d["kind"]) for d in dups] == [
        (d["record_id"], d["duplicate_of"], d["kind"]) for d in got["dedupe-text.yaml"][0]]
    assert [i["reason"] for i in invalid] == [i["reason"] for i in got["dedupe-text.yaml"][1]]
    lines = gzip.decompress((ROOT / "data" / "text" / "jsonl" / "pages.jsonl.gz").read_bytes()
                            ).splitlines(keepends=True)
    gone = {d["record_id"] for d in dups} | {i["record_id"] for i in invalid}
    clean = gzip.decompress((tmp_path / "dedupe-text-jsonl.yaml" / "clean" / "pages.jsonl.gz"
                             ).read_bytes()).splitlines(keepends=True)
    assert clean == [x for x in lines if json.loads(x)["url"] not in gone]
    parquet = pq.read_table(tmp_path / "dedupe-text.yaml" / "clean").to_pylist()
    assert [json.loads(x) for x in clean] == parquet


def test_shipped_megatron_job_removes_the_text_jobs_pages(tmp_path):
    """configs/dedupe-text-megatron.yaml (the text sample's rows tokenized as a Megatron
    dataset) as a user runs it: the planted copies removed and the empty page invalid, as
    the text job does (the page re-wrapped in upper case is an exact copy here: the
    tokenizer is uncased), nothing else; the clean pair, read by Megatron's own
    IndexedDataset, holds every other document's tokens in order."""
    import warnings

    import pyarrow.parquet as pq

    with warnings.catch_warnings():  # "Transformer Engine and Apex are not installed"
        warnings.simplefilter("ignore", UserWarning)
        from megatron.core.datasets.indexed_dataset import IndexedDataset

    _, summary, expected = _shipped("dedupe-text-megatron.yaml", tmp_path, "text")
    assert (summary["read"], summary["invalid"], summary["kept"]) == (
        expected["records"], expected["invalid"], expected["kept"])
    rows = pq.read_table(ROOT / "data" / "text" / "parquet").to_pylist()
    notes = [r["note"] for r in rows]
    row = {f"data/text/megatron/pages.idx:{i}": i for i in range(len(notes))}  # (as named)
    dups = pq_rows(tmp_path / "report" / "duplicates.parquet")
    invalid = pq_rows(tmp_path / "report" / "invalid.parquet")
    again = {i for i, r in enumerate(rows) if r["text"] in {q["text"] for q in rows[:i]}}
    assert sorted(row[d["record_id"]] for d in dups) == sorted(  # (if and else: one page)
        {i for i, n in enumerate(notes) if n.startswith(("near", "exact"))} | again)
    assert [notes[row[i["record_id"]]] for i in invalid] == ["invalid: empty"]
    gone = {row[d["record_id"]] for d in dups} | {row[i["record_id"]] for i in invalid}
    source = IndexedDataset(str(ROOT / "data" / "text" / "megatron" / "pages"))
    clean = IndexedDataset(str(tmp_path / "clean" / "pages"))
    assert [clean[i].tolist() for i in range(len(clean))] == [
        source[i].tolist() for i in range(len(notes)) if i not in gone]


def test_input_path_naming_a_directory_suggests_a_glob(tmp_path, capsys):
    """Users point input.path at the folder their files are in: one line, exit 2, the
    glob to write."""
    (tmp_path / "data").mkdir()
    assert run_job(tmp_path, "tfrecord", str(tmp_path / "data")) == 2
    line = one_error_line(capsys)
    assert "is a directory" in line and f"'{tmp_path / 'data'}/*.tfrecord*'" in line


def test_literal_path_with_glob_characters_is_that_file(tmp_path, capsys):
    """A file named ``my file [1].parquet`` named as it is: read it, not ``my file
    1.parquet`` (what ``[1]`` matches as a glob), and not "no files match"."""
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    write_input("parquet", tmp_path / "in" / "my file [1].parquet", ["a", "b", "c"], x,
                np.zeros(3, int))
    path = str(tmp_path / "in" / "my file [1].parquet")
    assert run_job(tmp_path, "parquet", path) == 0
    files = pq_rows(tmp_path / "out" / "report" / "files.parquet")
    assert [f["path"] for f in files] == [path]
    write_input("parquet", tmp_path / "in" / "my file 1.parquet", ["d", "e"], x[:2],
                np.zeros(2, int))
    assert run_job(tmp_path, "parquet", path, "output.overwrite=true") == 0
    assert [f["path"] for f in pq_rows(tmp_path / "out" / "report" / "files.parquet")] == [path]
    capsys.readouterr()


def test_input_files_of_several_dtypes_get_a_note(tmp_path, capsys):
    """float32 in one file, float64 in another: never exact copies of each other (dtype
    is part of the identity), so the run says so in one note (not with --quiet)."""
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    write_input("parquet", tmp_path / "in" / "a.parquet", ["a", "b", "c"], x, np.zeros(3, int))
    write_input("parquet", tmp_path / "in" / "b.parquet", ["d", "e", "f"], x.astype(np.float64),
                np.zeros(3, int))
    assert run_job(tmp_path, "parquet", str(tmp_path / "in" / "*.parquet")) == 0
    assert capsys.readouterr().err == ""  # --quiet
    assert main(["--config", str(tmp_path / "job.yaml"), "--overwrite"]) == 0  # not quiet
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note:")]
    assert notes == [f"note: the input files hold tensors of 2 dtypes (float32 in "
                     f"{tmp_path / 'in' / 'a.parquet'}, float64 in "
                     f"{tmp_path / 'in' / 'b.parquet'}): dtype is part of a record's "
                     "identity, so records in files of different dtypes are never exact "
                     "copies of each other; cast the files to one dtype to compare them"]


def pq_rows(path) -> list[dict]:
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()


def test_glob_matching_folders_links_or_spark_markers_is_refused(tmp_path, capsys):
    """What a glob matches but would not read is said, never skipped silently: a Spark
    ``out.parquet/`` folder of part files under ``*.parquet``, a broken symbolic link
    (matched or named; a loop of links), a FIFO, and Spark's ``_SUCCESS`` / ``.crc`` files
    under ``*``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    data = tmp_path / "data"
    write_input("parquet", data / "plain.parquet", ["a", "b", "c"], x, np.zeros(3, int))
    spark = data / "out.parquet"
    for k in range(2):
        write_input("parquet", spark / f"part-0000{k}-abc.snappy.parquet", [f"p{k}"], x[:1],
                    np.zeros(1, int))
    (spark / "_SUCCESS").write_bytes(b"")
    assert run_job(tmp_path, "parquet", str(data / "*.parquet")) == 2
    line = one_error_line(capsys)
    assert f"matches directory {spark}/ whose files it does not read" in line
    assert f"'{data}/**/*.parquet'" in line
    assert run_job(tmp_path, "parquet", str(data / "**" / "*.parquet")) == 0  # as suggested
    assert len(pq.read_table(tmp_path / "out" / "report" / "files.parquet")) == 3
    capsys.readouterr()
    assert run_job(tmp_path, "parquet", str(spark / "*")) == 2
    line = one_error_line(capsys)
    assert "_SUCCESS is a Spark/Hadoop job marker" in line and f"'{spark}/*.parquet'" in line
    (spark / "_SUCCESS").unlink()
    (spark / "part-00000-abc.snappy.parquet.crc").write_bytes(b"\x00" * 8)
    assert run_job(tmp_path, "parquet", str(spark / "*")) == 2
    assert ".crc is a Spark/Hadoop job marker or checksum file" in one_error_line(capsys)
    links = tmp_path / "links"
    links.mkdir()
    pq.write_table(pa.table({"id": ["a"], "emb": pa.array([[1.0]])}), links / "real.parquet")
    (links / "gone.parquet").symlink_to(tmp_path / "nowhere.parquet")
    for path in (links / "*.parquet", links / "gone.parquet"):
        assert run_job(tmp_path, "parquet", str(path)) == 2
        line = one_error_line(capsys)
        assert f"{links / 'gone.parquet'} is a broken symbolic link" in line, line
        assert "no files match" not in line
    (links / "gone.parquet").unlink()  # a loop of links: said as one (Sweep K: "does not
    (links / "a.parquet").symlink_to("b.parquet")  # exist" of a link that exists)
    (links / "b.parquet").symlink_to("a.parquet")
    assert run_job(tmp_path, "parquet", str(links / "*.parquet")) == 2
    assert "(to 'b.parquet', which leads back to a link already followed: a loop)" in (
        one_error_line(capsys))
    (links / "a.parquet").unlink()
    (links / "b.parquet").unlink()
    os.mkfifo(links / "pipe.parquet")  # skipped without a word, exit 0 (Sweep K)
    assert run_job(tmp_path, "parquet", str(links / "*.parquet")) == 2
    assert one_error_line(capsys) == (
        f"error: input.path: {links / 'pipe.parquet'} is not a file (a FIFO, socket or "
        "device): leave it out of the glob")


@pytest.mark.parametrize("store", ["out/report", "out/clean", "out/clean/store", "out"])
def test_store_overlapping_the_output_or_report_is_refused_before_any_work(
        tmp_path, parquet_in, capsys, store):
    """A store in the report or output directory would be replaced by their swap (or
    half-published by a failed run): refused with exit 2, a good earlier run untouched."""
    assert run_job(tmp_path, "parquet", parquet_in) == 0
    before = {p: p.read_bytes() for p in (tmp_path / "out").rglob("*") if p.is_file()}
    capsys.readouterr()
    assert run_job(tmp_path, "parquet", parquet_in, f"store.path={tmp_path / store}",
                   "output.overwrite=true") == 2
    line = one_error_line(capsys)
    assert "store.path:" in line and "overlap" in line
    assert {p: p.read_bytes() for p in (tmp_path / "out").rglob("*") if p.is_file()} == before


def test_output_that_is_a_store_is_never_replaced(tmp_path, parquet_in, capsys):
    assert run_job(tmp_path, "parquet", parquet_in, f"store.path={tmp_path / 'st'}") == 0
    before = sorted(p.name for p in (tmp_path / "st").iterdir())
    assert "STORE.json" in before
    capsys.readouterr()
    assert run_job(tmp_path, "parquet", parquet_in, f"output.path={tmp_path / 'st'}",
                   f"report={tmp_path / 'r2'}", "output.overwrite=true") == 2
    assert "output.path:" in (line := one_error_line(capsys)) and "fingerprint store" in line
    assert sorted(p.name for p in (tmp_path / "st").iterdir()) == before
    assert not (tmp_path / "r2").exists()


@pytest.mark.parametrize("where", ["st/runs/day1", "st/runs", "st/commits/a/b", "misc",
                                   "misc/README.md"])
def test_store_path_inside_a_store_or_over_other_files_is_refused_before_any_work(
        tmp_path, parquet_in, capsys, where):
    """A store inside another store's folder was accepted, then deleted by the outer
    store (its rerun of that run id prunes the run folder); a path into a store by
    mistake (st/runs) was a new, empty store no run was checked against; a folder of
    other files got a store written beside them. Each is refused: exit 2, one line naming
    store.path and the fix, nothing written."""
    st = tmp_path / "st"
    assert run_job(tmp_path, "parquet", parquet_in, f"store.path={st}") == 0
    (tmp_path / "misc").mkdir()
    (tmp_path / "misc" / "README.md").write_text("mine")
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    capsys.readouterr()
    target = tmp_path / where
    assert run_job(tmp_path, "parquet", parquet_in, f"store.path={target}",
                   f"output.path={tmp_path / 'o2' / 'clean'}", f"report={tmp_path / 'o2' / 'r'}"
                   ) == 2
    line = one_error_line(capsys)
    if where.startswith("st/"):
        assert line == (f"error: store.path: {target} is inside the fingerprint store {st} "
                        "(it holds STORE.json; the outer store would delete a store inside "
                        f"it): set store.path to {st} to use that store, or to a folder "
                        "outside it for a new one")
    elif where == "misc":
        assert line == (f"error: store.path: {target} is a folder of other files (README.md) "
                        "and no fingerprint store (no STORE.json): set store.path to a new or "
                        "empty folder for a new store, or to the folder that holds the "
                        "store's STORE.json")
    else:
        assert line == (f"error: store.path: {target} is a file, not a fingerprint store: set "
                        "store.path to a new or empty folder (or an existing store's)")
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
    assert not (tmp_path / "o2").exists()


def test_store_path_of_an_empty_folder_or_an_uncommitted_first_run_is_a_store(
        tmp_path, parquet_in):
    """What a first run killed before its commit left (runs/, no STORE.json yet) and an
    empty folder are stores to be: accepted."""
    (tmp_path / "st" / "runs" / "day0" / "123-abc").mkdir(parents=True)
    (tmp_path / "empty").mkdir()
    for i, st in enumerate(("st", "empty")):
        assert run_job(tmp_path, "parquet", parquet_in, f"store.path={tmp_path / st}",
                       f"output.path={tmp_path / f'o{i}' / 'clean'}",
                       f"report={tmp_path / f'o{i}' / 'r'}") == 0
        assert (tmp_path / st / "STORE.json").is_file()


@pytest.mark.parametrize("key,plant", [
    ("output.path", {"my_h5/a.h5": "x", "my_h5/NOTES.txt": "notes"}),
    ("report", {"rep/thesis.tex": "important"}),
    ("report", {"rep/summary.json": "{}", "rep/duplicates.parquet/notes.md": "mine"}),
    ("output.path", {"afile": "hi"}),
    ("output.path", {"h5_run/part-00000.h5": "an HDF5 run's shard"}),
])
def test_overwrite_never_deletes_what_tensordedup_did_not_write(tmp_path, parquet_in, capsys,
                                                                key, plant):
    for rel, text in plant.items():
        (tmp_path / "v" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "v" / rel).write_text(text)
    target = tmp_path / "v" / next(iter(plant)).split("/")[0]
    assert run_job(tmp_path, "parquet", parquet_in, f"{key}={target}", "output.overwrite=true") == 2
    line = one_error_line(capsys)
    assert line.startswith(f"error: {key}: {target} ") and "yourself" in line
    if target.is_file():
        assert "is a file" in line
    elif target.name == "h5_run":  # an earlier run's output of another input.format
        assert "(part-00000.h5: another input.format's clean shards?)" in line, line
    else:
        assert "files of your own?" in line and ("notes" in line.lower()
                                                 or "thesis.tex" in line), line
    assert {str(p.relative_to(tmp_path / "v")): p.read_text()
            for p in (tmp_path / "v").rglob("*") if p.is_file()} == plant
    assert not (tmp_path / "out").exists()  # refused before any work


@pytest.mark.parametrize("fmt,sets", [
    ("parquet", ("near.metric=l2", "near.threshold=0.5", "tuning.report_file_rows=0")),
    ("tfrecord", ()),
    ("hdf5", ("tuning.report_file_rows=0",)),
])
def test_overwrite_replaces_an_earlier_run_in_every_format_and_layout(tmp_path, capsys, fmt,
                                                                      sets):
    x = np.arange(64, dtype=np.float32).reshape(16, 4)
    x[8:] = x[:8]
    for sub in ("a", "b"):  # shards in subfolders of the output
        write_input(fmt, tmp_path / "in" / sub / f"p.{fmt}", [f"{sub}{i}" for i in range(16)],
                    x, np.zeros(16, int))
    (tmp_path / "out" / "clean").mkdir(parents=True)  # an empty folder is no one's
    glob = str(tmp_path / "in" / "*" / f"*.{fmt}")
    shape = {"input": {"shape": [4]}} if fmt == "tfrecord" else {}
    for _ in range(2):
        assert run_job(tmp_path, fmt, glob, *sets, "output.overwrite=true", **shape) == 0
    assert json.loads((tmp_path / "out" / "report" / "summary.json").read_text())["kept"] == 8
    assert sorted(p.relative_to(tmp_path / "out" / "clean").as_posix()
                  for p in (tmp_path / "out" / "clean").rglob("*") if p.is_file()) == [
        f"a/p.{fmt}", f"b/p.{fmt}"]


@pytest.mark.parametrize("ref", ["in/a.parquet", "in/*.parquet", "link/a.parquet"])
def test_reference_files_that_are_input_files_are_refused(tmp_path, parquet_in, capsys, ref):
    """Every record of such a file would be removed as a leak of itself."""
    x = np.arange(8, dtype=np.float32).reshape(2, 4) + 100
    write_input("parquet", tmp_path / "in" / "b.parquet", ["b0", "b1"], x, np.zeros(2, int))
    (tmp_path / "link").symlink_to(tmp_path / "in")
    reference = {"format": "parquet", "path": str(tmp_path / ref), "tensor": "emb", "id": "id"}
    assert run_job(tmp_path, "parquet", parquet_in.replace("in/*", "in/[ab]*"),
                   reference=reference) == 2
    line = one_error_line(capsys)
    assert line.startswith(f"error: reference.path: {tmp_path / 'in' / 'a.parquet'} is also an "
                           "input file")
    assert not (tmp_path / "out").exists()


def test_a_run_refused_by_the_store_lease_leaves_no_run_id_folder(tmp_path, parquet_in, capsys):
    """The run's outputs under out/st/{run_id}/: taking their leases made out/st/2/ before
    the store's lease refused the run; nothing of it is left."""
    from transforms.io import layout, lease

    held = lease.acquire(layout.store_lease(str(tmp_path / "store")), "store", "rival")
    try:
        assert run_job(tmp_path, "parquet", parquet_in, "run_id=2",
                       f"output.path={tmp_path / 'out' / 'st' / '{run_id}' / 'clean'}",
                       f"report={tmp_path / 'out' / 'st' / '{run_id}' / 'report'}",
                       f"store.path={tmp_path / 'store'}") == 2
        assert "in use by run rival" in one_error_line(capsys)
    finally:
        held.release()
    assert not (tmp_path / "out").exists()


def test_a_closed_stdout_after_the_run_keeps_exit_0(tmp_path, parquet_in):
    """``tensordedup ... | head -1``: the reader is gone when the summary is printed. The
    run has published; it ended with a BrokenPipeError traceback and exit 1 (stdout
    unbuffered, as PYTHONUNBUFFERED=1 makes it: the print writes at once)."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text(json.dumps({"input": {"format": "parquet", "path": parquet_in,
                                         "tensor": "emb", "id": "id"},
                               "output": {"path": str(tmp_path / "out" / "clean")},
                               "report": str(tmp_path / "out" / "report")}))
    read, write = os.pipe()
    os.close(read)  # every write to the command's stdout fails with EPIPE
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    try:
        r = subprocess.run([sys.executable, "-m", "pipeline.run", "--config", str(cfg),
                            "--quiet"], cwd=ROOT, stdout=write, stderr=subprocess.PIPE,
                           text=True, env=env)
    finally:
        os.close(write)
    assert (r.returncode, r.stderr) == (0, "")
    assert json.loads((tmp_path / "out" / "report" / "summary.json").read_text())["kept"] == 5

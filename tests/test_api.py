"""run_job from Python, the tensordedup console script (Beam flags after --), progress
output (bars on a terminal, lines otherwise, nothing with --quiet)."""

from __future__ import annotations

import dataclasses
import json
import os
import pty
import re
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest
import yaml

from pipeline import JobFailed, RunSummary, progress, run_job
from pipeline.api import to_config
from pipeline.config import ConfigError, DedupeConfig, load_config
from tests.jobkit import EXT
from tests.oracle import expected_removals
from tests.test_job import planted, records, write_files
from tests.test_job_near import by_kind
from tests.test_job_near import dataset as near_dataset
from tests.test_job_near import expected as near_expected
from transforms.io.formats.base import InputError

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = Path(sys.executable).parent / "tensordedup"


def config(tmp_path: Path, fmt: str = "parquet", **extra) -> dict:
    inp = {"format": fmt, "path": str(tmp_path / "in" / f"*.{EXT[fmt]}"), "tensor": "emb",
           "id": "id"}
    return {"input": inp, "output": {"path": str(tmp_path / "out" / "clean")},
            "report": str(tmp_path / "out" / "report"), **extra}


def removals(summary: RunSummary) -> dict[str, str]:
    t = summary.removals()
    return dict(zip(t["record_id"].to_pylist(), t["duplicate_of"].to_pylist(), strict=True))


@pytest.mark.parametrize("given", ["path", "dict", "model"])
def test_run_job_takes_a_path_a_dict_or_a_model(tmp_path, given):
    fmt = "hdf5" if given == "dict" else "parquet"
    parts = planted(1)
    write_files(fmt, tmp_path / "in", parts)
    cfg = config(tmp_path, fmt)
    if given == "path":
        (tmp_path / "job.yaml").write_text(yaml.safe_dump(cfg))
        arg = tmp_path / "job.yaml"  # a Path; a str works the same
    else:
        arg = cfg if given == "dict" else DedupeConfig.model_validate(cfg)

    s = run_job(arg, quiet=True, run_id="r1")
    expected = expected_removals(records(parts))
    assert 100 < len(expected) < 400
    assert isinstance(s, RunSummary) and not s.submitted and s.run_id == "r1"
    assert s.read == 450 and s.invalid_count == 0
    assert s.removed["exact"] == len(expected) == s.removed_total
    assert s.kept == s.read - len(expected)
    assert s.removed["near"] == 0 and s.near is None and s.recall is None
    assert (s.output, s.report) == (cfg["output"]["path"], cfg["report"])
    assert s.summary["kept"] == s.kept and s.wall_time_s > 0

    table = s.removals()  # report/duplicates.parquet, read back with pyarrow
    assert isinstance(table, pa.Table) and table.num_rows == len(expected)
    assert removals(s) == expected
    assert isinstance(s.invalid(), pa.Table) and s.invalid().num_rows == 0
    assert f"kept {s.kept:,}" in repr(s) and f"exact {len(expected):,}" in repr(s)
    assert "<table>" in s._repr_html_() and f"kept {s.kept:,}" in str(s)
    assert RunSummary.load(s.report) == s


def test_overrides_and_overwrite_on_a_model(tmp_path):
    parts = planted(2, files=1)
    write_files("parquet", tmp_path / "in", parts)
    model = DedupeConfig.model_validate(config(tmp_path))
    first = run_job(model, quiet=True)
    again = run_job(model, overrides=["keep=last"], overwrite=True, quiet=True)
    assert again.removed["exact"] == first.removed["exact"]
    assert removals(again) == expected_removals(records(parts), "last")
    assert model.keep == "first"  # the model given is not changed


@pytest.mark.parametrize("near", [{"metric": "jaccard", "threshold": 0.8},
                                  {"metric": "l2", "threshold": 0.5},
                                  {"metric": "allclose", "atol": 0.1, "rtol": 0.01},
                                  {"metric": "cosine", "threshold": 0.1, "probes": 3}])
def test_a_models_overrides_keep_its_near_settings(tmp_path, near):
    """A model given with overrides is dumped (every key, defaults too) and parsed again:
    the checks that refuse keys of another metric must not refuse the dump (a jaccard
    model was refused: 'near.probes applies to vector metrics')."""
    model = DedupeConfig.model_validate(config(tmp_path, near=near))
    again = to_config(model, overrides=["keep=last"])
    assert again.near == model.near and again.keep == "last"


def test_a_worker_traceback_becomes_the_line_it_raised():
    """Beam re-raises a worker's error with the remote traceback as its text; an error
    whose name does not end in Error (pyarrow's ArrowInvalid) left the line at
    'RuntimeError: Traceback (most recent call last):'."""
    from pipeline.api import failure_line

    remote = ("Traceback (most recent call last):\n  File \"apache_beam/runners/common.py\""
              ", line 1498, in process\n    return invoke(x)\npyarrow.lib.ArrowInvalid: "
              "Failed to parse string: 'a' as a scalar of type double [while running 'Read']")
    line = failure_line(RuntimeError(remote))
    assert line.endswith(": ArrowInvalid: Failed to parse string: 'a' as a scalar of type "
                         "double") and "Traceback" not in line


def test_a_worker_out_of_memory_says_what_to_change():
    """numpy's ``_ArrayMemoryError`` in a worker under a memory limit was the line, with
    no hint (Sweep K)."""
    from pipeline.api import failure_line

    remote = ("Traceback (most recent call last):\n  File \"x.py\", line 1, in f\n"
              "numpy.core._exceptions._ArrayMemoryError: Unable to allocate 16.0 MiB for an "
              "array with shape (65536, 64) and data type float32 [while running 'Near']")
    assert failure_line(RuntimeError(remote)).endswith(
        "_ArrayMemoryError: Unable to allocate 16.0 MiB for an array with shape (65536, 64) "
        "and data type float32 (out of memory: run with fewer runner.workers, or smaller "
        "tuning.chunk_bytes, or on a machine with more memory)")
    assert "out of memory" not in failure_line(RuntimeError("ValueError: a bad value"))


def test_near_run_reports_settings_and_recall(tmp_path):
    parts, spec = near_dataset(1, "l2")
    write_files("parquet", tmp_path / "in", parts)
    s = run_job(config(tmp_path, near={"metric": "l2", "threshold": spec.threshold}),
                quiet=True)
    want_exact, want_near = near_expected(parts, spec)
    table = s.removals()
    assert by_kind(table, "exact") == want_exact and by_kind(table, "near") == want_near
    assert s.removed["near"] == len(want_near) > 0
    assert s.near_settings["metric"] == "l2" and s.near_settings["threshold"] == spec.threshold
    assert s.recall == s.near["recall"]["recall"] == 1.0
    assert "recall 1.0" in repr(s)


def test_a_runner_that_does_not_wait_gives_a_submitted_summary(tmp_path, monkeypatch):
    """As on Dataflow (simulated: the local runner, which the launcher does not wait
    for): the summary says submitted, without counts; the report, once the job has
    published it, loads as a RunSummary."""
    from pipeline.runners import common

    monkeypatch.setattr(common, "launcher_waits", lambda cfg: False)
    write_files("parquet", tmp_path / "in", planted(8, files=1))
    s = run_job(config(tmp_path), quiet=True)
    assert s.submitted and s.summary is None and s.read is None and s.removed == {}
    assert "submitted=True" in repr(s) and str(s).startswith("submitted: the job publishes")
    done = RunSummary.load(s.report)
    assert not done.submitted and done.read == 150


def test_dataframes_need_pandas_only_when_asked(tmp_path, monkeypatch):
    write_files("parquet", tmp_path / "in", planted(3, files=1))
    s = run_job(config(tmp_path), quiet=True)
    try:
        import pandas  # noqa: F401
    except ImportError:
        pass
    else:
        df = s.removals_df()
        assert list(df["record_id"]) == s.removals()["record_id"].to_pylist()
        assert len(s.invalid_df()) == 0
    monkeypatch.setitem(sys.modules, "pandas", None)  # as on an install without pandas
    with pytest.raises(ImportError, match=r"removals_df\(\) needs pandas.*removals\(\)"):
        s.removals_df()
    assert s.removals().num_rows > 0  # pyarrow needs no pandas


def test_errors_raise_and_nothing_is_written(tmp_path):
    write_files("parquet", tmp_path / "in", planted(4, files=1))
    bad = config(tmp_path)
    bad["input"]["tensr"] = bad["input"].pop("tensor")
    with pytest.raises(ConfigError, match=r"^unknown key input\.tensr: did you mean "
                                          r"input\.tensor\?$"):
        run_job(bad)
    with pytest.raises(ConfigError, match="config key 'keep'"):
        run_job(config(tmp_path), overrides=["keep=middle"])
    with pytest.raises(InputError, match="input.tensor: no column 'embedding'"):
        run_job(config(tmp_path), overrides=["input.tensor=embedding"])
    with pytest.raises(ConfigError, match="not found"):
        run_job(tmp_path / "missing.yaml")
    assert not (tmp_path / "out").exists()


def test_a_failed_job_raises_job_failed_and_publishes_nothing(tmp_path, capfd):
    (tmp_path / "in").mkdir()
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": ["a", "b"], "emb": pa.array([[1.0], None],
                                                                pa.list_(pa.float32()))}),
                   tmp_path / "in" / "a.parquet")
    with pytest.raises(JobFailed, match="invalid record b.*on_invalid") as e:
        run_job(config(tmp_path, on_invalid="fail"))
    assert e.value.__cause__ is not None and "\n" not in str(e.value)
    assert not (tmp_path / "out" / "report" / "summary.json").exists()
    assert "Traceback" not in capfd.readouterr().err
    assert progress.enabled is False  # run_job leaves progress as it found it


def test_progress_lines_when_stderr_is_not_a_terminal(tmp_path, capfd):
    write_files("parquet", tmp_path / "in", planted(5, files=2))
    run_job(config(tmp_path))
    err = capfd.readouterr().err
    assert err.startswith("deduplicating 2 parquet file(s) (local runner)\n")
    assert re.search(r"^\[read\] 2/2 units done, 300/300 records$", err, re.M), err
    assert re.search(r"^\[write\] 2/2 files done, \d+ records$", err, re.M), err
    assert "\r" not in err and "\x1b[" not in err


def test_quiet_prints_nothing(tmp_path, capfd):
    write_files("parquet", tmp_path / "in", planted(6, files=1))
    s = run_job(config(tmp_path), quiet=True)
    assert s.kept > 0 and capfd.readouterr() == ("", "")


# --- progress module: bars and lines ---------------------------------------------------


class FakeTerminal:
    """A text stream that says it is a terminal."""

    encoding = "utf-8"

    def __init__(self) -> None:
        self.text = ""

    def write(self, s: str) -> int:
        self.text += s
        return len(s)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return True

    def fileno(self) -> int:
        raise OSError("no descriptor")


def screen(text: str) -> list[str]:
    """What a terminal shows: the lines left after carriage returns, cursor-ups and
    clears (``\x1b[J``: clear from the cursor down), blank lines dropped."""
    lines, row, col0 = [""], 0, True
    for token in re.findall(r"\x1b\[\d*[AJ]|\r|\n|[^\x1b\r\n]+", text):
        if token == "\n":
            row, col0 = row + 1, True
            lines += [""] * (row + 1 - len(lines))
        elif token == "\r":
            col0 = True
        elif token.endswith("A"):
            row -= int(token[2:-1] or 1)
        elif token.endswith("J"):
            del lines[row + 1:]
            if col0:
                lines[row] = ""
        else:
            lines[row] = token if col0 else lines[row] + token
            col0 = False
    return [ln for ln in lines if ln]


def test_bars_on_a_terminal_show_rate_and_eta(monkeypatch):
    term = FakeTerminal()
    monkeypatch.setenv("TERM", "xterm")
    monkeypatch.delenv("COLUMNS", raising=False)  # 100 columns: FakeTerminal has no size
    progress.enable(stream=term)
    try:
        progress.tick("read", 4, 0, "units", units=0, total_records=1000)
        progress.tick("read", 4, 250, "units", units=1, total_records=1000)
        progress.tick("near assign", 0, 0, "chunks", units=0, total_records=500)
        progress.note("near: exact search in 1 cell(s)")
        progress.step("near k-means", 3, 16)
        progress.tick("read", 4, 750, "units", units=3, total_records=1000)  # done
    finally:
        progress.close()
        progress.enable(False)
    assert "\r" in term.text and "\x1b[J" in term.text  # redrawn in place
    shown = screen(term.text)
    read = [ln for ln in shown if ln.startswith("[read]")]
    assert len(read) == 1 and re.match(
        r"\[read\] 100%\|█+\| 1,000/1,000 records \(4/4 units\) "
        r"\[\d\d:\d\d<\d\d:\d\d, [\d,]+ records/s\]$", read[0]), shown
    assert "near: exact search in 1 cell(s)" in shown
    assert any(re.match(r"\[near k-means\]  19%\|.*\| 3/16 \[\d\d:\d\d<\d\d:\d\d, [\d.,]+ it/s\]",
                        ln) for ln in shown), shown
    assert any(ln.startswith("[near assign]   0%|") and "<?" in ln for ln in shown), shown


def test_plain_lines_are_throttled_and_end_with_the_total(monkeypatch):
    term = FakeTerminal()
    term.isatty = lambda: False
    progress.enable(stream=term)
    try:
        for _ in range(100):  # within one INTERVAL_S: the first line and the last only
            progress.tick("near search", 100, 10, "cells")
        progress.tick("near search", 100, 10, "cells")  # after the end: not shown again
    finally:
        progress.close()
        progress.enable(False)
    assert term.text.splitlines() == ["[near search] 1/100 cells done, 10 records",
                                      "[near search] 100/100 cells done, 1,000 records"]


def test_a_note_said_again_is_shown_once_per_tally():
    """A step that runs again (a restarted Dask worker's, recomputed) repeats its notes,
    in the launcher or forwarded from a worker process."""
    term = FakeTerminal()
    term.isatty = lambda: False
    line = "near: exact search in 1 cell(s)"
    try:
        for _ in range(2):
            progress.enable(stream=term)
            progress.note(line)
            progress.replay(json.dumps(["note", line]))
            progress.note("near: planning about 10 cells")
    finally:
        progress.close()
        progress.enable(False)
    assert term.text.splitlines() == [line, "near: planning about 10 cells"] * 2


def test_progress_is_off_unless_enabled():
    code = ("from pipeline import progress; progress.tick('read', 1, 5, 'units'); "
            "progress.note('x'); progress.step('s', 1, 2); print(progress.enabled)")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       check=True)
    assert r.stdout == "False\n"
    # (importing Beam may log its own "apitools not found" warning)
    assert [ln for ln in r.stderr.splitlines() if "apitools" not in ln] == []


# --- the console script ----------------------------------------------------------------


def test_console_script_is_declared():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["tensordedup"] == "pipeline.run:console"


def cli() -> list[str]:
    """The installed console script (pip install -e . puts it beside the interpreter)."""
    if not SCRIPT.exists():
        pytest.skip(f"{SCRIPT} is not installed: pip install -c constraints.txt -e . "
                    "(pyproject's [project.scripts])")
    return [str(SCRIPT)]


def write_job(tmp_path: Path, **extra) -> Path:
    write_files("parquet", tmp_path / "in", planted(7, files=2))
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(config(tmp_path, **extra)))
    return path


def test_console_script_passes_beam_flags_after_double_dash(tmp_path):
    job = write_job(tmp_path)
    r = subprocess.run([*cli(), "--config", str(job), "--quiet", "--",
                        "--direct_num_workers=1", "--direct_running_mode=in_memory"],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0 and r.stderr == "", r.stderr  # --quiet: nothing but errors
    assert r.stdout.startswith("run ") and "kept" in r.stdout
    summary = RunSummary.load(tmp_path / "out" / "report")
    assert summary.summary["config"]["runner"]["options"] == {
        "direct_num_workers": 1, "direct_running_mode": "in_memory"}
    # the flags are checked like runner.options: this one is refused before any work
    r = subprocess.run([*cli(), "--config", str(job), "--overwrite", "--",
                        "--direct_running_mode=multi_threading"],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert r.stderr.startswith("error: ") and "loses shuffle elements" in r.stderr
    help_text = subprocess.run([*cli(), "--help"], capture_output=True, text=True,
                               check=True).stdout
    assert help_text.startswith("usage: tensordedup --config CONFIG [options] [-- BEAM_FLAG")


def test_the_config_alone_and_mistyped_flags(tmp_path, capsys):
    """``tensordedup c.yaml`` runs c.yaml (users type it so); a mistyped flag, a Beam flag
    before ``--``, a second config or none: one line with the fix, exit 2 (argparse
    printed its usage line above a bare error)."""
    from pipeline.run import parse_args

    job = write_job(tmp_path)
    r = subprocess.run([*cli(), str(job), "--quiet"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.startswith("run ") and r.stderr == "", r.stderr
    assert parse_args([str(job), "--dry-run"]).config == str(job)
    assert parse_args(["--config", str(job)]).config == str(job)
    for argv, says in ((["--config", "c.yaml", "--overwrit"], "did you mean --overwrite?"),
                       (["--confg", "c.yaml"], "did you mean --config?"),
                       (["c.yaml", "--dryrun"], "did you mean --dry-run?"),
                       (["c.yaml", "--direct_num_workers=2"],
                        "Beam pipeline flags go after -- ("),
                       (["--config", "c.yaml", "d.yaml"], "two configs given"),
                       (["c.yaml", "d.yaml"], "unexpected argument 'd.yaml'"),
                       (["--overwrite"], "no config given: "),
                       (["c.yaml", "--plan-records", "x"], "'x' is not a number of records")):
        with pytest.raises(SystemExit) as stop:
            parse_args(argv)
        err = capsys.readouterr().err
        assert stop.value.code == 2 and err.count("\n") == 1, err
        assert err.startswith("error: ") and says in err, err


def test_beam_flags_become_runner_keys(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config(tmp_path, runner={"options": {
        "sdk_worker_parallelism": 1}})))
    cfg = load_config(path, ["runner.options.max_cache_memory_usage_mb=2"],
                      ["--direct_num_workers", "2", "--experiments=x", "--experiments=y",
                       "--save_main_session", "--sdk_worker_parallelism=3", "--job_name=n"])
    assert cfg.runner.options == {"sdk_worker_parallelism": 3, "max_cache_memory_usage_mb": 2,
                                  "experiments": ["x", "y"], "save_main_session": True,
                                  "job_name": "n"}
    assert cfg.runner.workers == 2  # direct_num_workers on the local runner
    from pipeline.runners import pipeline_options

    opts = pipeline_options(cfg.runner).get_all_options()
    assert opts["direct_num_workers"] == 2 and opts["experiments"] == ["x", "y"]
    dataflow = {"name": "dataflow", "region": "us-central1", "temp_location": "gs://my-bucket/tmp",
                "worker_image": "img:1"}
    path.write_text(yaml.safe_dump(config(tmp_path, runner=dataflow)))
    cfg = load_config(path, (), ["--project=my-project", "--max_num_workers=4", "--labels=a=b"])
    assert (cfg.runner.project, cfg.runner.max_workers) == ("my-project", 4)
    assert cfg.runner.options == {"labels": "a=b"}
    with pytest.raises(ConfigError, match="--name=value"):
        load_config(path, (), ["stray"])


def test_console_script_draws_bars_on_a_terminal(tmp_path):
    """Under a pseudo-terminal: bars with a rate and an ETA, redrawn in place; the summary
    follows them on stdout."""
    job = write_job(tmp_path)
    main_fd, child_fd = pty.openpty()
    env = {**os.environ, "TERM": "xterm", "COLUMNS": "120"}
    proc = subprocess.Popen([*cli(), "--config", str(job)], cwd=ROOT, stdin=subprocess.DEVNULL,
                            stdout=child_fd, stderr=child_fd, env=env)
    os.close(child_fd)
    out, deadline = b"", time.monotonic() + 300
    while time.monotonic() < deadline:
        ready, _, _ = select.select([main_fd], [], [], 5)
        if not ready:
            if proc.poll() is not None:
                break
            continue
        try:
            data = os.read(main_fd, 65536)
        except OSError:  # EIO: the child side is closed
            break
        if not data:
            break
        out += data
    os.close(main_fd)
    assert proc.wait(timeout=60) == 0, out.decode(errors="replace")
    text = out.decode()
    assert "\r\x1b[J" in text  # bars redrawn in place
    shown = screen(text.replace("\r\n", "\n"))
    assert re.search(r"\[read\] 100%\|█+\| 300/300 records \(2/2 units\) "
                     r"\[\d\d:\d\d<\d\d:\d\d, [\d,]+ records/s\]", text), shown
    assert any(re.match(r"\[write\] 100%\|█+\| 2/2 files", ln) for ln in shown), shown
    assert shown[-3].startswith("run ") and "kept" in shown[-3]


@pytest.mark.skipif(shutil.which("script") is None, reason="no script(1)")
def test_quiet_on_a_terminal_draws_nothing(tmp_path):
    job = write_job(tmp_path)
    r = subprocess.run(["script", "-qec", " ".join([*cli(), "--config", str(job), "--quiet",
                                                    "2>&1 >/dev/null"]), "/dev/null"],
                       cwd=ROOT, capture_output=True, text=True, env={**os.environ,
                                                                     "TERM": "xterm"})
    assert r.returncode == 0 and r.stdout.strip() == "", r.stdout


def test_a_run_is_done_only_with_its_own_summary(tmp_path, parquet_in):
    """The runner returned (a Dask scheduler gone had ended Beam's wait as if done): the
    previous run's summary.json was read and reported as this run's. A run is done when
    the runner's result is DONE and summary.json is this attempt's."""
    from pipeline.api import _published
    from pipeline.preflight import prepare
    from pipeline.runners.common import RunIncomplete

    cfg = {"input": {"format": "parquet", "path": parquet_in, "tensor": "emb", "id": "id"},
           "output": {"path": str(tmp_path / "out" / "clean")},
           "report": str(tmp_path / "out" / "report")}
    report = cfg["report"]
    this = prepare(to_config(cfg, overwrite=True))  # a run about to start
    with pytest.raises(RunIncomplete, match="summary.json in .* is not this run's"):
        _published(this, report, "DONE")  # no summary.json yet
    earlier = run_job(cfg, quiet=True)
    with pytest.raises(RunIncomplete, match="summary.json in .* is not this run's"):
        _published(this, report, "DONE")  # the earlier run's
    with pytest.raises(RunIncomplete, match="in state FAILED, not DONE"):
        _published(this, report, "FAILED")
    assert earlier.summary["attempt"] != this.attempt
    again = dataclasses.replace(this, attempt=earlier.summary["attempt"])
    assert _published(again, report, "DONE").kept == earlier.kept == 5

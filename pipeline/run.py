"""``python -m pipeline.run --config configs/dedupe.yaml``: the dedup job's command line.

Exit codes: 0 done; 2 bad config or input, found before any work (one line, no
traceback); 1 the job failed while running (e.g. an invalid record with
``on_invalid: fail``), with one line saying why; nothing is published then.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import shutil
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# Beam warns about optional GCP client libraries when imported: noise for users.
logging.getLogger().addFilter(lambda r: "apitools not found" not in r.getMessage())

from pipeline import progress, report  # noqa: E402
from pipeline.config import ConfigError, describe_keys, load_config  # noqa: E402
from pipeline.preflight import Job, prepare  # noqa: E402
from transforms.fingerprint import SCHEME  # noqa: E402
from transforms.formats.base import InputError, InvalidRecordError  # noqa: E402

EXIT_FAILED, EXIT_USAGE = 1, 2


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m pipeline.run",
        description="Remove exact and near-duplicate tensors from TFRecord / Parquet / HDF5 files: "
                    "writes clean shards in the same format and a report of what was "
                    "removed and why.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="config keys (YAML; any of them can be given with --set key.path=value):\n"
               + "\n".join(describe_keys())
               + "\n\nPaths are relative to the current directory. Exit codes: 0 done, "
                 "1 the job failed, 2 bad config or input.")
    ap.add_argument("--config", required=True, help="YAML job config (see keys below)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a config key, e.g. --set keep=last (repeatable)")
    ap.add_argument("--overwrite", action="store_true",
                    help="same as --set output.overwrite=true")
    ap.add_argument("--quiet", action="store_true", help="no progress lines")
    return ap.parse_args(argv)


def beam_pipeline(job: Job):
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    options = PipelineOptions.from_dictionary(dict(job.cfg.runner.options))
    if job.cfg.runner.name == "local":
        from apache_beam.runners.portability.fn_api_runner import FnApiRunner

        return beam.Pipeline(runner=FnApiRunner(), options=options)
    return beam.Pipeline(runner=job.cfg.runner.name, options=options)


def execute(job: Job) -> dict:
    """Run the graph into staging directories, publish them, write summary.json last."""
    from pipeline.graph import build

    start = time.monotonic()
    out_stage, report_stage = job.staging(job.output), job.staging(job.report)
    try:
        p = beam_pipeline(job)
        build(p, job)
        p.run().wait_until_finish()
        taken = report.take_totals(report_stage)
        files = taken["files"]
        totals = report.totals(files)
        out_stage.mkdir(parents=True, exist_ok=True)  # an all-invalid input still gets a dir
        (job.report / "summary.json").unlink(missing_ok=True)  # old run: no longer complete
        report.publish(out_stage, job.output, job.cfg.output.overwrite)
        report.publish(report_stage, job.report, job.cfg.output.overwrite)
    finally:
        for stage in (out_stage, report_stage):
            shutil.rmtree(stage, ignore_errors=True)
    summary = {**totals, "wall_time_s": round(time.monotonic() - start, 3),
               "fingerprint_scheme": SCHEME, "output": str(job.output),
               "working_dir": os.getcwd(),  # resolves relative input paths in record ids
               "report": str(job.report), "files": files,
               "config": job.cfg.model_dump(mode="json"),
               "resolved": {"shape": None if job.resolved.shape is None
                            else list(job.resolved.shape), "dtype": job.resolved.dtype,
                            "inputs": len(job.files)},
               "near": None if job.near is None else {
                   "settings": job.cfg.near.model_dump(mode="json"), **taken["near"]}}
    report.write_summary(job.report, summary)
    return summary


def _innermost(e: BaseException) -> BaseException:
    """The original error: Beam wraps worker errors in its own exceptions and text."""
    while e.__cause__ is not None or e.__context__ is not None:
        e = e.__cause__ or e.__context__
    return e


def _first_line(e: BaseException) -> str:
    """The error's own line; a worker error re-raised by Beam carries the remote traceback
    as text, so take its last "XxxError: message" line, without Beam's step suffix."""
    lines = str(e).strip().splitlines()
    raised = [ln for ln in lines if re.match(r"^[A-Za-z_.]*(Error|Exception): ", ln)]
    line = raised[-1] if raised else lines[0] if lines else type(e).__name__
    return re.sub(r" \[while running '[^']*'\]$", "", line)


def human_summary(s: dict) -> str:
    removed = s["removed_exact"] + s["removed_near"]
    return (f"read {s['read']:,} records: kept {s['kept']:,}, removed {removed:,} "
            f"(exact {s['removed_exact']:,}, near {s['removed_near']:,}), invalid "
            f"{s['invalid']:,} in {s['wall_time_s']:.1f} s\n"
            f"clean shards: {s['output']}/ ({sum(f['output'] is not None for f in s['files'])}"
            " files)\n"
            f"report: {s['report']}/ (duplicates.parquet, invalid.parquet, summary.json"
            + (", near_distances.png/.json/.csv, borderline_pairs.parquet)" if s.get("near")
               else ")"))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    overrides = args.set + (["output.overwrite=true"] if args.overwrite else [])
    try:
        job = prepare(load_config(args.config, overrides))
    except (ConfigError, InputError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    progress.reset(show=not args.quiet)
    print(f"deduplicating {len(job.files)} {job.cfg.input.format} file(s) "
          f"({job.cfg.runner.name} runner)", file=sys.stderr)
    try:
        summary = execute(job)
    except Exception as e:  # a worker error: one line here, details in the Beam log above
        cause = _innermost(e)
        what = _first_line(cause)
        if not isinstance(cause, InvalidRecordError) and not what.startswith(
                type(cause).__name__):
            what = f"{type(cause).__name__}: {what}"
        print(f"error: the job failed, nothing was published: {what}", file=sys.stderr)
        return EXIT_FAILED
    print(human_summary(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Flex Template launcher entry: fetch the job's config, then run the job's command line.

Why a file of its own: template parameters are strings and the config lives in Cloud
Storage, while ``pipeline.run`` reads a local YAML file. Dataflow also hands the
launcher its own pipeline options (``--project``, ``--region``, ``--job_name``,
``--temp_location``, ``--staging_location``, ``--sdk_container_image``, ...): they become
``--set runner.*`` overrides, so the job that is submitted is the one the launch request
asked for. The job's CLI returns once the job is submitted (Dataflow runs do not wait).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

from apache_beam.io.filesystems import FileSystems

from pipeline import run
from pipeline.config import beam_flags, runner_key


def fetch(path: str) -> str:
    """A local copy of the config when it is a gs:// (any Beam filesystem) path."""
    if FileSystems.get_scheme(path) is None:
        return path
    with FileSystems.open(path) as src:
        data = src.read()
    fd, local = tempfile.mkstemp(prefix="tensordedup-", suffix=".yaml")
    with os.fdopen(fd, "wb") as dst:
        dst.write(data)
    return local


def job_argv(argv: list[str]) -> list[str]:
    """The template's parameters and Dataflow's options as ``pipeline.run`` arguments."""
    ap = argparse.ArgumentParser(prog="flex-template/main.py")
    ap.add_argument("--config", required=True, help="gs:// path of the job's YAML config")
    ap.add_argument("--run_id", help="the run's id (default: today's UTC date)")
    ap.add_argument("--set", default="", help="overrides, key.path=value;key.path=value")
    ours, beam_args = ap.parse_known_args(argv)
    sets = ["runner.name=dataflow"]  # a template only ever launches Dataflow jobs
    for name, values in beam_flags(beam_args).items():  # as the CLI reads flags after --
        key = runner_key(name, dataflow=True)
        sets.append(f"{key}={values[0] if len(values) == 1 else json.dumps(values)}")
    sets += [s.strip() for s in ours.set.split(";") if s.strip()]
    return (["--config", fetch(ours.config)]
            + (["--run-id", ours.run_id] if ours.run_id else [])
            + [a for s in sets for a in ("--set", s)])


def main(argv: list[str] | None = None) -> int:
    return run.main(job_argv(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())

"""Where the job runs: the runners' room. ``make_pipeline`` picks Beam's local runner
(``local``), Dask (``dask``), Beam's portable runner (``portable``) or Dataflow, and
``dry_run`` builds the job offline.

Why one entry: the config's typed runner keys become Beam pipeline options in one place
(tested key by key), and the dry run builds exactly the job a real run would submit,
without submitting it, so a config can be checked on a machine that has no cloud account.
Each runner module imports only ``common`` (what they share), the steps and the config's
types; this module is the one that imports them all. Beam is imported only inside the
functions: ``--help`` and config errors stay fast.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from pipeline.config.runner import RunnerConfig, dataflow_options
from pipeline.runners.common import (
    available_cores,
    avoid_flush_race,
    flush_race_problem,
    graph_checks_memoized,
)
from pipeline.runners.local import in_processes, local_options

EXIT_FAILED, EXIT_USAGE = 1, 2
STAGED_PIPELINE = "pipeline.pb"  # Beam's name for the staged job graph


def gcp_missing() -> str | None:
    """None, or one line naming the GCP library the Dataflow runner lacks and the extra
    that brings it (Beam's DataflowRunner imports without some of them, then fails or
    waits later)."""
    try:
        import google.auth  # noqa: F401
        import google.cloud.storage  # noqa: F401
        from apache_beam.io.gcp import gcsio  # noqa: F401
        from apache_beam.runners.dataflow.internal import apiclient  # noqa: F401
    except ImportError as e:
        return (f"runner.name: dataflow needs Beam's GCP libraries ({e.name} is missing): "
                "pip install -c constraints.txt -e '.[dataflow]'")
    return None


def check_launch(cfg: RunnerConfig, timeout: float) -> None:
    """Before a Dataflow job is launched (not a dry run, which stays offline): the GCP
    libraries are there, and Cloud Storage answers for the buckets of runner.temp_location
    and staging_location within ``timeout`` (tuning.remote_timeout_s). Beam's own option
    check asks about them too, with a retry that goes on for 10 minutes and more without
    network or credentials; once they answered here it answers at once. Raises
    ``InputError`` (one line naming the key and the fix)."""
    if cfg.name != "dataflow":
        return
    from transforms.io.formats.base import InputError
    from transforms.io.remote import bounded

    if (line := gcp_missing()) is not None:
        raise InputError(line)
    from apache_beam.io.gcp import gcsio

    options, paths = pipeline_options(cfg), dataflow_options(cfg)
    asked: set[str] = set()
    for key in ("temp_location", "staging_location"):
        path = paths[key]
        bucket = path.removeprefix("gs://").split("/", 1)[0]
        if bucket in asked:
            continue
        asked.add(bucket)
        found = bounded(path, lambda _, b=bucket: gcsio.GcsIO(pipeline_options=options)
                        .get_bucket(b), f"runner.{key}", "asking Cloud Storage for its bucket",
                        timeout, fix="check the network and the credentials (gcloud auth "
                        "application-default login), or raise tuning.remote_timeout_s; "
                        f"runner.{key} must be a bucket the job's account can write")
        if found is None:
            raise InputError(f"runner.{key}: {path}: bucket {bucket} does not exist (or this "
                             "account cannot see it): create it (gcloud storage buckets create "
                             f"gs://{bucket} --location {cfg.region}), or set runner.{key} to "
                             "a bucket of yours")


def pipeline_options(cfg: RunnerConfig, dry_run: bool = False):
    """Beam ``PipelineOptions``: ``runner.options`` as given plus the typed keys (on the
    local runner and Dask, ``runner.options`` win over what ``runner.workers`` sets). A dry
    run on Dataflow adds Beam's ``dry_run`` (build the job, return before any API call),
    ``no_auth`` (no credential lookup) and ``sdk_location=container`` (no SDK download)."""
    from apache_beam.options.pipeline_options import PipelineOptions

    opts = dict(cfg.options)
    if cfg.name == "local":
        opts = {**local_options(cfg), **opts}
        mode = cfg.options.get("direct_running_mode")  # set by hand: local_options did not see it
        if mode in ("multi_threading", "multi_processing") and (problem := avoid_flush_race()):
            print(f"warning: runner.options.direct_running_mode: {mode} may lose elements: "
                  f"{problem} (docs/beam-flush-race.md)", file=sys.stderr)
    elif cfg.name == "dask":
        try:  # registers Beam's Dask options, which options parsing would otherwise drop
            import apache_beam.runners.dask.dask_runner  # noqa: F401
        except ImportError as e:
            raise RuntimeError(f"runner.name: dask needs dask and distributed ({e.name} is "
                               "missing): pip install -c constraints.txt -e '.[dask]'") from e
        from pipeline.runners.dask import dask_options

        opts = {**dask_options(), **opts}
    elif cfg.name == "portable" and cfg.address is None and (problem := flush_race_problem()):
        print(f"warning: runner.name: portable: the job service's data plane may lose "
              f"elements: {problem} (docs/beam-flush-race.md)", file=sys.stderr)
    elif cfg.name == "dataflow":
        opts.update(dataflow_options(cfg))
        if dry_run:
            opts.update(dry_run="True", no_auth=True, sdk_location="container")
    return PipelineOptions.from_dictionary(opts)


def make_pipeline(cfg: RunnerConfig, dry_run: bool = False):
    """A ``beam.Pipeline`` for the configured runner: ``local`` is the FnApiRunner in this
    process, ``dask`` the DaskRunner (``pipeline.runners.dask``), ``portable`` the PortableRunner
    with the services it needs (``pipeline.runners.portable``), ``dataflow`` the DataflowRunner,
    any other name is Beam's to resolve."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import TestOptions

    graph_checks_memoized()
    options = pipeline_options(cfg, dry_run)
    if dry_run and cfg.name == "dataflow" and not options.view_as(TestOptions).dry_run:
        # never submit (or even check buckets, which Beam does for a real run) from a dry run
        raise RuntimeError("the dry run's options lost Beam's dry_run flag")
    if cfg.name == "local":
        from apache_beam.runners.portability.fn_api_runner import FnApiRunner

        if in_processes(cfg, options):
            from pipeline.runners.local import local_process_runner

            return beam.Pipeline(runner=local_process_runner(), options=options)
        from pipeline.runners.local import finished_outputs_dropped

        finished_outputs_dropped()  # the bundles run in this process (one worker, threads)
        return beam.Pipeline(runner=FnApiRunner(), options=options)
    if cfg.name == "dataflow":
        from apache_beam.runners.dataflow.dataflow_runner import DataflowRunner

        return beam.Pipeline(runner=DataflowRunner(), options=options)
    if cfg.name == "dask":
        from pipeline.runners.dask import dask_runner

        return beam.Pipeline(runner=dask_runner(cfg), options=options)
    if cfg.name == "portable":
        from pipeline.runners.portable import portable_runner

        return beam.Pipeline(runner=portable_runner(cfg, cfg.workers or available_cores()),
                             options=options)
    return beam.Pipeline(runner=cfg.name, options=options)


@dataclass
class DryRun:
    """What a dry run built. ``job`` is Beam's Dataflow job (``apiclient.Job``) with the
    environment the service would read (worker pool, image, service options) filled in."""

    runner: str
    steps: list[str]  # top-level step names, in graph order
    transforms: int  # leaf transforms in the portable graph
    job: Any = None
    processes: bool = False  # the local runner's workers are processes (runner.processes)

    def facts(self, cfg: RunnerConfig) -> list[str]:
        head = f"steps: {len(self.steps)} ({', '.join(self.steps)}), {self.transforms} transforms"
        if self.job is None:
            workers = cfg.workers or available_cores()
            where = {"local": f" (Beam FnApiRunner, {workers} worker processes)"
                     if self.processes else
                     f" (Beam FnApiRunner in this process, {workers} worker(s))",
                     "dask": f" (scheduler {cfg.address})" if cfg.address else
                     f" (a local Dask cluster of {workers} processes)",
                     "portable": f" (Beam PortableRunner, job service {cfg.address})"
                     if cfg.address else f" (Beam PortableRunner, a local job service and "
                     f"{workers} SDK worker process(es))"}.get(self.runner, "")
            return ["dry run: graph built; nothing was run, written or published",
                    f"runner: {self.runner}{where}", head]
        env = self.job.proto.environment
        pool = env.worker_pools[0]
        gpus = [o for o in env.service_options if o.startswith("worker_accelerator=")]
        gcp = self.job.google_cloud_options
        return [
            "dry run: Dataflow job built offline; nothing was submitted, written or published",
            f"runner: dataflow (project {gcp.project}, region {gcp.region}, job name "
            f"{self.job.proto.name})", head,
            f"worker machine type: {pool.machine_type or 'Dataflow default'}",
            f"accelerator: {gpus[0] if gpus else 'none'}",
            f"image: {pool.worker_harness_container_image}",
            f"max workers: {pool.autoscaling_settings.max_num_workers or 'Dataflow default'}"
            f" (start: {pool.num_workers or 'Dataflow default'}, disk: "
            f"{str(pool.disk_size_gb) + ' GB' if pool.disk_size_gb else 'Dataflow default'})",
            f"temp: {cfg.temp_location} (staging: {dataflow_options(cfg)['staging_location']})",
        ]


def _graph_facts(proto) -> tuple[list[str], int]:
    transforms = proto.components.transforms
    top = list(proto.root_transform_ids)
    if len(top) == 1 and transforms[top[0]].unique_name == top[0]:  # the unnamed root
        top = list(transforms[top[0]].subtransforms)
    leaves = sum(1 for t in transforms.values() if not t.subtransforms)
    # the Dedup composite is shown by its parts (Dedup/Fingerprint, Dedup/DedupExact, ...)
    top = [c for i in top for c in (transforms[i].subtransforms
                                    if transforms[i].unique_name == "Dedup" else [i])]
    return [transforms[i].unique_name for i in top], leaves


def build_offline(cfg: RunnerConfig, build_graph: Callable[[Any], None]) -> DryRun:
    """Build the job for ``cfg`` without running it. ``build_graph(p)`` adds the job's
    steps to the pipeline ``p``. On Dataflow this is Beam's own dry run: the options are
    validated, the graph is translated as for submission, and the job's environment is
    built as ``DataflowApplicationClient.create_job_description`` builds it, minus the
    uploads."""
    p = make_pipeline(cfg, dry_run=True)
    build_graph(p)
    if cfg.name != "dataflow":  # not run: Beam would remove its temp directory in run()
        try:
            return DryRun(cfg.name, *_graph_facts(p.to_runner_api()),
                          processes=in_processes(cfg, p.options))
        finally:
            shutil.rmtree(p.local_tempdir, ignore_errors=True)
    from apache_beam.runners.dataflow.internal import apiclient

    with own_tempdir():  # Beam's stager leaves its folders (the pickled main session)
        job = p.run().job  # dry_run: returns before any client is made
    staging = job.google_cloud_options.staging_location
    job.proto.environment = apiclient.Environment(
        packages=[], options=job.options,
        environment_version=getattr(apiclient, "_FNAPI_ENVIRONMENT_MAJOR_VERSION", "8"),
        proto_pipeline_staged_url=f"{staging.rstrip('/')}/{STAGED_PIPELINE}",
        proto_pipeline=job.proto_pipeline).proto
    return DryRun("dataflow", *_graph_facts(job.proto_pipeline), job=job)


@contextlib.contextmanager
def own_tempdir() -> Iterator[None]:
    """Python's temporary directory is a fresh one inside the block (made in the current
    one), removed after it: the temporary folders Beam makes there and does not remove
    go with it."""
    before = tempfile.tempdir
    tempfile.tempdir = mine = tempfile.mkdtemp(prefix="tensordedup-beam-")
    try:
        yield
    finally:
        tempfile.tempdir = before
        shutil.rmtree(mine, ignore_errors=True)


def dry_run(job, build_graph: Callable[[Any], None]) -> int:
    """``--dry-run``: build the job, print one line per fact, exit 0. Nothing is submitted,
    written or published; a problem Beam finds in the options is one line, exit 2."""
    cfg = job.cfg.runner
    if cfg.name == "dataflow" and (line := gcp_missing()) is not None:
        print(f"error: {line}", file=sys.stderr)
        return EXIT_USAGE
    try:
        built = build_offline(cfg, build_graph)
    except ValueError as e:  # Beam's option checks, e.g. "Pipeline has validations errors"
        print(f"error: runner: {' '.join(str(e).split())}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as e:  # the graph does not build (a bug): one line, no traceback
        line = (str(e).splitlines() or [""])[0]
        print(f"error: the dry run failed: {type(e).__name__}: {line}", file=sys.stderr)
        return EXIT_FAILED
    print("\n".join(built.facts(cfg)))
    if job.embed is not None:  # the model was loaded once by the checks
        print(job.embed.describe())
    if job.store is not None and (line := job.store.replacing_line(dry_run=True)):
        print(line)
    return 0

"""Where the job runs: Beam's local runner, Dask, Beam's portable runner or Dataflow, and
an offline dry run.

Why one module: the config's typed runner keys become Beam pipeline options in one
place (tested key by key), the local runner's workaround for a Beam data-plane race is
applied (and checked against the Beam version) here only, and the dry run builds
exactly the job a real run would submit, without submitting it, so a config can be
checked on a machine that has no cloud account. Beam is imported only inside the
functions: ``--help`` and config errors stay fast.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from pipeline.config import DATAFLOW_KEYS, RunnerConfig

EXIT_FAILED, EXIT_USAGE = 1, 2
STAGED_PIPELINE = "pipeline.pb"  # Beam's name for the staged job graph


def blocks(cfg: RunnerConfig) -> bool:
    """Whether the launcher waits for the job. Not on Dataflow: a Flex Template launcher
    must return once the job is submitted (waiting blocks the template), and the job
    finishes and publishes on its own workers."""
    return cfg.name != "dataflow"


def _as_list(value: Any) -> list:
    return [] if value is None else value if isinstance(value, list) else [value]


def dataflow_options(cfg: RunnerConfig) -> dict[str, Any]:
    """The typed Dataflow keys as Beam option names and values."""
    out = {names[0]: getattr(cfg, key) for key, names in DATAFLOW_KEYS.items()
           if key != "accelerator" and getattr(cfg, key) is not None}
    out.setdefault("staging_location", cfg.temp_location.rstrip("/") + "/staging")
    if cfg.accelerator is not None:  # appended to any other service options given
        out["dataflow_service_options"] = [
            *_as_list(cfg.options.get("dataflow_service_options")),
            cfg.accelerator.service_option()]
    return out


# The local runner's parallel mode unless ``runner.processes``: threads in this process.
# Measured on the 1 M x 128 Parquet job (docs/pipeline.md#runners): 2 processes took
# 14.1 s and 14.4 CPU-s against 10.9 s and 10.3 CPU-s for 2 threads (worker start-up,
# every element pickled between processes). A near job's cells are the other way round
# (``pipeline.processes``).
LOCAL_MODE = "multi_threading"
# The Beam release whose data plane was read and whose workaround is tested
# (docs/beam-flush-race.md, tests/test_runners.py).
FLUSH_RACE_BEAM = "2.77."


def recomputes_finished_steps(cfg: RunnerConfig) -> bool:
    """Whether a lost worker's finished steps run again (from their inputs, files the
    job wrote included): on Dask what the worker held is recomputed from the graph; the
    other runners keep finished stages' outputs (shuffle files, the runner's memory)."""
    return cfg.name == "dask"


def copies_at_once(cfg: RunnerConfig) -> int:
    """Files each worker's clean-copy step writes at once: two on the local runner's one
    worker (the copies' encoding releases the GIL, so the second uses the other core),
    one where parallel workers or threads share the cores already. Never more than one
    on Dask: Beam 2.77's DaskRunner collects a task's outputs before it calls
    ``finish_bundle``, which emits the last copies of a bundle."""
    return 2 if cfg.name == "local" and (cfg.workers or available_cores()) == 1 else 1


def available_cores() -> int:
    """Cores this process may run on: a container's or taskset's limit, not the host's."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def flush_race_problem() -> str | None:
    """Why the flush-race workaround cannot be applied to the installed Beam, or None.

    Beam 2.77's local runner with more than one worker moves data over a gRPC data plane
    whose output streams flush on a 1-second timer thread as well as by size, and that
    thread clears the buffer without a lock against the writing thread: elements written
    between its read and its clear are lost. The workaround (time limit 0: size-based
    flushing only, Dataflow's default) is checked against exactly this code."""
    import apache_beam
    from apache_beam.runners.portability.fn_api_runner import worker_handlers
    from apache_beam.runners.worker import data_plane

    if not apache_beam.__version__.startswith(FLUSH_RACE_BEAM):
        return (f"apache-beam {apache_beam.__version__} is not {FLUSH_RACE_BEAM}x, whose "
                "data-plane flush race the workaround was made and tested for")
    if not isinstance(getattr(worker_handlers, "DATA_BUFFER_TIME_LIMIT_MS", None), int):
        return ("apache_beam.runners.portability.fn_api_runner.worker_handlers has no "
                "DATA_BUFFER_TIME_LIMIT_MS")
    if not issubclass(getattr(data_plane, "TimeBasedBufferingClosableOutputStream", type),
                      getattr(data_plane, "SizeBasedBufferingClosableOutputStream", ())):
        return "apache_beam.runners.worker.data_plane's buffering streams have changed"
    return None


def avoid_flush_race() -> str | None:
    """Turn off the data plane's time-based flush (process-wide, before a runner is
    built); returns why it could not be done, or None once it is done."""
    problem = flush_race_problem()
    if problem is None:
        from apache_beam.runners.portability.fn_api_runner import worker_handlers

        worker_handlers.DATA_BUFFER_TIME_LIMIT_MS = 0
    return problem


def local_options(cfg: RunnerConfig) -> dict[str, Any]:
    """Beam options for ``runner.workers`` on the local runner: none for one worker (the
    in-process runner, no data plane); otherwise parallel workers, with the flush race
    avoided, or one worker and a warning where the workaround does not apply. Worker
    processes (``runner.processes``) log to the runner from warnings up."""
    workers = cfg.workers or available_cores()
    if workers == 1:
        return {}
    problem = avoid_flush_race()
    if problem is not None:
        print(f"warning: runner.workers: running 1 worker, not {workers}: {problem}; "
              "Beam's parallel local runner loses elements without the workaround "
              "(docs/beam-flush-race.md)", file=sys.stderr)
        return {}
    if cfg.processes:  # started by local_process_runner, in Beam's default mode
        return {"direct_num_workers": workers, "default_sdk_harness_log_level": "WARNING"}
    return {"direct_num_workers": workers, "direct_running_mode": LOCAL_MODE}


def in_processes(cfg: RunnerConfig, options) -> bool:
    """Whether the local runner's parallel workers are processes: ``runner.processes``,
    more than one worker, and no running mode set by hand in ``runner.options``."""
    from apache_beam.options.pipeline_options import DirectOptions

    return (cfg.name == "local" and bool(cfg.processes)
            and (options.view_as(DirectOptions).direct_num_workers or 1) > 1
            and "direct_running_mode" not in cfg.options)


@contextlib.contextmanager
def kernel_threads(cfg: RunnerConfig, options) -> Iterator[None]:
    """While the local runner runs bundles in parallel threads (``options``: the
    pipeline's, so ``runner.options`` set by hand count too): one BLAS/OpenMP thread per
    kernel call (``transforms.cores``; the 1M x 384 near job: 128 s of user CPU, 80 s
    with one each) and one Parquet row group read ahead per worker (two each raised that
    job's peak from 2.9 to 3.5 GB for no gain). One worker keeps the libraries' own
    threads and reads two ahead."""
    from apache_beam.options.pipeline_options import DirectOptions

    if cfg.name != "local" or (options.view_as(DirectOptions).direct_num_workers or 1) <= 1:
        yield
        return
    from transforms import cores
    from transforms.formats import ahead

    with cores.threads(1), ahead.at_once(1):
        yield


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
        from pipeline.dask_cluster import dask_options

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
    process, ``dask`` the DaskRunner (``pipeline.dask_cluster``), ``portable`` the PortableRunner
    with the services it needs (``pipeline.portable``), ``dataflow`` the DataflowRunner,
    any other name is Beam's to resolve."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import TestOptions

    options = pipeline_options(cfg, dry_run)
    if dry_run and cfg.name == "dataflow" and not options.view_as(TestOptions).dry_run:
        # never submit (or even check buckets, which Beam does for a real run) from a dry run
        raise RuntimeError("the dry run's options lost Beam's dry_run flag")
    if cfg.name == "local":
        from apache_beam.runners.portability.fn_api_runner import FnApiRunner

        if in_processes(cfg, options):
            from pipeline.processes import local_process_runner

            return beam.Pipeline(runner=local_process_runner(), options=options)
        from pipeline.processes import finished_outputs_dropped

        finished_outputs_dropped()  # the bundles run in this process (one worker, threads)
        return beam.Pipeline(runner=FnApiRunner(), options=options)
    if cfg.name == "dataflow":
        from apache_beam.runners.dataflow.dataflow_runner import DataflowRunner

        return beam.Pipeline(runner=DataflowRunner(), options=options)
    if cfg.name == "dask":
        from pipeline.dask_cluster import dask_runner

        return beam.Pipeline(runner=dask_runner(cfg), options=options)
    if cfg.name == "portable":
        from pipeline.portable import portable_runner

        return beam.Pipeline(runner=portable_runner(cfg, cfg.workers or available_cores()),
                             options=options)
    return beam.Pipeline(runner=cfg.name, options=options)


@dataclass
class Plan:
    """What a dry run built. ``job`` is Beam's Dataflow job (``apiclient.Job``) with the
    environment the service would read (worker pool, image, service options) filled in."""

    runner: str
    steps: list[str]  # top-level step names, in graph order
    transforms: int  # leaf transforms in the portable graph
    job: Any = None

    def facts(self, cfg: RunnerConfig) -> list[str]:
        head = f"steps: {len(self.steps)} ({', '.join(self.steps)}), {self.transforms} transforms"
        if self.job is None:
            workers = cfg.workers or available_cores()
            where = {"local": f" (Beam FnApiRunner in this process, {workers} worker(s))",
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


def plan(cfg: RunnerConfig, build_graph: Callable[[Any], None]) -> Plan:
    """Build the job for ``cfg`` without running it. ``build_graph(p)`` adds the job's
    steps to the pipeline ``p``. On Dataflow this is Beam's own dry run: the options are
    validated, the graph is translated as for submission, and the job's environment is
    built as ``DataflowApplicationClient.create_job_description`` builds it, minus the
    uploads."""
    p = make_pipeline(cfg, dry_run=True)
    build_graph(p)
    if cfg.name != "dataflow":  # not run: Beam would remove its temp directory in run()
        try:
            return Plan(cfg.name, *_graph_facts(p.to_runner_api()))
        finally:
            shutil.rmtree(p.local_tempdir, ignore_errors=True)
    from apache_beam.runners.dataflow.internal import apiclient

    job = p.run().job  # dry_run: returns before any client is made
    staging = job.google_cloud_options.staging_location
    job.proto.environment = apiclient.Environment(
        packages=[], options=job.options,
        environment_version=getattr(apiclient, "_FNAPI_ENVIRONMENT_MAJOR_VERSION", "8"),
        proto_pipeline_staged_url=f"{staging.rstrip('/')}/{STAGED_PIPELINE}",
        proto_pipeline=job.proto_pipeline).proto
    return Plan("dataflow", *_graph_facts(job.proto_pipeline), job=job)


def dry_run(job, build_graph: Callable[[Any], None]) -> int:
    """``--dry-run``: build the job, print one line per fact, exit 0. Nothing is submitted,
    written or published; a problem Beam finds in the options is one line, exit 2."""
    cfg = job.cfg.runner
    if cfg.name == "dataflow":
        try:
            from apache_beam.runners.dataflow.internal import apiclient  # noqa: F401
        except ImportError as e:
            print(f"error: the Dataflow runner needs Beam's GCP libraries ({e.name} is "
                  "missing): pip install -c constraints.txt -e '.[dataflow]'", file=sys.stderr)
            return EXIT_USAGE
    try:
        built = plan(cfg, build_graph)
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
    return 0

"""The config's runner section: where the job runs (local, Dask, portable, Dataflow) and
Dataflow's typed keys and GPUs, each checked with a one-line error; ``pipeline.config``
uses it in ``DedupeConfig`` and is where callers import it from."""

from __future__ import annotations

import difflib
import re
from typing import Any

from pydantic import Field, field_validator, model_validator

from pipeline.config.sections import Strict

# Typed Dataflow keys -> the Beam pipeline options they set (first name) and its aliases,
# which are refused in runner.options so a value is never given twice.
DATAFLOW_KEYS: dict[str, tuple[str, ...]] = {
    "project": ("project",), "region": ("region",), "temp_location": ("temp_location",),
    "staging_location": ("staging_location",),
    "machine_type": ("machine_type", "worker_machine_type"),
    "max_workers": ("max_num_workers",), "num_workers": ("num_workers",),
    "worker_image": ("sdk_container_image", "worker_harness_container_image"),
    "disk_size_gb": ("disk_size_gb",), "service_account_email": ("service_account_email",),
    "network": ("network",), "subnetwork": ("subnetwork",), "job_name": ("job_name",),
    "accelerator": ("dataflow_service_options",),  # only its worker_accelerator= entry
}
# The runners this package sets up itself (pipeline.runners), by their config names.
RUNNERS = ("local", "dask", "portable", "dataflow")
# Keys only some runners read -> those runners (others refuse the key).
RUNNER_KEYS: dict[str, tuple[str, ...]] = {
    **{key: ("dataflow",) for key in DATAFLOW_KEYS}, "workers": ("local", "dask", "portable"),
    "processes": ("local",), "address": ("dask", "portable")}
# Compute Engine attaches each GPU model to one machine series (custom-* is N1):
# the prefixes it accepts and an example type for the error line.
_N1 = (("n1-", "custom-"), "n1-standard-8")
GPU_MACHINES = {"nvidia-tesla-t4": _N1, "nvidia-tesla-p4": _N1, "nvidia-tesla-v100": _N1,
                "nvidia-tesla-p100": _N1, "nvidia-l4": (("g2-",), "g2-standard-8"),
                "nvidia-tesla-a100": (("a2-",), "a2-highgpu-1g"),
                "nvidia-a100-80gb": (("a2-",), "a2-ultragpu-1g"),
                "nvidia-h100-80gb": (("a3-",), "a3-highgpu-8g"),
                "nvidia-h100-mega-80gb": (("a3-",), "a3-megagpu-8g")}


class AcceleratorConfig(Strict):
    type: str = Field(description="GPU model per worker VM, e.g. nvidia-tesla-t4 (N1 machines), "
                      "nvidia-l4 (G2), nvidia-tesla-a100 (A2); see gcloud compute "
                      "accelerator-types list")
    count: int = Field(1, description="GPUs per worker VM (>= 1)")
    install_driver: bool = Field(True, description="Dataflow installs the NVIDIA driver on "
                                 "each worker (install-nvidia-driver); the image brings CUDA")

    @field_validator("type")
    @classmethod
    def _gpu_type(cls, v: str) -> str:
        if not re.fullmatch(r"nvidia-[a-z0-9-]+", v):
            raise ValueError(f"{v!r} is not a GPU type: use one such as nvidia-tesla-t4, "
                             "nvidia-l4 or nvidia-tesla-a100 (gcloud compute accelerator-types "
                             "list)")
        return v

    @field_validator("count")
    @classmethod
    def _at_least_one(cls, v: int) -> int:
        if v < 1:
            raise ValueError(f"{v} GPUs per worker: use 1 or more, or remove runner.accelerator")
        return v

    def service_option(self) -> str:
        """The Dataflow service option that attaches the GPUs to every worker VM."""
        return (f"worker_accelerator=type:{self.type};count:{self.count}"
                + (";install-nvidia-driver" if self.install_driver else ""))


def _bucket_name(name: str) -> bool:
    """Cloud Storage's bucket name rules (the syntax; not the reserved names)."""
    if not re.fullmatch(r"[a-z0-9][-_a-z0-9.]*[a-z0-9]", name) or len(name) < 3:
        return False
    return len(name) <= 63 or ("." in name and len(name) <= 222
                               and all(len(part) <= 63 for part in name.split(".")))


class RunnerConfig(Strict):
    """Where the job runs. ``name: dataflow`` takes the typed keys below (checked here, one
    line each); any other Beam option goes through ``options`` unchanged."""

    name: str = Field("local", description="local (Beam FnApiRunner on this machine) | dask "
                      "(Beam DaskRunner: a Dask cluster, or a local one) | portable (Beam "
                      "PortableRunner: a job service, SDK workers in their own processes) | "
                      "dataflow (Google Cloud Dataflow, typed keys below) | any Beam runner "
                      "name")
    options: dict[str, Any] = Field(default_factory=dict, description="other Beam pipeline "
                                    "options, passed through as given")
    workers: int | None = Field(None, gt=0, description="local: parallel workers (unset: the "
                                "cores this process may use, or 1 for an exact-only job over "
                                "stored tensors; 1: one in-process worker) | dask: "
                                "worker processes of the local cluster (unset: the cores) | "
                                "portable: SDK worker processes of the job's own job service "
                                "(unset: the cores)")
    processes: bool | None = Field(None, description="local: parallel workers as processes of "
                                   "their own, not threads of this one (unset: processes for a "
                                   "job with a near stage, no embed section, records of at "
                                   "most 4 KB and 32 MB of input files or more, whose cells' "
                                   "many small steps queue on one interpreter's lock in "
                                   "threads; threads otherwise)")
    address: str | None = Field(None, description="dask: the scheduler of an existing cluster, "
                                "e.g. tcp://scheduler:8786 (unset: a local cluster of "
                                "runner.workers processes, stopped when the job ends) | "
                                "portable: a Beam job service, HOST:PORT (unset: one started "
                                "and stopped with the job)")
    project: str | None = Field(None, description="dataflow: Google Cloud project ID (required)")
    region: str | None = Field(None, description="dataflow: region the job and its workers run "
                               "in, e.g. us-central1 (required; GPU quota is per region)")
    temp_location: str | None = Field(None, description="dataflow: gs:// path for temporary "
                                      "files (required)")
    staging_location: str | None = Field(None, description="dataflow: gs:// path for staged "
                                         "files (unset: <temp_location>/staging)")
    machine_type: str | None = Field(None, description="dataflow: worker VM type, e.g. "
                                     "n1-standard-8 (T4 GPUs need n1-*, L4 g2-*, A100 a2-*)")
    max_workers: int | None = Field(None, gt=0, description="dataflow: autoscaling limit on "
                                    "worker VMs (caps the cost)")
    num_workers: int | None = Field(None, gt=0, description="dataflow: worker VMs to start with")
    worker_image: str | None = Field(None, description="dataflow: worker container image with "
                                     "this package installed (deploy/Dockerfile), e.g. "
                                     "REGION-docker.pkg.dev/PROJECT/REPO/worker:TAG")
    disk_size_gb: int | None = Field(None, gt=0, description="dataflow: boot disk per worker, "
                                     "GB (GPU images are large: 50 or more)")
    service_account_email: str | None = Field(None, description="dataflow: service account "
                                              "the workers run as")
    network: str | None = Field(None, description="dataflow: VPC network of the workers")
    subnetwork: str | None = Field(None, description="dataflow: subnetwork of the workers, "
                                   "e.g. regions/us-central1/subnetworks/NAME")
    job_name: str | None = Field(None, description="dataflow: job name (lowercase letters, "
                                 "digits, hyphens; unset: generated by Beam)")
    accelerator: AcceleratorConfig | None = Field(None, description="dataflow: GPUs per worker")

    @field_validator("name", mode="before")
    @classmethod
    def _dataflow_spelling(cls, v: Any) -> Any:
        """Beam's own name for it (DataflowRunner) means the same runner."""
        return "dataflow" if isinstance(v, str) and v.lower() in ("dataflow",
                                                                   "dataflowrunner") else v

    @field_validator("name")
    @classmethod
    def _known_runner(cls, v: str) -> str:
        """One of ours, a Beam runner Beam resolves by name (as its ``create_runner`` does:
        the class name in any case, with or without ``Runner``), or a dotted class path;
        anything else is a misspelling, refused before any work. One of ours in other
        case is one too ("Portable" was Beam's bare PortableRunner: no job service)."""
        if v in RUNNERS or "." in v:
            return v
        beam = {name.lower(): name for name in _beam_runner_names()}
        if v.lower() not in RUNNERS and (v.lower() in beam or f"{v.lower()}runner" in beam):
            return v
        near = (difflib.get_close_matches(v.lower().removesuffix("runner"), RUNNERS, n=1,
                                          cutoff=0.6)
                or [beam[m] for m in difflib.get_close_matches(v.lower(), beam, n=1,
                                                               cutoff=0.6)])
        fix = f"did you mean {near[0]}?" if near else (
            "use one of " + ", ".join(RUNNERS) + ", a Beam runner's name (e.g. FlinkRunner) "
            "or a PipelineRunner class's dotted path")
        raise ValueError(f"{v!r} is not a runner: {fix}")

    @field_validator(*RUNNER_KEYS)
    @classmethod
    def _runner_only(cls, v: Any, info) -> Any:
        name, runners = info.data.get("name"), RUNNER_KEYS[info.field_name]
        if v is not None and name is not None and name not in runners:
            raise ValueError(f"only used with runner.name: {' or '.join(runners)} (runner.name "
                             f"is {name!r}): remove it, or set runner.name: {runners[-1]}")
        return v

    @field_validator("address")
    @classmethod
    def _address(cls, v: str | None, info) -> str | None:
        if v is not None and info.data.get("name") == "portable":
            m = re.fullmatch(r"(\[[0-9a-fA-F:.]+\]|[-\w.]+):(\d{1,5})", v)
            if not (m and 0 < int(m[2]) < 65536):
                raise ValueError(f"{v!r} is not a job service address: use HOST:PORT (what "
                                 "python -m pipeline.portable jobs prints), e.g. "
                                 "localhost:8099")
            return v
        if v is not None and not re.fullmatch(r"(tcp|tls|inproc|ucx|ws|wss)://\S+", v):
            raise ValueError(f"{v!r} is not a Dask scheduler address: use tcp://HOST:PORT "
                             "(what dask scheduler prints), e.g. tcp://10.0.0.5:8786")
        return v

    @field_validator("temp_location", "staging_location")
    @classmethod
    def _gcs_path(cls, v: str | None) -> str | None:
        m = re.fullmatch(r"gs://([^/]+)/(.+)", v or "")
        if v is not None and not m:
            raise ValueError(f"{v!r} is not a Cloud Storage path: use gs://BUCKET/PATH, "
                             "e.g. gs://my-bucket/tmp (Dataflow stages and writes temp files "
                             "there)")
        if v is not None and not _bucket_name(m[1]):
            raise ValueError(f"{v!r}: {m[1]!r} is not a valid Cloud Storage bucket name: a "
                             "bucket name has 3-63 characters (up to 222 with dots, 63 between "
                             "them), lowercase letters, digits, - _ and ., and starts and ends "
                             "with a letter or digit, e.g. gs://my-bucket/tmp")
        return v

    @field_validator("project")
    @classmethod
    def _project_id(cls, v: str | None) -> str | None:
        if v is not None and v.isdigit():
            raise ValueError(f"{v} is a project number: use the project ID (gcloud projects "
                             "list)")
        if v is not None and not re.fullmatch(r"[a-z][-a-z0-9:.]{4,28}[a-z0-9]", v):
            raise ValueError(f"{v!r} is not a project ID: use the ID (6-30 lowercase letters, "
                             "digits, hyphens), not the project's display name")
        return v

    @field_validator("region")
    @classmethod
    def _region(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[a-z]+(-[a-z]+)+[0-9]+", v):
            raise ValueError(f"{v!r} is not a region: use one such as us-central1 or "
                             "europe-west4 (a region, not a zone)")
        return v

    @field_validator("job_name")
    @classmethod
    def _job_name(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", v):
            raise ValueError(f"{v!r} is not a Dataflow job name: use lowercase letters, digits "
                             "and hyphens, starting with a letter (at most 63)")
        return v

    @field_validator("options")
    @classmethod
    def _not_twice(cls, v: dict[str, Any], info) -> dict[str, Any]:
        if info.data.get("name") == "portable" and "job_endpoint" in v:
            raise ValueError("job_endpoint has a typed key: use runner.address instead "
                             "(see --help)")
        if info.data.get("name") != "dataflow":
            return v
        for key, value in v.items():
            typed = [k for k, names in DATAFLOW_KEYS.items() if key in names]
            if typed and (typed[0] != "accelerator" or any(
                    str(o).startswith("worker_accelerator") for o in _as_list(value))):
                what = (key if typed[0] != "accelerator"
                        else "the worker_accelerator= entry of dataflow_service_options")
                raise ValueError(f"{what} has a typed key: use runner.{typed[0]} instead "
                                 "(see --help)")
        return v

    @field_validator("options")
    @classmethod
    def _known_to_beam(cls, v: dict[str, Any]) -> dict[str, Any]:
        """An option Beam does not define is dropped by Beam without a word (a typo in
        ``-- --direct_num_workerz=4`` ran with the default)."""
        if not v:
            return v
        known = beam_option_names()
        for key in v:
            if key not in known:
                near = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.75)
                hint = f"did you mean {near[0]}?" if near else "check its name in Beam's docs"
                raise ValueError(f"{key!r} is not a Beam pipeline option (Beam "
                                 f"would ignore it): {hint}")
        return v

    @model_validator(mode="after")
    def _local_workers_flag(self) -> RunnerConfig:
        """Beam's ``direct_num_workers`` on the local runner is ``runner.workers`` (the
        README's own example flag): alone, Beam ran one worker in its in-memory mode and
        said so only in a log line the job hides."""
        n = self.options.get("direct_num_workers")
        if self.name != "local" or n is None or "direct_running_mode" in self.options:
            return self
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"runner.options.direct_num_workers: {n!r} is not a number of "
                             "workers: give N >= 1 (0: every core), or set runner.workers: N")
        n = n or None  # Beam's 0: the cores
        if self.workers is not None and n != self.workers:
            raise ValueError(f"runner.options.direct_num_workers: {n} and runner.workers: "
                             f"{self.workers} disagree: keep one (runner.workers: N)")
        self.options = {k: v for k, v in self.options.items() if k != "direct_num_workers"}
        self.workers = n
        return self

    @model_validator(mode="after")
    def _dataflow_complete(self) -> RunnerConfig:
        if self.name == "portable" and self.address is not None and self.workers is not None:
            raise ValueError("runner.workers: the job service at runner.address starts the "
                             "workers: remove runner.workers, or runner.address (a job "
                             "service of the job's own, with runner.workers workers)")
        if self.name != "dataflow":
            return self
        missing = [f"runner.{k}" for k in ("project", "region", "temp_location")
                   if getattr(self, k) is None]
        if missing:
            raise ValueError(f"runner.name dataflow needs {', '.join(missing)}: add them (e.g. "
                             "project: my-project, region: us-central1, temp_location: "
                             "gs://my-bucket/tmp)")
        if self.worker_image is None and not {"setup_file", "extra_package", "extra_packages",
                                              "requirements_file"} & set(self.options):
            raise ValueError("runner.worker_image is missing: Dataflow workers need this "
                             "package installed: build deploy/Dockerfile and set "
                             "runner.worker_image to its image (docs/dataflow.md)")
        if self.num_workers and self.max_workers and self.num_workers > self.max_workers:
            raise ValueError(f"runner.num_workers ({self.num_workers}) is more than "
                             f"runner.max_workers ({self.max_workers}): raise max_workers or "
                             "lower num_workers")
        gpu = self.accelerator
        if gpu is not None and gpu.type in GPU_MACHINES:
            series, example = GPU_MACHINES[gpu.type]
            machine = self.machine_type or "n1-standard-1 (Dataflow's default)"
            if not machine.startswith(series):
                raise ValueError(f"runner.accelerator: {gpu.type} GPUs attach to {series[0]}* "
                                 f"machine types, not {machine}: set runner.machine_type, "
                                 f"e.g. {example}")
        return self


def beam_option_names() -> set[str]:
    """Every pipeline option Beam defines (as Beam's own ``get_all_options`` collects
    them), the Dask runner's too where it is installed."""
    from apache_beam.options.pipeline_options import PipelineOptions, _BeamArgumentParser

    try:
        import apache_beam.runners.dask.dask_runner  # noqa: F401  (defines DaskOptions)
    except ImportError:
        pass
    parser = _BeamArgumentParser(allow_abbrev=False)
    for cls in {str(c): c for c in PipelineOptions.__subclasses__()}.values():
        cls._add_argparse_args(parser)  # the way Beam reads them
    return {s.lstrip("-") for a in parser._actions for s in a.option_strings}


def _beam_runner_names() -> list[str]:
    """The runners Beam resolves by name (their class names): Beam is imported only for a
    name that is not one of ``RUNNERS``."""
    from apache_beam.options.pipeline_options import StandardOptions

    return [path.rsplit(".", 1)[-1] for path in StandardOptions.ALL_KNOWN_RUNNERS]


def _as_list(value: Any) -> list:
    """A Beam option's values: none, one, or a list."""
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

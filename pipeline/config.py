"""The dedup job's config: a typed schema, ``--set`` overrides, one-line errors.

Why: a bad config must stop the job before any work with one line naming the key
and the fix (exit code 2, no traceback). YAML is read with ``yaml.safe_load`` only.
"""

from __future__ import annotations

import copy
import difflib
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from transforms.canonical import DTYPE_CODES


class ConfigError(ValueError):
    """A config problem, phrased as one line: the key, what is wrong, the fix."""


# Tolerances above this are no tolerance at all (every pair is within it) and overflow
# float32 once squared: refused, like NaN and inf (``allow_inf_nan=False`` on every float).
MAX_TOLERANCE = 1e18


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class InputConfig(_Strict):
    format: Literal["parquet", "tfrecord", "hdf5"] = Field(
        description="file format of the input: parquet | tfrecord | hdf5")
    path: str = Field(description="glob of input files: a local path or any Beam filesystem "
                      "(gs://, s3://); '{run_id}' is replaced by the run id")
    tensor: str = Field(description="Parquet column / tf.train.Example feature / HDF5 dataset")
    id: str | None = Field(None, description="column/feature with a record id; "
                           "default '<file path>:<index in file>'")
    shape: list[int] | None = Field(None, description="record shape, where the format "
                                    "does not carry it (TFRecord float_list / int64_list)")
    dtype: str | None = Field(None, description="record dtype, likewise (e.g. float32)")
    compression: Literal["auto", "none", "gzip", "zlib"] = Field(
        "auto", description="TFRecord compression: auto (detected per file) | none | gzip | zlib")
    decode: Literal["none", "image", "bytes", "text"] = Field(
        "none", description="none (the field holds numbers) | image (JPEG/PNG/GIF/BMP/WebP "
        "bytes decoded to uint8 [h, w, c]) | bytes (the stored bytes as a uint8 vector) | "
        "text (UTF-8 text; distances only after embed)")
    resize: list[int] | None = Field(None, description="decode image: [height, width] the "
                                     "near stage compares (antialiased bilinear); exact dedup "
                                     "stays on full-resolution pixels")
    channels: Literal[1, 3] | None = Field(None, description="decode image: 1 (grey) | 3 "
                                           "(RGB); unset: as stored (RGB with resize)")
    max_pixels: int = Field(50_000_000, gt=0, description="decode image: larger images are "
                            "invalid records (decompression bombs)")

    @field_validator("dtype")
    @classmethod
    def _known_dtype(cls, v: str | None) -> str | None:
        if v is not None and v not in DTYPE_CODES:
            raise ValueError(f"unknown dtype {v!r}; use one of {', '.join(DTYPE_CODES)}")
        return v

    @field_validator("resize")
    @classmethod
    def _height_width(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and (len(v) != 2 or min(v) < 1):
            raise ValueError(f"{v} is not [height, width] of two sizes >= 1, e.g. [64, 64]")
        return v

    @model_validator(mode="after")
    def _image_keys(self) -> InputConfig:
        for key in ("resize", "channels"):
            if getattr(self, key) is not None and self.decode != "image":
                raise ValueError(f"input.{key} applies to decoded images: set input.decode: "
                                 f"image or remove input.{key}")
        return self

    @field_validator("shape")
    @classmethod
    def _non_negative_shape(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and any(d < 0 for d in v):
            raise ValueError(f"dimensions must be >= 0, got {v}")
        return v


class KeyColumn(_Strict):
    max: str | None = None
    min: str | None = None


class OutputConfig(_Strict):
    path: str = Field(description="directory for clean shards (same format as the input)")
    overwrite: bool = Field(False, description="replace an existing output.path and report "
                            "(only once the new run has succeeded)")


class TuningConfig(_Strict):
    chunk_rows: int = Field(65536, gt=0, description="records per Beam element (a chunk of "
                            "rows); bigger = less per-element overhead, more memory")
    chunk_bytes: int = Field(64 << 20, gt=0, description="tensor bytes per Beam element at "
                             "most: a chunk holds min(chunk_rows, chunk_bytes / record bytes) "
                             "records (at least 1), so wide tensors (images) stay small")
    unit_rows: int = Field(262144, gt=0, description="records per read unit (a range of a "
                           "file read by one worker, split into chunks); units are what runs "
                           "in parallel; wide records get units of as many chunks as "
                           "unit_rows / chunk_rows")
    shards: int = Field(16, gt=0, description="shuffle shards of the digest group-by")
    decoded_chunk_bytes: int = Field(64 << 20, gt=0, description="input.decode: a chunk "
                                     "holds at most this many decoded (and encoded) bytes, "
                                     "whatever its rows")
    remote_timeout_s: float = Field(10.0, gt=0, le=3600, allow_inf_nan=False,
                                    description="checks before the run: seconds to wait for "
                                    "one answer from a remote filesystem (gs://, s3://) before "
                                    "stopping with exit 2 (no network or credentials)")


class NearConfig(_Strict):
    metric: Literal["allclose", "l2", "cosine"] = Field(
        description="allclose | l2 | cosine; leave the near section out (or null) for no "
        "near-duplicate stage")
    threshold: float | None = Field(None, gt=0, le=MAX_TOLERANCE, allow_inf_nan=False,
                                    description="l2: Euclidean distance; cosine: cosine "
                                    "distance 1 - cos, at most 2 (required for l2 and cosine)")
    atol: float = Field(1e-5, ge=0, le=MAX_TOLERANCE, allow_inf_nan=False,
                        description="allclose: |a - b| <= atol + rtol * |b| elementwise, b = "
                        "the kept record (numpy isclose)")
    rtol: float = Field(0.0, ge=0, le=1, allow_inf_nan=False,
                        description="allclose: relative tolerance (at most 1)")
    grouping: Literal["representative", "components"] = Field(
        "representative", description="representative (removed only if within tolerance of "
        "a kept record) | components (connected components; chains allowed)")
    mode: Literal["auto", "exact", "bounded"] = Field(
        "auto", description="exact (every pair within tolerance is found; cost can approach "
        "all-pairs on high-dimensional data) | bounded (each record meets at most `probes` "
        "cells: cost grows as n x probes; recall measured) | auto (predicts both from a "
        "sample and takes exact when it costs no more than bounded)")
    probes: int = Field(3, ge=1, le=1000, description="bounded mode: cells each record "
                        "meets at most (its own included)")
    recall_sample: int = Field(2000, ge=0, le=1_000_000, description="records checked by "
                               "brute force against all records for the recall estimate in "
                               "summary.json (0: off)")
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="where the matrix products run: auto (a CUDA GPU through torch "
        "when there is one) | cpu | cuda")
    index: Literal["auto", "flat", "ivf", "hnsw"] = Field(
        "auto", description="search inside each cell: auto = flat (exact) | ivf | hnsw "
        "(approximate: recall < 1, precision stays 1)")
    nlist: int | None = Field(None, gt=0, description="ivf: inverted lists per partition "
                              "(default 4 sqrt(rows))")
    nprobe: int = Field(16, gt=0, description="ivf: lists visited per query")
    M: int = Field(32, gt=1, description="hnsw: links per node")
    nonfinite: Literal["keep", "invalid"] = Field(
        "keep", description="records with NaN/inf values: keep (never compared by distance) | "
        "invalid (reported in invalid.parquet)")
    single_index_rows: int = Field(20_000, gt=0, description="up to this many records: one "
                                   "partition (one index)")
    partition_rows: int = Field(1_000, gt=0, description="above that: k-means partitions of "
                                "about this many records, searched on separate workers")
    borderline_pairs: int = Field(500, ge=0, description="pairs just inside and just outside "
                                  "the tolerance sampled into borderline_pairs.parquet (each)")

    @model_validator(mode="after")
    def _threshold_for_distances(self) -> NearConfig:
        if self.metric in ("l2", "cosine") and self.threshold is None:
            raise ValueError(f"metric {self.metric} needs a threshold > 0 (near.threshold)")
        if self.metric == "cosine" and self.threshold is not None and self.threshold > 2:
            raise ValueError(f"near.threshold {self.threshold:g}: cosine distance is at most 2, "
                             "so every pair would be a duplicate: use a value in (0, 2]")
        return self


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


class AcceleratorConfig(_Strict):
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


class RunnerConfig(_Strict):
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
                                   "job with a near stage, no embed section and records of at "
                                   "most 4 KB, whose cells' many small steps queue on one "
                                   "interpreter's lock in threads; threads otherwise)")
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
        if v is not None and not (m and re.fullmatch(r"[a-z0-9][-_a-z0-9.]+[a-z0-9]", m[1])):
            raise ValueError(f"{v!r} is not a Cloud Storage path: use gs://BUCKET/PATH, "
                             "e.g. gs://my-bucket/tmp (Dataflow stages and writes temp files "
                             "there)")
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


def _as_list(value: Any) -> list:
    return value if isinstance(value, list) else [value]


class EmbedConfig(_Strict):
    model: Literal["sentence-transformers", "torchscript"] = Field(
        description="sentence-transformers (a model folder or Hub name: texts, or images "
        "for CLIP-like models) | torchscript (a torch.jit.save file called on a stacked "
        "batch of the records' tensors)")
    path: str = Field(description="the model: a local folder, a Hub name "
                      "(sentence-transformers) or a .pt file (torchscript)")
    batch_size: int = Field(64, gt=0, le=65536, description="records per model call")
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="auto (a CUDA GPU where torch sees one) | cpu | cuda")
    normalize: bool = Field(True, description="sentence-transformers: unit-length "
                            "embeddings (cosine distance = 1 - dot product)")
    write: bool = Field(True, description="write every embedding to "
                        "report/embeddings/*.parquet (record_id, file, row, embedding)")


class StoreConfig(_Strict):
    path: str = Field(description="fingerprint store: a directory (local or any Beam "
                      "filesystem, e.g. gs://) holding the digests (and, with near, the values) "
                      "of every record kept by earlier runs; inputs are deduplicated against it")
    update: bool = Field(True, description="append this run's kept records to the store once "
                         "the run has succeeded (false: only check against it)")


RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._=-]{0,99}")


class DedupeConfig(_Strict):
    input: InputConfig
    run_id: str | None = Field(None, description="this run's id (default: today's UTC date, "
                               "YYYY-MM-DD); '{run_id}' in output.path and report is replaced "
                               "by it; rerunning an id replaces that run's outputs and store "
                               "entries")
    reference: list[InputConfig] = Field(
        default_factory=list, description="reference sets (a mapping or a list of them, keys "
        "as input): never removed; input records that are exact/near copies of a reference "
        "record are removed as reference_exact/reference_near (leakage check)")
    store: StoreConfig | None = Field(None, description="incremental dedup against earlier "
                                      "runs (off when absent)")
    exact: bool = Field(True, description="exact-duplicate removal on/off")
    keep: Literal["first", "last"] | KeyColumn = Field(
        "first", description="which record of a group survives: first | last | "
        "{max: column} | {min: column}")
    output: OutputConfig
    report: str = Field(description="directory for duplicates.parquet, invalid.parquet, "
                        "summary.json")
    near: NearConfig | None = Field(None, description="near-duplicate stage (off when absent)")
    embed: EmbedConfig | None = Field(None, description="embed each record with your model on "
                                      "the workers before the near stage; exact dedup stays "
                                      "on the raw values (off when absent)")
    on_invalid: Literal["skip", "fail"] = Field(
        "skip", description="skip (record goes to the report) | fail (stop with an error)")
    max_invalid_fraction: float = Field(
        0.1, ge=0, le=1, allow_inf_nan=False, description="with on_invalid: skip, the run "
        "fails (exit 1, nothing published) when more than this fraction of the input records "
        "is invalid, e.g. a wrong input.format (1.0: never)")
    runner: RunnerConfig = Field(default_factory=RunnerConfig)
    tuning: TuningConfig = Field(default_factory=TuningConfig)

    @field_validator("run_id", mode="before")
    @classmethod
    def _yaml_scalar(cls, v: Any) -> Any:
        """YAML reads 2026-11-21 as a date and 20261121 as an int: both are fine ids."""
        return v if v is None or isinstance(v, str) else str(v)

    @field_validator("run_id")
    @classmethod
    def _safe_run_id(cls, v: str | None) -> str | None:
        if v is not None and not RUN_ID.fullmatch(v):
            raise ValueError(f"{v!r} is not a usable run id: use letters, digits and . _ = - "
                             "(at most 100, no slashes), e.g. 2026-11-21")
        return v

    @field_validator("reference", mode="before")
    @classmethod
    def _one_or_many(cls, v: Any) -> Any:
        return [v] if isinstance(v, dict) else [] if v is None else v

    @field_validator("keep")
    @classmethod
    def _one_key_column(cls, v: Any) -> Any:
        if isinstance(v, KeyColumn) and (v.max is None) == (v.min is None):
            raise ValueError("give exactly one of {max: column} or {min: column}")
        return v

    @model_validator(mode="after")
    def _store_and_reference_need_exact(self) -> DedupeConfig:
        for key, on in (("store", self.store is not None), ("reference", bool(self.reference))):
            if on and not self.exact:
                raise ValueError(f"config keys '{key}' and 'exact': checking against a {key} "
                                 "starts with its exact digests: set exact: true or remove "
                                 f"{key}")
        return self

    @model_validator(mode="after")
    def _near_after_exact(self) -> DedupeConfig:
        if self.near is not None and not self.exact:
            raise ValueError("config keys 'near' and 'exact': the near stage runs on the "
                             "survivors of exact dedup (exact copies are within any "
                             "tolerance): set exact: true or remove near")
        return self


def keep_policy(keep: str | KeyColumn) -> tuple[str, str | None]:
    """("first"|"last", None) or ("max"|"min", column)."""
    if isinstance(keep, KeyColumn):
        return ("max", keep.max) if keep.max is not None else ("min", keep.min)
    return keep, None


def describe_keys(model: type[BaseModel] = DedupeConfig, prefix: str = "") -> list[str]:
    """One line per config key (dotted path, default, description), for ``--help``."""
    lines = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        sub = [a for a in getattr(field.annotation, "__args__", (field.annotation,))
               if isinstance(a, type) and issubclass(a, BaseModel) and a is not KeyColumn]
        if sub:
            lines += describe_keys(sub[0], f"{key}.")
            continue
        default = ("required" if field.is_required()
                   else f"default {field.get_default(call_default_factory=True)!r}")
        lines.append(f"  {key:<22} {field.description or ''} ({default})")
    return lines


def _set_path(data: dict, dotted: str, value: Any) -> None:
    node = data
    *parents, leaf = dotted.split(".")
    for part in parents:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"--set {dotted}: {part!r} is not a mapping in the config")
        node = child
    node[leaf] = value


def _sub_model(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds: ``X``, ``X | None``, ``list[X]``, ``Literal[...] | X``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        if (found := _sub_model(arg)) is not None:
            return found
    return None


def _dotted(parts: Sequence[str | int]) -> str:
    """("reference", 0, "tensor") -> "reference[0].tensor"."""
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else f"{'.' if out else ''}{p}"
    return out


def _unknown_key(loc: tuple) -> str:
    """One line for a key the schema does not have, with the nearest known key at the
    same level (difflib) when there is one close enough, else the keys of that level."""
    model: type[BaseModel] | None = DedupeConfig
    parts: list[str | int] = []
    for part in loc[:-1]:
        if part == "KeyColumn":  # pydantic's tag for keep's mapping form
            model = KeyColumn
        elif isinstance(part, int):
            parts.append(part)
        else:
            parts.append(part)
            field = model.model_fields.get(part) if model is not None else None
            model = None if field is None else _sub_model(field.annotation)
    name = str(loc[-1])
    where = _dotted([*parts, name])
    known = list(model.model_fields) if model is not None else []
    match = difflib.get_close_matches(name, known, n=1, cutoff=0.6) or difflib.get_close_matches(
        name.lower(), [k.lower() for k in known], n=1, cutoff=0.6)
    if match:
        nearest = next(k for k in known if k.lower() == match[0].lower())
        return f"unknown key {where}: did you mean {_dotted([*parts, nearest])}?"
    level = f"keys under {_dotted(parts)}" if parts else "top-level keys"
    return (f"unknown key {where}: remove or rename it ({level}: {', '.join(known)}; see "
            "--help)")


def _describe(err: ValidationError) -> str:
    errors = err.errors()
    unknown = [e for e in errors if e["type"] == "extra_forbidden"]
    if unknown:  # a misspelt key also makes the right one "missing": name the cause
        return _unknown_key(tuple(p for p in unknown[0]["loc"]
                                  if not str(p).startswith("function-")))
    first = errors[0]
    parts = [str(p) for p in first["loc"] if not str(p).startswith("function-")]
    kind, msg = first["type"], first["msg"]
    if parts[:1] == ["keep"] and kind != "value_error":
        # keep is a union: name the choices, not pydantic's member tag
        field = DedupeConfig.model_fields["keep"]
        return f"config key 'keep': use {field.description.split(': ', 1)[1]}"
    key = ".".join(parts)
    if not key:  # a check across keys names them itself
        return msg.removeprefix("Value error, ")
    if kind == "missing":
        return f"config key '{key}' is missing: add it (see --help)"
    if kind == "finite_number":
        return f"config key '{key}': {first['input']!r} is not a finite number: give a number"
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        return (f"config key '{key}': {first['input']} is out of range: use a number "
                f"{msg.removeprefix('Input should be ')}")
    return f"config key '{key}': {msg.removeprefix('Value error, ')}"


def beam_flags(args: Sequence[str]) -> dict[str, list[str]]:
    """Beam pipeline flags (``--name=value``, ``--name value``, a bare ``--flag``) ->
    {name: [value, ...]} in order; a bare flag is "true"."""
    given: dict[str, list[str]] = {}
    for arg in args:
        if arg.startswith("--"):
            name, eq, value = arg[2:].partition("=")
            given.setdefault(name, []).append(value if eq else "true")
        elif given:
            given[list(given)[-1]][-1] = arg
        else:
            raise ConfigError(f"Beam flag {arg!r}: write Beam's pipeline options as --name=value "
                              "after --")
    return given


def runner_key(flag: str, dataflow: bool) -> str:
    """The config key a Beam flag sets: ``--runner`` is runner.name; on Dataflow a flag
    with a typed key (``--project``, ``--sdk_container_image``...) sets that key; any other
    flag is runner.options.<flag>."""
    if flag == "runner":
        return "runner.name"
    if dataflow:
        for key, names in DATAFLOW_KEYS.items():
            if key != "accelerator" and flag in names:
                return f"runner.{key}"
    return f"runner.options.{flag}"


def _flag_value(raw: str) -> Any:
    """A flag's text as YAML reads it (2 -> int, true -> bool), else the text itself."""
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw
    return value if isinstance(value, str | int | float | bool) else raw


def _is_dataflow(name: Any) -> bool:
    return isinstance(name, str) and name.lower() in ("dataflow", "dataflowrunner")


def _apply_overrides(data: dict, overrides: Sequence[str]) -> None:
    for item in overrides:
        dotted, sep, raw = item.partition("=")
        if not sep or not dotted:
            raise ConfigError(f"--set {item!r}: write it as key.path=value")
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError as e:  # a tag (!!python/...), an unclosed bracket, ...
            what = " ".join(str(getattr(e, "problem", None) or e).split())
            raise ConfigError(f"--set {dotted}: {raw!r} is not a YAML value ({what}): write a "
                              f"plain value, or quote it as a string: --set '{dotted}=\"...\"'"
                              ) from None
        _set_path(data, dotted, value)


def _apply_beam_flags(data: dict, args: Sequence[str]) -> None:
    """Beam flags passed through (after ``--`` on the command line) as runner keys: they
    win over the config's runner.options, and are checked like them."""
    given = beam_flags(args)
    runner = data.get("runner") if isinstance(data.get("runner"), dict) else {}
    name = given["runner"][-1] if "runner" in given else runner.get("name")
    for flag, values in given.items():
        value = ([_flag_value(v) for v in values] if len(values) > 1
                 else _flag_value(values[0]))
        _set_path(data, runner_key(flag, _is_dataflow(name)), value)


def parse_config(data: Mapping[str, Any], overrides: Sequence[str] = (),
                 beam_args: Sequence[str] = ()) -> DedupeConfig:
    """A config from a mapping shaped like the YAML file, with ``key.path=value``
    overrides and Beam flags (``["--direct_num_workers=2"]``) applied; ``data`` is not
    changed. Raises ``ConfigError`` with one line naming the key and the fix."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"a config must be a mapping of keys, not {type(data).__name__}")
    data = copy.deepcopy(dict(data))
    _apply_overrides(data, overrides)
    _apply_beam_flags(data, beam_args)
    try:
        return DedupeConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_describe(e)) from None


def read_config_file(path: str | Path) -> dict:
    """The YAML file's mapping (``yaml.safe_load``); one-line ``ConfigError`` otherwise."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise ConfigError(f"config file {path} not found: check the --config path") from None
    except OSError as e:  # a directory, no permission, a file where a directory should be
        raise ConfigError(f"config file {path} cannot be read ({e.strerror}): check the "
                          "--config path") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {path} is not valid YAML: {e}".replace("\n", " ")) from None
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of keys, not "
                          f"{type(data).__name__}")
    return data


def load_config(path: str | Path, overrides: Sequence[str] = (),
                beam_args: Sequence[str] = ()) -> DedupeConfig:
    """Read a YAML config, apply ``key.path=value`` overrides and Beam flags, validate.

    Raises ``ConfigError`` with one line naming the key or file and the fix.
    """
    return parse_config(read_config_file(path), overrides, beam_args)

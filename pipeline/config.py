"""The dedup job's config: a typed schema, ``--set`` overrides, one-line errors.

Why: a bad config must stop the job before any work with one line naming the key
and the fix (exit code 2, no traceback). YAML is read with ``yaml.safe_load`` only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

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


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class InputConfig(_Strict):
    format: Literal["parquet", "tfrecord", "hdf5"] = Field(
        description="file format of the input: parquet | tfrecord | hdf5")
    path: str = Field(description="glob of input files (local now; gs://, s3:// later)")
    tensor: str = Field(description="Parquet column / tf.train.Example feature / HDF5 dataset")
    id: str | None = Field(None, description="column/feature with a record id; "
                           "default '<file path>:<index in file>'")
    shape: list[int] | None = Field(None, description="record shape, where the format "
                                    "does not carry it (TFRecord float_list / int64_list)")
    dtype: str | None = Field(None, description="record dtype, likewise (e.g. float32)")
    compression: Literal["auto", "none", "gzip", "zlib"] = Field(
        "auto", description="TFRecord compression: auto (detected per file) | none | gzip | zlib")

    @field_validator("dtype")
    @classmethod
    def _known_dtype(cls, v: str | None) -> str | None:
        if v is not None and v not in DTYPE_CODES:
            raise ValueError(f"unknown dtype {v!r}; use one of {', '.join(DTYPE_CODES)}")
        return v

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
    unit_rows: int = Field(262144, gt=0, description="records per read unit (a range of a "
                           "file read by one worker, split into chunks); units are what runs "
                           "in parallel")
    shards: int = Field(16, gt=0, description="shuffle shards of the digest group-by")


class NearConfig(_Strict):
    metric: Literal["allclose", "l2", "cosine"] = Field(
        description="allclose | l2 | cosine; leave the near section out (or null) for no "
        "near-duplicate stage")
    threshold: float | None = Field(None, gt=0, description="l2: Euclidean distance; cosine: "
                                    "cosine distance 1 - cos (required for l2 and cosine)")
    atol: float = Field(1e-5, ge=0, description="allclose: |a - b| <= atol + rtol * |b| "
                        "elementwise, b = the kept record (numpy isclose)")
    rtol: float = Field(0.0, ge=0, description="allclose: relative tolerance")
    grouping: Literal["representative", "components"] = Field(
        "representative", description="representative (removed only if within tolerance of "
        "a kept record) | components (connected components; chains allowed)")
    index: Literal["auto", "flat", "ivf", "hnsw"] = Field(
        "auto", description="auto (exact flat search in k-means partitions) | flat | ivf | "
        "hnsw (approximate: recall < 1, precision stays 1)")
    nlist: int | None = Field(None, gt=0, description="ivf: inverted lists per partition "
                              "(default 4 sqrt(rows))")
    nprobe: int = Field(16, gt=0, description="ivf: lists visited per query")
    M: int = Field(32, gt=1, description="hnsw: links per node")
    nonfinite: Literal["keep", "invalid"] = Field(
        "keep", description="records with NaN/inf values: keep (never compared by distance) | "
        "invalid (reported in invalid.parquet)")
    single_index_rows: int = Field(50_000, gt=0, description="up to this many records: one "
                                   "partition (one index)")
    partition_rows: int = Field(3_000, gt=0, description="above that: k-means partitions of "
                                "about this many records, searched on separate workers")
    borderline_pairs: int = Field(500, ge=0, description="pairs just inside and just outside "
                                  "the tolerance sampled into borderline_pairs.parquet (each)")

    @model_validator(mode="after")
    def _threshold_for_distances(self) -> NearConfig:
        if self.metric in ("l2", "cosine") and self.threshold is None:
            raise ValueError(f"metric {self.metric} needs a threshold > 0 (near.threshold)")
        return self


class RunnerConfig(_Strict):
    name: str = Field("local", description="local (Beam FnApiRunner) | any Beam runner name")
    options: dict[str, Any] = Field(default_factory=dict,
                                    description="passed through as Beam pipeline options")


class DedupeConfig(_Strict):
    input: InputConfig
    exact: bool = Field(True, description="exact-duplicate removal on/off")
    keep: Literal["first", "last"] | KeyColumn = Field(
        "first", description="which record of a group survives: first | last | "
        "{max: column} | {min: column}")
    output: OutputConfig
    report: str = Field(description="directory for duplicates.parquet, invalid.parquet, "
                        "summary.json")
    near: NearConfig | None = Field(None, description="near-duplicate stage (off when absent)")
    on_invalid: Literal["skip", "fail"] = Field(
        "skip", description="skip (record goes to the report) | fail (stop with an error)")
    runner: RunnerConfig = Field(default_factory=RunnerConfig)
    tuning: TuningConfig = Field(default_factory=TuningConfig)

    @field_validator("keep")
    @classmethod
    def _one_key_column(cls, v: Any) -> Any:
        if isinstance(v, KeyColumn) and (v.max is None) == (v.min is None):
            raise ValueError("give exactly one of {max: column} or {min: column}")
        return v

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


def _describe(err: ValidationError) -> str:
    first = err.errors()[0]
    parts = [str(p) for p in first["loc"] if not str(p).startswith("function-")]
    kind, msg = first["type"], first["msg"]
    if parts[:1] == ["keep"] and kind not in ("value_error", "extra_forbidden"):
        # keep is a union: name the choices, not pydantic's member tag
        field = DedupeConfig.model_fields["keep"]
        return f"config key 'keep': use {field.description.split(': ', 1)[1]}"
    key = ".".join(parts)
    if not key:  # a check across keys names them itself
        return msg.removeprefix("Value error, ")
    if kind == "missing":
        return f"config key '{key}' is missing: add it (see --help)"
    if kind == "extra_forbidden":
        key = ".".join(p for p in parts if "[" not in p and p != "KeyColumn")
        return f"config key '{key}' is not a known key: remove or rename it (see --help)"
    return f"config key '{key}': {msg.removeprefix('Value error, ')}"


def load_config(path: str | Path, overrides: list[str] = ()) -> DedupeConfig:
    """Read a YAML config, apply ``key.path=value`` overrides, validate.

    Raises ``ConfigError`` with one line naming the key or file and the fix.
    """
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
    for item in overrides:
        dotted, sep, raw = item.partition("=")
        if not sep or not dotted:
            raise ConfigError(f"--set {item!r}: write it as key.path=value")
        _set_path(data, dotted, yaml.safe_load(raw))
    try:
        return DedupeConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_describe(e)) from None

"""The job config's section models (input, keep, output, tuning, near, embed, store) and
the strict base every config model shares; ``pipeline.config`` assembles them into
``DedupeConfig`` and is where callers import them from."""

from __future__ import annotations

import os
from typing import Annotated, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from transforms.canonical import DTYPE_CODES
from transforms.io import layout
from transforms.io.formats.base import Chunking, Decode, TensorSpec
from transforms.io.formats.columns import is_pattern, named
from transforms.near.sets import PERMUTATIONS, TARGET_AT_THRESHOLD
from transforms.near.spec import (
    DEFAULT_SIZE,
    MAX_TOLERANCE,
    NearSpec,
    Shingles,
    threshold_refusal,
)

# MAX_TOLERANCE: tolerances above it are no tolerance at all (every pair is within it) and
# overflow float32 once squared: refused, like NaN and inf (``allow_inf_nan=False``).


def _home(path: str) -> str:
    """A leading ``~`` is the user's home, as in a shell (YAML is not one): taken as it
    stood, ``~/out`` made a folder named ``~`` in the current directory."""
    return os.path.expanduser(path) if path.startswith("~") else path


HomePath = Annotated[str, AfterValidator(_home)]  # a path key: local, or any Beam filesystem


class Strict(BaseModel):
    """Every config model's base: an unknown key is an error, not ignored."""

    model_config = ConfigDict(extra="forbid")


NPY_TENSOR = "array"  # input.tensor of a .npy input, where the config names none
_DECODED = {"image": "uint8 pixels", "bytes": "a uint8 vector of the stored bytes",
            "text": "texts"}


class InputConfig(Strict):
    format: Literal["parquet", "tfrecord", "hdf5", "jsonl", "arrow", "csv", "npy", "npz",
                    "megatron"] = Field(
        description="file format of the input: parquet | tfrecord | hdf5 | jsonl (JSON "
                    "lines, also gzip, bz2 or zstd compressed) | arrow (Arrow IPC files "
                    "and streams: Hugging Face save_to_disk) | csv (.csv or .tsv with a "
                    "header line, also compressed) | npy (NumPy np.save files: each row of "
                    "the array a record) | npz (np.savez archives: input.tensor names the "
                    "array, input.id and keep other arrays) | megatron (Megatron indexed "
                    "datasets: input.path names the .idx files, each document's tokens a "
                    "record)")
    path: HomePath = Field(description="glob of input files: a local path or any Beam filesystem "
                      "(gs://, s3://); '{run_id}' is replaced by the run id")
    tensor: str | list[str] = Field(
        description="Parquet column / tf.train.Example feature / HDF5 dataset / .npz "
                    "array (npy: optional, the file's one array); or a list of "
                    "numeric columns (parquet, arrow, jsonl, csv) whose values make each record's "
                    "vector, one per column (a feature table); globs name several: "
                    "[mean_*, visits], ['*']")
    id: str | None = Field(None, description="column/feature with a record id; "
                           "default '<file path>:<index in file>'")
    show: str | None = Field(None, description="column / feature / dataset the report's "
                             "page shows for each record instead of input.tensor (e.g. the "
                             "text or image an embedding was made from): texts as text, "
                             "encoded images as pictures, numbers as a tensor")
    shape: list[int] | None = Field(None, description="record shape, where the format "
                                    "does not carry it (TFRecord float_list / int64_list)")
    dtype: str | None = Field(None, description="record dtype, likewise (e.g. float32)")
    compression: Literal["auto", "none", "gzip", "zlib"] = Field(
        "auto", description="TFRecord compression: auto (detected per file) | none | gzip | zlib")
    decode: Literal["none", "image", "bytes", "text"] = Field(
        "none", description="none (the field holds numbers) | image (JPEG/PNG/GIF/BMP/WebP "
        "bytes decoded to uint8 [h, w, c]) | bytes (the stored bytes as a uint8 vector) | "
        "text (UTF-8 text: near metric jaccard compares its shingles; vector metrics need an "
        "embed section)")
    resize: list[int] | None = Field(None, description="decode image: [height, width] the "
                                     "near stage compares (antialiased bilinear); exact dedup "
                                     "stays on full-resolution pixels")
    channels: Literal[1, 3] | None = Field(None, description="decode image: 1 (grey) | 3 "
                                           "(RGB); unset: as stored (RGB with resize)")
    max_pixels: int = Field(Decode.max_pixels, gt=0, description="decode image: larger images are "
                            "invalid records (decompression bombs)")
    exact_on: Literal["pixels", "bytes"] = Field(
        Decode.exact_on, description="decode image: what exact dedup compares: pixels (the "
        "full-resolution decoded pixels: copies differing only in container or metadata "
        "merge) | bytes (the stored bytes: such copies are then left to near, at distance "
        "0; with resize, JPEGs decode at reduced scale, about 2x faster)")

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

    @field_validator("tensor")
    @classmethod
    def _column_list(cls, v: str | list[str]) -> str | list[str]:
        if isinstance(v, list):
            if not v:
                raise ValueError("an empty list names no column: name one column, or the "
                                 "numeric columns that make each record's vector")
            twice = next((c for i, c in enumerate(v) if c in v[:i]), None)
            if twice is not None:
                raise ValueError(f"column {twice!r} is named twice: name each column once")
        return v

    @property
    def columns(self) -> tuple[str, ...]:
        """The columns of a feature table (``tensor`` given as a list), else ()."""
        return tuple(self.tensor) if isinstance(self.tensor, list) else ()

    @model_validator(mode="after")
    def _feature_columns(self) -> InputConfig:
        if not self.columns:
            return self
        if self.format not in ("parquet", "arrow", "jsonl", "csv"):
            raise ValueError(f"input.tensor: a list of columns is read from parquet, arrow, "
                             f"jsonl and csv tables; a {self.format} record's tensor is one "
                             "feature or dataset: name it (a string)")
        if self.decode != "none":
            raise ValueError(f"input.tensor: a list of columns makes a vector of their "
                             f"numbers; input.decode: {self.decode} reads one column: name "
                             "that column (a string), or remove input.decode")
        if self.shape is not None and (any(is_pattern(c) for c in self.columns)
                                       or self.shape != [len(self.columns)]):
            raise ValueError("input.shape: the columns of input.tensor make vectors of one "
                             "value per column: remove input.shape")
        return self

    @model_validator(mode="before")
    @classmethod
    def _one_array(cls, data: object) -> object:
        """A .npy file holds one array and nothing else, a Megatron dataset tokens and
        nothing else: they need no name, and have no column for ids, another value to
        show, or encoded values; an .npz archive holds arrays of numbers or strings, shown
        as no picture or text."""
        if not isinstance(data, dict) or data.get("format") not in ("npy", "npz", "megatron"):
            return data
        if data["format"] == "npz":
            if data.get("show") is not None or data.get("decode", "none") != "none":
                raise ValueError(f"input.{'show' if data.get('show') else 'decode'}: an .npz "
                                 "archive holds arrays of numbers: remove it")
            return data
        what, ids = (("a .npy file holds one array", "<file>:<row>") if data["format"] == "npy"
                     else ("a Megatron dataset holds token ids", "<file>:<document>"))
        for key in ("id", "show"):
            if data.get(key) is not None:
                raise ValueError(f"input.{key}: {what}, no column {data[key]!r}: remove "
                                 f"input.{key} (ids are {ids})")
        if data.get("decode", "none") != "none":
            raise ValueError(f"input.decode: {what}, not encoded values: remove input.decode")
        return {"tensor": NPY_TENSOR, **data}

    @model_validator(mode="after")
    def _image_keys(self) -> InputConfig:
        for key in ("resize", "channels", "exact_on"):
            if getattr(self, key) not in (None, "pixels") and self.decode != "image":
                raise ValueError(f"input.{key} applies to decoded images: set input.decode: "
                                 f"image or remove input.{key}")
        if self.dtype is not None and self.decode != "none":
            raise ValueError(f"input.dtype applies to stored tensors (input.decode: none); "
                             f"decode {self.decode} makes {_DECODED[self.decode]}: remove "
                             "input.dtype")
        return self

    @field_validator("shape")
    @classmethod
    def _non_negative_shape(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and any(d < 0 for d in v):
            raise ValueError(f"dimensions must be >= 0, got {v}")
        return v

    def to_spec(self, rank: str | None, decoded_chunk_bytes: int) -> TensorSpec:
        """What the readers read: this section, the keep column (``rank``) and how many
        decoded bytes a chunk holds (``tuning.decoded_chunk_bytes``)."""
        decode = None
        if self.decode != "none":
            decode = Decode(self.decode, None if self.resize is None else tuple(self.resize),
                            self.channels, self.max_pixels, decoded_chunk_bytes,
                            self.exact_on)
        return TensorSpec(named(self.columns) if self.columns else self.tensor, self.id,
                          (len(self.columns),) if self.columns and not any(
                              is_pattern(c) for c in self.columns) else
                          None if self.shape is None else tuple(self.shape), self.dtype, rank,
                          self.compression, decode, columns=self.columns)


class KeyColumn(Strict):
    max: str | None = None
    min: str | None = None


class OutputConfig(Strict):
    path: HomePath = Field(description="directory for clean shards (same format as the input)")
    overwrite: bool = Field(False, description="replace an existing output.path and report "
                            "(only once the new run has succeeded)")


class TuningConfig(Strict):
    chunk_rows: int = Field(Chunking.chunk_rows, gt=0, description="records per Beam "
                            "element (a chunk of rows); bigger = less per-element overhead, "
                            "more memory")
    chunk_bytes: int = Field(Chunking.chunk_bytes, gt=0, description="tensor bytes per "
                             "Beam element at most: a chunk holds min(chunk_rows, "
                             "chunk_bytes / record bytes) records (at least 1), so wide "
                             "tensors (images) stay small")
    unit_rows: int = Field(Chunking.unit_rows, gt=0, description="records per read unit "
                           "(a range of a file read by one worker, split into chunks); "
                           "units are what runs in parallel; wide records get units of as "
                           "many chunks as unit_rows / chunk_rows")
    shards: int = Field(16, gt=0, description="shuffle shards of the digest group-by")
    decoded_chunk_bytes: int = Field(Decode.chunk_bytes, gt=0, description="input.decode: a chunk "
                                     "holds at most this many decoded (and encoded) bytes, "
                                     "whatever its rows; with jaccard char shingles, of "
                                     "sets: 1/8 of it in text")
    report_file_rows: int = Field(
        layout.FILE_ROWS, ge=0, description="report/duplicates.parquet and invalid.parquet are one "
        "file each while they hold at most this many rows (the report's worker joins the "
        "workers' parts); above, directories of part-NNNNN.parquet files, one per input "
        "file (pq.read_table reads both alike); 0: directories whenever there are rows")
    remote_timeout_s: float = Field(10.0, gt=0, le=3600, allow_inf_nan=False,
                                    description="checks before the run: seconds to wait for "
                                    "one answer from a remote filesystem (gs://, s3://) before "
                                    "stopping with exit 2 (no network or credentials)")

    def chunking(self) -> Chunking:
        """How the steps cut the input into elements (``Chunking``)."""
        return Chunking(unit_rows=self.unit_rows, chunk_rows=self.chunk_rows,
                        chunk_bytes=self.chunk_bytes)


class ShinglesConfig(Strict):
    unit: Literal["word", "char", "token"] | None = Field(
        None, description="word (n-grams of the normalised text's words) | char (n-grams of "
        "its characters) | token (n-grams of an integer sequence as stored); default: word "
        "for text, token for integer sequences")
    size: int | None = Field(None, ge=1, le=1000, description="units per shingle (default "
                             f"{DEFAULT_SIZE['word']} for word and token, "
                             f"{DEFAULT_SIZE['char']} for char)")
    normalize: bool = Field(Shingles.normalize, description="text: Unicode NFKC, lower case, "
                            "punctuation and whitespace collapsed (false: as stored, words "
                            "split at whitespace)")
    permutations: int | None = Field(None, ge=1, le=4096, description="bounded mode: MinHash "
                                     f"signature length (default {PERMUTATIONS})")
    bands: int | None = Field(None, ge=1, le=4096, description="bounded mode: LSH bands (rows "
                              "= permutations / bands; default: chosen from the threshold so "
                              "a pair at J = threshold is a candidate with chance >= "
                              f"{TARGET_AT_THRESHOLD})")

    @model_validator(mode="after")
    def _bands_fit(self) -> ShinglesConfig:
        k = self.permutations or PERMUTATIONS
        if self.bands is not None and self.bands > k:
            raise ValueError(f"near.shingles.bands {self.bands} > permutations {k}: each band "
                             "holds permutations / bands signature values; use bands <= "
                             "permutations")
        return self

    def to_shingles(self, unit: str) -> Shingles:
        return Shingles(self.unit or unit, self.size, self.normalize, self.permutations,
                        self.bands)


VECTOR_ONLY = ("probes", "index", "nlist", "nprobe", "M", "atol", "rtol", "nonfinite",
               "single_index_rows", "partition_rows", "levels")


class NearConfig(Strict):
    metric: Literal["allclose", "l2", "cosine", "correlation", "jaccard"] = Field(
        description="allclose | l2 | cosine | correlation (1 - Pearson r, each image channel "
        "centred on its own mean: brightness and contrast ignored) | jaccard (texts and token "
        "sequences: the Jaccard similarity of their shingle sets); leave the near section "
        "out (or null) for no near-duplicate stage")
    threshold: float | None = Field(None, gt=0, le=MAX_TOLERANCE, allow_inf_nan=False,
                                    description="l2: Euclidean distance; cosine: cosine "
                                    "distance 1 - cos, at most 2; correlation: 1 - r, below "
                                    "2; jaccard: the MINIMUM Jaccard similarity of a near "
                                    "duplicate, in (0, 1] (required for every metric but "
                                    "allclose)")
    shingles: ShinglesConfig | None = Field(None, description="jaccard: how a record becomes "
                                            "a set of shingles")
    atol: float = Field(NearSpec.atol, ge=0, le=MAX_TOLERANCE, allow_inf_nan=False,
                        description="allclose: |a - b| <= atol + rtol * |b| elementwise, b = "
                        "the kept record (numpy isclose)")
    rtol: float = Field(NearSpec.rtol, ge=0, le=1, allow_inf_nan=False,
                        description="allclose: relative tolerance (at most 1)")
    grouping: Literal["representative", "components"] = Field(
        NearSpec.grouping, description="representative (removed only if within tolerance of "
        "a kept record) | components (connected components; chains allowed)")
    mode: Literal["auto", "exact", "bounded"] = Field(
        NearSpec.mode, description="exact (every pair within tolerance is found; cost can approach "
        "all-pairs on high-dimensional data) | bounded (each record meets at most `probes` "
        "cells: cost grows as n x probes; recall measured) | auto (predicts both from a "
        "sample and takes exact when it costs no more than bounded)")
    probes: int = Field(NearSpec.probes, ge=1, le=1000, description="bounded mode: cells "
                        "each record meets at most (its own included)")
    recall_sample: int = Field(NearSpec.recall_sample, ge=0, le=1_000_000,
                               description="records checked by brute force against all "
                               "records for the recall estimate in summary.json (0: off)")
    device: Literal["auto", "cpu", "cuda"] = Field(
        NearSpec.device, description="where the matrix products run: auto (a CUDA GPU "
        "through torch when there is one) | cpu | cuda")
    index: Literal["auto", "flat", "ivf", "hnsw"] = Field(
        NearSpec.index, description="search inside each cell: auto = flat (exact) | ivf | hnsw "
        "(approximate: recall < 1, precision stays 1)")
    nlist: int | None = Field(NearSpec.nlist, gt=0, description="ivf: inverted lists per partition "
                              "(default 4 sqrt(rows))")
    nprobe: int = Field(NearSpec.nprobe, gt=0, description="ivf: lists visited per query")
    M: int = Field(NearSpec.hnsw_m, gt=1, description="hnsw: links per node")
    nonfinite: Literal["keep", "invalid"] = Field(
        "keep", description="records with NaN/inf values: keep (never compared by distance) | "
        "invalid (reported in invalid.parquet)")
    single_index_rows: int = Field(NearSpec.single_index_rows, gt=0, description="up to "
                                   "this many records: one partition (one index)")
    partition_rows: int = Field(NearSpec.partition_rows, gt=0, description="above that: "
                                "k-means partitions of about this many records, searched on "
                                "separate workers")
    levels: Literal[1, 2] = Field(
        NearSpec.levels, description="cells in one level (k-means over the sample; above "
        "partition_rows^2 records they grow as sqrt n) or 2 (about 1,000 coarse cells, "
        "each cut into its own fine cells of partition_rows records: a record is "
        "assigned in about 1,000 + 12 x (fine cells per coarse cell) distances; "
        "docs/near.md for what it costs in recall today)")
    borderline_pairs: int = Field(500, ge=0, description="pairs just inside and just outside "
                                  "the tolerance sampled into borderline_pairs.parquet (each)")

    @field_validator("threshold", "atol", "rtol", mode="before")
    @classmethod
    def _a_number(cls, v: object) -> object:
        if isinstance(v, bool):  # YAML's true read as 1.0: a threshold of 1 by accident
            raise ValueError(f"a number is needed, not {str(v).lower()}")
        return v

    @model_validator(mode="after")
    def _threshold_for_distances(self) -> NearConfig:
        if refused := threshold_refusal(self.metric, self.threshold):
            raise ValueError(refused)
        if self.metric == "jaccard":
            # by value too: a dumped config (run_job(cfg, overrides=...)) holds every key
            wrong = [k for k in VECTOR_ONLY if k in self.model_fields_set
                     and getattr(self, k) != type(self).model_fields[k].default]
            if wrong:
                raise ValueError(f"near.{wrong[0]} applies to vector metrics, not jaccard: "
                                 "remove it (jaccard's settings are near.shingles.*)")
        elif self.shingles is not None:
            raise ValueError("near.shingles applies to metric jaccard only: remove it or set "
                             "near.metric: jaccard")
        if self.metric in ("l2", "cosine", "correlation"):
            wrong = [k for k in ("atol", "rtol") if k in self.model_fields_set
                     and getattr(self, k) != type(self).model_fields[k].default]
            if wrong:
                raise ValueError(f"near.{wrong[0]} applies to metric allclose only; "
                                 f"{self.metric} compares with near.threshold: remove "
                                 f"near.{wrong[0]}")
        if self.device == "cuda" and self.index in ("ivf", "hnsw"):
            raise ValueError(f"near.index {self.index} searches each cell with a FAISS index "
                             "on the CPU (docs/gpu.md); near.device: cuda applies to index "
                             "flat: set near.device: auto or cpu, or near.index: flat")
        return self

    def to_spec(self, channels: int = 1, unit: str = "word") -> NearSpec:
        """The kernel's settings (``NearSpec``); ``channels``: a decoded image's, each
        centred on its own mean by the correlation metric; ``unit``: jaccard's default
        shingle unit for the input (word for text, token for integer sequences)."""
        shingles = None
        if self.metric == "jaccard":
            shingles = (self.shingles or ShinglesConfig()).to_shingles(unit)
        return NearSpec(self.metric, threshold=self.threshold or 0.0, atol=self.atol,
                        rtol=self.rtol, grouping=self.grouping, index=self.index,
                        nlist=self.nlist, nprobe=self.nprobe, hnsw_m=self.M,
                        single_index_rows=self.single_index_rows,
                        partition_rows=self.partition_rows, levels=self.levels,
                        mode=self.mode,
                        probes=self.probes, recall_sample=self.recall_sample,
                        device=self.device, channels=channels, shingles=shingles)


class EmbedConfig(Strict):
    model: Literal["sentence-transformers", "torchscript"] = Field(
        description="sentence-transformers (a model folder or Hub name: texts, or images "
        "for CLIP-like models) | torchscript (a torch.jit.save file called on a stacked "
        "batch of the records' tensors)")
    path: HomePath = Field(description="the model: a local folder, a Hub name "
                      "(sentence-transformers) or a .pt file (torchscript)")
    batch_size: int = Field(64, gt=0, le=65536, description="records per model call")
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="auto (a CUDA GPU where torch sees one) | cpu | cuda")
    normalize: bool = Field(True, description="sentence-transformers: unit-length "
                            "embeddings (cosine distance = 1 - dot product)")
    write: bool = Field(True, description="write every embedding to "
                        "report/embeddings/*.parquet (record_id, file, row, embedding)")
    long: Literal["chunks", "truncate", "refuse"] = Field(
        "chunks", description="sentence-transformers, a text longer than the model's "
        "max_seq_length: chunks (embedded in windows of that length, their mean weighted by "
        "tokens) | truncate (cut at it: texts that share their first window get one "
        "embedding) | refuse (an invalid record, with the reason); counted in "
        "summary.json's embed.long_records either way")

    @model_validator(mode="after")
    def _long_for_text_models(self) -> EmbedConfig:
        if "long" in self.model_fields_set and self.model != "sentence-transformers":
            raise ValueError("embed.long applies to sentence-transformers models (texts and "
                             "their tokens): remove embed.long")
        return self


class StoreConfig(Strict):
    path: HomePath = Field(description="fingerprint store: a directory (local or any Beam "
                      "filesystem, e.g. gs://) holding the digests (and, with near, the values) "
                      "of every record kept by earlier runs; inputs are deduplicated against it")
    update: bool = Field(True, description="append this run's kept records to the store once "
                         "the run has succeeded (false: only check against it)")

    @field_validator("path")
    @classmethod
    def _shared(cls, path: str) -> str:
        if "{run_id}" in path:  # it is not replaced there: a folder named so, every run's
            raise ValueError("'{run_id}' is replaced in output.path and report, not here: "
                             "a store is the one folder every run shares (each run is checked "
                             "against the runs before it): remove it from store.path")
        return path

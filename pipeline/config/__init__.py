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
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from pipeline.config.runner import DATAFLOW_KEYS, RunnerConfig
from pipeline.config.sections import (
    EmbedConfig,
    HomePath,
    InputConfig,
    KeyColumn,
    NearConfig,
    OutputConfig,
    StoreConfig,
    Strict,
    TuningConfig,
)
from transforms.exact import Keep

# The whole config; its sections are ``pipeline.config.sections`` and the runner's keys
# ``pipeline.config.runner``.
__all__ = ["ConfigError", "RUN_ID", "DedupeConfig", "keep_policy", "describe_keys",
           "beam_flags", "runner_key", "parse_config", "read_config_file", "load_config"]


class ConfigError(ValueError):
    """A config problem, phrased as one line: the key, what is wrong, the fix."""


RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._=-]{0,99}")


class DedupeConfig(Strict):
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
    report: HomePath = Field(description="directory for duplicates.parquet, invalid.parquet, "
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
        "is invalid, or of the input files cannot be opened (damaged) (1.0: never)")
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

    @model_validator(mode="after")
    def _near_needs_a_distance(self) -> DedupeConfig:
        """Distances need one shape and numbers that mean something: no near stage on
        images without a size to compare them at, nor on stored bytes or text without an
        embedding."""
        src = self.input
        if src.format == "megatron":
            self._megatron_tokens()
        if self.near is not None and self.near.metric == "jaccard":
            return self._jaccard_input()
        if self.near is None or src.decode == "none":
            return self
        if src.decode == "image" and src.resize is None and src.shape is None:
            raise ValueError("near: decoded images are compared at one size, which the job "
                             "does not learn by reading every image first: set input.resize: "
                             "[height, width] (or input.shape: [h, w, c] when every image "
                             "has that shape)")
        if src.decode in ("bytes", "text") and self.embed is None:
            raise ValueError(f"near: input.decode: {src.decode} values have no distance until"
                             " they are embedded: add an embed section, or remove near (exact "
                             "dedup of the stored values needs none)")
        return self

    def _megatron_tokens(self) -> None:
        """A Megatron dataset's documents are token ids of any length: exact dedup, or
        jaccard over token n-grams; no vector metric, embedding or shape."""
        if self.embed is not None:
            raise ValueError("embed: a Megatron dataset holds token ids, not the texts or "
                             "tensors a model embeds: remove the embed section (near copies "
                             "of documents: near.metric: jaccard)")
        if self.near is not None and self.near.metric != "jaccard":
            raise ValueError(f"near.metric: {self.near.metric} compares tensors of one shape; "
                             "a Megatron dataset's documents are token sequences of any "
                             "length: use near.metric: jaccard, or remove near (exact dedup)")
        if self.input.shape is not None:
            raise ValueError("input.shape: a Megatron dataset's documents have their own "
                             "lengths: remove input.shape")

    def _jaccard_input(self) -> DedupeConfig:
        """Jaccard compares shingle sets: of texts (word, char) or integer sequences
        (token), never of embeddings or pixels."""
        src, unit = self.input, (self.near.shingles.unit if self.near.shingles else None)
        if self.embed is not None:
            raise ValueError("near.metric: jaccard compares the records' own shingles, not "
                             "embeddings: remove the embed section (or use metric cosine "
                             "with it)")
        if src.decode in ("image", "bytes"):
            raise ValueError(f"near.metric: jaccard needs text or integer sequences, not "
                             f"input.decode: {src.decode}: use decode: text for a text column")
        if src.decode == "text" and unit == "token":
            raise ValueError("near.shingles.unit: token compares integer sequences; for "
                             "input.decode: text use word or char")
        if src.decode == "none" and unit in ("word", "char"):
            raise ValueError(f"near.shingles.unit: {unit} needs input.decode: text (a string "
                             "column); integer sequences use unit token")
        if src.shape is not None:
            raise ValueError("input.shape with near.metric: jaccard: sequences are compared "
                             "at their own lengths; remove input.shape")
        return self

    @model_validator(mode="after")
    def _references_like_the_input(self) -> DedupeConfig:
        """Reference sets are read as one set, and compared with the input: one format,
        the same keys but path, and the input's decoding (records decoded otherwise never
        match)."""
        if not self.reference:
            return self
        formats = {r.format for r in self.reference}
        if len(formats) > 1:
            raise ValueError("reference: all reference sets must have one format (got "
                             f"{', '.join(sorted(formats))}): convert them or run them "
                             "separately")
        src = self.reference[0]
        if any(r.model_dump(exclude={"path"}) != src.model_dump(exclude={"path"})
               for r in self.reference[1:]):
            raise ValueError("reference: reference sets must share tensor/id/shape/dtype keys "
                             "(only path may differ): run sets with other keys separately")
        for key in ("decode", "resize", "channels", "exact_on"):
            if getattr(src, key) != getattr(self.input, key):
                raise ValueError(f"reference.{key}: {getattr(src, key)!r}, the input's "
                                 f"{getattr(self.input, key)!r}: records decoded otherwise "
                                 f"never match; give reference sets the input's {key}")
        return self

    @model_validator(mode="after")
    def _no_lossy_local_mode(self) -> DedupeConfig:
        """Beam 2.77's multi_threading mode set by hand skips the flush-race workaround
        that ``runner.workers`` applies (docs/beam-flush-race.md): it loses records."""
        mode = self.runner.options.get("direct_running_mode")
        if self.runner.name == "local" and mode == "multi_threading":
            raise ValueError("runner.options.direct_running_mode: multi_threading loses "
                             "shuffle elements in Beam 2.77's local runner; leave it out and "
                             "set runner.workers: N (parallel, with the workaround)")
        return self


def keep_policy(keep: str | KeyColumn) -> Keep:
    """The config's ``keep`` as the steps take it: ``Keep("first")``, ``Keep.max(col)``..."""
    if isinstance(keep, KeyColumn):
        return Keep.max(keep.max) if keep.max is not None else Keep.min(keep.min)
    return Keep(keep)


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
        text = field.description or ""
        default = ("required" if field.is_required()
                   else f"default {field.get_default(call_default_factory=True)!r}")
        if "default" not in text:  # a default the description explains says it there
            text += f" ({default})"
        # a key longer than the column gets a line of its own: the columns stay aligned
        lines.append(f"  {key:<22} {text}" if len(key) <= 22 else f"  {key}\n  {'':<22} {text}")
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


def _section_at(loc: Sequence[str | int]) -> type[BaseModel] | None:
    """The model of the config section at pydantic's ``loc`` ("near", "store",
    "reference", 0), or None where there is none."""
    model: type[BaseModel] | None = DedupeConfig
    for part in loc:
        if part == "KeyColumn":  # pydantic's tag for keep's mapping form
            model = KeyColumn
        elif not isinstance(part, int):  # an int: a list's item, of the list's model
            field = model.model_fields.get(part) if model is not None else None
            model = None if field is None else _sub_model(field.annotation)
    return model


def _unknown_key(loc: tuple) -> str:
    """One line for a key the schema does not have, with the nearest known key at the
    same level (difflib) when there is one close enough, else the keys of that level."""
    model = _section_at(loc[:-1])
    parts = [p for p in loc[:-1] if p != "KeyColumn"]
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


# Table formats users keep texts in, named as input.format, and the pyarrow reader of each
_CSV_NAMES = ("csv", "tsv", "txt", "text", "tab")
_ARROW_NAMES = ("feather", "ipc", "hf", "huggingface", "datasets")


_IMAGE_FILES = ("images", "image", "imagefolder", "folder", "jpg", "jpeg", "png", "webp",
                "bmp", "gif")


def _describe(err: ValidationError) -> str:
    errors = err.errors()
    unknown = [e for e in errors if e["type"] == "extra_forbidden"]
    if unknown:  # a misspelt key also makes the right one "missing": name the cause
        return _unknown_key(tuple(p for p in unknown[0]["loc"]
                                  if not str(p).startswith("function-")))
    first = errors[0]
    loc = [p for p in first["loc"] if not str(p).startswith("function-")]  # list items: ints
    parts = [str(p) for p in loc]
    kind, msg = first["type"], first["msg"]
    if parts[:1] == ["keep"] and kind != "value_error":
        # keep is a union: name the choices, not pydantic's member tag
        field = DedupeConfig.model_fields["keep"]
        return f"config key 'keep': use {field.description.split(': ', 1)[1]}"
    key = ".".join(parts)
    if not key:  # a check across keys names them itself
        return msg.removeprefix("Value error, ")
    if kind == "missing":  # say what goes there: near.metric's choices, input.format's
        section = _section_at(loc[:-1])
        field = section.model_fields.get(str(loc[-1])) if section is not None else None
        what = f" ({field.description})" if field is not None and field.description else ""
        return f"config key '{key}' is missing: add it{what}; see --help"
    if kind in ("model_type", "model_attributes_type", "dict_type") and (
            section := _section_at(loc)) is not None:
        # `--set store=/data/store`: pydantic named its class ("instance of StoreConfig")
        named = [k for k, f in section.model_fields.items() if f.is_required()] or list(
            section.model_fields)
        return (f"config key '{key}' is a section, not a value (got {first['input']!r}): give "
                f"its keys, e.g. --set {key}.{named[0]}=... or {key}: {{{named[0]}: ...}} in "
                f"the YAML (keys under {key}: {', '.join(section.model_fields)})")
    if kind == "finite_number":
        return f"config key '{key}': {first['input']!r} is not a finite number: give a number"
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        return (f"config key '{key}': {first['input']} is out of range: use a number "
                f"{msg.removeprefix('Input should be ')}")
    if kind == "literal_error" and isinstance(first["input"], str):
        allowed = re.findall(r"'([^']*)'", first["ctx"]["expected"])
        named = first["input"].lower().lstrip(".")
        if parts[-1:] == ["format"] and named in _IMAGE_FILES:
            return (f"config key '{key}': {first['input']!r} is not read (the job reads "
                    f"{', '.join(allowed)}): image files are read through a Parquet index "
                    f"of their paths (a Hugging Face Image() column): set {key}: parquet, "
                    "keep the image files' glob in the path and run again: the job then gives "
                    "the command that writes the index")
        if parts[-1:] == ["format"] and named in ("json", "ndjson", "jsonlines"):
            return (f"config key '{key}': {first['input']!r} is not one of "
                    f"{', '.join(allowed)}: JSON lines (one object per line) are read with "
                    f"{key}: jsonl")
        if parts[-1:] == ["format"] and named in _ARROW_NAMES:
            return (f"config key '{key}': {first['input']!r} is not one of "
                    f"{', '.join(allowed)}: Arrow IPC files and streams (Feather v2, Hugging "
                    f"Face save_to_disk) are read with {key}: arrow")
        if parts[-1:] == ["format"] and named in _CSV_NAMES:
            return (f"config key '{key}': {first['input']!r} is not one of "
                    f"{', '.join(allowed)}: delimited text with a header line (comma or "
                    f"tab) is read with {key}: csv")
        near = difflib.get_close_matches(first["input"].lower(), allowed, n=1, cutoff=0.6)
        if near:
            return (f"config key '{key}': {first['input']!r} is not one of "
                    f"{', '.join(allowed)}: did you mean {near[0]}?")
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
        if dotted == "run_id" and value is not None and not isinstance(value, str):
            value = raw.strip()  # an id as typed: YAML would make 0123 the number 83
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
                 beam_args: Sequence[str] = (), run_id: str | None = None) -> DedupeConfig:
    """A config from a mapping shaped like the YAML file, with ``key.path=value``
    overrides, Beam flags (``["--direct_num_workers=2"]``) and ``run_id`` (taken as
    given, a string: ``--run-id``) applied; ``data`` is not changed. Raises
    ``ConfigError`` with one line naming the key and the fix."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"a config must be a mapping of keys, not {type(data).__name__}")
    data = copy.deepcopy(dict(data))
    _apply_overrides(data, overrides)
    _apply_beam_flags(data, beam_args)
    if run_id:
        data["run_id"] = str(run_id)
    try:
        return DedupeConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_describe(e)) from None


def read_config_file(path: str | Path) -> dict:
    """The YAML file's mapping (``yaml.safe_load``); one-line ``ConfigError`` otherwise."""
    path = Path(path)
    try:
        text = path.read_text()
        data = yaml.safe_load(text)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} not found: check the --config path") from None
    except OSError as e:  # a directory, no permission, a file where a directory should be
        raise ConfigError(f"config file {path} cannot be read ({e.strerror}): check the "
                          "--config path") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {path} is not valid YAML: {e}".replace("\n", " ")) from None
    if data is None:  # 0 bytes, only comments or blank lines
        raise ConfigError(f"config file {path} is empty (it holds no keys): check the --config "
                          "path, or start from configs/dedupe.yaml")
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping of keys, not "
                          f"{type(data).__name__}")
    node = yaml.compose(text, Loader=yaml.SafeLoader)
    twice = _repeated_key(node, "")
    if twice is not None:
        raise ConfigError(f"config file {path}: key {twice[0]!r} appears twice (lines "
                          f"{twice[1]} and {twice[2]}; YAML would keep the last): keep one")
    if data.get("run_id") is not None and not isinstance(data["run_id"], str):
        data["run_id"] = _as_written(node, "run_id")
    return data


def _as_written(node: yaml.Node, key: str) -> Any:
    """A top-level key's value as the file spells it: an id YAML reads as a number, a
    date or a boolean (``run_id: 0123`` is the octal 83) is the text the user typed."""
    for k, v in node.value:
        if isinstance(k, yaml.ScalarNode) and k.value == key and isinstance(v, yaml.ScalarNode):
            return v.value
    raise ConfigError(f"config key {key!r}: give it as a quoted string, e.g. {key}: \"0123\"")


def _repeated_key(node: yaml.Node | None, at: str) -> tuple[str, int, int] | None:
    """(dotted key, its first line, the repeat's line) of the first key a mapping holds
    twice, which ``safe_load`` resolves silently by keeping the last."""
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key, value in node.value:
            name = f"{at}{key.value}" if isinstance(key, yaml.ScalarNode) else None
            if name is not None and name in seen:
                return name, seen[name], key.start_mark.line + 1
            if name is not None:
                seen[name] = key.start_mark.line + 1
            found = _repeated_key(value, f"{name or at}.")
            if found is not None:
                return found
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            if (found := _repeated_key(item, at)) is not None:
                return found
    return None


def load_config(path: str | Path, overrides: Sequence[str] = (),
                beam_args: Sequence[str] = (), run_id: str | None = None) -> DedupeConfig:
    """Read a YAML config, apply ``key.path=value`` overrides, Beam flags and ``run_id``
    (a string, as given), validate.

    Raises ``ConfigError`` with one line naming the key or file and the fix.
    """
    return parse_config(read_config_file(path), overrides, beam_args, run_id)

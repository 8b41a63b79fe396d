"""Config contract of the dedup job: valid configs load, bad ones give one clear line."""

import re

import pytest
import yaml
from pydantic import BaseModel

from pipeline.config import ConfigError, DedupeConfig, load_config
from pipeline.config.sections import KeyColumn, NearConfig
from transforms.near.spec import NearSpec

GOOD = {
    "input": {"format": "parquet", "path": "data/*.parquet", "tensor": "embedding", "id": "id"},
    "exact": True,
    "keep": "first",
    "output": {"path": "out/clean"},
    "report": "out/report",
    "on_invalid": "skip",
    "runner": {"name": "local", "options": {}},
}


def _write(tmp_path, data) -> str:
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return str(p)


def test_good_config_loads_with_defaults(tmp_path):
    minimal = {k: GOOD[k] for k in ("output", "report")}
    minimal["input"] = {k: v for k, v in GOOD["input"].items() if k != "id"}
    cfg = load_config(_write(tmp_path, minimal))
    assert cfg.exact is True and cfg.keep == "first" and cfg.on_invalid == "skip"
    assert cfg.runner.name == "local" and cfg.input.id is None


def test_set_overrides_any_key(tmp_path):
    sets = ["keep={max: score}", "input.shape=[2, 3]", "exact=false",
            "runner.options.max_cache_memory_usage_mb=2"]
    cfg = load_config(_write(tmp_path, GOOD), sets)
    assert cfg.keep == KeyColumn(max="score") and cfg.input.shape == [2, 3]
    assert cfg.exact is False and cfg.runner.options == {"max_cache_memory_usage_mb": 2}


@pytest.mark.parametrize("change,words", [
    ({"input": None}, "'input'"),
    ({"report": None}, "'report' is missing"),
    ({"near": {"threshold": 0.7}}, "'near.metric' is missing: add it (allclose | l2 | cosine"),
    ({"input": {k: v for k, v in GOOD["input"].items() if k != "format"}},
     "'input.format' is missing: add it (file format of the input: parquet | tfrecord"),
    ({"input": {**GOOD["input"], "format": "excel"}}, "input.format"),
    ({"input": {**GOOD["input"], "dtype": "float8"}}, "unknown dtype 'float8'"),
    ({"input": {**GOOD["input"], "shape": [-1]}}, "input.shape"),
    ({"keep": {"max": "a", "min": "b"}}, "exactly one"),
    ({"on_invalid": "ignore"}, "on_invalid"),
    ({"outptu": {"path": "x"}}, "unknown key outptu: did you mean output?"),
])
def test_bad_config_names_the_key(tmp_path, change, words):
    data = {**GOOD, **change}
    data = {k: v for k, v in data.items() if v is not None}
    with pytest.raises(ConfigError) as e:
        load_config(_write(tmp_path, data))
    assert words in str(e.value) and "\n" not in str(e.value)


def test_file_problems_are_one_line(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(_write(tmp_path, "input: [unclosed"))
    with pytest.raises(ConfigError, match="mapping"):
        load_config(_write(tmp_path, "- a\n- b\n"))
    with pytest.raises(ConfigError, match="key.path=value"):
        load_config(_write(tmp_path, GOOD), ["novalue"])


@pytest.mark.parametrize("text, key, lines", [
    ("near:\n  metric: l2\n  threshold: 0.1\nnear:\n  metric: l2\n", "near", "1 and 4"),
    ("near: {metric: l2, threshold: 0.1, metric: cosine}\n", "near.metric", "1 and 1"),
])
def test_a_key_written_twice_is_one_line(tmp_path, text, key, lines):
    """safe_load keeps the last of two; the first one's settings would be lost unsaid."""
    good = yaml.safe_dump(GOOD)
    with pytest.raises(ConfigError) as e:
        load_config(_write(tmp_path, good + text))
    first, second = (int(x) + len(good.splitlines()) for x in lines.split(" and "))
    assert str(e.value).endswith(f"key {key!r} appears twice (lines {first} and {second}; "
                                 "YAML would keep the last): keep one")


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n  # another\n", "---\n"])
def test_an_empty_config_file_is_named_so(tmp_path, text):
    """Not "config key 'input' is missing", which sends one looking for a typo."""
    with pytest.raises(ConfigError) as e:
        load_config(_write(tmp_path, text))
    assert str(e.value) == (f"config file {tmp_path / 'c.yaml'} is empty (it holds no keys): "
                            "check the --config path, or start from configs/dedupe.yaml")


RUN_IDS = ["0123", "0010", "0x1F", "1_000", "007", "0o17", "1.50", "true", "null", "2026_11_21",
           "2026-11-21", "20261121"]


@pytest.mark.parametrize("given", RUN_IDS)
def test_run_id_is_taken_as_typed(tmp_path, given):
    """--run-id (run_job's run_id, the schedule wrapper's TENSORDEDUP_RUN_ID), --set
    run_id= and an unquoted run_id: in the file give the id as typed: YAML reads 0123
    as the octal 83 and 0x1F as 31, so "0010" and "8" were one run (the second replaced
    the first's outputs and store entries)."""
    from pipeline.api import to_config

    path = _write(tmp_path, GOOD)
    unset = None if given == "null" else given  # in YAML (--set, the file): no id, the default
    assert to_config(path, run_id=given).run_id == given
    assert load_config(path, [f"run_id={given}"]).run_id == unset
    (tmp_path / "r.yaml").write_text(f"{yaml.safe_dump(GOOD)}run_id: {given}\n")
    assert load_config(tmp_path / "r.yaml").run_id == unset
    # --run-id wins over the file's and --set's, as before
    assert to_config(tmp_path / "r.yaml", overrides=["run_id=x"], run_id=given).run_id == given


def test_run_id_that_is_not_text_in_the_file_is_one_line(tmp_path):
    (tmp_path / "r.yaml").write_text(f"{yaml.safe_dump(GOOD)}run_id: [a, b]\n")
    with pytest.raises(ConfigError) as e:
        load_config(tmp_path / "r.yaml")
    assert str(e.value) == "config key 'run_id': give it as a quoted string, e.g. run_id: \"0123\""


def test_yaml_is_loaded_safely(tmp_path):
    """A python object tag must be rejected, never constructed."""
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(_write(tmp_path, "input: !!python/object/apply:os.system ['true']\n"))


def test_set_value_that_is_not_plain_yaml_is_one_line(tmp_path):
    """--set values are read with yaml.safe_load: a tag is refused, never constructed."""
    for raw in ("!!python/object/apply:os.system ['true']", "{", "[1, 2"):
        with pytest.raises(ConfigError, match="is not a YAML value") as e:
            load_config(_write(tmp_path, GOOD), [f"keep={raw}"])
        assert "\n" not in str(e.value)


def _float_keys(model: type[BaseModel] = DedupeConfig, prefix: str = "") -> list[str]:
    """Every float config key (dotted), found from the schema itself."""
    keys = []
    for name, field in model.model_fields.items():
        args = getattr(field.annotation, "__args__", (field.annotation,))
        sub = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
        if sub and sub[0] is not KeyColumn:
            keys += _float_keys(sub[0], f"{prefix}{name}.")
        elif float in args:
            keys.append(f"{prefix}{name}")
    return keys


@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan", "1.0e+300", "-1"])
def test_every_float_key_refuses_non_finite_and_absurd_values(tmp_path, value):
    keys = _float_keys()
    assert {"near.threshold", "near.atol", "near.rtol", "max_invalid_fraction",
            "tuning.remote_timeout_s"} <= set(keys)
    for key in keys:
        sets = ["near.metric=l2", "near.threshold=1"] if key.startswith("near.") else []
        with pytest.raises(ConfigError) as e:
            load_config(_write(tmp_path, GOOD), [*sets, f"{key}={value}"])
        assert f"config key '{key}'" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("name,line", [
    ("daks", "'daks' is not a runner: did you mean dask?"),
    ("Dask", "'Dask' is not a runner: did you mean dask?"),
    ("Portable", "'Portable' is not a runner: did you mean portable?"),
    ("DaskRunner", "'DaskRunner' is not a runner: did you mean dask?"),
    ("FlinkRuner", "'FlinkRuner' is not a runner: did you mean FlinkRunner?"),
    ("xyzzy", "'xyzzy' is not a runner: use one of local, dask, portable, dataflow, a Beam "
              "runner's name (e.g. FlinkRunner) or a PipelineRunner class's dotted path"),
    ("direct", None), ("DirectRunner", None), ("flink", None), ("PortableRunner", None),
    ("my_package.runners.MyRunner", None),
])
def test_runner_name_is_checked_before_any_work(tmp_path, name, line):
    """A misspelt runner.name was taken as a Beam runner's: the job started and failed
    with Beam's list of runner classes (exit 1). Beam's own names stay valid."""
    data = {**GOOD, "runner": {"name": name}}
    if line is None:
        assert load_config(_write(tmp_path, data)).runner.name == name
        return
    with pytest.raises(ConfigError) as e:
        load_config(_write(tmp_path, data))
    assert str(e.value) == f"config key 'runner.name': {line}"


@pytest.mark.parametrize("change,line", [
    ({"input": {**GOOD["input"], "tensr": "e"}}, "unknown key input.tensr: did you mean "
                                                 "input.tensor?"),
    ({"Keep": "last"}, "unknown key Keep: did you mean keep?"),
    ({"near": {"metric": "l2", "threshold": 1, "probe": 2}},
     "unknown key near.probe: did you mean near.probes?"),
    ({"runner": {"name": "dataflow", "accelerator": {"typ": "nvidia-l4"}}},
     "unknown key runner.accelerator.typ: did you mean runner.accelerator.type?"),
    ({"reference": [{**GOOD["input"], "formt": "parquet"}]},
     "unknown key reference[0].formt: did you mean reference[0].format?"),
    ({"keep": {"mx": "score"}}, "unknown key keep.mx: did you mean keep.max?"),
    ({"tuning": {"shard": 8}}, "unknown key tuning.shard: did you mean tuning.shards?"),
    ({"store": {"path": "s", "updat": True}}, "unknown key store.updat: did you mean "
                                              "store.update?"),
    ({"output": {"path": "o", "colour": "red"}},
     "unknown key output.colour: remove or rename it (keys under output: path, overwrite; "
     "see --help)"),
])
def test_unknown_keys_suggest_the_nearest_known_key(tmp_path, change, line):
    """At every level of the schema, one line; the misspelt key is named, not the key it
    leaves missing."""
    with pytest.raises(ConfigError) as e:
        load_config(_write(tmp_path, {**GOOD, **change}))
    assert str(e.value) == line


@pytest.mark.parametrize(("sets", "line"), [
    (["store=/data/store"], "config key 'store' is a section, not a value (got "
     "'/data/store'): give its keys, e.g. --set store.path=... or store: {path: ...} in the "
     "YAML (keys under store: path, update)"),
    (["near.metric=jaccard", "near.threshold=0.8", "near.shingles=5"],
     "config key 'near.shingles' is a section, not a value (got 5): give its keys, e.g. --set "
     "near.shingles.unit=... or near.shingles: {unit: ...} in the YAML (keys under "
     "near.shingles: unit, size, normalize, permutations, bands)"),
])
def test_a_value_where_a_section_goes_names_its_keys(tmp_path, sets, line):
    """`--set store=PATH` (a natural first guess) was "Input should be a valid dictionary
    or instance of StoreConfig": the class name, no fix."""
    with pytest.raises(ConfigError) as e:
        load_config(_write(tmp_path, GOOD), sets)
    assert str(e.value) == line


def test_paths_starting_with_a_tilde_are_in_the_home_folder(tmp_path, monkeypatch):
    """YAML is not a shell: ``~/out`` was taken as it stood, and the job made a folder
    named ``~`` in the current directory (``rm -rf ~`` away from a disaster)."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    cfg = load_config(_write(tmp_path, GOOD), ["input.path=~/in/*.parquet", "output.path=~/o",
                                               "report=~/r", "store.path=~/s",
                                               "reference=[{format: parquet, path: ~/ref.pq, "
                                               "tensor: emb}]"])
    home = tmp_path / "home"
    assert (cfg.input.path, cfg.output.path, cfg.report, cfg.store.path,
            cfg.reference[0].path) == (f"{home}/in/*.parquet", f"{home}/o", f"{home}/r",
                                       f"{home}/s", f"{home}/ref.pq")
    assert load_config(_write(tmp_path, GOOD), ["output.path=gs://b/~o"]).output.path == (
        "gs://b/~o")


def test_run_id_in_the_store_path_is_refused(tmp_path):
    """A store is shared by every run; '{run_id}' is not replaced there, and a folder
    named 'st_{run_id}' was made and used as the store."""
    with pytest.raises(ConfigError) as e:
        load_config(_write(tmp_path, GOOD), ["store.path=/data/st_{run_id}"])
    assert str(e.value) == (
        "config key 'store.path': '{run_id}' is replaced in output.path and report, not "
        "here: a store is the one folder every run shares (each run is checked against the "
        "runs before it): remove it from store.path")


def test_unknown_key_from_set_suggests_too(tmp_path):
    with pytest.raises(ConfigError, match=r"^unknown key near\.treshold: did you mean "
                                          r"near\.threshold\?$"):
        load_config(_write(tmp_path, GOOD), ["near.metric=l2", "near.treshold=0.5"])


def test_config_from_a_mapping(tmp_path):
    from pipeline.config import parse_config

    data = {**GOOD, "input": dict(GOOD["input"])}
    cfg = parse_config(data, ["keep=last"], ["--sdk_location=container"])
    assert cfg.keep == "last" and cfg.runner.options == {"sdk_location": "container"}
    assert data == {**GOOD, "input": GOOD["input"]}  # the mapping given is not changed
    with pytest.raises(ConfigError, match="must be a mapping"):
        parse_config(["input"])


@pytest.mark.parametrize("flag,words", [
    ("--direct_num_workerz=2", "'direct_num_workerz' is not a Beam pipeline option (Beam "
                               "would ignore it): did you mean direct_num_workers?"),
    ("--save_main_sesion", "'save_main_sesion' is not a Beam pipeline option (Beam would "
                           "ignore it): did you mean save_main_session?"),
    ("--my_own_flag=1", "'my_own_flag' is not a Beam pipeline option"),
])
def test_beam_options_beam_does_not_define_are_refused(tmp_path, flag, words):
    """Beam drops a pipeline option it does not define without a word: a typo after
    ``--`` (or in runner.options) ran with the default. Options Beam defines pass, the
    Dask runner's and Dataflow's among them."""
    from pipeline.config import parse_config

    with pytest.raises(ConfigError, match="^config key 'runner.options': " + re.escape(words)):
        parse_config({**GOOD}, [], [flag])
    cfg = parse_config({**GOOD}, [], ["--direct_num_workers=2", "--dask_client_address=x",
                                      "--experiments=a", "--sdk_location=container"])
    assert set(cfg.runner.options) == {"dask_client_address", "experiments", "sdk_location"}
    assert cfg.runner.workers == 2  # direct_num_workers on the local runner


@pytest.mark.parametrize("metric,threshold,words", [
    ("l2", None, "metric l2 needs a threshold > 0"),
    ("cosine", float("nan"), "near.threshold must be a number > 0, got nan"),
    ("l2", -1.0, "near.threshold must be a number > 0, got -1"),
    ("cosine", 3.0, "cosine distance is at most 2"),
    ("correlation", 2.0, "correlation distance 1 - r is at most 2"),
    ("allclose", 5.0, "near.threshold 5 applies to l2, cosine, correlation and jaccard"),
    ("jaccard", 1.5, "for jaccard it is the minimum Jaccard similarity, in (0, 1]"),
    ("jaccard", None, "metric jaccard needs near.threshold"),
    ("l2", 5e-324, "below the smallest normal float64 (2.225e-308)"),  # the report's
    ("cosine", 1e-310, "below the smallest normal float64"),  # histogram failed after the work
])
def test_near_spec_refuses_the_thresholds_the_config_refuses(metric, threshold, words):
    """The library's NearSpec accepted these (find_near then removed nothing, or every
    record); both now say what the job's config says."""
    with pytest.raises(ValueError, match=re.escape(words)):
        NearSpec(metric, **({} if threshold is None else {"threshold": threshold}))
    if threshold is None or threshold == threshold and threshold > 0:  # (pydantic: NaN, < 0)
        with pytest.raises(ValueError, match=re.escape(words)):
            NearConfig(metric=metric, threshold=threshold)


def test_beams_direct_num_workers_on_the_local_runner_is_runner_workers(tmp_path):
    """The README's example Beam flag (``-- --direct_num_workers=2``) ran one worker in
    Beam's in-memory mode, said only in a log line the job hides: it is runner.workers,
    with the parallel mode and its workaround (Beam's own options, as the job builds them)."""
    from apache_beam.options.pipeline_options import DirectOptions

    from pipeline.runners import pipeline_options

    cfg = load_config(_write(tmp_path, GOOD), beam_args=["--direct_num_workers=2"])
    assert (cfg.runner.workers, cfg.runner.options) == (2, {})
    direct = pipeline_options(cfg.runner).view_as(DirectOptions)
    assert (direct.direct_num_workers, direct.direct_running_mode) == (2, "multi_threading")
    assert load_config(_write(tmp_path, {**GOOD, "runner": {
        "options": {"direct_num_workers": 0}}})).runner.workers is None  # Beam's 0: the cores
    for runner, words in (({"workers": 3}, "direct_num_workers: 2 and runner.workers: 3 "
                                           "disagree"),
                          ({"options": {"direct_num_workers": "two"}}, "is not a number")):
        with pytest.raises(ConfigError) as e:
            load_config(_write(tmp_path, {**GOOD, "runner": runner}),
                        beam_args=["--direct_num_workers=2"] if "workers" in runner else ())
        assert words in str(e.value) and "\n" not in str(e.value)

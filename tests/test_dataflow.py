"""Dataflow runs: the typed runner keys (one-line errors), their mapping to Beam options,
and the offline dry run, checked where the Dataflow service reads each value (the job
Beam builds for submission, and its environment)."""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from apache_beam.io.localfilesystem import LocalFileSystem

from pipeline import runners as runner
from pipeline.config import runner as runner_keys
from pipeline.config.runner import DATAFLOW_KEYS, RunnerConfig
from pipeline.run import main
from pipeline.runners import common

ROOT = Path(__file__).resolve().parents[1]
IMAGE = "us-central1-docker.pkg.dev/my-project/tensordedup/worker:1"
T4 = "worker_accelerator=type:nvidia-tesla-t4;count:1;install-nvidia-driver"
DATAFLOW = {"name": "dataflow", "project": "my-project", "region": "us-central1",
            "temp_location": "gs://bucket/tmp", "machine_type": "n1-standard-8",
            "max_workers": 4, "worker_image": IMAGE,
            "accelerator": {"type": "nvidia-tesla-t4", "count": 1}}


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to resolve or connect fails the dry run and is recorded."""
    tried = []

    def refuse(*args, **kwargs):
        tried.append(args)
        raise OSError("the dry run tried to use the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    from apache_beam.runners.dataflow.internal import apiclient

    monkeypatch.setattr(apiclient, "DataflowApplicationClient", refuse)  # no submission
    return tried


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "Traceback" not in err[0], err
    return err[0]


def write_config(tmp_path: Path, glob: str, runner_cfg: dict) -> str:
    cfg = {"input": {"format": "parquet", "path": glob, "tensor": "emb", "id": "id"},
           "output": {"path": str(tmp_path / "out" / "clean")},
           "report": str(tmp_path / "out" / "report"), "runner": runner_cfg}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


# --- config: one line naming the key and the fix, exit 2, before any work -------------

@pytest.mark.parametrize("change,words", [
    ({"name": "local", "project": "my-project"},
     "config key 'runner.project': only used with runner.name: dataflow"),
    ({"name": "local", "accelerator": {"type": "nvidia-tesla-t4"}},
     "config key 'runner.accelerator': only used with runner.name: dataflow (runner.name is "
     "'local'): remove it, or set runner.name: dataflow"),
    ({"project": None, "region": None},
     "runner.name dataflow needs runner.project, runner.region: add them"),
    ({"temp_location": None}, "needs runner.temp_location"),
    ({"temp_location": "/tmp/beam"},
     "config key 'runner.temp_location': '/tmp/beam' is not a Cloud Storage path: use "
     "gs://BUCKET/PATH"),
    ({"staging_location": "gs://bucket"}, "config key 'runner.staging_location'"),
    ({"temp_location": "gs://b/tmp"},  # of the form gs://BUCKET/PATH: the name is the matter
     "config key 'runner.temp_location': 'gs://b/tmp': 'b' is not a valid Cloud Storage bucket "
     "name: a bucket name has 3-63 characters (up to 222 with dots, 63 between them), "
     "lowercase letters, digits, - _ and ., and starts and ends with a letter or digit, e.g. "
     "gs://my-bucket/tmp"),
    ({"temp_location": "gs://My_Bucket/tmp"}, "'My_Bucket' is not a valid Cloud Storage bucket "
                                              "name: a bucket name has 3-63 characters"),
    ({"staging_location": f"gs://{'a' * 64}/s"}, "is not a valid Cloud Storage bucket name"),
    ({"accelerator": {"type": "nvidia-tesla-t4", "count": 0}},
     "config key 'runner.accelerator.count': 0 GPUs per worker: use 1 or more"),
    ({"accelerator": {"type": "t4"}}, "config key 'runner.accelerator.type': 't4' is not a GPU"),
    ({"accelerator": {"type": "nvidia-l4"}},
     "nvidia-l4 GPUs attach to g2-* machine types, not n1-standard-8: set "
     "runner.machine_type, e.g. g2-standard-8"),
    ({"accelerator": {"type": "nvidia-tesla-t4", "driver": True}},
     "unknown key runner.accelerator.driver: did you mean runner.accelerator.install_driver?"),
    ({"project": "123456789"}, "is a project number: use the project ID"),
    ({"region": "us-central1-a"}, "is not a region"),
    ({"job_name": "Nightly_Run"}, "config key 'runner.job_name'"),
    ({"num_workers": 8}, "runner.num_workers (8) is more than runner.max_workers (4)"),
    ({"worker_image": None}, "runner.worker_image is missing"),
    ({"options": {"machine_type": "n1-standard-4"}},
     "config key 'runner.options': machine_type has a typed key: use runner.machine_type"),
    ({"options": {"dataflow_service_options": ["worker_accelerator=type:nvidia-l4"]}},
     "use runner.accelerator instead"),
])
def test_bad_runner_config_exits_2_with_one_line(tmp_path, parquet_in, capsys, no_network,
                                                 change, words):
    base = {} if change.get("name") == "local" else DATAFLOW
    cfg = {k: v for k, v in {**base, **change}.items() if v is not None}
    # --dry-run: a config that wrongly passed would be built offline, never submitted
    assert main(["--config", write_config(tmp_path, parquet_in, cfg), "--dry-run"]) == 2
    assert words in one_error_line(capsys)
    assert not (tmp_path / "out").exists()


# --- launching: the libraries and the buckets checked, bounded, before any work -------

LAUNCH = {**DATAFLOW, "temp_location": "gs://abc-bucket/tmp"}


class _Silent:
    """A Cloud Storage endpoint that takes connections and never answers (a network that
    drops packets, a firewall): the client's retry loop ran for 10 minutes and more."""

    def __enter__(self) -> str:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def __exit__(self, *exc) -> None:
        self.sock.close()


class _NoBuckets:
    """A Cloud Storage endpoint that answers every request: 404, no such bucket."""

    def __enter__(self) -> str:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class NotFound(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                body = b'{"error": {"code": 404, "message": "no such bucket"}}'
                self.send_response(404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), NotFound)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def _launch(tmp_path: Path, glob: str, endpoint: str, *pre: str) -> tuple[int, list[str], float]:
    """The CLI launching a Dataflow job (a process of its own: a Cloud Storage call that
    never answers stays behind in a daemon thread), Cloud Storage at ``endpoint``."""
    env = {**os.environ, "STORAGE_EMULATOR_HOST": endpoint}
    env.pop("GOOGLE_APPLICATION_CREDENTIALS", None)
    cfg = write_config(tmp_path, glob, LAUNCH)
    code = "; ".join(["import sys", *pre, "from pipeline.run import main", "sys.exit(main())"])
    start = time.monotonic()
    p = subprocess.run([sys.executable, "-c", code, "--config", cfg,
                        "--set", "tuning.remote_timeout_s=2"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    return p.returncode, p.stderr.strip().splitlines(), time.monotonic() - start


def test_a_launch_whose_bucket_does_not_answer_stops_within_the_timeout(tmp_path, parquet_in):
    """Beam's option check asked Cloud Storage about runner.temp_location's bucket with a
    retry that did not end (the sweep: 580 s without network, killed); the launch now asks
    first, for at most tuning.remote_timeout_s: one line naming the key, exit 2."""
    with _Silent() as endpoint:
        rc, err, wall = _launch(tmp_path, parquet_in, endpoint)
    assert rc == 2, err
    assert err == ["error: runner.temp_location: gs://abc-bucket/tmp: no answer within 2 s "
                   "(asking Cloud Storage for its bucket): check the network and the "
                   "credentials (gcloud auth application-default login), or raise "
                   "tuning.remote_timeout_s; runner.temp_location must be a bucket the job's "
                   "account can write"]
    assert wall < 60, wall  # the interpreter and Beam's imports, then 2 s
    assert not (tmp_path / "out").exists()


def test_a_launch_to_a_bucket_that_does_not_exist_is_one_line(tmp_path, parquet_in):
    with _NoBuckets() as endpoint:
        rc, err, _ = _launch(tmp_path, parquet_in, endpoint)
    assert rc == 2, err
    assert err == ["error: runner.temp_location: gs://abc-bucket/tmp: bucket abc-bucket does "
                   "not exist (or this account cannot see it): create it (gcloud storage "
                   "buckets create gs://abc-bucket --location us-central1), or set "
                   "runner.temp_location to a bucket of yours"]
    assert not (tmp_path / "out").exists()


def test_a_launch_without_the_gcp_libraries_is_one_line_at_once(tmp_path, parquet_in):
    """The library made missing for the launcher's process only (sys.modules: an import
    of it fails as if it were not installed)."""
    with _Silent() as endpoint:
        rc, err, _ = _launch(tmp_path, parquet_in, endpoint,
                             "sys.modules['google.cloud.storage'] = None")
    assert rc == 2, err
    assert err == ["error: runner.name: dataflow needs Beam's GCP libraries "
                   "(google.cloud.storage is missing): pip install -c constraints.txt -e "
                   "'.[dataflow]'"]
    assert not (tmp_path / "out").exists()


def test_dataflow_runner_spellings_and_help():
    assert RunnerConfig.model_validate({**DATAFLOW, "name": "DataflowRunner"}).name == "dataflow"
    assert RunnerConfig.model_validate({"name": "local", "options": {
        "sdk_worker_parallelism": 1}}).options == {"sdk_worker_parallelism": 1}
    for key in DATAFLOW_KEYS:  # every typed key is documented for --help
        assert RunnerConfig.model_fields[key].description.startswith("dataflow: ")


# --- the mapping to Beam options ------------------------------------------------------

def test_every_typed_key_reaches_its_beam_option():
    from apache_beam.options.pipeline_options import (
        GoogleCloudOptions,
        StandardOptions,
        TestOptions,
        WorkerOptions,
    )

    cfg = RunnerConfig.model_validate({
        **DATAFLOW, "staging_location": "gs://bucket/staging", "num_workers": 2,
        "disk_size_gb": 60, "service_account_email": "w@my-project.iam.gserviceaccount.com",
        "network": "net", "subnetwork": "regions/us-central1/subnetworks/sub",
        "job_name": "tensordedup-nightly",
        "accelerator": {"type": "nvidia-l4", "count": 2, "install_driver": False},
        "machine_type": "g2-standard-24",
        "options": {"experiments": ["no_use_multiple_sdk_containers"],
                    "dataflow_service_options": ["enable_prime"], "use_public_ips": False}})
    opts = runner.pipeline_options(cfg)
    given = opts.get_all_options()
    for key, names in DATAFLOW_KEYS.items():
        if key != "accelerator":
            assert given[names[0]] == getattr(cfg, key), key
    gcp, workers = opts.view_as(GoogleCloudOptions), opts.view_as(WorkerOptions)
    assert (gcp.project, gcp.region, gcp.job_name) == ("my-project", "us-central1",
                                                       "tensordedup-nightly")
    assert (gcp.temp_location, gcp.staging_location) == ("gs://bucket/tmp", "gs://bucket/staging")
    assert gcp.service_account_email == "w@my-project.iam.gserviceaccount.com"
    assert gcp.dataflow_service_options == ["enable_prime",
                                            "worker_accelerator=type:nvidia-l4;count:2"]
    assert (workers.machine_type, workers.max_num_workers, workers.num_workers) == (
        "g2-standard-24", 4, 2)
    assert (workers.sdk_container_image, workers.disk_size_gb) == (IMAGE, 60)
    assert (workers.network, workers.subnetwork) == ("net", "regions/us-central1/subnetworks/sub")
    assert workers.use_public_ips is False  # pass-through kept
    assert given["experiments"] == ["no_use_multiple_sdk_containers"]
    assert not opts.view_as(TestOptions).dry_run and not gcp.no_auth
    assert opts.view_as(StandardOptions).runner is None  # make_pipeline picks the runner

    dry = runner.pipeline_options(cfg, dry_run=True)
    assert dry.view_as(TestOptions).dry_run and dry.view_as(GoogleCloudOptions).no_auth
    assert dry.get_all_options()["sdk_location"] == "container"


def test_staging_defaults_under_temp_and_accelerator_string():
    cfg = RunnerConfig.model_validate({**DATAFLOW, "temp_location": "gs://bucket/tmp/"})
    assert runner_keys.dataflow_options(cfg)["staging_location"] == "gs://bucket/tmp/staging"
    assert runner_keys.dataflow_options(cfg)["dataflow_service_options"] == [T4]


def test_local_runner_options_pass_through_and_blocking():
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner

    local = RunnerConfig.model_validate({"options": {"direct_num_workers": 2}})
    got = runner.pipeline_options(local, dry_run=True).get_all_options(drop_default=True)
    assert got["direct_num_workers"] == 2  # taken as runner.workers: 2 on the local runner
    assert isinstance(runner.make_pipeline(local).runner, FnApiRunner)
    assert common.launcher_waits(local)
    assert not common.launcher_waits(RunnerConfig.model_validate(DATAFLOW))  # launchers return


# --- the dry run ----------------------------------------------------------------------

def capture_plan(monkeypatch) -> dict:
    seen = {}
    real = runner.build_offline

    def keep(*args):
        seen["plan"] = real(*args)
        return seen["plan"]

    monkeypatch.setattr(runner, "build_offline", keep)
    return seen


def test_dataflow_dry_run_builds_the_job_offline(tmp_path, parquet_in, capsys, monkeypatch,
                                                 no_network):
    import tempfile

    from apache_beam.portability.api import beam_runner_api_pb2

    seen = capture_plan(monkeypatch)
    cfg = write_config(tmp_path, parquet_in, DATAFLOW)
    before = sorted(p.name for p in tmp_path.iterdir())
    temp = tmp_path.parent / f"{tmp_path.name}-temp"  # Python's temp dir for this run
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    assert main(["--config", cfg, "--dry-run"]) == 0
    assert list(temp.iterdir()) == []  # Beam's stager left a folder per dry run there
    out = capsys.readouterr().out.splitlines()
    assert no_network == []
    for line in ("worker machine type: n1-standard-8", f"accelerator: {T4}", f"image: {IMAGE}"):
        assert line in out
    assert any(line.startswith("max workers: 4 ") for line in out)
    assert any(line.startswith("runner: dataflow (project my-project, region us-central1")
               for line in out)

    plan = seen["plan"]
    env = plan.job.proto.environment  # what the Dataflow service reads
    pool = env.worker_pools[0]
    assert pool.machine_type == "n1-standard-8"
    assert pool.autoscaling_settings.max_num_workers == 4
    assert pool.worker_harness_container_image == IMAGE
    assert [i.container_image for i in pool.sdk_harness_container_images] == [IMAGE]
    assert list(env.service_options) == [T4]
    assert "use_runner_v2" in env.experiments  # Dataflow GPUs need Runner v2
    assert env.temp_storage_prefix.startswith("storage.googleapis.com/bucket/tmp")
    images = {beam_runner_api_pb2.DockerPayload.FromString(e.payload).container_image
              for e in plan.job.proto_pipeline.components.environments.values()}
    assert images == {IMAGE}
    steps = plan.steps
    expected = ["Read", "Dedup/Fingerprint", "Dedup/DedupExact", "Dedup/Decide", "Write",
                "Report"]
    assert [s for s in steps if s in expected] == expected, steps
    assert plan.transforms > len(steps)
    assert f"steps: {len(steps)} ({', '.join(steps)}), {plan.transforms} transforms" in out
    # nothing written: no output, report or staging directory
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert not (tmp_path / "out").exists()


def test_dataflow_dry_run_with_embed_builds_the_gpu_job_offline(tmp_path, capsys,
                                                               monkeypatch, no_network):
    """An embed: job (texts, all-MiniLM-L6-v2 from its package folder, GPU workers): the
    model loads on the launcher, the Embed step (RunInference) is in the graph Dataflow
    would get, after exact dedup, the accelerator option is set, nothing is written or contacted."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from all_minilm_l6_v2 import extract_model

    model = str(extract_model(str(tmp_path / "models")))
    pq.write_table(pa.table({"id": ["a", "b", "c"], "text": ["x y", "z", "x y"]}),
                   tmp_path / "texts.parquet")
    seen = capture_plan(monkeypatch)
    cfg = {"input": {"format": "parquet", "path": str(tmp_path / "texts.parquet"),
                     "tensor": "text", "id": "id", "decode": "text"},
           "embed": {"model": "sentence-transformers", "path": model, "batch_size": 256},
           "near": {"metric": "cosine", "threshold": 0.1},
           "output": {"path": str(tmp_path / "out" / "clean")},
           "report": str(tmp_path / "out" / "report"), "runner": DATAFLOW}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["--config", str(tmp_path / "job.yaml"), "--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert no_network == []
    assert f"accelerator: {T4}" in out and f"image: {IMAGE}" in out
    assert f"embed: sentence-transformers {model} (batch 256, device auto, unit-length " \
        "vectors)" in out
    plan = seen["plan"]
    assert list(plan.job.proto.environment.service_options) == [T4]
    steps = plan.steps
    assert steps.index("Read") < steps.index("Dedup/DedupExact") < steps.index(
        "Dedup/EmbedKept") < steps.index("Dedup/DedupNear"), steps  # copies never embedded
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("sets, runs", [
    ([], "runner: local (Beam FnApiRunner in this process, 2 worker(s))"),
    # a near job's workers as processes (runner.processes' default from 32 MB of input):
    # it said "in this process", and the plan's memory per worker read as the whole run's
    (["near.metric=l2", "near.threshold=1.0", "runner.processes=true"],
     "runner: local (Beam FnApiRunner, 2 worker processes)"),
    (["near.metric=l2", "near.threshold=1.0"],  # a small input: threads
     "runner: local (Beam FnApiRunner in this process, 2 worker(s))"),
    (["near.metric=l2", "near.threshold=1.0", "runner.processes=false"],
     "runner: local (Beam FnApiRunner in this process, 2 worker(s))"),
])
def test_local_dry_run_builds_the_graph_without_running_it(tmp_path, parquet_in, capsys,
                                                           no_network, sets, runs):
    cfg = write_config(tmp_path, parquet_in, {"name": "local", "workers": 2})
    assert main(["--config", cfg, "--dry-run", *[a for s in sets for a in ("--set", s)]]) == 0
    out = capsys.readouterr().out
    assert runs in out.splitlines() and "steps: " in out and "Fingerprint" in out
    assert not (tmp_path / "out").exists() and no_network == []


def test_shipped_dataflow_config_dry_runs(tmp_path, capsys, monkeypatch, no_network):
    """deploy/dedupe-dataflow.yaml as shipped, its gs:// data paths pointed at the sample."""
    monkeypatch.chdir(ROOT)
    seen = capture_plan(monkeypatch)
    assert main(["--config", "deploy/dedupe-dataflow.yaml", "--dry-run",
                 "--set", "input.path=data/sample/parquet/*.parquet",
                 "--set", f"output.path={tmp_path / 'clean'}",
                 "--set", f"report={tmp_path / 'report'}"]) == 0
    assert "accelerator: " + T4 in capsys.readouterr().out
    assert "Dedup/DedupNear" in seen["plan"].steps and list(tmp_path.iterdir()) == []


# --- the Flex Template launcher entry --------------------------------------------------

def load_launcher():
    spec = importlib.util.spec_from_file_location(
        "flex_main", ROOT / "deploy" / "flex-template" / "main.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class LaunchTestFS(LocalFileSystem):
    """``dftest://x`` -> the local file ``$DFTEST_ROOT/x``: a remote-looking scheme that
    Beam's FileSystems resolves like gs:// (Beam finds FileSystem subclasses itself)."""

    @classmethod
    def scheme(cls):
        return "dftest"

    def open(self, path, *args, **kwargs):
        return super().open(os.path.join(os.environ["DFTEST_ROOT"], path[len("dftest://"):]),
                            *args, **kwargs)


def test_flex_launcher_turns_dataflow_options_into_runner_keys(tmp_path, monkeypatch):
    monkeypatch.setenv("DFTEST_ROOT", str(tmp_path))
    (tmp_path / "job.yaml").write_text("input: {}\n")
    argv = load_launcher().job_argv([
        "--config=dftest://job.yaml", "--run_id=2026-11-21", "--set=keep=last;tuning.shards=8",
        "--project=my-project", "--region=us-central1", "--job_name=tensordedup-daily",
        "--temp_location=gs://b/tmp", "--sdk_container_image=img:2", "--labels=a=b",
        "--experiments=x", "--experiments=y"])
    local = argv[1]
    assert argv[0] == "--config" and Path(local).read_text() == "input: {}\n"
    assert argv[2:4] == ["--run-id", "2026-11-21"]
    sets = argv[5::2]
    assert sets == ["runner.name=dataflow", "runner.project=my-project",
                    "runner.region=us-central1", "runner.job_name=tensordedup-daily",
                    "runner.temp_location=gs://b/tmp", "runner.worker_image=img:2",
                    "runner.options.labels=a=b", 'runner.options.experiments=["x", "y"]',
                    "keep=last", "tuning.shards=8"]
    Path(local).unlink()

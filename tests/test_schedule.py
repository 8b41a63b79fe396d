"""scripts/schedule/tensordedup-run.sh run by bash for real, with a stub python (the job
itself is tested elsewhere): exit codes, the log lines, the lock, the unit file.

Every outcome leaves a line in the log (or on stderr when the log is what is wrong): a
setup the wrapper cannot work with exits 78, never the job's 1 ("failed") or 2."""

from __future__ import annotations

import configparser
import fcntl
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "schedule" / "tensordedup-run.sh"
SETUP = 78
STUB = '#!/bin/sh\necho "job $*"\nexit "${STUB_RC:-0}"\n'


def _setup(folder: Path) -> dict[str, str]:
    (folder / "home").mkdir()
    py = folder / "py"
    py.write_text(STUB)
    py.chmod(0o755)
    return {"PATH": os.environ["PATH"], "TENSORDEDUP_HOME": str(folder / "home"),
            "TENSORDEDUP_PYTHON": str(py), "TENSORDEDUP_LOG": str(folder / "log" / "run.log"),
            "TENSORDEDUP_LOCK": str(folder / "lock")}


def _run(env: dict[str, str], user: str | None = None) -> subprocess.CompletedProcess:
    cmd = ["bash", str(SCRIPT)]
    if user is not None:
        cmd = ["runuser", "-u", user, "--", "env", *[f"{k}={v}" for k, v in env.items()], *cmd]
        env = {"PATH": os.environ["PATH"]}
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)


def _log(env: dict[str, str]) -> list[str]:
    return [ln.split(": ", 1)[1] for ln in Path(env["TENSORDEDUP_LOG"]).read_text().splitlines()
            if not ln.startswith("job ")]


def test_a_run_logs_start_and_end_and_passes_the_run_id_as_typed(tmp_path):
    env = _setup(tmp_path)
    p = _run({**env, "TENSORDEDUP_RUN_ID": "0123", "STUB_RC": "2"})
    assert p.returncode == 2, p.stderr
    text = Path(env["TENSORDEDUP_LOG"]).read_text()
    assert "job -m pipeline.run --config configs/dedupe.yaml --run-id 0123 --quiet\n" in text
    assert _log(env) == ["started: configs/dedupe.yaml", "finished: exit 2"]


def test_a_held_lock_skips_the_run_with_75_and_a_log_line(tmp_path):
    env = _setup(tmp_path)
    with open(env["TENSORDEDUP_LOCK"], "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        p = _run(env)
    assert p.returncode == 75, p.stderr
    assert _log(env) == [f"skipped: another run holds {env['TENSORDEDUP_LOCK']}"]


@pytest.mark.parametrize("key, value, words", [
    ("TENSORDEDUP_HOME", "{t}/missing", "TENSORDEDUP_HOME={t}/missing is not a directory this "
     "user can enter: set it to the tensordedup checkout"),
    ("TENSORDEDUP_PYTHON", "{t}/missing/python", "TENSORDEDUP_PYTHON={t}/missing/python is not "
     "an executable python"),
    ("TENSORDEDUP_LOCK", "{t}/afile/lock", "cannot open or create the lock file "
     "TENSORDEDUP_LOCK={t}/afile/lock as"),
])
def test_a_bad_setup_exits_78_with_a_line_in_the_log_and_on_stderr(tmp_path, key, value, words):
    """A missing TENSORDEDUP_HOME exited 1 (cd under set -e) with no log line; a lock
    file that cannot be made (here under a file) the same."""
    env = _setup(tmp_path)
    (tmp_path / "afile").write_text("")
    env[key] = value.format(t=tmp_path)
    p = _run(env)
    assert p.returncode == SETUP, p.stderr
    words = words.format(t=tmp_path)
    (logged,) = _log(env)
    assert logged.startswith("setup error: ") and words in logged, logged
    assert words in p.stderr and len(p.stderr.splitlines()) == 1, p.stderr


def test_a_log_that_cannot_be_written_exits_78_with_the_line_on_stderr(tmp_path):
    env = _setup(tmp_path)
    (tmp_path / "afile").write_text("")
    env["TENSORDEDUP_LOG"] = str(tmp_path / "afile" / "run.log")
    p = _run(env)
    assert p.returncode == SETUP
    assert (f"setup error: cannot write the log TENSORDEDUP_LOG={env['TENSORDEDUP_LOG']} as "
            in p.stderr), p.stderr


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("runuser") is None,
                    reason="needs root, to leave a root-owned lock, and runuser")
def test_a_lock_file_left_by_root_still_serves_the_service_user():
    """An admin's run by hand as root left the lock root-owned 0644: every later run as
    the service user exited 1 with no log line (the lock was opened for writing). Opened
    for reading, it locks as before. (A folder under /tmp: the service user cannot enter
    pytest's tmp_path, which is root's, mode 0700.)"""
    with tempfile.TemporaryDirectory(dir="/tmp") as d:
        folder = Path(d)
        folder.chmod(0o755)
        env = _setup(folder)
        (folder / "log").mkdir(mode=0o777)
        (folder / "log").chmod(0o777)
        Path(env["TENSORDEDUP_LOCK"]).write_text("")
        Path(env["TENSORDEDUP_LOCK"]).chmod(0o644)
        p = _run(env, user="nobody")
        assert p.returncode == 0, p.stderr
        assert _log(env) == ["started: configs/dedupe.yaml", "finished: exit 0"]
        with open(env["TENSORDEDUP_LOCK"]) as held:  # and it still excludes a second run
            fcntl.flock(held, fcntl.LOCK_EX)
            assert _run(env, user="nobody").returncode == 75


def test_the_unit_gives_the_service_user_a_lock_folder_of_its_own():
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # keys as written
    text = (ROOT / "scripts" / "schedule" / "tensordedup.service").read_text()
    unit.read_string("\n".join(ln for ln in text.splitlines() if not ln.startswith("Environment=")))
    service = unit["Service"]
    assert service["RuntimeDirectory"] == "tensordedup"
    assert "Environment=TENSORDEDUP_LOCK=/run/tensordedup/tensordedup.lock" in text.splitlines()
    assert "SuccessExitStatus" not in service  # 75 and 78 show as failures, so they are seen

"""Shared fixtures: a small Parquet input for CLI-level tests."""

import os
import tempfile
import uuid
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES", ""))


@pytest.fixture
def parquet_in(tmp_path):
    from tests.jobkit import write_input  # after the environment above is set

    x = np.arange(40, dtype=np.float32).reshape(10, 4)
    x[5:] = x[:5]
    write_input("parquet", tmp_path / "in" / "a.parquet", [f"r{i}" for i in range(10)], x,
                np.zeros(10, int))
    return str(tmp_path / "in" / "*.parquet")


@pytest.fixture
def isolated(tmp_path, monkeypatch) -> tuple[str, Path]:
    """A tag in the environment (to find every process the run starts) and a private
    temporary directory (to see every file it leaves)."""
    if not Path("/proc/self/environ").exists():
        pytest.skip("needs /proc to find the run's processes")
    tag = f"TENSORDEDUP_TEST_TAG={uuid.uuid4().hex}"
    monkeypatch.setenv(*tag.split("="))
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    return tag, tmp


@pytest.fixture(scope="session")
def corpus() -> list[str]:
    """Real texts with crawl-like near copies, a crowd and exact copies (the jaccard tests)."""
    from tests.textkit import crawl_corpus

    return crawl_corpus()


@pytest.fixture(scope="session")
def tokens(corpus) -> list[np.ndarray]:
    """``corpus`` as the all-MiniLM-L6-v2 tokenizer's ids."""
    from tests.textkit import token_ids

    return token_ids(corpus)

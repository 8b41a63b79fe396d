"""Shared fixtures: a small Parquet input for CLI-level tests."""

import os

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

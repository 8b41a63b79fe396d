"""How many threads the numeric libraries (BLAS under numpy, OpenMP under FAISS) start
per call. A runner that works on several bundles at once in one process wants one each
(on 2 cores, two workers' products with two threads each spin against each other); a
step that runs alone while the rest of the job waits on it (the near plan's k-means)
wants them all back."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


@contextlib.contextmanager
def threads(n: int | None) -> Iterator[None]:
    """BLAS and OpenMP calls use ``n`` threads inside the block (None: one per core),
    process-wide; the earlier limits come back after it."""
    import faiss
    from threadpoolctl import threadpool_limits

    n = n or os.cpu_count() or 1
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(n)
    try:
        with threadpool_limits(limits=n):
            yield
    finally:
        faiss.omp_set_num_threads(before)

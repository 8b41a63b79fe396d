"""transforms.exact: grouping and keep policies against a brute-force oracle, any input order."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.oracle import expected_removals
from transforms.exact import digest_words, find_exact_duplicates
from transforms.fingerprint import fingerprint_batch


@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.integers(0, 4), min_size=1, max_size=60),
       ranks=st.lists(st.sampled_from([0.0, 1.0, 2.0, float("nan")]), min_size=60,
                      max_size=60),
       keep=st.sampled_from(["first", "last", "max", "min"]),
       seed=st.integers(0, 2**16))
def test_matches_oracle_whatever_the_row_order(values, ranks, keep, seed):
    n = len(values)
    tensors = np.array(values, dtype=np.float32).reshape(n, 1)
    rank = np.array(ranks[:n])
    file_index, position = np.arange(n) // 7, np.arange(n) % 7  # input order = row order
    ids = [f"r{i}" for i in range(n)]
    expected = expected_removals(list(zip(ids, tensors, rank, strict=True)), keep)

    perm = np.random.default_rng(seed).permutation(n)  # the shuffle delivers rows in any order
    words = digest_words(fingerprint_batch(tensors[perm]))
    removed, kept = find_exact_duplicates(words, file_index[perm], position[perm], keep,
                                          rank[perm])
    got = {ids[perm[r]]: ids[perm[k]] for r, k in zip(removed, kept, strict=True)}
    assert got == expected
    order = [(file_index[perm[r]], position[perm[r]]) for r in removed]
    assert order == sorted(order)  # removals come out in input order


def test_no_duplicates_no_removals():
    words = digest_words(fingerprint_batch(np.arange(10, dtype=np.int64).reshape(10, 1)))
    removed, kept = find_exact_duplicates(words, np.zeros(10, int), np.arange(10))
    assert len(removed) == len(kept) == 0


def test_rows_sharing_only_the_first_digest_word_are_not_duplicates():
    """Digests built to collide on their first 64 bits (the kernel's pre-sort key) but not
    the second: at shard size, against a dict over whole digests, keep first and last."""
    rng = np.random.default_rng(5)
    n = 200_000
    hi = rng.integers(0, 2**16, n, dtype=np.uint64)  # ~3 rows share each hi word
    lo = rng.integers(0, 4, n, dtype=np.uint64)  # few lo values: real duplicates too
    words = np.stack([hi, lo], axis=1)
    file_index, position = rng.integers(0, 3, n), rng.permutation(n)
    for keep in ("first", "last"):
        removed, kept = find_exact_duplicates(words, file_index, position, keep)
        best: dict[tuple[int, int], int] = {}
        for i in np.lexsort((position, file_index)).tolist()[:: 1 if keep == "first" else -1]:
            best.setdefault((int(hi[i]), int(lo[i])), i)
        want = {i: best[(int(hi[i]), int(lo[i]))] for i in range(n)
                if best[(int(hi[i]), int(lo[i]))] != i}
        assert dict(zip(removed.tolist(), kept.tolist(), strict=True)) == want
        pairs = set(zip(hi.tolist(), lo.tolist(), strict=True))
        assert len(want) > 10_000 and len(pairs) > n // 2

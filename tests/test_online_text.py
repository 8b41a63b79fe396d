"""OnlineDedup with near metric jaccard: a streaming filter for texts and token sequences
(tf.data, PyTorch, plain batches), against the brute-force oracle in exact fractions
(tests/textkit.py) in stream order, on real texts and the model tokenizer's ids (the
``corpus`` and ``tokens`` fixtures: tests/conftest.py)."""

from __future__ import annotations

import numpy as np
import pytest

from filters.online import OnlineDedup
from tests.textkit import lsh_misses_allowed, oracle
from transforms.near.sets import Shingles, jaccard, lsh_params, record_sets
from transforms.near.spec import NearSpec

BATCH = 37  # rows per keep_mask call: batches end inside groups of near copies


def _stream(dedup: OnlineDedup, values: list, ids: list | None = None) -> np.ndarray:
    return np.concatenate([dedup.keep_mask(values[i:i + BATCH], None if ids is None else
                                           ids[i:i + BATCH])
                           for i in range(0, len(values), BATCH)])


def _spec(unit: str, mode: str, threshold: float = 0.8) -> NearSpec:
    return NearSpec("jaccard", threshold, mode=mode, shingles=Shingles(unit=unit))


@pytest.mark.parametrize("unit", ["word", "token"])
def test_exact_mode_keeps_what_the_oracle_keeps_in_stream_order(corpus, tokens, unit):
    """Greedy in stream order, every pair at J >= t found (prefix tokens in hash order):
    the kept records are the oracle's, exact repeats dropped as exact."""
    values = corpus if unit == "word" else tokens
    dedup = OnlineDedup(near=_spec(unit, "exact"))
    keep = _stream(dedup, values)
    removed = oracle(record_sets(values, Shingles(unit=unit)), 0.8)
    assert 150 < len(removed) < len(values) / 2
    assert set(np.flatnonzero(~keep).tolist()) == set(removed)
    distinct = len({v if isinstance(v, str) else v.tobytes() for v in values})
    assert dedup.stats.dropped_exact == len(values) - distinct
    assert dedup.stats.dropped_near == len(removed) - dedup.stats.dropped_exact


@pytest.mark.parametrize("threshold", [0.7, 0.9])
def test_bounded_mode_is_precise_and_finds_what_the_s_curve_says(corpus, threshold):
    """LSH bands (the default, auto): every dropped record has an earlier kept record at
    J >= t (verified), and the oracle's removals missed no more than the S-curve allows."""
    dedup = OnlineDedup(near=_spec("word", "auto", threshold))
    keep = _stream(dedup, corpus)
    sets = record_sets(corpus, Shingles())
    kept = np.flatnonzero(keep)
    for d in np.flatnonzero(~keep).tolist():
        earlier = kept[kept < d]
        assert max(jaccard(sets.row(d), sets.row(k)) for k in earlier.tolist()) >= threshold
    truth = oracle(sets, threshold)
    found = set(np.flatnonzero(~keep).tolist())
    assert len(set(truth) - found) <= lsh_misses_allowed(
        [j for _, j in truth.values()], *lsh_params(threshold))


def test_blank_texts_are_never_near_and_their_repeats_are_exact():
    texts = ["", "   ", "", "!!", "A short text.", "a short text", "A short text."]
    dedup = OnlineDedup(near=_spec("word", "exact"))
    keep = dedup.keep_mask(texts)
    # "" once; "   " and "!!" have no word (never near anything); the normalised copy is near
    assert keep.tolist() == [True, True, False, True, True, False, False]
    assert (dedup.stats.dropped_exact, dedup.stats.dropped_near) == (2, 1)


def test_lone_surrogates_and_bad_bytes_read_as_replacement_characters():
    """json.loads gives a str with a lone surrogate for a broken escape; Arrow refuses it
    (UnicodeEncodeError ended the stream): it reads as U+FFFD, as bytes that are not
    UTF-8 do."""
    base = "the quick brown fox jumps over the lazy dog again and again"
    texts = [base.replace("fox", "f\ud800x"), base.replace("fox", "f\ufffdx"),
             base.replace("fox", "f?x").encode().replace(b"?", b"\xe9"),
             "another text altogether, unrelated"]
    dedup = OnlineDedup(near=_spec("word", "exact"))
    assert dedup.keep_mask(texts).tolist() == [True, False, False, True]
    assert dedup.stats.dropped_exact == 2


def test_a_saved_state_resumes_the_stream_and_ids_keep_epochs_alike(tmp_path, corpus):
    """Stopped halfway, saved, loaded: the rest of the stream is decided as if never
    stopped; with ids, a second epoch keeps the same records."""
    ids = [f"doc-{i}" for i in range(len(corpus))]
    whole = _stream(OnlineDedup(near=_spec("word", "bounded")), corpus, ids)
    half = (len(corpus) // 2 // BATCH) * BATCH
    first = OnlineDedup(near=_spec("word", "bounded"))
    head = _stream(first, corpus[:half], ids[:half])
    first.save(tmp_path / "state.npz")
    resumed = OnlineDedup.load(tmp_path / "state.npz")
    assert resumed.near == first.near
    tail = _stream(resumed, corpus[half:], ids[half:])
    assert np.array_equal(np.concatenate([head, tail]), whole)
    resumed.new_epoch()
    again = _stream(resumed, corpus, ids)
    assert np.array_equal(again, whole)


def test_tf_data_strings_are_filtered_in_graph_order(corpus):
    tf = pytest.importorskip("tensorflow")
    from filters.tf import online_filter

    expected = [t for t, k in zip(corpus, _stream(OnlineDedup(near=_spec("word", "bounded")),
                                                  corpus), strict=True) if k]
    ds = tf.data.Dataset.from_tensor_slices(corpus).apply(
        online_filter(OnlineDedup(near=_spec("word", "bounded")), batch_size=BATCH))
    got = [b.decode("utf-8") for b in ds.as_numpy_iterator()]
    assert got == expected


def test_torch_dataset_of_token_sequences(tokens):
    """Variable-length sequences (lists of ints, as a dataset yields them) in chunks."""
    pytest.importorskip("torch")
    from filters.torch import OnlineDedupDataset

    expected = _stream(OnlineDedup(near=_spec("token", "exact")), tokens)
    rows = [{"input_ids": t.tolist(), "n": i} for i, t in enumerate(tokens)]
    ds = OnlineDedupDataset(rows, OnlineDedup(near=_spec("token", "exact")),
                            tensor_fn=lambda r: r["input_ids"], chunk=50)
    assert [r["n"] for r in ds] == np.flatnonzero(expected).tolist()


@pytest.mark.parametrize("unit", ["word", "token"])
def test_none_records_are_passed_on_and_the_others_decided_as_without_them(corpus, tokens, unit):
    """A null in a dataset's text column (pyarrow, HF datasets) is no text: kept, never
    compared, and the other records decided as in a stream without the nulls."""
    import pyarrow as pa

    values = corpus if unit == "word" else tokens
    rng = np.random.default_rng(5)
    null = rng.random(len(values)) < 0.1
    null[:3] = True
    mixed = [None if z else v for z, v in zip(null, values, strict=True)]
    plain = [v for z, v in zip(null, values, strict=True) if not z]
    want = _stream(OnlineDedup(near=_spec(unit, "exact")), plain)
    dedup = OnlineDedup(near=_spec(unit, "exact"))
    if unit == "word":  # as a pyarrow column with nulls
        keep = np.concatenate([dedup.keep_mask(pa.array(mixed[i:i + BATCH]))
                               for i in range(0, len(mixed), BATCH)])
    else:
        keep = _stream(dedup, mixed)
    assert keep[null].all() and (~want).sum() > 100
    assert keep[~null].tolist() == want.tolist()
    assert dedup.stats.seen == dedup.stats.kept + dedup.stats.dropped_exact \
        + dedup.stats.dropped_near == len(values)


def test_values_of_the_wrong_kind_are_refused_by_name():
    for one in ("one text, read as a batch of its characters", b"one text"):
        with pytest.raises(TypeError, match=r"not one (str|bytes).*pass \[text\]"):
            OnlineDedup(near=_spec("word", "bounded")).keep_mask(one)
    with pytest.raises(TypeError, match="texts"):
        OnlineDedup(near=_spec("word", "bounded")).keep_mask(np.arange(6.0).reshape(3, 2))
    with pytest.raises(TypeError, match="integer sequences"):
        OnlineDedup(near=_spec("token", "bounded")).keep_mask([np.array([0.5, 1.5])])

"""near.metric: correlation (1 - Pearson r, each image channel centred on its own mean)
against brute force on real photo tiles: the metric itself, flat records, the kernel in
every mode and grouping, the report's nearest neighbours, the online filter, the job on
a Hugging Face Image() Parquet and against its fingerprint store, and the config."""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from PIL import Image

from filters.online import OnlineDedup
from pipeline.run import main
from tests.imagekit import HF_IMAGE, crops, encode
from tests.oracle import near_decisions, near_oracle, near_pairs, stream_oracle
from transforms.images import decode_image
from transforms.near.find import find_near
from transforms.near.nearest import nearest_distances
from transforms.near.spec import NearSpec
from transforms.near.verify import centred_channels, exact_distance

FLAT = ((0, 0, 0), (40, 40, 40), (50, 50, 50), (128, 128, 128), (200, 60, 60))


def shifted(im: np.ndarray, b: int) -> np.ndarray:
    """Brightness: a uniform shift, clipped to 0..255."""
    return np.clip(im.astype(int) + b, 0, 255).astype(np.uint8)


def planted(n: int = 120, seed: int = 0) -> tuple[list[bytes], list[int]]:
    """(encoded images, the tile each comes from) in a shuffled order: ``n`` crops of the
    photos (random places, so neighbours overlap: near-identical decoys), flat tiles of
    several greys and colours, and edits of a third of them (JPEG q90 and q70, brightness
    +-10, a 1-pixel resize, a brightness +10 crowd of one tile), plus the flat tiles'
    +10 copies."""
    rng = np.random.default_rng(seed)
    tiles = crops(n, h=64, w=64, seed=seed) + [
        np.broadcast_to(np.array(c, np.uint8), (64, 64, 3)).copy() for c in FLAT]
    data, fam = [], []
    for i, t in enumerate(tiles):
        data.append(encode(t))
        fam.append(i)
    for i in rng.choice(n, n // 3, replace=False).tolist() + list(range(n, len(tiles))):
        t = tiles[i]
        for v in (encode(t, "JPEG", quality=90), encode(t, "JPEG", quality=70),
                  encode(shifted(t, 10)), encode(shifted(t, -10)),
                  encode(np.asarray(Image.fromarray(t).resize((65, 65))))):
            data.append(v)
            fam.append(i)
    for b in range(1, 30):  # one tile brightened 30 ways: a crowd at distance ~0
        data.append(encode(shifted(tiles[0], b)))
        fam.append(0)
    order = rng.permutation(len(data))
    return [data[i] for i in order], [fam[i] for i in order]


def pixels(data: list[bytes]) -> np.ndarray:
    """What the near stage compares: resized to 32 x 32, RGB, flattened (uint8)."""
    return np.stack([decode_image(v, resize=(32, 32), channels=3)[1] for v in data]
                    ).reshape(len(data), -1)


def pearson(a: np.ndarray, b: np.ndarray, channels: int) -> float:
    """1 - r from sums in exact arithmetic (math.fsum), each channel centred alone."""
    a = a.astype(np.float64).reshape(-1, channels)
    b = b.astype(np.float64).reshape(-1, channels)
    a = a - np.array([math.fsum(c) / len(c) for c in a.T])
    b = b - np.array([math.fsum(c) / len(c) for c in b.T])
    ab, aa, bb = (math.fsum((p * q).ravel()) for p, q in ((a, b), (a, a), (b, b)))
    return 1 - ab / math.sqrt(aa * bb)


def test_the_metric_is_one_minus_pearson_r_of_each_channel_centred():
    x = pixels(planted(60)[0])
    rng = np.random.default_rng(1)
    a, b = rng.integers(0, len(x), (2, 200))
    spec = NearSpec("correlation", 0.1, channels=3)
    d, _ = exact_distance(x[a], x[b], spec)
    ok = ~np.isnan(d)
    assert ok.sum() > 100
    want = [pearson(x[i], x[j], 3) for i, j in zip(a[ok], b[ok], strict=True)]
    np.testing.assert_allclose(d[ok], want, atol=1e-12)
    # one channel: numpy's Pearson r over all values
    d1, _ = exact_distance(x[a], x[b], NearSpec("correlation", 0.1))
    r = [np.corrcoef(x[i].astype(float), x[j].astype(float))[0, 1]
         for i, j in zip(a[ok], b[ok], strict=True)]
    np.testing.assert_allclose(d1[ok], 1 - np.array(r), atol=1e-12)
    # brightness (unclipped) and contrast leave it at 0; colour balance per channel too
    y = x[:20].astype(np.float64)
    moved = y * 1.7 + 12 + np.tile([5.0, -3.0, 0.0], 1024)
    np.testing.assert_allclose(exact_distance(y, moved, spec)[0], 0, atol=1e-12)


def test_flat_records_are_never_within():
    """A tile of one colour has no picture once centred: two flat tiles of different grey
    are different pictures, and a flat tile's brightness +10 copy is exactly such a pair,
    so neither is merged (equal flat tiles are exact copies). A tile flat in one channel
    only still has a direction."""
    flat = np.array([np.full(3072, v, np.uint8) for v in (0, 10, 40, 50, 255)])
    spec = NearSpec("correlation", 1.9, channels=3)
    d, within = exact_distance(flat[:-1], flat[1:], spec)
    assert np.isnan(d).all() and not within.any()
    assert not len(find_near(flat, np.arange(5), spec).removed)
    tile = pixels([encode(crops(1, seed=4)[0])])[0].reshape(-1, 3)
    one = tile.copy()
    one[:, 1] = 77  # green flat, red and blue as they were
    d, within = exact_distance(one.reshape(1, -1), tile.reshape(1, -1), spec)
    assert within.all() and 0 < d[0] < 1
    d, within = exact_distance(one.reshape(1, -1), (one + 9).reshape(1, -1), spec)
    assert within.all() and d[0] < 1e-12


def test_centring_gives_a_row_the_same_bits_in_any_company():
    """The search and the verification each centre the rows they hold; the bound holds
    because a row's centred values do not depend on which rows come with it."""
    rng = np.random.default_rng(2)
    for channels, d in ((1, 1), (1, 130), (3, 3), (3, 3072), (4, 4096)):
        x = rng.standard_normal((40, d)) * 10 ** rng.uniform(-3, 6, (40, 1))
        x += 10 ** rng.uniform(0, 9, (40, 1))  # offsets far above the spread
        x = x.astype(rng.choice([np.float32, np.float64]))
        c = centred_channels(x, channels)
        for i in range(40):
            for company in ([i], [7, i, 3], list(range(i + 1))):
                assert np.array_equal(centred_channels(x[company], channels)[company.index(i)],
                                      c[i])


@pytest.mark.parametrize("grouping", ["representative", "components"])
@pytest.mark.parametrize("partitions,mode", [(1, "exact"), (6, "exact"), (6, "bounded")])
@pytest.mark.parametrize("threshold", [0.01, 0.05])
def test_kernel_equals_the_oracle_on_photo_tiles(grouping, partitions, mode, threshold):
    x = pixels(planted()[0])
    spec = NearSpec("correlation", threshold, channels=3, grouping=grouping, mode=mode,
                    index="flat", recall_sample=500)
    r = find_near(x, np.arange(len(x)), spec, partitions=partitions)
    got = dict(zip(r.removed.tolist(), r.kept.tolist(), strict=True))
    want = near_oracle(x, spec)
    assert len(want) > 100
    np.testing.assert_allclose(r.distance, exact_distance(x[r.removed], x[r.kept], spec)[0])
    if mode == "exact" or not r.capped.any():
        assert got == want
        assert r.recall.recall == 1.0
    elif grouping == "representative":  # bounded may miss pairs, never precision
        assert exact_distance(x[r.removed], x[r.kept], spec)[1].all()
    else:
        assert all(want.get(a, a) == want.get(k, k) for a, k in got.items())


def test_report_nearest_neighbours_pass_over_flat_records():
    """A flat record is nobody's nearest neighbour and has none (like a zero vector for
    cosine); the others' nearest is the brute-force nearest among records with a
    picture."""
    x = pixels(planted(60)[0])
    spec = NearSpec("correlation", 0.02, channels=3)
    from transforms.near.space import search_space, search_vectors

    z = search_vectors(x, spec, 0.2, search_space(x, spec).mean(axis=0), np.float64)
    rows = np.arange(len(x))
    best, dist, _ = nearest_distances(x, z, rows, spec, 0.2)
    flat = (x.reshape(len(x), -1, 3).std(axis=1) == 0).all(axis=1)
    assert flat.sum() >= 10
    assert (best[flat] == -1).all() and np.isinf(dist[flat]).all()
    assert not np.isin(best, np.flatnonzero(flat)).any()
    c = centred_channels(x, 3)
    u = c / np.maximum(np.linalg.norm(c, axis=1, keepdims=True), 1e-300)
    g = 1 - u @ u.T
    g[:, flat] = np.inf
    np.fill_diagonal(g, np.inf)
    np.testing.assert_allclose(dist[~flat], g[~flat].min(axis=1), atol=1e-9)


def test_online_filter_matches_the_stream_oracle():
    x = pixels(planted(80)[0])
    spec = NearSpec("correlation", 0.02, channels=3)
    f, keep, rng, s = OnlineDedup(near=spec), np.zeros(len(x), bool), np.random.default_rng(5), 0
    while s < len(x):
        b = int(rng.integers(1, 60))
        keep[s:s + b] = f.keep_mask(x[s:s + b].reshape(-1, 32, 32, 3))
        s += b
    want = stream_oracle(x, spec)
    assert (~want).sum() > 60
    assert np.array_equal(keep, want)


def _hf(path, data: list[bytes], prefix: str) -> None:
    """An HF datasets Parquet (Image() column) with an id column."""
    table = pa.table({"id": [f"{prefix}{i}" for i in range(len(data))],
                      "image": pa.array([{"bytes": v, "path": f"{i}.png"}
                                         for i, v in enumerate(data)], HF_IMAGE)})
    features = {"image": {"_type": "Image"}, "id": {"dtype": "string", "_type": "Value"}}
    pq.write_table(table.replace_schema_metadata(
        {"huggingface": json.dumps({"info": {"features": features}})}), path,
        row_group_size=64)


def _run(tmp_path, name: str, near: dict, **top) -> dict[str, tuple[str, str, float]]:
    cfg = {"input": {"format": "parquet", "path": str(tmp_path / f"{name}.parquet"),
                     "tensor": "image", "id": "id", "decode": "image", "resize": [32, 32],
                     "channels": 3},
           "near": near, "output": {"path": str(tmp_path / name / "clean")},
           "report": str(tmp_path / name / "report"), "run_id": name, **top}
    (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["--config", str(tmp_path / f"{name}.yaml"), "--quiet"]) == 0
    rows = pq.read_table(tmp_path / name / "report" / "duplicates.parquet").to_pylist()
    return {r["record_id"]: (r["kind"], r["duplicate_of"], r["distance"]) for r in rows}


def _oracle(stored: np.ndarray, x: np.ndarray, data: list[bytes], prefix: str,
            stored_ids: list[str], spec: NearSpec) -> dict[str, tuple[str, str]]:
    """{removed id: (kind, kept id)}: exact copies of the full-resolution pixels, then the
    brute-force grouping of the survivors after the stored records (never removed)."""
    first: dict[bytes, int] = {}
    out, surv = {}, []
    for i, v in enumerate(data):
        full = decode_image(v, channels=3)[0]
        k = full.tobytes() + bytes(str(full.shape), "ascii")
        if k in first:
            out[f"{prefix}{i}"] = ("exact", f"{prefix}{first[k]}")
        else:
            first[k] = i
            surv.append(i)
    rows = np.concatenate([stored, x[surv]]) if len(stored) else x[surv]
    ids = stored_ids + [f"{prefix}{i}" for i in surv]
    tier = "store_near" if len(stored) else "near"
    for r, k in near_decisions(near_pairs(rows, spec), spec.grouping, len(stored)).items():
        out[ids[r]] = (tier if k < len(stored) else "near", ids[k])
    return out


@pytest.mark.parametrize("grouping", ["representative", "components"])
def test_the_job_on_hf_images_equals_brute_force(tmp_path, grouping):
    """Decoded images are compared with each channel centred (the job passes the
    decoded channels to the metric): the removals are the brute-force grouping of the
    resized pixels, with their verified 1 - r."""
    data, _ = planted(90, seed=3)
    _hf(tmp_path / "a.parquet", data, "a")
    got = _run(tmp_path, "a", {"metric": "correlation", "threshold": 0.03, "grouping": grouping})
    x = pixels(data)
    spec = NearSpec("correlation", 0.03, channels=3, grouping=grouping)
    want = _oracle(np.empty((0, x.shape[1])), x, data, "a", [], spec)
    assert {k: v[:2] for k, v in got.items()} == want
    assert sum(k == "near" for k, _ in want.values()) > 60
    for rid, (kind, kept, dist) in got.items():
        if kind == "near":
            i, j = int(rid[1:]), int(kept[1:])
            assert dist == pytest.approx(pearson(x[i], x[j], 3), abs=1e-12)


def test_the_store_near_path_compares_with_the_stored_pictures(tmp_path):
    """Run 1 stores its pictures' pixels; run 2's edited copies of them (JPEG, brightness,
    resize) are removed as near copies of the stored records, by the same metric."""
    tiles = crops(70, h=64, w=64, seed=6)
    first = [encode(t) for t in tiles[:50]]
    _hf(tmp_path / "day1.parquet", first, "d1-")
    store = {"path": str(tmp_path / "store")}
    near = {"metric": "correlation", "threshold": 0.02}
    got1 = _run(tmp_path, "day1", near, store=store)
    assert {k: v[:2] for k, v in got1.items()} == _oracle(
        np.empty((0, 3072)), pixels(first), first, "d1-", [], NearSpec(
            "correlation", 0.02, channels=3))
    second = [encode(t) for t in tiles[50:]]
    for t in tiles[:20]:
        second += [encode(t, "JPEG", quality=85), encode(shifted(t, 10)),
                   encode(np.asarray(Image.fromarray(t).resize((66, 66))))]
    _hf(tmp_path / "day2.parquet", second, "d2-")
    got = _run(tmp_path, "day2", near, store=store)
    kept1 = [i for i in range(len(first)) if f"d1-{i}" not in got1]
    stored = pixels([first[i] for i in kept1])
    want = _oracle(stored, pixels(second), second, "d2-", [f"d1-{i}" for i in kept1],
                   NearSpec("correlation", 0.02, channels=3))
    assert {k: v[:2] for k, v in got.items()} == want
    assert sum(k == "store_near" for k, _ in want.values()) > 40


@pytest.mark.parametrize("threshold,words", [
    (2, "near.threshold 2: correlation distance 1 - r is at most 2"),
    (5, "near.threshold 5: correlation distance 1 - r is at most 2"),
    (None, "metric correlation needs a threshold > 0 (near.threshold)")])
def test_a_threshold_of_2_or_more_stops_with_one_line(tmp_path, capsys, threshold, words):
    _hf(tmp_path / "c.parquet", [encode(t) for t in crops(3, seed=8)], "c")
    cfg = {"input": {"format": "parquet", "path": str(tmp_path / "c.parquet"),
                     "tensor": "image", "decode": "image", "resize": [32, 32]},
           "near": {"metric": "correlation", **({} if threshold is None
                                                else {"threshold": threshold})},
           "output": {"path": str(tmp_path / "out")}, "report": str(tmp_path / "report")}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["--config", str(tmp_path / "c.yaml"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and len(err.splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "out").exists()

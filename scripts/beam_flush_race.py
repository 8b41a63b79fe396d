"""Minimal repro: Beam's local runner in multi_threading mode loses elements.

Pure Beam, no project code, so it can go upstream as is (docs/beam-flush-race.md).
Create 16 keys -> Reshuffle -> FlatMap to 2,000 elements of 16 kB each per key ->
GroupByKey -> count per key. Every run should count 16 x 2,000 = 32,000 elements; with
``direct_running_mode=multi_threading`` the gRPC data plane's 1-second flush thread
drops whatever a worker writes between its read and its clear of the output buffer.
``--fixed`` sets ``worker_handlers.DATA_BUFFER_TIME_LIMIT_MS = 0`` before the runner is
built (size-based flushing only, as Dataflow's SDK harness does by default).

    python scripts/beam_flush_race.py --runs 5            # shows the loss
    python scripts/beam_flush_race.py --runs 5 --fixed    # exact every time
    python scripts/beam_flush_race.py --switch-interval 0.005   # Python's default: rarer
"""

from __future__ import annotations

import argparse
import sys
import time

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.portability.fn_api_runner import FnApiRunner, worker_handlers

KEYS, PER_KEY, SIZE = 16, 2000, 16_000


def fan_out(key: int, per_key: int, size: int):
    """A few MB per key: the writer keeps the output buffer busy past the 1 s flush."""
    payload = bytes(size)
    for _ in range(per_key):
        yield key, payload


def count_once(workers: int, mode: str, per_key: int, size: int) -> tuple[int, float]:
    """(elements that reached the GroupByKey's output, seconds)."""
    arrived = beam.metrics.Metrics.counter("repro", "arrived")

    def count(kv: tuple[int, list[bytes]]) -> int:
        arrived.inc(len(kv[1]))
        return len(kv[1])

    opts = PipelineOptions(flags=[], direct_num_workers=workers, direct_running_mode=mode)
    start = time.perf_counter()
    p = beam.Pipeline(runner=FnApiRunner(), options=opts)
    _ = (p | beam.Create(range(KEYS)) | beam.Reshuffle() | beam.FlatMap(fan_out, per_key, size)
         | beam.GroupByKey() | beam.Map(count))
    result = p.run()
    result.wait_until_finish()
    counters = result.metrics().query()["counters"]
    total = sum(c.committed for c in counters if c.key.metric.name == "arrived")
    return total, time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--per-key", type=int, default=PER_KEY, help="elements per key")
    ap.add_argument("--size", type=int, default=SIZE, help="bytes per element")
    ap.add_argument("--mode", default="multi_threading",
                    choices=["multi_threading", "multi_processing", "in_memory"])
    ap.add_argument("--fixed", action="store_true",
                    help="set worker_handlers.DATA_BUFFER_TIME_LIMIT_MS = 0 first")
    ap.add_argument("--switch-interval", type=float, default=1e-5, metavar="S",
                    help="sys.setswitchinterval(S) first (default 1e-5; Python's is 0.005): "
                    "threads trade the GIL more often, so the flush thread is preempted "
                    "inside its window in most runs, not one in five or ten")
    args = ap.parse_args(argv)
    sys.setswitchinterval(args.switch_interval)
    if args.fixed:
        worker_handlers.DATA_BUFFER_TIME_LIMIT_MS = 0
    expected = KEYS * args.per_key
    print(f"apache-beam {beam.__version__}, {args.mode}, {args.workers} workers, "
          f"{KEYS} x {args.per_key} x {args.size:,} B, GIL switch interval "
          f"{sys.getswitchinterval():g} s, "
          f"DATA_BUFFER_TIME_LIMIT_MS={worker_handlers.DATA_BUFFER_TIME_LIMIT_MS}")
    lossy = 0
    for i in range(args.runs):
        got, secs = count_once(args.workers, args.mode, args.per_key, args.size)
        lossy += got != expected
        print(f"run {i + 1}: {got:,} of {expected:,} elements ({expected - got:,} lost) "
              f"in {secs:.1f} s")
    print(f"{lossy} of {args.runs} runs lost elements")
    return 1 if lossy else 0


if __name__ == "__main__":
    sys.exit(main())

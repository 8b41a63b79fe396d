"""The dry run's capacity plan: what the job would do with the input (``workload``) and
its time, bytes and memory on a runner (``plan``, per-core rates in ``rates.json``;
docs/scale.md)."""

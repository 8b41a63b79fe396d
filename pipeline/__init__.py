"""The dedup job (Beam): Read -> Fingerprint -> Exact -> Near -> Decide -> Write.

Coming with the pipeline issue; the kernels it will call live in ``transforms``.
"""

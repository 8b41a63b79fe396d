"""Kernels over plain arrays (no Beam inside): fingerprints, tensor keys, and later the
near-duplicate search; the Beam pipeline and the training filters are thin layers over them.
"""

"""Building blocks of the dedup job and the training filters. Nothing here builds a Beam
pipeline (pipeline/ does), and no module imports Beam or TensorFlow when it is imported
(torch: only ``fingerprint_torch``, the torch kernel; h5py: only ``io.formats.hdf5*``).
Nothing here imports pipeline/ or filters/ (tests/test_architecture.py).

- Kernels over plain arrays (numpy, xxhash, ml_dtypes): fingerprints (``fingerprint``,
  ``digests``, ``canonical``, ``xxh3``), exact grouping and keep policies (``exact``),
  tensors as dict keys (``keys``), image bytes to pixels (``images``), threads per
  kernel call (``cores``).
- ``near/``: the near-duplicate search, one package (its ``__init__`` names the API).
  torch is imported only for torch inputs or a CUDA device, FAISS only for approximate
  indexes and the job's k-means planning.
- ``io/``: files and storage: ``fs`` (local paths with ``os``; Beam's FileSystems,
  imported on first use, for gs:// and other schemes), ``formats`` (TFRecord, Parquet,
  HDF5 readers and writers: TFRecord features need TensorFlow, HDF5 needs h5py),
  ``layout`` (where every file of a run lives), ``lease``, ``conditional``, ``owner``,
  ``remote``, ``spill``, ``agreed``, ``periodic``.
- ``store/``: the fingerprint store across runs.

The training filters (filters/) use the kernels and the TFRecord framing, so they run in
the lean install (``pip install -c constraints.txt "tensordedup[torch]"`` or ``[tf]``).
"""

"""Building blocks of the dedup job and the training filters. Nothing here builds a Beam
pipeline (pipeline/ does), and no module imports Beam or TensorFlow when it is imported
(torch: only ``fingerprint_torch``, the torch kernel; h5py: only ``formats.hdf5*``).

- Kernels over plain arrays (numpy, xxhash, ml_dtypes): fingerprints (``fingerprint``,
  ``canonical``, ``xxh3``, ``exact``), tensors as dict keys (``keys``), the near-duplicate
  search (``near``, ``near_plan``, ``near_search``, ``near_recall``). torch is imported
  only for torch inputs or a CUDA device, FAISS only for approximate indexes and the
  job's k-means planning.
- Files: ``fs`` (local paths with ``os``; Beam's FileSystems, imported on first use, for
  gs:// and other schemes), ``formats`` (TFRecord, Parquet, HDF5 readers and writers:
  TFRecord features need TensorFlow, HDF5 needs h5py), ``store``, ``digest_segment`` and
  ``lease`` (the incremental digest store); ``periodic`` (a function called every few
  seconds while a block runs: lease renewal, the local processes' memory trimming).

The training filters (filters/) use the kernels and the TFRecord framing, so they run in
the lean install (``pip install -c constraints.txt "tensordedup[torch]"`` or ``[tf]``).
"""

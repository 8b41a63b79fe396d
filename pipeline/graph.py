"""The job's Beam graph: Read -> Fingerprint -> Exact -> (Near) -> Decide -> Write -> Report
-> Publish.

Each arrow is a module of this package; the kernels they call are plain functions
in ``transforms/``. Near-duplicate removal slots in as one more removal stream
handed to Decide. A reference set is read like the input and joins Fingerprint as
protected rows; a fingerprint store joins Exact (digest lookups) and Near (stored
values) the same way, and this run's kept records are appended to it (StoreUpdate)
once Decide knows which they are.
"""

from __future__ import annotations

import apache_beam as beam

from pipeline.decide import Decide
from pipeline.exact import SEEN, SURVIVORS, Exact
from pipeline.fingerprint import VECTORS, Fingerprint
from pipeline.near import NEAR_REPORT, Near
from pipeline.preflight import Job
from pipeline.publish import Publication, publish_run
from pipeline.read import FACTS, Read
from pipeline.report import write_report
from pipeline.store import DECISIONS, StoreUpdate, StoreVectors
from pipeline.write import Write


def build(p: beam.Pipeline, job: Job, pub: Publication) -> None:
    cfg = job.cfg
    nonfinite_invalid = cfg.near is not None and cfg.near.nonfinite == "invalid"
    read = p | "Read" >> Read(cfg.input.format, job.files, job.spec, cfg.tuning.unit_rows,
                              cfg.tuning.chunk_rows, cfg.on_invalid == "fail",
                              nonfinite_invalid)
    chunks, reference = read["chunks"], None
    if job.references is not None:
        refs = job.references
        ref_read = p | "ReadReference" >> Read(refs.format, refs.files, refs.spec,
                                               cfg.tuning.unit_rows, cfg.tuning.chunk_rows,
                                               False, nonfinite_invalid,
                                               first_index=len(job.files))
        chunks = (chunks, ref_read["chunks"]) | "WithReference" >> beam.Flatten()
        reference = beam.pvalue.AsList(ref_read[FACTS])
    streams = {FACTS: read[FACTS]}
    near_report = None
    if cfg.exact:
        keys = (chunks
                | "Fingerprint" >> Fingerprint(cfg.tuning.shards, job.keep[0],
                                               job.spill + "/values" if job.near else None,
                                               len(job.files)))
        exact = keys["keys"] | "Exact" >> Exact(job.keep[0], job.store, pub.store is not None)
        streams.update(exact=exact["removed"], seen=exact[SEEN])
        if job.near:
            vectors = keys[VECTORS]
            if job.store is not None:
                stored = p | "ReadStore" >> StoreVectors(job.store, job.keep[0])
                vectors = (vectors, stored) | "WithStored" >> beam.Flatten()
            near = vectors | "Near" >> Near(job.near, cfg.near.borderline_pairs,
                                            job.spill + "/cells")
            streams["near"] = near["removed"]
            near_report = beam.pvalue.AsSingleton(near[NEAR_REPORT])
    else:
        chunks | "DiscardChunks" >> beam.Filter(lambda _: False)
    decisions = streams | "Decide" >> Decide(job.files)
    store_parts = p | "NoStoreUpdate" >> beam.Create([])
    if pub.store is not None:
        update = {SURVIVORS: exact[SURVIVORS], DECISIONS: decisions}
        if job.near:
            update[VECTORS] = keys[VECTORS]
        store_parts = update | "StoreUpdate" >> StoreUpdate(pub.store, len(job.files))
    (decisions
     | "Write" >> Write(cfg.input.format, job.spec, job.root, job.staging(job.output),
                        len(job.files))
     | "CollectResults" >> beam.combiners.ToList()
     | "Report" >> beam.Map(write_report, job.staging(job.report), job.near, near_report,
                            job.references.files if job.references else None, reference,
                            max_invalid_fraction=cfg.max_invalid_fraction)
     | "Publish" >> beam.Map(publish_run, beam.pvalue.AsList(store_parts), pub))

"""The job's Beam graph: Read -> Fingerprint -> Exact -> (Near) -> Decide -> Write -> Report.

Each arrow is a module of this package; the kernels they call are plain functions
in ``transforms/``. Near-duplicate removal slots in as one more removal stream
handed to Decide.
"""

from __future__ import annotations

import apache_beam as beam

from pipeline.decide import Decide
from pipeline.exact import SEEN, Exact
from pipeline.fingerprint import VECTORS, Fingerprint
from pipeline.near import NEAR_REPORT, Near
from pipeline.preflight import Job
from pipeline.read import Read
from pipeline.report import write_report
from pipeline.write import Write


def build(p: beam.Pipeline, job: Job) -> None:
    cfg = job.cfg
    read = p | "Read" >> Read(cfg.input.format, job.files, job.spec, cfg.tuning.unit_rows,
                              cfg.tuning.chunk_rows, cfg.on_invalid == "fail",
                              cfg.near is not None and cfg.near.nonfinite == "invalid")
    streams = {"facts": read["facts"]}
    near_report = None
    if cfg.exact:
        keys = (read["chunks"]
                | "Fingerprint" >> Fingerprint(cfg.tuning.shards,
                                               job.keep[0] if job.near else None))
        exact = keys["keys"] | "Exact" >> Exact(job.keep[0])
        streams.update(exact=exact["removed"], seen=exact[SEEN])
        if job.near:
            near = keys[VECTORS] | "Near" >> Near(job.near, cfg.near.borderline_pairs)
            streams["near"] = near["removed"]
            near_report = beam.pvalue.AsSingleton(near[NEAR_REPORT])
    else:
        read["chunks"] | "DiscardChunks" >> beam.Filter(lambda _: False)
    (streams
     | "Decide" >> Decide(job.files)
     | "Write" >> Write(cfg.input.format, job.spec, job.root, str(job.staging(job.output)),
                        len(job.files))
     | "CollectResults" >> beam.combiners.ToList()
     | "Report" >> beam.Map(write_report, str(job.staging(job.report)), job.near, near_report))

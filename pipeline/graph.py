"""The job's Beam graph, a client of the public steps (``pipeline.steps``):
ReadTensors (+ a reference set) -> Dedup -> WriteClean -> Report -> Publish.
With ``embed:``, Dedup reads the input a second time after exact dedup and embeds the
records it kept (``EmbedKept``).

A fingerprint store joins Dedup (earlier runs' records count as references), and this
run's kept records are appended to it (StoreUpdate) once Dedup knows which they are.
"""

from __future__ import annotations

import apache_beam as beam

from pipeline.job import Job
from pipeline.publish import Publication, publish_run
from pipeline.report.parts import ReportParts
from pipeline.report.tables import TensorSource, rows_to_show, write_report
from pipeline.runners.common import (
    copies_at_once,
    recomputes_finished_steps,
    shuffle_carries_rows,
)
from pipeline.steps import (
    DECISIONS,
    FACTS,
    NEAR_REPORT,
    SURVIVORS,
    VECTORS,
    Dedup,
    ReadTensors,
    StoreUpdate,
    WriteClean,
)
from pipeline.steps.ids import RepeatedIds
from transforms.io import layout


def build(p: beam.Pipeline, job: Job, pub: Publication) -> None:
    cfg = job.cfg
    chunking = job.chunking
    nonfinite_invalid = (cfg.near is not None and cfg.near.nonfinite == "invalid"
                         and job.spec.decode is None)  # decoded values are finite
    long_texts = None if job.embed is None else job.embed.long_texts()  # embed.long
    blank = job.near.shingles if job.near is not None and job.near.is_sets else None
    read = p | "Read" >> ReadTensors(job.files, format=cfg.input.format, spec=job.spec,
                                     chunking=chunking, on_invalid=cfg.on_invalid,
                                     nonfinite_invalid=nonfinite_invalid, long_texts=long_texts,
                                     blank=blank)
    ref = refs = None
    if job.references is not None:
        refs = job.references
        ref = p | "ReadReference" >> ReadTensors(refs.files, format=refs.format, spec=refs.spec,
                                                 chunking=chunking, reference=True,
                                                 nonfinite_invalid=nonfinite_invalid,
                                                 long_texts=long_texts, blank=blank)
    embed = None
    if job.embed is not None:  # exact dedup on the raw values, then its survivors embedded
        from pipeline.steps.embed import Embed, EmbedKept  # imports torch: only when embedding

        e = job.embed
        write_to = layout.embeddings(job.staging(job.report)) if e.cfg.write else None
        embed = EmbedKept(Embed(e.handler, batch_size=e.cfg.batch_size, prepare=e.prepare,
                                write_to=write_to),
                          source=ReadTensors(job.files, format=cfg.input.format, spec=job.spec,
                                             chunking=chunking, nonfinite_invalid=nonfinite_invalid,
                                             stage="read for the model",
                                             long_texts=long_texts))
        if ref is not None:
            ref = ref | "EmbedReference" >> Embed(e.handler, batch_size=e.cfg.batch_size,
                                                  prepare=e.prepare)
    long_records = {}  # summary.json's embed section: the input's long texts, as read
    if long_texts is not None:
        from pipeline.steps.embed import LongRecords

        long_records["embed"] = beam.pvalue.AsSingleton(
            read[FACTS] | "LongRecords" >> LongRecords(long_texts))
    repeated = None
    if job.spec.id is not None:  # ids from a column may repeat (default ids cannot)
        repeated = beam.pvalue.AsSingleton(
            read["chunks"] | "RepeatedIds" >> RepeatedIds(shards=cfg.tuning.shards))
    updates = pub.store is not None
    dedup = read | "Dedup" >> Dedup(
        keep=job.keep, near=job.near, exact=cfg.exact,
        reference=None if ref is None else ref["chunks"], store=job.store, survivors=updates,
        spill=job.spill, shards=cfg.tuning.shards,
        borderline_pairs=cfg.near.borderline_pairs if cfg.near else 0,
        keep_spill=recomputes_finished_steps(cfg.runner),
        carry_rows=shuffle_carries_rows(cfg.runner.name), embed=embed, removals=job.removals)
    store_parts = p | "NoStoreUpdate" >> beam.Create([])
    if updates:
        update = {k: dedup[k] for k in (SURVIVORS, DECISIONS, VECTORS) if k in dedup}
        store_parts = update | "StoreUpdate" >> StoreUpdate(pub.store)
    near_report = (beam.pvalue.AsSingleton(dedup[NEAR_REPORT]) if NEAR_REPORT in dedup
                   else None)
    # each file's rows of the report's tables, written by the workers; what the page shows
    parts = dedup[DECISIONS] | "ReportParts" >> ReportParts(
        job.staging(job.report), total_files=len(job.files), shards=cfg.tuning.shards)
    pick = beam.pvalue.AsSingleton(parts["pick"])
    # the records the report's page shows, taken by the clean copy from its own pass
    # (input.show: another column, which the report reads back itself)
    show = None if job.show else beam.pvalue.AsSingleton(
        parts["pick"] | "RowsToShow" >> beam.Map(rows_to_show, near_report))
    (dedup[DECISIONS]
     | "Write" >> WriteClean(job.staging(job.output), format=cfg.input.format, spec=job.spec,
                             root=job.root, total_files=len(job.files),
                             files_at_once=copies_at_once(cfg.runner), show=show)
     | "CollectResults" >> beam.combiners.ToList()
     | "Report" >> beam.Map(write_report, job.staging(job.report), job.near, near_report,
                            refs.files if refs else None,
                            beam.pvalue.AsList(ref[FACTS]) if ref else None,
                            max_invalid_fraction=cfg.max_invalid_fraction,
                            inputs=TensorSource(cfg.input.format, job.show or job.spec),
                            reference=TensorSource(refs.format, refs.show or refs.spec)
                            if refs else None,
                            parts=beam.pvalue.AsList(parts["parts"]), pick=pick,
                            file_rows=cfg.tuning.report_file_rows, repeated=repeated,
                            id_column=job.spec.id)
     | "Publish" >> beam.Map(publish_run, beam.pvalue.AsList(store_parts), pub,
                               **long_records))

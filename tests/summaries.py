"""A complete ``JobSummary`` for tests of the summary's readers (report, CLI, benches)."""

from __future__ import annotations

import dataclasses
from typing import Any

from dlrover.faults.records import Failure, FailureKind
from dlrover.metrics.reliability import ReliabilityReport
from dlrover.resource.configs import Config
from dlrover.runlogs.records import JobSummary, SummaryConfig
from dlrover.runlogs.scale_record import ScaleEvent, ScaleKind

CONFIG = Config(workers=2, ps=1, worker_cpu=1.0, ps_cpu=1.0, worker_memory_mb=1536, ps_memory_mb=2048)


def a_summary(**changes: Any) -> JobSummary:
    """A succeeded job's summary: one memory resize, one memory-pressure failure."""
    grown = dataclasses.replace(CONFIG, worker_memory_mb=2304)
    s = JobSummary(
        job_id="j", status="succeeded", samples_expected=10, samples_trained=10, samples_lost=0, bad_lines_skipped=0,
        ids_expected=260, long_bags_truncated=0, ids_per_sample=26.0, auc=0.77, logloss=0.5, best_auc=0.77, eval_rows=100,
        throughput_samples_per_s=2000.0, train_time_s=30.0, wall_time_s=40.0, epochs=1,
        config=SummaryConfig(workers=2, ps=1, worker_cpu=1.0, ps_cpu=1.0, dense_ps=1, dense_ps_cpu=0.25, batch_size=512, vshards=64),
        scale_events=[ScaleEvent(ScaleKind.RESIZE, 20.0, "correct", "memory pressure", CONFIG, grown, duration_s=5.0, timings={"pause_s": 0.0})],
        failures=[Failure(FailureKind.MEMORY_PRESSURE, "j/worker-0", 20.0, 20.0, recovered_s=25.0)],
        ps_bags_updated=10, ps_ids_updated=260, policy="dlrover_rm",
        configurations=[{"summary": "2w x 1cpu + 1ps x 1cpu", "measured_throughput": 2000.0, "predicted_throughput": 2100.0}],
        final_config=grown.to_dict(), history_dir="/tmp/history",
        reliability=ReliabilityReport(ettr=0.9, productive_s=36.0, wall_s=40.0, downtime_s=4.0, replay_s=0.0, mttf_s=None, failures=1, samples_replayed=0),
        ettr=0.9,
    )  # fmt: skip
    return dataclasses.replace(s, **changes)

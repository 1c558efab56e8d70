"""Typed failure records: classification by kind, and the summary row round trip."""

from __future__ import annotations

import json

from dlrover.faults.records import CAUSE_OF_KIND, CauseClass, CheckpointRef, Failure, FailureKind


def test_every_kind_has_a_cause_class_and_only_node_loss_and_stragglers_blame_the_infrastructure():
    assert set(CAUSE_OF_KIND) == set(FailureKind)
    blamed = {k for k, c in CAUSE_OF_KIND.items() if c == CauseClass.INFRASTRUCTURE}
    assert blamed == {FailureKind.NODE_LOSS, FailureKind.STRAGGLER}


def test_a_summary_row_has_the_documented_fields_and_only_the_optional_ones_set():
    f = Failure(FailureKind.WORKER_HANG, "j/worker-0", 3.0, 9.5, cause="silent", node="n1", replacement="j/worker-2")
    row = f.to_dict()
    assert row["kind"] == "worker_hang" and row["cause_class"] == "system"
    assert {"kind", "actor", "node", "at_s", "detected_s", "cause", "cause_class", "handled_s", "recovered_s"} <= set(row)
    assert row["replacement"] == "j/worker-2" and "checkpoint" not in row and "samples_replayed" not in row


def test_a_row_written_to_json_reads_back_as_the_same_failure():
    f = Failure(FailureKind.PS_DEATH, "j/ps-1", 4.0, 4.2, handled_s=4.3, recovered_s=8.0,
                checkpoint=CheckpointRef(3, 2.5, "memory"), samples_replayed=1200, rollback_s=1.5)
    back = Failure.from_dict(json.loads(json.dumps(f.to_dict())))
    assert back == f

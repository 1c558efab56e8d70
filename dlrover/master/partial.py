"""Partial PS recovery (``recovery.ps: partial``): a lost embedding PS costs only its own
vshards' updates since the newest checkpoint, not the whole job's.

Every worker's run is aborted (the workers stay, with their processes and routing), the
dead PS are replaced, each replacement loads exactly the dead PS's vshards from the
newest checkpoint's payloads, and the surviving PS and the dense PS keep their state.
Each leased shard goes back to the queue from its holder's last progress report and the
runs start again under a new generation: a batch past that progress which some survivor
had applied is skipped there (its applied log) and applied on the replacement, which
never saw it.

What is lost: the updates of the dead PS's vshards in the lines trained between the
checkpoint's cut and the point each shard resumes from. The master counts them from the
data itself (the lines are read again and routed as the workers route them), on a
background task, into the failure's ``updates_lost``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from dlrover.data.criteo import FileIndex
from dlrover.data.layout import DataLayout
from dlrover.data.reader import FileReader
from dlrover.faults.records import CheckpointRef, Failure, LostPs
from dlrover.ps.vshard import VShardMap

from dlrover.master.job import Job
from dlrover.master.replace import replace_ps, replace_workers
from dlrover.master.rollback import halt

READ_ROWS = 65_536  # lines read at a time when counting lost updates


@dataclass(frozen=True)
class PartialRecovery:
    """Where the replaced PS went back to, and what that cost."""

    checkpoint: CheckpointRef
    recovery_s: float
    replaced: dict[str, str]  # dead PS -> its replacement (actor names)
    lost: Any  # ObjectRef of ``count_ids``: the updates lost with the dead PS

    def apply_to(self, failure: Failure) -> None:
        failure.checkpoint, failure.rollback_s, failure.samples_replayed = self.checkpoint, self.recovery_s, 0
        failure.replacement = self.replaced.get(failure.actor)


def count_ids(files: dict[str, FileIndex], ranges: list[tuple[str, int, int]], vmap: VShardMap, ps_ids: list[int], layout: DataLayout) -> int:
    """Ids of the lines ``ranges`` that the PS ``ps_ids`` own under ``vmap`` (bad lines
    trained nothing: skipped)."""
    reader, total = FileReader(on_bad_line="skip", cache_files=0, layout=layout), 0
    feature_tables = np.asarray(layout.schema.feature_tables())
    for path, start, stop in ranges:
        for a in range(start, stop, READ_ROWS):
            batch, _ = reader.read(files[path], a, min(stop, a + READ_ROWS))
            total += vmap.ids_on(batch.jagged()[0], feature_tables[batch.features_of_ids()], ps_ids)
    return total


def recover_partially(m: Job, lost_ps: LostPs) -> PartialRecovery | None:
    """Replace the embedding PS ``lost_ps.ps`` from the newest checkpoint (see module
    doc). None, with every run stopped, when the dense PS turns out to be gone too: then
    only a rollback will do."""
    lz = m.launcher
    t0 = m.clock() - m.t0
    gone, lost_ps = halt(m, lost_ps)
    if lost_ps.dense:
        return None
    for name in gone:
        m.books.retire(name)
    replace_workers(m, set(gone))
    m.books.requeue_all()
    ckpt, payloads, source = m.checkpointer.payloads()
    if source != "memory" and m.checkpointer.chain is not None:
        m.checkpointer.chain.broken()  # the replacements hold an older state than the newest cut
    at_death = lz.vmap
    owner, replaced = replace_ps(m, lost_ps.ps)
    lz.wait_started()
    refs = None if payloads is None else [p if m.cluster.is_ref(p) else m.cluster.put(p) for p in payloads]
    vmap = at_death.with_owner(owner)
    # The replacements rebuild their vshards; the survivors keep theirs (same slots: only
    # the map's version moves, and pulls of the aborted runs are dropped).
    new = set(replaced.values())
    m.cluster.get([h.restore.remote(vmap, refs) if k in new else h.reconfigure.remote(vmap, []) for k, h in lz.ps.items()])
    ranges = m.books.queue.lines_since(type(m.books.queue).from_state_dict(ckpt.queue))
    lost = m.cluster.task(count_ids, lz.files, ranges, at_death, list(lost_ps.ps), m.spec.layout())
    lz.switch_map(vmap, dense=True)
    m.runs.add({lz.start(name): name for name in lz.workers})
    if m.control is not None:
        m.control.after_rollback()
    names = {lz.ps_name(k): lz.ps_name(v) for k, v in replaced.items()}
    back = PartialRecovery(CheckpointRef(ckpt.seq, round(ckpt.at_s, 3), source), round((m.clock() - m.t0) - t0, 3), names, lost)
    m.events.add("partial_recovery", checkpoint=asdict(back.checkpoint), recovery_s=back.recovery_s, generation=m.books.generation,
                 replaced=names, lines_lost=sum(b - a for _, a, b in ranges),
                 bags_at_checkpoint={lz.ps_name(k): ckpt.extra.get("ps_bags", {}).get(str(k)) for k in lost_ps.ps},
                 ids_at_checkpoint={lz.ps_name(k): ckpt.extra.get("ps_ids", {}).get(str(k)) for k in lost_ps.ps})
    return back

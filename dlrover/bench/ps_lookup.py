"""``dlrover bench ps-lookup``: the CPU that a batch's embedding lookups cost the PS, and
routing them costs the worker, as the tables are spread over more PS.

In one process, without Ray, so only the work itself is timed (``time.thread_time``, one
thread): the throughput bench's batches (2048 rows, 26 tables, the bench data) are routed
by ``PSClient.route`` and each PS's share is pulled and pushed on real ``EmbeddingPS``
objects. Ideally the PS work of a batch does not grow with the PS count (each PS
does its share of the ids); what it grows by is each PS's fixed cost per call, and
what any padding of the requests would add. ``bags`` counts the bags the PS updated,
against the batch's ``rows x tables``.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from dlrover.bench.progress import bench_data

PS_COUNTS = [1, 2, 4, 8]
BATCHES, QUICK_BATCHES = 30, 3
ROUNDS = 2  # the first warms the tables' pages and caches; the last is reported


def run_ps_lookup_bench(ps_counts: list[int] | None = None, quick: bool = False, batch_size: int = 2048) -> dict:
    """Per PS count: CPU ms a batch of all PS together, of the busiest PS, of routing."""
    import torch

    from dlrover.bench.scaling import scaling_spec
    from dlrover.data.criteo import expand_paths, index_file
    from dlrover.data.reader import FileReader
    from dlrover.model.dlrm import PSClient, make_kjt
    from dlrover.ps.embedding_ps import EmbeddingPS
    from dlrover.ps.vshard import VShardMap
    from dlrover.driver.runner import ensure_data

    torch.set_num_threads(1)
    ps_counts = ps_counts or PS_COUNTS
    n = QUICK_BATCHES if quick else BATCHES
    rows = 2 * n * batch_size  # two files: the first holds the n batches
    spec = scaling_spec(bench_data(f"criteo-{rows}"), rows, 1, 1, batch_size)
    ensure_data(spec)
    reader, index = FileReader(), index_file(expand_paths(spec.data.paths)[0])
    kjts = [make_kjt(reader.read(index, a, a + batch_size)[0].sparse) for a in range(0, index.rows - batch_size + 1, batch_size)]
    m, optimizer = spec.model, spec.optimizer.sparse.model_dump()
    out = []
    for p in ps_counts:
        print(f"[bench] {p} PS: {len(kjts)} batches of {batch_size}, {ROUNDS} rounds", file=sys.stderr)
        vmap = VShardMap.round_robin(spec.schema.table_sizes(), spec.train.vshards_for(p), p)
        servers = {k: EmbeddingPS(k, vmap, m.embedding_dim, optimizer, spec.seed) for k in vmap.ps_ids}
        client = PSClient(dict(servers), vmap, m.embedding_dim, "bench", get=None)
        for _ in range(ROUNDS):
            ps_s, route_s, bags = dict.fromkeys(servers, 0.0), 0.0, 0
            for i, kjt in enumerate(kjts):
                t0 = time.thread_time()
                routed = client.route(kjt)
                route_s += time.thread_time() - t0
                for r in routed.requests:
                    t0 = time.thread_time()
                    answer = servers[r.ps].pull(("bench", i), r.indices, r.offsets, True, None, r.bags)
                    bags += servers[r.ps].push(("bench", i), np.full(answer.shape, 1e-3, dtype=np.float32))
                    ps_s[r.ps] += time.thread_time() - t0
        per = 1e3 / len(kjts)
        out.append({
            "ps": p, "ps_cpu_ms": sum(ps_s.values()) * per, "busiest_ps_cpu_ms": max(ps_s.values()) * per,
            "route_ms": route_s * per, "bags_per_batch": bags / len(kjts), "rows_x_tables": batch_size * len(spec.schema.tables),
        })  # fmt: skip
    base = out[0]["ps_cpu_ms"] if out and out[0]["ps"] == 1 else None
    for r in out:
        r["ps_cpu_vs_1ps"] = r["ps_cpu_ms"] / base if base else None
    return {"batch_size": batch_size, "batches": len(kjts), "quick": quick, "rows": out}


def print_ps_lookup(r: dict) -> None:
    print(f"{r['batches']} batches of {r['batch_size']}, one thread, CPU ms per batch (thread_time)")
    head = ["PS", "all PS", "vs 1 PS", "busiest PS", "routing", "bags updated"]
    print("".join(f"{h:>15s}" for h in head))
    for x in r["rows"]:
        ratio = f"{x['ps_cpu_vs_1ps']:.2f}x" if x["ps_cpu_vs_1ps"] is not None else "n/a"
        bags = f"{x['bags_per_batch']:,.0f}/{x['rows_x_tables']:,}"
        print("".join(f"{c:>15s}" for c in (str(x["ps"]), f"{x['ps_cpu_ms']:.2f}", ratio, f"{x['busiest_ps_cpu_ms']:.2f}", f"{x['route_ms']:.2f}", bags)))

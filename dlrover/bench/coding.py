"""``dlrover bench coding``: gradient-coding schemes on the real DLRM's gradients, timed by
the straggler model (issue 17, item 4: ignore-stragglers vs exact vs approximate coding on
time to target AUC).

Live, ``train.dense_sync: coded`` is the ignore-stragglers scheme only: a redundant
assignment needs every batch read by several workers, which the shard queue does not do
(docs/FAULTS.md). This bench answers whether building it would pay, with real training
and a simulated clock. One process trains the dense-sync bench's DLRM (TorchRec,
``FusedEmbeddingBagCollection``) in rounds: round ``r`` takes the next ``workers``
batches as the data partitions, computes each partition's dense gradient at the round's
parameters (each partition's embedding rows are updated once, in its backward, as the
live embedding PS does in every mode), and applies the dense gradient the scheme's
decoder gets from the workers that arrived (:mod:`dlrover.sim.coding`), divided by the
number of partitions. Who arrives, and when the round ends, follow the workers' speeds:
``worker:0`` ``slow_factor`` times slower throughout (the live bench's fault), and the
two-class slow/active Markov model. A round's time is its stop time in units of one
partition's compute, converted to seconds with the median partition time measured here;
communication is not modelled.

``sync``'s parameters do not depend on who is slow (it waits for everyone), so it is
trained once and timed under each straggler path and under none (fault-free); every other
scheme is trained under each. Target AUC: sync's last periodic AUC less ``AUC_SLACK``.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch

from dlrover.errors import DLRoverError
from dlrover.sim.coding import Assignment, Scheme, assignment, check_sizes, decode, stop_times
from dlrover.sim.coding_sim import StragglerModel, slow_states
from dlrover.spec import JobSpec

BATCH_SIZE = 1024  # rows per partition, as the live bench's batch
EVAL_EVERY_ROUNDS = 8
EVAL_BATCHES = 16  # the periodic evaluation's fixed slice of held-out rows, in batches
AUC_SLACK = 0.005


@dataclass(frozen=True)
class Data:
    """Everything one training needs, read once: training batches in file order, the
    periodic evaluation's slice and what the final evaluation reads."""

    spec: JobSpec
    train: list
    eval_slice: list
    sizes: np.ndarray


@dataclass
class Trained:
    """One training: AUC at the end of each evaluated round, the rounds' arrival patterns
    (rounds x workers) and per-round gradient error against the mean of every partition."""

    eval_rounds: list[int]
    eval_auc: list[float]
    auc: float
    grad_error: np.ndarray
    exact: np.ndarray
    partition_s: list[float]


@dataclass(frozen=True)
class Row:
    """One scheme under one straggler path; times in seconds of this host's compute."""

    scheme: str
    stragglers: str
    load: float
    round_s: float
    train_s: float
    auc: float
    target_reached_s: float | None
    dropped: float  # partitions per round whose gradient was not in the decoded sum
    grad_error_mean: float  # ||decoded - mean of all partitions|| / ||mean||
    exact_fraction: float
    curve: list[tuple[float, float]]


def load_data(rows: int, workers: int) -> Data:
    """The live dense-sync bench's job (data generated once, cached), read into memory."""
    from dlrover.bench.dense_sync import dense_sync_spec
    from dlrover.data.plan import DataPlan
    from dlrover.data.reader import FileReader
    from dlrover.runner import ensure_data

    cache = os.environ.get("DLROVER_BENCH_DATA", os.path.join(tempfile.gettempdir(), "dlrover-bench-data"))
    spec = dense_sync_spec(os.path.join(cache, f"criteo-{rows}"), rows, workers, "sync", 1.0)
    ensure_data(spec)
    plan, reader = DataPlan.build(spec), FileReader()
    b = spec.data.batch_size
    train = [reader.read(plan.files[p], a, min(a + b, n))[0] for p, n in plan.train_rows.items() for a in range(0, n, b)]
    held = [(p, a, min(a + b, z)) for p, lo, z in plan.eval_ranges(spec.data.shard_rows) for a in range(lo, z, b)]
    eval_slice = [reader.read(plan.files[p], a, z)[0] for p, a, z in held[:EVAL_BATCHES]]
    if len(train) < workers:
        raise DLRoverError(f"--rows {rows}: {len(train)} training batches of {b}, fewer than --workers {workers}")
    return Data(spec, train, eval_slice, np.array(spec.model.table_sizes(), dtype=np.int64))


def _scores(model: torch.nn.Module, batches: list, sizes: np.ndarray) -> float:
    from dlrover.baseline import hashed
    from dlrover.metrics.evaluation import evaluate_scores
    from dlrover.model.dlrm import make_kjt

    model.eval()
    with torch.no_grad():
        probs = [torch.sigmoid(model(torch.from_numpy(b.dense), make_kjt(hashed(b, sizes))).squeeze(-1)).numpy() for b in batches]
    model.train()
    return float(evaluate_scores(np.concatenate([b.labels for b in batches]), np.concatenate(probs))["auc"])


def train(data: Data, a: Assignment, arrived: np.ndarray) -> Trained:
    """Train one epoch in rounds of ``a.workers`` partitions; round ``r`` decodes the
    workers ``arrived[r]`` (bool, rounds x workers)."""
    from dlrover.baseline import build_local_model, evaluate_local, hashed
    from dlrover.data.plan import DataPlan
    from dlrover.data.reader import FileReader
    from dlrover.model.dlrm import dense_parameters, make_kjt

    n = a.workers
    model, opt = build_local_model(data.spec)
    params = dense_parameters(model)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    grads = torch.empty(n, sum(p.numel() for p in params))
    decoded: dict[bytes, tuple[torch.Tensor, bool]] = {}  # arrival pattern -> (partition coefficients / n, exact)
    out = Trained([], [], 0.0, np.zeros(len(arrived)), np.zeros(len(arrived), dtype=bool), [])
    for r, pattern in enumerate(arrived):
        for j, batch in enumerate(data.train[r * n : (r + 1) * n]):
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)  # the embedding rows' optimizer runs inside backward
            loss_fn(model(torch.from_numpy(batch.dense), make_kjt(hashed(batch, data.sizes))).squeeze(-1), torch.from_numpy(batch.labels)).backward()
            torch.cat([p.grad.reshape(-1) for p in params], out=grads[j])
            out.partition_s.append(time.perf_counter() - t0)
        key = pattern.tobytes()
        if key not in decoded:
            d = decode(a, pattern)
            decoded[key] = (torch.as_tensor(d.coefficients / n, dtype=torch.float32), d.exact)
        coef, out.exact[r] = decoded[key]
        g, full = coef @ grads, grads.mean(dim=0)
        out.grad_error[r] = float(torch.linalg.vector_norm(g - full) / torch.linalg.vector_norm(full))
        for p, part in zip(params, g.split([p.numel() for p in params])):
            p.grad.copy_(part.view_as(p))
        opt.step()
        if (r + 1) % EVAL_EVERY_ROUNDS == 0 or r + 1 == len(arrived):
            out.eval_rounds.append(r)
            out.eval_auc.append(_scores(model, data.eval_slice, data.sizes))
    out.auc = float(evaluate_local(model, DataPlan.build(data.spec), FileReader(), data.spec)["auc"])
    return out


def straggler_paths(workers: int, rounds: int, slow_factor: float, rate: float, seed: int) -> dict[str, np.ndarray]:
    """Workers' speeds per round (rounds x workers) of each straggler path: ``worker:0``
    slow throughout, and the two-class Markov model at straggler rate ``rate``."""
    persistent = np.ones((rounds, workers))
    persistent[:, 0] = 1.0 / slow_factor
    model = StragglerModel(p_slow=rate, slow_factor=1.0 / slow_factor)
    markov = np.where(slow_states(model, workers, rounds, np.random.default_rng(seed)), model.slow_factor, 1.0)
    return {f"worker:0 {slow_factor:g}x slow": persistent, f"markov p_slow={rate:g} ({100 * model.slow_fraction:.0f}% slow)": markov}


def _timing(a: Assignment, speeds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(stop time per round in partition units, who arrived by then: rounds x workers)."""
    finish = a.load / speeds
    stop = stop_times(a, finish)
    return stop, finish <= stop[:, None]


def _row(scheme: str, path: str, a: Assignment, t: Trained, stop: np.ndarray, arrived: np.ndarray, unit_s: float, target: float) -> Row:
    clock = np.cumsum(stop) * unit_s
    curve = [(float(clock[r]), auc) for r, auc in zip(t.eval_rounds, t.eval_auc)]
    reached = next((s for s, auc in curve if auc >= target), None)
    dropped = float(np.mean(np.count_nonzero(arrived.astype(float) @ a.B == 0, axis=1)))  # partitions no arrived worker holds
    return Row(scheme, path, float(a.load.mean()), float(stop.mean() * unit_s), float(clock[-1]), t.auc, reached, dropped,
               float(t.grad_error.mean()), float(t.exact.mean()), curve)  # fmt: skip


def run_coding_bench(rows: int = 960_000, workers: int = 4, stragglers: int = 1, d: int | None = None,
                     slow_factor: float = 4.0, rate: float = 0.05, seed: int = 0) -> dict:  # fmt: skip
    """Every scheme under every straggler path (see the module docstring)."""
    check_sizes(workers, stragglers)
    assignment(Scheme.CYCLIC, workers, stragglers, d)  # a bad d fails before any work
    data = load_data(rows, workers)
    rounds = len(data.train) // workers
    paths = {"fault-free": np.ones((rounds, workers)), **straggler_paths(workers, rounds, slow_factor, rate, seed)}
    trained: list[tuple[str, str, Assignment, Trained, np.ndarray, np.ndarray]] = []
    sync = assignment(Scheme.SYNC, workers, stragglers)
    print(f"[bench] coding: sync ({rounds} rounds of {workers} x {BATCH_SIZE} rows)", file=sys.stderr, flush=True)
    t_sync = train(data, sync, np.ones((rounds, workers), dtype=bool))
    for path, speeds in paths.items():
        trained.append(("sync", path, sync, t_sync, *_timing(sync, speeds)))
    for path, speeds in paths.items():
        for scheme in (Scheme.IGNORE, Scheme.FRC, Scheme.CYCLIC):
            a = assignment(scheme, workers, stragglers, d)
            stop, arrived = _timing(a, speeds)
            print(f"[bench] coding: {scheme.value}, {path}", file=sys.stderr, flush=True)
            trained.append((scheme.value, path, a, train(data, a, arrived), stop, arrived))
    unit_s = float(np.median([s for _, _, _, t, _, _ in trained for s in t.partition_s]))
    target = t_sync.eval_auc[-1] - AUC_SLACK
    out = [_row(s, p, a, t, stop, arr, unit_s, target) for s, p, a, t, stop, arr in trained]
    return {"rows": rows, "workers": workers, "stragglers": stragglers, "d": d or stragglers + 1, "slow_factor": slow_factor,
            "rate": rate, "partition_s": unit_s, "target_auc": target, "runs": [asdict(r) for r in out]}  # fmt: skip


def print_coding(r: dict) -> None:
    print(f"coding: {r['workers']} workers = partitions of {BATCH_SIZE} rows, {r['stragglers']} straggler(s) tolerated, cyclic d={r['d']},"
          f" {r['rows']:,} rows; one partition = {1000 * r['partition_s']:.1f} ms of this host's compute")  # fmt: skip
    print(f"target AUC {r['target_auc']:.4f} (sync's last periodic AUC - {AUC_SLACK}); times on the straggler model's clock")
    head = f"  {'stragglers':<30} {'scheme':<7} {'load':>4} {'s/round':>8} {'train s':>8} {'AUC':>7} {'to target':>9} {'dropped':>7} {'grad err':>8} {'exact':>5}"
    print(head)
    for x in r["runs"]:
        reach = f"{x['target_reached_s']:.1f}" if x["target_reached_s"] is not None else "never"
        print(f"  {x['stragglers']:<30} {x['scheme']:<7} {x['load']:>4.1f} {x['round_s']:>8.3f} {x['train_s']:>8.1f} {x['auc']:>7.4f}"
              f" {reach:>9} {x['dropped']:>7.2f} {x['grad_error_mean']:>8.4f} {x['exact_fraction']:>5.2f}")  # fmt: skip

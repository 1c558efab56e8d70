"""``dlrover bench coding``: gradient-coding schemes on the real DLRM's gradients, timed by
the straggler model (issue 17, item 4: ignore-stragglers vs exact vs approximate coding on
time to target AUC).

Live, ``train.dense_sync: coded`` is the ignore-stragglers scheme only: a redundant
assignment needs every batch read by several workers, which the shard queue does not do
(docs/FAULTS.md). This bench asks whether building it would pay, with real training and a
simulated clock. One process trains the dense-sync bench's DLRM (TorchRec,
``FusedEmbeddingBagCollection``) in rounds: round ``r`` takes the next ``workers``
batches as the data partitions and computes each partition's dense gradient at the
round's dense parameters (embedding rows change within the round: each partition's
backward updates its rows, as the live embedding PS does in every mode). The dense
optimizer then applies what the scheme's decoder (:mod:`dlrover.sim.coding`) gets from
the workers that arrived, divided by the number of partitions. A partition that no
arrived worker holds was never finished: it updates neither the dense parameters nor its
embedding rows (its embedding output is detached). Who arrives, and when the round
ends, follow the workers' speeds: ``worker:0`` ``slow_factor`` times slower throughout
(the live bench's fault), and the two-class slow/active Markov model. A round lasts its
stop time in units of one partition's compute, converted to seconds with the median
partition time measured here; communication is not modelled. Rounds cover the training
rows once; the last ``len % workers`` batches are left out.

Schemes whose rounds decode to the same coefficients train the same model, so each
distinct coefficient sequence is trained once (``sync``, every exact code and fault-free
``ignore`` share one) and timed under each path. Target AUC: the fault-free ``sync``
run's last periodic AUC less ``AUC_SLACK``.
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch

from dlrover.bench.dense_sync import AUC_SLACK, first_reach
from dlrover.bench.progress import bench_data
from dlrover.data.plan import DataPlan
from dlrover.data.reader import FileReader
from dlrover.data.schema import Schema
from dlrover.errors import DLRoverError
from dlrover.sim.coding import EXACT_TOL, Assignment, Scheme, arrivals, assignment, decode
from dlrover.sim.coding_sim import StragglerModel, straggler_speeds
from dlrover.spec import JobSpec

EVAL_EVERY_ROUNDS = 8
EVAL_BATCHES = 16  # the periodic evaluation's fixed slice (as many rows as the live bench's 4 ranges)


@dataclass(frozen=True)
class Data:
    """What a training needs, read once: training batches in file order and the periodic
    evaluation's slice; the plan and reader for the final evaluation."""

    spec: JobSpec
    plan: DataPlan
    reader: FileReader
    train: list
    eval_slice: list
    eval_labels: np.ndarray  # the slice's labels, in order
    schema: Schema


@dataclass
class Trained:
    """One training: the AUC after each evaluated round, the final AUC on every held-out
    row, per round the decoded gradient's error against the mean of every partition's
    and whether the decoding was exact, and each partition's compute time."""

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
    dropped: float  # partitions per round that no arrived worker held
    grad_error_mean: float  # ||decoded - mean of all partitions|| / ||mean||
    exact_fraction: float
    curve: list[tuple[float, float]]


def load_data(rows: int, workers: int) -> Data:
    """The live dense-sync bench's job (its data generated once, kept), read into memory."""
    from dlrover.bench.dense_sync import dense_sync_spec
    from dlrover.driver.runner import ensure_data

    spec = dense_sync_spec(bench_data(f"criteo-{rows}"), rows, workers, "sync", 1.0)
    ensure_data(spec)
    plan, reader = DataPlan.build(spec), FileReader(on_bad_line=spec.data.on_bad_line)
    b = spec.data.batch_size
    train = [reader.read(plan.files[p], a, min(a + b, n))[0] for p, n in plan.train_rows.items() for a in range(0, n, b)]
    held = [(p, a, min(a + b, z)) for p, lo, z in plan.eval_ranges(spec.data.shard_rows) for a in range(lo, z, b)]
    eval_slice = [reader.read(plan.files[p], a, z)[0] for p, a, z in held[:EVAL_BATCHES]]
    if len(train) < workers:
        raise DLRoverError(f"--rows {rows}: {len(train)} training batches of {b}, fewer than --workers {workers}")
    labels = np.concatenate([b.labels for b in eval_slice])
    return Data(spec, plan, reader, train, eval_slice, labels, spec.schema)


def _detached(module: torch.nn.Module, inputs: tuple, out):
    """A forward hook: the pooled embeddings (a ``KeyedTensor``) without their backward, so
    no row update."""
    from torchrec.sparse.jagged_tensor import KeyedTensor  # not at import: a bad argument fails fast

    return KeyedTensor(keys=out.keys(), length_per_key=out.length_per_key(), values=out.values().detach(), key_dim=out.key_dim())


def train(data: Data, coefficients: np.ndarray, computed: np.ndarray) -> Trained:
    """Train in rounds of ``coefficients.shape[1]`` partitions: round ``r`` applies
    ``coefficients[r] @ partition gradients / n``; partitions not ``computed[r]`` update
    no embedding rows."""
    from dlrover.bench.baseline import batch_loss, build_local_model, evaluate_local, predict
    from dlrover.metrics.auc import evaluate_scores
    from dlrover.model.dlrm import dense_parameters

    rounds, n = coefficients.shape
    model, opt = build_local_model(data.spec)
    params = dense_parameters(model)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    grads = torch.empty(n, sum(p.numel() for p in params))
    weights = torch.as_tensor(coefficients / n, dtype=torch.float32)
    out = Trained([], [], 0.0, np.zeros(rounds), np.sum((coefficients - 1.0) ** 2, axis=1) / n <= EXACT_TOL, [])  # as Decoded.exact
    for r in range(rounds):
        for j, batch in enumerate(data.train[r * n : (r + 1) * n]):
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            hook = None if computed[r, j] else model.sparse_arch.embedding_bag_collection.register_forward_hook(_detached)
            batch_loss(model, loss_fn, batch, data.schema).backward()
            if hook is not None:
                hook.remove()
            torch.cat([p.grad.reshape(-1) for p in params], out=grads[j])
            out.partition_s.append(time.perf_counter() - t0)
        g, full = weights[r] @ grads, grads.mean(dim=0)
        out.grad_error[r] = float(torch.linalg.vector_norm(g - full) / torch.linalg.vector_norm(full))
        for p, part in zip(params, g.split([p.numel() for p in params])):
            p.grad.copy_(part.view_as(p))
        opt.step()
        if (r + 1) % EVAL_EVERY_ROUNDS == 0 or r + 1 == rounds:
            model.eval()
            with torch.no_grad():
                probs = np.concatenate([predict(model, b, data.schema) for b in data.eval_slice])
            model.train()
            out.eval_rounds.append(r)
            out.eval_auc.append(float(evaluate_scores(data.eval_labels, probs)["auc"]))
    out.auc = float(evaluate_local(model, data.plan, data.reader, data.spec)["auc"])
    return out


def straggler_paths(workers: int, rounds: int, slow_factor: float, rate: float, seed: int) -> dict[str, np.ndarray]:
    """Workers' speeds per round (rounds x workers) of each path: none slow, ``worker:0``
    slow throughout, and the two-class Markov model at straggler rate ``rate``."""
    persistent = np.ones((rounds, workers))
    persistent[:, 0] = 1.0 / slow_factor
    model = StragglerModel(p_slow=rate, slow_factor=1.0 / slow_factor)
    markov = straggler_speeds(model, workers, rounds, np.random.default_rng(seed))
    return {
        "fault-free": np.ones((rounds, workers)), f"worker:0 {slow_factor:g}x slow": persistent,
        f"markov p_slow={rate:g} ({100 * model.slow_fraction:.0f}% slow)": markov,
    }  # fmt: skip


def decoding(a: Assignment, arrived: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per round: each partition's decoded coefficient, and whether an arrived worker
    held it (both rounds x partitions)."""
    patterns, which = np.unique(arrived, axis=0, return_inverse=True)
    coefficients = np.array([decode(a, p).coefficients for p in patterns])[which.ravel()]
    return coefficients, arrived.astype(float) @ a.B > 0


def run_coding_bench(rows: int = 960_000, workers: int = 4, stragglers: int = 1, d: int | None = None,
                     slow_factor: float = 4.0, rate: float = 0.05, seed: int = 0) -> dict:  # fmt: skip
    """Every scheme under every straggler path (see the module docstring)."""
    schemes = {s: assignment(s, workers, stragglers, d) for s in (Scheme.SYNC, Scheme.IGNORE, Scheme.FRC, Scheme.CYCLIC)}  # bad sizes fail first
    data = load_data(rows, workers)
    rounds = len(data.train) // workers
    trained: dict[bytes, Trained] = {}  # coefficient sequence -> its training
    rows_out = []
    for path, speeds in straggler_paths(workers, rounds, slow_factor, rate, seed).items():
        for scheme, a in schemes.items():
            stop, arrived = arrivals(a, speeds)
            coefficients, computed = decoding(a, arrived)
            key = np.concatenate([np.round(coefficients, 12), computed]).tobytes()
            if key not in trained:
                print(f"[bench] coding: {scheme.value}, {path} ({rounds} rounds of {workers} partitions)", file=sys.stderr, flush=True)
                trained[key] = train(data, coefficients, computed)
            rows_out.append((scheme.value, path, a, trained[key], stop, computed))
    unit_s = float(np.median([s for t in trained.values() for s in t.partition_s]))
    ref = next(t for s, p, _, t, _, _ in rows_out if s == "sync" and p == "fault-free")
    target = ref.eval_auc[-1] - AUC_SLACK
    out = []
    for scheme, path, a, t, stop, computed in rows_out:
        clock = np.cumsum(stop) * unit_s
        curve = [(float(clock[r]), auc) for r, auc in zip(t.eval_rounds, t.eval_auc)]
        out.append(Row(scheme, path, float(a.load.mean()), float(stop.mean() * unit_s), float(clock[-1]), t.auc, first_reach(curve, target),
                       float(np.mean(np.count_nonzero(~computed, axis=1))), float(t.grad_error.mean()), float(t.exact.mean()), curve))  # fmt: skip
    return {"rows": rows, "workers": workers, "stragglers": stragglers, "d": d or stragglers + 1, "slow_factor": slow_factor, "rate": rate,
            "batch_size": data.spec.data.batch_size, "trainings": len(trained), "partition_s": unit_s, "target_auc": target,
            "runs": [asdict(r) for r in out]}  # fmt: skip


def print_coding(r: dict) -> None:
    print(f"coding: {r['workers']} workers = partitions of {r['batch_size']} rows, {r['stragglers']} straggler(s) tolerated, cyclic d={r['d']},"
          f" {r['rows']:,} rows, {r['trainings']} distinct trainings; one partition = {1000 * r['partition_s']:.1f} ms of this host's compute")  # fmt: skip
    print(f"target AUC {r['target_auc']:.4f} (fault-free sync's last periodic AUC - {AUC_SLACK}); times on the straggler model's clock")
    print(f"  {'stragglers':<30} {'scheme':<7} {'load':>4} {'s/round':>8} {'train s':>8} {'AUC':>7} {'to target':>9} {'dropped':>7} {'grad err':>8} {'exact':>5}")
    for x in r["runs"]:
        reach = f"{x['target_reached_s']:.1f}" if x["target_reached_s"] is not None else "never"
        print(f"  {x['stragglers']:<30} {x['scheme']:<7} {x['load']:>4.1f} {x['round_s']:>8.3f} {x['train_s']:>8.1f} {x['auc']:>7.4f}"
              f" {reach:>9} {x['dropped']:>7.2f} {x['grad_error_mean']:>8.4f} {x['exact_fraction']:>5.2f}")  # fmt: skip

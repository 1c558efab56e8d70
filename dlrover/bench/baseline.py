"""Single-process TorchRec training: the baseline dlrover is measured against.

Same model (``torchrec.models.dlrm.DLRM``), same data reader, same hyperparameters, but
embeddings in a local ``FusedEmbeddingBagCollection`` (fbgemm TBE with the optimizer fused
into backward) and no Ray. Used by ``dlrover bench throughput`` and by the accuracy test.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
import torchrec.optim as trec_optim
from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection

from dlrover.data.batch import Batch
from dlrover.data.reader import FileReader
from dlrover.data.plan import DataPlan
from dlrover.metrics.auc import evaluate_scores
from dlrover.model.dlrm import build_dense_dlrm, dense_parameters, make_kjt, table_configs
from dlrover.ps.dense_ps import make_dense_optimizer
from dlrover.ps.tables import init_rows
from dlrover.data.schema import Schema
from dlrover.spec import JobSpec

_SPARSE_OPT = {
    "rowwise_adagrad": trec_optim.RowWiseAdagrad,
    "adagrad": torch.optim.Adagrad,
    "sgd": torch.optim.SGD,
}


def build_local_model(spec: JobSpec):
    """DLRM over a FusedEmbeddingBagCollection, plus the dense optimizer; every weight
    starts where dlrover's starts (dense init by seed, embedding rows as the PS makes them)."""
    sparse = spec.optimizer.sparse
    kwargs = {"lr": sparse.lr} if sparse.name == "sgd" else {"lr": sparse.lr, "eps": sparse.eps}
    torch.manual_seed(spec.seed)
    configs = table_configs(spec.model, spec.schema)
    ebc = FusedEmbeddingBagCollection(tables=configs, optimizer_type=_SPARSE_OPT[sparse.name], optimizer_kwargs=kwargs)
    model = build_dense_dlrm(spec.model, ebc, spec.seed, spec.schema)
    weights = ebc.state_dict()
    with torch.no_grad():  # the PS's initial rows, so that both sides start from one model
        for t, cfg in enumerate(configs):
            w = weights[f"embedding_bags.{cfg.name}.weight"]
            w.copy_(init_rows(spec.seed, t, w.shape[0], w.shape[1], np.arange(w.shape[0])))
    opt = make_dense_optimizer(dense_parameters(model), spec.optimizer.dense.model_dump())
    return model, opt


def hashed(batch: Batch, schema: Schema) -> Batch:
    """The batch with each id replaced by its row (id % rows of the feature's table), as
    the PS hashes a hashed table's ids."""
    sizes = np.asarray(schema.table_sizes(), dtype=np.int64)[schema.feature_tables()]
    if batch.lengths is None:
        return Batch(batch.labels, batch.dense, batch.sparse % sizes)
    return Batch(batch.labels, batch.dense, batch.sparse % np.repeat(sizes, batch.lengths.sum(axis=1)), batch.lengths)


def local_kjt(batch: Batch, schema: Schema):
    """The KJT a local TorchRec model of the schema takes for ``batch``."""
    return make_kjt(hashed(batch, schema), schema.feature_names)


@dataclass
class LocalResult:
    samples: int
    train_time_s: float
    metrics: dict

    @property
    def samples_per_s(self) -> float:
        return self.samples / max(self.train_time_s, 1e-9)


def batch_loss(model, loss_fn, batch: Batch, schema: Schema) -> torch.Tensor:
    """The model's loss on ``batch`` (its backward also updates the fused embedding rows)."""
    return loss_fn(model(torch.from_numpy(batch.dense), local_kjt(batch, schema)).squeeze(-1), torch.from_numpy(batch.labels))


def predict(model, batch: Batch, schema: Schema) -> np.ndarray:
    """Click probabilities of ``batch`` (call under ``torch.no_grad()``, in eval mode)."""
    return torch.sigmoid(model(torch.from_numpy(batch.dense), local_kjt(batch, schema)).squeeze(-1)).numpy()


def train_step(model, opt, loss_fn, batch: Batch, schema: Schema) -> float:
    opt.zero_grad(set_to_none=True)
    loss = batch_loss(model, loss_fn, batch, schema)
    loss.backward()
    opt.step()
    return float(loss.detach())


def train_local(spec: JobSpec, threads: int | None = None) -> LocalResult:
    """Train ``spec`` in this process (every epoch over every file's training rows)."""
    if threads:
        torch.set_num_threads(threads)
    plan = DataPlan.build(spec)
    reader = FileReader(on_bad_line=spec.data.on_bad_line, layout=spec.layout())
    sizes = spec.schema
    model, opt = build_local_model(spec)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    b = spec.data.batch_size
    samples, t0 = 0, time.perf_counter()
    for _ in range(spec.data.epochs):
        for path, idx in plan.files.items():
            for a in range(0, plan.train_rows[path], b):
                batch, _ = reader.read(idx, a, min(plan.train_rows[path], a + b))
                train_step(model, opt, loss_fn, batch, sizes)
                samples += len(batch)
    train_s = time.perf_counter() - t0
    metrics = evaluate_local(model, plan, reader, spec)
    return LocalResult(samples, train_s, metrics)


def evaluate_local(model, plan: DataPlan, reader: FileReader, spec: JobSpec) -> dict:
    """AUC and log loss of a locally trained model on the plan's held-out rows ({} if none)."""
    sizes = spec.schema
    b = spec.data.batch_size
    model.eval()
    labels, probs = [], []
    with torch.no_grad():
        for path, a, z in plan.eval_ranges(spec.data.shard_rows):
            for s in range(a, z, b):
                batch, _ = reader.read(plan.files[path], s, min(z, s + b))
                probs.append(predict(model, batch, sizes))
                labels.append(batch.labels)
    model.train()
    return evaluate_scores(np.concatenate(labels), np.concatenate(probs)) if labels else {}

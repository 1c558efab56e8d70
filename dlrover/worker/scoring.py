"""Scoring held-out rows on a worker (periodic and final evaluation), beside training."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import ray
import torch

from dlrover.data.batch import Batch
from dlrover.data.criteo import FileIndex
from dlrover.data.layout import DataLayout
from dlrover.data.reader import FileReader
from dlrover.data.synth import Oracle
from dlrover.model.dlrm import PSClient, PSEmbeddingBagCollection, build_dense_dlrm, dense_parameters, table_configs
from dlrover.ps.dense_shards import DenseShards
from dlrover.spec import ModelSpec
from dlrover.worker.batches import Step, batches_of, with_tensors


class Evaluator:
    """A model replica with its own PS client and reader, so that evaluation can run while
    the worker trains without touching the training state. Built for one routing (PS set
    and vshard map): the worker drops it when the routing changes."""

    def __init__(
        self,
        client: PSClient,
        name: str,
        model: ModelSpec,
        seed: int,
        on_bad_line: str,
        batch_size: int,
        files: dict[str, FileIndex],
        layout: DataLayout,
        device: torch.device = torch.device("cpu"),
    ) -> None:
        # An injected link latency (chaos) holds for evaluation pulls too (one dict, shared).
        schema = layout.schema
        eval_client = PSClient(client.ps, client.vmap, client.dim, f"{name}/eval", get=ray.get, latency_s=client.latency_s, feature_tables=schema.feature_tables())
        self.device = device
        ebc = PSEmbeddingBagCollection(table_configs(model, schema), eval_client)
        self.model = build_dense_dlrm(model, ebc, seed, schema).to(device).eval()
        self.params = dense_parameters(self.model)
        self.reader = FileReader(on_bad_line=on_bad_line, layout=layout)
        self.batch_size = batch_size
        self.files = files

    def evaluate(self, ranges: list[tuple[str, int, int]], dense_ps: DenseShards) -> dict:
        """Labels, logits and (synthetic data only) true probabilities of rows [start, stop)
        of each file, scored with the dense PS's latest parameters."""
        torch.nn.utils.vector_to_parameters(torch.as_tensor(dense_ps.pull()).to(self.device), self.params)
        labels, logits, batches = [], [], []
        with torch.no_grad():
            for path, start, stop in ranges:
                for batch, _bad, _last in batches_of(self.reader, self.files[path], start, stop, self.batch_size):
                    if len(batch) == 0:
                        continue
                    step = with_tensors(Step(None, batch, False), self.reader.layout.schema.feature_names)
                    logits.append(self.model(step.dense.to(self.device), step.kjt).squeeze(-1).cpu().numpy())
                    labels.append(batch.labels)
                    batches.append((path, batch))
        return {
            "labels": np.concatenate(labels) if labels else np.zeros(0, np.float32),
            "logits": np.concatenate(logits) if logits else np.zeros(0, np.float32),
            "oracle": _oracle_scores(batches),
        }


def _oracle_scores(batches: list[tuple[str, Batch]]) -> np.ndarray | None:
    """The synthetic generator's true probabilities for these rows, if the data is synthetic."""
    cache: dict[str, Any] = {}
    out = []
    for path, batch in batches:
        d = os.path.dirname(path)
        if d not in cache:
            cache[d] = Oracle.from_dir(d)
        if cache[d] is None:
            return None
        out.append(cache[d].probability(batch))
    return np.concatenate(out) if out else None

"""The dense optimizer's first steps. From an empty accumulator, Adagrad's first step moves
every weight by the full learning rate whatever its gradient; on the bench DLRM that killed
every unit of the bottom MLP's last ReLU layer within 20 steps, and a dead layer gets no
gradient, so the model never used the dense features again (the low of the "two plateaus"
in docs/FAULTS.md). The default start value of the accumulator keeps the layer alive."""

from __future__ import annotations

import numpy as np
import torch

from dlrover.bench.baseline import build_local_model, train_step
from dlrover.bench.throughput import bench_spec
from dlrover.data.plan import DataPlan
from dlrover.data.reader import FileReader
from dlrover.data.synth import SynthConfig, generate
from dlrover.spec import spec_from_dict

ROWS, BATCH, STEPS = 24_000, 1024, 20


def alive_bottom_units(data_dir: str, **dense_optimizer) -> int:
    """Units of the bottom MLP's output that are > 0 for some row of the last of ``STEPS``
    single-process training steps of the bench model (the bench data's seed)."""
    doc = bench_spec(data_dir, ROWS, BATCH, workers=4).model_dump()
    doc["optimizer"]["dense"] = {"name": "adagrad", "lr": 0.01, **dense_optimizer}
    spec = spec_from_dict(doc, "bench")
    plan, reader = DataPlan.build(spec), FileReader()
    sizes = spec.schema
    model, opt = build_local_model(spec)
    out: list[torch.Tensor] = []
    model.dense_arch.register_forward_hook(lambda _m, _i, o: out.append(o.detach()))
    (path, rows), = plan.train_rows.items()
    for a in range(0, STEPS * BATCH, BATCH):
        batch, _ = reader.read(plan.files[path], a, min(rows, a + BATCH))
        train_step(model, opt, torch.nn.BCEWithLogitsLoss(), batch, sizes)
    return int((out[-1] > 0).any(dim=0).sum())


def test_an_empty_adagrad_accumulator_kills_the_bottom_mlp_and_the_default_start_keeps_it(tmp_path):
    generate(str(tmp_path), SynthConfig(rows=ROWS, files=1, seed=1), progress=False)
    assert alive_bottom_units(str(tmp_path), initial_accumulator_value=0.0) == 0
    assert alive_bottom_units(str(tmp_path)) >= 8  # of 16

"""The job spec's ``optimizer`` section (the embedding PS's optimizer and the dense PS's)
and how the dense PS combines the workers' gradients (``train.dense_sync``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from dlrover.spec_base import SpecSection

ADAGRAD_INITIAL_ACCUMULATOR = 0.001

# each gradient alone; one step per round of all workers' gradients; of all but the stragglers'
DenseSync = Literal["async", "sync", "coded"]


class SparseOptimizerSpec(SpecSection):
    name: Literal["rowwise_adagrad", "adagrad", "sgd"] = "rowwise_adagrad"
    lr: float = Field(0.01, gt=0)
    eps: float = Field(1e-8, gt=0)


class DenseOptimizerSpec(SpecSection):
    name: Literal["adagrad", "sgd", "adam"] = "adagrad"
    lr: float = Field(0.01, gt=0)
    eps: float = Field(1e-8, gt=0)
    # From an empty accumulator Adagrad's first step moves every weight by the full lr,
    # whatever its gradient: with the bench DLRM's seed that killed every unit of the
    # bottom MLP's last ReLU layer, and the model never used the dense features again
    # (docs/FAULTS.md, "Two plateaus"). A small start value damps the first steps.
    initial_accumulator_value: float | None = Field(None, ge=0, description=f"adagrad: the accumulator's start value (unset: {ADAGRAD_INITIAL_ACCUMULATOR})")

    @model_validator(mode="after")
    def _adagrad_only(self) -> "DenseOptimizerSpec":
        if self.name != "adagrad" and self.initial_accumulator_value is not None:
            raise ValueError(f"initial_accumulator_value: {self.name} has no accumulator (adagrad only)")
        return self

    @property
    def accumulator_start(self) -> float:
        """Adagrad's accumulator start: the value set, else the default (kept unset in the
        spec, so that a dumped spec may still switch to another optimizer)."""
        return ADAGRAD_INITIAL_ACCUMULATOR if self.initial_accumulator_value is None else self.initial_accumulator_value


class OptimizerSpec(SpecSection):
    sparse: SparseOptimizerSpec = Field(default_factory=SparseOptimizerSpec)
    dense: DenseOptimizerSpec = Field(default_factory=DenseOptimizerSpec)

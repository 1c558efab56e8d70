"""The base of every job-spec section: unknown keys are errors, values never change."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class SpecSection(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)  # resolved once, on the driver; never changed after

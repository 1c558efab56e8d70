"""A finished job's model: exported to a directory (``export``), loaded and scored without
Ray (``model.ServedModel``, ``predict``)."""

from dlrover.serving.model import ServedModel

__all__ = ["ServedModel"]

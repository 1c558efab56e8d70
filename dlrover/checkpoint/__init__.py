"""Durable, checksummed checkpoints (:mod:`dlrover.checkpoint.store`)."""

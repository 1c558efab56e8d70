"""A parsed block of rows (:class:`Batch`), in the form the model consumes."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dlrover.data.schema import CRITEO


@dataclass
class Batch:
    """A parsed block of rows, already in the form the model consumes.

    Single-hot (``lengths`` None): ``sparse`` is ``[N, T]``, one id per feature and row.
    Otherwise ``sparse`` holds the ids flat, feature-major (all of feature 0's bags, row
    by row, then feature 1's, ...: a KeyedJaggedTensor's order) and ``lengths[t, i]`` is
    the length of row i's bag of feature t. ``cut``: bags of each row cut to ``max_len``.
    """

    labels: np.ndarray  # float32 [N]
    dense: np.ndarray  # float32 [N, D]: transformed as the schema says, missing -> 0
    sparse: np.ndarray  # int64 [N, T], or flat with ``lengths``
    lengths: np.ndarray | None = None  # int32 [T, N]
    cut: np.ndarray | None = None  # int32 [N], None: none cut

    @property
    def long_bags(self) -> int:
        return 0 if self.cut is None else int(self.cut.sum())

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    @property
    def num_features(self) -> int:
        return int(self.sparse.shape[1] if self.lengths is None else self.lengths.shape[0])

    @property
    def num_ids(self) -> int:
        return int(self.sparse.size if self.lengths is None else self.lengths.sum())

    def features_of_ids(self) -> np.ndarray:
        """The feature of each id of :meth:`jagged`'s ids."""
        _, lengths = self.jagged()
        return np.repeat(np.arange(len(lengths)), lengths.sum(axis=1))

    def jagged(self) -> tuple[np.ndarray, np.ndarray]:
        """(feature-major ids, lengths ``[T, N]``) whatever the layout."""
        if self.lengths is not None:
            return self.sparse, self.lengths
        return np.ascontiguousarray(self.sparse.T).reshape(-1), np.ones(self.sparse.shape[::-1], np.int32)

    def _spans(self, start: int, stop: int) -> list[tuple[int, int]]:
        """Where rows [start, stop) of each feature's bags lie in the flat ``sparse``."""
        assert self.lengths is not None
        ends = np.cumsum(self.lengths, axis=1, dtype=np.int64)
        base = np.concatenate([[0], np.cumsum(ends[:, -1])[:-1]]) if len(self) else np.zeros(len(ends), np.int64)
        at = lambda r: base + (ends[:, r - 1] if r > 0 else 0)  # noqa: E731
        return list(zip(at(start).tolist(), at(stop).tolist()))

    def slice(self, start: int, stop: int) -> "Batch":
        """Rows ``[start, stop)`` (views where the layout allows)."""
        cut = None if self.cut is None else self.cut[start:stop]
        if self.lengths is None:
            return Batch(self.labels[start:stop], self.dense[start:stop], self.sparse[start:stop], cut=cut)
        ids = np.concatenate([self.sparse[a:b] for a, b in self._spans(start, stop)])
        return Batch(self.labels[start:stop], self.dense[start:stop], ids, self.lengths[:, start:stop], cut)

    @staticmethod
    def empty(dense_width: int = CRITEO.dense_width, features: int = len(CRITEO.sparse)) -> "Batch":
        return Batch(
            np.zeros(0, np.float32),
            np.zeros((0, dense_width), np.float32),
            np.zeros((0, features), np.int64),
        )

    @staticmethod
    def concat(batches: list["Batch"]) -> "Batch":
        if not batches:
            return Batch.empty()
        if len(batches) == 1:
            return batches[0]
        labels = np.concatenate([b.labels for b in batches])
        dense = np.concatenate([b.dense for b in batches])
        cuts = None if all(b.cut is None for b in batches) else np.concatenate([np.zeros(len(b), np.int32) if b.cut is None else b.cut for b in batches])
        if all(b.lengths is None for b in batches):
            return Batch(labels, dense, np.concatenate([b.sparse for b in batches]), cut=cuts)
        parts = [b.jagged() for b in batches]
        per_feature = [np.split(ids, np.cumsum(lens.sum(axis=1))[:-1]) for ids, lens in parts]
        ids = np.concatenate([piece for t in range(len(parts[0][1])) for piece in (p[t] for p in per_feature)])
        return Batch(labels, dense, ids, np.concatenate([lens for _, lens in parts], axis=1), cuts)

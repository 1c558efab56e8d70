"""A Ray Data pipeline the ray_data tests train from: a raw click log in Parquet
(``write_click_log``), read with ``ray.data.read_parquet`` and preprocessed by
``map_batches`` into the columns ``FEATURES`` names (``click_log``, a ``data.dataset``
function). ``DATA_DIR`` tells it where the files are (the job's spec names only the
function)."""

from __future__ import annotations

import os

import numpy as np

DENSE = [f"d{j}" for j in range(100)]  # wide rows: a store-sized log in few rows
FEATURES = {
    "label": "click",
    "dense": ["price", *DENSE],
    "sparse": ["site", "app", {"column": "tags", "max_len": 4}],
}
MODEL = {"embedding_dim": 8, "num_embeddings": 5000, "dense_arch": [32, 8], "over_arch": [64, 32, 1]}
BLOCK_BYTES = 2 << 20  # Ray Data's target block size here: the store holds a few dozen


def write_click_log(out: str, rows: int, files: int, seed: int = 0, row_group: int = 16_384) -> list[str]:
    """``files`` Parquet files of raw rows: ``clicked`` (bool), ``price_cents``, 100 dense
    values, a site and an app id, a list of 0..6 tags (``max_len`` 4 cuts some)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    os.makedirs(out, exist_ok=True)
    paths = []
    for f, n in enumerate(np.diff(np.linspace(0, rows, files + 1).astype(int))):
        lengths = rng.integers(0, 7, n)
        cols = {
            "clicked": rng.random(n) < 0.3,
            "price_cents": rng.integers(0, 100_000, n),
            **{d: rng.normal(size=n) for d in DENSE},
            "site": rng.integers(0, 10_000, n),
            "app": rng.integers(0, 3000, n),
            "tags": pa.ListArray.from_arrays(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32), rng.integers(0, 50_000, lengths.sum())),
        }
        paths.append(os.path.join(out, f"part-{f:05d}.parquet"))
        pq.write_table(pa.table(cols), paths[-1], row_group_size=row_group)
    return paths


def preprocess(batch):
    """Raw rows -> the job's columns: a 0/1 label, the price in units; the rest as it is."""
    import pyarrow as pa
    import pyarrow.compute as pc

    click = pc.cast(batch.column("clicked"), pa.int64())
    price = pc.divide(pc.cast(batch.column("price_cents"), pa.float64()), 100.0)
    keep = [c for c in batch.column_names if c not in ("clicked", "price_cents")]
    return pa.table({"click": click, "price": price, **{c: batch.column(c) for c in keep}})


def click_log():
    """``data.dataset: ray_data_pipeline:click_log``: the log under ``$DATA_DIR``, preprocessed."""
    import ray.data

    # map_batches without a batch_size fuses with the read: no read output waits in the store.
    ds = ray.data.read_parquet(os.environ["DATA_DIR"]).map_batches(preprocess, batch_format="pyarrow")
    ds.context.target_max_block_size = BLOCK_BYTES
    return ds


def without_tags():
    """A pipeline whose columns miss one the features name (``tags``)."""
    return click_log().drop_columns(["tags"])


def check_prices(batch):
    """A preprocessing step that refuses a negative price (``write_click_log`` writes none;
    a test plants some)."""
    import pyarrow.compute as pc

    if pc.any(pc.less(batch.column("price_cents"), 0)).as_py():
        raise ValueError("price must be positive")
    return preprocess(batch)


def with_price_check():
    import ray.data

    return ray.data.read_parquet(os.environ["DATA_DIR"]).map_batches(check_prices, batch_format="pyarrow")

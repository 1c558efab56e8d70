"""Data: Criteo readers, synthetic data with a known best AUC, and dynamic sharding."""

from dlrover.data.criteo import (
    NUM_DENSE,
    NUM_SPARSE,
    Batch,
    FileIndex,
    FileReader,
    detect_format,
    expand_paths,
    hex_to_int,
    index_file,
    parse_tsv_lines,
    tsv_to_parquet,
)
from dlrover.data.shards import Shard, ShardQueue
from dlrover.data.synth import Oracle, SynthConfig, best_auc, generate

__all__ = [
    "NUM_DENSE",
    "NUM_SPARSE",
    "Batch",
    "FileIndex",
    "FileReader",
    "Oracle",
    "Shard",
    "ShardQueue",
    "SynthConfig",
    "best_auc",
    "detect_format",
    "expand_paths",
    "generate",
    "hex_to_int",
    "index_file",
    "parse_tsv_lines",
    "tsv_to_parquet",
]

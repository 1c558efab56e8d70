"""Data: Criteo readers, synthetic data with a known best AUC, and dynamic sharding."""

from dlrover.data.batch import Batch
from dlrover.data.criteo import NUM_DENSE, NUM_SPARSE, FileIndex, detect_format, expand_paths, index_file
from dlrover.data.parquet import tsv_to_parquet
from dlrover.data.reader import FileReader
from dlrover.data.shards import Shard, ShardQueue
from dlrover.data.synth import Oracle, SynthConfig, best_auc, generate
from dlrover.data.tsv import hex_to_int, parse_tsv_lines

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

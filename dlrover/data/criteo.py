"""Readers for Criteo Kaggle click logs (TSV, gzip'd TSV, Parquet).

A line is ``label \\t I1..I13 \\t C1..C26``: 40 tab-separated fields. Workers read
row ranges ``[start, stop)`` of a file (a shard), so plain TSV files are indexed once
(a byte offset every ``stride`` rows) and a read seeks close to ``start`` instead of
scanning the file. Compressed and columnar files cannot be seeked by row, so they are
parsed once and kept in a small LRU cache.

Parsing is vectorised over ~1 MiB of bytes at a time: separators are located with
numpy, the 40 field boundaries of every row come out of one reshape, and each field's
first 8 bytes are gathered as one uint64 and decoded with a byte lookup table plus
SWAR arithmetic. Only when that fast path sees something wrong do we fall back to
per-line checks, to name the exact ``file:line`` (or to skip bad lines and count them).
"""

from __future__ import annotations

import glob
import gzip
import os
import re
import zlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from dlrover.errors import DataError

NUM_DENSE = 13
NUM_SPARSE = 26
NUM_FIELDS = 1 + NUM_DENSE + NUM_SPARSE

DENSE_COLUMNS = [f"I{j}" for j in range(1, NUM_DENSE + 1)]
SPARSE_COLUMNS = [f"C{j}" for j in range(1, NUM_SPARSE + 1)]

_TSV_EXTS = (".tsv", ".txt", ".csv", ".gz", "")
_PARQUET_EXTS = (".parquet", ".pq")
_BLOCK = 16 << 20  # bytes read at a time when indexing
_PIECE = 1 << 20  # bytes parsed at once
_MAX_DIGITS = 18  # longest dense integer that fits int64 without overflow checks
_TAB, _NL, _CR, _MINUS = 9, 10, 13, 45

# Hex digit value of every byte, 255 where the byte is not a hex digit.
_NIBBLE = np.full(256, 255, dtype=np.uint8)
_NIBBLE[ord("0") : ord("9") + 1] = np.arange(10)
_NIBBLE[ord("a") : ord("f") + 1] = np.arange(10, 16)
_NIBBLE[ord("A") : ord("F") + 1] = np.arange(10, 16)
# Decimal digit value of every byte, 255 where the byte is not a digit.
_DIGIT = np.full(256, 255, dtype=np.uint8)
_DIGIT[ord("0") : ord("9") + 1] = np.arange(10)


# --------------------------------------------------------------------------- batch


@dataclass
class Batch:
    """A parsed block of rows, already in the form the model consumes."""

    labels: np.ndarray  # float32 [N]
    dense: np.ndarray  # float32 [N, 13]: log1p(max(x, 0)), empty -> 0
    sparse: np.ndarray  # int64 [N, 26]: categorical value decoded from hex, empty -> 0

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def slice(self, start: int, stop: int) -> "Batch":
        """Rows ``[start, stop)`` as views (no copy)."""
        return Batch(self.labels[start:stop], self.dense[start:stop], self.sparse[start:stop])

    @staticmethod
    def empty() -> "Batch":
        return Batch(
            np.zeros(0, np.float32),
            np.zeros((0, NUM_DENSE), np.float32),
            np.zeros((0, NUM_SPARSE), np.int64),
        )

    @staticmethod
    def concat(batches: list["Batch"]) -> "Batch":
        if not batches:
            return Batch.empty()
        if len(batches) == 1:
            return batches[0]
        return Batch(
            np.concatenate([b.labels for b in batches]),
            np.concatenate([b.dense for b in batches]),
            np.concatenate([b.sparse for b in batches]),
        )


class _Raw(NamedTuple):
    """Parsed values before the model transform; kept for Parquet conversion."""

    labels: np.ndarray  # uint8 [N]
    dense: np.ndarray  # int64 [N, 13]
    dense_missing: np.ndarray  # bool [N, 13]
    sparse: np.ndarray  # int64 [N, 26]
    sparse_missing: np.ndarray  # bool [N, 26]

    def batch(self) -> Batch:
        dense = np.log1p(np.maximum(self.dense, 0).astype(np.float32))
        return Batch(self.labels.astype(np.float32), dense, self.sparse)


# --------------------------------------------------------------------------- paths


def detect_format(path: str) -> str:
    """``"tsv"`` or ``"parquet"``, from the file name; unknown extensions are refused
    rather than guessed, so a stray ``synth.json`` never gets parsed as data."""
    name = os.path.basename(path).lower()
    ext = os.path.splitext(name)[1]
    if ext in _PARQUET_EXTS:
        return "parquet"
    if ext in _TSV_EXTS:
        return "tsv"
    raise DataError(
        f"{path}: unknown data file extension {ext!r} "
        "(expected .tsv, .txt, .csv, .gz, .parquet, .pq or none)"
    )


def _is_data_file(path: str) -> bool:
    try:
        detect_format(path)
    except DataError:
        return False
    return os.path.isfile(path) and not os.path.basename(path).startswith(".")


def expand_paths(patterns: list[str]) -> list[str]:
    """Expand globs (and directories, to the data files inside them) into a sorted,
    deduplicated file list; a pattern that matches nothing is an error, since silently
    training on fewer files than asked for is worse than failing."""
    found: set[str] = set()
    for pattern in patterns:
        expanded = os.path.expanduser(pattern)
        if os.path.isdir(expanded):
            names = [os.path.join(expanded, n) for n in os.listdir(expanded)]
            matches = [p for p in names if _is_data_file(p)]
        elif glob.has_magic(expanded):
            matches = [p for p in glob.glob(expanded) if _is_data_file(p)]
        else:
            matches = [expanded] if os.path.isfile(expanded) else []
        if not matches:
            raise DataError(f"{pattern}: matches no data files")
        found.update(os.path.normpath(p) for p in matches)
    return sorted(found)


# --------------------------------------------------------------------------- index


@dataclass
class FileIndex:
    """Row count of one file, plus seek points for plain TSV.

    ``offsets[k]`` is the byte offset of row ``k * stride`` and ``line_nos[k]`` its
    0-based physical line, so blank lines never shift reported line numbers.
    """

    path: str
    fmt: str
    rows: int
    offsets: list[int] | None
    stride: int = 4096
    line_nos: list[int] | None = None


def _line_bounds(data: bytes, at_eof: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Start/end byte of each complete line in ``data`` (plus the unterminated last one
    when ``at_eof``), and whether it is a row (not blank, ignoring a trailing CR)."""
    buf = np.frombuffer(data, dtype=np.uint8)
    ends = np.flatnonzero(buf == _NL)
    tail_start = int(ends[-1]) + 1 if len(ends) else 0
    if at_eof and tail_start < len(data):
        ends = np.append(ends, len(data))
    starts = np.empty_like(ends)
    if len(ends):
        starts[0] = 0
        starts[1:] = ends[:-1] + 1
    lengths = ends - starts
    has_cr = (lengths > 0) & (buf[np.maximum(ends - 1, 0)] == _CR) if len(buf) else lengths > 0
    return starts, ends, (lengths - has_cr) > 0


def _open_binary(path: str):
    try:
        return gzip.open(path, "rb") if path.lower().endswith(".gz") else open(path, "rb")
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except OSError as e:
        raise DataError(f"{path}: cannot open: {e.strerror or e}") from None


def index_file(path: str, stride: int = 4096) -> FileIndex:
    """Count the rows (non-blank lines) of a file; for plain TSV also record a seek
    point every ``stride`` rows. Reads 16 MiB blocks and finds newlines with numpy."""
    if stride < 1:
        raise ValueError(f"stride must be >= 1, got {stride}")
    fmt = detect_format(path)
    if not os.path.isfile(path):
        raise DataError(f"{path}: no such file")
    if fmt == "parquet":
        import pyarrow.parquet as pq

        try:
            rows = pq.ParquetFile(path).metadata.num_rows
        except Exception as e:  # pyarrow raises several types for a bad file
            raise DataError(f"{path}: not a readable Parquet file: {e}") from None
        return FileIndex(path, fmt, int(rows), None, stride)

    want_offsets = not path.lower().endswith(".gz")
    offsets: list[int] = []
    line_nos: list[int] = []
    rows = 0  # rows seen before `data`
    lines = 0  # physical lines seen before `data`
    pos = 0  # file offset of data[0]
    tail = b""
    with _open_binary(path) as f:
        while True:
            try:
                block = f.read(_BLOCK)
            except (OSError, EOFError, zlib.error) as e:
                raise DataError(f"{path}: corrupt file: {e}") from None
            at_eof = not block
            data = tail + block if tail else block
            starts, ends, is_row = _line_bounds(data, at_eof)
            row_lines = np.flatnonzero(is_row)
            if want_offsets:
                picked = row_lines[(-rows) % stride :: stride]
                offsets.extend((pos + starts[picked]).tolist())
                line_nos.extend((lines + picked).tolist())
            rows += len(row_lines)
            lines += len(starts)
            if at_eof:
                break
            consumed = int(ends[-1]) + 1 if len(ends) else 0
            tail = data[consumed:]
            pos += consumed
    if not want_offsets:
        return FileIndex(path, fmt, rows, None, stride)
    return FileIndex(path, fmt, rows, offsets, stride, line_nos)


# --------------------------------------------------------------------------- decoding


_U = np.uint64
_LOW_BYTES = _U(0x00FF00FF00FF00FF)
_LOW_WORDS = _U(0x0000FFFF0000FFFF)
_LOW_DWORD = _U(0xFFFFFFFF)
_HIGH_NIBBLES = _U(0xF0F0F0F0F0F0F0F0)
# _PREFIX[k]: the first k bytes (in memory order) of a little-endian uint64.
_PREFIX = np.array([(1 << (8 * k)) - 1 for k in range(9)], dtype=np.uint64)
_POW10 = 10 ** np.arange(9, dtype=np.int64)


def _words(buf: bytes, starts: np.ndarray) -> np.ndarray:
    """The 8 bytes at each start offset of ``buf`` (which must have 7 bytes of padding
    past the last start), as little-endian uint64: one gather per field, not per byte."""
    view = np.ndarray((len(buf) - 7,), dtype="<u8", buffer=buf, strides=(1,))
    return view[starts]


def _lookup(words: np.ndarray, table: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Map every byte of ``words`` through ``table`` (invalid -> 0xFF) and zero the bytes
    past each field's length, keeping a byte-per-digit uint64."""
    mapped = np.take(table, words.view(np.uint8)).view("<u8")
    return mapped & _PREFIX[np.minimum(lengths, 8)]


def _hex_words(words: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Decode hex strings held left-aligned in uint64 words (first ``lengths`` bytes).

    Each byte becomes a nibble via the 256-entry table; SWAR shifts then pack the 8
    nibbles into one 32-bit number as if the string had 8 digits, and shifting right
    by the missing digits gives the value. Returns (int64 values, ok mask).
    """
    nib = _lookup(words, _NIBBLE, lengths)
    ok = ((nib & _HIGH_NIBBLES) == 0) & (lengths <= 8)
    pairs = ((nib & _LOW_BYTES) << _U(4)) | ((nib >> _U(8)) & _LOW_BYTES)
    quads = ((pairs & _LOW_WORDS) << _U(8)) | ((pairs >> _U(16)) & _LOW_WORDS)
    full = ((quads & _LOW_DWORD) << _U(16)) | (quads >> _U(32))
    shift = (4 * (8 - np.minimum(lengths, 8))).astype(np.uint64)
    return (full >> shift).astype(np.int64), ok


def hex_to_int(col: np.ndarray) -> np.ndarray:
    """Decode an array of hex strings (``'S8'``; empty -> 0) into int64 values.

    Each ``S8`` item is exactly one uint64 word, decoded with a 256-entry nibble table
    on the uint8 view, so a million values take milliseconds. Raises ValueError on a
    non-hex or longer-than-8 string.
    """
    arr = np.asarray(col)
    if arr.dtype.kind == "U":
        arr = np.char.encode(arr, "ascii")
    if arr.dtype.kind != "S":
        raise ValueError(f"expected an array of byte strings, got dtype {arr.dtype}")
    flat = arr.reshape(-1)
    if arr.dtype.itemsize > 8:
        too_long = np.char.str_len(flat) > 8
        if too_long.any():
            raise ValueError(f"hex value longer than 8 characters: {flat[too_long][0]!r}")
    s8 = np.ascontiguousarray(flat.astype("S8"))
    values, ok = _hex_words(s8.view("<u8"), np.char.str_len(s8))
    if not ok.all():
        raise ValueError(f"not a hex string: {flat[~ok][0]!r}")
    return values.reshape(arr.shape)


def _decimal_words(
    buf: bytes, starts: np.ndarray, lengths: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Decode optionally negative decimal integers at ``buf[starts:starts+lengths]``.

    Fields of up to 8 bytes (nearly all) are decoded in uint64 words: a leading '-'
    becomes a '0' digit, digits are mapped through a table and SWAR multiply-adds
    combine them; fields longer than 8 bytes take the per-byte path.
    Returns (int64 values, ok mask).
    """
    words = _words(buf, starts)
    negative = (lengths > 0) & ((words & _U(0xFF)) == _U(_MINUS))
    words = words + negative.astype(np.uint64) * _U(ord("0") - _MINUS)
    d = _lookup(words, _DIGIT, lengths)
    ok = ((d & _HIGH_NIBBLES) == 0) & ~(negative & (lengths == 1))
    pairs = (d & _LOW_BYTES) * _U(10) + ((d >> _U(8)) & _LOW_BYTES)
    quads = (pairs & _LOW_WORDS) * _U(100) + ((pairs >> _U(16)) & _LOW_WORDS)
    full = ((quads & _LOW_DWORD) * _U(10000) + (quads >> _U(32))).astype(np.int64)
    values = full // _POW10[8 - np.minimum(lengths, 8)]
    long = lengths > 8
    if long.any():
        arr = np.frombuffer(buf, dtype=np.uint8)
        values[long], ok[long] = _decimal_bytes(arr, starts[long], lengths[long])
    return np.where(negative, -values, values), ok


def _decimal_bytes(
    buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per-byte decoder for long fields: digits (sign excluded) gathered right-aligned
    into a [M, W] matrix, then one dot product with powers of ten. Absolute values."""
    negative = buf[starts] == _MINUS
    digits = lengths - negative
    ok = digits <= _MAX_DIGITS
    width = int(min(digits.max(initial=0), _MAX_DIGITS))
    cols = np.arange(width)
    valid = cols >= (width - np.minimum(digits, width))[:, None]
    idx = np.where(valid, (starts + lengths)[:, None] - width + cols, 0)
    d = buf[idx] - np.uint8(48)  # non-digits wrap around to > 9
    ok &= ((d <= 9) | ~valid).all(axis=1)
    d = np.where(valid & (d <= 9), d, 0).astype(np.int64)
    return d @ (10 ** np.arange(width - 1, -1, -1, dtype=np.int64)), ok


def _fast_parse(data: bytes) -> _Raw | None:
    """Parse well-formed rows; None if anything at all is off (caller then checks
    line by line). ``data`` must end with a newline and contain no blank lines."""
    buf = np.frombuffer(data, dtype=np.uint8)
    seps = np.flatnonzero((buf == _TAB) | (buf == _NL))
    if len(seps) % NUM_FIELDS:
        return None
    n = len(seps) // NUM_FIELDS
    if n == 0:
        return _Raw(*(np.zeros((0, *s), t) for s, t in _EMPTY_SHAPES))
    if (buf[seps[NUM_FIELDS - 1 :: NUM_FIELDS]] != _NL).any():
        return None
    if int(np.count_nonzero(buf[seps] == _NL)) != n:
        return None
    ends = seps.reshape(n, NUM_FIELDS)
    starts = np.empty_like(ends)
    starts.reshape(-1)[0] = 0
    starts.reshape(-1)[1:] = seps[:-1] + 1
    lengths = ends - starts

    first = buf[starts[:, 0]]
    if not ((lengths[:, 0] == 1) & ((first == 48) | (first == 49))).all():
        return None
    labels = first - np.uint8(48)

    padded = data + b"\0" * 8
    d_start, d_len = starts[:, 1:14].reshape(-1), lengths[:, 1:14].reshape(-1)
    dense, ok = _decimal_words(padded, d_start, d_len)
    if not ok.all():
        return None
    s_start, s_len = starts[:, 14:].reshape(-1), lengths[:, 14:].reshape(-1)
    sparse, ok = _hex_words(_words(padded, s_start), s_len)
    if not ok.all():
        return None
    return _Raw(
        labels,
        dense.reshape(n, NUM_DENSE),
        (d_len == 0).reshape(n, NUM_DENSE),
        sparse.reshape(n, NUM_SPARSE),
        (s_len == 0).reshape(n, NUM_SPARSE),
    )


_EMPTY_SHAPES = [
    ((), np.uint8),
    ((NUM_DENSE,), np.int64),
    ((NUM_DENSE,), bool),
    ((NUM_SPARSE,), np.int64),
    ((NUM_SPARSE,), bool),
]


_INT_RE = re.compile(rb"-?[0-9]{1,%d}" % _MAX_DIGITS)
_HEX_RE = re.compile(rb"[0-9a-fA-F]{1,8}")


def _show(field: bytes) -> str:
    text = field.decode("ascii", "backslashreplace")
    return repr(text if len(text) <= 32 else text[:29] + "...")


def _line_problem(line: bytes) -> str | None:
    """Why a (non-blank) line is malformed, or None. Mirrors the fast path's rules."""
    fields = line.split(b"\t")
    if len(fields) != NUM_FIELDS:
        return f"expected {NUM_FIELDS} tab-separated fields, got {len(fields)}"
    if fields[0] not in (b"0", b"1"):
        return f"label must be 0 or 1, got {_show(fields[0])}"
    for name, field in zip(DENSE_COLUMNS, fields[1:14]):
        if field and not _INT_RE.fullmatch(field):
            return f"{name} must be an integer, got {_show(field)}"
    for name, field in zip(SPARSE_COLUMNS, fields[14:]):
        if field and not _HEX_RE.fullmatch(field):
            return f"{name} must be a hex string of at most 8 digits, got {_show(field)}"
    return None


def _normalise(data: bytes) -> bytes:
    """Terminate the last line and turn CRLF into LF (line count is unchanged)."""
    if data and not data.endswith(b"\n"):
        data += b"\n"
    if b"\r" in data:
        data = data.replace(b"\r\n", b"\n")
    return data


def _parse(
    data: bytes, path: str, first_line_no: int, on_bad_line: str
) -> tuple[_Raw, np.ndarray, list[str]]:
    """Parse a buffer of lines; returns the good rows, the row ordinals (among the
    buffer's non-blank lines) of the lines that were skipped, and why.

    Big buffers go in ~1 MiB pieces: the vectorised path allocates several arrays per
    byte, which stay in cache for a piece but not for a whole file.
    """
    data = _normalise(data)
    if len(data) <= _PIECE:
        return _parse_piece(data, path, first_line_no, on_bad_line)
    raws: list[_Raw] = []
    bads: list[np.ndarray] = []
    reasons: list[str] = []
    pos, line_no, row = 0, first_line_no, 0
    while pos < len(data):
        end = data.find(b"\n", min(pos + _PIECE, len(data)) - 1) + 1
        piece = data[pos:end]
        raw, bad, why = _parse_piece(piece, path, line_no, on_bad_line)
        raws.append(raw)
        bads.append(bad + row)
        reasons += why
        row += len(raw.labels) + len(bad)
        line_no += piece.count(b"\n")
        pos = end
    merged = _Raw(*(np.concatenate(parts) for parts in zip(*raws)))
    return merged, np.concatenate(bads), reasons


def _parse_piece(
    data: bytes, path: str, first_line_no: int, on_bad_line: str
) -> tuple[_Raw, np.ndarray, list[str]]:
    """:func:`_parse` for a normalised buffer: fast path, else line-by-line checks."""
    compact = data
    if compact.startswith(b"\n") or b"\n\n" in compact:
        compact = compact.lstrip(b"\n")
        while b"\n\n" in compact:
            compact = compact.replace(b"\n\n", b"\n")
    raw = _fast_parse(compact)
    if raw is not None:
        return raw, np.zeros(0, np.int64), []

    good: list[bytes] = []
    bad: list[int] = []
    reasons: list[str] = []
    row = 0
    for i, line in enumerate(data.split(b"\n")[:-1]):
        if not line:
            continue
        problem = _line_problem(line)
        if problem is not None:
            reason = f"{path}:{first_line_no + i}: {problem}"
            if on_bad_line == "fail":
                raise DataError(reason)
            bad.append(row)
            reasons.append(reason)
        else:
            good.append(line)
        row += 1
    raw = _fast_parse(b"\n".join(good) + b"\n") if good else _fast_parse(b"")
    if raw is None:  # the two validators disagree: a bug, not bad data
        raise RuntimeError(f"{path}: line checks passed but vectorised parse failed")
    return raw, np.asarray(bad, dtype=np.int64), reasons


def parse_tsv_lines(
    lines: list[bytes] | bytes, path: str, first_line_no: int, on_bad_line: str
) -> tuple[Batch, int]:
    """Parse Criteo TSV lines into a Batch; returns (batch, number of lines skipped).

    ``first_line_no`` is the 1-based line number of the first line in ``path``, used
    only in error messages. ``on_bad_line`` is ``"fail"`` (DataError naming
    ``path:line``) or ``"skip"`` (drop and count). Blank lines are ignored.
    """
    _check_mode(on_bad_line)
    if not isinstance(lines, (bytes, bytearray, memoryview)):
        lines = b"\n".join(line.rstrip(b"\r\n") for line in lines)
    raw, bad, _ = _parse(bytes(lines), path, first_line_no, on_bad_line)
    return raw.batch(), len(bad)


def _check_mode(on_bad_line: str) -> None:
    if on_bad_line not in ("fail", "skip"):
        raise ValueError(f"on_bad_line must be 'fail' or 'skip', got {on_bad_line!r}")


# --------------------------------------------------------------------------- parquet


def _read_parquet(path: str) -> tuple[_Raw, np.ndarray, list[str]]:
    """Whole Parquet file -> (good rows, bad row ordinals, reasons); 1-based row
    numbers stand in for line numbers."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    try:
        names = set(pq.read_schema(path).names)
        missing = [c for c in ["label", *DENSE_COLUMNS, *SPARSE_COLUMNS] if c not in names]
        if missing:
            raise DataError(f"{path}: Parquet file lacks column(s) {', '.join(missing)}")
        table = pq.read_table(path, columns=["label", *DENSE_COLUMNS, *SPARSE_COLUMNS])
    except DataError:
        raise
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except Exception as e:
        raise DataError(f"{path}: not a readable Parquet file: {e}") from None

    n = table.num_rows
    problems: list[tuple[np.ndarray, str]] = []  # (bad-row mask, reason)

    def integers(name: str) -> tuple[np.ndarray, np.ndarray]:
        col = table.column(name)
        if not pa.types.is_integer(col.type):
            raise DataError(f"{path}: column {name} has type {col.type}, expected integers")
        missing = col.is_null().to_numpy(zero_copy_only=False)
        return pc.fill_null(col, 0).to_numpy().astype(np.int64), missing

    label_col = table.column("label")
    kind = label_col.type
    if not (pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)):
        raise DataError(f"{path}: column label has type {kind}, expected numbers")
    label_values = pc.fill_null(label_col.cast(pa.float64()), -1.0).to_numpy()
    label_ok = (label_values == 0) | (label_values == 1)
    labels = np.where(label_ok, label_values, 0).astype(np.int64)
    problems.append((~label_ok, "label must be 0 or 1"))
    dense = np.zeros((n, NUM_DENSE), np.int64)
    dense_missing = np.zeros((n, NUM_DENSE), bool)
    for j, name in enumerate(DENSE_COLUMNS):
        dense[:, j], dense_missing[:, j] = integers(name)
    sparse = np.zeros((n, NUM_SPARSE), np.int64)
    sparse_missing = np.zeros((n, NUM_SPARSE), bool)
    for j, name in enumerate(SPARSE_COLUMNS):
        col = table.column(name)
        if pa.types.is_integer(col.type):
            sparse[:, j], sparse_missing[:, j] = integers(name)
            reason = f"{name} must be in [0, 2**32)"
            problems.append(((sparse[:, j] < 0) | (sparse[:, j] >= 1 << 32), reason))
        elif pa.types.is_string(col.type) or pa.types.is_binary(col.type):
            sparse_missing[:, j] = col.is_null().to_numpy(zero_copy_only=False)
            text = pc.fill_null(col, "").to_numpy(zero_copy_only=False).astype("S")
            lengths = np.char.str_len(text)
            words = np.ascontiguousarray(text.astype("S8")).view("<u8")
            sparse[:, j], ok = _hex_words(words, lengths)
            sparse_missing[:, j] |= lengths == 0
            problems.append((~ok, f"{name} must be a hex string of at most 8 digits"))
        else:
            raise DataError(f"{path}: column {name} has type {col.type}, expected int or string")

    bad_mask = np.zeros(n, bool)
    reason_of: dict[int, str] = {}
    for mask, reason in problems:
        for row in np.flatnonzero(mask & ~bad_mask).tolist():
            reason_of[row] = f"{path}:{row + 1}: {reason}"
        bad_mask |= mask
    keep = ~bad_mask
    raw = _Raw(
        labels[keep].astype(np.uint8),
        dense[keep],
        dense_missing[keep],
        sparse[keep],
        sparse_missing[keep],
    )
    bad = np.flatnonzero(bad_mask)
    return raw, bad, [reason_of[r] for r in bad.tolist()]


def tsv_to_parquet(src: str, dst: str, hex_strings: bool = False) -> int:
    """Convert a (possibly gzip'd) Criteo TSV file to Parquet; returns the row count.

    Empty fields become nulls; ``C*`` columns are int64 unless ``hex_strings``.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    raw, _, _ = _read_whole_tsv(src, "fail")
    columns = {"label": pa.array(raw.labels.astype(np.int8))}
    for j, name in enumerate(DENSE_COLUMNS):
        columns[name] = pa.array(raw.dense[:, j], mask=raw.dense_missing[:, j])
    for j, name in enumerate(SPARSE_COLUMNS):
        if hex_strings:
            text = np.array([f"{v:08x}" for v in raw.sparse[:, j].tolist()], dtype=object)
            columns[name] = pa.array(text, type=pa.string(), mask=raw.sparse_missing[:, j])
        else:
            columns[name] = pa.array(raw.sparse[:, j], mask=raw.sparse_missing[:, j])
    os.makedirs(os.path.dirname(os.path.abspath(dst)), exist_ok=True)
    pq.write_table(pa.table(columns), dst)
    return len(raw.labels)


# --------------------------------------------------------------------------- reader


def _read_whole_tsv(path: str, on_bad_line: str) -> tuple[_Raw, np.ndarray, list[str]]:
    with _open_binary(path) as f:
        try:
            data = f.read()
        except (OSError, EOFError, zlib.error) as e:
            raise DataError(f"{path}: corrupt file: {e}") from None
    return _parse(data, path, 1, on_bad_line)


class FileReader:
    """Reads row ranges [start, stop) of data files; on_bad_line: 'fail' | 'skip'.

    Plain TSV is read by seeking to the nearest indexed row, so a read costs about
    the rows asked for. ``.gz`` and Parquet files are parsed whole once and kept in
    an LRU of ``cache_files`` files, because they cannot be seeked by row. Bad lines
    are then remembered, so 'fail' raises only for a range that contains one, exactly
    as for plain TSV.
    """

    def __init__(self, on_bad_line: str = "fail", cache_files: int = 2) -> None:
        _check_mode(on_bad_line)
        self.on_bad_line = on_bad_line
        self.cache_files = max(0, int(cache_files))
        self._cache: OrderedDict[str, tuple[Batch, np.ndarray, list[str]]] = OrderedDict()

    def read(self, index: FileIndex, start: int, stop: int) -> tuple[Batch, int]:
        """Rows [start, stop) of ``index.path`` (rows = non-blank lines, 0-based);
        returns (batch of the good rows, number of bad lines skipped)."""
        if not 0 <= start <= stop <= index.rows:
            raise ValueError(f"rows [{start}, {stop}) outside 0..{index.rows} of {index.path}")
        if start == stop:
            return Batch.empty(), 0
        if index.fmt == "tsv" and index.offsets is not None:
            return self._read_seek(index, start, stop)
        batch, bad, reasons = self._whole(index)
        # `bad` holds file row ordinals of bad rows; map file rows to batch rows.
        first_bad, end_bad = np.searchsorted(bad, [start, stop])
        if end_bad > first_bad and self.on_bad_line == "fail":
            raise DataError(reasons[int(first_bad)])
        lo, hi = start - int(first_bad), stop - int(end_bad)
        return batch.slice(lo, hi), int(end_bad - first_bad)

    def _whole(self, index: FileIndex) -> tuple[Batch, np.ndarray, list[str]]:
        key = os.path.abspath(index.path)
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        if index.fmt == "parquet":
            raw, bad, reasons = _read_parquet(index.path)
        else:
            raw, bad, reasons = _read_whole_tsv(index.path, "skip")
        if len(raw.labels) + len(bad) != index.rows:
            raise DataError(
                f"{index.path}: has {len(raw.labels) + len(bad)} rows but was indexed with "
                f"{index.rows}; was it modified during the job?"
            )
        entry = (raw.batch(), bad, reasons)
        if self.cache_files:
            self._cache[key] = entry
            while len(self._cache) > self.cache_files:
                self._cache.popitem(last=False)
        return entry

    def _read_seek(self, index: FileIndex, start: int, stop: int) -> tuple[Batch, int]:
        assert index.offsets is not None
        k = start // index.stride
        skip = start - k * index.stride
        need = skip + (stop - start)
        line0 = index.line_nos[k] if index.line_nos is not None else k * index.stride
        try:
            size = os.path.getsize(index.path)
            f = open(index.path, "rb")
        except FileNotFoundError:
            raise DataError(f"{index.path}: no such file") from None
        with f:
            f.seek(index.offsets[k])
            per_row = size / max(index.rows, 1)
            want = int(need * per_row * 1.1) + (64 << 10)
            data = f.read(want)
            while True:
                at_eof = len(data) >= size - index.offsets[k]
                starts, ends, is_row = _line_bounds(data, at_eof)
                row_lines = np.flatnonzero(is_row)
                if len(row_lines) >= need or at_eof:
                    break
                more = f.read(max(want, len(data)))
                if not more:
                    at_eof = True
                    size = index.offsets[k] + len(data)
                    continue
                data += more
        if len(row_lines) < need:
            raise DataError(
                f"{index.path}: ends before row {stop} it was indexed with; "
                "was it modified during the job?"
            )
        first, last = int(row_lines[skip]), int(row_lines[need - 1])
        chunk = data[int(starts[first]) : int(ends[last])]
        raw, bad, _ = _parse(chunk, index.path, line0 + first + 1, self.on_bad_line)
        return raw.batch(), len(bad)

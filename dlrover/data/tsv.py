"""Parsing Criteo TSV bytes into rows, fast.

Parsing is vectorised over ~1 MiB of bytes at a time: separators are located with
numpy, the 40 field boundaries of every row come out of one reshape, and each field's
first 8 bytes are gathered as one uint64 and decoded with a byte lookup table plus
SWAR arithmetic. Only when that fast path sees something wrong do we fall back to
per-line checks, to name the exact ``file:line`` (or to skip bad lines and count them).
"""

from __future__ import annotations

import re

import numpy as np

from dlrover.data.batch import Batch
from dlrover.data.criteo import DENSE_COLUMNS, NUM_DENSE, NUM_FIELDS, NUM_SPARSE, SPARSE_COLUMNS, RawRows, open_binary, read_bytes
from dlrover.errors import DataError

_PIECE = 1 << 20  # bytes parsed at once
_MAX_DIGITS = 18  # longest dense integer that fits int64 without overflow checks
_TAB, _NL, _MINUS = 9, 10, 45

# Hex digit value of every byte, 255 where the byte is not a hex digit.
_NIBBLE = np.full(256, 255, dtype=np.uint8)
_NIBBLE[ord("0") : ord("9") + 1] = np.arange(10)
_NIBBLE[ord("a") : ord("f") + 1] = np.arange(10, 16)
_NIBBLE[ord("A") : ord("F") + 1] = np.arange(10, 16)
# Decimal digit value of every byte, 255 where the byte is not a digit.
_DIGIT = np.full(256, 255, dtype=np.uint8)
_DIGIT[ord("0") : ord("9") + 1] = np.arange(10)


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


def hex_words(words: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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
    values, ok = hex_words(s8.view("<u8"), np.char.str_len(s8))
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


def _fast_parse(data: bytes) -> RawRows | None:
    """Parse well-formed rows; None if anything at all is off (caller then checks
    line by line). ``data`` must end with a newline and contain no blank lines."""
    buf = np.frombuffer(data, dtype=np.uint8)
    seps = np.flatnonzero((buf == _TAB) | (buf == _NL))
    if len(seps) % NUM_FIELDS:
        return None
    n = len(seps) // NUM_FIELDS
    if n == 0:
        return RawRows(*(np.zeros((0, *s), t) for s, t in _EMPTY_SHAPES))
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
    sparse, ok = hex_words(_words(padded, s_start), s_len)
    if not ok.all():
        return None
    return RawRows(
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


def parse_buffer(
    data: bytes, path: str, first_line_no: int, on_bad_line: str
) -> tuple[RawRows, np.ndarray, list[str]]:
    """Parse a buffer of lines; returns the good rows, the row ordinals (among the
    buffer's non-blank lines) of the lines that were skipped, and why.

    Big buffers go in ~1 MiB pieces: the vectorised path allocates several arrays per
    byte, which stay in cache for a piece but not for a whole file.
    """
    data = _normalise(data)
    if len(data) <= _PIECE:
        return _parse_piece(data, path, first_line_no, on_bad_line)
    raws: list[RawRows] = []
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
    merged = RawRows(*(np.concatenate(parts) for parts in zip(*raws)))
    return merged, np.concatenate(bads), reasons


def _parse_piece(
    data: bytes, path: str, first_line_no: int, on_bad_line: str
) -> tuple[RawRows, np.ndarray, list[str]]:
    """:func:`parse_buffer` for a normalised buffer: fast path, else line-by-line checks."""
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
    check_on_bad_line(on_bad_line)
    if not isinstance(lines, (bytes, bytearray, memoryview)):
        lines = b"\n".join(line.rstrip(b"\r\n") for line in lines)
    raw, bad, _ = parse_buffer(bytes(lines), path, first_line_no, on_bad_line)
    return raw.batch(), len(bad)


def check_on_bad_line(on_bad_line: str) -> None:
    """Refuse an unknown ``on_bad_line`` mode up front, not at the first bad line."""
    if on_bad_line not in ("fail", "skip"):
        raise ValueError(f"on_bad_line must be 'fail' or 'skip', got {on_bad_line!r}")



def read_whole_tsv(path: str, on_bad_line: str) -> tuple[RawRows, np.ndarray, list[str]]:
    """A whole (possibly gzip'd) TSV file, parsed as by :func:`parse_buffer`."""
    with open_binary(path) as f:
        data = read_bytes(f, path)
    return parse_buffer(data, path, 1, on_bad_line)

"""Delimited text with named columns (CSV, TSV; a header or ``data.columns``): a block of
whole lines parsed by pyarrow's CSV reader (single-threaded, typed by the schema), then
turned into a :class:`Batch` by :mod:`dlrover.data.columns`.

Lines are rows, so a quoted value may not hold a newline. A line with the wrong number
of fields is a bad row, named ``file:line``; so is a value the schema cannot use.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np

from dlrover.data.columns import Rows, empty_rows, table_to_rows
from dlrover.data.criteo import line_bounds
from dlrover.data.layout import DataLayout
from dlrover.data.schema import IdKind
from dlrover.errors import DataError


def _types(layout: DataLayout, as_text: bool) -> dict[str, Any]:
    """Column types to parse as: numbers for the label and dense columns and integer
    ids, text for the rest (``as_text``: everything text, to find a bad value's row)."""
    import pyarrow as pa

    s = layout.schema
    if as_text:
        return {c: pa.string() for c in layout.required_columns}
    types = {c: pa.float64() for c in ([s.label.column] if layout.labeled else []) + s.dense_columns}
    for f in s.sparse:
        types[f.column] = pa.int64() if f.ids is IdKind.INT and not f.multi else pa.string()
    return types


def _parse(data: bytes, names: list[str], sep: str, types: dict[str, Any], invalid: list[int]) -> Any:
    import pyarrow.csv as pacsv

    def on_invalid(row: Any) -> str:
        invalid.append(row.number)
        return "skip"

    return pacsv.read_csv(
        io.BytesIO(data),
        read_options=pacsv.ReadOptions(column_names=names, use_threads=False, block_size=max(1 << 20, min(len(data) + 1, 1 << 30))),
        parse_options=pacsv.ParseOptions(delimiter=sep, invalid_row_handler=on_invalid),
        convert_options=pacsv.ConvertOptions(column_types=types, include_columns=list(types), strings_can_be_null=False),
    )


def parse_delimited(data: bytes, path: str, first_line_no: int, names: list[str], layout: DataLayout) -> Rows:
    """Whole lines of a delimited file (blank ones allowed), the first being line
    ``first_line_no`` (1-based) -> (good rows, bad row ordinals, reasons)."""
    import pyarrow as pa

    if not data.strip():
        return empty_rows(layout)
    starts, _, is_row = line_bounds(data, at_eof=True)
    row_lines = np.flatnonzero(is_row)  # physical line (0-based in data) of each row
    sep = layout.sep(path)
    invalid: list[int] = []
    try:
        table = _parse(data, names, sep, _types(layout, as_text=False), invalid)
    except pa.ArrowInvalid:  # a value of the wrong type somewhere: parse as text to find it
        invalid = []
        try:
            table = _parse(data, names, sep, _types(layout, as_text=True), invalid)
        except pa.ArrowInvalid as e:
            raise DataError(f"{path}:{first_line_no}: cannot parse: {e}") from None
    parse_bad = np.searchsorted(row_lines, np.asarray(invalid, np.int64) - 1)
    good = np.setdiff1d(np.arange(len(row_lines)), parse_bad)  # the table's rows, as row ordinals
    if len(good) != table.num_rows:
        raise DataError(f"{path}:{first_line_no}: {table.num_rows} rows parsed from {len(good)} lines (a quoted value holding a newline?)")
    where = lambda o: [f"{path}:{first_line_no + int(row_lines[good[i]])}" for i in o]  # noqa: E731
    batch, bad, reasons = table_to_rows(table, layout, path, where)
    field_reasons = [f"{path}:{first_line_no + int(row_lines[r])}: expected {len(names)} {_sep_name(sep)}-separated fields" for r in parse_bad.tolist()]
    merged = sorted([*zip(parse_bad.tolist(), field_reasons), *zip(good[bad].tolist(), reasons)])
    return batch, np.asarray([r for r, _ in merged], np.int64), [why for _, why in merged]


def _sep_name(sep: str) -> str:
    return {"\t": "tab", ",": "comma", ";": "semicolon", "|": "pipe"}.get(sep, repr(sep))

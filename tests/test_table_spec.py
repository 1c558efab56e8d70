"""``model.tables``: per-table id mapping, hashed unless said otherwise."""

from __future__ import annotations

import pytest

from dlrover.errors import SpecError
from dlrover.spec import spec_from_dict
from dlrover.table_spec import Eviction, dynamic_tables


def _spec(tables: dict, **model):
    return spec_from_dict({"data": {"paths": ["x"]}, "model": {"num_embeddings": 1000, "tables": tables, **model}}, "job.yaml")


def test_every_table_is_hashed_when_model_tables_is_absent():
    spec = spec_from_dict({"data": {"paths": ["x"]}})
    assert spec.model.tables == {} and spec.schema.dynamic() == {}


def test_a_dynamic_table_holds_capacity_rows_and_the_others_keep_their_size():
    spec = _spec({3: {"kind": "dynamic", "capacity_rows": 64, "admit_after": 2, "eviction": "lfu"}})
    sizes = spec.schema.table_sizes()
    assert sizes[3] == 64 and sizes[:3] == [1000] * 3 and sizes[4:] == [1000] * 22
    (t, table), = spec.schema.dynamic().items()
    assert t == 3 and table.admit_after == 2 and table.eviction is Eviction.LFU


@pytest.mark.parametrize(
    "tables,needle",
    [
        ({3: {"kind": "dynamic"}}, "model.tables.3: capacity_rows: required for kind: dynamic"),
        ({26: {"kind": "dynamic", "capacity_rows": 8}}, "model.tables.26"),
        ({0: {"kind": "dynamic", "capacity_rows": 8, "eviction": "ttl"}}, "ttl_steps: required for eviction: ttl"),
        ({0: {"kind": "dynamic", "capacity_rows": 8, "ttl_steps": 5}}, "ttl_steps: only for eviction: ttl"),
        ({0: {"capacity_rows": 8}}, "capacity_rows: only for kind: dynamic"),
        ({0: {"kind": "dynamic", "capacity_rows": 8, "eviction": "fifo"}}, "model.tables.0.eviction"),
        ({0: {"kind": "dynamic", "capacity_rows": 0}}, "model.tables.0.capacity_rows"),
        ({0: {"kind": "dynamic", "capacity_rows": 8, "admit_after": -1}}, "model.tables.0.admit_after"),
    ],
)
def test_a_bad_table_setting_names_its_field(tables, needle):
    with pytest.raises(SpecError) as e:
        _spec(tables)
    assert needle in str(e.value), str(e.value)


def test_a_dynamic_table_with_fewer_rows_than_vshards_is_refused_naming_both():
    with pytest.raises(SpecError, match=r"model\.tables\.3\.capacity_rows: 32 is below train\.vshards \(64\)"):
        _spec({3: {"kind": "dynamic", "capacity_rows": 32}})
    spec = spec_from_dict({"data": {"paths": ["x"]}, "model": {"tables": {3: {"kind": "dynamic", "capacity_rows": 32}}}, "train": {"vshards": 32}})
    assert spec.schema.table_sizes()[3] == 32

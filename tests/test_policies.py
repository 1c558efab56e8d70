"""Allocation policies: static and scripted, the history store, and the policies' knob
files. DLRover-RM's three stages are in test_dlrover_rm.py.

No Ray: every JobView is built by hand (policy_views.py).
"""

from __future__ import annotations

import json
import logging

import pytest
import yaml

from dlrover.errors import SpecError
from dlrover.resource.configs import Budget
from dlrover.resource.history import HistoryStore, dataset_signature, job_signature
from dlrover.resource.perf_model import PerfModel
from dlrover.resource.policies import load_policy
from dlrover.resource.policy_config import (
    KNOBS,
    POLICIES_DIR,
    DLRoverRMKnobs,
    knob_search_space,
    load_knobs,
)
from dlrover.resource.scripted import ScriptedPolicy
from dlrover.resource.static import StaticPolicy
from policy_views import B, cfg, mk_view, ps, record


# ------------------------------------------------------------------ static / scripted


def test_static_keeps_the_request():
    pol = load_policy("static")
    assert isinstance(pol, StaticPolicy)
    want = cfg(3, 2, 2, 1)
    v = mk_view(config=cfg(1, 1), requested=want, actors={"ps-0": ps("ps-0", busy=0.99)})
    assert pol.initial(v).config == want
    v.config = want
    for t in (100.0, 5000.0):
        v.now_s = t
        assert pol.decide(v) is None


def test_scripted_fires_steps_in_order_once_each():
    pol = load_policy(
        "scripted",
        overrides={
            "steps": [
                {"at_s": 10, "workers": 4},
                {"at_progress": 0.5, "ps": 2, "ps_cpu": 2, "rebalance_ps": True},
                {"at_s": 5, "replace": ["w-1"]},  # due early, but fires only after step 2
            ]
        },
    )
    assert isinstance(pol, ScriptedPolicy)
    v = mk_view(now_s=0.0, progress=0.0)
    assert pol.initial(v).config == v.config
    assert pol.decide(v) is None  # t=0: nothing due
    v.now_s = 20.0
    p1 = pol.decide(v)
    assert p1 is not None and p1.config == cfg(4, 1) and p1.stage == "scripted" and not p1.replace
    v.config = p1.config
    assert pol.decide(v) is None  # step 2 waits for progress; step 3 waits for step 2
    v.progress = 0.6
    p2 = pol.decide(v)
    assert p2 is not None and p2.config == cfg(4, 2, 1, 2) and p2.rebalance_ps
    v.config = p2.config
    p3 = pol.decide(v)
    assert p3 is not None and p3.replace == ["w-1"] and p3.config == v.config
    for _ in range(3):
        assert pol.decide(v) is None


def test_scripted_clips_to_budget_and_validates_triggers():
    pol = load_policy("scripted", overrides={"steps": [{"at_s": 0, "workers": 50}]})
    p = pol.decide(mk_view(budget=Budget(cpu=8, memory_mb=100_000)))
    assert p is not None and p.config.fits(Budget(cpu=8, memory_mb=100_000)) and "clipped" in p.reason
    with pytest.raises(SpecError, match=r"policy\.knobs\.steps\.0: exactly one of at_progress, at_s"):
        load_policy("scripted", overrides={"steps": [{"at_s": 1, "at_progress": 0.5, "workers": 2}]})
    with pytest.raises(SpecError, match=r"policy\.knobs\.steps\.0: exactly one"):
        load_policy("scripted", overrides={"steps": [{"workers": 2}]})


# ------------------------------------------------------------------ history


def test_history_round_trip_newest_first_and_corrupt_files_skipped(tmp_path, caplog):
    store = HistoryStore(tmp_path / "hist")
    old = record("job-old", cfg(4, 2), 900.0, 1000.0, measurements=[(cfg(2, 1), 500.0), (cfg(4, 2), 900.0)], samples=10, wall_time_s=60.0)
    new = record("job-new", cfg(8, 2), 1500.0, 2000.0, perf_model=PerfModel(B).to_dict())
    other = record("job-other", cfg(1, 1), 10.0, 3000.0, sig="m-other")
    other_data = record("job-data", cfg(2, 2), 20.0, 2500.0, dataset="d-2")
    for r in (old, new, other, other_data):
        path = store.add(r)
        assert path.is_file() and path.suffix == ".json"
    assert not list((tmp_path / "hist").glob(".tmp-*"))
    (tmp_path / "hist" / "9999999999999-broken.json").write_text("{not json")
    (tmp_path / "hist" / "9999999999998-partial.json").write_text(json.dumps({"signature": "m-x"}))

    with caplog.at_level(logging.WARNING):
        got = store.similar("m-x", dataset="d-1")
    assert [r.job_id for r in got] == ["job-new", "job-old"]
    assert got[1] == old and got[0] == new  # exact round trip
    assert got[1].measured() == [(cfg(2, 1), 500.0, 60.0), (cfg(4, 2), 900.0, 60.0)]
    assert sum("skipping unreadable record" in m for m in caplog.messages) == 2
    assert [r.job_id for r in store.similar("m-x")] == ["job-data", "job-new", "job-old"]
    assert [r.job_id for r in store.similar("m-x", limit=1)] == ["job-data"]
    assert store.similar("m-none") == [] and HistoryStore(tmp_path / "absent").similar("m-x") == []


def test_signatures_are_stable_and_discriminating():
    model = {"embedding_dim": 16, "num_embeddings": 1000, "dense_arch": [64, 16], "over_arch": [32, 1]}
    same = dict(model, num_embeddings=[1000] * 26)
    assert job_signature(model, 512) == job_signature(same, 512) == job_signature(dict(reversed(model.items())), 512)
    assert job_signature(model, 512) != job_signature(model, 1024)
    assert job_signature(model, 512) != job_signature(dict(model, embedding_dim=8), 512)
    assert dataset_signature(["/a/x.tsv", "/a/y.tsv"], 100) == dataset_signature(["/b/y.tsv", "/b/x.tsv"], 100)
    assert dataset_signature(["/a/x.tsv"], 100) != dataset_signature(["/a/x.tsv"], 101)


# ------------------------------------------------------------------ knob files


def test_policy_files_equal_the_defaults():
    files = sorted(POLICIES_DIR.glob("*.yaml"))
    assert {"static", "dlrover_rm", "optimus"} <= {f.stem for f in files}
    for f in [f for f in files if f.stem in KNOBS]:  # (dlrover tune may have written policies/tuned.yaml)
        assert yaml.safe_load(f.read_text())["name"] == f.stem
        assert load_knobs(f.stem, str(f)) == KNOBS[f.stem](), f
    text = (POLICIES_DIR / "dlrover_rm.yaml").read_text().splitlines()
    knob_lines = [ln for ln in text if ln.startswith("  ") and ":" in ln and not ln.strip().startswith("#")]
    assert len(knob_lines) >= len(DLRoverRMKnobs.model_fields)
    assert all("#" in ln for ln in knob_lines)  # every knob documented on its line
    space = knob_search_space("dlrover_rm")
    assert space["min_gain"]["search"] == [0.01, 0.3] and space["max_changes"]["type"] == "int"
    for name, s in space.items():
        default = getattr(DLRoverRMKnobs(), name)
        if isinstance(s["search"], list):
            assert default is None or s["search"][0] <= default <= s["search"][1], name  # None: off unless tuned
        else:
            assert default in s["search"]["choices"], name


def test_bad_policy_files_are_one_line_spec_errors(tmp_path):
    def write(text):
        p = tmp_path / "p.yaml"
        p.write_text(text)
        return str(p)

    cases = [
        ("name: dlrover_rm\nknobs:\n  min_gian: 0.1\n", r"p\.yaml: knobs\.min_gian: unknown field"),
        ("name: dlrover_rm\nknobs:\n  default_config: {workers: 0}\n", r"p\.yaml: knobs\.default_config\.workers: .*greater than or equal to 1"),
        ("name: dlrover_rm\nknobs:\n  worker_cpu_choices: []\n", r"knobs\.worker_cpu_choices: needs at least one"),
        ("name: static\nknobs: {}\n", r"p\.yaml: name: file is for policy 'static', not 'dlrover_rm'"),
        ("name: dlrover_rm\nknobs: [1\n", r"p\.yaml:\d+: "),
        ("- 1\n", r"p\.yaml: expected a YAML mapping"),
    ]
    for text, pattern in cases:
        with pytest.raises(SpecError, match=pattern) as e:
            load_policy("dlrover_rm", write(text))
        assert "\n" not in str(e.value)
    with pytest.raises(SpecError, match=r"job\.yaml: policy\.knobs\.hot_ps_busy: .*less than or equal to 1"):
        load_policy("dlrover_rm", str(POLICIES_DIR / "dlrover_rm.yaml"), {"hot_ps_busy": 2}, overrides_source="job.yaml")
    with pytest.raises(SpecError, match=r"unknown policy 'nope'"):
        load_policy("nope")
    with pytest.raises(SpecError, match=r"policy file not found"):
        load_policy("static", str(tmp_path / "absent.yaml"))
    ok = load_policy("dlrover_rm", write("name: dlrover_rm\nknobs:\n  min_gain: 0.2\n"), {"cooldown_s": 5})
    assert (ok.knobs.min_gain, ok.knobs.cooldown_s, ok.knobs.hot_ps_busy) == (0.2, 5.0, 0.9)

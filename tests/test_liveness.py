"""Liveness with real signals to real processes: a frozen worker (SIGSTOP) and OS-level
SIGKILLs of a worker's, a PS's and the master's process.

A thread of the test waits until the job trains, asks the victim actor for its pid and
sends the signal; the job must then finish with every sample trained once by the books,
none lost, and the failure in its summary with detection and recovery times.
"""

from __future__ import annotations

import signal

import pytest

from conftest import check_exactly_once, fault_spec, signal_when_training, sleepy


def liveness_spec(data_dir, tmp_path, epochs: int = 1, **over):
    """``fault_spec`` for ``epochs``, both first workers sleeping twice each step's time after
    it (``slow``, factor 3: no update changes): the job lasts as long as 3x the epochs
    (detection and recovery within it), at their CPU."""
    return fault_spec(data_dir, tmp_path, sleepy(3), data__epochs=epochs, **over)


def run_with_signal(spec, tmp_path, actor: str, sig: int) -> tuple[dict, dict]:
    from dlrover.driver.runner import run_job

    job_id = f"sig-{actor}-{sig}"
    out: dict = {}
    t = signal_when_training(job_id, actor, sig, out)
    s, _ = run_job(spec, runs_dir=str(tmp_path / "runs"), progress="none", job_id=job_id)
    t.join(timeout=5)
    assert "pid" in out, "the signal was never sent"
    return s, out


def check_survived(s: dict, kind: str) -> dict:
    assert s["status"] == "succeeded", s.get("status")
    assert s["samples_lost"] == 0 and s["samples_trained"] == s["samples_expected"]
    failures = [f for f in s["failures"] if f["kind"] == kind]
    assert failures, s["failures"]
    f = failures[0]
    assert f["at_s"] <= f["detected_s"] <= f["recovered_s"], f
    print(f"{kind}: detected after {f['detected_s'] - f['at_s']:.1f}s, training again after {f['recovered_s'] - f['at_s']:.1f}s, "
          f"replayed {s['samples_replayed']}, lost {s['samples_lost']}, wall {s['wall_time_s']:.1f}s")
    return f


def gone(pid: int, within_s: float = 30.0) -> bool:
    """The process is dead (or a zombie) now or within ``within_s``."""
    import time

    import psutil

    deadline = time.monotonic() + within_s
    while True:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)


def test_a_frozen_worker_is_declared_hung_killed_and_replaced(ray_local, synth_dir_large, tmp_path):
    spec = liveness_spec(synth_dir_large, tmp_path, train__liveness_timeout_s=6.0)
    s, out = run_with_signal(spec, tmp_path, "worker-0", signal.SIGSTOP)
    f = check_survived(s, "worker_hang")
    assert f["actor"].endswith("/worker-0") and f["replacement"] and f["shards_requeued"] >= 1
    assert f["detected_s"] - f["at_s"] >= 6.0  # silent for the whole timeout first
    assert gone(out["pid"])  # its process was killed, not left stopped
    check_exactly_once(s, spec)


def test_a_sigkilled_worker_process_is_replaced(ray_local, synth_dir_large, tmp_path):
    spec = liveness_spec(synth_dir_large, tmp_path)
    s, out = run_with_signal(spec, tmp_path, "worker-1", signal.SIGKILL)
    f = check_survived(s, "worker_death")
    assert f["actor"].endswith("/worker-1") and f["replacement"]
    check_exactly_once(s, spec)  # the PS kept their state: no rollback, no batch applied twice


def test_a_sigkilled_ps_process_is_recovered_from_a_checkpoint(ray_local, synth_dir_large, tmp_path):
    s, out = run_with_signal(liveness_spec(synth_dir_large, tmp_path), tmp_path, "ps-0", signal.SIGKILL)
    f = check_survived(s, "ps_death")
    assert f["actor"].endswith("/ps-0") and f["checkpoint"]["at_s"] <= f["at_s"]
    assert s["samples_replayed"] == f["samples_replayed"] >= 0


@pytest.mark.timeout(600)
def test_a_sigkilled_master_process_resumes_from_its_durable_checkpoint(ray_local, synth_dir_large, tmp_path):
    s, out = run_with_signal(liveness_spec(synth_dir_large, tmp_path, epochs=2), tmp_path, "master", signal.SIGKILL)
    f = check_survived(s, "master_death")
    assert f["checkpoint"]["source"] == "durable" and f["restarts"] == 1

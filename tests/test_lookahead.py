"""Adaptive pull-ahead (``dlrover/worker/lookahead.py``): pure logic, no Ray; and the
arguments of the bench that measures it (``dlrover bench slow-link``)."""

from dataclasses import dataclass

import pytest

from dlrover.worker.lookahead import GROW_SHARE, HELPS, HOLD_WINDOWS, QUIET_WINDOWS, WINDOW_STEPS, Lookahead, PullAhead, ring_slots


def window(control: PullAhead, wait_share: float, step_s: float = 0.1) -> None:
    for _ in range(WINDOW_STEPS):
        control.observe(wait_share * step_s, step_s)


def link(control: PullAhead, latency_s: float = 0.2, compute_s: float = 0.07) -> None:
    """One window behind a link: each step waits for what ``depth`` batches of steps
    ahead did not hide, w = (L - d*S) / (d + 1) (steady state)."""
    wait = max(0.0, (latency_s - control.depth * compute_s) / (control.depth + 1))
    window(control, wait / (compute_s + wait), compute_s + wait)


def test_a_window_waiting_for_pulls_lets_them_run_one_batch_further_ahead():
    control = PullAhead.of(staleness=1, bound=4)
    window(control, 2 * GROW_SHARE)
    assert control.depth == 2


def test_the_depth_changes_only_at_the_end_of_a_window():
    control = PullAhead.of(staleness=1, bound=4)
    for _ in range(WINDOW_STEPS - 1):
        control.observe(0.09, 0.1)
    assert control.depth == 1
    control.observe(0.09, 0.1)
    assert control.depth == 2


def test_behind_a_slow_link_pulls_go_as_deep_as_hides_it_and_no_deeper():
    control = PullAhead.of(staleness=1, bound=8)
    for _ in range(12):
        link(control)  # 200 ms, 70 ms of compute: three batches ahead hide it
    assert control.depth == 3 and control.peak == 3


def test_the_depth_stops_at_max_staleness():
    control = PullAhead.of(staleness=1, bound=2)
    for _ in range(12):
        link(control)
    assert control.depth == 2 and control.peak == 2


def test_a_step_deeper_that_does_not_shorten_the_steps_is_taken_back_and_not_retried_for_a_while():
    control = PullAhead.of(staleness=1, bound=4)
    window(control, 0.5)  # a busy PS: waiting, whatever the depth
    assert control.depth == 2
    window(control, 0.5)  # settling: batches pulled before the step deeper
    assert control.depth == 2
    window(control, 0.5, step_s=0.1 * HELPS * 1.01)  # not shorter enough
    assert control.depth == 1 and control.peak == 2
    for _ in range(HOLD_WINDOWS - 1):
        window(control, 0.5)
    assert control.depth == 1
    window(control, 0.5)
    assert control.depth == 2


def test_pulls_come_one_batch_back_only_after_a_run_of_quiet_windows():
    control = PullAhead.of(staleness=1, bound=4)
    for _ in range(5):  # deeper, settle, compare and deeper, settle, compare
        link(control, latency_s=0.1, compute_s=0.04)  # three ahead hide it
    assert control.depth == 3  # and its last window waited no more: the first quiet one
    for _ in range(QUIET_WINDOWS - 2):
        window(control, 0.0)
    assert control.depth == 3
    window(control, 0.0)
    assert control.depth == 2 and control.peak == 3


def test_a_window_between_quiet_and_waiting_restarts_the_quiet_count():
    control = PullAhead.of(staleness=1, bound=4)
    window(control, 0.5)
    window(control, 0.0)  # settling
    window(control, 0.0, step_s=0.05)  # the step deeper helped
    for _ in range(QUIET_WINDOWS - 2):
        window(control, 0.0)
    window(control, GROW_SHARE / 2)  # neither quiet nor waiting long enough to grow
    window(control, 0.0)
    assert control.depth == 2


def test_the_depth_never_goes_under_the_staleness():
    control = PullAhead.of(staleness=1, bound=4)
    for _ in range(3 * QUIET_WINDOWS):
        window(control, 0.0)
    assert control.depth == 1


def test_a_fixed_staleness_never_adapts():
    control = PullAhead.of(staleness=1, bound=1)
    for _ in range(5):
        window(control, 0.9)
    assert control.depth == 1 and control.peak == 1


def test_shared_memory_slots_outnumber_the_lookups_a_worker_may_not_have_read():
    # Unread: the batch in training and up to ``bound`` ahead; one more for the push
    # still reading a gradient. A slot taken again any sooner would overwrite an answer.
    for bound in range(9):
        assert ring_slots(bound) >= bound + 3


@dataclass
class FakeInput:
    """Batches 0..n-1, then the end; ``ready`` of them can be had without waiting."""

    n: int
    ready: int
    next: int = 0

    def poll(self):
        if self.next >= self.n:
            return None, True
        if self.next >= self.ready:
            return None, False
        self.next += 1
        return self.next - 1, False


def test_lookahead_issues_pulls_up_to_the_depth_behind_the_next_batch():
    pulled = []
    source = FakeInput(n=10, ready=10)
    ahead = Lookahead(source.poll, pulled.append, PullAhead.of(1, 4))
    ahead.fill()
    assert pulled == [0, 1] and ahead.pop() == 0
    ahead.control.depth = 3
    ahead.fill()
    assert pulled == [0, 1, 2, 3, 4] and len(ahead) == 4


def test_lookahead_takes_only_the_batches_input_has_ready():
    pulled = []
    source = FakeInput(n=10, ready=1)
    ahead = Lookahead(source.poll, pulled.append, PullAhead.of(1, 4))
    ahead.fill()
    assert pulled == [0] and not ahead.ended


def test_lookahead_notes_the_end_of_input():
    source = FakeInput(n=1, ready=1)
    ahead = Lookahead(source.poll, lambda step: None, PullAhead.of(1, 4))
    ahead.fill()
    ahead.fill()
    assert ahead.ended and len(ahead) == 1


@pytest.mark.parametrize(
    "args, field",
    [(["--max-staleness", "1"], "--max-staleness"), (["--max-staleness", "9"], "--max-staleness"), (["--latency-ms", "0"], "--latency-ms"), (["--rows", "-5"], "--rows")],
)
def test_bad_slow_link_bench_arguments_are_one_line_naming_the_flag(args, field, capsys):
    from dlrover.cli.main import main

    with pytest.raises(SystemExit) as e:
        main(["bench", "slow-link", *args])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and field in err[0]

"""A local Ray head (``dlrover.driver.localhead``): its ports and a start that dies, without Ray."""

from __future__ import annotations

import socket

import pytest

from dlrover.driver import localhead
from dlrover.errors import DLRoverError


def test_a_port_is_free_outside_the_kernels_ephemeral_range_and_never_handed_out_twice(monkeypatch):
    monkeypatch.setattr(localhead, "ephemeral_range", lambda: (20000, 60000))
    ports = [localhead.free_port() for _ in range(40)]
    assert len(set(ports)) == len(ports)
    assert all(60000 < p <= 65535 for p in ports)
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[-1]))  # it was free


def test_no_port_left_outside_the_ephemeral_range_is_a_one_line_error(monkeypatch):
    monkeypatch.setattr(localhead, "ephemeral_range", lambda: (1024, 65535))
    with pytest.raises(DLRoverError, match="no free loopback port"):
        localhead.free_port()


def test_a_head_that_dies_while_starting_is_started_once_more_then_named_with_its_last_words(monkeypatch, tmp_path):
    """A stand-in ``ray`` that counts its starts and dies as a raylet losing its dashboard
    agent would: two starts, then one line with the head's own last words."""
    import stat

    count = tmp_path / "starts"
    fake = tmp_path / "ray"
    fake.write_text(f"#!/bin/sh\necho x >> {count}\necho 'INFO starting'\necho 'Some Ray subprocesses exited unexpectedly: raylet [exit code=1]'\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setattr(localhead.shutil, "which", lambda *a, **k: str(fake))
    with pytest.raises(DLRoverError, match=r"exited with code 1: Some Ray subprocesses exited unexpectedly: raylet \[exit code=1\]$"):
        with localhead.LocalHead():
            pass
    assert len(count.read_text().splitlines()) == 2

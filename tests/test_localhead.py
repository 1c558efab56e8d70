"""Ports of a local Ray head (``dlrover.driver.localhead.free_port``): pure logic, no Ray."""

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

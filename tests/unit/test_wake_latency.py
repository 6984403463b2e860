"""qemu/wake_latency.py against the kernel's own PM QoS device (read back: the request the
kernel holds now)."""
from __future__ import annotations

import logging
import os
import struct
from pathlib import Path

import pytest

from tandem.qemu import wake_latency


def current_request() -> int:
    return struct.unpack("=i", wake_latency.PM_QOS.read_bytes()[:4])[0]


@pytest.mark.skipif(os.geteuid() != 0 or not wake_latency.PM_QOS.exists(), reason="PM QoS needs root")
def test_the_kernel_holds_a_zero_latency_request_while_inside_and_not_after():
    before = current_request()      # another process (a tandem replay) may hold one too
    with wake_latency.held() as holding:
        assert holding
        assert current_request() == 0
    assert current_request() == before


def test_cpu_idle_leaves_the_host_as_it_is(tmp_path):
    device = tmp_path / "cpu_dma_latency"
    with wake_latency.held(False, device) as holding:
        assert not holding
    assert not device.exists()


def test_a_device_that_cannot_be_opened_is_said_once_and_the_run_goes_on(tmp_path, caplog):
    device = tmp_path / "no-such-dir" / "cpu_dma_latency"
    wake_latency._said.clear()
    with caplog.at_level(logging.INFO, logger="tandem.qemu.wake_latency"):
        for _ in range(2):
            with wake_latency.held(True, device) as holding:
                assert not holding
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and str(device) in said[0], said


def test_a_device_that_refuses_the_request_is_said_once_and_the_run_goes_on(tmp_path, caplog):
    wake_latency._said.clear()
    with caplog.at_level(logging.INFO, logger="tandem.qemu.wake_latency"):
        with wake_latency.held(True, Path("/dev/full")) as holding:     # opens, and refuses every write
            assert not holding
    assert any("/dev/full" in r.getMessage() for r in caplog.records)

"""Hold the host's CPUs out of their idle states while analysis VMs run in lockstep.

An analysis VM stops at every horizon and waits for tandem's driver (semantic/driving/driver.py):
some 25,000 stops in a 20 s heavy recording's KASAN replay, each a round of wake-ups
across the host's CPUs (QEMU's vCPU thread to tandem, tandem to QEMU's main loop, the
main loop to the vCPU). A CPU that has gone idle in a halt takes long to wake on a host
that is itself a VM: on this machine (a KVM guest with cpuidle's haltpoll driver and
guest_halt_poll_ns=0) a unix-socket ping-pong between two threads on its two CPUs took
121-124 us per round trip, median, and 30-33 us with this held (four runs each).
In the heavy KASAN replay that was 100-104 s of wall time against 75-78 s, alternating.

The kernel's PM QoS interface holds the request while the file stays open
(Documentation/power/pm_qos_interface.rst; as cyclictest and tuned's latency-performance
profile use it): a CPU then polls instead of halting, which costs the host power while
analyses run. `--cpu-idle` leaves the host as it is. Opening the file needs root; without
it tandem says so once and goes on.
"""
from __future__ import annotations

import logging
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger(__name__)

PM_QOS = Path("/dev/cpu_dma_latency")
_said: set[str] = set()     # why it could not be held, said once per process


@contextmanager
def held(enabled: bool = True, device: Path = PM_QOS) -> Iterator[bool]:
    """While inside, the host's CPUs wake at once (a 0 us PM QoS latency request); yields
    whether the request is held."""
    if not enabled:
        yield False
        return
    try:
        f = open(device, "wb", buffering=0)
        try:
            f.write(struct.pack("=i", 0))
        except OSError:
            f.close()
            raise
    except OSError as e:
        why = e.strerror or str(e)
        if why not in _said:
            _said.add(why)
            log.info("the host's CPUs may idle while analyses run (%s: %s); each of an analysis "
                     "VM's stops then waits for a CPU to wake", device, why)
        yield False
        return
    with f:
        log.debug("holding %s at 0 us while analyses run", device)
        yield True

"""A replay's device log compared with its recording's while QEMU writes it, so that a
replay that has departed from its recording can be stopped once it has shown what the
departure led to (`tandem replay --locate`), instead of run to its end or, as a replay
that departed often does, until it is found hung.

The replay's log is followed as it grows (pcapng.DevlogReader, as `tandem shadow` follows a
native's). Its events are compared with the recording's in order, its outputs with the
recording's outputs, its state checkpoints with the recording's. The replay is done when,
having departed, it has sent an output that differs, or run GRACE_NS of VM time past the
departure without one (the output it led to is then one it did not send), or its VM clock
has stood still for STILL_S.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path

from ..errors import BundleError
from ..formats import pcapng
from .verify import compare_events

GRACE_NS = 1_000_000_000    # VM time a departed replay runs on for the output it leads to
STILL_S = 5.0               # host seconds a departed replay's VM clock may stand still


class DepartureWatch:
    def __init__(self, recorded: pcapng.Devlog, replayed: Path):
        self.recorded = recorded
        self.path = replayed
        self._outs = [e for e in recorded.events if e.direction == "out"]
        self.departed_ns: int | None = None     # the VM time of the first difference seen
        self.led = False                        # an output differs
        self._states = 0                        # checkpoints compared
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="departure-watch", daemon=True)
        self._clock: int | None = None
        self._since = time.monotonic()

    def start(self) -> "DepartureWatch":
        self._thread.start()
        return self

    def close(self) -> None:
        self._closed.set()
        self._thread.join(10)

    def done(self, clock: int | None) -> bool:
        """Whether to stop the replay, its VM clock now `clock`."""
        if clock != self._clock:
            self._clock, self._since = clock, time.monotonic()
        if self.departed_ns is None:
            return False
        if self.led or (clock is not None and clock > self.departed_ns + GRACE_NS):
            return True
        return time.monotonic() - self._since > STILL_S

    def _depart(self, vm_ns: int) -> None:
        if self.departed_ns is None:
            self.departed_ns = vm_ns

    def _follow(self) -> None:
        reader = pcapng.DevlogReader(self.path, follow=lambda: self._waiting(reader))
        events, outs = self.recorded.events, 0
        try:
            for i, b in enumerate(reader):
                if i >= len(events) or compare_events(events[i], b):
                    self._depart(b.vm_ns)
                if b.direction == "out":
                    if outs >= len(self._outs) or compare_events(self._outs[outs], b):
                        self._depart(b.vm_ns)
                        self.led = True
                        return
                    outs += 1
                self._check_states(reader)
        except BundleError:
            return      # a log cut as its QEMU ends: what was read stands

    def _waiting(self, reader: pcapng.DevlogReader) -> bool:
        """At the end of the log so far: compare the checkpoints; whether to wait for more."""
        self._check_states(reader)
        return not self._closed.is_set()

    def _check_states(self, reader: pcapng.DevlogReader) -> bool:
        """Compare the checkpoints read since the last call; whether one differs."""
        rec = self.recorded.states
        while self._states < min(len(reader.states), len(rec)):
            a, b = rec[self._states], reader.states[self._states]
            if (a.icount, a.vm_ns, a.data) != (b.icount, b.vm_ns, b.data):
                self._depart(min(a.vm_ns, b.vm_ns))
                return True
            self._states += 1
        return False

"""The one lifecycle of tandem's long-lived objects: a QEMU (qemu/vm.VM), a feed's socket
(qemu/feed.FeedServer), the release gate (live/gate.Gate), analyses trailing a recording
(semantic/trail.Trail), a live shadow run (live/shadow.ShadowRun), a private libvirtd
(libvirt/daemon.Libvirtd) and a recording (record/recording.Recording).

- `start()` begins: it makes what the object holds (a process, a socket, threads) and
  returns the object.
- `close()` ends it and releases everything it holds. It is idempotent, and safe on an
  object that never started or whose start() failed part way: whatever that start made
  is released.
- `with obj:` starts it unless it has started, and closes it at the block's end. A
  start() that fails there is closed before the error goes on (a `with` block's exit
  does not run when its entry fails). An object that lives within one function is used
  in `with` (several in one `contextlib.ExitStack`); one that holds others closes them in
  its own close().

Verbs that wait for a result are not a second way to close: `Recording.finish()` (the
guest's own end, the sealed manifest), `ShadowRun.finish()` (the run's summary),
`Trail.join()` and `Gate.join()` (the end of what their threads run) wait and give what
was made; close() afterwards releases what is left. A Recording's `with` block that ends
without an error finishes it first (its bundle is the block's result).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Self


class Lifecycle(ABC):
    """Base of the objects above: each says how it starts, closes and knows it has started."""

    @abstractmethod
    def start(self) -> Self:
        """Begin: make what the object holds; returns the object."""

    @abstractmethod
    def close(self) -> None:
        """End and release everything (idempotent; safe unstarted or after a failed start)."""

    @property
    @abstractmethod
    def started(self) -> bool:
        """start() has run (it may have failed part way: close() still releases)."""

    def __enter__(self) -> Self:
        if not self.started:
            try:
                self.start()
            except BaseException:
                self.close()
                raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

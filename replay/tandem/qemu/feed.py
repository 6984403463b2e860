"""The feed's wire protocol between tandem and an analysis QEMU (qemu-patches/0027).

Both directions: a 16-byte little-endian header {u32 payload length, u16 type,
u16 channel, u64 VM-clock ns} and the payload. tandem sends inputs and horizon
advances; QEMU sends what the guest outputs and WAIT when the VM stops (its
channel says why: at the horizon, or idle at the warp bound a horizon may carry,
qemu-patches/0031), and SHUTDOWN (with QEMU's reason) after the guest's last output.
tandem may also send release rules (RULE, qemu-patches/0034): frames QEMU delivers
itself once the guest's TCP output has reached given sequence numbers; QEMU says
FIRED, with the acknowledgements the frames carried, for each in order.
QEMU connects to tandem's unix socket at start.

`FeedConnection` is what a driver (semantic/driving/driver.AnalysisDriver) asks of the
feed: FeedServer below, or a scripted stand-in (tests/unit/scripted_feed.ScriptedFeed).
"""
from __future__ import annotations

import socket
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from .. import private
from ..errors import InfraError, TandemError
from ..lifecycle import Lifecycle

HEADER = struct.Struct("<IHHQ")
INPUT, HORIZON, END, RULE, UNRULE, OUTPUT, WAIT, SHUTDOWN, FIRED = 1, 2, 3, 4, 5, 16, 17, 18, 19
# QEMU's ShutdownCause, in its QAPI order: the channel of a SHUTDOWN message.
SHUTDOWN_CAUSES = ["none", "host-error", "host-qmp-quit", "host-qmp-system-reset", "host-signal",
                   "host-ui", "guest-shutdown", "guest-reset", "guest-panic", "subsystem-reset",
                   "snapshot-load"]
NET, SERIAL, RNG = 1, 2, 3
WAIT_HORIZON, WAIT_IDLE = 0, 1      # the channel of a WAIT message
MAX_PAYLOAD = 1 << 20
RULE_HEAD = struct.Struct("<HH")      # entries, frames
RULE_ENTRY = struct.Struct("<II")     # after the 12-byte 4-tuple: sequence number, flags
RULE_ACKS = 1                         # an entry that is no condition: where the frames' ACK reaches
RULE_OWN = 2                          # a condition on the frames' own connection: a lookahead after it


@dataclass
class Message:
    type: int
    channel: int
    vm_ns: int
    data: bytes


class FeedConnection(Protocol):
    """The feed as a driver uses it: what it queues (inputs, horizons, release rules) goes
    to QEMU at flush(); receive(timeout) gives QEMU's messages ([] when none came within
    timeout s), None once QEMU has closed the feed."""

    def input(self, channel: int, vm_ns: int, data: bytes) -> None: ...

    def horizon(self, vm_ns: int, warp_ns: int | None = None) -> None: ...

    def rule(self, not_before_ns: int, conds: list[tuple[bytes, int, bool]], acks: tuple[bytes, int],
             frames: list[bytes]) -> None: ...

    def unrule(self) -> None: ...

    def flush(self) -> None: ...

    def receive(self, timeout: float) -> list[Message] | None: ...


class FeedServer(Lifecycle):
    """Listens for one QEMU (start(): the socket at `path`, which QEMU connects to as it
    starts); accept() waits for it; then sends inputs, receives outputs and waits."""

    def __init__(self, path: Path):
        self.path = path
        private.require_private_dir(Path(path).parent, f"feed socket {path}")
        self.listener: socket.socket | None = None
        self.conn: socket.socket | None = None
        self.buf = bytearray()
        self.out = bytearray()
        self._rx: bytearray | None = None
        self._closed = False

    @property
    def started(self) -> bool:
        return self.listener is not None

    def start(self) -> FeedServer:
        """Listen at `path`, before QEMU starts: it connects as it starts."""
        listener = socket.socket(socket.AF_UNIX)
        try:
            listener.bind(str(self.path))
            listener.listen(1)
        except OSError as e:        # the path is taken, or too long for a unix socket
            listener.close()
            raise TandemError(f"feed socket {self.path}: {e.strerror or e}") from None
        self.listener = listener
        return self

    def accept(self, timeout: float) -> None:
        """Wait up to `timeout` s for QEMU to connect."""
        if self.listener is None:
            raise TandemError(f"{self.path}: the feed is not listening (not started)")
        self.listener.settimeout(timeout)
        try:
            self.conn, _ = self.listener.accept()
        except socket.timeout:
            raise InfraError(f"analysis QEMU did not connect to {self.path} within {timeout:.0f}s") from None
        self.conn.settimeout(None)

    def _connection(self) -> socket.socket:
        """QEMU's connection, once accept() has it."""
        if self.conn is None:
            raise InfraError(f"{self.path}: no analysis QEMU connected yet")
        return self.conn

    def input(self, channel: int, vm_ns: int, data: bytes) -> None:
        self.out += HEADER.pack(len(data), INPUT, channel, vm_ns) + data

    def horizon(self, vm_ns: int, warp_ns: int | None = None) -> None:
        """The VM may run to vm_ns; with warp_ns (< vm_ns), an idle VM warps no further
        than warp_ns: it executes up to the horizon but idles at the warp bound."""
        if warp_ns is None or warp_ns >= vm_ns:
            self.out += HEADER.pack(0, HORIZON, 0, vm_ns)
        else:
            self.out += HEADER.pack(8, HORIZON, 0, vm_ns) + struct.pack("<q", warp_ns)

    def rule(self, not_before_ns: int, conds: list[tuple[bytes, int, bool]], acks: tuple[bytes, int],
             frames: list[bytes]) -> None:
        """A release rule: `frames` go once the guest's TCP output has reached, on each
        connection of `conds` (its 12-byte 4-tuple as the guest sends it, the sequence
        number, whether the frames go on it), the given sequence number: a lookahead
        after it on their own connection, at once on others; not before not_before_ns.
        acks: the connection the frames go on and how far they will acknowledge the
        guest's bytes there (its output up to there needs no stop)."""
        entries = [(key, seq, RULE_OWN if own else 0) for key, seq, own in conds] + [(acks[0], acks[1], RULE_ACKS)]
        body = bytearray(RULE_HEAD.pack(len(entries), len(frames)))
        for key, seq, flags in entries:
            body += key + RULE_ENTRY.pack(seq, flags)
        for fr in frames:
            body += struct.pack("<I", len(fr)) + fr
        self.out += HEADER.pack(len(body), RULE, 0, not_before_ns) + body

    def unrule(self) -> None:
        """Drop the release rules not fired yet."""
        self.out += HEADER.pack(0, UNRULE, 0, 0)

    def send(self, type_: int, channel: int, value: int, data: bytes = b"") -> None:
        self.out += HEADER.pack(len(data), type_, channel, value) + data

    def flush(self) -> None:
        if self.out:
            try:
                self._connection().sendall(self.out)
            except (BrokenPipeError, ConnectionResetError):
                pass    # QEMU has exited; receive() reports it
            self.out.clear()

    def receive(self, timeout: float) -> list[Message] | None:
        """Messages that arrived within timeout ([] if none); None once QEMU closed."""
        conn = self._connection()
        conn.settimeout(timeout)
        if self._rx is None:
            self._rx = bytearray(1 << 20)   # one receive buffer: no 1 MB allocation per call
        try:
            n = conn.recv_into(self._rx)
        except socket.timeout:
            return []
        except OSError:
            return None
        if not n:
            return None
        self.buf += memoryview(self._rx)[:n]
        msgs = []
        buf, at = self.buf, 0
        while len(buf) - at >= HEADER.size:
            ln, typ, ch, ns = HEADER.unpack_from(buf, at)
            if ln > MAX_PAYLOAD:
                raise InfraError(f"feed {self.path}: message of {ln} bytes, stream out of sync")
            if len(buf) - at < HEADER.size + ln:
                break
            msgs.append(Message(typ, ch, ns, bytes(buf[at + HEADER.size:at + HEADER.size + ln])))
            at += HEADER.size + ln
        del buf[:at]                        # once, not per message
        return msgs

    def close(self) -> None:
        """Close QEMU's connection and the listener, and remove the socket file start() made."""
        if self._closed:
            return
        self._closed = True
        for s in (self.conn, self.listener):
            if s:
                s.close()
        if self.listener is not None:
            self.path.unlink(missing_ok=True)

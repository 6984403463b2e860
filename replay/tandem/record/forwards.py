"""Forwards nothing answers: a `--forward tcp:8080:80` to a port where nothing listens in
the guest is not an error (the service may start later, or never be asked for), but a
user whose client gets "connection reset" should be told why. Learned from the device
log as the recording writes it, not by probing the port (a probe would be traffic of
tandem's own in the recording):

- TCP: a SYN to the forward's guest port answered by a RST (no SYN-ACK) is a refusal;
- UDP: an ICMP port unreachable the guest sends about a datagram to the guest port.

Each forward is reported once, then no longer watched; once every forward has either
answered or been reported, or after the first WATCH_VM_NS of VM time (a forward no
client uses would keep it reading), the watcher stops reading the log: a heavy
recording's log is tens of MB a second, and reading it all would take CPU from the
recording. A refusal after that is not said (the client sees its reset)."""
from __future__ import annotations

import logging
import struct
import threading
from collections.abc import Callable
from pathlib import Path

from ..errors import TandemError
from ..formats import netpkt, pcapng
from ..machine import Forward

log = logging.getLogger(__name__)

TCP_SYN, TCP_RST, TCP_ACK = 0x02, 0x04, 0x10
ICMP_UNREACHABLE, ICMP_PORT_UNREACHABLE = 3, 3
WATCH_VM_NS = 300 * 10**9       # boot and the first clients: when an absent service shows


class RefusedForwards:
    """Which forwards the guest refused, decided event by event (see the module's docstring)."""

    def __init__(self, forwards: tuple[Forward, ...]):
        self.pending = {(f.protocol, f.guest_port): f for f in forwards}
        self._syns: set[tuple[bytes, int, int]] = set()       # (client ip, client port, guest port)

    def done(self) -> bool:
        return not self.pending

    def see(self, event: pcapng.Event) -> tuple[Forward, int] | None:
        """The forward this event shows refused, with the VM time, or None."""
        if not event.channel.startswith("net") or not self.pending:
            return None
        f = netpkt.parse(event.data)
        if f is None or f.eth_type != netpkt.ETH_IP or f.fragment:
            return None
        if f.proto == netpkt.PROTO_TCP:
            return self._tcp(event, f)
        if f.proto == netpkt.PROTO_ICMP and event.direction == "out":
            return self._icmp(event, f)
        return None

    def _tcp(self, event: pcapng.Event, f: netpkt.Frame) -> tuple[Forward, int] | None:
        if event.direction == "in" and ("tcp", f.dport) in self.pending and f.flags & (TCP_SYN | TCP_ACK) == TCP_SYN:
            self._syns.add((f.ip_src, f.sport, f.dport))
            return None
        key = (f.ip_dst, f.dport, f.sport)
        if event.direction != "out" or ("tcp", f.sport) not in self.pending or key not in self._syns:
            return None
        self._syns.discard(key)
        if f.flags & TCP_RST:
            return self.pending.pop(("tcp", f.sport)), event.vm_ns
        if f.flags & TCP_SYN:       # SYN-ACK: something listens there
            del self.pending[("tcp", f.sport)]
        return None

    def _icmp(self, event: pcapng.Event, f: netpkt.Frame) -> tuple[Forward, int] | None:
        icmp = f.payload
        if len(icmp) < 8 + 20 or icmp[0] != ICMP_UNREACHABLE or icmp[1] != ICMP_PORT_UNREACHABLE:
            return None
        inner = icmp[8:]
        ihl = (inner[0] & 0x0F) * 4
        if inner[9] != netpkt.PROTO_UDP or len(inner) < ihl + 4:
            return None
        (dport,) = struct.unpack_from("!H", inner, ihl + 2)
        forward = self.pending.pop(("udp", dport), None)
        return (forward, event.vm_ns) if forward else None


def watch(devlog: Path, forwards: tuple[Forward, ...], running: Callable[[], bool],
          say: Callable[[str], None]) -> threading.Thread | None:
    """Follow the recording's device log in a thread and say each refused forward once
    (None: no forwards to watch)."""
    if not forwards:
        return None
    state = RefusedForwards(forwards)

    def run() -> None:
        reader = pcapng.DevlogReader(devlog, follow=lambda: running() and not state.done()
                                     and reader.clock_ns < WATCH_VM_NS)
        try:
            for event in reader:
                if (refused := state.see(event)) is not None:
                    forward, vm_ns = refused
                    say(f"forward {forward}: the guest refused a connection to its {forward.protocol} port "
                        f"{forward.guest_port} at VM {vm_ns / 1e9:.2f}s (nothing listens there yet?); "
                        f"the recording goes on")
                if state.done() or event.vm_ns >= WATCH_VM_NS:
                    return
        except TandemError as e:    # a log torn by a crash: the recording says so itself
            log.debug("forward watcher stopped: %s", e)
    thread = threading.Thread(target=run, name="forwards", daemon=True)
    thread.start()
    return thread

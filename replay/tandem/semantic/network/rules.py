"""Release rules: a client's next segment handed to QEMU ahead, to go when the guest's
output lets it (qemu-patches/0023), instead of at a stop of the VM.

Offline, most stops of an analysis VM release one input: a client's next request,
which waited only for the guest's reply on its connection and for the outputs the
native had made before it on the others (inputs.py). Each stop is a round trip through
tandem's driver and two threads of QEMU. Such an input can be decided ahead: the
peer's segment is built as it would be sent (peer.Peer.prebuilt), with the sequence
numbers the guest's output must reach on each connection it waits on; QEMU delivers
it a lookahead after the output that reaches them, exactly when a stop would have, and
says FIRED. Rules fire in order, so the inputs keep the native's order, and an input
no rule can carry (a connection to open or close, a console line to wait for, a
segment the guest's window or MSS would split) ends the rules installed at a stop.

Why not everything is a rule: QEMU compares sequence numbers, no more. An input that
waits on a console line, on a connection not open yet, or on bytes given up on is
released at a stop, as before, and so is anything while a flow has bytes waiting for
the guest's window (an ACK that opens it must reach the peer).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from .. import inputs as inputs_mod
from .peer import PEER_MSS, Peer, PeerFlow, TcpState

# Rules installed at once: enough that a chain of requests runs between stops for a
# while, few enough that QEMU's per-output look over them stays short.
MAX_RULES = 64
# The guest's bytes on the rule's own connection that may wait for its segment's ACK:
# the peer acknowledges more than a segment at once (peer.py), so a rule that would
# leave more unacknowledged could leave the guest's sender waiting for an ACK only a
# stop could send.
OWN_BYTES_MAX = 2 * PEER_MSS


@dataclass
class Rule:
    inp: inputs_mod.Input
    flow: PeerFlow


class Rules:
    """The rules installed in QEMU and not fired yet, oldest first."""

    def __init__(self) -> None:
        self.queue: deque[Rule] = deque()
        self.dropping = False       # UNRULE sent: QEMU drops what did not fire by the next stop

    def __len__(self) -> int:
        return len(self.queue)

    def queued_on(self, fl: PeerFlow) -> int:
        """Bytes of rules not fired yet on this connection."""
        return sum(len(r.inp.data) for r in self.queue if r.flow is fl)


def conditions(inp: inputs_mod.Input, peer: Peer, have,
               short: dict[int, int]) -> list[tuple[bytes, int, bool]] | None:
    """The (guest 4-tuple, sequence number, on the input's own connection) each unmet
    dependency of `inp` is, or None if
    one is not a sequence number QEMU can see reached: a connection not open here (or
    not yet bound to the one recorded). have(flow): the guest bytes the flow has sent
    here; short: bytes given up on (driver.give_up), which will never come."""
    out = []
    for flow, need in inp.needs_bytes.items():
        if have(flow) >= need:
            continue
        fl = peer.flows.get(flow)
        # QEMU follows IPv4 TCP alone (qemu-patches/0023): an IPv6 connection's inputs go at stops.
        if fl is None or fl.state != TcpState.ESTABLISHED or fl.index != flow or not fl.ipv4:
            return None
        out.append((fl.guest_key(), guest_seq(fl, need - short.get(flow, 0)), flow == inp.flow))
    return out


def guest_seq(fl: PeerFlow, n: int) -> int:
    """The sequence number after the guest's first n bytes on the connection."""
    return (fl.guest_isn + 1 + n) & 0xFFFFFFFF

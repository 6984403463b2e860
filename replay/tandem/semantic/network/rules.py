"""Release rules: a client's next segment handed to QEMU ahead, to go when the guest's
output lets it (qemu-patches/0034), instead of at a stop of the VM.

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
released at a stop, as without rules, and so is anything while a flow has bytes waiting for
the guest's window (an ACK that opens it must reach the peer).
"""
from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from ...errors import InfraError
from ..inputs import Input, InputKind
from .peer import PEER_MSS, Peer, PeerFlow, TcpState

# Rules installed at once: enough that a chain of requests runs between stops for a
# while, few enough that QEMU's per-output look over them stays short.
MAX_RULES = 64
# The guest's bytes on the rule's own connection that may wait for its segment's ACK:
# the peer acknowledges more than a segment at once (peer.py), so a rule that would
# leave more unacknowledged could leave the guest's sender waiting for an ACK only a
# stop could send.
OWN_BYTES_MAX = 2 * PEER_MSS

Condition = tuple[bytes, int, bool]     # (the guest's 4-tuple, sequence number, on the input's own connection)


class RuleFeed(Protocol):
    """What the rules say to QEMU (qemu.feed.FeedServer)."""
    def rule(self, not_before_ns: int, conds: list[Condition], acks: tuple[bytes, int],
             frames: list[bytes]) -> None: ...
    def unrule(self) -> None: ...


class Waits(Protocol):
    """What an input waits for (driving.dependencies.Dependencies), as far as rules ask."""
    short: dict[int, int]

    def have(self, flow: int) -> int: ...
    def bytes_met(self, flow: int, need: int) -> bool: ...
    def only_bytes(self, inp: Input) -> bool: ...
    def waiting(self, now: int, inp: Input | None = None) -> None: ...
    def waited_out(self, now: int) -> bool: ...


@dataclass
class Rule:
    inp: Input
    flow: PeerFlow


class Rules:
    """The rules installed in QEMU and not fired yet, oldest first, and what the loop
    does with them at a stop. enabled False: none are made (every input goes at a stop)."""

    def __init__(self, feed: RuleFeed, enabled: bool = True) -> None:
        self.feed, self.enabled = feed, enabled
        self.queue: deque[Rule] = deque()
        self.dropping = False       # UNRULE sent: QEMU drops what did not fire by the next stop

    def __len__(self) -> int:
        return len(self.queue)

    def queued_on(self, fl: PeerFlow) -> int:
        """Bytes of rules not fired yet on this connection."""
        return sum(len(r.inp.data) for r in self.queue if r.flow is fl)

    def settle(self, now: int, deps: Waits) -> None:
        """At a stop: rules dropped at the last one are gone (what fired meanwhile has
        been taken); the oldest one waiting DEP_TIMEOUT_NS is dropped, its input then
        released as any other (sent anyway, a replay limit)."""
        if self.dropping:
            self.queue.clear()
            self.dropping = False
        if not self.queue:
            return
        deps.waiting(now)
        if deps.waited_out(now):
            self.drop()

    def drop(self) -> None:
        """Ask QEMU to drop the rules not fired; until the next stop any may still fire."""
        self.feed.unrule()
        self.dropping = True

    def renew(self, ahead: Iterable[Input], now: int, peer: Peer, deps: Waits) -> None:
        """After a stop's inputs went: the rules a retransmission overtook are dropped (their
        segments would not follow it); else the inputs `ahead` (those after the rules held)
        go to QEMU as far as they can (install)."""
        if self.queue and any(r.flow.unsent() for r in self.queue):
            self.drop()
        elif self.enabled and not self.dropping:
            self.install(ahead, now, peer, deps)

    def install(self, ahead: Iterable[Input], now: int, peer: Peer, deps: Waits) -> None:
        """Hand QEMU the inputs `ahead` that wait only on sequence numbers of the guest's
        output, up to MAX_RULES, in order: the first that cannot be a rule ends them."""
        sent_by = {f: n for r in self.queue for f, n in r.inp.needs_bytes.items()}   # guest bytes, by then
        for inp in ahead:
            if len(self.queue) >= MAX_RULES:
                return
            for f, n in inp.needs_bytes.items():
                sent_by[f] = max(sent_by.get(f, 0), n)
            if not self._add(inp, now, peer, deps, sent_by):
                return

    def _add(self, inp: Input, now: int, peer: Peer, deps: Waits, sent_by: dict[int, int]) -> bool:
        """Make inp a rule, if it can be one; sent_by: per connection, the guest's bytes the
        native had sent before it."""
        if inp.kind != InputKind.TCP_DATA or inp.flow is None or inp.vm_ns > now or not deps.only_bytes(inp):
            return False
        fl = peer.flows.get(inp.flow)
        conds = conditions(inp, peer, deps.bytes_met, deps.short) if fl is not None else None
        if fl is None or conds is None or not fl.ipv4:   # QEMU patches IPv4 segments alone (0034)
            return False
        # The guest's bytes on this connection its segment will acknowledge: as many
        # as the native had sent before it, fewer if it came first.
        have = deps.have(inp.flow)
        owed = max(sent_by.get(inp.flow, 0), have) - have
        frame = peer.prebuilt(fl, inp.data, self.queued_on(fl)) if owed <= OWN_BYTES_MAX else None
        if frame is None:
            return False
        self.feed.rule(inp.vm_ns, conds, (fl.guest_key(), guest_seq(fl, fl.guest_bytes + owed)), [frame])
        self.queue.append(Rule(inp, fl))
        return True

    def fired(self, due: Input | None) -> Rule:
        """QEMU delivered the oldest rule's segment: that rule, which must carry `due`, the
        input next in order."""
        if not self.queue:
            raise InfraError("feed: QEMU fired a release rule none was installed for")
        r = self.queue.popleft()
        if due is not r.inp:
            raise InfraError(f"feed: release rule fired for {r.inp.describe()}, next in order is "
                              f"{due.describe() if due else 'none'}")
        return r


def conditions(inp: Input, peer: Peer, met: Callable[[int, int], bool],
               short: dict[int, int]) -> list[Condition] | None:
    """The (guest 4-tuple, sequence number, on the input's own connection) each unmet
    dependency of `inp` is, or None if one is not a sequence number QEMU can see
    reached: a connection not open here (or not yet bound to the one recorded).
    met(flow, need): the guest has sent `need` bytes on it here (or it is retired);
    short: bytes given up on (Dependencies.give_up), which will never come."""
    out = []
    for flow, need in inp.needs_bytes.items():
        if met(flow, need):
            continue
        fl = peer.flows.get(flow)
        # QEMU follows IPv4 TCP alone (qemu-patches/0034): an IPv6 connection's inputs go at stops.
        if fl is None or fl.state != TcpState.ESTABLISHED or fl.index != flow or not fl.ipv4:
            return None
        out.append((fl.guest_key(), guest_seq(fl, need - short.get(flow, 0)), flow == inp.flow))
    return out


def guest_seq(fl: PeerFlow, n: int) -> int:
    """The sequence number after the guest's first n bytes on the connection."""
    return (fl.guest_isn + 1 + n) & 0xFFFFFFFF

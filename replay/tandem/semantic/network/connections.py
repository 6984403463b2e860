"""TCP connections the guest opens (nginx to its backend at 10.0.2.2:8081), matched to the
recording's so the peer can answer them as the remote server did.

An analysis guest opens its own connections: from its own ephemeral ports, with its own
sequence numbers, at its own VM times, maybe in another order when several are open at
once (two nginx workers proxying two requests). Port numbers say nothing then; what the
connection asks for does. So a new connection is matched by where it goes (destination
address and port) and, among the recorded connections there not taken yet, by order:
the first. Where that is ambiguous, because the native had several connections to that
destination open at once (each opened before the first of them closed), the peer
accepts it unbound and it is matched by its first bytes once they come: the recorded
connection whose first request (inputs.Flow.request) shares the longest prefix with
them, the earlier one on a tie. That is request_key's idea for UDP (exchanges.py) with
the prefix as the key: an HTTP request line, a RESP command, a protocol's first line
all tell requests apart at their start. Where one of them had its server speak first
(no request), they are matched by order alone: its guest waits for the server, so there
may be no first bytes to wait for.

A connection with no recorded one left to match is reset and reported once (miss).
"""
from __future__ import annotations

from collections import deque
from itertools import islice

from ...formats import netpkt
from ..inputs import Flow

GROUP_MAX = 64          # recorded connections compared with one new connection's first bytes, at most
MISSES_KEPT = 20        # unmatched connections reported one by one; past that, counted


class Connections:
    """The recording's guest-opened connections not matched yet, per destination, in the
    order the native opened them."""

    def __init__(self) -> None:
        self.by_dst: dict[tuple[bytes, int], deque[Flow]] = {}
        self.misses = 0

    def add(self, fl: Flow) -> None:
        self.by_dst.setdefault(fl.client, deque()).append(fl)

    def group(self, dst: tuple[bytes, int]) -> list[Flow]:
        """The recorded connections to `dst` a new connection there may be: the first not
        matched yet, and the next ones the native opened before that one closed (open at
        once with it: their order may differ in another kernel), GROUP_MAX at most."""
        q = self.by_dst.get(dst)
        if not q:
            return []
        first = q[0]
        end = first.closed_ns
        out = [first]
        for fl in islice(q, 1, GROUP_MAX):
            if end is not None and fl.opened_ns >= end:
                break
            out.append(fl)
        return out

    def at_syn(self, dst: tuple[bytes, int]) -> list[Flow]:
        """What a new connection to `dst` is, as far as its SYN tells: [] none (no
        recorded connection there is left, or none read yet), [fl] that one (by order),
        several: ambiguous until its first bytes (pick)."""
        g = self.group(dst)
        if len(g) > 1 and not all(fl.request and fl.answer == "accepted" for fl in g):
            return g[:1]        # a server spoke first, or one refused: order alone
        return g

    def pick(self, dst: tuple[bytes, int], first: bytes) -> Flow | None:
        """The recorded connection to `dst` an unbound connection is, by its first bytes."""
        g = self.group(dst)
        if not g:
            return None
        return max(g, key=lambda fl: (_common_prefix(fl.request, first), -fl.index))

    def take(self, fl: Flow) -> None:
        """Matched (or given up on): no later connection is matched to it."""
        q = self.by_dst.get(fl.client, deque())
        for i, x in enumerate(q):
            if x is fl:         # by identity: a Flow compares equal by value
                del q[i]
                break
        if not q:
            self.by_dst.pop(fl.client, None)

    def miss(self, guest: tuple[bytes, int], dst: tuple[bytes, int]) -> str | None:
        """A connection from `guest` to `dst` no recorded one matches: the line to report
        (None once MISSES_KEPT were said; the last one says so)."""
        self.misses += 1
        if self.misses > MISSES_KEPT:
            return None
        to = f"{netpkt.ip_str(dst[0])}:{dst[1]}"
        line = (f"tcp {netpkt.ip_str(guest[0])}:{guest[1]}->{to}: the guest opened a connection the "
                f"recording has no match for (the native's guest opened fewer to {to}, or none): reset")
        if self.misses == MISSES_KEPT:
            line += "; further ones are not listed"
        return line


def _common_prefix(a: bytes, b: bytes) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n           # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo

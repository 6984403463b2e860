"""Where an analysis VM may run to next: pure functions of plain values, so the policy is
tested table-driven (tests/unit/test_horizon.py) apart from the loop that applies it
(driver.py)."""
from __future__ import annotations

from ..model import DEP_TIMEOUT_NS, LIVE_SLICE_NS, SETTLE_NS


def next_horizon(now: int, next_input_ns: int | None, blocked_since: int | None, last_output_ns: int,
                 peer_timer_ns: int | None, native_end_ns: int, last_input_ns: int,
                 live: bool = False) -> int | None:
    """Where the VM may run to next, from plain values (tests/unit/test_horizon.py has the
    table); None when the replay is over (or, live, when nothing but the native bounds it).

    next_input_ns: the next input's recorded VM time (None: all delivered); blocked_since:
    when that input began waiting on the guest's outputs (None: it is not); peer_timer_ns:
    the replayed TCP peer's next retransmission or timeout."""
    cands = []
    if next_input_ns is not None:
        # Blocked on dependencies: the guest's outputs pull the horizon in as they
        # come; without any, give up waiting at the dependency timeout.
        cands.append(max(blocked_since, last_output_ns) + DEP_TIMEOUT_NS
                     if blocked_since is not None and next_input_ns <= now else next_input_ns)
    if peer_timer_ns is not None:
        cands.append(peer_timer_ns)
    if next_input_ns is None and live:
        return max(min(cands), now + 1) if cands else None
    if next_input_ns is None:
        end = max(native_end_ns, last_input_ns) + SETTLE_NS
        if now >= end:
            return None
        cands.append(end)
    return max(min(cands), now + 1)


def live_grant(now: int, horizon: int | None, known_ns: int, warp_granted_ns: int, *,
               behind: bool, idle: bool, sent: bool) -> tuple[int, int | None] | None:
    """A live run's grant at a stop: (horizon, warp bound) or None when the VM, idle, has
    nothing new to do and waits on the native.

    The native's clock (known_ns) bounds how far this VM may skip ahead idle (the native's
    next input may come before), not how far it may work ahead. Nor does it while an input
    is due and waits on this guest's outputs (`behind`; not one that waits on a running
    native's answer to a SYN, which an idle guest would otherwise give up on in 5 s of VM
    time taking less wall time than the native's log takes to show it): the VM is behind the point the
    native was at then, and idle time it skips (a KASAN kernel's boot waits out timers in
    some 10 s of VM time, the native's in 1.6 s) is the way there; what arrives meanwhile
    is late in VM time, as in an offline semantic replay. Past the native, it stops every
    LIVE_SLICE_NS to take what came meanwhile."""
    if idle and not sent and not behind and known_ns <= max(now, warp_granted_ns):
        return None
    cap = max(now, known_ns) + LIVE_SLICE_NS
    return (min(horizon, cap) if horizon is not None else cap), (None if behind else known_ns)

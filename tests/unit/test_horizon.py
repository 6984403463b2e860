"""The semantic driver's horizon, a pure function of plain values: where an
analysis VM may run to next. Table-driven, the way syzkaller tests its monitor's rules."""
from __future__ import annotations

import pytest

from tandem.semantic.driving.horizon import live_grant, next_horizon
from tandem.semantic.model import DEP_TIMEOUT_NS, LIVE_SLICE_NS, SETTLE_NS

MS = 1_000_000
# (what, now, next input, blocked since, last output, peer timer, native end, last input, live) -> horizon
TABLE = [
    ("the next input is ahead: run to it", 10 * MS, 50 * MS, None, 0, None, 0, 0, False, 50 * MS),
    ("a peer timer before it: run to the timer", 10 * MS, 50 * MS, None, 0, 30 * MS, 0, 0, False, 30 * MS),
    ("an input due now: one step on, never back", 50 * MS, 50 * MS, None, 0, None, 0, 0, False, 50 * MS + 1),
    ("an input overdue: one step on", 80 * MS, 50 * MS, None, 0, None, 0, 0, False, 80 * MS + 1),
    ("blocked on the guest: the dependency timeout from when it blocked", 60 * MS, 50 * MS, 55 * MS, 0, None,
     0, 0, False, 55 * MS + DEP_TIMEOUT_NS),
    ("blocked, then the guest wrote: the timeout from its last output", 60 * MS, 50 * MS, 55 * MS, 58 * MS,
     None, 0, 0, False, 58 * MS + DEP_TIMEOUT_NS),
    ("blocked but not due yet: the input's time", 40 * MS, 50 * MS, 35 * MS, 0, None, 0, 0, False, 50 * MS),
    ("all delivered: settle after the native's end", 10 * MS, None, None, 0, None, 100 * MS, 90 * MS, False,
     100 * MS + SETTLE_NS),
    ("all delivered, last input after the native's end: settle after it", 10 * MS, None, None, 0, None,
     100 * MS, 120 * MS, False, 120 * MS + SETTLE_NS),
    ("settled: over", 100 * MS + SETTLE_NS, None, None, 0, None, 100 * MS, 0, False, None),
    ("settling, a peer timer first", 10 * MS, None, None, 0, 20 * MS, 100 * MS, 0, False, 20 * MS),
    ("live, all delivered, nothing else: only the native bounds it", 10 * MS, None, None, 0, None, 0, 0, True, None),
    ("live, all delivered, a peer timer: run to it", 10 * MS, None, None, 0, 25 * MS, 0, 0, True, 25 * MS),
    ("live, a peer timer in the past: one step on", 30 * MS, None, None, 0, 25 * MS, 0, 0, True, 30 * MS + 1),
]


@pytest.mark.parametrize("what,now,nxt,blocked,out,timer,end,last,live,want", TABLE, ids=[r[0] for r in TABLE])
def test_next_horizon(what, now, nxt, blocked, out, timer, end, last, live, want):
    assert next_horizon(now, nxt, blocked, out, timer, end, last, live) == want


def test_the_horizon_never_goes_back():
    for what, now, nxt, blocked, out, timer, end, last, live, _ in TABLE:
        h = next_horizon(now, nxt, blocked, out, timer, end, last, live)
        assert h is None or h > now, what


# A live run's grant: (what, now, horizon, native's clock, warp granted, behind, idle, sent) -> (horizon, warp) | None
LIVE = [
    ("idle, nothing new, the native no further: no grant (wait on the native)",
     10 * MS, None, 10 * MS, 10 * MS, False, True, False, None),
    ("idle, the native has moved on: warp to its clock, a slice past it",
     10 * MS, None, 30 * MS, 10 * MS, False, True, False, (30 * MS + LIVE_SLICE_NS, 30 * MS)),
    ("idle but inputs were just sent: run on", 10 * MS, None, 10 * MS, 10 * MS, False, True, True,
     (10 * MS + LIVE_SLICE_NS, 10 * MS)),
    ("an input ahead, before the cap: run to it", 10 * MS, 20 * MS, 30 * MS, 0, False, False, False,
     (20 * MS, 30 * MS)),
    ("far ahead of the native: the slice caps it", 100 * MS, 900 * MS, 30 * MS, 0, False, False, False,
     (100 * MS + LIVE_SLICE_NS, 30 * MS)),
    ("behind (an input due waits on the guest): no warp bound, idle time may be skipped",
     10 * MS, 15 * MS, 30 * MS, 30 * MS, True, True, False, (15 * MS, None)),
]


@pytest.mark.parametrize("what,now,horizon,known,warped,behind,idle,sent,want", LIVE, ids=[r[0] for r in LIVE])
def test_live_grant(what, now, horizon, known, warped, behind, idle, sent, want):
    assert live_grant(now, horizon, known, warped, behind=behind, idle=idle, sent=sent) == want

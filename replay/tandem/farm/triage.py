"""What a finding is tonight, from its history: new, known, flaky, fixed, or gone for fewer
nights than fixed takes. Pure: the farm's reports read the database into Observations and
ask here.

The rules follow the farms users already read: syzbot merges crashes by title and calls
one fixed when it is not seen again; LKFT marks a result that comes and goes as
intermittent instead of a regression; both rerun before they report. Here a finding's
signature is its title; a signature seen in some but not all replays of one task on one
night is flaky (from then on: a finding that came and went once will again); one that
was seen and then not seen on `fixed_after` nights in a row where the tasks that showed
it ran is fixed.
"""
from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass


class State(enum.StrEnum):
    NEW = "new"         # first seen tonight, in every replay of its task
    KNOWN = "known"     # seen tonight and before
    FLAKY = "flaky"     # seen in some but not all replays of one task, once or more
    GONE = "gone"       # not seen tonight, nor on fewer than fixed_after nights before
    FIXED = "fixed"     # not seen on fixed_after nights in a row where its tasks ran


@dataclass(frozen=True)
class Observation:
    """One task group (a recording into one analysis, whichever build of its kernel: a fix
    is a new build in the same group) on one night, as far as one signature goes: how
    many replays of it ran, and in how many the signature was seen."""
    night: int          # the night's place in time: larger is later
    group: tuple[str, str]          # recording, analysis
    runs: int
    seen: int


def state(history: Iterable[Observation], tonight: int, fixed_after: int) -> State | None:
    """The signature's state on night `tonight`, from every observation of the groups that
    ever showed it (the nights they ran without it included); None if it was never seen
    up to tonight."""
    obs = [o for o in history if o.night <= tonight and o.runs > 0]
    seen_nights = {o.night for o in obs if o.seen}
    if not seen_nights:
        return None
    if any(0 < o.seen < o.runs for o in obs):
        return State.FLAKY
    if tonight in seen_nights:
        return State.KNOWN if min(seen_nights) < tonight else State.NEW
    last = max(seen_nights)
    clean = {o.night for o in obs if o.night > last and o.seen == 0}
    return State.FIXED if len(clean) >= fixed_after else State.GONE


def needs_repeats(history: Iterable[Observation], tonight: int) -> bool:
    """Whether a signature seen tonight must be replayed again before it is reported: it
    was never seen before tonight (a known one has earned its place)."""
    return not any(o.seen and o.night < tonight for o in history)

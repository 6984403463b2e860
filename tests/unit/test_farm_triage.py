"""The farm's triage, table-driven: what a signature is tonight from its history."""
from __future__ import annotations

import pytest

from tandem.farm.triage import Observation, State, needs_repeats, state

G = ("rec-a", "kasan")
H = ("rec-b", "kasan")


def seen(night: int, runs: int = 1, hits: int = 1, group=G) -> Observation:
    return Observation(night, group, runs, hits)


CASES = [
    ("never seen", [seen(0, hits=0), seen(1, hits=0)], 1, None),
    ("first tonight, every replay", [seen(0, hits=0), seen(1, runs=3, hits=3)], 1, State.NEW),
    ("tonight and before", [seen(0), seen(1)], 1, State.KNOWN),
    ("some replays of one task", [seen(1, runs=3, hits=2)], 1, State.FLAKY),
    ("flaky once, steady since", [seen(0, runs=3, hits=1), seen(1), seen(2)], 2, State.FLAKY),
    ("gone one night of three", [seen(0), seen(1, hits=0)], 1, State.GONE),
    ("gone three nights", [seen(0), seen(1, hits=0), seen(2, hits=0), seen(3, hits=0)], 3, State.FIXED),
    ("its task did not run", [seen(0), Observation(1, G, 0, 0), Observation(2, G, 0, 0),
                              Observation(3, G, 0, 0)], 3, State.GONE),
    ("seen on another recording", [seen(0), seen(1, hits=0), seen(1, group=H)], 1, State.KNOWN),
    ("later nights are not read", [seen(0, hits=0), seen(1), seen(2)], 1, State.NEW),
    ("back after it was gone", [seen(0), seen(1, hits=0), seen(2)], 2, State.KNOWN),
]


@pytest.mark.parametrize("history,tonight,want", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_state(history, tonight, want):
    assert state(history, tonight, fixed_after=3) == want


def test_a_signature_never_seen_before_is_replayed_again_first():
    assert needs_repeats([seen(0, hits=0), seen(1)], 1)
    assert not needs_repeats([seen(0), seen(1)], 1)

"""A live analysis's buffer bound and its overflow policies (semantic.model.Buffer)."""
from __future__ import annotations


from tandem.semantic.model import Buffer


def test_detach_policy_fails_as_soon_as_the_bound_is_passed():
    b = Buffer(max_events=10, max_bytes=1000)
    assert b.update(10, 1000)
    assert not b.update(11, 10)
    assert not Buffer(max_events=10, max_bytes=1000).update(1, 1001)
    assert b.peak_events == 11 and b.blocks == 0


def test_block_policy_holds_until_there_is_room_again():
    b = Buffer(max_events=10, max_bytes=1000, policy="block", budget_s=60)
    assert b.update(11, 10) and b.full and b.blocks == 1
    assert b.update(10, 10) and b.full          # at the bound: not yet room (resumes at 90%)
    assert b.update(9, 10) and not b.full
    assert b.blocked_s >= 0
    assert b.update(12, 10) and b.full and b.blocks == 2


def test_block_policy_detaches_once_the_budget_is_spent():
    b = Buffer(max_events=10, max_bytes=1000, policy="block", budget_s=0.05)
    assert b.update(11, 10)
    b.full_since -= 0.08                        # full since 80 ms ago: past its 50 ms budget
    assert not b.update(11, 10)                 # still full past the budget: detach
    b.release()
    assert not b.full and b.blocked_s >= 0.05


def test_its_fill_between_updates_is_what_was_made_and_not_delivered():
    """The native's side (overflow "block") reads the fill between the loop's updates,
    which may be a second apart: the inputs made since, against those delivered."""
    b = Buffer(max_events=10, policy="block")
    assert b.pending(50) is None and not b.over(50)     # no analysis loop feeds it
    b.delivered = 35
    assert b.pending(50) == 15 and b.over(50) and not b.over(45)


def test_analysis_cpus_leave_the_first_cpu_to_the_native():
    import os
    import pytest
    from tandem.errors import TandemError
    from tandem.live.shadow import analysis_cpuset
    allowed = sorted(os.sched_getaffinity(0))
    assert analysis_cpuset("auto") == (set(allowed[1:]) or None)
    assert analysis_cpuset("all") is None
    assert analysis_cpuset(str(allowed[-1])) == {allowed[-1]}
    for bad in ("x", "1-", str(max(allowed) + 1)):
        with pytest.raises(TandemError, match="--analysis-cpus"):
            analysis_cpuset(bad)

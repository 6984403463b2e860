"""Exact-replay verification (verify.first_mismatch), on device logs made by hand."""
from __future__ import annotations

from tandem.formats.pcapng import Devlog, Event
from tandem.exact.verify import first_mismatch


def ev(seq: int, channel: str, data: bytes, vm_ns: int = 0, direction: str = "out") -> Event:
    kind = "serial" if channel.startswith("serial") else "net"
    return Event(seq, 0, channel, kind, direction, vm_ns, seq * 10, data, 0)


RECORDED = Devlog(events=[ev(0, "serial0", b"boot\n", 1), ev(1, "net0", b"\x00" * 60, 2, "in"),
                          ev(2, "serial0", b"a line of 27 bytes, long!\r\n", 3), ev(3, "net0", b"\x01" * 42, 4)])


def test_identical_logs_verify():
    assert first_mismatch(RECORDED, Devlog(events=list(RECORDED.events))) is None


def test_a_payload_that_differs_is_named():
    replayed = Devlog(events=[*RECORDED.events[:2], RECORDED.events[2]._replace(data=b"a line of 27 bytes, LONG!\r\n"),
                              RECORDED.events[3]])
    mm = first_mismatch(RECORDED, replayed)
    assert mm.index == 2 and "byte 20" in mm.what


def test_a_prefix_replay_may_stop_early():
    assert first_mismatch(RECORDED, Devlog(events=RECORDED.events[:2]), prefix=True) is None
    assert "missing" in first_mismatch(RECORDED, Devlog(events=RECORDED.events[:2])).what


def test_a_prefix_replay_may_go_on_past_a_device_log_cut_earlier():
    """A torn recording's device log may end before its record log's intact prefix
    (each is flushed on its own clock): the replay's later events are not compared."""
    assert first_mismatch(Devlog(events=RECORDED.events[:2]), RECORDED, prefix=True) is None
    assert "extra event" in first_mismatch(Devlog(events=RECORDED.events[:2]), RECORDED).what
    wrong = RECORDED.events[1]._replace(data=b"\x02" * 60)
    mm = first_mismatch(Devlog(events=RECORDED.events[:2]), Devlog(events=[RECORDED.events[0], wrong,
                                                                           *RECORDED.events[2:]]), prefix=True)
    assert mm is not None and mm.index == 1


def test_a_prefix_replay_may_stop_inside_its_last_event():
    """The replay paused where the intact log ends, inside the guest's write of a line:
    its last event has the line's first bytes. Not a divergence."""
    cut = RECORDED.events[2]._replace(data=b"a ")
    assert first_mismatch(RECORDED, Devlog(events=[*RECORDED.events[:2], cut]), prefix=True) is None


def test_a_short_event_before_the_end_is_a_mismatch_even_in_a_prefix():
    cut = RECORDED.events[2]._replace(data=b"a ")
    mm = first_mismatch(RECORDED, Devlog(events=[*RECORDED.events[:2], cut, RECORDED.events[3]]), prefix=True)
    assert mm is not None and mm.index == 2


def test_a_last_event_that_is_not_a_prefix_is_a_mismatch():
    wrong = RECORDED.events[2]._replace(data=b"b ")
    assert first_mismatch(RECORDED, Devlog(events=[*RECORDED.events[:2], wrong]), prefix=True) is not None

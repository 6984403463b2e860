"""QEMU's OVERFLOW message (filter-gate reached max-frames/max-bytes, qemu-patches/0033)
as the host reads it: an event of the run, and under policy detach nothing more to decide.
What QEMU writes on the gate socket is input like any other: a malformed one is ignored."""
from __future__ import annotations

from tandem.qemu.feed import Message
from tandem.live.shadow import overflow_limits
from tandem.live.gate import OVERFLOW, OVERFLOW_BODY, STATS, STATS_BODY, STATS_NAMES, Gate, Held


def overflow(channel: int, policy: int, vm_ns: int = 1_500_000_000) -> Message:
    return Message(OVERFLOW, channel, vm_ns, OVERFLOW_BODY.pack(64, 65_000, 64, 65_536, policy))


def test_detach_is_reported_and_leaves_nothing_held():
    g = Gate(None, None, [])
    g.queues[("c", 1, "s", 2)] = [Held(1, 0, b"frame")]
    g._overflow(overflow(0, 0))
    (e,) = g.events
    assert (e.kind, e.vm_ns, e.qemu) == ("overflow", 1_500_000_000, {
        "direction": "outputs", "frames": 64, "bytes": 65_000, "max_frames": 64, "max_bytes": 65_536,
        "policy": "detach"})
    assert e.describe().startswith("QEMU held the native's outputs up to its bound at VM time 1.500s "
                                   "(64 frames, 65000 bytes held; max-frames 64, max-bytes 65536): detached")
    assert g.detached and not g.queues


def test_block_is_reported_and_keeps_deciding():
    g = Gate(None, None, [])
    g._overflow(overflow(1, 1))
    (e,) = g.events
    assert e.qemu["direction"] == "inputs" and "refused until there was room" in e.describe()
    assert not g.detached


def test_a_malformed_overflow_is_ignored(caplog):
    g = Gate(None, None, [])
    for m in (Message(OVERFLOW, 0, 0, b"short"), overflow(7, 0),
              Message(OVERFLOW, 0, 0, OVERFLOW_BODY.pack(0, 0, 0, 0, 0) + b"x")):
        g._overflow(m)
    assert not g.events and not g.detached
    assert caplog.text.count("malformed OVERFLOW") == 3
    g._overflow(overflow(0, 9))          # an unknown policy number: said as it is, not trusted
    assert g.events[0].qemu["policy"] == "9" and not g.detached


def test_qemus_counters_at_its_end_are_kept_by_name():
    g = Gate(None, None, [])
    g._stats(Message(STATS, 0, 0, b"\0" * 63))          # malformed: ignored
    assert g.qemu_stats is None
    g._stats(Message(STATS, 0, 0, STATS_BODY.pack(*range(1, 9))))
    assert g.qemu_stats == dict(zip(STATS_NAMES, range(1, 9)))
    assert g.qemu_stats["held_peak_frames"] == 1 and g.qemu_stats["dropped"] == 8


def test_overflows_are_said_once_a_direction():
    g = Gate(None, None, [])
    for vm_ns in (1_000_000_000, 2_000_000_000, 3_000_000_000):
        g._overflow(overflow(0, 1, vm_ns))
    g._overflow(overflow(1, 1))
    out, inp = overflow_limits(g.events)
    assert out.startswith("gate: QEMU held the native's outputs up to its bound at VM time 1.000s")
    assert out.endswith("(3 times, the last at VM time 3.000s)")
    assert inp.startswith("gate: QEMU held the native's inputs") and "times" not in inp

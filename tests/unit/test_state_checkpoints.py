"""State checkpoints in a device log (devlog state-every): written in QEMU's layout, read
back apart from the events, decoded, compared by verify.first_departure; a record that
does not parse is refused in one line."""
from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings, strategies as st

from tandem.errors import BundleError
from tandem.exact.verify import first_departure, first_state_mismatch
from tandem.formats import cpustate, pcapng

NAMES = ["rax", "rbx", "rip", "eflags", "fs_base", "xmm0"]


def regs(rip: int, rax: int = 0, fs_base_width: int = 8) -> bytes:
    """One vCPU's record as QEMU writes it: index, length, then length-prefixed registers."""
    values = [rax.to_bytes(8, "little"), (7).to_bytes(8, "little"), rip.to_bytes(8, "little"),
              (0x246).to_bytes(4, "little"), bytes(fs_base_width), bytes(range(16))]
    body = b"".join(bytes([len(v)]) + v for v in values)
    return struct.pack("<II", 0, len(body)) + body


def write(path, checkpoints, events=()) -> pcapng.Devlog:
    w = pcapng.PcapngWriter(path)
    net = w.add_interface("net0", "net")
    cpus = w.add_interface("cpus", "state", comment="registers: " + " ".join(NAMES))
    for vm_ns, icount, data in checkpoints:
        w.event(cpus, "out", vm_ns, data, icount)
    for vm_ns, icount, data in events:
        w.event(net, "out", vm_ns, data, icount)
    w.f.close()
    return pcapng.read_devlog(path)


CPS = [(100_000_000, 1000, regs(0xffffffff81000000)), (200_000_000, 2000, regs(0xffffffff81000010, rax=5)),
       (300_000_000, 3000, regs(0xffffffff81000020))]


def test_checkpoints_are_read_apart_from_the_events(tmp_path):
    log = write(tmp_path / "a.pcapng", CPS, [(150_000_000, 1500, b"\x01" * 60)])
    assert [e.kind for e in log.events] == ["net"] and log.events[0].seq == 0
    assert [s.icount for s in log.states] == [1000, 2000, 3000]
    cp = cpustate.decode(log, 1)
    assert cp.pc() == 0xffffffff81000010 and cp.cpus[0].value("rax") == 5 and cp.icount == 2000


def test_a_register_narrower_in_another_cpu_mode_is_read_by_its_length(tmp_path):
    log = write(tmp_path / "a.pcapng", [(1, 1, regs(0x1000, fs_base_width=4))])
    assert dict(cpustate.decode(log, 0).cpus[0].registers)["fs_base"] == bytes(4)


def test_equal_checkpoints_verify_and_a_register_that_differs_is_named(tmp_path):
    rec = write(tmp_path / "r.pcapng", CPS)
    assert first_state_mismatch(rec, write(tmp_path / "same.pcapng", CPS)) is None
    bad = [CPS[0], (CPS[1][0], CPS[1][1], regs(0xffffffff81000010, rax=6)), CPS[2]]
    mm = first_state_mismatch(rec, write(tmp_path / "b.pcapng", bad))
    assert (mm.index, mm.icount, mm.kind) == (1, 2000, "state checkpoint")
    assert "vCPU 0 rax recorded 0x0000000000000005, replayed 0x0000000000000006" in mm.what


def test_a_checkpoint_at_another_instruction_is_a_departure(tmp_path):
    rec = write(tmp_path / "r.pcapng", CPS)
    moved = [CPS[0], (CPS[1][0], 2001, CPS[1][2]), CPS[2]]
    assert "written at instruction 2001, recorded at 2000" in first_state_mismatch(
        rec, write(tmp_path / "m.pcapng", moved)).what


def test_the_earlier_of_a_checkpoint_and_an_event_is_the_departure(tmp_path):
    """A checkpoint that differs before the first event that differs bounds the departure
    from below; an event that differs first is named itself."""
    rec = write(tmp_path / "r.pcapng", CPS, [(250_000_000, 2500, b"\x01" * 60)])
    later_event = write(tmp_path / "a.pcapng", [CPS[0], (CPS[1][0], CPS[1][1], regs(1)), CPS[2]],
                        [(250_000_000, 2500, b"\x02" * 60)])
    assert first_departure(rec, later_event).kind == "state checkpoint"
    earlier_event = write(tmp_path / "b.pcapng", [CPS[0], CPS[1], (CPS[2][0], CPS[2][1], regs(1))],
                          [(250_000_000, 2500, b"\x02" * 60)])
    m = first_departure(rec, earlier_event)
    assert m.kind == "event" and m.icount == 2500


def test_a_recording_without_checkpoints_compares_none(tmp_path):
    rec = write(tmp_path / "r.pcapng", [])
    assert first_state_mismatch(rec, write(tmp_path / "a.pcapng", CPS)) is None


def test_a_prefix_replay_compares_the_checkpoints_both_hold(tmp_path):
    rec = write(tmp_path / "r.pcapng", CPS)
    short = write(tmp_path / "s.pcapng", CPS[:2])
    assert first_state_mismatch(rec, short, prefix=True) is None
    assert "missing from the replay" in first_state_mismatch(rec, short).what


def test_a_state_interface_whose_comment_names_no_registers_is_refused(tmp_path):
    w = pcapng.PcapngWriter(tmp_path / "x.pcapng")
    w.event(w.add_interface("cpus", "state", comment="hello"), "out", 1, regs(1), 1)
    w.f.close()
    with pytest.raises(BundleError, match="does not name the registers"):
        cpustate.decode(pcapng.read_devlog(tmp_path / "x.pcapng"), 0)


def test_a_state_kind_on_another_link_type_is_refused(tmp_path):
    w = pcapng.PcapngWriter(tmp_path / "x.pcapng")
    w.add_interface("cpus", "state", linktype=147)
    w.f.close()
    with pytest.raises(BundleError, match="kind 'state' with link type 147"):
        pcapng.read_devlog(tmp_path / "x.pcapng")


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_hostile_checkpoint_bytes_decode_or_are_refused_in_one_line(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("h") / "h.pcapng"
    log = write(path, [(1, 1, data)])
    try:
        cp = cpustate.decode(log, 0)
    except BundleError as e:
        assert "\n" not in str(e) and "state checkpoint 0" in str(e)
    else:
        assert all(len(c.registers) == len(NAMES) for c in cp.cpus)

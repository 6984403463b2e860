"""What `tandem replay --locate` prints of a departure (cli/replay.py) and how it reads
QEMU's `info registers -a` (exact/debug.py), on one vCPU and on several: the vCPU the
difference names first with its registers, the others' program counters after it."""
from __future__ import annotations

from tandem.cli.replay import departure_json, render_departure
from tandem.exact.debug import parse_registers
from tandem.exact.locate import Departure, VcpuAt
from tandem.exact.verify import Mismatch

STATE = Mismatch(7, "state", 1_200_000_000, "vCPU 1 rax recorded 0x10, replayed 0x0", 5_000, "state checkpoint")
FRAME = Mismatch(42, "net0", 1_697_653_000, "payload differs at byte 96", 4_000)


def departure(m: Mismatch, how: str, vcpu: int | None, *vcpus: VcpuAt) -> Departure:
    return Departure(how, m, m.icount or 0, m.vm_ns, 4_000 if how == "state" else None, None, vcpu, vcpus, None, 9)


def test_one_vcpu_reads_as_it_always_has():
    dep = departure(FRAME, "input", None, VcpuAt(0, 0xffffffff814774c3, "default_idle+0x13/0x15",
                                                  (("rax", None, 0), ("rip", None, 0xffffffff814774c3))))
    text = render_departure(dep)
    assert "  guest pc: 0xffffffff814774c3 default_idle+0x13/0x15\n" in text and "vCPU" not in text
    assert "  registers: rax=0x0 rip=0xffffffff814774c3" in text


def test_several_vcpus_the_named_one_first_and_the_others_pcs_after():
    dep = departure(STATE, "state", 1,
                    VcpuAt(1, 0x2000, "b+0x0/0x4", (("rax", 0x10, 0), ("rip", 0x2000, 0x2000))),
                    VcpuAt(0, 0x1000, "a+0x0/0x4", (("rax", 1, 1), ("rip", 0x1000, 0x1000))))
    text = render_departure(dep)
    assert "  guest pc (vCPU 1: its registers differ): 0x2000 b+0x0/0x4" in text
    assert "  registers (recorded->replayed where they differ): rax=0x10->0x0 rip=0x2000" in text
    assert text.splitlines()[-2] == "  vCPU 0: pc 0x1000 a+0x0/0x4"
    j = departure_json(dep)
    assert (j["vcpu"], j["pc"], [v["index"] for v in j["vcpus"]]) == (1, 0x2000, [1, 0])
    assert j["registers"]["rax"] == {"recorded": 0x10, "replayed": 0}


def test_an_event_that_names_no_vcpu_shows_vcpu_0_first_and_says_so():
    dep = departure(FRAME, "input", None, VcpuAt(0, 0x1000, None, ()), VcpuAt(1, None, None, ()))
    text = render_departure(dep)
    assert "guest pc (vCPU 0: the first; the difference names no vCPU): 0x1000" in text
    assert "  vCPU 1: pc ?" in text


def test_a_kernel_not_named_is_said_once():
    why = "not named: its kernel has no vmlinux"
    text = render_departure(departure(FRAME, "input", None, VcpuAt(0, 0x1000, why, ()), VcpuAt(1, 0x2000, why, ())))
    assert text.count(why) == 1 and "  vCPU 1: pc 0x2000 (not named, as above)" in text


def test_no_registers_at_all_still_says_where():
    assert "  guest pc: ?" in render_departure(departure(FRAME, "input", None))


# `info registers -a` of QEMU 10.0 (tandem's build), 2 vCPUs at power-on, paused (-S):
# real mode, so 32-bit names; its segment, debug and FPU lines trimmed to a few.
POWER_ON = """
CPU#0
EAX=00000000 EBX=00000000 ECX=00000000 EDX=00060fb1
ESI=00000000 EDI=00000000 EBP=00000000 ESP=00000000
EIP=0000fff0 EFL=00000002 [-------] CPL=0 II=0 A20=1 SMM=0 HLT=0
ES =0000 00000000 0000ffff 00009300
CS =f000 ffff0000 0000ffff 00009b00
CR0=60000010 CR2=00000000 CR3=00000000 CR4=00000000
DR0=0000000000000000 DR1=0000000000000000 DR2=0000000000000000 DR3=0000000000000000
EFER=0000000000000000
FCW=037f FSW=0000 [ST=0] FTW=00 MXCSR=00001f80

CPU#1
EAX=00000000 EBX=00000000 ECX=00000000 EDX=00060fb1
ESI=00000000 EDI=00000000 EBP=00000000 ESP=00000000
EIP=0000fff0 EFL=00000002 [-------] CPL=0 II=0 A20=1 SMM=0 HLT=1
ES =0000 00000000 0000ffff 00009300
CR0=60000010 CR2=00000000 CR3=00000000 CR4=00000000
"""
# ... and in long mode: the same, of the demo guest on 2 vCPUs (Debian's kernel) replayed to
# instruction 3,000,000,000
LONG = """
CPU#0
RAX=22611b60f609830b RBX=ffffcf20c04bb330 RCX=0000000000000002 RDX=07738ad6752c9abb
RSI=07738ad6752c9abc RDI=22611b60f609830b RBP=ffffcf20c04bb0d0 RSP=ffffcf20c04bb080
R8 =0000000000000000 R9 =0000000000000006 R10=0000000000000006 R11=ffffcf20c04bb668
R12=0000000000000006 R13=ffffcf20c04bb0e0 R14=0000000000000001 R15=ffffcf20c04bb330
RIP=ffffffff95697020 RFL=00000297 [--S-APC] CPL=0 II=0 A20=1 SMM=0 HLT=0
CS =0010 0000000000000000 ffffffff 00af9b00 DPL=0 CS64 [-RA]
GS =0000 ffff8a2c8f600000 00000000 00000000
CR0=80050033 CR2=0000000000500ebe CR3=00000000021ae000 CR4=000006f0
DR0=0000000000000000 DR1=0000000000000000 DR2=0000000000000000 DR3=0000000000000000
EFER=0000000000000d01
CPU#1
RAX=ffff8a2c81d26650 RBX=0000000000000010 RCX=ffff8a2c81d26680 RDX=32013bc6a70273bb
RSI=0000000000000008 RDI=0000000000000000 RBP=ffff8a2c81d26600 RSP=ffffcf20c05f3af0
R8 =0000000012245d5c R9 =00000000170f3e2c R10=ffff8a2c81d26640 R11=ffff8a2c81d26600
R12=0000000000000008 R13=0000000000000040 R14=0000000000000008 R15=ffff8a2c81d26700
RIP=ffffffff9572d161 RFL=00000283 [--S---C] CPL=0 II=0 A20=1 SMM=0 HLT=0
CS =0010 0000000000000000 ffffffff 00af9b00 DPL=0 CS64 [-RA]
GS =0000 ffff8a2c8f700000 00000000 00000000
CR0=80050033 CR2=000000001da1a730 CR3=000000000e222000 CR4=000006f0
DR0=0000000000000000 DR1=0000000000000000 DR2=0000000000000000 DR3=0000000000000000
EFER=0000000000000d01
"""


def test_info_registers_by_vcpu_in_real_and_long_mode():
    regs = parse_registers(POWER_ON)
    assert sorted(regs) == [0, 1]
    assert regs[1]["eip"] == 0xfff0 and regs[1]["edx"] == 0x60fb1 and regs[1]["eflags"] == 2
    assert set(regs[0]) == {"eax", "ebx", "ecx", "edx", "esi", "edi", "ebp", "esp", "eip", "eflags",
                            "cr0", "cr2", "cr3", "cr4"}     # no segment, debug, EFER or FPU register
    long = parse_registers(LONG)
    assert long[0]["rip"] == 0xffffffff95697020 and long[1]["rip"] == 0xffffffff9572d161
    assert long[1]["r8"] == 0x12245d5c and long[0]["eflags"] == 0x297 and long[0]["cr3"] == 0x21ae000
    assert len(long[0]) == 22       # 16 general, rip, eflags, cr0, cr2, cr3, cr4
    assert parse_registers("No CPU available\n") == {}
    assert parse_registers(POWER_ON.replace("\n", "\r\n")) == regs    # as QMP's human-monitor-command gives it

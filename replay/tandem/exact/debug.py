"""Reverse debugging of a bundle: its exact replay under gdb, with snapshots to seek by.

QEMU's reverse debugging (QMP `replay-seek`, gdb's reverse-stepi and reverse-continue)
loads the nearest snapshot at or before an instruction count and replays on from it to
the instruction; the snapshot's log position is found again in tandem's segmented log by
its segment index (qemu-patches/0012). tandem gives it the snapshots: one at power-on and
then one every `spacing_s` of the replay's host time, each taken where the replay is stopped
(`stop`) and saved (`savevm`) into the run's qcow2 overlay.

A seek then costs one snapshot load (each holds the RAM the guest uses: 43-86 MiB of the
demo guest's 256 MiB, saved in 0.02-0.15 s on a 2-core TCG machine) and at most `spacing_s`
of replay. Snapshots stop
when they would pass `budget` bytes; the seeks after the last one replay on further.
"""
from __future__ import annotations

import bisect
import contextlib
import dataclasses
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import artifacts
from ..errors import BundleError, InfraError
from ..formats import bundle, pcapng, rrstream
from ..machine import Guest, Host
from ..machine.guest import ICOUNT_SHIFT
from ..machine.section import recorded
from ..qemu.image import make_overlays
from ..qemu.vm import VM
from .replay import HANG_SECONDS, refuse_device_mode, replay_run, replay_vm
from .verify import final_state

SPACING_S = 0.5            # replay host seconds between snapshots: a seek replays at most this long
BUDGET = 8 << 30           # bytes of snapshots at most (QEMU stores each guest RAM page in use)
RETRY_S = 0.02             # host seconds on, when the replay cannot be snapshotted where it stopped
POLL_S = 0.01
START = "tandem-0"
# x86's `info registers`: "RAX=ffffffff81e0b0c0 RBX=... R8 =0000000000000000" in long mode,
# "EAX=00000000 ... EIP=0000fff0 EFL=00000002" outside it; the segment lines ("CS =0010
# ...", "ES =0000 ...") name no register matched here.
HMP_REGISTER = re.compile(r"\b([RE](?:AX|BX|CX|DX|SI|DI|BP|SP|IP|FL)|R(?:8|9|1[0-5])|CR[0-4]) ?=([0-9a-f]+)\b")
FLAGS = {"rfl": "eflags", "efl": "eflags"}    # gdb's name
CPU_HEADER = re.compile(r"^CPU#(\d+)\r?$", re.M)      # HMP ends its lines with CRLF


def parse_registers(text: str) -> dict[int, dict[str, int]]:
    """`info registers -a`'s answer by vCPU: each vCPU's dump follows a "CPU#N" line."""
    parts = CPU_HEADER.split(text)
    out: dict[int, dict[str, int]] = {}
    for index, dump in zip(parts[1::2], parts[2::2]):
        regs = {m.group(1).lower(): int(m.group(2), 16) for m in HMP_REGISTER.finditer(dump)}
        out[int(index)] = {FLAGS.get(name, name): v for name, v in regs.items()}
    return out


@dataclass(frozen=True)
class Snapshot:
    name: str
    icount: int
    vm_ns: int


@dataclass
class Session:
    """A bundle's replay under gdb: QEMU paused, its gdbstub on `port` (None: no gdbstub)."""
    vm: VM
    port: int | None
    snapshots: list[Snapshot]
    end: tuple[int | None, int | None]     # the recording's (VM time, instruction count) at its end
    recording: pcapng.Devlog

    def images(self) -> list[dict]:
        """The run's block images (query-block), the snapshots' qcow2 overlay among them."""
        return _images(self.vm)

    def icount(self) -> int:
        return int(_qmp(self.vm, "query-replay")["icount"])

    def vm_ns(self) -> int:
        return int(self.vm.vm_status(("vm-clock-ns",))["vm-clock-ns"])

    def seek(self, icount: int) -> None:
        """Stop the replay at this instruction count (QEMU's replay-seek: the nearest
        snapshot at or before it, then replay on)."""
        if self.end[1] is not None and not 0 <= icount <= self.end[1]:
            raise BundleError(f"instruction count {icount}: the recording has 0..{self.end[1]}")
        # QEMU answers once it has loaded the snapshot: a load that never ends (a drain
        # waiting on the log, as before qemu-patches/0009) would hold this call for ever.
        qmp = self.vm._monitor()
        qmp.settimeout(HANG_SECONDS)
        try:
            _qmp(self.vm, "replay-seek", icount=icount)
        except TimeoutError:
            raise InfraError(f"replay-seek {icount}: QEMU did not answer within {HANG_SECONDS}s "
                             f"(loading a snapshot) ({self.vm.log_tail()})") from None
        except Exception as e:       # QEMU's refusal, or QEMU gone: its log says why
            raise InfraError(f"replay-seek {icount}: {e} ({self.vm.log_tail()})") from e
        finally:
            qmp.settimeout(None)
        _wait_paused(self.vm)

    def run_to(self, icount: int) -> None:
        """Replay on to this instruction count (QEMU's replay-break), without a snapshot:
        forward only."""
        if icount < self.icount():
            raise BundleError(f"instruction count {icount}: the replay is already at {self.icount()}")
        if icount > self.icount():
            _qmp(self.vm, "replay-break", icount=icount)
            _qmp(self.vm, "cont")
            _wait_paused(self.vm)
        if self.icount() != icount:
            raise InfraError(f"replay-break {icount}: the replay stopped at {self.icount()} "
                             f"({self.vm.log_tail()})")

    def registers_all(self) -> dict[int, dict[str, int]]:
        """Every vCPU's registers where the replay stands, by vCPU index, from QEMU's `info
        registers -a` (x86: RAX..R15, RIP, RFL, CR0..CR4, or EAX..EIP, EFL outside long
        mode; lower-cased, the flags as eflags: gdb's names)."""
        return parse_registers(_hmp(self.vm, "info registers -a"))

    def icount_at(self, vm_ns: int) -> int:
        """The instruction count at which the replay's VM clock reaches vm_ns, from the
        recording's device log: its events give (VM time, instruction count) pairs, and in
        between the guest either ran (1 << ICOUNT_SHIFT ns an instruction) or idled (the
        clock warped: no instruction)."""
        events = [e for e in self.recording.events if e.icount is not None]
        times = [e.vm_ns for e in events]
        i = bisect.bisect_right(times, vm_ns)
        t0, n0 = (events[i - 1].vm_ns, int(events[i - 1].icount or 0)) if i else (0, 0)
        limit = events[i].icount if i < len(events) else self.end[1]
        n = n0 + max(0, vm_ns - t0) // (1 << ICOUNT_SHIFT)
        return int(min(n, limit)) if limit is not None else int(n)


def _qmp(vm: VM, name: str, **args: Any) -> Any:
    """A QMP command's answer (qemu.qmp types it as object)."""
    return vm._monitor().command(name, **args)


def _wait_paused(vm: VM) -> None:
    """Until the replay stops (a break, a seek's end); QEMU exiting or no progress for
    HANG_SECONDS is an error."""
    last, since = None, time.monotonic()
    while _qmp(vm, "query-status")["status"] == "running":
        if vm.process().poll() is not None:
            raise InfraError(f"replay QEMU exited: {vm.log_tail()}")
        now = _qmp(vm, "query-replay")["icount"]
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since > HANG_SECONDS:
            raise InfraError(f"replay hung at instruction {now} for {HANG_SECONDS}s ({vm.log_tail()})")
        time.sleep(POLL_S)


def _hmp(vm: VM, line: str) -> str:
    return str(_qmp(vm, "human-monitor-command", **{"command-line": line}))


def _save(vm: VM, name: str) -> str:
    """savevm; QEMU's refusal as text ("" when saved)."""
    return _hmp(vm, f"savevm {name}").strip()


def _snapshot_bytes(vm: VM) -> int:
    return sum(int(img.get("actual-size", 0)) for img in _images(vm))


def _images(vm: VM) -> list[dict]:
    return [b["inserted"]["image"] for b in _qmp(vm, "query-block") if b.get("inserted")]


def take_snapshots(vm: VM, end_icount: int, *, spacing_s: float = SPACING_S, budget: int = BUDGET,
                   progress: Callable[[str], None] | None = None) -> list[Snapshot]:
    """Replay from power-on (QEMU started paused, -S) to the end, stopping every spacing_s
    of host time to save a snapshot; then load the first again. Returns them in order.

    The replay is stopped by the clock, not at instruction counts: a boot runs 400 million
    instructions in 0.4 s of host time where the guest idles and 50 million where it works,
    so no instruction rate spaces the snapshots evenly in host time, which is what a seek
    costs. A point where QEMU cannot snapshot (an I/O in flight) is retried RETRY_S later."""
    shots: list[Snapshot] = []

    def status() -> str:
        return str(_qmp(vm, "query-status")["status"])

    def save(name: str) -> bool:
        if _save(vm, name):
            return False
        shots.append(Snapshot(name, int(_qmp(vm, "query-replay")["icount"]),
                              int(vm.vm_status(("vm-clock-ns",))["vm-clock-ns"])))
        return True

    if not save(START):
        raise InfraError(f"replay: no snapshot at power-on ({_save(vm, START)})")
    wait, last, since = spacing_s, 0, time.monotonic()
    while _snapshot_bytes(vm) < budget:
        _qmp(vm, "cont")
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and status() == "running":
            time.sleep(POLL_S)
        if status() != "running":
            break       # the recorded end (-no-shutdown: the replay pauses there)
        _qmp(vm, "stop")
        now = int(_qmp(vm, "query-replay")["icount"])
        if now >= end_icount:
            break
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since > HANG_SECONDS:
            raise InfraError(f"replay hung at instruction {now} for {HANG_SECONDS}s ({vm.log_tail()})")
        wait = spacing_s if save(f"tandem-{len(shots)}") else RETRY_S
        if progress and wait == spacing_s:
            progress(f"snapshot {len(shots)} at instruction {now} (VM time {shots[-1].vm_ns / 1e9:.3f}s)")
    if vm.process().poll() is not None:
        raise InfraError(f"replay QEMU exited: {vm.log_tail()}")
    # Back to power-on as a seek goes there (the snapshot, then a break at once): after a
    # bare loadvm, gdb's first stepi never returned.
    _qmp(vm, "replay-seek", icount=0)
    _wait_paused(vm)
    return shots


@contextmanager
def debug(bundle_dir: str | Path, port: int | None, *, spacing_s: float = SPACING_S, budget: int = BUDGET,
          progress: Callable[[str], None] | None = None, index: bool = True) -> Iterator[Session]:
    """The bundle's exact replay, paused at power-on with its gdbstub on 127.0.0.1:port
    (None: none) and snapshots taken through the whole recording (index=False: none, the
    replay only goes forward, Session.run_to); QEMU is stopped on exit."""
    d = Path(bundle_dir)
    manifest = bundle.check_bundle(d, qemu_build_id=artifacts.qemu()["build_id"])
    refuse_device_mode(d, manifest)
    if recorded(manifest).machine.mode == "analysis":
        raise BundleError(f"{d}: an analysis run's recording replays through its feed, whose "
                          f"state a snapshot does not hold: reverse debugging needs a native's bundle")
    info = rrstream.scan(d / bundle.STREAM)
    if not info.finished:
        raise BundleError(f"{d / bundle.STREAM}: unfinished recording: reverse debugging needs a finished one")
    rec = pcapng.read_devlog(d / bundle.DEVLOG)
    end = final_state(rec)
    if end[1] is None:
        raise BundleError(f"{d / bundle.DEVLOG}: no final instruction count (the device log did not close)")
    guest = Guest.from_manifest(manifest)
    tmp = Path(tempfile.mkdtemp(prefix="tandem-debug-"))
    try:
        overlay = tmp / "disk.qcow2"
        make_overlays(guest, overlay)
        with bundle.open_member(d, bundle.STREAM) as f, contextlib.ExitStack() as held:
            stream = Path(f"/dev/fd/{f.fileno()}")
            # -S: paused at power-on; -no-shutdown: the recorded shutdown pauses the
            # replay instead of ending it, so that gdb can step back from there.
            gdb = ["-gdb", f"tcp:127.0.0.1:{port}"] if port is not None else []
            run = replay_run(manifest, tmp, stream, overlay, extra=[*gdb, "-S", "-no-shutdown"])
            run = dataclasses.replace(run, host=Host(pass_fds=(f.fileno(),)))
            with replay_vm(manifest, guest, run, held, where=str(d), name="debug") as vm:
                shots = (take_snapshots(vm, end[1], spacing_s=spacing_s, budget=budget, progress=progress)
                         if index else [])
                yield Session(vm, port, shots, end, rec)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

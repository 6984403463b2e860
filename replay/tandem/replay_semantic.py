"""Semantic replay: a recording's inputs re-delivered into an analysis VM.

The analysis VM runs a different kernel or userland. Its network, serial input
and entropy come from a feed (qemu-patches/0006): tandem sends each input with
the VM time to deliver it at and grants the VM clock a horizon it may not pass;
QEMU returns every frame and serial byte the guest sends and stops at the
horizon. Each output also pulls the horizon in by the link's lookahead, so the
replayer (tcp_peer) answers the guest within that VM time, as the real network
did: the two advance conservatively in VM time, and with -icount sleep=off the
guest never waits out idle time.

An input is released no earlier than its recorded VM time, and not before the
analysis guest has produced the outputs the native had produced when the input
arrived (inputs.py); one that waits longer than the dependency timeout is sent
anyway and reported as a replay limit.
"""
from __future__ import annotations

import bisect
import shutil
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from . import bundle, feedproto, private
from . import inputs as inputs_mod
from . import record as record_mod
from .errors import TandemError
from .feedproto import FeedServer
from .tcp_peer import Peer
from .vm import QMP_GONE, VM, Guest, Run, cpu_seconds, make_overlay

LOOKAHEAD_NS = 1_000_000            # the replayer answers an output within 1 ms of VM time
DEP_TIMEOUT_NS = 5_000_000_000      # an input waiting on dependencies is sent anyway after
                                    # this much VM time without any output from the guest
LIVE_SLICE_NS = 50_000_000         # live, past the native's clock: stop this often to take new inputs
SETTLE_NS = 1_000_000_000           # run this long after the last input (and the native's end)
MAX_LAG_NS = 60_000_000_000         # beyond the native's end: the analysis is lagging
HANG_WALL_S = 60.0                  # no word from QEMU for this long (wall): it is hung
DELIVERED_KEPT = 5_000             # live: the inputs delivered last, kept to attribute findings
TICK_S = 0.5                        # live: how often the run's `tick` (live comparison) is called


@dataclass
class Delivered:
    vm_ns: int                  # when the analysis VM got it
    input: inputs_mod.Input


@dataclass
class AnalysisRun:
    analysis: str
    outcome: str = "running"    # poweroff | finished | crashed | hung | lagging | error
    detail: str = ""
    end_ns: int = 0
    wall_s: float = 0.0
    console: bytearray = field(default_factory=bytearray)
    console_times: list[tuple[int, int]] = field(default_factory=list)   # (offset, vm_ns)
    console_base: int = 0           # console offset of console[0] (a live run drops what it compared)
    net_out: list[tuple[int, bytes]] | None = field(default_factory=list)  # (vm_ns, frame); None: live
    # Offline every input delivered; live the last DELIVERED_KEPT (n_delivered counts them all).
    delivered: list[Delivered] | deque = field(default_factory=list)
    n_delivered: int = 0
    taken: int = 0                  # the recording's inputs looked at so far
    last_input_of: dict[int, int] = field(default_factory=dict)  # flow -> VM ns of its last input here
    pending_of_flow: object = None  # (flow) -> does an input of it wait to be delivered?
    limits: list[str] = field(default_factory=list)
    waits: int = 0
    peer: Peer | None = None
    qemu_log: str = ""
    bundle: Path | None = None  # the run's own recording, replayable exactly
    qemu_pid: int | None = None
    cpu_s: float = 0.0              # CPU time its QEMU used (sampled while it runs)


    def vm_time_at(self, offset: int) -> int:
        """VM time at which console byte `offset` was written."""
        i = bisect.bisect_right(self.console_times, (offset, float("inf"))) - 1
        return self.console_times[i][1] if i >= 0 else 0

    def deliver(self, vm_ns: int, inp: inputs_mod.Input) -> None:
        self.delivered.append(Delivered(vm_ns, inp))
        self.n_delivered += 1
        if inp.flow is not None:
            self.last_input_of[inp.flow] = vm_ns

    def drop_console(self, offset: int) -> None:
        """Forget console bytes before `offset` (compared, and scanned for reports)."""
        k = offset - self.console_base
        if k <= 0:
            return
        del self.console[:k]
        self.console_base = offset
        i = bisect.bisect_right(self.console_times, (offset, float("inf"))) - 1
        if i > 0:       # the write that `offset` is in stays: it times what follows
            del self.console_times[:i]

    def input_before(self, vm_ns: int) -> Delivered | None:
        """The last input delivered at or before vm_ns: what a finding is attributed to."""
        last = None
        for d in self.delivered:
            if d.vm_ns > vm_ns:
                break
            if d.input.kind != "rng":
                last = d
        return last


@dataclass
class Buffer:
    """A live analysis's bound on inputs the native has made but it has not taken yet,
    and what happens over it: policy "detach" (the analysis is detached at once) or
    "block" (the native gets no new input until the buffer has room again, for at most
    `budget_s` of wall time at a stretch; past that the analysis is detached)."""
    max_events: int = 100_000
    max_bytes: int = 64 << 20
    policy: str = "detach"
    budget_s: float = 10.0
    events: int = 0             # now
    bytes: int = 0
    oldest_ns: int | None = None  # recorded VM time of the oldest input not taken yet
    peak_events: int = 0        # the most it ever held: what the run needed
    peak_bytes: int = 0
    full: bool = False          # policy "block": over its bound, the native's inputs are held
    full_since: float | None = None
    blocks: int = 0             # how often it blocked the native, and for how long in all
    blocked_s: float = 0.0
    pending: object = None      # () -> inputs not taken right now (set by the analysis's loop)

    # Room again at 90%: the native is not held and let go at every input.
    RESUME = 0.9

    def update(self, events: int, nbytes: int, oldest_ns: int | None = None) -> bool:
        """Record the current fill; False once the analysis must be detached."""
        self.events, self.bytes, self.oldest_ns = events, nbytes, oldest_ns
        self.peak_events, self.peak_bytes = max(self.peak_events, events), max(self.peak_bytes, nbytes)
        over = events > self.max_events or nbytes > self.max_bytes
        if self.policy != "block":
            return not over
        now = time.monotonic()
        if over and not self.full:
            self.full, self.full_since = True, now
            self.blocks += 1
        elif self.full and events <= self.RESUME * self.max_events and nbytes <= self.RESUME * self.max_bytes:
            self.release(now)
        return not (self.full and now - self.full_since > self.budget_s)

    def over(self) -> bool:
        """Full or, by the inputs made since its last update, over its bound (any thread)."""
        return self.full or (self.pending is not None and self.pending() > self.max_events)

    def release(self, now: float | None = None) -> None:
        """No longer holding the native (room again, or detached)."""
        if self.full:
            self.blocked_s += (now or time.monotonic()) - self.full_since
            self.full, self.full_since = False, None


def run(rec: inputs_mod.Recording, analysis: str, workdir: Path, *,
        lookahead_ns: int = LOOKAHEAD_NS, guest: Guest | None = None,
        max_lag_ns: int = MAX_LAG_NS, progress=None, record: bool = True,
        buffer: Buffer | None = None, stop=None, hang_wall_s: float = HANG_WALL_S,
        idle: bool = False, cpus: str | None = None, launcher=None, tick=None) -> AnalysisRun:
    """Replay rec into one analysis VM; never raises for what the guest does.

    With record (the default) the analysis VM runs under QEMU's record/replay and
    leaves its own bundle, workdir/ANALYSIS.tdm, which `tandem replay` replays
    exactly: every finding can be reproduced instruction for instruction.

    rec may be a live native's, still filling in (rec.finished False): the analysis
    then trails it, idling no further than what the native has reached (rec.known_ns;
    it may work past it, as a slow-booting analysis must), holding at
    most `buffer` of inputs it has not taken yet; over that it detaches (outcome
    "detached"). `stop()` returning True ends the run early (outcome "detached").

    launcher: run the analysis VM as a libvirt domain (virt.Launcher, see vm.VM).
    tick(run): called every TICK_S from the run's thread (a live run compares and drops
    what it has matched: live_compare.py); a live run keeps only the inputs it delivered
    last and no raw frames, so that its memory does not grow with its length.
    """
    guest = guest or Guest.for_analysis(analysis)
    res = AnalysisRun(analysis)
    if not rec.finished:
        res.delivered, res.net_out = deque(maxlen=DELIVERED_KEPT), None
    tmp = Path(tempfile.mkdtemp(prefix="tandem-an-"))
    private.make_dir(workdir)
    run_args = dict(feed_lookahead_ns=lookahead_ns, rtc_base=rec.created, idle=idle, cpus=cpus)
    manifest = None
    if record:
        res.bundle = workdir / f"{analysis}.tdm"
        if res.bundle.exists():
            shutil.rmtree(res.bundle)
        manifest = record_mod.start_manifest(res.bundle, guest, {
            "mode": "analysis", "analysis": analysis, "rtc_base": rec.created,
            "lookahead_ns": lookahead_ns, "source": str(rec.path),
            "net": {"backend": "feed"}, **(launcher.machine() if launcher else {})})
        run_args.update(rr="record", rrfile=res.bundle / bundle.STREAM,
                        devlog=res.bundle / bundle.DEVLOG,
                        overlay=res.bundle / record_mod.OVERLAY if guest.disk else None)
    else:
        run_args.update(devlog=workdir / f"{analysis}.pcapng")
        if guest.disk:
            run_args["overlay"] = tmp / "disk-overlay.qcow2"
            make_overlay(guest.disk.base, run_args["overlay"], guest.disk.format)
    server = FeedServer(tmp / "feed.sock")
    vm = VM(guest, Run("analysis", tmp, feed_socket=server.path, **run_args), launcher=launcher, name=analysis)
    vm.console = lambda: bytes(res.console)
    t0 = time.monotonic()
    try:
        vm.start()
        res.qemu_pid = vm.proc.pid
        server.accept(30)
        _drive(rec, res, vm, server, max_lag_ns, progress, buffer or Buffer(), stop, hang_wall_s, tick)
    except TandemError as e:
        res.outcome, res.detail = "error", str(e)
    finally:
        if vm.proc and vm.proc.poll() is None:
            vm.kill()
        res.wall_s = time.monotonic() - t0
        res.qemu_log = vm.log_tail(2000)
        vm.close()
        server.close()
        if manifest is not None:
            _seal(res, vm, manifest)
        shutil.rmtree(tmp, ignore_errors=True)
    return res


def _seal(res: AnalysisRun, vm: VM, manifest: dict) -> None:
    """Finish the analysis run's bundle; a run that did not end cleanly stays 'interrupted'."""
    try:
        private.copy_file(vm.log_path, res.bundle / "qemu.log")
        status = vm.proc.returncode if vm.proc and vm.proc.returncode is not None else -9
        record_mod.seal(res.bundle, manifest, status=status, wall_s=res.wall_s,
                        stop_reason=res.outcome)
    except (OSError, TandemError) as e:
        res.limits.append(f"the run's recording could not be sealed: {e}")


def _drive(rec, res: AnalysisRun, vm: VM, server: FeedServer, max_lag_ns: int, progress,
           buffer: Buffer, stop, hang_wall_s: float, tick=None) -> None:
    peer = res.peer = Peer()
    lines = inputs_mod.SerialLines()
    todo: list = []                         # taken, not delivered yet: todo[nxt:]
    trimmed = 0                             # delivered inputs dropped from todo's front
    pending_bytes = 0                       # of todo[nxt:]

    def pull() -> None:
        """Take the inputs the native has made since (all of them for a finished one).
        res.taken counts inputs from the recording's first: a live one drops the front
        of rec.inputs once every analysis has taken it."""
        nonlocal pending_bytes
        with rec.lock:
            new = rec.inputs[res.taken - rec.inputs_dropped:]
        res.taken += len(new)
        for i in new:
            if i.kind == "rng":             # entropy is a pool the guest draws from in order
                server.input(feedproto.RNG, 0, i.data)
                res.deliver(0, i)
            else:
                todo.append(i)
                pending_bytes += len(i.data)
        server.flush()

    def not_taken() -> int:
        with rec.lock:
            return len(rec.inputs) + rec.inputs_dropped - res.taken

    pull()
    nxt = 0
    # The fill as of now, for the native's side (overflow "block" checks it between
    # this loop's updates, which may be a second apart).
    buffer.pending = lambda: len(todo) - nxt + not_taken()

    def pending_of_flow(flow: int) -> bool:
        with rec.lock:
            later = rec.inputs[res.taken - rec.inputs_dropped:]
        return any(i.flow == flow for i in todo[nxt:]) or any(i.flow == flow for i in later)
    res.pending_of_flow = pending_of_flow
    stalled_at: int | None = None           # live: idle at a WAIT, waiting on the native
    warp_granted = 0                        # live: the last warp bound granted
    blocked_since: int | None = None
    last_input_ns = 0
    pending: list[bytes] = []               # frames to send at the next stop
    last_word = time.monotonic()
    last_output_ns = 0
    shutdown = None

    # Outputs given up on: after one dependency timeout, the bytes a flow never
    # produced (and lines never printed) are not waited for again.
    short: dict[int, int] = {}
    lost_lines: set[bytes] = set()

    def have(flow: int) -> int:
        pf = peer.flows.get(flow)
        if pf is None and rec.flows[flow] is None:
            return 1 << 62          # retired: compared to its end by every analysis
        return (pf.guest_bytes if pf else 0) + short.get(flow, 0)

    def deps_met(inp) -> bool:
        if inp.needs_line and inp.needs_line[0] not in lost_lines and not lines.has(inp.needs_line):
            return False
        return all(have(flow) >= need for flow, need in inp.needs_bytes.items())

    def give_up(inp) -> None:
        if inp.needs_line and not lines.has(inp.needs_line):
            lost_lines.add(inp.needs_line[0])
        for flow, need in inp.needs_bytes.items():
            if have(flow) < need:
                short[flow] = short.get(flow, 0) + need - have(flow)

    def unmet(inp) -> str:
        parts = []
        if inp.needs_line and inp.needs_line[0] not in lost_lines and not lines.has(inp.needs_line):
            parts.append(f"serial line {inp.needs_line[0][:60]!r} (#{inp.needs_line[1]})")
        parts += [f"flow {flow}: {have(flow)}/{need} guest bytes"
                  for flow, need in inp.needs_bytes.items() if have(flow) < need]
        return ", ".join(parts)

    def grant(now: int, idle: bool) -> bool:
        """Release what is due at a stop and grant the next horizon; False while a live
        native has given this VM, idle, nothing new to do."""
        nonlocal nxt, trimmed, blocked_since, last_input_ns, pending, pending_bytes, warp_granted
        pull()
        frames = pending + peer.retransmit(now)
        pending = []
        first = nxt
        while nxt < len(todo) and todo[nxt].vm_ns <= now:
            inp = todo[nxt]
            if not deps_met(inp):
                blocked_since = blocked_since if blocked_since is not None else now
                if now - max(blocked_since, last_output_ns) < DEP_TIMEOUT_NS:
                    break
                res.limits.append(f"{inp.describe()}: sent after waiting "
                                  f"{DEP_TIMEOUT_NS / 1e9:.0f}s of VM time for {unmet(inp)}")
                give_up(inp)
            blocked_since = None
            frames += _release(inp, rec, peer, server, now)
            res.deliver(now, inp)
            pending_bytes -= len(inp.data)
            last_input_ns = now
            nxt += 1
        sent = bool(frames) or nxt != first
        if nxt > 256 and 2 * nxt > len(todo):      # what was delivered is not needed here
            del todo[:nxt]
            trimmed += nxt
            nxt = 0
        for fr in frames:
            server.input(feedproto.NET, now, fr)
        live = not rec.finished
        horizon = next_horizon(now, todo[nxt].vm_ns if nxt < len(todo) else None, blocked_since,
                               last_output_ns, peer.next_timer(), rec.end_ns or 0, last_input_ns, live)
        if live:
            # The native's clock bounds how far this VM may skip ahead idle (the native's
            # next input may come before), not how far it may work ahead. Nor does it
            # while an input is due and waits on this guest's outputs: the VM is behind
            # the point the native was at then, and idle time it skips (a KASAN kernel's
            # boot waits out timers in some 10 s of VM time, the native's in 1.6 s) is
            # the way there; what arrives meanwhile is late in VM time, as in an offline
            # semantic replay. Past the native, it stops every LIVE_SLICE_NS to take
            # what came meanwhile.
            known = rec.known_ns
            behind = nxt < len(todo) and todo[nxt].vm_ns <= now
            if idle and not sent and not behind and known <= max(now, warp_granted):
                server.flush()
                return False
            cap = max(now, known) + LIVE_SLICE_NS
            horizon = min(horizon, cap) if horizon is not None else cap
            warp_granted = known
            server.horizon(horizon, warp_ns=None if behind else known)
            server.flush()
            return True
        if horizon is None:
            server.flush()
            vm.quit()           # reported back as SHUTDOWN host-qmp-quit
            return True
        server.horizon(horizon)
        server.flush()
        return True

    cpu_at = tick_at = 0.0
    while True:
        if time.monotonic() - cpu_at > 0.2:
            res.cpu_s, cpu_at = cpu_seconds(vm.proc.pid) or res.cpu_s, time.monotonic()
        if tick is not None and time.monotonic() - tick_at > TICK_S:
            tick(res)
            tick_at = time.monotonic()
        if stop is not None and stop():
            res.outcome, res.detail = "detached", "stopped by tandem"
            vm.kill()
            return
        if nxt < len(todo):
            oldest = todo[nxt].vm_ns
        else:
            with rec.lock:
                i = res.taken - rec.inputs_dropped
                oldest = rec.inputs[i].vm_ns if i < len(rec.inputs) else None
        if not buffer.update(len(todo) - nxt + not_taken(), pending_bytes, oldest):
            res.outcome = "detached"
            res.detail = (f"input buffer full ({buffer.events} events, {buffer.bytes} bytes; bound "
                          f"{buffer.max_events} events, {buffer.max_bytes} bytes): the analysis fell "
                          f"{(rec.known_ns - res.end_ns) / 1e9:.1f}s of VM time behind the native")
            if buffer.full:
                res.detail += (f", still full after blocking the native for the {buffer.budget_s:g}s "
                               f"wall-time budget")
                buffer.release()
            vm.kill()
            return
        if stalled_at is not None:
            if grant(stalled_at, True):
                stalled_at = None
            last_word = time.monotonic()    # waiting on the native, not on QEMU
        msgs = server.receive(0.05 if stalled_at is not None else 1.0)
        if msgs is None:                    # QEMU exited
            break
        if not msgs:
            if time.monotonic() - last_word > hang_wall_s:
                res.outcome = "hung"
                # QMP may be as stuck as the feed: ask it with a deadline.
                vm.qmp.settimeout(2.0)
                res.detail = (f"QEMU silent for {hang_wall_s:.0f}s of wall time (QEMU state "
                              f"{vm.status()}, {_feed_state(vm)}, last stop at VM {res.end_ns / 1e9:.6f}s)")
                return
            continue
        last_word = time.monotonic()
        for m in msgs:
            if m.type == feedproto.OUTPUT:
                last_output_ns = m.vm_ns
            if m.type == feedproto.SHUTDOWN:
                # The first one says why: a QEMU under libvirt (-no-shutdown) pauses at a
                # guest poweroff and then says SHUTDOWN again for libvirt's SIGTERM.
                if shutdown is None:
                    c = feedproto.SHUTDOWN_CAUSES
                    shutdown = c[m.channel] if m.channel < len(c) else f"cause {m.channel}"
                    res.end_ns = m.vm_ns
            elif m.type == feedproto.OUTPUT and m.channel == feedproto.NET:
                if res.net_out is not None:
                    res.net_out.append((m.vm_ns, m.data))
                pending += peer.on_frame(m.data, m.vm_ns)
            elif m.type == feedproto.OUTPUT and m.channel == feedproto.SERIAL:
                res.console_times.append((res.console_base + len(res.console), m.vm_ns))
                res.console += m.data
                lines.feed(m.data)
            elif m.type == feedproto.WAIT:
                now = res.end_ns = m.vm_ns
                res.waits += 1
                if rec.finished and now > (rec.end_ns or 0) + max_lag_ns:
                    res.outcome = "lagging"
                    res.detail = (f"still running {max_lag_ns / 1e9:.0f}s of VM time past the native's end "
                                  f"({trimmed + nxt}/{trimmed + len(todo)} inputs delivered)")
                    vm.kill()
                    return
                if not grant(now, m.channel == feedproto.WAIT_IDLE):
                    stalled_at = now
                if progress:
                    progress(res, trimmed + nxt, trimmed + len(todo))
        server.flush()
    vm.wait(30)
    if shutdown == "guest-shutdown":
        res.outcome = "poweroff"
    elif shutdown == "host-qmp-quit":
        res.outcome = "finished"
    elif shutdown in ("guest-reset", "guest-panic"):
        res.outcome, res.detail = "crashed", f"the guest stopped with {shutdown} (kernel panic or reboot)"
    else:
        res.outcome = "crashed"
        res.detail = f"QEMU exited ({shutdown or 'without saying why'}): {vm.log_tail(300)}"
    if nxt < len(todo):
        res.detail += f"; {len(todo) - nxt} of {trimmed + len(todo)} inputs not delivered"


def _feed_state(vm: VM) -> str:
    """The feed object's counters, for diagnosing a stuck analysis VM."""
    out = []
    for prop in ("horizon", "waits", "delivered", "late"):
        try:
            out.append(f"{prop}={vm.qmp.command('qom-get', path='/objects/feed', property=prop)}")
        except QMP_GONE as e:
            out.append(f"{prop}=? ({type(e).__name__})")
    return "feed " + " ".join(out)


def _release(inp, rec, peer: Peer, server: FeedServer, now: int) -> list[bytes]:
    if inp.kind == "serial":
        server.input(feedproto.SERIAL, now, inp.data)
        return []
    if inp.kind == "frame":
        return [inp.data]
    fl = rec.flows[inp.flow]
    if inp.kind == "tcp-open":
        return peer.open(fl.index, fl.client, fl.server, fl.client_mac, fl.guest_mac, now)
    if inp.flow not in peer.flows:
        return []
    if inp.kind == "tcp-data":
        return peer.send(inp.flow, inp.data, now)
    if inp.kind == "tcp-fin":
        return peer.close(inp.flow, now)
    if inp.kind == "tcp-rst":
        return peer.reset(inp.flow, now)
    return []


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

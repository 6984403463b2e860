"""Compare a native recording's outputs with an analysis VM's, per channel.

Streams compared: the serial console (lines), each TCP flow's guest-to-client
payload (lines of the byte stream, so segmentation does not matter) and the
UDP datagrams the guest sent (in order, per destination). Both sides pass
through the equivalence spec first (dropped lines, masks). What still differs
is a divergence, unless the same difference also appears between the native
and a replay into a second copy of the native kernel: that is noise (Diffy's
idea), reported only as a count.

Speed: each stream is joined once and compared whole (memcmp) first; only a
stream whose bytes differ, or whose spec rewrites lines, is split into lines,
and only lines that still differ after the spec go through difflib. Line times
are looked up only for what is reported.
"""
from __future__ import annotations

import bisect
import difflib
from dataclasses import dataclass
from itertools import accumulate
from operator import itemgetter

from . import inputs as inputs_mod, netpkt
from .equivalence import Spec
from .replay_semantic import AnalysisRun

KERNEL_LINE = inputs_mod.KERNEL_LINE
MASKED = b"<*>"
_DATA = itemgetter(1)               # of a (VM time, bytes) chunk


@dataclass
class Line:
    vm_ns: int
    text: bytes


@dataclass
class Divergence:
    channel: str                # serial | tcp flow N (a->b) | udp a:port
    kind: str                   # differ | missing | extra | lag
    native: list[Line]
    analysis: list[Line]
    native_ns: int | None
    analysis_ns: int | None
    after_input: str            # the last input delivered to the analysis VM before it
    diff: str

    def key(self) -> tuple:
        """What the difference is, independent of when: matched against noise."""
        return (self.channel.split(" (")[0], self.kind,
                tuple(l.text for l in self.native), tuple(l.text for l in self.analysis))


class _Stream:
    """A timed byte stream: its bytes, and the VM time of each chunk it arrived in
    (indexed only when a line's time is needed)."""
    __slots__ = ("_chunks", "_starts", "_times", "_writes", "text")

    def __init__(self, text: bytes, chunks: list[tuple[int, bytes]] | None = None,
                 writes: tuple[list[tuple[int, int]], int] | None = None):
        """Timed by `chunks` (VM time, bytes) joined into `text`, or by `writes`:
        ([(offset, VM time)], offset of text[0]) of a buffer text was cut from."""
        self.text = text
        self._chunks, self._writes = chunks, writes
        self._starts: list[int] | None = None
        self._times: list[int] = []

    @classmethod
    def of_chunks(cls, chunks: list[tuple[int, bytes]]) -> _Stream:
        return cls(b"".join(map(_DATA, chunks)), chunks=chunks)

    def masked(self, ranges: list[tuple[int, int]]) -> _Stream:
        """The same stream with bytes [start, end) of each range replaced by '*'."""
        b = bytearray(self.text)
        for start, end in ranges:
            hi = min(end, len(b))
            if start < hi:
                b[start:hi] = b"*" * (hi - start)
        return _Stream(bytes(b), self._chunks, self._writes)

    def time_at(self, pos: int) -> int:
        """VM time of the chunk byte `pos` came in."""
        if self._writes is not None:
            writes, base = self._writes
            return writes[bisect.bisect_right(writes, (pos + base, _INF)) - 1][1]
        if self._starts is None:
            chunks = self._chunks or []
            self._starts = list(accumulate([len(d) for _, d in chunks[:-1]], initial=0)) if chunks else []
            self._times = [ns for ns, _ in chunks]
        return self._times[bisect.bisect_right(self._starts, pos) - 1]

    def lines(self) -> tuple[list[bytes], list[int]]:
        """The stream's lines (without their \\n or trailing \\r; no empty last line)
        and the offset each starts at."""
        parts = self.text.split(b"\n")
        if not parts[-1]:
            parts.pop()
        starts = list(accumulate([len(p) + 1 for p in parts[:-1]], initial=0)) if parts else []
        if b"\r" in self.text:
            parts = [p.rstrip(b"\r") for p in parts]
        return parts, starts


_EMPTY = _Stream(b"", chunks=[])
_INF = float("inf")
_DROP = object()


def _apply(lines: list[bytes], rules, serial: bool, cache: dict) -> tuple[list[bytes], list[int]]:
    """The lines the spec keeps, rewritten by its masks, and their indices in `lines`.
    `cache` maps a line to its rewrite (_DROP: dropped), shared by both sides."""
    out, kept = [], []
    kernel = serial and rules.ignore_kernel_lines
    for i, t in enumerate(lines):
        r = cache.get(t)
        if r is None:
            if (kernel and KERNEL_LINE.match(t)) or any(p.search(t) for p in rules.ignore):
                r = _DROP
            else:
                r = t
                for p in rules.mask:
                    r = p.sub(MASKED, r)
            cache[t] = r
        if r is not _DROP:
            out.append(r)
            kept.append(i)
    return out, kept


kept_lines = _apply     # for the release gate (gate.py): the same rules, line by line


class _Side:
    """One side of a stream as lines after the spec; a line's time is looked up only
    when it is reported."""
    __slots__ = ("kept", "starts", "stream", "texts")

    def __init__(self, stream: _Stream, rules, serial: bool, cache: dict):
        lines, self.starts = stream.lines()
        self.stream = stream
        self.texts, self.kept = _apply(lines, rules, serial, cache)

    def vm_ns(self, i: int) -> int:
        return self.stream.time_at(self.starts[self.kept[i]])

    def line(self, i: int) -> Line:
        return Line(self.vm_ns(i), self.texts[i])


def _compare_lines(name: str, sa: _Stream, sb: _Stream, rules, serial: bool, spec: Spec,
                   run: AnalysisRun) -> list[Divergence]:
    cache: dict = {}
    a, b = _Side(sa, rules, serial, cache), _Side(sb, rules, serial, cache)
    if a.texts == b.texts and not spec.max_lag_ns:
        return []                   # difflib would find one 'equal' block
    return _diff_stream(name, a, b, spec, run, rules.reorder_window)


def _reordered(a: list[bytes], b: list[bytes], opcodes, window: int) -> tuple[set[int], set[int]]:
    """Lines removed on one side and inserted within `window` lines on the other."""
    if not window:
        return set(), set()
    removed = [(i, j1 - i1) for op, i1, i2, j1, j2 in opcodes if op in ("replace", "delete")
               for i in range(i1, i2)]
    inserted = [j for op, i1, i2, j1, j2 in opcodes if op in ("replace", "insert") for j in range(j1, j2)]
    gone_a, gone_b = set(), set()
    for i, shift in removed:
        for j in inserted:
            if j not in gone_b and abs(j - (i + shift)) <= window and a[i] == b[j]:
                gone_a.add(i)
                gone_b.add(j)
                break
    return gone_a, gone_b


def _diff_stream(channel: str, a: _Side, b: _Side, spec: Spec, run: AnalysisRun,
                 window: int = 0) -> list[Divergence]:
    sm = difflib.SequenceMatcher(None, a.texts, b.texts, autojunk=False)
    out = []
    opcodes = sm.get_opcodes()
    gone_a, gone_b = _reordered(a.texts, b.texts, opcodes, window)
    for op, i1, i2, j1, j2 in opcodes:
        if op == "equal":
            if spec.max_lag_ns:
                for i, j in zip(range(i1, i2), range(j1, j2)):
                    x, y = a.line(i), b.line(j)
                    if y.vm_ns - x.vm_ns > spec.max_lag_ns:
                        out.append(_div(channel, "lag", [x], [y], run,
                                        f"same output {(y.vm_ns - x.vm_ns) / 1e9:.3f}s of VM time later "
                                        f"than the native (bound {spec.max_lag_ns / 1e9:.3f}s): {x.text[:100]!r}"))
                        break
            continue
        na = [a.line(i) for i in range(i1, i2) if i not in gone_a]
        nb = [b.line(j) for j in range(j1, j2) if j not in gone_b]
        if not na and not nb:
            continue
        kind = "differ" if na and nb else "missing" if na else "extra"
        diff = "\n".join(difflib.unified_diff([l.text.decode(errors="replace") for l in na],
                                              [l.text.decode(errors="replace") for l in nb],
                                              "native", "analysis", lineterm="", n=0))
        out.append(_div(channel, kind, na, nb, run, diff))
    return out


def _div(channel, kind, na, nb, run: AnalysisRun, diff) -> Divergence:
    ans = nb[0].vm_ns if nb else None
    before = run.input_before(ans) if ans is not None else None
    return Divergence(channel, kind, na, nb, na[0].vm_ns if na else None, ans,
                      before.input.describe() if before else "none (before the first input)", diff)


def streams_native(rec: inputs_mod.Recording) -> dict[str, _Stream]:
    s = {"serial": _Stream.of_chunks(rec.serial_out)}
    for fl in rec.flows:
        s[f"tcp flow {fl.index} ({fl.name()})"] = _Stream.of_chunks(fl.guest_data)
    udp: dict[str, list[tuple[int, bytes]]] = {}
    for ns, (ip, port), payload in rec.udp_out:
        udp.setdefault(f"udp {netpkt.ip_str(ip)}:{port}", []).append((ns, payload + b"\n"))
    s.update((k, _Stream.of_chunks(v)) for k, v in udp.items())
    return s


def streams_analysis(run: AnalysisRun, rec: inputs_mod.Recording) -> dict[str, _Stream]:
    # The console is one buffer; each write's (offset, VM time) indexes it.
    base = run.console_times[0][0] if run.console_times else len(run.console)
    s = {"serial": _Stream(bytes(run.console[base:]), writes=(run.console_times, base))}
    for fl in rec.flows:
        pf = run.peer.flows.get(fl.index) if run.peer else None
        s[f"tcp flow {fl.index} ({fl.name()})"] = _Stream.of_chunks(pf.guest_data if pf else [])
    # The guest's UDP datagrams: the replayer's peer kept them as it parsed each frame.
    if run.peer is not None:
        datagrams = run.peer.udp_out
    else:                           # a run that stopped before replaying: parse what it has
        datagrams = []
        for ns, frame in run.net_out:
            f = netpkt.parse(frame)
            if f and f.eth_type == netpkt.ETH_IP and f.proto == netpkt.PROTO_UDP and not f.fragment:
                datagrams.append((ns, (f.ip_dst, f.dport), f.payload))
    udp: dict[str, list[tuple[int, bytes]]] = {}
    for ns, (ip, port), payload in datagrams:
        udp.setdefault(f"udp {netpkt.ip_str(ip)}:{port}", []).append((ns, payload + b"\n"))
    s.update((k, _Stream.of_chunks(v)) for k, v in udp.items())
    return s


def compare(rec: inputs_mod.Recording, run: AnalysisRun, spec: Spec) -> list[Divergence]:
    """Every difference between the native's outputs and the analysis run's."""
    a, b = streams_native(rec), streams_analysis(run, rec)
    out = []
    for name in sorted(set(a) | set(b), key=lambda n: (n != "serial", n)):
        chan = name.split(" ")[0]
        if chan in spec.ignore_channels:
            continue
        rules = spec.rules[chan]
        sa, sb = a.get(name, _EMPTY), b.get(name, _EMPTY)
        if chan == "tcp" and rules.byte_ranges:
            flow = int(name.split()[2])
            ranges = [(s, e) for f, s, e in rules.byte_ranges if f == flow]
            if ranges:
                sa, sb = sa.masked(ranges), sb.masked(ranges)
        plain = not (rules.ignore or rules.mask or rules.ignore_kernel_lines or spec.max_lag_ns)
        if plain and sa.text == sb.text:
            continue                # the common case, at memcmp speed
        out += _compare_lines(name, sa, sb, rules, chan == "serial", spec, run)
    return out


def split_noise(divs: list[Divergence], noise: list[Divergence] | None) -> tuple[list[Divergence], int]:
    """(divergences beyond the noise, how many were noise)."""
    if not noise:
        return divs, 0
    keys = {d.key() for d in noise}
    real = [d for d in divs if d.key() not in keys]
    return real, len(divs) - len(real)


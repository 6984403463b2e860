"""Compare a native recording's outputs with an analysis VM's, per channel.

Streams compared: the serial console (lines), each TCP flow's guest-to-client
payload (lines of the byte stream, so segmentation does not matter) and the
UDP datagrams the guest sent (in order, per destination). Both sides pass
through the equivalence spec first (dropped lines, masks). What still differs
is a divergence, unless the same difference also appears between the native
and a replay into a second copy of the native kernel: that is noise (Diffy's
idea), reported only as a count.
"""
from __future__ import annotations

import bisect
import difflib
from dataclasses import dataclass

from . import inputs as inputs_mod, netpkt
from .equivalence import Spec
from .replay_semantic import AnalysisRun

KERNEL_LINE = inputs_mod.KERNEL_LINE
MASKED = b"<*>"


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


def _lines(chunks: list[tuple[int, bytes]]) -> list[Line]:
    """Split a timed byte stream into lines, each timed by the chunk its first byte
    came in. One join and one split: a console arrives a few bytes per chunk."""
    if not chunks:
        return []
    starts, off = [], 0
    for _, data in chunks:
        starts.append(off)
        off += len(data)
    text = b"".join(d for _, d in chunks)
    out, pos = [], 0
    parts = text.split(b"\n")
    if not parts[-1]:
        parts.pop()
    for p in parts:
        ns = chunks[bisect.bisect_right(starts, pos) - 1][0]
        out.append(Line(ns, p.rstrip(b"\r")))
        pos += len(p) + 1
    return out


def _mask_ranges(chunks: list[tuple[int, bytes]], ranges: list[tuple[int, int]]) -> list[tuple[int, bytes]]:
    if not ranges:
        return chunks
    out, off = [], 0
    for ns, data in chunks:
        b = bytearray(data)
        for start, end in ranges:
            lo, hi = max(start - off, 0), min(end - off, len(b))
            if lo < hi:
                b[lo:hi] = b"*" * (hi - lo)
        out.append((ns, bytes(b)))
        off += len(data)
    return out


def _apply(lines: list[Line], rules, serial: bool) -> list[Line]:
    out = []
    for l in lines:
        t = l.text
        if serial and rules.ignore_kernel_lines and KERNEL_LINE.match(t):
            continue
        if any(p.search(t) for p in rules.ignore):
            continue
        for p in rules.mask:
            t = p.sub(MASKED, t)
        out.append(Line(l.vm_ns, t))
    return out


def _reordered(a: list[Line], b: list[Line], opcodes, window: int) -> tuple[set[int], set[int]]:
    """Lines removed on one side and inserted within `window` lines on the other."""
    if not window:
        return set(), set()
    removed = [(i, j1 - i1) for op, i1, i2, j1, j2 in opcodes if op in ("replace", "delete")
               for i in range(i1, i2)]
    inserted = [j for op, i1, i2, j1, j2 in opcodes if op in ("replace", "insert") for j in range(j1, j2)]
    gone_a, gone_b = set(), set()
    for i, shift in removed:
        for j in inserted:
            if j not in gone_b and abs(j - (i + shift)) <= window and a[i].text == b[j].text:
                gone_a.add(i)
                gone_b.add(j)
                break
    return gone_a, gone_b


def _diff_stream(channel: str, a: list[Line], b: list[Line], spec: Spec, run: AnalysisRun,
                 window: int = 0) -> list[Divergence]:
    sm = difflib.SequenceMatcher(None, [l.text for l in a], [l.text for l in b], autojunk=False)
    out = []
    opcodes = sm.get_opcodes()
    gone_a, gone_b = _reordered(a, b, opcodes, window)
    for op, i1, i2, j1, j2 in opcodes:
        if op == "equal":
            if spec.max_lag_ns:
                for x, y in zip(a[i1:i2], b[j1:j2]):
                    if y.vm_ns - x.vm_ns > spec.max_lag_ns:
                        out.append(_div(channel, "lag", [x], [y], run,
                                        f"same output {(y.vm_ns - x.vm_ns) / 1e9:.3f}s of VM time later "
                                        f"than the native (bound {spec.max_lag_ns / 1e9:.3f}s): {x.text[:100]!r}"))
                        break
            continue
        na = [a[i] for i in range(i1, i2) if i not in gone_a]
        nb = [b[j] for j in range(j1, j2) if j not in gone_b]
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


def streams_native(rec: inputs_mod.Recording) -> dict[str, list[tuple[int, bytes]]]:
    s = {"serial": rec.serial_out}
    for fl in rec.flows:
        s[f"tcp flow {fl.index} ({fl.name()})"] = fl.guest_data
    for ns, (ip, port), payload in rec.udp_out:
        s.setdefault(f"udp {netpkt.ip_str(ip)}:{port}", []).append((ns, payload + b"\n"))
    return s


def streams_analysis(run: AnalysisRun, rec: inputs_mod.Recording) -> dict[str, list[tuple[int, bytes]]]:
    chunks, times = [], run.console_times + [(len(run.console), 0)]
    for (off, ns), (nxt, _) in zip(times, times[1:]):
        chunks.append((ns, bytes(run.console[off:nxt])))
    s = {"serial": chunks}
    for fl in rec.flows:
        pf = run.peer.flows.get(fl.index) if run.peer else None
        s[f"tcp flow {fl.index} ({fl.name()})"] = pf.guest_data if pf else []
    for ns, frame in run.net_out:
        f = netpkt.parse(frame)
        if f and f.eth_type == netpkt.ETH_IP and f.proto == netpkt.PROTO_UDP and not f.fragment:
            s.setdefault(f"udp {netpkt.ip_str(f.ip_dst)}:{f.dport}", []).append((ns, f.payload + b"\n"))
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
        ca, cb = a.get(name, []), b.get(name, [])
        if chan == "tcp":
            flow = int(name.split()[2])
            ranges = [(s, e) for f, s, e in rules.byte_ranges if f == flow]
            ca, cb = _mask_ranges(ca, ranges), _mask_ranges(cb, ranges)
        plain = not (rules.ignore or rules.mask or rules.ignore_kernel_lines or spec.max_lag_ns)
        if plain and b"".join(d for _, d in ca) == b"".join(d for _, d in cb):
            continue                # the common case, at memcmp speed
        la = _apply(_lines(ca), rules, chan == "serial")
        lb = _apply(_lines(cb), rules, chan == "serial")
        out += _diff_stream(name, la, lb, spec, run, rules.reorder_window)
    return out


def split_noise(divs: list[Divergence], noise: list[Divergence] | None) -> tuple[list[Divergence], int]:
    """(divergences beyond the noise, how many were noise)."""
    if not noise:
        return divs, 0
    keys = {d.key() for d in noise}
    real = [d for d in divs if d.key() not in keys]
    return real, len(divs) - len(real)


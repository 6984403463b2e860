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
import enum
import re
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import accumulate
from typing import Final

from ...formats import netpkt
from . import http_messages
from .. import inputs
from ..network.exchanges import without_ids
from .equivalence import MAX_RULED_LINE, ChannelRules, Spec
from ..model import AnalysisRun

KERNEL_LINE = inputs.KERNEL_LINE
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


@dataclass
class NotAnalysed:
    """Output of the native's that an analysis never reached (it ended early): not a
    divergence, since the analysis never got the inputs it answers."""
    channel: str
    native_ns: int | None       # VM time of its first line on the native
    lines: int
    first: bytes                # that line

    def describe(self) -> str:
        at = f" from native VM {self.native_ns / 1e9:.6f}s" if self.native_ns is not None else ""
        return f"{self.channel}: {self.lines} line(s){at}, the first {self.first[:80]!r}"


class _Stream:
    """A timed byte stream: its bytes, and where to look up the VM time of each (the
    Chunks it was cut from, or a list of writes), only when a line's time is needed."""
    __slots__ = ("_chunks", "_writes", "origin", "text")

    def __init__(self, text: bytes, chunks: inputs.Chunks | list[tuple[int, bytes]] | None = None,
                 writes: tuple[list[tuple[int, int]], int] | None = None, origin: int = 0):
        """Timed by `chunks`, whose stream offset `origin` is text[0], or by `writes`:
        ([(offset, VM time)], offset of text[0]) of a buffer text was cut from. `origin`:
        the stream offset of text[0] (a live comparison starts where the matched part ends)."""
        self.text = text
        if chunks is not None and not isinstance(chunks, inputs.Chunks):
            chunks = inputs.Chunks(chunks)      # a plain (VM ns, bytes) list
        self._chunks, self._writes, self.origin = chunks, writes, origin

    @classmethod
    def of_chunks(cls, chunks: inputs.Chunks | list[tuple[int, bytes]], start: int | None = None) -> _Stream:
        """The stream of a chunk list (inputs.Chunks, or a plain list), from stream
        offset `start` (default: its first byte kept): one copy of its buffer."""
        whole = chunks if isinstance(chunks, inputs.Chunks) else inputs.Chunks(chunks)
        origin = whole.base if start is None else max(start, whole.base)
        return cls(whole.bytes_from(origin), chunks=whole, origin=origin)

    def masked(self, ranges: list[tuple[int, int]]) -> _Stream:
        """The same stream with stream bytes [start, end) of each range replaced by '*'."""
        b = bytearray(self.text)
        for start, end in ranges:
            lo, hi = max(0, start - self.origin), min(end - self.origin, len(b))
            if lo < hi:
                b[lo:hi] = b"*" * (hi - lo)
        return _Stream(bytes(b), self._chunks, self._writes, self.origin)

    def time_masked(self) -> _Stream:
        """The same stream with the seconds and microseconds of each reply of redis's
        TIME shape replaced by as many NUL bytes (offsets and times kept: a live
        comparison matches on them); the resp rules mask a line of NULs."""
        if b"*2\r\n$" not in self.text:
            return self
        text = TIME_REPLY.sub(_nul_digits, self.text)
        return self if text == self.text else _Stream(text, self._chunks, self._writes, self.origin)

    def window(self, lo: int) -> _Stream:
        """The stream from its byte lo on (timed as it is)."""
        if self._writes is not None:
            writes, base = self._writes
            return _Stream(self.text[lo:], writes=(writes, base + lo), origin=self.origin + lo)
        return _Stream(self.text[lo:], self._chunks, origin=self.origin + lo)

    def cut(self, n: int) -> _Stream:
        """The stream's first n bytes (timed as it is)."""
        return _Stream(self.text[:n], self._chunks, self._writes, self.origin)

    def time_at(self, pos: int) -> int:
        """VM time of the chunk byte `pos` came in."""
        if self._writes is not None:
            writes, base = self._writes
            return writes[max(0, bisect.bisect_right(writes, (pos + base, _INF)) - 1)][1]
        if not self._chunks:
            return 0
        return self._chunks.time_at(self.origin + pos)

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


_EMPTY = _Stream(b"")
_INF = float("inf")
# redis's reply to TIME: an array of two bulk strings, the seconds and the microseconds
TIME_REPLY = re.compile(rb"\*2\r\n\$\d\d?\r\n(\d{1,20})\r\n\$\d\r\n(\d{1,6})\r\n")


def _nul_digits(m: re.Match[bytes]) -> bytes:
    """A TIME reply with its two numbers' digits replaced by as many NUL bytes."""
    t, base = m.group(), m.start()
    (a0, a1), (b0, b1) = (x - base for x in m.span(1)), (x - base for x in m.span(2))
    return t[:a0] + b"\0" * (a1 - a0) + t[a1:b0] + b"\0" * (b1 - b0) + t[b1:]


class _Drop(enum.Enum):
    LINE = "dropped"        # an enum member, not object(): `is not _DROP` narrows a line's type


_DROP: Final = _Drop.LINE


def _apply(lines: list[bytes], rules: ChannelRules, serial: bool,
           cache: dict[bytes, bytes | _Drop]) -> tuple[list[bytes], list[int]]:
    """The lines the spec keeps, rewritten by its masks, and their indices in `lines`.
    `cache` maps a line to its rewrite (_DROP: dropped), shared by both sides.

    The spec's patterns see a line of at most MAX_RULED_LINE bytes (equivalence.py: their
    time on one line is bounded by what a line that long allows, so their time on the
    output is linear in it); a longer line, or one the masks grew past that, is compared
    as it stands. The guest writes these lines: a 1 MB line of digits kept `\\d+x` busy
    for over half an hour."""
    out: list[bytes] = []
    kept: list[int] = []
    kernel = serial and rules.ignore_kernel_lines
    for i, t in enumerate(lines):
        r = cache.get(t)
        if r is None:
            r = cache[t] = _ruled(t, rules, kernel)
        if r is not _DROP:
            out.append(r)
            kept.append(i)
    return out, kept


def _ruled(t: bytes, rules: ChannelRules, kernel: bool) -> bytes | _Drop:
    """One line under the spec: dropped, or rewritten by its masks (a line's rewrite
    depends on that line alone: equal lines are equal under any spec)."""
    if (kernel and KERNEL_LINE.match(t)) or (len(t) <= MAX_RULED_LINE and any(p.search(t) for p in rules.ignore)):
        return _DROP
    r = t
    for p in rules.mask:
        if len(r) > MAX_RULED_LINE:
            break
        r = p.sub(MASKED, r)
    return r


def _common_prefix(la: list[bytes], lb: list[bytes], rules: ChannelRules, serial: bool, cache: dict) -> int:
    """How many leading lines two line lists have equal under the spec, line for line.
    Only lines that differ as they stand are ruled (an HTTP stream differs from its
    native's in its Date lines and nowhere else: 0.1 us a line, where ruling every line
    took 0.3-0.5 us); the whole comparison (rules on every line, difflib) takes over
    from the first pair that differs under the spec too."""
    kernel = serial and rules.ignore_kernel_lines
    n = 0
    for x, y in zip(la, lb):
        if x != y:
            rx = cache.get(x)
            if rx is None:
                rx = cache[x] = _ruled(x, rules, kernel)
            ry = cache.get(y)
            if ry is None:
                ry = cache[y] = _ruled(y, rules, kernel)
            if rx != ry:
                break
        n += 1
    return n


kept_lines = _apply     # for the release gate (gate.py): the same rules, line by line


class _Side:
    """One side of a stream as lines after the spec; a line's time is looked up only
    when it is reported."""
    __slots__ = ("end", "kept", "starts", "stream", "texts")

    def __init__(self, stream: _Stream, rules, serial: bool, cache: dict,
                 split: tuple[list[bytes], list[int]] | None = None):
        lines, self.starts = split or stream.lines()
        self.stream, self.end = stream, len(stream.text)
        self.texts, self.kept = _apply(lines, rules, serial, cache)

    @classmethod
    def whole_lines(cls, stream: _Stream, rules, serial: bool, cache: dict) -> _Side:
        """The side's complete lines only (what a live comparison can match yet)."""
        end = stream.text.rfind(b"\n") + 1
        side = cls(_Stream(stream.text[:end]), rules, serial, cache)
        side.stream, side.end = stream, end
        return side

    def part(self, i: int, j: int) -> _Side:
        """Kept lines i..j-1 only."""
        p = object.__new__(_Side)
        p.stream, p.starts, p.end = self.stream, self.starts, self.end
        p.texts, p.kept = self.texts[i:j], self.kept[i:j]
        return p

    def cut(self, i: int) -> int:
        """Offset just past kept line i-1 and the dropped lines after it: where kept
        line i starts (the end of the complete lines if there is none)."""
        return self.starts[self.kept[i]] if i < len(self.kept) else self.end

    def vm_ns(self, i: int) -> int:
        return self.stream.time_at(self.starts[self.kept[i]])

    def line(self, i: int) -> Line:
        return Line(self.vm_ns(i), self.texts[i])


def _compare_lines(name: str, sa: _Stream, sb: _Stream, rules, serial: bool, spec: Spec,
                   run: AnalysisRun, unreached: list[NotAnalysed] | None = None) -> list[Divergence]:
    cache: dict = {}
    la, lb = sa.lines(), sb.lines()
    if not spec.max_lag_ns:         # a lag bound compares every line's time: no shortcut
        k = _common_prefix(la[0], lb[0], rules, serial, cache)
        if k == len(la[0]) == len(lb[0]):
            return []
        la, lb = (la[0][k:], la[1][k:]), (lb[0][k:], lb[1][k:])    # from the first difference on
    a, b = _Side(sa, rules, serial, cache, la), _Side(sb, rules, serial, cache, lb)
    if a.texts == b.texts and not spec.max_lag_ns:
        return []                   # difflib would find one 'equal' block
    return _diff_stream(name, a, b, spec, run, rules.reorder_window, unreached)


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
                 window: int = 0, unreached: list[NotAnalysed] | None = None) -> list[Divergence]:
    """The differences of two sides. With `unreached` (the analysis ended early), native
    lines at the end that the analysis has nothing after are not a divergence: they go
    into `unreached`, as output it never reached."""
    sm = difflib.SequenceMatcher(None, a.texts, b.texts, autojunk=False)
    out = []
    opcodes = sm.get_opcodes()
    if unreached is not None and opcodes and (opcodes[-1][0] == "delete" and opcodes[-1][3] == len(b.texts)
                                              or _cut_short(a, b, opcodes[-1])):
        _, i1, i2, _, _ = opcodes.pop()
        unreached.append(NotAnalysed(channel, a.vm_ns(i1), i2 - i1, a.texts[i1]))
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
        out.append(_div(channel, kind, na, nb, run, diff, _where(b, j1, na[0].vm_ns) if not nb else None))
    return out


def _where(b: _Side, j: int, native_ns: int) -> tuple[int, bool]:
    """Where lines the analysis lacks belong (just before its kept line j), and whether that
    is a native time: the analysis's line before the gap, which answers the same request,
    else the one after it; on a channel it wrote nothing on, the native's time of its first
    line, which the inputs the native had then were recorded before (the analysis may have
    taken them later than that time on its own clock)."""
    if j:
        return b.vm_ns(j - 1), False
    return (b.vm_ns(j), False) if j < len(b.texts) else (native_ns, True)


def _cut_short(a: _Side, b: _Side, last: tuple[str, int, int, int, int]) -> bool:
    """The last difference is only the line an early-ended analysis was writing when it
    stopped: its one unterminated last line, which the native's line there begins with
    (as written, before the spec's rules: a mask may need the whole line)."""
    op, i1, _, j1, j2 = last
    text = b.stream.text
    if op != "replace" or j2 != len(b.texts) or j2 - j1 != 1 or b.end != len(text) or text.endswith(b"\n"):
        return False
    return _raw(a, i1).startswith(_raw(b, j1))


def _raw(side: _Side, i: int) -> bytes:
    """Kept line i of a side as the guest wrote it (without its newline and trailing \r)."""
    text, start = side.stream.text, side.starts[side.kept[i]]
    end = text.find(b"\n", start)
    return text[start:end if end >= 0 else len(text)].rstrip(b"\r")


def _div(channel, kind, na, nb, run: AnalysisRun, diff, where: tuple[int, bool] | None = None) -> Divergence:
    """A divergence, after the input the analysis had last taken where it is: at its
    first line, or for lines it lacks at `where` (_where)."""
    ans = nb[0].vm_ns if nb else None
    flow = int(channel.split()[2]) if channel.startswith("tcp flow ") else None
    at, native_time = (ans, False) if ans is not None else where if where is not None else (None, False)
    before = run.input_before(at, flow, recorded=native_time) if at is not None else None
    return Divergence(channel, kind, na, nb, na[0].vm_ns if na else None, ans,
                      before.input.describe() if before else "none (before the first input)", diff)


def channel(fl: inputs.Flow) -> str:
    """A TCP flow's channel name."""
    return fl.channel


def _flows(rec: inputs.RecordedInputs, only: set | None) -> Iterable[inputs.Flow]:
    """The flows of the recording not retired, or only those named in `only` (looked up
    by index: a connection compared as it closes is one of thousands)."""
    if only is None:
        return (fl for fl in rec.flows if fl is not None)
    picked = (rec.flows[i] for i in sorted({int(n.split()[2]) for n in only if n.startswith("tcp flow ")})
              if i < len(rec.flows))
    return (fl for fl in picked if fl is not None and fl.channel in only)


def streams_native(rec: inputs.RecordedInputs, at: dict | None = None,
                   only: set | None = None) -> dict[str, _Stream]:
    """The native's output streams (from what `at` says was matched: channel ->
    (native offset, analysis offset); only the channels in `only`, if given, where
    "udp" stands for every UDP destination)."""
    at = at or {}
    s = {}
    if only is None or "serial" in only:
        s["serial"] = _Stream.of_chunks(rec.serial_out, at.get("serial", (None,))[0])
    for fl in _flows(rec, only):
        name = fl.channel
        s[name] = _Stream.of_chunks(fl.guest_data, at.get(name, (None,))[0])
    s.update(_datagram_streams(rec.udp_out if only is None or "udp" in only else ()))
    return s


def _datagram_streams(datagrams) -> dict[str, _Stream]:
    """The guest's UDP datagrams [(VM ns, (dst ip, port), payload)] as one stream per
    destination, a line each (without the ids each guest draws: exchanges.without_ids). A
    datagram that repeats the one before it to the same destination is a retransmission
    (a DHCP client's DISCOVER again, a DNS question again): how often a guest retransmits
    follows its timing, not what it does, and is compared once (a KASAN shadow booting
    under load may send three DISCOVERs more than its native)."""
    udp: dict[str, list[tuple[int, bytes]]] = {}
    for ns, (ip, port), payload in datagrams:
        line = without_ids(port, payload) + b"\n"
        lines = udp.setdefault(f"udp {netpkt.ip_str(ip)}:{port}", [])
        if not lines or lines[-1][1] != line:
            lines.append((ns, line))
    return {k: _Stream.of_chunks(v) for k, v in udp.items()}


def streams_analysis(run: AnalysisRun, rec: inputs.RecordedInputs, at: dict | None = None,
                     only: set | None = None) -> dict[str, _Stream]:
    at = at or {}
    s = {}
    if only is None or "serial" in only:
        # The console is one buffer; each write's (offset, VM time) indexes it.
        start = at["serial"][1] if "serial" in at else \
            run.console_times[0][0] if run.console_times else run.console_base + len(run.console)
        s["serial"] = _Stream(bytes(run.console[start - run.console_base:]),
                              writes=(run.console_times, start), origin=start)
    for fl in _flows(rec, only):
        name = fl.channel
        out = run.net.flows.get(fl.index) if run.net else None
        s[name] = _Stream.of_chunks(out.data if out else [], at.get(name, (0, None))[1])
    if only is not None and "udp" not in only:
        return s
    # The guest's UDP datagrams: the replayer's peer kept them as it parsed each frame.
    if run.net is not None:
        datagrams = run.net.udp_out
    else:                           # a run that stopped before replaying: parse what it has
        datagrams = []
        for ns, frame in run.net_out or ():
            f = netpkt.parse(frame)
            if f and f.eth_type in (netpkt.ETH_IP, netpkt.ETH_IP6) and f.proto == netpkt.PROTO_UDP and not f.fragment:
                datagrams.append((ns, (f.ip_dst, f.dport), f.payload))
    s.update(_datagram_streams(datagrams))
    return s


def compare(rec: inputs.RecordedInputs, run: AnalysisRun, spec: Spec, at: dict | None = None,
            only: set | None = None, unreached: list[NotAnalysed] | None = None,
            as_lines: set[str] | frozenset[str] = frozenset()) -> list[Divergence]:
    """Every difference between the native's outputs and the analysis run's (from
    what `at` says was already matched; in the channels of `only`, if given). With
    `unreached` (a run that ended early), what the native output at the end of a
    channel and the analysis never did goes there, not into the divergences.
    `as_lines`: connections compared as lines whatever they carry (a live comparison
    left HTTP framing there: live_compare.py)."""
    a, b = streams_native(rec, at, only), streams_analysis(run, rec, at, only)
    out = []
    for name in sorted(set(a) | set(b), key=lambda n: (n != "serial", n)):
        fl = flow_of(name, rec)
        sa, sb = a.get(name, _EMPTY), b.get(name, _EMPTY)
        if fl is not None and fl.reset_starting and not sa.text:
            continue        # the native's service was starting: what the analysis's answered is not compared
        if fl is not None and fl.asks_time and sa.text != sb.text:
            sa, sb = sa.time_masked(), sb.time_masked()
        out += compare_channel(name, sa, sb, spec_of(name, rec, spec), run,
                               unreached, reset=fl is not None and fl.client_reset,
                               protocol=fl.protocol if fl is not None and name not in as_lines else None)
    return out


def flow_of(name: str, rec: inputs.RecordedInputs) -> inputs.Flow | None:
    """The recorded flow a channel is (None: not a connection, or retired)."""
    if not name.startswith("tcp flow "):
        return None
    index = int(name.split()[2])
    return rec.flows[index] if index < len(rec.flows) else None


def spec_of(name: str, rec: inputs.RecordedInputs, spec: Spec) -> Spec:
    """The spec a channel is compared under: a connection's with its protocol's rules."""
    fl = flow_of(name, rec)
    return spec.for_protocol(fl.protocol) if fl is not None else spec


def channel_rules(name: str, spec: Spec) -> tuple[ChannelRules | None, list[tuple[int, int]]]:
    """The spec's rules for a channel and the byte ranges it masks (None: not compared)."""
    chan = name.split(" ")[0]
    if chan in spec.ignore_channels:
        return None, []
    rules = spec.rules[chan]
    ranges = []
    if chan == "tcp" and rules.byte_ranges:
        flow = int(name.split()[2])
        ranges = [(s, e) for f, s, e in rules.byte_ranges if f == flow]
    return rules, ranges


def compare_channel(name: str, sa: _Stream, sb: _Stream, spec: Spec, run: AnalysisRun,
                    unreached: list[NotAnalysed] | None = None, reset: bool = False,
                    protocol: str | None = None) -> list[Divergence]:
    """The differences on one channel. `reset`: the remote side reset the connection, so
    the native's output ends where the client stopped reading; the analysis's is
    compared only that far (_cut_to_native). `protocol` "http": compared response by
    response (compare_http)."""
    rules, ranges = channel_rules(name, spec)
    if rules is None:
        return []
    if ranges:
        sa, sb = sa.masked(ranges), sb.masked(ranges)
    http = protocol == "http" and not spec.max_lag_ns
    if reset and len(sb.text) > len(sa.text) and not http:     # (compare_http cuts its own)
        sb = _cut_to_native(sa, sb, rules, name == "serial")
    if not spec.max_lag_ns and sa.text == sb.text:
        return []                   # the common case, at memcmp speed: equal lines are equal under any spec
    if http:
        return compare_http(name, sa, sb, rules, spec, run, unreached, reset)
    return _compare_lines(name, sa, sb, rules, name == "serial", spec, run, unreached)


def compare_http(name: str, sa: _Stream, sb: _Stream, rules: ChannelRules, spec: Spec, run: AnalysisRun,
                 unreached: list[NotAnalysed] | None = None, reset: bool = False) -> list[Divergence]:
    """An HTTP connection's two streams, response by response (http_messages.py: chunked
    or not, headers in any order), then what is not a response on either side (a
    response missing at the end, a cut one, bytes that do not parse) as lines. `reset`:
    the client reset it, and what is left of the analysis's after the responses both
    have is cut to the native's (_cut_to_native on those bytes alone: on the whole
    stream it split 13 MB into lines, 90% of an HTTP comparison's time)."""
    fa, fb = http_messages.frame(sa.text, closed=True), http_messages.frame(sb.text, closed=True)
    n = min(len(fa.responses), len(fb.responses))
    out: list[Divergence] = []
    agreed: set[tuple[bytes, bytes]] = set()
    for x, y in zip(fa.responses[:n], fb.responses[:n]):
        out += compare_response(name, sa, sb, x, y, rules, spec, run, agreed)
    ra = fa.responses[n].start if n < len(fa.responses) else fa.end
    rb = fb.responses[n].start if n < len(fb.responses) else fb.end
    ta, tb = sa.window(ra), sb.window(rb)
    if reset and len(tb.text) > len(ta.text):
        tb = _cut_to_native(ta, tb, rules, False)
    if ta.text != tb.text:
        out += _compare_lines(name, ta, tb, rules, False, spec, run, unreached)
    return out


def compare_response(name: str, sa: _Stream, sb: _Stream, x: http_messages.Response, y: http_messages.Response,
                     rules: ChannelRules, spec: Spec, run: AnalysisRun,
                     agreed: set[tuple[bytes, bytes]] | None = None) -> list[Divergence]:
    """One response of each side: their canonical heads as lines under the spec, then
    their bodies (bytes first, in place: a 64 KiB body is one memcmp; as lines if they
    differ). `agreed`: pairs of heads found equal under the spec before, on this
    connection (a keep-alive connection's replies differ in their Date, which changes
    once a second: most pairs come again)."""
    if _same(sa.text, x.start, x.end, sb.text, y.start, y.end):
        return []
    out = []
    ha, hb = x.canonical_head(), y.canonical_head()
    if ha != hb and (agreed is None or (ha, hb) not in agreed):
        found = _compare_lines(name, _Stream(ha, writes=([(0, sa.time_at(x.start))], 0)),
                               _Stream(hb, writes=([(0, sb.time_at(y.start))], 0)), rules, False, spec, run)
        if not found and agreed is not None and len(agreed) < AGREED_HEADS:
            agreed.add((ha, hb))
        out += found
    if x.body and y.body and _same(sa.text, *x.body, sb.text, *y.body):
        return out
    ba, bb = _body(sa, x), _body(sb, y)
    if ba.text != bb.text:
        out += _compare_lines(name, ba, bb, rules, False, spec, run)
    return out


AGREED_HEADS = 1000     # pairs of heads remembered per connection


def _same(a: bytes, a0: int, a1: int, b: bytes, b0: int, b1: int) -> bool:
    """a[a0:a1] == b[b0:b1], without copying either (6 us for 64 KiB, where the two
    slices and their comparison took 24 us)."""
    if a1 - a0 != b1 - b0:
        return False
    with memoryview(b) as m:
        return a.startswith(m[b0:b1], a0)


def _body(s: _Stream, r: http_messages.Response) -> _Stream:
    """A response's body as the client got it, timed by the stream's time at its first byte."""
    return _Stream(r.body_bytes(s.text), writes=([(0, s.time_at(r.body_at))], 0))


def _cut_to_native(sa: _Stream, sb: _Stream, rules: ChannelRules, serial: bool) -> _Stream:
    """The analysis's stream of a connection its client reset, as far as the native's
    went. The client (wrk ending its run) reset it mid-response; the analysis, on its own
    timing, sent more of that response before the reset reached it (3 of wrk's 4
    connections in `bench semantic --only protocols`). What it sent past the point
    matching the native's end reached no one and is no divergence. That point is found
    line by line under the spec (a Date line may differ in length): as many bytes past
    the lines both have equal as the native has past them."""
    if sb.text.startswith(sa.text):
        keep = len(sa.text)         # the common case: the same bytes, at memcmp speed
    else:
        la, lb = sa.lines(), sb.lines()
        k = _common_prefix(la[0], lb[0], rules, serial, {})
        at_a = la[1][k] if k < len(la[1]) else len(sa.text)
        at_b = lb[1][k] if k < len(lb[1]) else len(sb.text)
        keep = at_b + len(sa.text) - at_a
    return sb.cut(keep)


RESYNC_LINES = 4    # after a difference, this many equal lines on both sides end it
RESYNC_MAX = 200    # lines searched for them; a longer difference is compared at the end


def matched(name: str, sa: _Stream, sb: _Stream, spec: Spec, cache: dict,
            run: AnalysisRun) -> tuple[int, int, list[Divergence], bool]:
    """Compare two streams from their starts as far as their complete lines allow
    (a live comparison, live_compare.py): (native offset, analysis offset) up to which
    they are compared, the divergences found there, and whether the comparison is
    stuck (a difference no RESYNC_LINES equal lines end within RESYNC_MAX lines: the
    channel is then compared whole at its end).

    Equal lines under the spec are matched one for one; at a difference, the next
    RESYNC_LINES lines equal on both sides end it, and the lines between are diffed
    as compare() diffs a stream (a reordering within the spec's window is no
    divergence). The part after the last match waits for more lines. Lines the spec
    drops are skipped; with max_lag (timing) the channel is only compared at its end."""
    rules, ranges = channel_rules(name, spec)
    if rules is None:
        return sa.origin + len(sa.text), sb.origin + len(sb.text), [], False
    if spec.max_lag_ns:
        return sa.origin, sb.origin, [], True
    if ranges:
        sa, sb = sa.masked(ranges), sb.masked(ranges)
    same = equal_lines(sa.text, sb.text)
    if same:                    # equal as they stand: equal under any spec, matched one for one
        sa, sb = sa.window(same), sb.window(same)
    serial = name == "serial"
    drops = bool(rules.ignore) or (serial and rules.ignore_kernel_lines)
    if not drops and (b"\n" not in sa.text or b"\n" not in sb.text):
        # One side is behind (an analysis trails the native by thousands of lines): with no
        # line to drop, nothing more can match until it has a line; the other side's are
        # not ruled again at every tick.
        return sa.origin, sb.origin, [], False
    a, b = _Side.whole_lines(sa, rules, serial, cache), _Side.whole_lines(sb, rules, serial, cache)
    ta, tb = a.texts, b.texts
    ia = ib = 0
    divs: list[Divergence] = []
    stuck = False
    while True:
        while ia < len(ta) and ib < len(tb) and ta[ia] == tb[ib]:
            ia, ib = ia + 1, ib + 1
        if ia == len(ta) or ib == len(tb):
            break                           # one side is behind: wait for it
        m = _reordered_block(ta, tb, ia, ib, rules.reorder_window)
        if m:
            ia, ib = ia + m, ib + m         # the same lines, reordered within the window
            continue
        if m is None:
            break                           # maybe a reordering: wait for more lines
        r = _resync(ta, tb, ia, ib)
        if r is None:
            stuck = len(ta) - ia > RESYNC_MAX + RESYNC_LINES and len(tb) - ib > RESYNC_MAX + RESYNC_LINES
            break
        divs += _diff_stream(name, a.part(ia, r[0]), b.part(ib, r[1]), spec, run, rules.reorder_window)
        ia, ib = r
    if ia == 0 and ib == 0 and (ta or tb):
        return sa.origin, sb.origin, divs, stuck
    return sa.origin + a.cut(ia), sb.origin + b.cut(ib), divs, stuck


def equal_lines(a: bytes, b: bytes) -> int:
    """Bytes of the whole lines two texts start with, byte for byte: what a live
    comparison matches without splitting or ruling a line (the spec's rules ran over
    every pending line at every tick: a third of tandem's CPU replaying a heavy demo
    recording). Found by memcmp, binary search over the common length."""
    n = min(len(a), len(b))
    with memoryview(b) as mb:
        if a.startswith(mb[:n]):
            same = n
        else:
            lo, hi = 0, n               # a[:lo] == b[:lo], a[:hi] != b[:hi]
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if a.startswith(mb[:mid]):
                    lo = mid
                else:
                    hi = mid
            same = lo
    return a.rfind(b"\n", 0, same) + 1


def _reordered_block(ta: list[bytes], tb: list[bytes], ia: int, ib: int, window: int) -> int | None:
    """At a difference: the length of the shortest block from (ia, ib) that holds the
    same lines on both sides, each at most `window` lines from its place (a
    reordering, as _reordered sees one); 0 if there is none, None if more lines are
    needed to tell."""
    if not window:
        return 0
    for m in range(2, window + 1):
        if ia + m > len(ta) or ib + m > len(tb):
            return None
        if sorted(ta[ia:ia + m]) == sorted(tb[ib:ib + m]):
            return m
    return 0


def _resync(ta: list[bytes], tb: list[bytes], ia: int, ib: int) -> tuple[int, int] | None:
    """After a difference at (ia, ib): the nearest (i, j) from which RESYNC_LINES lines
    are equal on both sides, if any within RESYNC_MAX lines."""
    n = RESYNC_LINES
    at: dict[tuple, int] = {}
    for j in range(ib, min(len(tb) - n, ib + RESYNC_MAX) + 1):
        at.setdefault(tuple(tb[j:j + n]), j)
    best = None
    for i in range(ia, min(len(ta) - n, ia + RESYNC_MAX) + 1):
        k = at.get(tuple(ta[i:i + n]))
        if k is not None and (i, k) != (ia, ib) and (best is None or i - ia + k - ib < best[0] - ia + best[1] - ib):
            best = (i, k)
    return best


def split_noise(divs: list[Divergence], noise: list[Divergence] | None) -> tuple[list[Divergence], int]:
    """(divergences beyond the noise, how many were noise)."""
    if not noise:
        return divs, 0
    keys = {d.key() for d in noise}
    real = [d for d in divs if d.key() not in keys]
    return real, len(divs) - len(real)


"""Comparing a live analysis with the native as both run, so that tandem's memory
does not grow with the length of a shadow run.

A finished recording is compared whole (compare.compare). A live one never finishes
until the native stops, so each analysis compares as it goes, from its own thread
(LiveCompare.tick, every semantic.model.TICK_S): on every channel (the console and
each TCP connection) the longest prefix of complete lines that the native and the
analysis agree on under the equivalence spec is *matched*, and neither side needs
it any more. The analysis drops its side at once; the native's side is dropped by
live.shadow.ShadowRun once every analysis has matched it (or ended).

A difference ends where RESYNC_LINES equal lines follow it on both sides; the lines
between are diffed as compare.compare diffs a whole stream, and the divergences are
kept (compare.matched). A difference that does not end within RESYNC_MAX lines makes
the channel *stuck*: it is kept from there and compared whole when the connection
closes, or at the end of the run; but once either side has STUCK_MAX bytes kept, it
is compared whole then, and not compared further (a console that never resyncs
would otherwise keep the whole run): that is reported in the run's limits.

A connection both sides have closed, and whose inputs this analysis has all taken,
is compared to its end (compare.compare on what is not matched yet) and forgotten;
live.shadow.ShadowRun retires the native's once every analysis is done with it.

An analysis that ends early (crashed, hung, detached) is compared at once, up to
what the native had then; connections it never saw are not compared, and that is
said once.
"""
from __future__ import annotations

from collections.abc import Callable

from . import compare, http_messages
from .. import inputs
from .compare import Divergence, NotAnalysed, _Stream
from .equivalence import Spec
from ..model import AnalysisRun, Outcome

CACHE_LINES = 10_000    # lines whose rewrite under the spec is remembered, at most
STUCK_MAX = 1 << 20     # bytes a stuck channel keeps, per side, before it is compared and left
GIST_LINE = 4096        # bytes looked at for the first line of output not analysed
OFFLINE_STUCK_MAX = 64 << 20    # the same, reading a finished bundle (nothing waits on the memory)


class LiveCompare:
    def __init__(self, rec: inputs.RecordedInputs, spec: Spec, stuck_max: int | None = None):
        """stuck_max: bytes a stuck channel keeps per side (default STUCK_MAX)."""
        self.rec, self.spec = rec, spec
        self.stuck_max = stuck_max or STUCK_MAX
        self.at: dict[str, tuple[int, int]] = {}   # channel -> (native, analysis) offsets matched
        self.stuck: set[str] = set()               # channels with a difference: compared whole
        self.left: set[str] = set()                # stuck past STUCK_MAX: compared no further
        self.as_lines: set[str] = set()            # HTTP connections compared as lines from where framing stopped
        self._agreed: dict[str, set] = {}          # HTTP connection -> pairs of heads equal under the spec
        self.done: set[int] = set()                # flows compared to their end (live.shadow.ShadowRun retires them)
        self.divergences: list[Divergence] = []
        self.not_analysed: list[NotAnalysed] = []   # the native's output an early-ended analysis never reached
        self.finished = False                      # compared to the end: the native's data is not needed
        # () -> console offset a report in progress starts at
        self.keep_console_from: Callable[[], int] | None = None
        # (flow) -> analysis output the release gate has not copied
        self.keep_flow_from: Callable[[int], int] | None = None
        self._cache: dict[int, dict] = {}          # id(spec for the channel) -> line -> its rewrite under it
        self._seen: dict[str, tuple[int, int]] = {}  # channel -> stream ends at its last try

    def native_at(self, name: str) -> int:
        """Where the native's side of a channel is still needed from, for this analysis."""
        return self.at.get(name, (0, 0))[0]

    def tick(self, run: AnalysisRun) -> set[int]:
        """Match what is new, compare closed connections, drop this analysis's side. The
        connections done with (compared to their end, or never opened here): the run
        forgets them."""
        self._match("serial", self.rec.serial_out, run)
        net = run.net
        if net is None:
            return set()
        done = set(net.not_opened)              # nothing to compare: retired by the shadow's _trim
        self.done |= done
        for index, out in net.flows.items():
            fl = self.rec.flows[index]
            if fl is None or index in self.done:
                continue
            name = compare.channel(fl)
            self._match(name, fl.guest_data, run, out.data)
            if fl.closed and out.over and not run.waits_on(index, self.rec):
                self._compare_flow(name, fl, run)
                self.done.add(index)
                done.add(index)
        for index in done:
            run.last_input_of.pop(index, None)
        return done

    def _match(self, name: str, native: inputs.Chunks, run: AnalysisRun, theirs: inputs.Chunks | None = None):
        n_at, a_at = self.at.get(name, (native.base, 0))
        a_end = run.console_base + len(run.console) if theirs is None else theirs.end
        if name in self.stuck:
            if max(native.end - n_at, a_end - a_at) < self.stuck_max:
                return
            self._leave(name, run)                  # compared to here, and no further
        if name in self.left:
            self.at[name] = (native.end, a_end)
            self._drop(name, a_end, run, theirs)
            return
        if self._seen.get(name) == (native.end, a_end):
            return                                  # nothing new on either side
        self._seen[name] = (native.end, a_end)
        with self.rec.lock:
            sa = _Stream.of_chunks(native, n_at)
        if theirs is None:
            sb = _Stream(bytes(run.console[a_at - run.console_base:]), writes=(run.console_times, a_at),
                         origin=a_at)
        else:
            sb = _Stream.of_chunks(theirs, a_at)
        spec = compare.spec_of(name, self.rec, self.spec)
        fl = compare.flow_of(name, self.rec)
        if fl is not None and fl.asks_time:
            sa, sb = sa.time_masked(), sb.time_masked()
        if fl is not None and fl.protocol == "http" and name not in self.as_lines and not spec.max_lag_ns:
            n_to, a_to, divs, stuck = self._match_http(name, sa, sb, spec, run)
        else:
            n_to, a_to, divs, stuck = compare.matched(name, sa, sb, spec, self._cache.setdefault(id(spec), {}), run)
        self.divergences += divs
        if stuck:
            self.stuck.add(name)
        if (n_to, a_to) != (n_at, a_at):
            self.at[name] = (n_to, a_to)
        self._drop(name, a_to, run, theirs)

    def _match_http(self, name: str, sa: _Stream, sb: _Stream, spec: Spec,
                    run: AnalysisRun) -> tuple[int, int, list[Divergence], bool]:
        """An HTTP connection, as compare.compare_http compares it: the responses complete
        on both sides, pair by pair. Where either side stops parsing as responses, or a
        response in progress holds stuck_max bytes on a side (a large download), the
        connection is matched as lines from that response on (as_lines)."""
        rules, ranges = compare.channel_rules(name, spec)
        if rules is None:
            return sa.origin + len(sa.text), sb.origin + len(sb.text), [], False
        if ranges:
            sa, sb = sa.masked(ranges), sb.masked(ranges)
        fa = http_messages.frame(sa.text, closed=False)
        fb = http_messages.frame(sb.text, closed=False)
        n = min(len(fa.responses), len(fb.responses))
        divs = []
        for x, y in zip(fa.responses[:n], fb.responses[:n]):
            divs += compare.compare_response(name, sa, sb, x, y, rules, spec, run, self._agreed.setdefault(name, set()))
        n_to = sa.origin + (fa.responses[n - 1].end if n else 0)
        a_to = sb.origin + (fb.responses[n - 1].end if n else 0)
        if ((fa.bad and len(fa.responses) == n) or (fb.bad and len(fb.responses) == n)
                or sa.origin + len(sa.text) - n_to >= self.stuck_max or sb.origin + len(sb.text) - a_to >= self.stuck_max):
            self.as_lines.add(name)
        return n_to, a_to, divs, False

    def _drop(self, name: str, a_to: int, run: AnalysisRun, theirs: inputs.Chunks | None) -> None:
        """This analysis's side of a channel is done with before a_to: it goes, but for
        what the release gate or the report scanner still read."""
        if theirs is not None:
            index = int(name.split()[2])
            keep = self.keep_flow_from(index) if self.keep_flow_from else a_to
            with self.rec.lock:         # the release gate reads it from its own thread
                theirs.drop_to(min(a_to, keep))
        else:
            keep = self.keep_console_from() if self.keep_console_from else a_to
            run.drop_console(min(a_to, keep))
        if sum(map(len, self._cache.values())) > CACHE_LINES:  # lines of a long run: do not keep them all
            self._cache.clear()

    def _compare_flow(self, name: str, fl: inputs.Flow, run: AnalysisRun) -> None:
        if name not in self.left:
            with self.rec.lock:
                self.divergences += compare.compare(self.rec, run, self.spec, self.at, {name}, as_lines=self.as_lines)
        self.at.pop(name, None)
        self.stuck.discard(name)
        self.left.discard(name)
        self.as_lines.discard(name)
        self._agreed.pop(name, None)
        self._seen.pop(name, None)

    def _leave(self, name: str, run: AnalysisRun) -> None:
        """A stuck channel has STUCK_MAX bytes on a side: compare it whole now, and say
        that it is compared no further."""
        with self.rec.lock:
            divs = compare.compare(self.rec, run, self.spec, self.at, {name}, as_lines=self.as_lines)
        self.divergences += divs
        self.stuck.discard(name)
        self.left.add(name)
        ns = divs[0].native_ns if divs else None
        since = f" from VM {ns / 1e9:.6f}s" if ns is not None else ""
        why = ("its spec compares output times (max_lag), which takes the channel whole" if self.spec.max_lag_ns
               else f"the outputs differ{since} with no {compare.RESYNC_LINES} equal lines ending it")
        more = (f" (the native's bundle keeps it all: tandem replay BUNDLE --analysis {run.analysis} "
                f"compares {OFFLINE_STUCK_MAX >> 20} MiB of it)" if self.stuck_max < OFFLINE_STUCK_MAX else "")
        run.limits.append(f"{name}: {why}; compared to {self.stuck_max:,} bytes, not after{more}")

    def finish(self, run: AnalysisRun) -> None:
        """The analysis has ended: compare what is left (the console, the connections
        not compared yet), against what the native has produced so far. One that ended
        early (crashed, hung, lagging, detached) never reached the native's output after
        its last input: that is not analysed (not_analysed), not a divergence."""
        early = run.outcome not in (Outcome.POWEROFF, Outcome.FINISHED)
        unreached = self.not_analysed if early else None
        seen = run.net.flows if run.net else {}
        with self.rec.lock:
            names = {"serial"} - self.left
            for fl in self.rec.flows:
                if fl is None or fl.index in self.done:
                    continue
                if early and fl.index not in seen:
                    first = fl.guest_data.head(GIST_LINE)
                    lines = fl.guest_data.buf.count(b"\n")
                    self.not_analysed.append(NotAnalysed(compare.channel(fl), fl.opened_ns, lines,
                                                         first.split(b"\n")[0]))
                    continue
                if compare.channel(fl) not in self.left:
                    names.add(compare.channel(fl))
            if not early:
                names.add("udp")            # datagrams: compared whole, at the end
            elif self.rec.udp_out:
                ns, (ip, port), payload = self.rec.udp_out[0]
                self.not_analysed.append(NotAnalysed("udp", ns, len(self.rec.udp_out), payload[:80]))
            self.divergences += compare.compare(self.rec, run, self.spec, self.at, names, unreached, self.as_lines)
        self.finished = True

"""Analyses trailing a recording as it is read (FreeDA's followers), with memory that
follows what is in flight, not the recording's length.

Both ways of analysing a recording use this: `tandem shadow` reads a live native's
device log as its QEMU writes it (live/shadow.py), `tandem replay --analysis` reads a
finished bundle's no further ahead than its slowest analysis needs (analyze.py). Either
way the log is turned into inputs in place (inputs.InputExtractor into `rec`, which
stays unfinished until the log's end), each analysis VM runs driving.replay.run on it
in a thread of its own, compares its outputs with the native's as it goes
(live_compare.LiveCompare) and reports findings the moment their report completes;
`trim()`, called by the reading thread, drops the inputs every analysis has taken, the
output every analysis has matched, and the connections every analysis has compared.

Measured (docs/benchmarks.md, shadow memory): a live run's Python heap grows by under
a byte per request over 60,000 requests. Loaded whole, a 20 s heavy recording (203k
events) would pass 100,000 inputs held, and a longer one would hold every input and frame.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TextIO

from .. import catalog, report
from ..errors import TandemError
from ..lifecycle import Lifecycle
from . import inputs, model
from . import findings
from .driving import replay
from .driving.replay import RunOptions
from .comparison.equivalence import Spec
from .comparison.live_compare import LiveCompare

log = logging.getLogger(__name__)

# close(): an analysis told to stop ends at its driver's next pass (a second at most) and
# seals its bundle; this is what each may take before close() stops waiting for it.
CLOSE_WAIT_S = 30.0
# trim(): how often, in wall seconds, it goes through the open connections. A bundle's
# reader runs ahead of its analyses by up to analyze.READ_AHEAD_INPUTS, 1,200 connections
# open on a 30 s recording of ab and redis-benchmark, 2.5 ms a pass: at every call (each
# 512 events, and every 20 ms while the reader waits) it was 4 of the replayer's 9 s of CPU
# time beside a KASAN replay's 45.
FLOWS_TRIM_S = 0.25
# A report open on a console that has written nothing for this long in the analysis VM's
# own time is complete: a kernel prints a report in one go (a KASAN report, a FreeBSD
# WITNESS lock order reversal with its two stacks: a few ms of VM time), and a report
# that is the console's last words (a LOR nothing follows) has no line after it to end it.
REPORT_QUIET_NS = 1_000_000_000


def reports_of(scanner: report.Scanner, run: model.AnalysisRun, new: bytes, seen: int) -> list[report.Report]:
    """The reports `new` console bytes complete (`seen`: the console's bytes the scanner has
    had, these among them); every report left once the run has ended, or once the console
    has been quiet for REPORT_QUIET_NS of the run's VM time (its last stop) with a report
    or a line still open."""
    reps = scanner.feed(new) if new else []
    if run.outcome != "running":
        reps += scanner.flush()
    elif not new and scanner.pending_start < seen and run.end_ns - run.vm_time_at(seen - 1) >= REPORT_QUIET_NS:
        reps += scanner.flush()
    return reps


@dataclass
class Follower:
    """One analysis VM trailing the recording, and what it has shown so far."""
    of: catalog.Analysis                            # the analysis it runs
    buffer: model.Buffer
    cmp: LiveCompare
    analysis: str = field(init=False)               # its name, as outputs say it
    run: model.AnalysisRun | None = None
    console_seen: int = 0
    scanner: report.Scanner = field(init=False)     # its guest OS's console dialect (catalogue)
    thread: threading.Thread | None = None
    live_findings: list[findings.Finding] = field(default_factory=list)
    # findings.symbolizer, made at the first report
    symbolize: Callable[[report.Report], report.Report] | None = None

    def __post_init__(self) -> None:
        self.analysis = self.of.name
        self.scanner = report.Scanner(self.of.os)

    def ran(self) -> model.AnalysisRun:
        """Its run; one that never started (its thread failed, or is stuck, before the
        run's first report) is an error run, so the summary still has its line."""
        if self.run is None:
            self.run = model.AnalysisRun(self.analysis)
            self.run.outcome, self.run.detail = model.Outcome.ERROR, "the analysis VM never started"
        return self.run

    def running(self) -> bool:
        return not self.cmp.finished


class Trail(Lifecycle):
    """Analysis VMs trailing `rec` (filled in by the caller's reading thread), each in a
    thread of its own from start() on; join() waits for them to end by themselves (the
    recording's end), close() stops those still running."""

    def __init__(self, rec: inputs.RecordedInputs, analyses: list[catalog.Analysis], specs: dict[str, Spec],
                 buffers: dict[str, model.Buffer], *, run_options: Callable[[catalog.Analysis], RunOptions],
                 findings_file: TextIO | None = None, on_finding=None, stuck_max: int | None = None,
                 progress: Callable | None = None):
        """specs, buffers: by analysis name. run_options(analysis): how its VM runs
        (driving.replay.RunOptions: its guest, workdir, launcher, ...), made in the
        analysis's own thread as it starts. findings_file: findings.jsonl, a line written
        the moment each finding is reported; on_finding(finding) is called then too, from
        the analysis's thread. progress(analysis, run, delivered, taken): at each stop of
        an analysis VM."""
        self.rec, self.run_options, self.progress = rec, run_options, progress
        self.followers = [Follower(a, buffers[a.name], LiveCompare(rec, specs[a.name], stuck_max=stuck_max))
                          for a in analyses]
        self.findings_file, self.on_finding = findings_file, on_finding
        self.on_retire: Callable[[inputs.Flow], None] | None = None   # a flow every analysis is done with
        self._open_flows: set[int] = set()      # the recording's flows not retired yet
        self._flows_seen = 0
        self._flows_trimmed_at = float("-inf")  # monotonic time of trim()'s last pass through them
        self._lock = threading.Lock()           # findings_file
        self._started = False
        self._closing = False                   # close(): every analysis's stop() is true

    @property
    def started(self) -> bool:
        return self._started

    def start(self) -> Trail:
        self._started = True
        for f in self.followers:
            f.thread = threading.Thread(target=self._analyse, args=(f,), name=f"tandem-{f.analysis}",
                                        daemon=True)
            f.thread.start()
        return self

    def close(self) -> None:
        """Stop the analyses still running (their runs end "detached": what they found so
        far stays) and wait for them, CLOSE_WAIT_S each at most."""
        self._closing = True
        self.join(CLOSE_WAIT_S * len(self.followers))

    def join(self, timeout: float | None = None) -> bool:
        """Wait for every analysis to end (at most `timeout` seconds in all); True if they have."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for f in self.followers:
            if f.thread is not None:
                f.thread.join(None if deadline is None else max(1.0, deadline - time.monotonic()))
        return not any(f.thread is not None and f.thread.is_alive() for f in self.followers)

    # --- the reading side ---

    def trim(self) -> None:
        """Drop the recording's inputs every analysis has taken, its output every analysis
        has matched, and retire connections every analysis has compared to their end (an
        analysis that has ended and been compared needs nothing more; the connections at
        most every FLOWS_TRIM_S while an analysis runs). Called from the thread that
        appends to them."""
        rec = self.rec
        live = [f for f in self.followers if f.running()]
        self._open_flows.update(range(self._flows_seen, len(rec.flows)))
        self._flows_seen = len(rec.flows)
        with rec.lock:
            taken = min((f.run.taken if f.run else 0 for f in live),
                        default=len(rec.inputs) + rec.inputs_dropped)
            if (k := taken - rec.inputs_dropped) > 0:
                del rec.inputs[:k]
                rec.inputs_dropped += k
            asked = min((f.run.exchanges_taken if f.run else 0 for f in live),
                        default=len(rec.exchanges) + rec.exchanges_dropped)
            if (k := asked - rec.exchanges_dropped) > 0:      # each analysis holds what it took (exchanges.Answers)
                del rec.exchanges[:k]
                rec.exchanges_dropped += k
            rec.serial_out.drop_to(min((f.cmp.native_at("serial") for f in live), default=rec.serial_out.end))
            if (now := time.monotonic()) - self._flows_trimmed_at < FLOWS_TRIM_S and live:
                return
            self._flows_trimmed_at = now
            for i in list(self._open_flows):
                fl = rec.flows[i]
                if fl is None:          # retired already (_open_flows holds those that are not)
                    self._open_flows.discard(i)
                    continue
                need = [f for f in live if i not in f.cmp.done]
                if fl.closed and not need:
                    rec.flows[i] = None
                    self._open_flows.discard(i)
                    for f in self.followers:
                        f.cmp.done.discard(i)
                    if self.on_retire:
                        self.on_retire(fl)
                    continue
                fl.guest_data.drop_to(min((f.cmp.native_at(fl.channel) for f in need), default=fl.guest_data.end))

    def kept_bytes(self) -> int:
        """Bytes of the recording held now: inputs not taken by every analysis, and output
        not matched by every analysis (the console's and open connections')."""
        rec = self.rec
        with rec.lock:
            n = sum(len(i.data) for i in rec.inputs) + rec.serial_out.size
            for i in self._open_flows:
                fl = rec.flows[i] if i < len(rec.flows) else None
                n += fl.guest_data.size if fl is not None else 0
        return n

    def slowest_pending(self) -> int | None:
        """Inputs read and not delivered yet by the analysis furthest behind (None: no
        analysis is running)."""
        read = len(self.rec.inputs) + self.rec.inputs_dropped
        pend = [p if (p := f.buffer.pending(read)) is not None else read - (f.run.taken if f.run else 0)
                for f in self.followers if f.running()]
        return min(pend) if pend else None

    # --- the analyses' side ---

    def _analyse(self, f: Follower) -> None:
        def progress(run, done, total):
            f.run = run
            if self.progress:
                self.progress(f.analysis, run, done, total)

        def tick(run: model.AnalysisRun) -> set[int]:
            f.run = run
            self._emit_findings(f, run)
            return f.cmp.tick(run)
        f.cmp.keep_console_from = lambda: min(f.console_seen, f.scanner.pending_start)
        try:
            f.run = replay.run(self.rec, self._options(f.of), buffer=f.buffer, progress=progress,
                               tick=tick)
        except TandemError as e:        # its machine could not be made (a live user VM's root, an overlay)
            log.warning("%s: %s", f.analysis, e)
            f.run = model.AnalysisRun(f.analysis)
            f.run.outcome, f.run.detail = model.Outcome.ERROR, str(e)
        finally:
            f.buffer.release()          # ended: it holds the native no longer
            f.buffer.delivered = None
            if f.run is not None:
                self._emit_findings(f, f.run)
                f.cmp.finish(f.run)
            f.cmp.finished = True

    def _options(self, analysis: catalog.Analysis) -> RunOptions:
        """run_options(analysis), its stop() also true once close() is called."""
        options = self.run_options(analysis)
        stop = options.stop
        return dataclasses.replace(options, stop=lambda: self._closing or bool(stop and stop()))

    def _emit_findings(self, f: Follower, run: model.AnalysisRun) -> None:
        """Findings as they happen: appended to findings.jsonl the moment a report completes
        (reports_of)."""
        new = bytes(run.console[f.console_seen - run.console_base:])
        f.console_seen += len(new)
        for rep in reports_of(f.scanner, run, new, f.console_seen):
            if f.symbolize is None:
                f.symbolize = findings.symbolizer(f.of)
            x = findings.of_report(run, f.symbolize(rep))
            f.live_findings.append(x)
            with self._lock:
                if self.findings_file is not None:
                    self.findings_file.write(x.to_json() + "\n")
                    self.findings_file.flush()
            if self.on_finding:
                self.on_finding(x)

    def results(self) -> tuple[dict[str, model.AnalysisRun], dict[str, tuple[list, list, list]]]:
        """Every analysis's run, and its (findings, divergences, output not analysed) as
        found while it ran."""
        runs = {f.analysis: f.ran() for f in self.followers}
        found = {f.analysis: (f.live_findings + findings.outcome(runs[f.analysis], f.live_findings), f.cmp.divergences,
                              f.cmp.not_analysed)
                 for f in self.followers}
        return runs, found

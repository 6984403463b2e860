"""Reports a live analysis gives as its console shows them (semantic/trail.reports_of):
one that is the console's last words has no line after it to end it, and is complete once
the console has been quiet for REPORT_QUIET_NS of the analysis VM's own time. The console
is a real one: the FreeBSD debug kernel's lock order reversal from tests/report-corpus."""
from __future__ import annotations

from pathlib import Path

from tandem import report
from tandem.semantic import model
from tandem.semantic.trail import REPORT_QUIET_NS, reports_of

CORPUS = Path(__file__).parent.parent / "report-corpus" / "freebsd" / "tandem-debug-planted"
LOR = "WITNESS: lock order reversal: tandem_b -> tandem_a in tb_stats_reset"


def lor_console() -> bytes:
    """The corpus console up to the end of its lock order reversal, nothing after it."""
    text = CORPUS.read_bytes().split(b"\n\n", 1)[1]
    end = text.index(b"Sleeping on")
    return text[:end]


def written(run: model.AnalysisRun, data: bytes, vm_ns: int) -> bytes:
    run.console_times.append((run.console_base + len(run.console), vm_ns))
    run.console += data
    run.end_ns = vm_ns
    return data


def test_a_report_the_console_ends_with_is_given_once_the_console_is_quiet():
    run, sc = model.AnalysisRun("freebsd-debug"), report.Scanner("freebsd")
    data = written(run, lor_console(), 5_000_000_000)
    assert reports_of(sc, run, data, len(data)) == []            # open: its next line may belong to it
    run.end_ns += REPORT_QUIET_NS // 2
    assert reports_of(sc, run, b"", len(data)) == []
    run.end_ns += REPORT_QUIET_NS // 2
    (rep,) = reports_of(sc, run, b"", len(data))
    assert rep.title == LOR
    run.end_ns += 5 * REPORT_QUIET_NS
    assert reports_of(sc, run, b"", len(data)) == []             # given once
    more = written(run, b"kvd-init: listening on port 7000\n", run.end_ns)
    assert reports_of(sc, run, more, len(data) + len(more)) == []


def test_a_report_is_not_cut_while_its_lines_keep_coming():
    run, sc = model.AnalysisRun("freebsd-debug"), report.Scanner("freebsd")
    lines, seen, vm = lor_console().splitlines(keepends=True), 0, 5_000_000_000
    got = []
    for line in lines:                  # a line each 0.2 s of VM time: never quiet for long
        vm += REPORT_QUIET_NS // 5
        seen += len(written(run, line, vm))
        got += reports_of(sc, run, line, seen)
        run.end_ns = vm + REPORT_QUIET_NS // 10
        got += reports_of(sc, run, b"", seen)
    assert got == []
    run.outcome = model.Outcome.POWEROFF
    (rep,) = reports_of(sc, run, b"", seen)
    assert rep.title == LOR and "tb_stats_reset" in rep.text

"""Findings of an analysis run: sanitizer reports on its console, and the run's
own failures (a panic, a hang, a lagging VM), each attributed to the input after
which it appeared."""
from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .. import artifacts, catalog, report
from ..errors import TandemError
from ..report.symbolize import short_path
from .inputs import Input, InputKind
from .model import AnalysisRun, Outcome

log = logging.getLogger(__name__)


@dataclass
class Finding:
    analysis: str
    type: str                   # a report type (report.TYPES) or VM-CRASH
    title: str
    vm_ns: int
    after_input: str            # the recorded input delivered last before it
    input_channel: str | None
    input_flow: int | None
    input_offset: int | None
    text: str
    frames: list[str]
    locations: list[tuple[str, str, int]]
    # The inputs delivered just before after_input, newest first, a connection once
    # (_before): an analysis kernel that was slower than the native's takes several
    # inputs in a row, and the one that reached the bug (a datagram queued while a
    # service started) need not be the last.
    before: list[str] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self))


BEFORE_KEPT = 4         # inputs named before the last one a finding came after (a connection once)
BEFORE_LOOKED = 64      # the delivered inputs looked through for them


def _attributed(run: AnalysisRun, vm_ns: int) -> dict:
    d = run.input_before(vm_ns)
    if d is None:
        return {"after_input": "none (before the first input)", "input_channel": None,
                "input_flow": None, "input_offset": None}
    i = d.input
    chan = "net" if i.kind.startswith("tcp") or i.kind == "frame" else i.kind
    earlier = [x.input for x in run.delivered if x.vm_ns <= vm_ns and x.input.kind != "rng" and x is not d]
    return {"after_input": i.describe(), "input_channel": chan, "input_flow": i.flow,
            "input_offset": i.offset, "before": [x.describe() for x in _before(earlier, i)]}


def _before(earlier: Sequence[Input], last: Input) -> list[Input]:
    """The inputs delivered before `last`, newest first, BEFORE_KEPT of them, a connection
    counting once (by its request's bytes where it has any among the last BEFORE_LOOKED,
    else its newest input), `last`'s own not at all. A connection's open, request and FIN
    are one request to the person reading: counted apart, two connections a user network
    holds till the guest's service comes up (6 inputs in 7 ms of VM time) push the
    datagram that reached the bug out of the 4 named."""
    chosen: dict[tuple[str, int], Input] = {}
    for x in reversed(earlier[-BEFORE_LOOKED:]):
        key = ("flow", x.flow) if x.flow is not None else ("input", id(x))
        if x.flow is not None and x.flow == last.flow:
            continue
        if key in chosen:
            if x.kind == InputKind.TCP_DATA and chosen[key].kind != InputKind.TCP_DATA:
                chosen[key] = x
        elif len(chosen) < BEFORE_KEPT:
            chosen[key] = x
    return list(chosen.values())


def of_report(run: AnalysisRun, rep: report.Report) -> Finding:
    """A console report of an analysis run as a finding, with its VM time and input."""
    ns = run.vm_time_at(rep.start)
    locs = [(fn, short_path(f), ln) for fn, f, ln in rep.locations]
    return Finding(run.analysis, rep.type, rep.title, ns, text=rep.text, frames=rep.frames,
                   locations=locs, **_attributed(run, ns))


def distinct(found: list[Finding]) -> list[tuple[Finding, int]]:
    """Each title once, with its first finding and how many there were, in order.

    The title is the deduplication key (docs/reports.md): it names the bug the way
    syzkaller does and carries nothing that changes between runs, so a WARNING the
    kernel prints every few seconds is one bug, and two nights' runs of one bug agree.
    findings.jsonl keeps every occurrence; summaries show each title once."""
    first: dict[str, Finding] = {}
    count: dict[str, int] = {}
    for f in found:
        first.setdefault(f.title, f)
        count[f.title] = count.get(f.title, 0) + 1
    return [(f, count[t]) for t, f in first.items()]


# The dialects of the kernels tandem boots, whose reports its kernels' DWARF symbolizes
# (a userland's, ASan's, symbolizes itself)
KERNEL_OSES = frozenset({"linux", "freebsd"})


def symbolizer(analysis: catalog.Analysis):
    """rep -> rep with source locations from the analysis kernel's vmlinux (FreeBSD's
    kernel.debug) and modules (rep unchanged when they are not there)."""
    if analysis.kernel.image:        # a kernel the user brought, with its vmlinux or none
        brought = analysis.kernel.vmlinux
        return lambda rep: report.symbolize(rep, brought) if brought and rep.os in KERNEL_OSES else rep
    try:
        built = artifacts.kernel(analysis.flavor)
        vmlinux = built["vmlinux"]
        # Linux's planted-bug module comes in a build of its own; FreeBSD's KLDs with their kernel
        modules: list[Path | str] = (list(artifacts.modules(analysis.flavor).get("modules", []))
                                     if analysis.kernel.os == "linux" else list(built.get("klds", [])))
    except (TandemError, KeyError) as e:   # not built (./tandem build), or a build record without a vmlinux
        log.info("findings of %s are not symbolized: %s", analysis.name, e)
        return lambda rep: rep
    return lambda rep: report.symbolize(rep, vmlinux, modules) if vmlinux and rep.os in KERNEL_OSES else rep


def findings(run: AnalysisRun, analysis: catalog.Analysis, symbolize: bool = True) -> list[Finding]:
    """Every finding of a finished run (of `analysis`): its console's reports, in its guest
    OS's dialect, and its end."""
    sym = symbolizer(analysis) if symbolize else (lambda rep: rep)
    found = [of_report(run, sym(rep)) for rep in report.parse(bytes(run.console), analysis.os)]
    return found + outcome(run, found)


def booted(run: AnalysisRun) -> bool:
    """Did the analysis VM get as far as its first recorded input (other than entropy)?"""
    return run.first_input_ns is not None


# A kernel's own word that it is going down: Linux's panic() ("Kernel panic - not syncing:",
# after its printk time), FreeBSD's ("panic: ").
_PANICKED = re.compile(r"^(?:\[[ \d.]+\] )?(?:Kernel panic - not syncing: |panic: )", re.M)


def outcome(run: AnalysisRun, found: Sequence[Finding] = ()) -> list[Finding]:
    """The run's end as a finding about the guest: a crash (panic, reset, QEMU gone)
    after its first input, unless one of its reports (`found`) is the kernel's panic, which
    is that crash already said (a FreeBSD debug kernel's failed KASSERT). Other ends that
    are not clean are tandem's own (failure())."""
    if run.outcome != Outcome.CRASHED or not booted(run) or any(_PANICKED.search(f.text) for f in found):
        return []
    return [Finding(run.analysis, "VM-CRASH", f"analysis VM crashed: {run.detail}",
                    run.end_ns, text=run.qemu_log, frames=[], locations=[],
                    **_attributed(run, run.end_ns))]


# Ends of a run that say what tandem could not do, not what the guest did.
TANDEM_OUTCOMES = {Outcome.HUNG: "QEMU stopped answering", Outcome.LAGGING: "timed out",
                   Outcome.DETACHED: "detached", Outcome.ERROR: "failed in tandem"}


def did_not_boot(run: AnalysisRun, found: list[Finding]) -> tuple[str | None, list[Finding]]:
    """(failure, findings) of a run: for a VM that crashed before its first input, what
    its console reported (a panic at the root mount, say) is why the analysis did not
    boot, part of its failure and not a finding about the guest (who gave it a kernel
    that cannot boot its disk is no bug of the guest's); so for one that panicked before
    its first input and never stopped (a FreeBSD kernel whose early panic faults again
    as it reboots, over and over), whatever tandem's limit then ended it; otherwise
    failure(run) and the findings as they are."""
    why = failure(run)
    if why is None or booted(run) or not found:
        return why, found
    if run.outcome in (Outcome.LAGGING, Outcome.HUNG) and any(_PANICKED.search(f.text) for f in found):
        why = _why(f"did not boot (its kernel panicked before its first input, then {run.outcome}: "
                   f"{TANDEM_OUTCOMES[Outcome(run.outcome)]})", run)
    elif run.outcome != Outcome.CRASHED:
        return why, found
    titles = list(dict.fromkeys(f.title for f in found))
    return f"{why}; its console: {'; '.join(titles[:3])}", []


def failure(run: AnalysisRun) -> str | None:
    """Why the analysis could not analyse the whole recording, when tandem (or the
    analysis VM's setup) is why: hung, lagging, detached, an error, or a VM that crashed
    before its first input (it did not boot). None for a run that ended cleanly or
    crashed on the way (a finding)."""
    if run.outcome in TANDEM_OUTCOMES:
        what = f"{run.outcome} ({TANDEM_OUTCOMES[Outcome(run.outcome)]})"
    elif run.outcome == Outcome.CRASHED and not booted(run):
        what = "did not boot (crashed before its first input)"
    else:
        return None
    return _why(what, run)


def _why(what: str, run: AnalysisRun) -> str:
    """A failure's line: what, the run's detail, and the input it stopped before."""
    stop = f"; stopped before {run.stopped_before}" if run.stopped_before else ""
    return f"{what}: {run.detail}{stop}"

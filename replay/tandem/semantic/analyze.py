"""`tandem replay BUNDLE --analysis A ...`: replay a recording into analysis VMs in
parallel, then report their findings and their divergences from the native.

The bundle's device log is read as the analyses advance (read_paced: inputs.InputExtractor
into a recording that fills in, as a live native's does) -> driving.replay.run per analysis
(feed + TCP peer), trailing it (trail.Trail) -> compared as it goes (live_compare, under the
equivalence spec; noise from a replay into the native kernel) + findings (console reports,
as they complete) -> this summary. Memory follows what is in flight, not the recording's
length (a 20 s heavy recording has 203k device events): no bound detaches an analysis, the
reading waits for the slowest.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .. import catalog, private
from ..errors import EXIT_CLEAN, EXIT_FOUND, EXIT_INCOMPLETE, TandemError
from ..formats import bundle, pcapng
from ..machine import analyses_given
from .comparison import compare, equivalence
from . import inputs, model
from .findings import Finding, did_not_boot, distinct
from .guests import analysis_guest, as_recorded, noise_analysis
from .comparison.live_compare import OFFLINE_STUCK_MAX
from .driving.replay import RunOptions
from .trail import Trail

log = logging.getLogger(__name__)

NOISE = catalog.NATIVE.name


@dataclass
class AnalysisResult:
    analysis: str
    run: model.AnalysisRun
    findings: list[Finding]
    divergences: list[compare.Divergence]
    noise: int                      # differences also seen between two runs of the native kernel
    spec: list[str]
    # What tandem could not do: why the run did not analyse the whole recording
    # (findings.failure), and the native's output it never reached.
    failure: str | None = None
    not_analysed: list[compare.NotAnalysed] = field(default_factory=list)
    # Each title once, with its first finding and how often (findings.distinct): what a
    # summary shows, as data its readers (summary.json, the CLI) print without recomputing.
    distinct: list[tuple[Finding, int]] = field(init=False)

    def __post_init__(self) -> None:
        self.distinct = distinct(self.findings)

    @property
    def complete(self) -> bool:
        return self.failure is None and not self.not_analysed


@dataclass
class Summary:
    bundle: str
    results: list[AnalysisResult] = field(default_factory=list)
    limits: list[str] = field(default_factory=list)
    # The noise run (the native kernel replayed on the semantic path) and what it found,
    # for a later analyze() of the same bundle to split its noise by (noise_from).
    noise: tuple[model.AnalysisRun, tuple[list, list, list]] | None = None

    @property
    def ok(self) -> bool:
        """Nothing found: no finding, no divergence, in what was analysed."""
        return not any(r.findings or r.divergences for r in self.results)

    @property
    def complete(self) -> bool:
        """Every analysis analysed the whole recording."""
        return all(r.complete for r in self.results)

    def exit_status(self) -> int:
        """EXIT_FOUND for a finding or a divergence; else EXIT_INCOMPLETE when tandem
        could not analyse all of it (tandem's limit, never a finding); else EXIT_CLEAN."""
        return EXIT_FOUND if not self.ok else EXIT_INCOMPLETE if not self.complete else EXIT_CLEAN


def check_request(bundle_dir: Path, analyses: list[catalog.Analysis],
                  spec_path: str | None) -> tuple[bundle.Manifest, list[catalog.Analysis]]:
    """Fail early, with one line, on anything wrong with the request. `native` is checked
    as the kernel the recording was made on (a FreeBSD recording's is freebsd-native, not
    the Linux native, which need not be built). Returns the manifest and the analyses so
    named."""
    m = bundle.load_manifest(bundle_dir)
    analyses = analyses_given(as_recorded(analyses, m))     # none, missing kernel or image
    for a in analyses:
        equivalence.load(a, spec_path)                      # malformed spec
    problems = bundle.verify_files(bundle_dir, m)
    devlog = [p for p in problems if p.file == bundle.DEVLOG]
    if devlog:
        raise TandemError(devlog[0].message)
    return m, analyses


# Reading a finished bundle: how far ahead of its slowest analysis (inputs read and not
# delivered there, and bytes of the recording held), and below what it reads on regardless
# (an analysis that has few inputs left may need the output that comes with the next).
READ_AHEAD_INPUTS = 20_000
READ_AHEAD_BYTES = 64 << 20
READ_ON_BELOW = 1_000
PACE_EVERY = 512            # events read between two looks at the analyses
PACE_SLEEP_S = 0.02


def analyze(bundle_dir: str | Path, analyses: list[catalog.Analysis], *, spec_path: str | None = None,
            workdir: Path | None = None, noise: bool = True, jobs: int = 2,
            lookahead_ns: int = model.LOOKAHEAD_NS, progress=None,
            record: bool = True, guests: dict | None = None, root: str | None = None,
            cpu_idle: bool = False, noise_from: Summary | None = None, vcpus: int = 1) -> Summary:
    """Replay a finished recording into analysis VMs, `jobs` at a time, each batch
    trailing one reading of the bundle's device log (trail.Trail): tandem's memory
    follows what is in flight, not the recording's length, and no bound stops an
    analysis; the reading waits for the slowest instead. guests: analysis name -> the
    machine.Guest it boots (default: guests.analysis_guest's: a user's VM on its own
    disks, its root device `root` or the recorded one). cpu_idle: let the host's CPUs idle
    while the analyses run (driving.replay.run). noise_from: an earlier analyze() of this
    bundle whose noise run is used again rather than run once more (the demo analyses in
    turns, as their kernels are built). vcpus: each analysis VM's (driving.replay.RunOptions)."""
    bundle_dir = Path(bundle_dir)
    manifest, analyses = check_request(bundle_dir, analyses, spec_path)
    workdir = workdir or bundle_dir / "analysis"
    private.make_dir(workdir)
    earlier = noise_from.noise if noise and noise_from is not None else None
    noise_run = noise and earlier is None and NOISE not in {a.name for a in analyses}
    runs_wanted = analyses + ([noise_analysis(manifest)] if noise_run else [])
    users = manifest.users_guest
    specs = {a.name: equivalence.load(a, spec_path, users) for a in runs_wanted}
    guests = guests or {a.name: analysis_guest(bundle_dir, manifest, a, root) for a in runs_wanted}
    runs: dict[str, model.AnalysisRun] = {}
    found: dict[str, tuple[list, list, list]] = {}
    if earlier is not None:
        runs[NOISE], found[NOISE] = earlier
    with open(workdir / "findings.jsonl", "w", opener=private.opener) as findings_file:
        for at in range(0, len(runs_wanted), max(1, jobs)):
            batch = runs_wanted[at:at + max(1, jobs)]
            rec = _unread(bundle_dir, manifest, users)
            trail = Trail(rec, batch, specs, {a.name: model.Buffer.unbounded() for a in batch},
                          run_options=lambda a: RunOptions(a, guests.get(a.name), workdir, record=record,
                                                           lookahead_ns=lookahead_ns, line_deps=not users,
                                                           cpu_idle=cpu_idle, swap_from=bundle_dir if users else None,
                                                           vcpus=vcpus),
                          findings_file=findings_file, stuck_max=OFFLINE_STUCK_MAX, progress=progress)
            with trail:         # started; its analyses stopped if reading fails
                read_paced(trail, bundle_dir)
                trail.join()
            r, f = trail.results()
            runs.update(r)
            found.update(f)
    return summarize(bundle_dir, rec, analyses, runs, specs, noise, workdir, found)


def _unread(bundle_dir: Path, manifest: bundle.Manifest, users_guest: bool) -> inputs.RecordedInputs:
    """A recording's inputs before its device log is read (filled in by read_paced)."""
    rec = inputs.RecordedInputs([], [], None, [], finished=False, path=str(bundle_dir))
    if manifest.started_at is not None:
        rec.created = manifest.started_at
    stop = manifest.stop
    # A user's VM that powered off may have had its button pressed by a tool of the
    # user's; tandem's own guest powers off from its console unless the button was.
    rec.powered_off = stop.reason == "poweroff"
    rec.power_button = rec.powered_off and (users_guest or stop.power_button is True)
    return rec


def read_paced(trail: Trail, bundle_dir: Path) -> None:
    """Read the bundle's device log into trail.rec no faster than its slowest analysis
    takes it (READ_AHEAD_*), trimming what every analysis is done with; stop reading
    once no analysis runs. Sets rec.finished at the end."""
    rec = trail.rec
    reader = pcapng.DevlogReader(bundle_dir / bundle.DEVLOG)

    def paced():
        for n, e in enumerate(reader):
            if n % PACE_EVERY == 0:
                trail.trim()
                while (pending := trail.slowest_pending()) is not None and pending >= READ_ON_BELOW and (
                        pending > READ_AHEAD_INPUTS or trail.kept_bytes() > READ_AHEAD_BYTES):
                    time.sleep(PACE_SLEEP_S)
                    trail.trim()
                if pending is None:
                    log.debug("%s: no analysis runs; reading stops at event %d", bundle_dir, n)
                    return
            yield e
    try:
        inputs.InputExtractor(rec).feed(paced())
    except TandemError as e:        # checked whole before the run: a log damaged since
        rec.limits.append(f"reading the device log stopped: {e}")
    rec.end_ns = next((s.end_vm_ns for s in reader.stats if s and s.end_vm_ns), None) or rec.known_ns
    rec.finished = True


def summarize(bundle_dir, rec: inputs.RecordedInputs, analyses: list[catalog.Analysis],
              runs: dict[str, model.AnalysisRun], specs: dict[str, equivalence.Spec], noise: bool,
              workdir: Path, found: dict[str, tuple]) -> Summary:
    """The summary of finished analysis runs; writes summary.json and findings.jsonl into
    workdir. By analysis name: runs, specs (the spec each was compared under) and found
    ((findings, divergences, not analysed), as each run found them while it went:
    trail.Trail.results)."""
    summary = Summary(str(bundle_dir), limits=list(rec.limits),
                      noise=(runs[NOISE], found[NOISE]) if NOISE in runs and NOISE in found else None)
    for name in (a.name for a in analyses):
        run, spec = runs[name], specs[name]
        findings, divs, unreached = found[name]
        n_noise = 0
        if noise and name != NOISE and NOISE in runs:
            divs, n_noise = compare.split_noise(divs, found[NOISE][1])
        failure, findings = did_not_boot(run, findings)
        summary.results.append(AnalysisResult(name, run, findings, divs, n_noise, spec.sources, failure, unreached))
        unknown = run.net.unknown[:5] if run.net else []
        summary.limits += [f"{name}: {x}" for x in run.limits + unknown]
    write_summary(workdir, summary)
    return summary


def write_summary(workdir: Path, s: Summary) -> None:
    """findings.jsonl (one finding per line) and summary.json, next to the analysis logs."""
    private.make_dir(workdir)
    with open(workdir / "findings.jsonl", "w", opener=private.opener) as f:
        for r in s.results:
            for fd in r.findings:
                f.write(fd.to_json() + "\n")
    out = {"bundle": s.bundle, "ok": s.ok, "complete": s.complete, "exit_status": s.exit_status(),
           "limits": s.limits, "analyses": [
        {"analysis": r.analysis, "outcome": r.run.outcome, "detail": r.run.detail,
         "end_vm_ns": r.run.end_ns, "wall_s": round(r.run.wall_s, 3), "waits": r.run.waits,
         "cpu_s": round(r.run.cpu_s, 3), "delivered": r.run.n_delivered,
         "failure": r.failure, "stopped_before": r.run.stopped_before or None,
         "not_analysed": [asdict(x) | {"first": x.first.decode("latin-1")} for x in r.not_analysed],
         "recording": str(r.run.bundle) if r.run.bundle else None,
         "findings": [asdict(x) for x in r.findings],
         "distinct": [{"title": f.title, "type": f.type, "count": n, "first_vm_ns": f.vm_ns}
                      for f, n in r.distinct],
         "noise": r.noise, "spec": r.spec,
         "divergences": [{"channel": d.channel, "kind": d.kind, "native_vm_ns": d.native_ns,
                          "analysis_vm_ns": d.analysis_ns, "after_input": d.after_input,
                          "diff": d.diff} for d in r.divergences]}
        for r in s.results]}
    private.write_text(workdir / "summary.json", json.dumps(out, indent=1, default=str))

"""`tandem replay BUNDLE --analysis A ...`: replay a recording into analysis VMs in
parallel, then report their findings and their divergences from the native.

record -> inputs.load (what the native received) -> replay_semantic.run per
analysis (feed + TCP peer) -> compare (equivalence spec, noise from a replay
into the native kernel) + findings (console reports) -> this summary.
"""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .. import private
from ..errors import TandemError
from ..formats import bundle
from ..machine import analyses_given
from . import compare, equivalence, inputs, model
from . import findings as findings_mod
from . import replay as replay_semantic

NOISE = "native"


@dataclass
class AnalysisResult:
    analysis: str
    run: model.AnalysisRun
    findings: list[findings_mod.Finding]
    divergences: list[compare.Divergence]
    noise: int                      # differences also seen between two runs of the native kernel
    spec: list[str]


@dataclass
class Summary:
    bundle: str
    results: list[AnalysisResult] = field(default_factory=list)
    limits: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(r.findings or r.divergences for r in self.results)


def check_request(bundle_dir: Path, analyses: list[str], spec_path: str | None) -> dict:
    """Fail early, with one line, on anything wrong with the request."""
    for a in analyses_given(analyses):          # unknown name, missing kernel or image
        equivalence.load(a, spec_path)          # malformed spec
    m = bundle.load_manifest(bundle_dir)
    problems = bundle.verify_files(bundle_dir, m)
    devlog = [p for p in problems if p.file == bundle.DEVLOG]
    if devlog:
        raise TandemError(devlog[0].message)
    return m


def analyze(bundle_dir: str | Path, analyses: list[str], *, spec_path: str | None = None,
            workdir: Path | None = None, noise: bool = True, jobs: int = 2,
            lookahead_ns: int = model.LOOKAHEAD_NS, progress=None,
            record: bool = True) -> Summary:
    bundle_dir = Path(bundle_dir)
    analyses = list(dict.fromkeys(analyses))
    check_request(bundle_dir, analyses, spec_path)
    workdir = workdir or bundle_dir / "analysis"
    rec = inputs.load(bundle_dir)
    runs_wanted = analyses + ([NOISE] if noise and NOISE not in analyses else [])

    def one(name: str) -> model.AnalysisRun:
        return replay_semantic.run(rec, name, workdir, lookahead_ns=lookahead_ns, record=record,
                                   progress=(lambda r, n, t: progress(name, r, n, t)) if progress else None)

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        runs = dict(zip(runs_wanted, pool.map(one, runs_wanted)))

    return summarize(bundle_dir, rec, analyses, runs, spec_path, noise, workdir)


def summarize(bundle_dir, rec: inputs.RecordedInputs, analyses: list[str],
              runs: dict[str, model.AnalysisRun], spec_path: str | None, noise: bool,
              workdir: Path, live: dict | None = None) -> Summary:
    """Findings and divergences of finished analysis runs; writes summary.json and
    findings.jsonl into workdir. live: analysis -> (findings, divergences) already
    found as a live run went (live.shadow.ShadowRun), instead of from the whole runs."""
    summary = Summary(str(bundle_dir), limits=list(rec.limits))
    for name in analyses:
        run = runs[name]
        spec = equivalence.load(name, spec_path)
        if live:
            found, divs = live[name]
        else:
            found, divs = findings_mod.findings(run), compare.compare(rec, run, spec)
        n_noise = 0
        if noise and name != NOISE and NOISE in runs:
            divs, n_noise = compare.split_noise(
                divs, live[NOISE][1] if live else compare.compare(rec, runs[NOISE], spec))
        summary.results.append(AnalysisResult(name, run, found, divs, n_noise, spec.sources))
        unknown = run.peer.unknown[:5] if run.peer else []
        summary.limits += [f"{name}: {x}" for x in run.limits + unknown]
    _write(workdir, summary)
    return summary


def _write(workdir: Path, s: Summary) -> None:
    """findings.jsonl (one finding per line) and summary.json, next to the analysis logs."""
    private.make_dir(workdir)
    with open(workdir / "findings.jsonl", "w", opener=private.opener) as f:
        for r in s.results:
            for fd in r.findings:
                f.write(fd.to_json() + "\n")
    out = {"bundle": s.bundle, "ok": s.ok, "limits": s.limits, "analyses": [
        {"analysis": r.analysis, "outcome": r.run.outcome, "detail": r.run.detail,
         "end_vm_ns": r.run.end_ns, "wall_s": round(r.run.wall_s, 3), "waits": r.run.waits,
         "cpu_s": round(r.run.cpu_s, 3), "delivered": r.run.n_delivered,
         "recording": str(r.run.bundle) if r.run.bundle else None,
         "findings": [asdict(x) for x in r.findings],
         "distinct": [{"title": f.title, "type": f.type, "count": n, "first_vm_ns": f.vm_ns}
                      for f, n in findings_mod.distinct(r.findings)],
         "noise": r.noise, "spec": r.spec,
         "divergences": [{"channel": d.channel, "kind": d.kind, "native_vm_ns": d.native_ns,
                          "analysis_vm_ns": d.analysis_ns, "after_input": d.after_input,
                          "diff": d.diff} for d in r.divergences]}
        for r in s.results]}
    private.write_text(workdir / "summary.json", json.dumps(out, indent=1, default=str))

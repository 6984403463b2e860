"""What people read of the farm: a night (or the nights since a date) as one self-contained
HTML page, as JUnit XML (a test case per recording x analysis, so a CI system shows the
night as its tests) and as JSON. All three come from one view of the database (`view`).

The page puts what is new first, as syzbot's dashboard and LKFT's regressions list do:
people read the top of a report; known findings are counted, fixed ones noticed, flaky
ones marked, and the harness's errors kept apart from findings (KCIDB's ERROR is not a
FAIL).
"""
from __future__ import annotations

import datetime
import html
import io
import json
import shlex
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from . import triage
from .store import CONFIRM, aware, findings, nights, tasks

ORDER = {"new": 0, "flaky": 1, "known": 2, "gone": 3, "fixed": 4}


@dataclass
class Signature:
    signature: str
    kind: str
    state: str
    title: str
    first_seen: str
    last_seen: str
    tonight: int                # tasks of the last night that showed it
    report: str | None = None
    input: str | None = None
    recording: str | None = None
    reproduced: bool | None = None
    reproduce: str | None = None        # the command that replays it exactly


@dataclass
class View:
    night: str
    nights: list[dict[str, Any]] = field(default_factory=list)   # name, started, findings, replay_s, tasks
    matrix: dict[str, dict[str, str]] = field(default_factory=dict)     # bundle -> analysis -> status
    signatures: list[Signature] = field(default_factory=list)
    errors: list[dict[str, str]] = field(default_factory=list)          # the harness's, apart
    skipped: list[dict[str, str]] = field(default_factory=list)         # analyses that do not apply, and why
    new: int = 0


def view(engine: Engine, night: str | None = None, since: datetime.datetime | None = None,
         fixed_after: int = 3) -> View:
    """The last night (or the one named) with the nights before it since `since`."""
    with engine.connect() as c:
        all_nights = list(c.execute(sa.select(nights).order_by(nights.c.started_at, nights.c.id)))
        if night is not None:
            at = next((i for i, n in enumerate(all_nights) if n.name == night), None)
            all_nights = [] if at is None else all_nights[:at + 1]
        if not all_nights:
            return View("")
        rows = list(c.execute(sa.select(tasks).where(tasks.c.status.not_in(("pending", "running")))))
        found = list(c.execute(sa.select(findings)))
    order = {n.id: i for i, n in enumerate(all_nights)}
    last = all_nights[-1]
    shown = [n for n in all_nights if since is None or aware(n.started_at) >= since]
    v = View(last.name)
    by_task = {t.id: t for t in rows if t.night_id in order}
    # indexes, so that the report grows with the rows it reads, not with their product
    by_night, by_group = defaultdict(list), defaultdict(list)
    for t in by_task.values():
        by_night[t.night_id].append(t)
        if t.kernel != CONFIRM:
            by_group[t.recording, t.analysis].append(t)
    hits, of_task = defaultdict(list), defaultdict(list)
    for f in found:
        if f.task_id in by_task:
            hits[f.signature].append(f)
            of_task[f.task_id].append(f)
    v.nights = [_night_row(n, by_night[n.id], of_task) for n in shown]
    v.matrix = _matrix(by_night[last.id])
    v.errors, v.skipped = ([{"bundle": t.bundle, "analysis": t.analysis, "reason": t.reason or ""}
                            for t in by_night[last.id] if t.status == status]
                           for status in ("error", "skipped"))
    v.signatures = sorted((_signature(sig, fs, by_task, by_group, order, all_nights, fixed_after)
                           for sig, fs in hits.items()), key=lambda s: (ORDER[s.state], s.kind, s.signature))
    v.new = sum(s.state == "new" for s in v.signatures)
    return v


def _night_row(n, mine, of_task) -> dict[str, Any]:
    return {"name": n.name, "started": aware(n.started_at).isoformat(timespec="seconds"), "tasks": len(mine),
            "findings": len({f.signature for t in mine for f in of_task[t.id] if f.kind == "finding"}),
            "errors": sum(t.status == "error" for t in mine),
            "replay_s": round(sum(t.replay_s or 0 for t in mine), 1)}


def _matrix(rows) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = defaultdict(dict)
    for t in rows:
        if t.repeat == 0 and t.kernel != CONFIRM:
            out[t.bundle][t.analysis] = t.status
    return dict(out)


def _signature(sig, fs, by_task, by_group, order, all_nights, fixed_after) -> Signature:
    groups = {(by_task[f.task_id].recording, by_task[f.task_id].analysis) for f in fs}
    seen_in = {f.task_id for f in fs}
    obs = [triage.Observation(order[t.night_id], g, 1, int(t.id in seen_in)) for g in groups for t in by_group[g]]
    tonight = len(all_nights) - 1
    st = triage.state(_merge(obs), tonight, fixed_after)
    nights_seen = sorted({order[by_task[f.task_id].night_id] for f in fs})
    latest = max(fs, key=lambda f: (order[by_task[f.task_id].night_id], f.id))
    return Signature(sig, latest.kind, str(st or "gone"), latest.title, all_nights[nights_seen[0]].name,
                     all_nights[nights_seen[-1]].name,
                     sum(1 for f in fs if order[by_task[f.task_id].night_id] == tonight),
                     latest.report, latest.input, latest.recording, _reproduced(fs),
                     f"tandem replay {shlex.quote(latest.recording)}" if latest.recording else None)


def _reproduced(fs) -> bool | None:
    """Whether any of a signature's recordings replayed exactly (None: none was tried)."""
    tried = [f.reproduced for f in fs if f.reproduced is not None]
    return any(tried) if tried else None


def _merge(obs: list[triage.Observation]) -> list[triage.Observation]:
    """One observation per night and group: its replays counted, and those that saw it."""
    acc: dict[tuple, list[int]] = defaultdict(lambda: [0, 0])
    for o in obs:
        acc[(o.night, o.group)][0] += o.runs
        acc[(o.night, o.group)][1] += o.seen
    return [triage.Observation(n, g, r, s) for (n, g), (r, s) in acc.items()]


def to_json(v: View) -> str:
    return json.dumps(asdict(v), indent=2, sort_keys=True) + "\n"


def to_junit(v: View) -> str:
    """A test suite per recording, a test case per analysis: a finding or a divergence is a
    failure, the harness's error an error, a skipped task skipped."""
    suites = ET.Element("testsuites", name=f"tandem farm {v.night}")
    for bundle, row in sorted(v.matrix.items()):
        suite = ET.SubElement(suites, "testsuite", name=bundle, tests=str(len(row)),
                              failures=str(sum(s in ("finding", "divergence") for s in row.values())),
                              errors=str(sum(s == "error" for s in row.values())),
                              skipped=str(sum(s == "skipped" for s in row.values())))
        for analysis, status in sorted(row.items()):
            case = ET.SubElement(suite, "testcase", classname=Path(bundle).name, name=analysis)
            if status in ("finding", "divergence"):
                ET.SubElement(case, "failure", message=status, type=status)
            elif status == "error":
                ET.SubElement(case, "error", message=_reason(v.errors, bundle, analysis), type="harness")
            elif status == "skipped":
                ET.SubElement(case, "skipped", message=_reason(v.skipped, bundle, analysis))
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"


def _reason(entries: list[dict[str, str]], bundle: str, analysis: str) -> str:
    return next((e["reason"] for e in entries if e["bundle"] == bundle and e["analysis"] == analysis), "")[:500]


def to_html(v: View) -> str:
    """One page, nothing fetched: styles inline, plots as inline SVG."""
    e = html.escape
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>tandem farm: {e(v.night)}</title>"
             f"<style>{_CSS}</style></head><body>",
             f"<h1>tandem farm: night {e(v.night)}</h1>",
             f"<p class='summary'><b id='new-count'>{v.new}</b> new, "
             f"{sum(s.state == 'known' for s in v.signatures)} known, "
             f"{sum(s.state == 'flaky' for s in v.signatures)} flaky, "
             f"{sum(s.state == 'fixed' for s in v.signatures)} fixed; "
             f"{len(v.errors)} harness error(s)</p>",
             "<h2>Findings</h2>", _signatures_table(v), "<h2>Recordings &times; analyses</h2>", _matrix_table(v)]
    if v.errors:
        parts += ["<h2>Harness errors (not findings)</h2><table id='errors'><tr><th>recording</th><th>analysis</th>"
                  "<th>reason</th></tr>"] + [f"<tr><td>{e(x['bundle'])}</td><td>{e(x['analysis'])}</td>"
                                             f"<td><pre>{e(x['reason'])}</pre></td></tr>" for x in v.errors] + ["</table>"]
    parts += ["<h2>Nights</h2>", _plots(v), "</body></html>"]
    return "\n".join(parts) + "\n"


def _signatures_table(v: View) -> str:
    e = html.escape
    rows = ["<table id='findings'><tr><th>state</th><th>title</th><th>first seen</th><th>last seen</th>"
            "<th>tonight</th><th>reproduces</th></tr>"]
    for s in v.signatures:
        repro = "" if s.reproduced is None else ("yes" if s.reproduced else "no")
        detail = (f"<details><summary>report, input and reproducer</summary><p>after: {e(s.input or '-')}</p>"
                  f"<pre>{e(s.report or '')}</pre><p><code>{e(s.reproduce or '')}</code></p></details>")
        rows.append(f"<tr class='{e(s.state)}'><td>{e(s.state)}</td><td>{e(s.title)}{detail}</td>"
                    f"<td>{e(s.first_seen)}</td><td>{e(s.last_seen)}</td><td>{s.tonight}</td><td>{repro}</td></tr>")
    return "\n".join(rows + ["</table>"])


def _matrix_table(v: View) -> str:
    e = html.escape
    analyses = sorted({a for row in v.matrix.values() for a in row})
    rows = ["<table id='matrix'><tr><th>recording</th>" + "".join(f"<th>{e(a)}</th>" for a in analyses) + "</tr>"]
    for bundle, row in sorted(v.matrix.items()):
        cells = "".join(f"<td class='{e(row.get(a, ''))}'>{e(row.get(a, '-'))}</td>" for a in analyses)
        rows.append(f"<tr><td>{e(Path(bundle).name)}</td>{cells}</tr>")
    return "\n".join(rows + ["</table>"])


def _plots(v: View) -> str:
    """Findings and replay time per night, as inline SVG (matplotlib, no fonts fetched)."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    names = [n["name"] for n in v.nights]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3))
    axes[0].bar(names, [n["findings"] for n in v.nights])
    axes[0].set_title("findings per night")
    axes[1].bar(names, [n["replay_s"] for n in v.nights])
    axes[1].set_title("replay time per night (s)")
    for ax in axes:
        ax.tick_params(axis="x", labelrotation=45, labelsize=7)
    fig.tight_layout()
    buf = io.StringIO()
    fig.savefig(buf, format="svg")
    plt.close(fig)
    svg = buf.getvalue()
    return svg[svg.index("<svg"):]


_CSS = ("body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin-bottom:1em}"
        "td,th{border:1px solid #ccc;padding:.3em .6em;vertical-align:top}pre{white-space:pre-wrap;max-width:60em}"
        "tr.new td:first-child{background:#fdd;font-weight:bold}tr.flaky td:first-child{background:#ffd}"
        "tr.fixed td:first-child{background:#dfd}td.finding,td.divergence{background:#fdd}"
        "td.error{background:#eee}td.pass{background:#dfd}")


def write(v: View, out: Path) -> dict[str, Path]:
    """The three forms into out/: night.html, junit.xml, night.json."""
    out.mkdir(parents=True, exist_ok=True)
    paths = {"html": out / "night.html", "junit": out / "junit.xml", "json": out / "night.json"}
    paths["html"].write_text(to_html(v))
    paths["junit"].write_text(to_junit(v))
    paths["json"].write_text(to_json(v))
    return paths

"""Findings are deduplicated by title, and a title (guest console text) is printed as text."""
from __future__ import annotations

import io

from rich.console import Console

from tandem.cli import render
from tandem.semantic.analyze import AnalysisResult, Summary
from tandem.semantic.comparison.compare import NotAnalysed
from tandem.semantic.findings import Finding, distinct
from tandem.semantic.model import AnalysisRun

HOSTILE = "WARNING in [/] [bold]x[/bold] [link=file:///etc/passwd]y"


def finding(title: str, ns: int) -> Finding:
    return Finding("kasan", "WARNING", title, ns, after_input="tcp flow 1 offset 0", input_channel="net",
                   input_flow=1, input_offset=0, text="", frames=[], locations=[])


def test_distinct_keeps_first_of_each_title_with_its_count():
    found = [finding("WARNING in f", 1), finding("KASAN: x in g", 2), finding("WARNING in f", 3)]
    assert [(f.vm_ns, n) for f, n in distinct(found)] == [(1, 2), (2, 1)]


def _capture() -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, width=400, color_system=None), buf


def test_summary_prints_each_title_once_and_as_text():
    run = AnalysisRun("kasan", outcome="finished", end_ns=10**9, wall_s=1.0)
    result = AnalysisResult("kasan", run, [finding(HOSTILE, 1), finding(HOSTILE, 2)], [], 0, [])
    out, buf = _capture()
    render.print_summary(Summary("b", [result]), out=out)
    text = buf.getvalue()
    assert text.count("FINDING") == 1 and f"FINDING {HOSTILE} (2 times; first shown)" in text
    assert "FOUND: 2 finding(s)" in text


def test_what_was_not_analysed_prints_apart_and_as_text():
    run = AnalysisRun("kasan", outcome="lagging", end_ns=10**9, wall_s=1.0, detail=HOSTILE)
    unreached = [NotAnalysed(f"tcp flow {i} (x)", 10**9, 3, HOSTILE.encode()) for i in range(7)]
    result = AnalysisResult("kasan", run, [], [], 0, [], f"lagging: {HOSTILE}", unreached)
    out, buf = _capture()
    render.print_summary(Summary("b", [result]), out=out)
    text = buf.getvalue()
    assert f"NOT ANALYSED lagging: {HOSTILE}" in text and "FINDING" not in text
    assert "21 line(s) of the native's output on 7 channel(s)" in text and "... 2 more channel(s)" in text
    assert "INCOMPLETE: 0 finding(s), 0 divergence(s) across 1 analysis VM(s); 1 did not analyse" in text


def test_live_finding_prints_hostile_title_as_text():
    out, buf = _capture()
    render.print_live_finding(finding(HOSTILE, 5 * 10**8), out=out)
    assert f"kasan: {HOSTILE} (VM 0.500s" in buf.getvalue()

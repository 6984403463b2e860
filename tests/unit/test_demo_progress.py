"""The demo's wait for the analyses' kernels shows progress in a terminal and in a log."""
from __future__ import annotations

import io

from rich.console import Console

from tandem.cli import demo


class Status:
    def __init__(self):
        self.lines = []

    def update(self, line):
        self.lines.append(line)


def test_terminal_gets_every_line_on_the_status_line():
    status = Status()
    show = demo._progress(Console(file=io.StringIO(), force_terminal=True), status)
    for n in range(3):
        show(f"building kernel-kasan {n}/10 files")
    assert status.lines == [f"building kernel-kasan {n}/10 files" for n in range(3)]


def test_a_log_gets_plain_lines_at_most_every_interval(monkeypatch):
    out, now = io.StringIO(), [1000.0]
    monkeypatch.setattr(demo.time, "monotonic", lambda: now[0])
    show = demo._progress(Console(file=out, force_terminal=False, width=200), Status(), every_s=30)
    for n in range(100):        # one call a second, as build.Background.wait makes them
        show(f"building kernel-kasan {n}/100 files")
        now[0] += 1
    lines = out.getvalue().splitlines()
    assert lines == [f"building kernel-kasan {n}/100 files" for n in (0, 30, 60, 90)]

"""What tandem prints for people: the summary of an analysis, a finding the moment it is
reported. The CLI and the demo both print through here, so the demo needs nothing of the
CLI (which imports the demo).

Everything a guest wrote (titles, inputs, console lines) is escaped before rich sees it:
a console line holding "[/]" would stop a live run on a markup error."""
from __future__ import annotations

from rich.console import Console
from rich.markup import escape

console = Console(stderr=True, highlight=False, soft_wrap=True)


def print_live_finding(f, out=console) -> None:
    """One line the moment an analysis reports. The title and the input are made of
    guest text: escaped, so "[/]" in a console line cannot stop a live run on a
    markup error."""
    out.print(f"[red]FINDING[/] {escape(f'{f.analysis}: {f.title} (VM {f.vm_ns / 1e9:.3f}s, after {f.after_input})')}")


def print_summary(s, out=console) -> None:
    """Findings first (what the analyses found, each title once), then divergences, then the verdict."""
    for r in s.results:
        run = r.run
        head = (f"[bold]{r.analysis}[/]: {run.outcome}, VM time {run.end_ns / 1e9:.2f}s, "
                f"wall {run.wall_s:.1f}s, {len(r.findings)} finding(s), "
                f"{len(r.divergences)} divergence(s)" + (f" ({r.noise} noise)" if r.noise else ""))
        out.print(head)
        for f, n in r.distinct:
            # The guilty frame's own source line, when it could be found.
            at = [x for x in f.locations if f.frames and x[0] == f.frames[0]]
            loc = f" at {at[0][1]}:{at[0][2]}" if at else ""
            times = f" ({n} times; first shown)" if n > 1 else ""
            # The title is made of guest console text: never markup.
            out.print(f"  [red]FINDING[/] {escape(f.title + loc)}{times}", markup=True)
            out.print(f"    VM {f.vm_ns / 1e9:.6f}s, after {f.after_input}", markup=False)
            for earlier in f.before:
                out.print(f"      before it: {earlier}", markup=False)
        if r.findings and run.bundle:
            out.print(f"  reproduce exactly: tandem replay {run.bundle}", markup=False)
        for d in r.divergences:
            out.print(f"  [yellow]DIVERGENCE[/] {d.channel}: {d.kind}", markup=True)
            t = lambda ns: "-" if ns is None else f"{ns / 1e9:.6f}s"
            out.print(f"    native VM {t(d.native_ns)}, analysis VM {t(d.analysis_ns)}, "
                      f"after {d.after_input}", markup=False)
            lines = d.diff.splitlines()
            for line in lines[2:14]:
                out.print("    " + line, markup=False)
            if len(lines) > 14:
                out.print(f"    ... {len(lines) - 14} more lines", markup=False)
        print_not_analysed(r, out)
    for lim in s.limits:
        out.print(f"  replay limit: {lim}", markup=False)
    print_verdict(s, out)


def print_verdict(s, out=console) -> None:
    """One line: found, incomplete or clean, with the counts across the summary's analyses."""
    n_f = sum(len(r.findings) for r in s.results)
    n_d = sum(len(r.divergences) for r in s.results)
    n_i = sum(not r.complete for r in s.results)
    verdict = "[bold red]FOUND" if not s.ok else "[bold yellow]INCOMPLETE" if not s.complete else "[bold green]CLEAN"
    out.print(verdict + f"[/]: {n_f} finding(s), {n_d} divergence(s) across {len(s.results)} analysis VM(s)"
              + (f"; {n_i} did not analyse the whole recording (tandem's limit, not a finding)" if n_i else ""))


SHOWN = 5       # channels of output not analysed shown, per analysis


def print_not_analysed(r, out=console) -> None:
    """What an analysis could not analyse, and why: apart from findings and divergences."""
    if r.failure:
        out.print(f"  [yellow]NOT ANALYSED[/] {escape(r.failure)}")
    if r.not_analysed:
        lines = sum(x.lines for x in r.not_analysed)
        out.print(f"  not analysed: {lines} line(s) of the native's output on {len(r.not_analysed)} "
                  "channel(s), which the analysis never reached", markup=False)
        for x in r.not_analysed[:SHOWN]:
            out.print(f"    {x.describe()}", markup=False)
        if len(r.not_analysed) > SHOWN:
            out.print(f"    ... {len(r.not_analysed) - SHOWN} more channel(s)", markup=False)

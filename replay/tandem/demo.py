"""`tandem demo`: the embedded default, end to end.

Record the demo guest while real clients talk to it over the port forward and
lines are typed on its serial console; power it off; inspect the bundle; replay
it exactly and show the verdict.
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from .inspect_bundle import inspect, render
from .record import Recording
from .replay_exact import replay
from .workload import demo_traffic


def run_demo(console, workdir: Path | None = None) -> int:
    tmp = None
    if workdir is None:
        tmp = Path(tempfile.mkdtemp(prefix="tandem-demo-"))
        workdir = tmp
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "demo.tdm"
    if path.exists():
        shutil.rmtree(path)
    try:
        console.rule("[bold]1. record")
        with Recording(path) as rec:
            with console.status("booting the demo guest (native kernel, kvd service)"):
                rec.wait_ready()
            console.print(f"guest ready; service forwarded to 127.0.0.1:{rec.port}")
            with console.status("driving client traffic (python sockets + nc)"):
                stats = demo_traffic(rec.port)
            console.print(f"clients made {stats['requests']} requests")
            rec.serial.type("echo hello from the serial console")
            mark = rec.serial.wait_for(b"hello from the serial console", 30)
            rec.serial.type("stats")
            rec.serial.wait_for(b"STATS", 30, start=mark)
            rec.serial.type("poweroff")
            with console.status("guest powering off"):
                rec.wait(timeout=120)
        console.print(render(inspect(path)))

        console.rule("[bold]2. exact replay")
        with console.status("replaying under icount (idle time skipped)"):
            v = replay(path)
        console.print(("[bold green]" if v.ok else "[bold red]") + v.summary())
        console.print(f"bundle kept at {path}" if tmp is None else
                      f"(bundle in {path}; removed at exit, use --workdir to keep it)")
        return 0 if v.ok else 1
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)

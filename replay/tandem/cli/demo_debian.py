"""`tandem demo --guest debian`: the same story on an ordinary VM. The
reference VM (scripts/build-refvm.sh: Debian 12 from its own disk, GRUB, systemd, nginx,
redis; nothing of tandem inside) is recorded from power-on while Debian's clients drive
both services at once; it is powered off by its ACPI button; the bundle is inspected and
replayed exactly. The CLI does not depend on this VM: it is `tandem record --disk` with
two forwards, as a user would type it."""
from __future__ import annotations

import shutil
import tempfile
import threading
from pathlib import Path

from .. import artifacts, private
from ..errors import EXIT_CLEAN, EXIT_FOUND
from ..exact.replay import replay
from ..machine import Forward, Guest
from ..qemu.vm import free_port
from ..record import clients
from ..record.recording import Recording
from .inspect_bundle import inspect, render

BOOT_TIMEOUT_S = 600        # SeaBIOS, GRUB, the kernel and systemd under TCG with -icount


def record_debian(path: Path, console, *, http_requests: int = 400, redis_requests: int = 2000) -> list[str]:
    """Record the reference VM under both services' clients; what the clients said."""
    ref = artifacts.refvm()
    http, redis = free_port(), free_port()
    guest = Guest.of_disks([(ref["disk"], ref["disk_format"])])
    said: list[str] = []
    with Recording(path, guest, forwards=(Forward("tcp", http, 80), Forward("tcp", redis, 6379))) as rec:
        alive = rec.running
        with console.status("booting Debian (SeaBIOS, GRUB, the kernel, systemd)") as st:
            waited = clients.wait_for(lambda: clients.http_up(http), "nginx", BOOT_TIMEOUT_S, alive, st.update)
            clients.wait_for(lambda: clients.redis_up(redis), "redis", BOOT_TIMEOUT_S, alive, st.update)
        console.print(f"nginx answered {waited:.0f} s after power-on; forwards: 127.0.0.1:{http} -> 80, "
                      f"127.0.0.1:{redis} -> 6379")
        with console.status("curl fetches the site, ab and redis-benchmark load both services at once"):
            fetched = clients.fetch_files(http, {f["path"]: f["sha256"] for f in ref["site"]})
            said.append(f"curl: {len(ref['site'])} files, {fetched} bytes, every hash as built")
            loads: list[clients.Load] = []
            redis_thread = threading.Thread(target=lambda: loads.extend(
                clients.redis_benchmark(redis, requests=redis_requests)), name="redis-benchmark")
            redis_thread.start()
            loads.append(clients.ab(http, requests=http_requests))
            redis_thread.join()
            said += [load.line() for load in loads]
        for line in said:
            console.print(line, markup=False)
        with console.status("pressing the ACPI power button; Debian shuts down"):
            rec.powerdown()
            rec.wait(timeout=300)
    return said


def run_debian_demo(console, workdir: Path | None = None) -> int:
    tmp = Path(tempfile.mkdtemp(prefix="tandem-demo-")) if workdir is None else None
    workdir = tmp or workdir or Path(".")
    private.make_dir(workdir)
    path = workdir / "debian.tdm"
    if path.exists():
        shutil.rmtree(path)
    from ..setup import build
    build.build(["record", "refvm"], command="tandem demo --guest debian")
    try:
        console.rule("[bold]1. record the reference Debian VM from its own disk")
        record_debian(path, console)
        console.print(render(inspect(path)))
        console.rule("[bold]2. exact replay")
        with console.status("replaying under icount"):
            v = replay(path)
        console.print(("[bold green]" if v.ok else "[bold red]") + v.summary())
        console.print(f"bundle kept at {path}" if tmp is None else
                      f"(bundle in {path}; removed at exit, use --workdir to keep it)")
        return EXIT_CLEAN if v.ok else EXIT_FOUND
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)

"""`tandem record`: boot a guest (the demo guest, or your VM from its disks) and record it
into a bundle."""
from __future__ import annotations

import argparse
import signal

from .common import add_mode_option, add_stop_option, build_for, parse_duration, progress, record_targets
from .guest_options import add_guest_options, guest_from_args, kernel_flavor
from .render import console

FORWARD_WATCH_JOIN_S = 10.0    # wall seconds to let the forward watcher read the log's end

EPILOG = """\
Your own VM, booted by its own bootloader, its web server on host port 8080:
  tandem record web.tdm --disk web.qcow2 --forward tcp:8080:80
  (drive it: curl http://127.0.0.1:8080/ ...; stop it: poweroff in the guest, --duration, Ctrl-C)
  tandem replay web.tdm
The recording starts at power-on; no agent runs in the guest. To wait until a service is up
before driving it, poll its forward (e.g. until curl -sf http://127.0.0.1:8080/ >/dev/null;
do sleep 1; done): a connection tried before the guest listens is refused, and tandem says so.
"""


def add_parsers(sub) -> None:
    r = sub.add_parser("record", help="boot a guest and record it into a bundle", epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    r.add_argument("bundle", help="bundle directory to create (NAME.tdm)")
    r.add_argument("--duration", type=parse_duration, help="stop after this much VM time (e.g. 30s)")
    r.add_argument("--port", type=int, help="demo guest: the host port forwarded to its service "
                                            "(port 7000; default a free port)")
    add_mode_option(r)
    add_guest_options(r)
    add_stop_option(r)
    r.add_argument("--assertions", metavar="FILE",
                   help="declare an assertion pack for later `tandem assert` (checked, hashed into "
                        "the manifest; the recording itself is unchanged)")
    r.set_defaults(func=cmd_record)


def cmd_record(args) -> int:
    from ..qemu.vm import free_port
    from ..record.recording import Recording
    build_for(record_targets(args), "recording")
    guest = guest_from_args(args)
    declared = None
    if args.assertions:     # checked now, so a broken pack is found before the recording
        from ..assertions.check import declare_pack
        declared = declare_pack(args.assertions, kernel_flavor(args))
    port = args.port
    if not args.disk and port is None:    # the demo guest's service is always forwarded
        port = free_port()
    rec = Recording(args.bundle, guest, duration_ns=args.duration or 0, port=port, forwards=tuple(args.forward),
                    assertions=declared, stop=args.stop, powerdown_wait_s=args.shutdown_timeout, mode=args.mode)
    with rec:       # should anything fail before finish(), closing quits and seals it
        console.print(f"recording {args.bundle}: {_what(rec, guest)}; stop with "
                      f"{'--duration, ' if args.duration else ''}guest poweroff or Ctrl-C", markup=False)
        signal.signal(signal.SIGINT, lambda *_: rec.request_stop())
        signal.signal(signal.SIGTERM, lambda *_: rec.request_stop())
        watcher = rec.watch_forwards(lambda line: console.print(f"tandem: warning: {line}", markup=False))
        with console.status("booting") as status:
            rec.wait(progress=progress("recording", status),
                     say=lambda line: console.print(f"tandem: {line}", markup=False))
        m = rec.finish()
    if watcher is not None:
        watcher.join(FORWARD_WATCH_JOIN_S)      # what it reads of the log's end is said before the summary
    if m.stop.reason in ("guest-reset", "guest-panic"):
        console.print(f"tandem: warning: the guest stopped by {m.stop.reason} (a kernel panic "
                      f"reboots with panic=-1); its console is in {args.bundle}/devices.pcapng",
                      markup=False)
    console.print(f"[bold]recorded[/] {args.bundle}: stop={m.stop.reason}, "
                  f"VM time {(m.stop.vm_ns or 0) / 1e9:.2f}s, "
                  f"{sum((c.inbound.events or 0) + (c.outbound.events or 0) for c in m.channels.values() if c.kind != 'state')} "
                  f"device events, wall {m.wall_time_s or 0:.1f}s")
    return 0


def _what(rec, guest) -> str:
    """What is recorded and where its services are, in one line."""
    fwd = ", ".join(f"{f.protocol} 127.0.0.1:{f.host_port} -> guest {f.guest_port}" for f in rec.all_forwards())
    disks = ", ".join(d.base for d in guest.disks) if guest.boot == "firmware" or len(guest.disks) > 1 else ""
    parts = [f"booting {disks} through its bootloader" if guest.boot == "firmware" else f"kernel {guest.kernel}",
             f"forwards {fwd}" if fwd else "no forwards"]
    if rec.mode == "device":
        parts.append(f"device mode, {guest.vcpus} vCPU{'s' if guest.vcpus > 1 else ''} under {guest.accel}")
    elif guest.vcpus > 1:
        parts.append(f"{guest.vcpus} vCPUs in turns on one host thread")
    return "; ".join(parts)

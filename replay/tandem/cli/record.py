"""`tandem record`: boot a guest and record it into a bundle."""
from __future__ import annotations

import signal

from .. import catalog
from .common import parse_duration, progress
from .render import console


def add_parsers(sub) -> None:
    r = sub.add_parser("record", help="boot a guest and record it into a bundle")
    r.add_argument("bundle", help="bundle directory to create (NAME.tdm)")
    r.add_argument("--duration", type=parse_duration, help="stop after this much VM time (e.g. 30s)")
    r.add_argument("--port", type=int, help="host port forwarded to the guest service (default: free port)")
    r.add_argument("--kernel", default="native", choices=list(catalog.KERNELS),
                   help="guest kernel flavor (default native)")
    r.add_argument("--kernel-image", help="boot this bzImage instead of a built flavor")
    r.add_argument("--userland", default="native", choices=list(catalog.USERLANDS),
                   help="guest userland (default native; asan: its services built with ASan)")
    r.add_argument("--assertions", metavar="FILE",
                   help="declare an assertion pack for later `tandem assert` (checked, hashed into "
                        "the manifest; the recording itself is unchanged)")
    r.set_defaults(func=cmd_record)


def cmd_record(args) -> int:
    from ..machine import Guest
    from ..record.recording import Recording
    guest = Guest.default(args.kernel, args.userland)
    if args.kernel_image:
        guest.kernel = args.kernel_image
    declared = None
    if args.assertions:     # checked now, so a broken pack is found before the recording
        from ..assertions.check import declare_pack
        declared = declare_pack(args.assertions, args.kernel)
    rec = Recording(args.bundle, guest, duration_ns=args.duration or 0, port=args.port,
                    assertions=declared)
    rec.start()
    console.print(f"recording {args.bundle}: guest service on 127.0.0.1:{rec.port}, "
                  f"stop with {'--duration, ' if args.duration else ''}guest poweroff or Ctrl-C")
    interrupted = False

    def on_sigint(*_):
        nonlocal interrupted
        interrupted = True
        rec.stop()
    signal.signal(signal.SIGINT, on_sigint)
    signal.signal(signal.SIGTERM, on_sigint)
    with console.status("booting") as status:
        rec.wait(progress=progress("recording", status))
    m = rec.finish()
    if m["stop"]["reason"] in ("guest-reset", "guest-panic"):
        console.print(f"tandem: warning: the guest stopped by {m['stop']['reason']} (a kernel panic "
                      f"reboots with panic=-1); its console is in {args.bundle}/devices.pcapng",
                      markup=False)
    console.print(f"[bold]recorded[/] {args.bundle}: stop={m['stop']['reason']}, "
                  f"VM time {m['stop']['vm_ns'] / 1e9:.2f}s, "
                  f"{sum(c['in']['events'] + c['out']['events'] for c in m['channels'].values())} "
                  f"device events, wall {m['wall_time_s']:.1f}s")
    return 0

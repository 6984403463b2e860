"""`tandem inspect`: what a bundle holds, and whether it is intact."""
from __future__ import annotations

import json

from ..errors import EXIT_CLEAN, EXIT_FOUND


def add_parsers(sub) -> None:
    r = sub.add_parser("inspect", help="per-channel counts, sizes, integrity of a bundle")
    r.add_argument("bundle")
    r.add_argument("--json", action="store_true")
    r.set_defaults(func=cmd_inspect)


def cmd_inspect(args) -> int:
    from .inspect_bundle import inspect, render
    info = inspect(args.bundle)
    print(json.dumps(info, indent=2, default=str) if args.json else render(info))
    return EXIT_CLEAN if info["integrity"]["ok"] else EXIT_FOUND

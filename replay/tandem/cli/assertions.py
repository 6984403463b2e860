"""`tandem assert`: temporal kernel assertions checked on an exact replay."""
from __future__ import annotations

from ..errors import EXIT_CLEAN, EXIT_FOUND
from .common import build_for, progress
from .render import console


def add_parsers(sub) -> None:
    r = sub.add_parser("assert", help="check temporal kernel assertions on an exact replay "
                       "(docs/assertions-running.md)")
    r.add_argument("bundle")
    r.add_argument("--assertions", metavar="FILE",
                   help="assertion pack (default: the one the recording declared)")
    r.add_argument("--select", action="append", metavar="NAME",
                   help="check only this assertion (repeatable)")
    r.add_argument("--json", action="store_true", help="also print the violations as JSON on stdout")
    r.set_defaults(func=cmd_assert)


def cmd_assert(args) -> int:
    from ..assertions.check import check, render
    # the recorded kernel and its modules are the bundle's own (a missing one: one line from check)
    build_for(["qemu", "plugin-calls"], "checking assertions")
    with console.status("replaying with the assertion plugin") as status:
        res = check(args.bundle, args.assertions, select=args.select,
                    progress=progress("replaying with assertions", status))
    render(res, console)
    if args.json:
        print(res.to_json())
    return EXIT_FOUND if res.fatal else EXIT_CLEAN

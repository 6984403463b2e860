"""`tandem plan`: the input buffer an analysis needs (FreeDA's equation 2)."""
from __future__ import annotations

import json

from .render import console


def add_parsers(sub) -> None:
    r = sub.add_parser("plan", help="predict the input buffer an analysis needs (FreeDA's "
                       "equation 2) from a recording's requests")
    r.add_argument("bundle", help="the native's recording")
    r.add_argument("--slowdown", type=float, metavar="F",
                   help="how many times slower the analysis runs than the native")
    r.add_argument("--from", dest="from_workdir", metavar="WORKDIR",
                   help="measure the slowdown from a finished semantic replay's summary.json "
                        "(tandem replay BUNDLE --analysis NAME --workdir WORKDIR)")
    r.add_argument("--analysis", help="with --from: that analysis only (default: each, and the largest)")
    r.add_argument("--concurrency", type=int, metavar="N_T",
                   help="requests the native issues before the analysis catches up (default: "
                        "measured from the recording for the slowdown)")
    r.add_argument("--no-boot", action="store_true",
                   help="the analysis is booted before the native serves: no boot backlog")
    r.add_argument("--per-request", choices=["mean", "max"], default="mean",
                   help="S_req as the mean request (FreeDA's choice, default) or the largest")
    r.add_argument("--json", action="store_true", help="also print the inputs and result as JSON on stdout")
    r.set_defaults(func=cmd_plan)


def cmd_plan(args) -> int:
    from ..plan import plan, render
    p = plan(args.bundle, slowdown=args.slowdown, concurrency=args.concurrency,
             from_workdir=args.from_workdir, analysis=args.analysis, stat=args.per_request,
             boot=not args.no_boot)
    console.print(render(p), markup=False)
    if args.json:
        print(json.dumps(p.to_json(), indent=1))
    return 0

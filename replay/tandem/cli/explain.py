"""`tandem explain`: did the native make the bad access an analysis reported?"""
from __future__ import annotations

import json
from pathlib import Path

from ..errors import EXIT_CLEAN, EXIT_FOUND
from .common import build_for, progress
from .render import console


def add_parsers(sub) -> None:
    r = sub.add_parser("explain", help="replay the native to a finding's function and re-execute it in "
                       "Unicorn: did the native make the same bad access? (docs/explain.md)")
    r.add_argument("bundle", help="the native's recording")
    r.add_argument("--finding", type=int, required=True, metavar="N",
                   help="the finding's number: its line in findings.jsonl, from 1")
    r.add_argument("--findings", metavar="FILE",
                   help="the findings file (default: BUNDLE/analysis/findings.jsonl, tandem replay's)")
    r.add_argument("--trace", type=int, default=60, metavar="N",
                   help="instructions of the trace shown around the access (default 60; 0: all)")
    r.add_argument("--vmlinux", metavar="PATH",
                   help="the native's kernel with its debug info, when tandem did not build it (System.map "
                        "and its modules' .ko files beside it)")
    r.add_argument("--json", action="store_true", help="also print the explanation as JSON on stdout")
    r.set_defaults(func=cmd_explain)


def cmd_explain(args) -> int:
    from ..explain import explain, render
    path = Path(args.findings) if args.findings else Path(args.bundle) / "analysis" / "findings.jsonl"
    f = explain.load_finding(path, args.finding)
    explain.function_of(f)          # a finding with no kernel function: one line, before any build
    build_for(["qemu", "plugin-calls", "plugin-stop"], "explaining a finding")
    with console.status("replaying the native to the finding's input") as status:
        e = explain.explain(Path(args.bundle), f, args.finding, progress=progress("replaying the native", status),
                            vmlinux=Path(args.vmlinux) if args.vmlinux else None)
    console.print(render.text(e, args.trace), markup=False, highlight=False)
    if args.json:
        print(json.dumps(e.to_json(), indent=1))
    return EXIT_FOUND if e.same else EXIT_CLEAN

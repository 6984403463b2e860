"""`tandem plan` on a real recording of the demo guest under its client traffic."""
from __future__ import annotations

import json

from helpers import run_cli


def test_plan_counts_the_demo_requests(demo_bundle):
    """demo_traffic(rounds=10): two clients alternate 10 SETs and 10 GETs, one SYNC, a
    QUIT each (the close counts with it), then nc sends five lines and QUIT in one
    write: 20 + 1 + 2 + 1 = 24 requests on 3 connections."""
    r = run_cli("plan", str(demo_bundle), "--slowdown", "2", "--json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    w = out["workload"]
    assert (w["requests"], w["flows"]) == (24, 3)
    assert w["events_per_request"]["max"] == 3                  # nc: open, its lines, close
    assert w["background_events"] >= 2                          # the typed serial lines
    assert 1.0 < w["ready_vm_s"] < w["vm_s"] and "TANDEM-READY" in w["ready_source"]
    (b,) = out["buffers"]
    assert 1 <= b["n_t"] <= 24 and b["events"] == b["equation"]["events"] + b["boot_backlog"]["events"]
    # Equation 2 at F = 2: (N_T * S_req - N_T / 2 * S_req + S_req), rounded up.
    s = out["s_req_events"]
    assert b["equation"]["events"] == -(-(b["n_t"] * s / 2 + s) // 1)

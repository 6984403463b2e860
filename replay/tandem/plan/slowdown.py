"""F, how many times slower an analysis runs than the native, measured from a finished
semantic replay's summary.json (`tandem replay --analysis`; docs/plan.md)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import TandemError
from ..formats.bundle import Manifest, unencodable

BASE = "native"             # the null analysis: the native kernel, replayed as the analyses are


@dataclass
class Slowdown:
    f: float
    source: str
    analysis: str | None = None
    analysis_wall_s: float | None = None
    base_wall_s: float | None = None
    base: str = ""


def slowdowns_from(workdir: Path, manifest: Manifest, analysis: str | None) -> list[Slowdown]:
    """F for each analysis of a finished semantic replay (`tandem replay --analysis`),
    from WORKDIR/summary.json. Only runs that reached the end count.

    The base is the replay's run of the native kernel (the `native` analysis), if it has
    one: same inputs, same replay, same skipping of idle time (sleep=off), so F is the
    analysis kernel's slowdown alone. Otherwise the base is the native recording's wall
    time from its manifest. The recording waited out its idle time and the analysis did
    not, so that F is too low for an idle-heavy recording.
    """
    path = Path(workdir) / "summary.json"
    try:
        summary = json.loads(path.read_text())
    except FileNotFoundError:
        raise TandemError(f"{path}: not found (run tandem replay BUNDLE --analysis NAME --workdir DIR)") from None
    except json.JSONDecodeError as e:
        raise TandemError(f"{path}: unreadable ({e})") from None
    if problem := (unencodable(summary) if isinstance(summary, dict) else "not a JSON object"):
        raise TandemError(f"{path}: {problem}")
    runs = summary.get("analyses", [])
    live_cpu = (summary.get("live") or {}).get("native_cpu_s")
    if live_cpu:
        # A live run (tandem shadow): every VM ran as long as the native, so wall times
        # say nothing; F is the analysis QEMU's CPU time over the native QEMU's, for the
        # same inputs (idle costs neither: the native sleeps, the analysis warps).
        rows = [a for a in runs if analysis is None or a.get("analysis") == analysis]
        if not rows:
            raise TandemError(f"{path}: no analysis {analysis!r}")
        out = []
        for a in rows:
            if a.get("outcome") not in ("finished", "poweroff") or not a.get("cpu_s"):
                raise TandemError(f"{path}: analysis {a.get('analysis')!r} did not finish "
                                  f"(outcome {a.get('outcome')!r}): no slowdown to measure")
            out.append(Slowdown(a["cpu_s"] / live_cpu, f"measured: {path}", a["analysis"], a["cpu_s"],
                                live_cpu, f"live run: {a['cpu_s']:.2f}s of CPU against the native "
                                          f"QEMU's {live_cpu:.2f}s"))
        return out
    done = [a for a in runs if a.get("outcome") in ("finished", "poweroff") and a.get("wall_s")]
    base = next((a for a in done if a.get("analysis") == BASE), None)
    if analysis is None:
        rows = [a for a in runs if not (base and a is base)]
    else:
        rows = [a for a in runs if a.get("analysis") == analysis]
    if not rows:
        known = ", ".join(a.get("analysis", "?") for a in runs)
        raise TandemError(f"{path}: no analysis {analysis or '(other than native)'!r} (it has: {known or 'none'})")
    if base and analysis != BASE:
        base_wall, how = base["wall_s"], f"the native kernel's replay took {base['wall_s']:.2f}s"
    else:
        base_wall = manifest.wall_time_s
        if not base_wall:
            raise TandemError("the native bundle's manifest has no wall time (an unfinished recording?)")
        how = (f"the native recorded in {base_wall:.2f}s, idle included (replay --analysis "
               f"{BASE},... for a base without idle)")
    out = []
    for a in rows:
        if a not in done:
            raise TandemError(f"{path}: analysis {a.get('analysis')!r} did not finish "
                              f"(outcome {a.get('outcome')!r}): no slowdown to measure")
        out.append(Slowdown(a["wall_s"] / base_wall, f"measured: {path}", a["analysis"], a["wall_s"],
                            base_wall, how))
    return out

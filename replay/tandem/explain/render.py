"""An explanation as text: the verdict first, then the window's trace around the access,
each instruction with its source line, the memory it touched and what the replay ran."""
from __future__ import annotations

from .explain import Explanation


def text(e: Explanation, around: int = 60) -> str:
    out = [f"finding {e.finding}: {e.title} ({e.analysis})",
           f"  after input: {e.input}",
           f"  verdict: {e.verdict}",
           f"  exact replay: {e.replay}",
           f"  {e.function} entered {len(e.windows)} time(s) after the input; Unicorn ran {e.emulated} "
           f"instructions in {e.emulate_s:.2f} s; the replay took {e.to_stop_s:.1f} s to reach the window, "
           f"{e.explain_s:.2f} s to explain it" if e.windows else
           f"  {e.function} never entered after the input: the replay ran to its end in {e.to_stop_s:.1f} s"]
    focus = e.access
    for k, w in enumerate(e.windows):
        entry = w["entry"]
        out.append(f"\nwindow {k + 1}: {e.function} at instruction {entry['icount']} "
                   f"(VM {entry['vm_ns'] / 1e9:.6f}s): {w['end']}; {w['emulated']} instructions in Unicorn, "
                   f"{w['stepped_over']} run by the replay")
        for m in w["mismatches"]:
            out.append(f"  ! Unicorn and the replay differ {m}")
        steps = w["steps"]
        acc_by_step: dict[int, list[dict]] = {}
        for a in w["accesses"]:
            acc_by_step.setdefault(a["step"], []).append(a)
        lo, hi = 0, len(steps)
        if around and len(steps) > around:
            mid = focus.step if focus is not None and any(a["icount"] == focus.icount for a in w["accesses"]) \
                else next(iter(acc_by_step), 0)
            lo, hi = max(0, mid - around // 2), min(len(steps), mid + around // 2)
            if lo:
                out.append(f"  ... {lo} instructions")
        for j in range(lo, hi):
            s = steps[j]
            mark = "R" if s["stepped"] else " "
            line = f"  {mark} {s['icount'] if s['icount'] is not None else '':>12} {s['where']:<36} {s['text']:<36}"
            out.append(line + (f" {s['line']}" if s["line"] else "") +
                       (f"  [{s['stepped']}]" if s["stepped"] else ""))
            for a in acc_by_step.get(j, []):
                hit = focus is not None and a["icount"] == focus.icount and a["addr"] == focus.addr
                out.append(f"      {'>>' if hit else '  '} {a['kind']} {a['size']} at {a['addr']:#x}"
                           + (f": {a['place']}" if a["place"] else ""))
        if hi < len(steps):
            out.append(f"  ... {len(steps) - hi} instructions")
    if focus is not None:
        out.append(f"\nthe object: allocated by {focus.allocated_by or '?'} at instruction {focus.allocated_icount}"
                   + (f", freed by {focus.freed_by or '?'} at instruction {focus.freed_icount} "
                      f"(VM {(focus.freed_vm_ns or 0) / 1e9:.6f}s)" if focus.freed_icount is not None else ""))
    return "\n".join(out)

"""Equivalence specs: which output differences between the native and an analysis VM
are acceptable (the Differential Monitoring idea of an acceptable-difference spec).

A spec is a TOML file (docs/equivalence.md); every key is optional:

    ignore_channels = ["udp"]          # serial | tcp | udp: not compared at all
    max_lag_ms = 5000                  # an output this much later (VM time) than the
                                       # native's counterpart is a divergence (0: no bound)
    [serial]
    ignore_kernel_lines = true         # printk lines ("[    1.234] ...") differ by kernel
    ignore = ['^kvd: open conn']       # regexes: matching lines are dropped on both sides
    mask = ['conn \\d+']               # regexes: matches are replaced by <*> on both sides
    reorder_window = 8                 # a line found this many lines away on the other side
                                       # is a reordering (processes sharing a console), not a
                                       # difference
    [tcp]
    ignore = []
    mask = []
    byte_ranges = [{flow = 0, start = 0, end = 8}]   # masked payload bytes of a flow
    relaxed_flow_order = true          # flows are compared one by one (the only mode)

Built-in defaults per analysis are applied first (BUILTIN below); a user spec
adds to them.
"""
from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from .errors import TandemError

CHANNELS = ("serial", "tcp", "udp")

# Sanitizer output is reported as findings, not as divergences.
_SANITIZER_LINES = [r"^==\d+==", r"^\s*#\d+ 0x[0-9a-f]+ ", r"runtime error:", r"^SUMMARY: ",
                    r"^(Shadow|Address|  )", r"^=+$"]
BUILTIN: dict[str, dict] = {
    "*": {"serial": {"ignore_kernel_lines": True, "reorder_window": 8}},
    "asan-userland": {"serial": {"ignore": _SANITIZER_LINES}},
}


@dataclass
class ChannelRules:
    ignore: list[re.Pattern] = field(default_factory=list)
    mask: list[re.Pattern] = field(default_factory=list)
    ignore_kernel_lines: bool = False
    byte_ranges: list[tuple[int, int, int]] = field(default_factory=list)   # (flow, start, end)
    reorder_window: int = 0


@dataclass
class Spec:
    ignore_channels: set[str] = field(default_factory=set)
    max_lag_ns: int = 0
    rules: dict[str, ChannelRules] = field(default_factory=lambda: {c: ChannelRules() for c in CHANNELS})
    sources: list[str] = field(default_factory=list)


def _merge(spec: Spec, data: dict, where: str) -> None:
    def fail(msg: str):
        raise TandemError(f"{where}: {msg}")

    known = {"ignore_channels", "max_lag_ms", *CHANNELS}
    for k in data:
        if k not in known:
            fail(f"unknown key {k!r} (known: {', '.join(sorted(known))})")
    for c in data.get("ignore_channels", []):
        if c not in CHANNELS:
            fail(f"ignore_channels: unknown channel {c!r} (known: {', '.join(CHANNELS)})")
        spec.ignore_channels.add(c)
    if "max_lag_ms" in data:
        v = data["max_lag_ms"]
        if not isinstance(v, (int, float)) or v < 0:
            fail(f"max_lag_ms: want a number >= 0, got {v!r}")
        spec.max_lag_ns = int(v * 1e6)
    for c in CHANNELS:
        sect = data.get(c, {})
        if not isinstance(sect, dict):
            fail(f"[{c}] must be a table")
        r = spec.rules[c]
        for k, v in sect.items():
            if k in ("ignore", "mask"):
                if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
                    fail(f"{c}.{k}: want a list of regular expressions")
                for x in v:
                    try:
                        getattr(r, k).append(re.compile(x.encode()))
                    except re.error as e:
                        fail(f"{c}.{k}: bad regular expression {x!r}: {e}")
            elif k == "ignore_kernel_lines" and c == "serial":
                if not isinstance(v, bool):
                    fail(f"{c}.{k}: want true or false")
                r.ignore_kernel_lines = v
            elif k == "reorder_window":
                if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                    fail(f"{c}.{k}: want a whole number of lines >= 0, got {v!r}")
                r.reorder_window = v
            elif k == "byte_ranges" and c == "tcp":
                for br in v:
                    if not (isinstance(br, dict) and set(br) == {"flow", "start", "end"}
                            and all(isinstance(br[x], int) and br[x] >= 0 for x in br)
                            and br["start"] < br["end"]):
                        fail(f"{c}.byte_ranges: want {{flow, start, end}} with start < end, got {br!r}")
                    r.byte_ranges.append((br["flow"], br["start"], br["end"]))
            elif k == "relaxed_flow_order" and c == "tcp":
                if v is not True:
                    fail("tcp.relaxed_flow_order: flows are always compared one by one; only true is accepted")
            else:
                fail(f"unknown key {c}.{k}")


# The embedded default guest's own spec, used when the user gives none.
DEMO_SPEC = Path(__file__).resolve().parents[2] / "agent" / "kvd.equiv.toml"


def load(analysis: str, path: str | Path | None = None) -> Spec:
    """The built-in defaults for this analysis, plus the user's spec file if given
    (else the demo service's, agent/kvd.equiv.toml)."""
    spec = Spec()
    for key in ("*", analysis):
        if key in BUILTIN:
            _merge(spec, BUILTIN[key], f"built-in spec {key!r}")
            spec.sources.append(f"built-in:{key}")
    if path is None and DEMO_SPEC.is_file():
        path = DEMO_SPEC
    if path is not None:
        p = Path(path)
        try:
            data = tomllib.loads(p.read_text())
        except FileNotFoundError:
            raise TandemError(f"{p}: equivalence spec not found") from None
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise TandemError(f"{p}: not a valid TOML equivalence spec: {e}") from None
        _merge(spec, data, str(p))
        spec.sources.append(str(p))
    return spec

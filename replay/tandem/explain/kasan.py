"""What a KASAN report says of its bad access, read from its text: kind and size, and
where the address lies (how far into or past which region, allocated or freed)."""
from __future__ import annotations

import re
from dataclasses import dataclass

_ACCESS = re.compile(r"^(Read|Write) of size (\d+) at addr ([0-9a-f]+)", re.M)
_WHERE = re.compile(r"The buggy address is located (\d+) bytes (inside of|to the right of|to the left of)\s*\n?"
                    r"\s*(?:(allocated|freed) )?(\d+)-byte region", re.M)
# printk's prefixes: its time, then the caller's thread or CPU ("[   50.51][    C1] ")
_PREFIX = re.compile(r"^(?:\[[^\]\n]*\])*[ \t]?", re.M)
_CACHE = re.compile(r"which belongs to the cache (\S+) of size (\d+)")


@dataclass(frozen=True)
class Expected:
    kind: str            # "read" or "write"
    size: int
    offset: int          # from the region's start (past its end: size of region + bytes)
    region: int          # bytes requested
    state: str           # "allocated" or "freed" ("": a kernel before 6.4 does not say)
    cache: str = ""


def expected(text: str) -> Expected | None:
    """The report's access, or None for a report that is not KASAN's slab report."""
    text = _PREFIX.sub("", text)
    a, w = _ACCESS.search(text), _WHERE.search(text)
    if a is None or w is None:
        return None
    n, rel, state, region = int(w.group(1)), w.group(2), w.group(3) or "", int(w.group(4))
    offset = n if rel == "inside of" else region + n if rel == "to the right of" else -n
    c = _CACHE.search(text)
    return Expected(a.group(1).lower(), int(a.group(2)), offset, region, state, c.group(1) if c else "")


def describe(e: dict) -> str:
    n = e["offset"] - e["region"] if e["offset"] >= e["region"] else e["offset"]
    rel = "to the right of" if e["offset"] >= e["region"] else "inside of"
    cache = f" (cache {e['cache']})" if e.get("cache") else ""
    state = f"{e['state']} " if e["state"] else ""
    return f"{e['kind']} of size {e['size']} {n} bytes {rel} {state}{e['region']}-byte region{cache}"


def same(e: dict, m) -> bool:
    """Is the native's access m (explain.Matched) the one the report describes?"""
    return (m.kind == e["kind"] and m.size == e["size"] and m.offset == e["offset"]
            and m.region == e["region"] and (m.state == e["state"] or not e["state"]))

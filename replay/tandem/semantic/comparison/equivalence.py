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
    [http]                             # added to [tcp] on connections that carry HTTP/1.x
    ignore = []                        # (the client's first bytes are a request line)
    mask = []
    [resp]                             # added to [tcp] on connections that carry RESP (redis)
    mask = []

Built-in defaults are applied first (EVERY_ANALYSIS below, then the analysis's own from
the catalogue: Analysis.equivalence); a user spec
adds to them. The built-in protocol rules (PROTOCOL_RULES) allow what differs between two
servers answering the same requests at different times: docs/equivalence.md says why
each is there.
"""
from __future__ import annotations

import dataclasses
import math
import re
import re._constants as sre_constants
import re._parser as sre_parse
import tomllib
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from ... import artifacts, catalog
from ...errors import TandemError

CHANNELS = ("serial", "tcp", "udp")
PROTOCOLS = ("http", "resp")        # rule sets added to [tcp] by what a connection carries

# A spec is input from outside: every value is checked by type and range, so no
# value reaches int()/re.compile() in a shape that raises anything but TandemError.
MAX_LAG_MS = 10**12             # 31 years of VM time; the bound in ns stays within int64
MAX_REORDER_WINDOW = 1 << 20    # lines; the comparator looks this far on both sides
MAX_OFFSET = (1 << 63) - 1      # byte_ranges: a flow index or a byte offset
# A spec's patterns run on every line the guest writes, with Python's backtracking engine
# (no linear one in the venv: no re2, no regex). One search over a line of n bytes can take
# n x (what one attempt can give back), so the time is bounded twice: patterns are applied
# only to lines of at most MAX_RULED_LINE bytes (a longer line is compared as it stands,
# byte for byte), and a pattern whose bound on one line is over RULE_BUDGET steps is refused
# at load (_cost below). Measured (CPU, one core; bench/spec_lines.py, docs/benchmarks.md):
# `\d+x` on one line of 1 MB of digits is quadratic without the cap (16 KB: 0.5-0.64 s, so
# over half an hour for 1 MB); with the cap that line is compared in under 1 ms, and the
# worst a guest can do is distinct lines of exactly MAX_RULED_LINE bytes: 1 MB of them costs
# about 1 s per `\d+x`-like pattern (2.1 s with it as ignore and mask). A kernel's console lines stay under 1 KiB (printk
# records are at most 1,024 bytes), so the cap changes nothing for them.
MAX_RULED_LINE = 1024
RULE_BUDGET = 16 * MAX_RULED_LINE ** 2

# Every analysis's, then its own from the catalogue (an ASan userland's sanitizer lines
# are findings, not divergences).
# Protocol rules, on every analysis's connections that carry the protocol:
#  http: response headers whose values come from the server's clock or state, not from
#        the request (Date, Expires, Age; Last-Modified and ETag, nginx's made of the file's
#        mtime, which a guest that writes its files at boot sets from its own clock;
#        Keep-Alive's timeout=, max= count down per connection). Status lines, other
#        headers and bodies are compared as they are: a different body, status or a
#        missing response is a divergence.
#  resp: redis INFO fields that are the server's time, memory, counters or ids, and the
#        $LENGTH line of a bulk reply (INFO's length follows those fields; any other
#        difference shows in the value line itself). TIME's reply: on a connection whose
#        client sent TIME, compare.py turns the digits of each reply of its shape into NUL
#        bytes, and a line of 1-20 NULs is masked here.
PROTOCOL_RULES: dict[str, Mapping[str, object]] = {
    "http": {"mask": [r"(?i)(?<=^date: ).*", r"(?i)(?<=^expires: ).*", r"(?i)(?<=^age: ).*",
                      r"(?i)(?<=^last-modified: ).*", r"(?i)(?<=^etag: ).*", r"(?i)(?<=^keep-alive: ).*"]},
    "resp": {"mask": [r"^\$\d++$", r"^\x00{1,20}$",
                      r"(?<=^uptime_in_seconds:).*", r"(?<=^uptime_in_days:).*", r"(?<=^server_time_usec:).*",
                      r"(?<=^lru_clock:).*", r"(?<=^process_id:).*", r"(?<=^run_id:).*",
                      r"(?<=^used_memory).*", r"(?<=^used_cpu_).*", r"(?<=^mem_).*", r"(?<=^rss_).*",
                      r"(?<=^allocator_).*", r"(?<=^total_net_).*", r"(?<=^instantaneous_).*",
                      r"(?<=^total_connections_received:).*", r"(?<=^total_commands_processed:).*",
                      r"(?<=^total_reads_processed:).*", r"(?<=^total_writes_processed:).*",
                      r"(?<=^connected_clients:).*", r"(?<=^client_recent_max_).*", r"(?<=^cmdstat_).*",
                      r"(?<=^latest_fork_usec:).*", r"(?<=^rdb_).*", r"(?<=^aof_).*", r"(?<=^expired_).*",
                      r"(?<=^evicted_).*", r"(?<=^keyspace_).*", r"(?<=^executable:).*",
                      r"(?<=^config_file:).*", r"(?<=^io_threads_).*", r"(?<=^errorstat_).*"]},
}

EVERY_ANALYSIS: Mapping[str, object] = {"serial": {"ignore_kernel_lines": True, "reorder_window": 8},
                                         **PROTOCOL_RULES}


@dataclass
class ChannelRules:
    ignore: list[re.Pattern[bytes]] = field(default_factory=list)
    mask: list[re.Pattern[bytes]] = field(default_factory=list)
    ignore_kernel_lines: bool = False
    byte_ranges: list[tuple[int, int, int]] = field(default_factory=list)   # (flow, start, end)
    reorder_window: int = 0


@dataclass
class Spec:
    ignore_channels: set[str] = field(default_factory=set)
    max_lag_ns: int = 0
    rules: dict[str, ChannelRules] = field(default_factory=lambda: {c: ChannelRules() for c in (*CHANNELS, *PROTOCOLS)})
    sources: list[str] = field(default_factory=list)
    _per_protocol: dict[str, Spec] = field(default_factory=dict, repr=False, compare=False)

    def for_protocol(self, protocol: str | None) -> Spec:
        """This spec for a connection carrying `protocol` (inputs.Flow.protocol): its [tcp]
        rules with the protocol's added (made once per protocol)."""
        if protocol not in PROTOCOLS:
            return self
        if protocol not in self._per_protocol:
            tcp, extra = self.rules["tcp"], self.rules[protocol]
            merged = ChannelRules(tcp.ignore + extra.ignore, tcp.mask + extra.mask, tcp.ignore_kernel_lines,
                                  tcp.byte_ranges, max(tcp.reorder_window, extra.reorder_window))
            self._per_protocol[protocol] = dataclasses.replace(self, rules={**self.rules, "tcp": merged},
                                                               _per_protocol={})
        return self._per_protocol[protocol]


def _merge(spec: Spec, data: Mapping[str, object], where: str) -> None:
    def fail(msg: str) -> NoReturn:
        raise TandemError(f"{where}: {msg}")

    known = {"ignore_channels", "max_lag_ms", *CHANNELS, *PROTOCOLS}
    for k in data:
        if k not in known:
            fail(f"unknown key {_show(k)} (known: {', '.join(sorted(known))})")
    channels = data.get("ignore_channels", [])
    if not isinstance(channels, list):
        fail(f"ignore_channels: want a list of channel names, got {_show(channels)}")
    for c in channels:
        if c not in CHANNELS:
            fail(f"ignore_channels: unknown channel {_show(c)} (known: {', '.join(CHANNELS)})")
        spec.ignore_channels.add(c)
    if "max_lag_ms" in data:
        v = data["max_lag_ms"]
        # bool is an int to Python; inf, nan and 1e400 (inf to tomllib) are floats that
        # int() refuses with OverflowError/ValueError.
        if (not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v)
                or not 0 <= v <= MAX_LAG_MS):
            fail(f"max_lag_ms: want a number from 0 to {MAX_LAG_MS}, got {_show(v)}")
        spec.max_lag_ns = int(v * 1e6)
    for c in (*CHANNELS, *PROTOCOLS):
        sect = data.get(c, {})
        if not isinstance(sect, dict):
            fail(f"[{c}] must be a table")
        r = spec.rules[c]
        for k, v in sect.items():
            if k in ("ignore", "mask"):
                if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
                    fail(f"{c}.{k}: want a list of regular expressions")
                for x in v:
                    getattr(r, k).append(_regex(x, f"{c}.{k}", fail))
            elif k == "ignore_kernel_lines" and c == "serial":
                if not isinstance(v, bool):
                    fail(f"{c}.{k}: want true or false")
                r.ignore_kernel_lines = v
            elif k == "reorder_window":
                if not _whole(v, MAX_REORDER_WINDOW):
                    fail(f"{c}.{k}: want a whole number of lines from 0 to {MAX_REORDER_WINDOW}, "
                         f"got {_show(v)}")
                r.reorder_window = v
            elif k == "byte_ranges" and c == "tcp":     # of a flow: [tcp] only
                if not isinstance(v, list):
                    fail(f"{c}.byte_ranges: want a list of {{flow, start, end}}, got {_show(v)}")
                for br in v:
                    if not (isinstance(br, dict) and set(br) == {"flow", "start", "end"}
                            and all(_whole(br[x], MAX_OFFSET) for x in br)
                            and br["start"] < br["end"]):
                        fail(f"{c}.byte_ranges: want {{flow, start, end}} with start < end, got {_show(br)}")
                    r.byte_ranges.append((br["flow"], br["start"], br["end"]))
            elif k == "relaxed_flow_order" and c == "tcp":
                if v is not True:
                    fail("tcp.relaxed_flow_order: flows are always compared one by one; only true is accepted")
            else:
                fail(f"unknown key {c}.{_show(k)}")


def _whole(v: object, most: int) -> bool:
    """v is an integer (not a bool) from 0 to `most`."""
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= most


def _show(v: object, nested: bool = False) -> str:
    """v for a one-line message, at most 80 characters: repr() of a 5,000-digit int raises
    ValueError, of 1,000 nested lists RecursionError, and a value may be megabytes long.
    A table or list is shown one level deep, as TOML writes it."""
    if isinstance(v, bool):
        text = "true" if v else "false"
    elif isinstance(v, int) and v.bit_length() > 64:
        text = f"an integer of {v.bit_length()} bits"
    elif isinstance(v, (list, dict)) and (nested or len(v) > 8):
        text = f"a {'list' if isinstance(v, list) else 'table'} of {len(v)}"
    elif isinstance(v, dict):
        text = "{" + ", ".join(f"{str(k)[:20]} = {_show(x, True)}" for k, x in v.items()) + "}"
    elif isinstance(v, list):
        text = "[" + ", ".join(_show(x, True) for x in v) + "]"
    else:
        text = repr(v)
    return text if len(text) <= 80 else text[:77] + "..."


def _regex(text: str, where: str, fail: Callable[[str], NoReturn]) -> re.Pattern[bytes]:
    """re.compile, with every way it refuses a pattern as a spec error: re.error, and
    the OverflowError (a{4294967296}) and RecursionError (1,000 nested groups) that
    sre_parse raises instead. A FutureWarning (`[[a]`, `[a--b]`: set syntax whose meaning
    a later Python changes) is refused too: the pattern is ambiguous, and the warning
    would be a multi-line message on stderr (an exception under -W error)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", FutureWarning)
            pattern = re.compile(text.encode())
    except (re.error, OverflowError, RecursionError, FutureWarning) as e:
        fail(f"{where}: bad regular expression {_show(text)}: {type(e).__name__}: {e}")
    parsed = sre_parse.parse(text.encode())
    if _nested_repeat(parsed) or _choice_in_repeat(parsed):
        fail(f"{where}: regular expression {_show(text)} repeats a repeat or a choice (like (a+)+ "
             f"or (a|ab)+): on a line the guest writes it can take exponential time; repeat once, "
             f"or make the inner repeat possessive (a++) or atomic ((?>...))")
    if _cost(parsed) * (1 if _anchored(parsed) else MAX_RULED_LINE) > RULE_BUDGET:
        fail(f"{where}: regular expression {_show(text)} can backtrack over a line in more than "
             f"quadratic time (three unbounded repeats, or two not anchored with ^); anchor it "
             f"with ^, or make repeats possessive (\\d++) or atomic ((?>...))")
    return pattern


_REPEATS = (sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT)
# A parsed pattern (re._parser's SubPattern): (opcode, argument) pairs whose argument's shape
# depends on the opcode (a (low, high, body) repeat, a branch's list of bodies, ...) and is
# read per opcode below; typing cannot tie the argument to the opcode, hence Any there.
Parsed = Sequence[tuple[object, Any]]


def _nested_repeat(items: Parsed, inside: bool = False) -> bool:
    """Whether a parsed pattern has a repeat (up to more than one) inside another: the
    shape whose backtracking is exponential in the length of the text it fails on (ReDoS).
    The specs' patterns run on every line of guest output, which the guest writes.
    Possessive repeats and atomic groups do not backtrack and are allowed."""
    for op, av in items:
        if op in _REPEATS:
            low, high, sub = av
            if high > 1 and (inside or _nested_repeat(sub, True)):
                return True
            if _nested_repeat(sub, inside):
                return True
        elif op in (sre_constants.POSSESSIVE_REPEAT, sre_constants.ATOMIC_GROUP):
            continue
        elif op == sre_constants.SUBPATTERN:
            if _nested_repeat(av[-1], inside):
                return True
        elif op == sre_constants.BRANCH:
            if any(_nested_repeat(b, inside) for b in av[1]):
                return True
        elif op in (sre_constants.ASSERT, sre_constants.ASSERT_NOT):
            if _nested_repeat(av[1], inside):
                return True
    return False


_CHOICES = (*_REPEATS, sre_constants.BRANCH, sre_constants.GROUPREF, sre_constants.GROUPREF_EXISTS)


def _choice_in_repeat(items: Parsed, inside: bool = False) -> bool:
    """Whether a repeat (up to more than once, backtracking) holds a choice: an alternation,
    an optional or variable repeat, a back reference. (a|a)+b and (a?a)+b backtrack
    exponentially on a line of a's as (a+)+b does (measured: (a|a)+b on 22 bytes, 0.5 s,
    doubling with each byte); _nested_repeat does not see them."""
    for op, av in items:
        if op in _REPEATS:
            low, high, sub = av
            if inside and low != high:
                return True
            if _choice_in_repeat(sub, inside or high > 1):
                return True
        elif op in (sre_constants.POSSESSIVE_REPEAT, sre_constants.ATOMIC_GROUP):
            continue
        elif op in (sre_constants.BRANCH, sre_constants.GROUPREF, sre_constants.GROUPREF_EXISTS):
            if inside:
                return True
            if op == sre_constants.BRANCH and any(_choice_in_repeat(b, inside) for b in av[1]):
                return True
            if op == sre_constants.GROUPREF_EXISTS and any(_choice_in_repeat(b, inside) for b in av[1:] if b):
                return True
        elif op == sre_constants.SUBPATTERN:
            if _choice_in_repeat(av[-1], inside):
                return True
        elif op in (sre_constants.ASSERT, sre_constants.ASSERT_NOT):
            if _choice_in_repeat(av[1], inside):
                return True
    return False


def _cost(items: Parsed) -> int:
    """A bound on the steps of one match attempt on a line of MAX_RULED_LINE bytes (with no
    repeat of a repeat or of a choice, refused before): the ways its choice points can go
    (_ways), and at least the line (an attempt may read it once)."""
    return max(_ways(items), MAX_RULED_LINE)


def _ways(items: Parsed) -> int:
    """The product, over a pattern's choice points, of how many ways each can go: a repeat
    as many as the lengths it can take (at most the line), an alternation its branches, a
    back reference the line. Possessive repeats and atomic groups give nothing back: they
    read on (their reading is the line _cost counts once), and count only the ways inside."""
    total = 1
    for op, av in items:
        if op in _REPEATS:
            low, high, sub = av
            total *= min(high - low + 1, MAX_RULED_LINE) * _ways(sub)
        elif op == sre_constants.BRANCH:
            total *= len(av[1]) * max(_ways(b) for b in av[1])
        elif op == sre_constants.GROUPREF_EXISTS:
            total *= 2 * max((_ways(b) for b in av[1:] if b), default=1)    # (?(1)|): both empty
        elif op == sre_constants.GROUPREF:
            total *= MAX_RULED_LINE
        elif op in (sre_constants.SUBPATTERN,):
            total *= _ways(av[-1])
        elif op in (sre_constants.ASSERT, sre_constants.ASSERT_NOT):
            total *= _ways(av[1])
        elif op == sre_constants.POSSESSIVE_REPEAT:
            total *= _ways_given_nothing_back(av[2])
        elif op == sre_constants.ATOMIC_GROUP:
            total *= _ways_given_nothing_back(av)
        total = min(total, RULE_BUDGET * MAX_RULED_LINE)     # enough to refuse; stays small
    return total


def _ways_given_nothing_back(body: Parsed) -> int:
    """The ways inside an atomic group or a possessive repeat's body: its own choice points
    still backtrack while it first matches, but not a repeat it ends with (nothing after
    it inside can fail, and nothing outside can take back from it): (?>a+) has one way."""
    if body and body[-1][0] in _REPEATS:
        body = body[:-1]
    return _ways(body)


_STARTS = (sre_constants.AT_BEGINNING, sre_constants.AT_BEGINNING_STRING)


def _anchored(items: Parsed) -> bool:
    """Whether a pattern can match only at the start of a line (^ or \\A first, also inside a
    group, a lookbehind or every branch): then a search makes one attempt, not one per byte."""
    if not items:
        return False
    op, av = items[0]
    if op == sre_constants.AT:
        return av in _STARTS
    if op == sre_constants.SUBPATTERN:
        return _anchored(av[-1])
    if op == sre_constants.ATOMIC_GROUP:
        return _anchored(av)
    if op == sre_constants.ASSERT:
        return _anchored(av[1])
    if op == sre_constants.BRANCH:
        return all(_anchored(b) for b in av[1])
    return False


# The embedded default guest's own spec, used when the user gives none.
DEMO_SPEC = artifacts.REPO / "agent" / "kvd.equiv.toml"
# Each guest OS's demo guest's spec, by the analysis kernel's OS.
DEMO_SPECS = {"linux": DEMO_SPEC, "freebsd": artifacts.REPO / "guest-kernel" / "freebsd" / "init" / "kvd-init.equiv.toml"}


def parse_toml(text: bytes, where: str) -> dict[str, object]:
    """A spec file's TOML table, or TandemError. tomllib raises ValueError besides its
    TOMLDecodeError (an integer of more than 4,300 digits) and RecursionError on about
    1,000 nested arrays or inline tables."""
    try:
        return tomllib.loads(text.decode())
    except UnicodeDecodeError as e:
        raise TandemError(f"{where}: not a valid TOML equivalence spec: not UTF-8 at byte {e.start}") from None
    except RecursionError:
        raise TandemError(f"{where}: not a valid TOML equivalence spec: nested too deeply") from None
    except ValueError as e:     # tomllib.TOMLDecodeError is a ValueError
        raise TandemError(f"{where}: not a valid TOML equivalence spec: {e}") from None


def check(data: Mapping[str, object], where: str = "<spec>") -> Spec:
    """A parsed spec table checked on its own (no built-in defaults): a Spec or TandemError."""
    spec = Spec()
    _merge(spec, data, where)
    return spec


def load(analysis: catalog.Analysis, path: str | Path | None = None, users_guest: bool = False) -> Spec:
    """The built-in defaults for this analysis, plus the user's spec file if given
    (else, for a demo guest, its service's: DEMO_SPECS by the analysis's OS).

    users_guest: a recording of the user's own VM, whose console carries its boot's
    chatter (systemd's, its services'): scanned for reports, compared only when the
    user's spec asks for it with a [serial] table."""
    spec = Spec()
    for key, rules in (("*", EVERY_ANALYSIS), (analysis.name, analysis.equivalence)):
        if rules:
            _merge(spec, rules, f"built-in spec {key!r}")
            spec.sources.append(f"built-in:{key}")
    demo_spec = DEMO_SPECS.get(analysis.os, DEMO_SPEC)
    if path is None and demo_spec.is_file() and not users_guest:
        path = demo_spec
    data: dict[str, object] = {}
    if path is not None:
        p = Path(path)
        try:
            text = p.read_bytes()
        except FileNotFoundError:
            raise TandemError(f"{p}: equivalence spec not found") from None
        except OSError as e:
            raise TandemError(f"{p}: cannot read the equivalence spec: {e.strerror}") from None
        data = parse_toml(text, str(p))
        _merge(spec, data, str(p))
        spec.sources.append(str(p))
    if users_guest and "serial" not in data:
        spec.ignore_channels.add("serial")
        spec.sources.append("built-in:your VM's console is scanned for reports, not compared")
    return spec

"""What an OS parser declares about one kind of report."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, NamedTuple


# An empty match with nine empty groups: what matched() gives for no match.
_NOTHING = next(re.finditer("()" * 9, ""))


def matched(m: re.Match[str] | None) -> re.Match[str]:
    """`m`, a match a describer knows is there (its kind's header in the report's first line:
    the Scanner starts a report only on a line its start pattern matches; a line an earlier
    search of the same pattern found); an empty match, its groups "", if it is not, so that
    a describer called on other text still returns instead of raising."""
    return m if m is not None else _NOTHING


class Description(NamedTuple):
    type: str
    title: str
    frames: list[str]           # guilty frame first
    corrupted: str | None       # why the report looks damaged, or None


@dataclass(frozen=True)
class Kind:
    name: str
    start: re.Pattern                       # searched in a prefix-stripped line
    describe: Callable[..., Description]    # (lines) or, with_context, (lines, ctx)
    end: re.Pattern | None = None           # the report's own last line (e.g. "=====")
    task_end: bool = False                  # ends with the "</TASK>" closing its last stack
    tail: bool = False                      # may be the aftermath of the report before it
    inside: bool = False                    # inside a report, a part of it: starts none there
    absorbs: frozenset[str] = field(default_factory=frozenset)  # kinds that continue this one
    continues: Callable[[str], bool] | None = None  # single-message kinds: is this line still ours?
    # Only lines of the first line's printk context are the report's (a timestamped report
    # leaves out lines without one and the reverse), but for other CPUs' backtraces after
    # "Sending NMI from CPU": syzkaller's rule. Without it, only printk caller ids filter.
    strict_context: bool = False
    drop_line: Callable[[str], bool] | None = None  # a prefixed line that is no part of a report
    # Why a report is corrupted when its title lacks lines: at its end marker, such a
    # report's title reads on to the next report, as syzkaller's does (its text ends there).
    reread: frozenset[str] = frozenset()
    with_context: bool = False  # describe(lines, ctx): the printk context of the report's lines


class Table(NamedTuple):
    """One OS module's report kinds, as report/dialects.py combines them: texts one of
    which every line starting one of its kinds holds, and the search that says which kind
    a line starts (None: none of these)."""
    tokens: tuple[str, ...]
    start: Callable[[str], Kind | None]

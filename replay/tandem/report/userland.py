"""Sanitizer reports from a guest userland process: ASan, LeakSanitizer, UBSan."""
from __future__ import annotations

import re

from .frames import sanitize_title, user_frame, useful
from .kind import Description, Kind, Table, matched

# Runtime and libc frames: the allocator, interceptors and process start-up.
_SKIP = re.compile(r"^(?:malloc|calloc|realloc|free|operator new|operator delete|strdup|strndup|"
                   r"__libc_start|_start$|__interceptor_|__asan_|__ubsan_|__sanitizer)")


def _stack(lines: list[str], after: re.Pattern | None = None) -> list[str]:
    """Useful frames of the first stack (after a line matching `after`)."""
    i = 0
    if after is not None:
        i = next((i + 1 for i, t in enumerate(lines) if after.search(t)), len(lines))
    out, seen = [], False
    for text in lines[i:]:
        name = user_frame(text)
        if name:
            out.append(name)
            seen = True
        elif seen:
            break
    return useful(out, _SKIP)


def _named(type_: str, title: str, frames: list[str], where: str | None = None) -> Description:
    if frames:
        return Description(type_, sanitize_title(f"{title} in {frames[0]}"), frames, None)
    if where:
        return Description(type_, sanitize_title(f"{title} in {where}"), [], None)
    return Description(type_, f"{title} in corrupted", [], "no frame to name the report by")


_ASAN = re.compile(r"AddressSanitizer: (?:attempting )?([\w-]+)")
_ACCESS = re.compile(r"^(READ|WRITE) of size|caused by a (READ|WRITE) memory access")


def asan(lines: list[str]) -> Description:
    bug = matched(_ASAN.search(lines[0])).group(1)
    access = next((m for t in lines if (m := _ACCESS.search(t))), None)
    rw = (access.group(1) or access.group(2)).capitalize() if access else ""
    return _named("ASAN", f"ASAN: {bug} {rw}".strip(), _stack(lines))


def leak(lines: list[str]) -> Description:
    return _named("LSAN", "LSAN: memory leak", _stack(lines, re.compile(r"^(?:Direct|Indirect) leak of")))


_UBSAN = re.compile(r"^(?:.*/)?([^/\s:]+):\d+:\d+: runtime error: (.*)")
_UB_KINDS = [  # message -> kind, in the words of the kernel's UBSAN titles
    (r"out of bounds for type", "array-index-out-of-bounds"),
    (r"shift exponent|left shift of|right shift of", "shift-out-of-bounds"),
    (r"signed integer overflow|negation of", "signed-integer-overflow"),
    (r"unsigned integer overflow", "unsigned-integer-overflow"),
    (r"null pointer", "null-ptr-deref"),
    (r"misaligned address", "misaligned-access"),
    (r"insufficient space for an object", "object-size-mismatch"),
    (r"division by zero", "division-by-zero"),
    (r"not a valid value for type", "invalid-load"),
    (r"unreachable program point", "unreachable"),
    (r"pointer index expression|applying .*offset to", "pointer-overflow"),
    (r"variable length array bound", "vla-bound"),
]


def ubsan(lines: list[str]) -> Description:
    m = matched(_UBSAN.search(lines[0]))
    kind = next((k for pattern, k in _UB_KINDS if re.search(pattern, m.group(2))), "undefined-behaviour")
    return _named("UBSAN_USER", f"UBSAN: {kind}", _stack(lines), where=m.group(1))


# Lines that still belong to a one-line UBSan error: its stack, the pointer note and dump.
_UB_MORE = re.compile(r"^\s+#\d+ 0x|^0x[0-9a-f]+: note: |^ [0-9a-f]{2} |^\s+\^|^SUMMARY: UndefinedBehaviorSanitizer")

KINDS = [
    # Only a header naming the bug starts a report: asan() titles it by that name.
    Kind("asan", re.compile(r"==\d+==ERROR: AddressSanitizer: (?:attempting )?[\w-]"), asan,
         end=re.compile(r"^==\d+==ABORTING")),
    Kind("lsan", re.compile(r"==\d+==ERROR: LeakSanitizer: "), leak, end=re.compile(r"^SUMMARY: ")),
    Kind("ubsan", _UBSAN, ubsan, continues=lambda text: bool(_UB_MORE.search(text))),
]
# Text every line that starts a report holds (the scanner skips lines with none of it).
TOKENS = ("==ERROR: AddressSanitizer: ", "==ERROR: LeakSanitizer: ", ": runtime error: ")


def start(text: str) -> Kind | None:
    for kind in KINDS:
        if kind.start.search(text):
            return kind
    return None


USERLAND = Table(TOKENS, start)

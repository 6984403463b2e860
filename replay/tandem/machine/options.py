"""QEMU options built from typed values, never by pasting text into an option string.

A value that reaches QEMU's command line may come from outside: a bundle's manifest (its
MAC, stop time, RTC base, lookahead, disk format), a libvirt domain's definition (its NIC
model and MAC), a path the user chose (a bundle named `a,romfile=x.tdm`). In QEMU's
`key=value,key=value` syntax a comma in a value starts a new key: a manifest `mac` of
`52:54:00:12:34:56,romfile=/etc/shadow` would be a second `romfile=` on the NIC.
So every option is built here from a dict of typed values:

- `-device`, `-object` and `-netdev` in QEMU's JSON form (QEMU 10 parses an argument that
  starts with `{` as JSON, with the types of the QAPI schema or the QOM property): a value
  is one JSON string or number whatever it holds, so it cannot add a key;
- the options that have no JSON form in QEMU 10 (`-chardev`, `-icount`, `-drive`, `-rtc`)
  as `key=value` lists whose values have every comma doubled, QEMU's own escape
  (`qemu_opts_parse` reads `,,` as one comma inside a value);

and the values with a shape (a MAC, an id, a device model) are checked for it before they
are used. The composition of the whole command line per mode is qemu.vm.qemu_argv; libvirt's
domain XML passes these same strings through (libvirt.domain.domain_xml).
"""
from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Union

from ..errors import TandemError

# What a QEMU option's property may hold: JSON's values (QEMU's QAPI types) but null.
Value = Union[str, int, bool, list["Value"], dict[str, "Value"]]

MAC = re.compile(r"[0-9a-fA-F]{2}(?::[0-9a-fA-F]{2}){5}")
_ID = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,63}")     # QEMU's id_wellformed, bounded
_KEY = re.compile(r"[a-z][a-z0-9_.-]*")
RTC_BASE = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}")   # -rtc base=, a time of day
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")    # -uuid (SMBIOS)

# The NIC models tandem's QEMU build has (qemu-patches/0001 is its device set), keyed by
# libvirt's <model type>. A domain's model outside this table is refused by name.
NIC_MODELS = {"virtio": "virtio-net-pci", "e1000": "e1000", "e1000e": "e1000e",
              "rtl8139": "rtl8139", "ne2k_pci": "ne2k_pci", "pcnet": "pcnet"}
NIC_DEVICES = frozenset(NIC_MODELS.values())
# Properties only virtio-net has: tx=timer (a frame leaves at the same VM time in every
# run) and ioeventfd=off (a queue kick taken in the vCPU thread); see vm.qemu_argv.
VIRTIO_NET = "virtio-net-pci"
# The analysis feed's lookahead (qemu-patches/0027): each output of the guest pulls the
# horizon in by this much VM time, so the replayer answers within it, as the network did.
LOOKAHEAD_NS = 1_000_000


class OptionError(TandemError):
    """A value that cannot become part of a QEMU option: it names the value and why."""


def _check_value(where: str, value: object) -> None:
    if isinstance(value, bool | str):
        if isinstance(value, str) and "\0" in value:
            raise OptionError(f"{where}: a NUL byte cannot go on QEMU's command line")
        return
    if isinstance(value, int):
        if not -(1 << 63) <= value < (1 << 64):
            raise OptionError(f"{where}: {value} does not fit QEMU's 64-bit integers")
        return
    if isinstance(value, list):
        for i, v in enumerate(value):
            _check_value(f"{where}[{i}]", v)
        return
    if isinstance(value, dict):
        for k, v in value.items():
            _check_value(f"{where}.{k}", v)
        return
    raise OptionError(f"{where}: {type(value).__name__} {value!r} is not a QEMU option value")


def json_option(props: Mapping[str, Value | None]) -> str:
    """One `-device`/`-object`/`-netdev` argument in QEMU's JSON form (keys in the given
    order). None-valued keys are left out: QEMU's default applies."""
    given = {k: v for k, v in props.items() if v is not None}
    for key, value in given.items():
        if not isinstance(key, str) or not _KEY.fullmatch(key):
            raise OptionError(f"QEMU option key {key!r}: not a property name")
        _check_value(key, value)
    return json.dumps(given, separators=(",", ":"), ensure_ascii=True)


def escape(value: str) -> str:
    """A value for QEMU's key=value syntax: commas doubled, so it stays one value."""
    return value.replace(",", ",,")


def keyval_option(head: str | None, props: Mapping[str, str | int | bool | None]) -> str:
    """`head,key=value,...` for the options with no JSON form (-chardev, -icount, -drive,
    -rtc). Booleans become on/off, None-valued keys are left out, every value is escaped."""
    parts = [] if head is None else [escape(head)]
    for key, value in props.items():
        if value is None:
            continue
        if not _KEY.fullmatch(key):
            raise OptionError(f"QEMU option key {key!r}: not a property name")
        _check_value(key, value)
        text = ("on" if value else "off") if isinstance(value, bool) else str(value)
        parts.append(f"{key}={escape(text)}")
    return ",".join(parts)


def check_id(value: str, what: str = "id") -> str:
    if not isinstance(value, str) or not _ID.fullmatch(value):
        raise OptionError(f"{what} {value!r}: not a QEMU id (a letter, then letters, digits, '_.-')")
    return value


def check_mac(value: str | None, what: str = "MAC") -> str | None:
    if value is not None and not (isinstance(value, str) and MAC.fullmatch(value)):
        raise OptionError(f"{what} {value!r}: not a MAC address (52:54:00:12:34:56)")
    return value

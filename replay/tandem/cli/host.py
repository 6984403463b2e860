"""`tandem wireshark` and `tandem doctor`: the host side of the tools around tandem."""
from __future__ import annotations

from pathlib import Path


def add_parsers(sub) -> None:
    r = sub.add_parser("wireshark", help="install the device log's Wireshark dissector (serial, block, "
                       "rng records, VM time, instruction count), or print its path")
    r.add_argument("action", choices=["install", "path"],
                   help="install: copy it into Wireshark's personal Lua plugins folder; path: print "
                        "where it is (for tshark -X lua_script:PATH)")
    r.add_argument("--dir", help="install into this folder instead")
    r.set_defaults(func=cmd_wireshark)

    r = sub.add_parser("doctor", help="check the host, the cache and its builds; one line a check, "
                       "with the fix (also ./tandem doctor, which needs no venv)")
    r.add_argument("--no-kvm-boot", action="store_true", help="do not boot a guest to check /dev/kvm")
    r.set_defaults(func=cmd_doctor)


def cmd_wireshark(args) -> int:
    from .. import wireshark
    if args.action == "path":
        print(wireshark.DISSECTOR)
        return 0
    target = wireshark.install(Path(args.dir) if args.dir else None)
    print(f"installed {target}; Wireshark and tshark load it at start "
          f"(try: tshark -r BUNDLE/devices.pcapng -Y 'tandem.block.offset > 0x100000')")
    return 0


def cmd_doctor(args) -> int:
    from ..setup import doctor
    return doctor.main(["--no-kvm-boot"] if args.no_kvm_boot else [])

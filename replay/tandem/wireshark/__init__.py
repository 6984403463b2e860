"""`tandem wireshark`: the Lua dissector for the device log, and where Wireshark loads it.

Wireshark loads every `.lua` file in its personal Lua plugins folder at start; `tshark -G
folders` names that folder (XDG_CONFIG_HOME and WIRESHARK_CONFIG_DIR move it), so it is
asked, not guessed. Without tshark the folder is Wireshark's default on Linux.
"""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
from pathlib import Path

from ..errors import TandemError

DISSECTOR = Path(__file__).with_name("tandem.lua")
log = logging.getLogger(__name__)


def plugins_dir() -> Path:
    """Wireshark's personal Lua plugins folder for this user."""
    tshark = shutil.which("tshark")
    if tshark:
        r = subprocess.run([tshark, "-G", "folders"], capture_output=True, text=True, timeout=60)
        for line in r.stdout.splitlines():
            name, _, path = line.partition(":")
            if name.strip() == "Personal Lua Plugins" and path.strip():
                return Path(path.strip())
        log.debug("tshark -G folders named no personal Lua plugins folder: %s", r.stdout)
    return Path(os.environ.get("HOME", "~")).expanduser() / ".local/lib/wireshark/plugins"


def install(dest: Path | None = None) -> Path:
    """Copy the dissector into `dest` (default: the personal plugins folder); its path."""
    dest = plugins_dir() if dest is None else dest
    try:
        dest.mkdir(parents=True, exist_ok=True)
        target = dest / DISSECTOR.name
        shutil.copyfile(DISSECTOR, target)
    except OSError as e:
        raise TandemError(f"{dest}: cannot install the dissector there ({e.strerror})") from None
    return target

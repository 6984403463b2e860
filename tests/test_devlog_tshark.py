"""The device log is standard pcapng: tshark opens it and counts the same frames."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from tandem import bundle


@pytest.fixture(scope="module")
def tshark():
    path = shutil.which("tshark")
    if path is None:  # installed by scripts/host-deps.sh; its absence is a setup bug
        pytest.fail("tshark not installed (scripts/host-deps.sh installs it)")
    return path


def test_tshark_reads_devlog_and_counts_match(demo_bundle, tshark):
    m = bundle.load_manifest(demo_bundle)
    want = sum(c["in"]["events"] + c["out"]["events"] for c in m["channels"].values())
    r = subprocess.run([tshark, "-r", str(demo_bundle / bundle.DEVLOG), "-T", "fields",
                        "-e", "frame.interface_name", "-e", "frame.len"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    rows = [l.split("\t") for l in r.stdout.splitlines() if l]
    assert len(rows) == want
    names = {row[0] for row in rows}
    assert {"net0", "serial0", "disk0", "rng0"} <= names


def test_tshark_decodes_guest_tcp(demo_bundle, tshark):
    r = subprocess.run([tshark, "-r", str(demo_bundle / bundle.DEVLOG), "-Y", "tcp.port == 7000",
                        "-T", "fields", "-e", "tcp.payload"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    payload = bytes.fromhex("".join(l.replace(":", "") for l in r.stdout.split()))
    assert b"SET key1 " in payload and b"OK\n" in payload

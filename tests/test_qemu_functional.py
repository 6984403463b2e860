"""QEMU's own functional tests (tests/functional of the source tandem's QEMU is built from),
run against tandem's build as QEMU's `make check-functional` runs them: one test file a
process, TAP on stdout, the binary in QEMU_TEST_QEMU_BINARY.

- test_x86_64_reverse_debug: QEMU's reverse-debugging test (record with rrsnapshot=init,
  replay under the gdbstub: stepi, reverse-stepi, reverse-continue). Upstream marks it flaky
  on x86_64 (skipped unless QEMU_TEST_FLAKY_TESTS is set); here it runs, and it fails on
  the series before the replay log could seek (qemu-patches/0012's snapshot loads).
- test_x86_64_tandem_record, the series' own: a guest that uses every channel (a boot
  sector that loads the rest of itself and drives legacy virtio-rng and virtio-net by
  polling: tandem_guest.py) recorded and replayed; the segmented log's segments, the device
  log's interfaces and records (serial, block, net both ways, rng, state checkpoints), the
  replay's device log equal to the recording's, a torn log replayed with rrpartial=on and
  refused without, a replay following a growing log with rrfollow=on.
- test_x86_64_tandem_feed, the series' own: the feed (the test as its controller: entropy,
  a serial line and a frame delivered at chosen VM times, outputs stamped with the VM time,
  the VM held at the horizon; the recorded run replayed without the controller to the same
  device log) and filter-gate (frames held, released, dropped; inputs held and passed; the
  detach overflow; the counters at shutdown).
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tandem import artifacts


def run_functional(test: str, tmp_path: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """QEMU's functional test file `test` (a name under tests/functional) against tandem's
    QEMU; its TAP output in the result."""
    q = artifacts.qemu()
    src = Path(q["source"])
    build_root = tmp_path / "build"          # what qemu_test takes for a build dir: qemu-img, port locks
    (build_root / "tests" / "functional").mkdir(parents=True)
    (build_root / "qemu-img").symlink_to(q["img"])
    env = {**os.environ,
           "QEMU_TEST_QEMU_BINARY": q["binary"], "QEMU_TEST_QEMU_IMG": q["img"], "QEMU_BUILD_ROOT": str(build_root),
           "QEMU_TEST_FLAKY_TESTS": "1", "PYTHONPATH": f"{src / 'python'}:{src / 'tests' / 'functional'}"}
    return subprocess.run([sys.executable, str(src / "tests" / "functional" / f"{test}.py")], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=timeout)


def tap_results(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith(("ok ", "not ok "))]


@pytest.mark.parametrize("test", ["test_x86_64_reverse_debug", "test_x86_64_tandem_record",
                                  "test_x86_64_tandem_feed"])
def test_qemu_functional(test, tmp_path):
    r = run_functional(test, tmp_path)
    results = tap_results(r.stdout)
    assert results, f"{test}: no TAP result (exit {r.returncode}): {r.stdout[-2000:]} {r.stderr[-2000:]}"
    failed = [x for x in results if x.startswith("not ok") or "# SKIP" in x]
    assert r.returncode == 0 and not failed, f"{test}: {results}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"


def test_the_functional_tests_guest_is_its_source_assembled(tmp_path):
    """tandem_guest.py carries the guest as bytes (QEMU's tests need no assembler); they
    are tandem_guest.S assembled as its header says, so the source is the guest."""
    import importlib.util
    functional = Path(artifacts.qemu()["source"]) / "tests" / "functional"
    spec = importlib.util.spec_from_file_location("tandem_guest", functional / "tandem_guest.py")
    guest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(guest)
    subprocess.run(["as", "--32", str(functional / "tandem_guest.S"), "-o", str(tmp_path / "g.o")], check=True)
    subprocess.run(["ld", "-m", "elf_i386", "-Ttext", "0x7c00", "--oformat", "binary", str(tmp_path / "g.o"),
                    "-o", str(tmp_path / "g.bin")], check=True)
    assert (tmp_path / "g.bin").read_bytes() == guest.GUEST

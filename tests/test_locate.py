"""A failed exact replay located (`tandem replay --locate`, exact/locate.py), on recordings
of the demo guest on tandem's native kernel (its vmlinux names the code) altered on
purpose in copies: one input byte changed in the replay log (the replay departs exactly
there), one register changed in a state checkpoint the recording logged (the departure
is bounded by the checkpoints)."""
from __future__ import annotations

import dataclasses
import json
import shutil
import struct
from pathlib import Path

import pytest

from helpers import assert_one_line_error, record_demo, run_cli
from helpers.tamper import alter_frame
from tandem.exact.locate import locate
from tandem.explain.native import describe_pc
from tandem.formats import bundle, cpustate, pcapng


@pytest.fixture(scope="module")
def native_bundle(built, tmp_path_factory) -> Path:
    return record_demo(tmp_path_factory.mktemp("rec") / "native.tdm", rounds=4, flavor="native")


@pytest.fixture(scope="module")
def smp_bundle(built, tmp_path_factory) -> Path:
    return record_demo(tmp_path_factory.mktemp("smp") / "smp2.tdm", rounds=3, vcpus=2)


def copy(src: Path, tmp_path: Path, name: str = "altered.tdm") -> Path:
    dst = tmp_path / name
    shutil.copytree(src, dst)
    return dst


def test_an_altered_input_is_located_to_its_instruction(native_bundle, tmp_path):
    d = copy(native_bundle, tmp_path)
    log = pcapng.read_devlog(d / bundle.DEVLOG)
    middle = log.events[len(log.events) // 2].vm_ns
    altered = alter_frame(d, after_ns=middle)
    r = run_cli("replay", str(d), "--locate", "--json", timeout=900)
    assert r.returncode == 1, r.stderr
    dep = json.loads(r.stdout.splitlines()[0])
    assert dep["how"] == "input" and dep["window"] == 0
    assert dep["icount"] == altered.icount and dep["vm_ns"] == altered.vm_ns
    assert f"event #{altered.seq} on net0" in dep["first_difference"]
    assert dep["pc"] == dep["registers"]["rip"]["replayed"]
    assert "+0x" in dep["symbol"], dep["symbol"]           # named in the native's vmlinux
    assert dep["led_to"] and "net0" in dep["led_to"]
    assert "departs from its recording exactly at instruction" in r.stdout + r.stderr


def flip_rax(d: Path, k: int, cpu: int = 0) -> pcapng.Event:
    """Change one byte of vCPU `cpu`'s rax in the recorded checkpoint k, in place, and the
    manifest's hash of the device log with it."""
    log = pcapng.read_devlog(d / bundle.DEVLOG)
    cp = log.states[k]
    assert cpustate.register_names(log, cp)[0] == "rax"
    off = 0     # the vCPU's block in the record: its index and length (8), then its registers
    while (head := struct.unpack_from("<II", cp.data, off))[0] != cpu:
        off += 8 + head[1]
    # EPB head (28), tandem's record header (16), the vCPU's index and length (8), rax's length byte
    at = cp.file_offset + 28 + 16 + off + 8 + 1
    with open(d / bundle.DEVLOG, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0x10]))
    m = bundle.load_manifest(d)
    bundle.write_manifest(d, dataclasses.replace(m, files={**m.files, bundle.DEVLOG: bundle.file_entry(d / bundle.DEVLOG)}))
    return cp


def test_a_checkpoint_that_differs_bounds_the_departure(native_bundle, tmp_path):
    d = copy(native_bundle, tmp_path)
    log = pcapng.read_devlog(d / bundle.DEVLOG)
    assert len(log.states) > 10, "the recording has state checkpoints"
    k = len(log.states) // 2
    cp = flip_rax(d, k)
    dep = locate(d, name=lambda pc: describe_pc(d, pc))
    assert dep is not None and dep.how == "state" and dep.mismatch.index == k
    assert (dep.icount, dep.vm_ns) == (cp.icount, cp.vm_ns)
    assert (dep.agreed_icount, dep.agreed_vm_ns) == (log.states[k - 1].icount, log.states[k - 1].vm_ns)
    name, recorded, replayed = dep.registers[0]
    assert name == "rax" and recorded is not None and recorded ^ replayed == 0x10
    assert dep.pc == cpustate.decode(log, k).pc() and dep.symbol and "+0x" in dep.symbol
    assert "rax recorded" in dep.mismatch.what


def test_on_two_vcpus_the_departing_vcpu_is_shown_first_and_the_others_after(smp_bundle, tmp_path):
    """The demo guest on 2 vCPUs (exact, qemu-patches/0038): a register of vCPU 1 changed in
    a checkpoint is located to vCPU 1, its registers shown, vCPU 0's pc after it; an input
    changed is located exactly, with both vCPUs' pcs where the replay stood."""
    d = copy(smp_bundle, tmp_path, "state.tdm")
    log = pcapng.read_devlog(d / bundle.DEVLOG)
    k = len(log.states) // 2
    flip_rax(d, k, cpu=1)
    dep = locate(d)
    assert dep is not None and dep.how == "state" and dep.mismatch.index == k
    assert dep.vcpu == 1 and [v.index for v in dep.vcpus] == [1, 0], dep.vcpus
    name, recorded, replayed = dep.registers[0]
    assert name == "rax" and recorded is not None and recorded ^ replayed == 0x10
    assert all(a == b for _, a, b in dep.vcpus[1].registers)
    assert (dep.pc, dep.vcpus[1].pc) == (cpustate.decode(log, k).pc(1), cpustate.decode(log, k).pc(0))

    d = copy(smp_bundle, tmp_path, "input.tdm")
    altered = alter_frame(d, after_ns=log.events[len(log.events) // 2].vm_ns)
    r = run_cli("replay", str(d), "--locate", "--json", timeout=900)
    assert r.returncode == 1, r.stderr
    dep = json.loads(r.stdout.splitlines()[0])
    assert dep["how"] == "input" and dep["icount"] == altered.icount, dep
    assert dep["vcpu"] is None      # a frame in is delivered from the main loop: no vCPU's access
    assert [v["index"] for v in dep["vcpus"]] == [0, 1] and all(v["pc"] for v in dep["vcpus"]), dep["vcpus"]
    assert dep["pc"] == dep["registers"]["rip"]["replayed"] == dep["vcpus"][0]["pc"]
    assert f"vCPU 1: pc {dep['vcpus'][1]['pc']:#x}" in r.stdout + r.stderr, r.stderr


def test_a_replay_that_matches_has_nothing_to_locate(native_bundle):
    r = run_cli("replay", str(native_bundle), "--locate", timeout=900)
    assert r.returncode == 0, r.stderr
    assert "nothing to locate" in r.stderr


@pytest.mark.parametrize("args, says", [
    (["--vmlinux", "/etc/hostname"], "--vmlinux: only with --locate"),
    (["--locate", "--partial"], "--locate: a finished recording only"),
    (["--locate", "--vmlinux", "/nonexistent/vmlinux"], "--vmlinux /nonexistent/vmlinux: not a file"),
])
def test_bad_locate_options_are_one_line_errors(native_bundle, args, says):
    assert_one_line_error(run_cli("replay", str(native_bundle), *args), says)

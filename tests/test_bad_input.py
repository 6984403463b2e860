"""Damaged, truncated and mismatched bundles: one clear line, non-zero exit, never a
traceback; --partial replays the intact prefix."""
from __future__ import annotations

import json
import shutil

import pytest

from helpers import assert_one_line_error, run_cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tandem.formats import bundle, rrstream


def edit_manifest(path, fn):
    m = json.loads((path / bundle.MANIFEST).read_text())
    fn(m)
    (path / bundle.MANIFEST).write_text(json.dumps(m))


def cut(path, size):
    with open(path, "r+b") as f:
        f.truncate(size)


def test_not_a_bundle(tmp_path):
    assert_one_line_error(run_cli("replay", str(tmp_path / "nope.tdm")), "nope.tdm", "no such")


def test_unparseable_manifest(bundle_copy):
    (bundle_copy / bundle.MANIFEST).write_text("{not json")
    assert_one_line_error(run_cli("replay", str(bundle_copy)), "manifest.json", "not valid JSON")


@pytest.mark.parametrize("field", ["inputs.kernel.path", "files", "stop.reason"])
def test_a_string_that_cannot_be_encoded_is_one_line_from_inspect_and_replay(bundle_copy, field):
    """A lone surrogate escape, which JSON decodes and nothing can write back: a file name
    (a key of files), an input path, text passed on (the unit tests cover every field)."""
    def put(m):
        if field == "files":
            m["files"]["devices\ud800"] = m["files"].pop(bundle.DEVLOG)
        elif field == "inputs.kernel.path":
            m["inputs"]["kernel"]["path"] += "\udfff"
        else:
            m["stop"]["reason"] = "\ud800"
    edit_manifest(bundle_copy, put)
    for command in ("inspect", "replay"):
        r = run_cli(command, str(bundle_copy))
        assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
        assert field in r.stdout + r.stderr and "lone surrogate" in r.stdout + r.stderr


def test_truncated_stream(bundle_copy):
    s = bundle_copy / bundle.STREAM
    cut(s, s.stat().st_size - 100)
    assert_one_line_error(run_cli("replay", str(bundle_copy)), "replay.tdrs", "truncated")


def test_flipped_byte_in_stream(bundle_copy):
    s = bundle_copy / bundle.STREAM
    data = bytearray(s.read_bytes())
    data[len(data) // 2] ^= 0x40
    s.write_bytes(data)
    assert_one_line_error(run_cli("replay", str(bundle_copy)), "replay.tdrs", "checksum")


def test_flipped_byte_in_devlog_is_caught_by_inspect(bundle_copy):
    d = bundle_copy / bundle.DEVLOG
    data = bytearray(d.read_bytes())
    data[100] ^= 0xFF
    d.write_bytes(data)
    r = run_cli("inspect", str(bundle_copy))
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "devices.pcapng" in r.stdout + r.stderr


def test_wrong_qemu_build(bundle_copy):
    edit_manifest(bundle_copy, lambda m: m["qemu"].update(build_id="0" * 64))
    assert_one_line_error(run_cli("replay", str(bundle_copy)), "recorded with QEMU build 000000000000")


def test_missing_kernel(bundle_copy, tmp_path):
    edit_manifest(bundle_copy, lambda m: m["inputs"]["kernel"].update(path=str(tmp_path / "gone/bzImage")))
    assert_one_line_error(run_cli("replay", str(bundle_copy)), "kernel", "gone/bzImage", "not found")


def test_bad_flag():
    r = run_cli("record", "x.tdm", "--duration", "soon")
    assert r.returncode == 2 and "not a duration: 'soon'" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("gate", [["--release", "agreed"], ["--overflow", "block"]])
def test_yielding_with_a_gate_the_native_waits_on_is_one_line_before_anything_starts(tmp_path, gate):
    r = run_cli("shadow", str(tmp_path / "x.tdm"), "--analysis", "kasan", "--analysis-priority", "yield", *gate)
    assert_one_line_error(r, "--analysis-priority yield", gate[0])
    assert not (tmp_path / "x.tdm").exists()


def test_refuses_to_overwrite_a_recording(demo_bundle):
    assert_one_line_error(run_cli("record", str(demo_bundle)), str(demo_bundle), "not empty")


def test_partial_replays_intact_prefix_of_a_crashed_recording(bundle_copy):
    """A recording cut mid-segment, as a crash leaves it: --partial verifies what is intact."""
    s = bundle_copy / bundle.STREAM
    info = rrstream.scan(s)
    mid = info.segments[len(info.segments) // 2]
    cut(s, mid.offset + 20)            # tear the middle segment's header
    edit_manifest(bundle_copy, lambda m: m.update(state="interrupted"))
    assert_one_line_error(run_cli("replay", str(bundle_copy)), "interrupted", "--partial")
    r = run_cli("replay", "--partial", str(bundle_copy))
    assert r.returncode == 0, r.stderr
    assert "VERIFIED: intact prefix" in r.stderr


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(frac=st.floats(0.0, 1.0))
def test_inspect_cut_at_any_offset_never_crashes(demo_bundle, tmp_path_factory, frac):
    d = tmp_path_factory.mktemp("cut") / "b.tdm"
    shutil.copytree(demo_bundle, d)
    for name in (bundle.STREAM, bundle.DEVLOG):
        p = d / name
        cut(p, int(p.stat().st_size * frac))
    r = run_cli("inspect", str(d))
    assert "Traceback" not in r.stderr + r.stdout
    assert r.returncode in (0, 1)


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(frac=st.floats(0.05, 0.95))
def test_partial_replay_cut_at_random_offset(demo_bundle, tmp_path_factory, frac):
    """Each example boots a replay: either the prefix verifies or a one-line error."""
    d = tmp_path_factory.mktemp("cutrep") / "b.tdm"
    shutil.copytree(demo_bundle, d)
    s = d / bundle.STREAM
    cut(s, int(s.stat().st_size * frac))
    r = run_cli("replay", "--partial", str(d))
    assert "Traceback" not in r.stderr
    if r.returncode != 0:
        assert_one_line_error(r)
    else:
        assert "VERIFIED: intact prefix" in r.stderr


def test_kernel_qemu_cannot_boot(tmp_path):
    """QEMU refuses the kernel at start: one line with QEMU's reason, bundle marked interrupted."""
    junk = tmp_path / "not-a-kernel"
    junk.write_bytes(b"\0" * 4096)
    path = tmp_path / "bad.tdm"
    assert_one_line_error(run_cli("record", str(path), "--kernel-image", str(junk)), "QEMU exited at start")
    assert bundle.load_manifest(path).state == "interrupted"

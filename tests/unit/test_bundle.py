import fcntl
import json
import os

import pytest

from tandem.formats import bundle
from tandem.errors import BundleError
from tandem.cli.inspect_bundle import inspect, render
from helpers.bundles import make_bundle


def test_round_trip(tmp_path):
    d, m = make_bundle(tmp_path)
    assert bundle.load_manifest(d).to_json() == m
    assert bundle.check_bundle(d, qemu_build_id="a" * 64) == bundle.Manifest.from_json(m)
    assert not (d / "manifest.json.tmp").exists()
    assert bundle.verify_files(d, bundle.Manifest.from_json(m)) == []


def test_new_bundle_refuses_non_empty(tmp_path):
    d, _ = make_bundle(tmp_path)
    with pytest.raises(BundleError, match="already exists and is not empty"):
        bundle.new_bundle(d)
    (tmp_path / "empty.tdm").mkdir()
    assert bundle.new_bundle(tmp_path / "empty.tdm").is_dir()


def test_new_bundle_claims_the_directory(tmp_path):
    """Two recorders started together on one path: the second is refused before it
    writes anything (the first holds the directory's flock, or has its manifest there)."""
    d = tmp_path / "race.tdm"
    d.mkdir()
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)          # the first recorder, mid-claim
        with pytest.raises(BundleError, match="race.tdm: another tandem is creating a recording here"):
            bundle.new_bundle(d, bundle.Manifest.new())
        assert list(d.iterdir()) == []
    finally:
        os.close(fd)
    m = bundle.Manifest.new()
    bundle.new_bundle(d, m)                     # the claim is the first manifest
    assert bundle.load_manifest(d) == m
    with pytest.raises(BundleError, match="already exists and is not empty"):
        bundle.new_bundle(d, bundle.Manifest.new())
    assert bundle.load_manifest(d) == m


def test_load_manifest_errors(tmp_path):
    with pytest.raises(BundleError, match=r"nope.tdm: no such recording bundle$"):
        bundle.load_manifest(tmp_path / "nope.tdm")
    d = bundle.new_bundle(tmp_path / "x.tdm")
    with pytest.raises(BundleError, match=r"manifest.json: missing"):
        bundle.load_manifest(d)
    (d / "manifest.json").write_text("{oops")
    with pytest.raises(BundleError, match=r"manifest.json: not valid JSON \(line 1"):
        bundle.load_manifest(d)
    (d / "manifest.json").write_text(json.dumps({"schema": 2}))
    with pytest.raises(BundleError, match=r"manifest.json: schema 2, this tandem reads schema 1"):
        bundle.load_manifest(d)


def test_truncated_file(tmp_path):
    d, m = make_bundle(tmp_path)
    size = m["files"][bundle.STREAM]["size"]
    with open(d / bundle.STREAM, "r+b") as f:
        f.truncate(size - 10)
    with pytest.raises(BundleError, match=rf"^truncated: {d / bundle.STREAM} has {size - 10} bytes, manifest says {size}$"):
        bundle.check_bundle(d)
    m["state"] = "interrupted"
    bundle.write_manifest(d, m)
    with pytest.raises(BundleError, match="recording is interrupted, not complete"):
        bundle.check_bundle(d)
    bundle.check_bundle(d, partial=True)  # tolerated: the stream reader finds the intact prefix


def test_missing_and_checksum(tmp_path):
    d, m = make_bundle(tmp_path)
    data = bytearray((d / bundle.DEVLOG).read_bytes())
    data[-20] ^= 1
    (d / bundle.DEVLOG).write_bytes(bytes(data))
    with pytest.raises(BundleError, match=rf"^{d / bundle.DEVLOG}: checksum mismatch"):
        bundle.check_bundle(d)
    bundle.check_bundle(d, partial=True)
    assert [p.kind for p in bundle.verify_files(d, bundle.Manifest.from_json(m))] == ["hash"]
    assert bundle.verify_files(d, bundle.Manifest.from_json(m), check_hash=False) == []
    (d / bundle.STREAM).unlink()
    with pytest.raises(BundleError, match=rf"^{d / bundle.STREAM}: missing$"):
        bundle.check_bundle(d, partial=True)  # missing is never tolerated


def test_inputs_and_qemu(tmp_path):
    d, m = make_bundle(tmp_path)
    with pytest.raises(BundleError, match=r"recorded with QEMU build aaaaaaaaaaaa, this is cccccccccccc$"):
        bundle.check_bundle(d, qemu_build_id="c" * 64)
    kernel = tmp_path / "bzImage"
    kernel.write_bytes(b"KERNEL" * 100)  # same size, other content
    with pytest.raises(BundleError, match=rf"^kernel {kernel}: changed since recording$"):
        bundle.check_bundle(d)
    kernel.unlink()
    with pytest.raises(BundleError, match=rf"^kernel {kernel}: not found$"):
        bundle.check_bundle(d)


def test_inspect_complete(tmp_path):
    d, _ = make_bundle(tmp_path)
    info = inspect(d)
    assert info["integrity"] == {"ok": True, "problems": []}
    net = info["channels"]["net0"]
    assert (net["events"], net["bytes"], net["first_vm_ns"], net["last_vm_ns"]) == (2, 102, 2_000, 5_000)
    assert net["in"] == {"events": 1, "bytes": 60} and net["out"] == {"events": 1, "bytes": 42}
    s = info["stream"]
    assert (s["segments"], s["raw_bytes"], s["last_icount"], s["finished"]) == (2, 4100, 10, True)
    assert s["ratio"] > 1
    assert info["channels"]["serial0"]["vcpus"] == {"0": 1} and "vcpus" not in net     # frames name none
    text = render(info)
    assert "net0" in text and "integrity: ok" in text and "replay.tdrs" in text
    assert "vCPU:events" in text and " 0:1 " in text


def test_inspect_torn(tmp_path):
    d, m = make_bundle(tmp_path, finish=False, state="interrupted")
    with open(d / bundle.DEVLOG, "ab") as f:
        f.write(b"\x06\0\0\0\x40\0\0\0partial")
    info = inspect(d)
    probs = info["integrity"]["problems"]
    assert not info["integrity"]["ok"]
    assert any("recording state is interrupted" in p for p in probs)
    assert any(p.endswith(f"torn tail at offset {m['files'][bundle.DEVLOG]['size']}") for p in probs)
    assert any("unfinished (no END segment)" in p for p in probs)
    assert "problem(s)" in render(info)

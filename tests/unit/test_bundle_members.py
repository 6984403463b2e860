"""A bundle's files are opened by bundle.open_member: one plain name, relative
to the bundle directory, never through a symbolic link, never waiting on a FIFO, never a
directory. Each reader of a bundle refuses such a member with one BundleError line naming
it. A FIFO that was opened would block the test: SIGALRM turns that hang into a failure."""
from __future__ import annotations

import os
import signal

import pytest

from tandem.formats import bundle, pcapng, rrstream
from tandem.errors import BundleError
from tandem.cli.inspect_bundle import inspect

from helpers.bundles import make_bundle


@pytest.fixture(autouse=True)
def no_hang():
    """A reader that opens a FIFO blocks for ever; this ends it as a failure instead."""
    def hung(signum, frame):
        raise AssertionError("a reader blocked on a bundle member (opened a FIFO?)")
    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def plant(path, kind, secret):
    """Replace path by a symbolic link to secret, a FIFO or a directory."""
    if path.is_dir():
        path.rmdir()
    elif os.path.lexists(path):
        path.unlink()
    if kind == "symlink":
        path.symlink_to(secret)
    elif kind == "fifo":
        os.mkfifo(path, 0o600)
    else:
        path.mkdir()


KINDS = {"symlink": "symbolic link", "fifo": "a FIFO", "directory": "a directory"}


def one_line_naming(error, path, kind):
    message = str(error)
    assert "\n" not in message and message.startswith(f"{path}: ") and KINDS[kind] in message, message


@pytest.fixture
def secret(tmp_path):
    s = tmp_path / "secret"
    s.write_bytes(b"x" * 12345)
    return s


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("member", [bundle.DEVLOG, bundle.STREAM])
def test_check_bundle_refuses_a_member_that_is_not_a_file(tmp_path, secret, kind, member):
    d, m = make_bundle(tmp_path)
    plant(d / member, kind, secret)
    with pytest.raises(BundleError) as e:
        bundle.check_bundle(d, partial=True)
    one_line_naming(e.value, d / member, kind)


@pytest.mark.parametrize("kind", KINDS)
def test_a_manifest_that_is_not_a_file_is_refused_by_load_and_inspect(tmp_path, secret, kind):
    d, m = make_bundle(tmp_path)
    plant(d / bundle.MANIFEST, kind, secret)
    with pytest.raises(BundleError) as e:
        bundle.load_manifest(d)
    one_line_naming(e.value, d / bundle.MANIFEST, kind)
    problems = inspect(d)["integrity"]["problems"]
    assert any(str(d / bundle.MANIFEST) in p and KINDS[kind] in p for p in problems), problems


@pytest.mark.parametrize("kind", KINDS)
def test_the_device_log_reader_refuses_it(tmp_path, secret, kind):
    d, m = make_bundle(tmp_path)
    plant(d / bundle.DEVLOG, kind, secret)
    for read in (pcapng.read_devlog, lambda p: list(pcapng.iter_events(p)),
                 lambda p: list(pcapng.DevlogReader(p, follow=lambda: False))):
        with pytest.raises(BundleError) as e:
            read(d / bundle.DEVLOG)
        one_line_naming(e.value, d / bundle.DEVLOG, kind)


@pytest.mark.parametrize("kind", KINDS)
def test_the_stream_readers_refuse_it(tmp_path, secret, kind):
    d, m = make_bundle(tmp_path)
    plant(d / bundle.STREAM, kind, secret)
    for read in (rrstream.scan, lambda p: list(rrstream.iter_raw(p)), rrstream.is_being_written,
                 lambda p: rrstream.write_intact_prefix(p, tmp_path / "prefix.tdrs")):
        with pytest.raises(BundleError) as e:
            read(d / bundle.STREAM)
        one_line_naming(e.value, d / bundle.STREAM, kind)
    assert not (tmp_path / "prefix.tdrs").exists()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("member", [bundle.DEVLOG, bundle.STREAM, "extra.bin"])
def test_inspect_lists_it_once_and_goes_on(tmp_path, secret, kind, member):
    """Named in the manifest's files or not, the member is one problem line; the rest of
    the bundle is still read, and nothing of the secret is sized or read."""
    d, m = make_bundle(tmp_path)
    m["files"]["extra.bin"] = bundle.file_entry(secret).to_json()
    bundle.write_manifest(d, m)
    plant(d / member, kind, secret)
    info = inspect(d)
    mine = [p for p in info["integrity"]["problems"] if p.startswith(f"{d / member}: ")]
    assert len(mine) == 1 and KINDS[kind] in mine[0], info["integrity"]["problems"]
    assert member not in info["files"] and 12345 not in info["files"].values()
    if member != bundle.DEVLOG:
        assert info["devlog"]["records"] == 3
    if member != bundle.STREAM:
        assert info["stream"]["finished"]


@pytest.mark.parametrize("name", ["../secret", "sub/file", "/etc/passwd", "..", ".", "", "x" * 256, "a\0b"])
def test_a_name_that_is_not_one_plain_name_is_never_opened(tmp_path, secret, name):
    """load_manifest refuses such a `files` key; open_member refuses it too, for a caller
    that did not load the manifest (verify_files given a table of its own)."""
    d, m = make_bundle(tmp_path)
    (d / "sub").mkdir()
    (d / "sub" / "file").write_bytes(b"x" * 12345)
    with pytest.raises(BundleError) as e:
        bundle.open_member(d, name)
    assert "\n" not in str(e.value) and "file name" in str(e.value)
    problems = bundle.verify_files(d, bundle.Manifest(files={name: bundle.file_entry(secret)}))
    assert [p.file for p in problems] == [name] and "file name" in problems[0].message


def test_a_regular_member_reads_as_before(tmp_path):
    d, m = make_bundle(tmp_path)
    with bundle.open_member(d, bundle.DEVLOG) as f:
        assert f.read() == (d / bundle.DEVLOG).read_bytes()
    with pytest.raises(bundle.MissingMember, match="missing"):
        bundle.open_member(d, "absent")
    assert bundle.check_bundle(d).to_json() == m

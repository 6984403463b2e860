"""Private by default: what tandem creates is 0700/0600 whatever the
umask, and `tandem inspect` warns, in one line naming the bundle, on one that is not.
The real recording's modes (QEMU's logs included) are tests/test_private_modes.py's."""
import logging
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tandem.formats import bundle
from tandem import private
from tandem.cli.inspect_bundle import inspect

ROOT = Path(__file__).resolve().parents[2]


def mode(p: Path) -> int:
    return stat.S_IMODE(p.lstat().st_mode)


@pytest.fixture(autouse=True)
def usual_umask():
    """The umask most hosts run with (022: mkdir 0755, files 0644), restored after."""
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_make_dir_private_with_its_parents_existing_left_alone(tmp_path):
    (tmp_path / "mine").mkdir(mode=0o755)
    d = private.make_dir(tmp_path / "mine" / "a" / "b.tdm")
    assert (mode(tmp_path / "mine"), mode(tmp_path / "mine" / "a"), mode(d)) == (0o755, 0o700, 0o700)
    assert private.make_dir(d) == d      # exists: no error, no change


def test_files_private_also_when_rewritten(tmp_path):
    old = tmp_path / "findings.jsonl"
    old.write_text("from a run before tandem was private\n")
    assert mode(old) == 0o644
    with open(old, "w", opener=private.opener) as f:
        f.write("{}\n")
    private.write_text(tmp_path / "summary.json", "{}")
    private.copy_file(old, tmp_path / "qemu.log")
    assert [mode(tmp_path / n) for n in ("findings.jsonl", "summary.json", "qemu.log")] == [0o600] * 3
    assert (tmp_path / "qemu.log").read_text() == "{}\n"


def test_new_bundle_and_manifest_private(tmp_path):
    d = bundle.new_bundle(tmp_path / "out" / "run.tdm")
    bundle.write_manifest(d, bundle.Manifest.new())
    assert (mode(tmp_path / "out"), mode(d), mode(d / bundle.MANIFEST)) == (0o700, 0o700, 0o600)
    (tmp_path / "empty.tdm").mkdir(mode=0o755)      # an empty directory given: it becomes the bundle
    assert mode(bundle.new_bundle(tmp_path / "empty.tdm")) == 0o700


def test_feed_socket_only_in_a_private_directory(tmp_path):
    from tandem.errors import TandemError
    from tandem.qemu.feed import FeedServer
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    with pytest.raises(TandemError, match=r"feed socket .*f.sock: its directory .*shared is open to other "
                                          r"users \(mode 0755"):
        FeedServer(shared / "f.sock")
    assert not (shared / "f.sock").exists()
    with FeedServer(private.make_dir(tmp_path / "mine") / "f.sock") as srv:
        assert srv.path.is_socket()
    assert not srv.path.exists()


def test_exposed_lists_what_others_may_read_or_write(tmp_path):
    d = bundle.new_bundle(tmp_path / "run.tdm")
    private.write_text(d / "ok", "")
    (d / "loose").write_text("")                     # 0644 under umask 022
    os.symlink("/etc/passwd", d / "link")           # a link's own mode means nothing
    assert private.exposed(d) == [(d / "loose", 0o644)]
    os.chmod(d, 0o711)                               # search alone lets no name be listed
    assert private.exposed(d) == [(d / "loose", 0o644)]
    os.chmod(d, 0o755)
    assert private.exposed(d) == [(d, 0o755), (d / "loose", 0o644)]


def test_inspect_warns_on_a_bundle_others_can_read(tmp_path, caplog):
    d = bundle.new_bundle(tmp_path / "run.tdm")
    bundle.write_manifest(d, bundle.Manifest.new())
    with caplog.at_level(logging.WARNING):
        assert inspect(d)["exposed"] == {}
    assert not caplog.records
    os.chmod(d, 0o755)
    os.chmod(d / bundle.MANIFEST, 0o664)
    with caplog.at_level(logging.WARNING):
        info = inspect(d)
    assert info["exposed"] == {str(d): "0755", str(d / bundle.MANIFEST): "0664"}
    [rec] = caplog.records
    assert rec.levelno == logging.WARNING
    assert f"{d}: readable or writable by group/others ({d} is 0755 and 1 more)" in rec.getMessage()
    assert f"chmod -R go= {d}" in rec.getMessage()


def test_inspect_cli_warning_is_one_line_naming_the_bundle(tmp_path):
    d = bundle.new_bundle(tmp_path / "run.tdm")
    bundle.write_manifest(d, bundle.Manifest.new())
    os.chmod(d / bundle.MANIFEST, 0o644)
    env = dict(os.environ, PYTHONPATH=str(ROOT / "replay"))
    r = subprocess.run([sys.executable, "-m", "tandem", "inspect", str(d)], capture_output=True,
                       text=True, timeout=60, env=env)
    assert "Traceback" not in r.stderr, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert lines == [f"tandem: warning: {d}: readable or writable by group/others "
                     f"({d / bundle.MANIFEST} is 0644), and a recording holds the guest's traffic "
                     f"and disk writes; make it private: chmod -R go= {d}"], r.stderr

"""The one lifecycle of tandem's long-lived objects (replay/tandem/lifecycle.py): start()
makes what the object holds, close() releases it (idempotent, safe unstarted or after a
failed start), `with` starts unless started and closes. Shown here on the objects that
need no VM (a feed's socket, the gate's thread, a VM, a recording and a libvirtd never
started); the real-VM tests (tests/test_live.py, test_semantic.py, test_virt.py) run the
rest."""
from __future__ import annotations

import socket
from pathlib import Path
from typing import Self

import pytest

from tandem import private
from tandem.errors import TandemError
from tandem.libvirt.daemon import Libvirtd
from tandem.libvirt.launcher import Launcher
from tandem.lifecycle import Lifecycle
from tandem.live.gate import Gate
from tandem.machine import Guest, Host, Run
from tandem.qemu.feed import FeedServer
from tandem.qemu.vm import VM
from tandem.record.recording import Recording


class Held(Lifecycle):
    """The base's own behaviour: what start() made and close() released, in order."""

    def __init__(self, fail: bool = False):
        self.fail, self.made, self.log = fail, False, []

    @property
    def started(self) -> bool:
        return self.made

    def start(self) -> Self:
        self.made = True
        self.log.append("start")
        if self.fail:
            raise TandemError("start failed half way")
        return self

    def close(self) -> None:
        self.log.append("close")


def test_with_starts_once_and_closes():
    h = Held()
    with h as got:
        assert got is h and h.log == ["start"]
        with h:                         # started already: not again
            pass
    assert h.log == ["start", "close", "close"]


def test_a_start_that_fails_in_with_is_closed_before_the_error_goes_on():
    h = Held(fail=True)
    with pytest.raises(TandemError, match="half way"):
        with h:
            pytest.fail("the block ran after a failed start")
    assert h.log == ["start", "close"]


def connect(path: Path) -> socket.socket:
    client = socket.socket(socket.AF_UNIX)
    client.connect(str(path))
    return client


def test_a_feed_server_listens_from_start_to_close(tmp_path):
    srv = FeedServer(private.make_dir(tmp_path / "run") / "feed.sock")
    assert not srv.started and not srv.path.exists()        # made, not listening
    with srv:
        assert srv.path.is_socket()
        with connect(srv.path):
            srv.accept(5)
    assert not srv.path.exists()
    srv.close()                         # again: nothing left to do


def test_closing_a_feed_server_removes_only_the_socket_it_made(tmp_path):
    path = private.make_dir(tmp_path / "run") / "feed.sock"
    path.write_text("someone's")
    FeedServer(path).close()            # never started
    srv = FeedServer(path)
    with pytest.raises(TandemError, match=r"^feed socket .*feed\.sock: Address already in use$"):
        with srv:
            pass
    assert path.read_text() == "someone's" and not srv.started


def test_the_gate_runs_from_start_to_close_and_join_sees_qemu_go(tmp_path):
    with FeedServer(private.make_dir(tmp_path / "run") / "gate.sock") as srv:
        qemu = connect(srv.path)
        srv.accept(5)
        with Gate(srv, None, []) as gate:       # started: its loop receives
            assert gate.started and gate.thread.is_alive()
            assert not gate.join(0.2)           # QEMU is still there
        assert not gate.thread.is_alive()       # closed: stopped and waited for

        again = Gate(srv, None, []).start()
        qemu.close()                            # QEMU gone: the loop ends by itself
        assert again.join(30)
        again.close()


def test_a_vm_never_started_closes_and_its_launcher_releases_nothing(tmp_path):
    guest = Guest(kernel="/k/bzImage", initrd=None)
    run = Run(tmp_path / "run", host=Host(qemu={"binary": "/opt/qemu/bin/qemu-system-x86_64",
                                                 "firmware_dir": "/opt/qemu/share"}))
    vm = VM(guest, run, launcher=Launcher(None, "never-defined"))    # no libvirt is asked
    assert not vm.started
    vm.close()
    vm.close()
    with pytest.raises(TandemError, match="QEMU was not started"):
        vm.process()


def test_a_libvirtd_never_started_closes_and_leaves_its_directory(tmp_path):
    (tmp_path / "lv").mkdir()
    (tmp_path / "lv" / "yours").write_text("kept")
    d = Libvirtd(tmp_path / "lv")
    d.close()
    assert (tmp_path / "lv" / "yours").read_text() == "kept" and not d.started


def test_a_recording_whose_start_fails_is_closed_and_leaves_no_bundle(tmp_path):
    rec = Recording(tmp_path / "r.tdm", Guest(kernel=str(tmp_path / "no-bzImage"), initrd=None))
    rec.close()                                 # never started: nothing to do
    with pytest.raises(TandemError, match=r"^kernel .*no-bzImage: not found$"):
        with rec:
            pytest.fail("the block ran after a failed start")
    assert not (tmp_path / "r.tdm").exists()
    rec.close()

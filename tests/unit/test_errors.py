"""One error hierarchy (tandem/errors.py): every raise site's kind maps to its class, every
class to its exit status, and errors.py's docstring lists every class tandem defines.

The raise sites below are driven for real: a bundle directory that is not there, a QMP
socket nobody serves, a feed socket no QEMU connects to, a console whose guest hung up,
a guest service nobody listens on. None needs a VM.
"""
from __future__ import annotations

import ast
import re
import socket
import tempfile
from pathlib import Path

import pytest

from tandem import errors
from tandem.assertions import lang, trace
from tandem.cli.main import main
from tandem.errors import BootError, BundleError, InfraError, TandemError
from tandem.formats import bundle
from tandem.machine import options
from tandem.qemu import feed, vm
from tandem.record import workload

PACKAGE = Path(errors.__file__).resolve().parent


@pytest.fixture
def short_dir():
    """A private directory with a short path (a unix socket's path is at most 107 bytes)."""
    d = Path(tempfile.mkdtemp(prefix="tandem-err-"))
    yield d
    for p in d.iterdir():
        p.unlink()
    d.rmdir()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def hung_up_console(d: Path) -> vm.Serial:
    """A Serial whose other end (QEMU's chardev) accepted it and closed at once."""
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(d / "serial.sock"))
    server.listen(1)
    serial = vm.Serial(d / "serial.sock")
    conn, _ = server.accept()
    conn.close()
    server.close()
    return serial


SITES = {
    # the user's input
    "bundle not there": (lambda d: bundle.open_member(d / "none.tdm", bundle.MANIFEST), bundle.MissingMember),
    "option with a NUL": (lambda d: options._check_value("-name", "a\0b"), options.OptionError),
    "assertion syntax": (lambda d: lang.parse_text("assertion (", "bad.tas"), lang.AssertionLangError),
    # the guest's
    "console never printed": (lambda d: hung_up_console(d).wait_for(b"login:", 5), BootError),
    "service never answered": (lambda d: workload.KV(closed_port(), timeout=5), BootError),
    # tandem's machinery
    "QEMU gone before QMP": (lambda d: vm.qmp_connect(d / "qmp.sock", 5, alive=lambda: False), vm.QMPUnavailable),
    "QMP never answered": (lambda d: vm.qmp_connect(d / "qmp.sock", 0.05), vm.QMPUnavailable),
    "feed never connected": (lambda d: feed.FeedServer(d / "feed.sock").start().accept(0.05), InfraError),
    "plugin wrote no events": (lambda d: trace.read_records(d / "calls.bin"), trace.TraceError),
}
KIND = {bundle.MissingMember: BundleError, options.OptionError: TandemError, lang.AssertionLangError: TandemError,
        BootError: BootError, vm.QMPUnavailable: InfraError, InfraError: InfraError, trace.TraceError: InfraError}


@pytest.mark.parametrize("site", sorted(SITES))
def test_each_raise_site_raises_its_class(site, short_dir):
    raise_it, cls = SITES[site]
    with pytest.raises(TandemError) as e:
        raise_it(short_dir)
    assert type(e.value) is cls
    assert isinstance(e.value, KIND[cls])
    assert e.value.exit_code == errors.EXIT_ERROR == 2
    assert "\n" not in str(e.value)


def test_boot_infra_and_input_are_apart():
    for cls in (BootError, InfraError, BundleError, options.OptionError, lang.AssertionLangError):
        assert issubclass(cls, TandemError)
    assert not issubclass(BootError, InfraError) and not issubclass(InfraError, BootError)
    for cls in (vm.QMPUnavailable, trace.TraceError):
        assert issubclass(cls, InfraError)
    assert issubclass(bundle.MissingMember, BundleError)


def test_exit_statuses_are_distinct():
    statuses = [errors.EXIT_CLEAN, errors.EXIT_FOUND, errors.EXIT_ERROR, errors.EXIT_INCOMPLETE,
                errors.EXIT_INTERRUPTED]
    assert statuses == [0, 1, 2, 3, 130]


def test_the_cli_exits_with_the_errors_status(tmp_path, capfd):
    assert main(["inspect", str(tmp_path / "none.tdm")]) == errors.EXIT_ERROR
    out = capfd.readouterr().err
    assert out.startswith("tandem: error: ") and out.count("\n") == 1


def defined_errors() -> dict[str, str]:
    """Every exception class tandem defines over TandemError: name -> its module's path."""
    bases = {"TandemError"}
    found: dict[str, str] = {}
    trees = {p: ast.parse(p.read_text()) for p in PACKAGE.rglob("*.py")}
    while True:
        before = len(found)
        for p, tree in trees.items():
            for n in ast.walk(tree):
                if isinstance(n, ast.ClassDef) and any(isinstance(b, ast.Name) and b.id in bases for b in n.bases):
                    found[n.name] = str(p.relative_to(PACKAGE))
                    bases.add(n.name)
        if len(found) == before:
            return found


def test_errors_docstring_lists_every_class_where_it_lives():
    doc = errors.__doc__ or ""
    classes = defined_errors()
    assert len(classes) >= 8
    for name, path in classes.items():
        line = next((ln for ln in doc.splitlines() if re.match(rf"\s+{name}\s", ln)), None)
        assert line is not None, f"{name} ({path}) is not listed in errors.py's docstring"
        if path != "errors.py":
            assert f"({path})" in line, f"errors.py's docstring does not say {name} lives in {path}"


def test_no_exit_status_is_spelled_elsewhere():
    """An exit status is one of errors.py's names: no other module defines one."""
    spelled = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
               if p.name != "errors.py" and re.search(r"^\s*EXIT_\w+\s*(,\s*EXIT_\w+\s*)*=", p.read_text(), re.M)}
    assert spelled == set()

"""The tests' run_cli: a CLI command that outlives its deadline fails its test with what
it printed and every thread's stack, not with pytest's own timeout, which loses both."""
from __future__ import annotations

import socket

import pytest

from helpers import run_cli
from tandem import private
from tandem.record.console import console_socket


def test_a_command_past_its_deadline_fails_with_its_stacks_and_is_killed(tmp_path):
    """`tandem console` on a recording that never ends (a listening socket that never
    speaks) waits forever; run_cli ends it at its deadline with the CLI's stacks
    (faulthandler on SIGUSR1)."""
    bundle = tmp_path / "b.tdm"
    bundle.mkdir()
    path = console_socket(bundle)
    private.make_dir(path.parent)       # 0700, as the recordings' consoles require of it
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(path))
        listener.listen()
        try:
            with pytest.raises(AssertionError) as e:
                run_cli("console", str(bundle), timeout=3)
        finally:
            path.unlink()
    text = str(e.value)
    assert text.startswith(f"tandem console {bundle}: still running after 3 s"), text
    assert "_relay" in text and "cmd_console" in text, text

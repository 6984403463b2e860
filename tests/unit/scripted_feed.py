"""A scripted feed and VM for the semantic replay's loop (semantic.driving.driver.AnalysisDriver):
what QEMU says on the feed, step by step, and what the driver asked of it. Shared by
the loop's tests (test_driver.py) and the tests of what it answers (test_guest_connections.py).

They stand in for the Protocols qemu.vm.AnalysisVM and qemu.feed.FeedConnection; mypy
holds them to those (the assignments at the end: tests/unit/test_lint.py runs mypy over
this module, pyproject.toml's [tool.mypy] files)."""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from tandem.qemu import feed
from tandem.qemu.feed import FeedConnection
from tandem.qemu.vm import AnalysisVM

CAUSE = {name: i for i, name in enumerate(feed.SHUTDOWN_CAUSES)}


def wait(ns: int, idle: bool = False) -> feed.Message:
    return feed.Message(feed.WAIT, feed.WAIT_IDLE if idle else feed.WAIT_HORIZON, ns, b"")


def console(ns: int, text: bytes) -> feed.Message:
    return feed.Message(feed.OUTPUT, feed.SERIAL, ns, text)


def shutdown(ns: int, cause: str) -> feed.Message:
    return feed.Message(feed.SHUTDOWN, CAUSE[cause], ns, b"")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class ScriptedVM:
    """What the driver asks of QEMU, answered from the script's state."""

    def __init__(self) -> None:
        self.killed = self.quit_asked = self.pressed = False

    def kill(self) -> None:
        self.killed = True

    def quit(self) -> None:
        self.quit_asked = True

    def powerdown(self) -> None:
        self.pressed = True

    def wait(self, timeout: float | None = None) -> int:
        return 0

    def log_tail(self, n: int = 400) -> str:
        return "qemu: the log's tail"

    def status(self) -> str:
        return "running"

    def feed_counters(self) -> str:
        return "feed horizon=7 waits=3 delivered=0 late=0"

    def cpu_seconds(self) -> float | None:
        return 1.5


Messages = list[feed.Message] | None       # what one receive() gives
ScriptStep = Messages | Callable[["ScriptedFeed"], Messages]


class ScriptedFeed:
    """The feed as the driver sees it. Each receive() takes the script's next step:
    a list of messages, None (QEMU exited) or a callable of the feed giving one of
    those; a finished script is silence (the clock runs on by the timeout). A QEMU
    asked to quit says SHUTDOWN host-qmp-quit at its last stop and exits."""

    def __init__(self, script: Iterable[ScriptStep], vm: ScriptedVM, clock: Clock):
        self.script, self.vm, self.clock = list(script), vm, clock
        self.inputs: list[tuple[int, int, bytes]] = []
        self.horizons: list[tuple[int, int | None]] = []
        # release rules, as sent
        self.rules: list[tuple[int, list[tuple[bytes, int, bool]], tuple[bytes, int], list[bytes]]] = []
        self.unrules = 0
        self.quit_said = False

    def input(self, channel: int, vm_ns: int, data: bytes) -> None:
        self.inputs.append((channel, vm_ns, data))

    def horizon(self, vm_ns: int, warp_ns: int | None = None) -> None:
        self.horizons.append((vm_ns, warp_ns))

    def rule(self, not_before_ns: int, conds: list[tuple[bytes, int, bool]], acks: tuple[bytes, int],
             frames: list[bytes]) -> None:
        self.rules.append((not_before_ns, conds, acks, frames))

    def unrule(self) -> None:
        self.unrules += 1

    def flush(self) -> None:
        pass

    def receive(self, timeout: float) -> Messages:
        if self.vm.quit_asked:
            if self.quit_said:
                return None
            self.quit_said = True
            return [shutdown(self.horizons[-1][0] if self.horizons else 0, "host-qmp-quit")]
        if not self.script:
            self.clock.now += timeout
            return []
        step = self.script.pop(0)
        return step(self) if callable(step) else step


if TYPE_CHECKING:       # the seams they stand in for
    _vm: AnalysisVM = ScriptedVM()
    _feed: FeedConnection = ScriptedFeed([], ScriptedVM(), Clock())

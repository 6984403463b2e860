"""Driving a live shadow run as the CLI does: the client side in a thread, the native
sampled until it stops."""
from __future__ import annotations

import io

from rich.console import Console

from helpers import Client, start_client, wait_until
from tandem.cli.render import print_summary
from tandem.live.shadow import ShadowRun


def drive(sh: ShadowRun, work) -> Client:
    """Run the client side in a thread (its failure reaches the test at join) while the
    caller samples the native, as the CLI does; the client powers the native off."""
    def client():
        sh.native.wait_ready()
        work()
        sh.native.serial.type("poweroff")
    return start_client(client, "client")

def run_until_native_stops(sh: ShadowRun, each=None, timeout: float = 300, client: Client | None = None) -> None:
    """Sample the native (and call `each`) until its QEMU exits; a client that failed ends
    the wait with its own error rather than a timeout."""
    def stopped() -> bool:
        if client is not None and not client.is_alive() and client.error is not None:
            client.join(0)
        sh.sample()
        sh.native.vm.poll_events()
        if each:
            each()
        return sh.native.vm.proc.poll() is not None
    wait_until(stopped, timeout, lambda: f"the native to stop (VM {sh.native.vm.vm_status()})")

def analyses_caught_up(sh: ShadowRun, each=None, timeout: float = 300) -> None:
    """Until every analysis has finished with what the native gave it."""
    def done() -> bool:
        if each:
            each()
        return not any(f.thread.is_alive() for f in sh.followers)
    wait_until(done, timeout, lambda: "the analyses to catch up: " + ", ".join(
        f"{f.analysis} {'running' if f.thread.is_alive() else 'done'}" for f in sh.followers))


def summary_text(s) -> str:
    """The summary as `tandem shadow` prints it (each divergence with its diff, the input
    it came after, the replay limits), for an assertion's message: pytest shows a string
    whole, where it cuts the repr of a list of divergences short of the lines that differ."""
    out = io.StringIO()
    print_summary(s, out=Console(file=out, width=200, highlight=False, soft_wrap=True))
    return out.getvalue()

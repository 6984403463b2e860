"""Real client traffic for the demo guest service (kvd): Python sockets and nc.

Shared by the demo, the tests and the benchmarks so they all drive the guest
the same way. Every request waits for its reply, so a run is reproducible in
what it sends (not in when: that is what recording is for).
"""
from __future__ import annotations

import logging
import socket
import subprocess
import threading

from ..errors import BootError, TandemError

log = logging.getLogger(__name__)


class KV:
    """One client connection to kvd's line protocol."""

    def __init__(self, port: int, timeout: float = 30.0):
        try:
            self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        except OSError as e:
            raise BootError(f"guest service 127.0.0.1:{port}: {e}") from None
        self.rfile = self.sock.makefile("rb")

    def request(self, line: str) -> str:
        self.sock.sendall(line.encode() + b"\n")
        reply = self.rfile.readline()
        if not reply:
            raise BootError(f"guest service closed the connection after {line[:40]!r}")
        return reply.decode(errors="replace").rstrip("\n")

    def requests(self, lines: list[str]) -> list[str]:
        """Pipelined: send all lines in one write, then read one reply per line."""
        self.sock.sendall(b"".join(l.encode() + b"\n" for l in lines))
        replies = []
        for line in lines:
            reply = self.rfile.readline()
            if not reply:
                raise BootError(f"guest service closed the connection after {line[:40]!r}")
            replies.append(reply.decode(errors="replace").rstrip("\n"))
        return replies

    def close(self):
        try:
            self.sock.sendall(b"QUIT\n")
        except OSError:
            pass
        self.rfile.close()
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Hammer:
    """One client sending SET after SET, each waiting for its reply, until stop is set or
    the guest's service goes away under it (the recording ended or was killed): the heavy
    load of the torn and followed replays (51,000 requests in a 15 s recording, two device
    events each). `replies` counts as it goes, for whoever waits on the load."""

    def __init__(self, port: int, keys: int = 1000):
        self.port, self.keys = port, keys
        self.replies = 0
        self.stop = threading.Event()

    def run(self) -> int:
        try:
            kv = KV(self.port)
        except TandemError as e:
            return self._gone(e)
        with kv:
            while not self.stop.is_set():
                line = f"SET k{self.replies % self.keys} v{self.replies}"
                try:
                    reply = kv.request(line)
                except (TandemError, OSError) as e:     # the service is gone: the load ends
                    return self._gone(e)
                if reply != "OK":
                    raise BootError(f"guest service: expected OK to {line!r}, got {reply!r}")
                self.replies += 1
        return self.replies

    def _gone(self, why: Exception) -> int:
        if not self.stop.is_set():
            log.info("hammer on port %d: the service went away after %d replies (%s)",
                     self.port, self.replies, why)
        return self.replies


def nc_session(port: int, lines: list[str], timeout: float = 30.0) -> list[str]:
    """Send lines with netcat (a real, independent client) and return its replies."""
    r = subprocess.run(["nc", "-N", "-w", str(int(timeout)), "127.0.0.1", str(port)],
                       input="".join(l + "\n" for l in lines + ["QUIT"]).encode(),
                       capture_output=True, timeout=timeout + 5)
    if r.returncode not in (0, 1):
        raise BootError(f"nc 127.0.0.1:{port}: exit {r.returncode}: {r.stderr.decode().strip()}")
    return r.stdout.decode(errors="replace").splitlines()


def demo_traffic(port: int, rounds: int = 20) -> dict:
    """A small mixed workload: writes that reach disk, reads, a sync, from two clients."""
    replies = 0
    with KV(port) as a, KV(port) as b:
        for i in range(rounds):
            for reply, want in ((a.request(f"SET key{i} value-{i}-{'x' * (i % 7)}"), "OK"),
                                (b.request(f"GET key{i}"), "VALUE")):
                if not reply.startswith(want):
                    raise BootError(f"guest service: expected {want}, got {reply!r}")
                replies += 1
        if a.request("SYNC") != "OK":
            raise BootError("guest service: SYNC failed")
        replies += 1
    out = nc_session(port, ["GET key1", "DEL key2", "GET key2", "STATS", "SYNC"])
    replies += len(out)
    if not out or not out[0].startswith("VALUE"):
        raise BootError(f"nc client: unexpected replies {out!r}")
    return {"requests": replies}


# The planted bugs (docs/planted-bugs.md): each is one request to kvd, and a native guest
# answers it like any other request. Which analysis reports it, and what the native
# guest answers. The lock-order pair comes first: the debug kernel has KASAN and lockdep,
# and a KASAN report taints the kernel, which turns lockdep off ("Disabling lock debugging
# due to kernel taint"), as in syzbot's kernels:
#   kind                 request                        reported by                 native reply
PLANTED_BUGS = {
    "lockdep-ab":         ("BUG lock-ab",                "(the order lock-ba breaks)", "OK"),
    "lockdep-ba":         ("BUG lock-ba",                "lockdep circular locking",  "OK"),
    "kasan-oob":          ("BUG oob " + "n" * 52,        "KASAN slab-out-of-bounds",  "OK"),
    "kasan-uaf":          ("BUG uaf",                    "KASAN slab-use-after-free", "OK"),
    "ubsan-shift":        ("BUG shift 40",               "UBSAN shift-out-of-bounds", "OK"),
    "ubsan-index":        ("BUG index 8",                "UBSAN array-index-out-of-bounds", "OK"),
    "kcsan-race":         ("BUG race",                   "KCSAN data-race",           "OK"),
    "lkdtm-uaf":          ("LKDTM READ_AFTER_FREE",      "KASAN slab-use-after-free", "OK"),
    # A table update without its audit hook: only a temporal assertion sees it
    # (guest-kernel/assertions/linux-6.12.tesla, checked by `tandem assert`).
    "assert-nocheck":     ("BUG update-nocheck 7",       "tandem assert: tb_table_update without tb_audit_check", "OK"),
    # Last: kvd-asan aborts on it, which closes the connection.
    "asan-heap-overflow": ("GET " + "k" * 43,            "ASan heap-buffer-overflow", "NOTFOUND"),
}


def bad_requests(port: int, kinds: list[str] | None = None, *, check: bool = True) -> dict[str, str | None]:
    """Send the planted-bug requests (all, or `kinds`, in PLANTED_BUGS order) on one
    connection; return {kind: reply}, None once the service has closed the connection
    (the ASan build aborts on its bug). check=True: every reply must be the native one."""
    want = [k for k in PLANTED_BUGS if kinds is None or k in kinds]
    unknown = set(kinds or ()) - set(PLANTED_BUGS)
    if unknown:
        raise TandemError(f"unknown planted bugs: {', '.join(sorted(unknown))}")
    replies: dict[str, str | None] = {}
    with KV(port) as kv:
        for kind in want:
            line, _, native = PLANTED_BUGS[kind]
            try:
                replies[kind] = reply = kv.request(line)
            except (TandemError, OSError):
                if check:
                    raise
                replies.update({k: None for k in want if k not in replies})
                break
            if check and reply != native:
                raise BootError(f"guest service: {kind} ({line[:30]!r}): expected {native}, got {reply!r}")
    return replies

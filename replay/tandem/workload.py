"""Real client traffic for the demo guest service (kvd): Python sockets and nc.

Shared by the demo, the tests and the benchmarks so they all drive the guest
the same way. Every request waits for its reply, so a run is reproducible in
what it sends (not in when: that is what recording is for).
"""
from __future__ import annotations

import socket
import subprocess

from .errors import TandemError


class KV:
    """One client connection to kvd's line protocol."""

    def __init__(self, port: int, timeout: float = 30.0):
        try:
            self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        except OSError as e:
            raise TandemError(f"guest service 127.0.0.1:{port}: {e}") from None
        self.rfile = self.sock.makefile("rb")

    def request(self, line: str) -> str:
        self.sock.sendall(line.encode() + b"\n")
        reply = self.rfile.readline()
        if not reply:
            raise TandemError(f"guest service closed the connection after {line[:40]!r}")
        return reply.decode(errors="replace").rstrip("\n")

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


def nc_session(port: int, lines: list[str], timeout: float = 30.0) -> list[str]:
    """Send lines with netcat (a real, independent client) and return its replies."""
    r = subprocess.run(["nc", "-N", "-w", str(int(timeout)), "127.0.0.1", str(port)],
                       input="".join(l + "\n" for l in lines + ["QUIT"]).encode(),
                       capture_output=True, timeout=timeout + 5)
    if r.returncode not in (0, 1):
        raise TandemError(f"nc 127.0.0.1:{port}: exit {r.returncode}: {r.stderr.decode().strip()}")
    return r.stdout.decode(errors="replace").splitlines()


def demo_traffic(port: int, rounds: int = 20) -> dict:
    """A small mixed workload: writes that reach disk, reads, a sync, from two clients."""
    replies = 0
    with KV(port) as a, KV(port) as b:
        for i in range(rounds):
            for reply, want in ((a.request(f"SET key{i} value-{i}-{'x' * (i % 7)}"), "OK"),
                                (b.request(f"GET key{i}"), "VALUE")):
                if not reply.startswith(want):
                    raise TandemError(f"guest service: expected {want}, got {reply!r}")
                replies += 1
        if a.request("SYNC") != "OK":
            raise TandemError("guest service: SYNC failed")
        replies += 1
    out = nc_session(port, ["GET key1", "DEL key2", "GET key2", "STATS", "SYNC"])
    replies += len(out)
    if not out or not out[0].startswith("VALUE"):
        raise TandemError(f"nc client: unexpected replies {out!r}")
    return {"requests": replies}

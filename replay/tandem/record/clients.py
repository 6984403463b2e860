"""Debian's own clients against a guest's services (through its forwards, or at its
address on a libvirt network: Via): what a user drives their VM with, used by `tandem demo --guest debian`, the tests and the benchmarks.
Each run is bounded in requests or time, checks what came back, and returns
the client's own figures (requests, requests a second, p99 latency).

- curl fetches files and their hashes are checked (a body the guest served wrong is an
  error here, not a number);
- ab: a new connection per request (-n requests, -c at once);
- wrk: connections kept alive, for a time (-d), latency percentiles from --latency;
- redis-benchmark: SET/GET over -c connections, -n requests, --csv figures.
"""
from __future__ import annotations

import csv
import hashlib
import io
import re
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import BootError
from ..setup import programs

HOST = "127.0.0.1"


@dataclass(frozen=True)
class Via:
    """Where a client reaches the guest from: the host's loopback, through a forward
    (default), or the guest's own address from inside a network namespace (netns, a
    /proc/PID/ns/net: where a libvirt network is, as in the tests' private libvirtd)."""
    host: str = HOST
    netns: str | None = None

    def argv(self, argv: list[str]) -> list[str]:
        return ["nsenter", f"--net={self.netns}", "--", *argv] if self.netns else argv


LOOPBACK = Via()


@dataclass
class Load:
    """What one client run reported."""
    client: str
    requests: int
    per_s: float
    p99_ms: float | None
    failed: int = 0

    def line(self) -> str:
        p99 = f", p99 {self.p99_ms:.2f} ms" if self.p99_ms is not None else ""
        return f"{self.client}: {self.requests} requests, {self.per_s:,.0f}/s{p99}, {self.failed} failed"


def _run(argv: list[str], timeout: float) -> str:
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise BootError(f"{argv[0]}: no result within {timeout:.0f}s") from None
    if r.returncode:
        why = (r.stderr.strip() or r.stdout.strip()).splitlines()[-1:] or [f"status {r.returncode}"]
        shown = argv[argv.index("--") + 1:] if argv[0] == "nsenter" else argv
        raise BootError(f"{' '.join(shown[:3])}...: failed ({why[0]})")
    return r.stdout


def http_get(port: int, path: str = "/", timeout: float = 30.0) -> tuple[int, bytes]:
    """One GET: (status, body); a connection error raises OSError."""
    try:
        with urllib.request.urlopen(f"http://{HOST}:{port}{path}", timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def http_up(port: int) -> bool:
    """The HTTP service behind port answers now (slirp accepts before the guest listens,
    then closes: that is 'not yet')."""
    try:
        return http_get(port, timeout=5)[0] == 200
    except (OSError, urllib.error.URLError):
        return False


def redis_up(port: int) -> bool:
    """The redis behind port answers PING now."""
    try:
        with socket.create_connection((HOST, port), timeout=5) as s:
            s.sendall(b"*1\r\n$4\r\nPING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def wait_for(up: Callable[[], bool], what: str, timeout: float, alive: Callable[[], bool],
             progress: Callable[[str], None] | None = None) -> float:
    """Poll until up() (a service answers), while alive() (the guest runs); the seconds it
    took. A one-line error when the guest stops or the time is over."""
    t0 = time.monotonic()
    while not up():
        if not alive():
            raise BootError(f"{what}: the guest stopped before it answered")
        waited = time.monotonic() - t0
        if waited > timeout:
            raise BootError(f"{what}: no answer within {timeout:.0f}s")
        if progress:
            progress(f"waiting for {what} ({waited:.0f}s)")
        time.sleep(0.5)
    return time.monotonic() - t0


def fetch_files(port: int, files: dict[str, str], via: Via = LOOPBACK, max_time: float = 120) -> int:
    """curl each path and check its sha256 (files: path -> hex digest); the bytes fetched.
    max_time: seconds a file may take (a gated native's answer waits for its shadows)."""
    total = 0
    for path, digest in files.items():
        url = f"http://{via.host}:{port}{path}"
        body = subprocess.run(via.argv([programs.require("curl"), "-sf", "--max-time", f"{max_time:g}", url]),
                              capture_output=True, timeout=max_time + 60)
        if body.returncode:
            raise BootError(f"curl {url}: failed (status {body.returncode})")
        if hashlib.sha256(body.stdout).hexdigest() != digest:
            raise BootError(f"{url}: {len(body.stdout)} bytes, not the file served (sha256 differs)")
        total += len(body.stdout)
    return total


def ab(port: int, path: str = "/", requests: int = 500, concurrency: int = 4, via: Via = LOOPBACK) -> Load:
    """ApacheBench: a new connection per request."""
    out = _run(via.argv([programs.require("ab"), "-q", "-n", str(requests), "-c", str(concurrency), "-s", "60",
                         f"http://{via.host}:{port}{path}"]), timeout=600)
    done = int(_field(out, r"Complete requests:\s+(\d+)"))
    failed = int(_field(out, r"Failed requests:\s+(\d+)")) + int(_field(out, r"Non-2xx responses:\s+(\d+)", "0"))
    return Load("ab", done, float(_field(out, r"Requests per second:\s+([\d.]+)")),
                float(_field(out, r"\n\s*99%\s+(\d+)")), failed)


_WRK_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def wrk(port: int, path: str = "/", seconds: int = 10, connections: int = 4) -> Load:
    """wrk: connections kept alive for `seconds`."""
    out = _run([programs.require("wrk"), "-t1", f"-c{connections}", f"-d{seconds}s", "--latency", "--timeout", "30s",
                f"http://{HOST}:{port}{path}"], timeout=seconds + 120)
    p99 = re.search(r"\n\s*99%\s+([\d.]+)(us|ms|s)", out)
    errors = sum(int(n) for n in re.findall(r"(?:connect|read|write|timeout) (\d+)", out))
    non2xx = int(_field(out, r"Non-2xx or 3xx responses:\s+(\d+)", "0"))
    return Load("wrk", int(_field(out, r"(\d+) requests in")), float(_field(out, r"Requests/sec:\s+([\d.]+)")),
                float(p99.group(1)) * _WRK_UNITS[p99.group(2)] if p99 else None, errors + non2xx)


def redis_benchmark(port: int, requests: int = 2000, clients: int = 4, tests: str = "set,get",
                    via: Via = LOOPBACK) -> list[Load]:
    """redis-benchmark: one Load per test, from its --csv output."""
    out = _run(via.argv([programs.require("redis-benchmark"), "-h", via.host, "-p", str(port), "-n", str(requests),
                         "-c", str(clients), "-t", tests, "--csv"]), timeout=600)
    loads = []
    for row in csv.DictReader(io.StringIO(out)):
        loads.append(Load(f"redis-benchmark {row['test']}", requests, float(row["rps"]),
                          float(row["p99_latency_ms"]) if row.get("p99_latency_ms") else None))
    if not loads:
        raise BootError(f"redis-benchmark: no figures in its output ({out.strip()[:80]!r})")
    return loads


def _field(text: str, pattern: str, default: str | None = None) -> str:
    m = re.search(pattern, text)
    if m:
        return m.group(1)
    if default is not None:
        return default
    raise BootError(f"client output: no {pattern!r} in it ({text.strip()[-120:]!r})")

"""What the tests share: waiting for an event, client threads that report their failures,
running the CLI, recording the demo guest, reading device logs with Wireshark's tools.

One definition of each. Test modules import from here, never from each other
or from conftest.py; conftest.py holds the fixtures.

Waiting: a test never sleeps for an event; it waits for it with `wait_until`, which
polls a predicate until a deadline and fails naming what it waited for. tests/unit/
test_suite_habits.py enforces it (no time.sleep outside this module's wait_until poll and
a client's think time, `pace`; no thread joined unchecked).
"""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, TypeVar

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "replay") not in sys.path:
    sys.path.insert(0, str(ROOT / "replay"))

from tandem import catalog  # noqa: E402
from tandem.formats import pcapng  # noqa: E402
from tandem.errors import BundleError  # noqa: E402

# syzkaller's report corpus, beside the clone (../shared) or beside the directory holding a
# worktree (../../shared).
SHARED = next((p / "shared" / "syzkaller-reports" for p in ROOT.parents[0:2]
               if (p / "shared" / "syzkaller-reports").is_dir()),
              ROOT.parent / "shared" / "syzkaller-reports")

T = TypeVar("T")
POLL_S = 0.1
MARK = "TANDEM_TEST_MARK"          # in the environment of everything a test starts (conftest)
_shared = threading.local()


def analyses(*names: str) -> list[catalog.Analysis]:
    """The built-in analyses of these names, as the CLI hands them to the stages."""
    return [catalog.ANALYSES[name] for name in names]


@contextlib.contextmanager
def shared_across_tests():
    """VMs and processes started inside this block belong to a fixture wider than one
    test (it closes them itself): the end of the test that happened to start them must
    not (conftest's test_leaves_nothing), so they get no test mark and are not watched."""
    mark = os.environ.pop(MARK, None)
    _shared.on = True
    try:
        yield
    finally:
        _shared.on = False
        if mark is not None:
            os.environ[MARK] = mark


def in_shared_block() -> bool:
    return getattr(_shared, "on", False)


def wait_until(predicate: Callable[[], T], timeout: float, what: str | Callable[[], str], *,
               poll: float = POLL_S) -> T:
    """predicate's first truthy value, polled every `poll` seconds; an AssertionError
    naming `what` (a text, or a function giving one with the state at the deadline) when
    `timeout` seconds pass without one."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            said = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout:g}s waiting for {said}")
        time.sleep(poll)


def quiet(count: Callable[[], int]) -> Callable[[], bool]:
    """A predicate for wait_until: count() is above zero and has not changed since the
    last poll (a log that has stopped growing)."""
    last: list[int | None] = [None]

    def unchanged() -> bool:
        now = count()
        same, last[0] = now == last[0], now
        return same and now > 0
    return unchanged


def pace(seconds: float) -> None:
    """A client's think time between requests: a load's shape, not a wait for an event
    (a test that waits for something uses wait_until)."""
    time.sleep(seconds)


class Client(threading.Thread):
    """A thread whose exception reaches the test: join() raises it, and fails when the
    thread is still running at its timeout (a client stuck on a dead service)."""

    def __init__(self, target: Callable[[], object], name: str = "client"):
        super().__init__(name=name, daemon=True)
        self._target_fn = target
        self.error: BaseException | None = None
        self.result: object = None

    def run(self) -> None:
        try:
            self.result = self._target_fn()
        except BaseException as e:      # handed to the test by join(): nothing is lost
            self.error = e

    def join(self, timeout: float | None = 60) -> None:     # noqa: D401 - a checked join
        super().join(timeout)
        if self.is_alive():
            raise AssertionError(f"thread {self.name} still running after {timeout:g}s")
        if self.error is not None:
            raise AssertionError(f"thread {self.name} failed: {type(self.error).__name__}: {self.error}") \
                from self.error


def start_client(target: Callable[[], object], name: str = "client") -> Client:
    t = Client(target, name)
    t.start()
    return t


def unsent_bytes(sock) -> int:
    """Bytes written to a socket that its peer has not taken yet (SIOCOUTQ: for TCP, not
    yet acknowledged; for a unix stream socket, not yet read)."""
    import fcntl
    import struct
    import termios
    return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0]


def run_cli(*args: str, timeout: float = 270) -> subprocess.CompletedProcess:
    """Run the tandem CLI as a user would (a subprocess), capturing its output.

    One that outlives `timeout` fails the test with what it printed and every thread's
    stack (SIGUSR1, faulthandler: the CLI registers it), then it and its QEMUs are killed.
    The default is below pytest's 300 s, or the test's deadline would fire first and the
    command's output would be lost with it."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "replay"))
    p = subprocess.Popen([sys.executable, "-m", "tandem", *args], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.kill(p.pid, signal.SIGUSR1)
        try:
            p.communicate(timeout=2)        # the stacks, written at once
        except subprocess.TimeoutExpired:
            pass
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        raise AssertionError(f"tandem {' '.join(args)}: still running after {timeout:.0f} s\n"
                             f"--- stderr (thread stacks at the end) ---\n{err[-8000:]}\n"
                             f"--- stdout (tail) ---\n{out[-2000:]}") from None
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def start_cli(*args: str) -> subprocess.Popen:
    """The tandem CLI started as a user would (a subprocess), its output piped: for a
    command that runs until stopped (record, attach)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "replay"))
    return subprocess.Popen([sys.executable, "-m", "tandem", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def drain(p: subprocess.Popen, into: list[str]) -> None:
    """Keep reading a start_cli command's stdout and stderr into `into`, in threads, once
    the test has read what it waited for: a pipe nobody reads fills at 64 KiB and blocks
    the command in its next write, which looks like a command that will not exit."""
    for stream in (p.stdout, p.stderr):
        if stream is not None:
            threading.Thread(target=lambda s=stream: into.extend(iter(s.readline, "")), daemon=True).start()


def interrupt_cli(p: subprocess.Popen, out: list[str], timeout: float = 60, sig: int = signal.SIGINT) -> int:
    """Ctrl-C (sig: SIGINT, or another, e.g. SIGTERM) a start_cli command (drained into
    `out`) and its exit status; one that is still running after `timeout` fails the test
    with what it printed and every thread's stack (SIGUSR1, faulthandler: the CLI
    registers it)."""
    p.send_signal(sig)
    try:
        return p.wait(timeout)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGUSR1)
        time.sleep(2)       # the stacks, written at once
        raise AssertionError(f"tandem: still running {timeout:.0f} s after Ctrl-C; its output, thread stacks "
                             f"at the end:\n{''.join(out)[-8000:]}") from None


def assert_one_line_error(r: subprocess.CompletedProcess, *needles: str) -> str:
    """A user error: non-zero exit, one line on stderr naming the culprit, no traceback."""
    assert r.returncode != 0, r.stderr
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert "Traceback" not in r.stderr, r.stderr
    assert len(lines) == 1, r.stderr
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def record_demo(path: Path, *, rounds: int = 10, flavor: str | None = None, vcpus: int = 1) -> Path:
    """Record the demo guest (on its default kernel, or `flavor`; on `vcpus` vCPUs): client
    traffic, serial lines, disk writes, poweroff."""
    from tandem import catalog
    from tandem.machine import Guest
    from tandem.record.recording import Recording
    from tandem.record.workload import demo_traffic
    guest = Guest.default(flavor or catalog.DEFAULT_KERNEL) if flavor or vcpus > 1 else None
    if guest is not None:
        guest.vcpus = vcpus
    with Recording(path, guest=guest) as rec:
        rec.wait_ready()
        demo_traffic(rec.port, rounds=rounds)
        rec.serial.type("echo serial says hi")
        rec.serial.wait_for(b"serial says hi", 30)
        rec.serial.type("poweroff")
        rec.wait(timeout=120)
    return path


def record_planted_bugs(path: Path, **recording) -> Path:
    """Record the demo guest (Recording(path, **recording)): clean traffic, then every
    planted-bug request (answered normally), then poweroff."""
    from tandem.record.recording import Recording
    from tandem.record.workload import bad_requests, demo_traffic
    with Recording(path, **recording) as rec:
        rec.wait_ready()
        demo_traffic(rec.port, rounds=5)
        bad_requests(rec.port)
        rec.serial.type("poweroff")
        rec.wait(timeout=180)
    return path


def service_answers(port: int) -> bool:
    """The demo service behind `port` answers a SET now. Not yet: a refused connection or
    one closed without an answer (tandem's TandemError: slirp accepts before the guest
    listens, then closes), a reset, a timeout; anything else fails the test."""
    from tandem.errors import TandemError
    from tandem.record.workload import KV
    try:
        with KV(port, timeout=5) as kv:
            return kv.request("SET up 1") == "OK"
    except (TandemError, ConnectionError, TimeoutError):
        return False


def wait_for_service(port: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    """Until the guest service behind `port` answers, while `proc` (tandem) runs."""
    def up() -> bool:
        if proc.poll() is not None:
            said = proc.stderr.read()[-3000:] if proc.stderr else ""
            raise AssertionError(f"tandem exited ({proc.returncode}) before its guest served: {said}")
        return service_answers(port)
    wait_until(up, timeout, f"the guest service on port {port}", poll=0.5)


def wireshark_counts(path: Path) -> tuple[int, int]:
    """(capinfos's packet count, tshark's): each reads the file to its end or fails."""
    r = subprocess.run(["capinfos", "-M", "-c", str(path)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"capinfos cannot read {path} to the end: {r.stderr.strip()}"
    n_capinfos = int(r.stdout.rsplit("Number of packets:", 1)[1].split()[0])
    r = subprocess.run(["tshark", "-r", str(path), "-T", "fields", "-e", "frame.number"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"tshark cannot read {path} to the end: {r.stderr.strip()}"
    return n_capinfos, len(r.stdout.split())


def check_devlogs_readable(paths: list[Path]) -> None:
    """Every device log QEMU wrote (its SHB names `tandem devlog`) is read to the end by
    Wireshark's tools, which count as many packets as tandem counts records. Logs the
    tests damage on purpose, or that a killed QEMU left torn, are the readers' tests'."""
    for path in paths:
        with open(path, "rb") as f:
            if b"tandem devlog" not in f.read(256):
                continue
        try:
            log = pcapng.read_devlog(path)
        except BundleError:
            continue
        if log.torn_at is not None:
            continue
        assert wireshark_counts(path) == (sum(log.records),) * 2, path


def console(bundle_path: Path) -> bytes:
    """What a recording's guest wrote on its serial console, from its device log."""
    from tandem.formats import bundle, pcapng
    return b"".join(e.data for e in pcapng.DevlogReader(Path(bundle_path) / bundle.DEVLOG)
                    if e.kind == "serial" and e.direction == "out")

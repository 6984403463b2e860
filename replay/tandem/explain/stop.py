"""The client of the tandem-stop plugin (replay/plugins/tandem-stop.c): an exact replay's
vCPU stopped at a window's instruction, its registers and memory read while it waits, and
runs on to the next instruction asked for."""
from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import InfraError


class StopError(InfraError):
    """The stopped replay did not answer as the plugin's protocol says."""


@dataclass(frozen=True)
class Stop:
    """Where the replay's vCPU stopped: the instruction about to run, the instructions
    executed before it, and the VM time."""
    pc: int
    icount: int
    vm_ns: int


class StopClient:
    """One connection to the plugin: connect() waits for QEMU to create the socket (it
    does so as it loads the plugin); first() waits until the vCPU reaches the window."""

    def __init__(self, path: Path):
        self.path = path
        self.sock: socket.socket | None = None
        self.buf = b""

    def connect(self, timeout: float, alive=lambda: True) -> None:
        deadline = time.monotonic() + timeout
        while True:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(str(self.path))
                self.sock = s
                return
            except (FileNotFoundError, ConnectionRefusedError):
                s.close()
                if time.monotonic() > deadline or not alive():
                    raise StopError(f"{self.path}: the replay's tandem-stop plugin never listened "
                                    f"(QEMU did not start, or did not load the plugin)") from None
                time.sleep(0.05)

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    # --- the protocol --------------------------------------------------------------

    def _recv(self) -> bool:
        assert self.sock is not None
        try:
            data = self.sock.recv(1 << 16)
        except ConnectionResetError:     # QEMU exited with the connection still queued
            return False
        if not data:
            return False
        self.buf += data
        return True

    def _line(self) -> str | None:
        while b"\n" not in self.buf:
            if not self._recv():
                return None
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode("ascii", errors="replace")

    def _bytes(self, n: int) -> bytes:
        while len(self.buf) < n:
            if not self._recv():
                raise StopError(f"{self.path}: the replay ended in the middle of a memory read")
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def _send(self, line: str) -> None:
        assert self.sock is not None, "not connected"
        try:
            self.sock.sendall(line.encode("ascii") + b"\n")
        except OSError as e:
            raise StopError(f"{self.path}: the stopped replay is gone ({e})") from None

    def _stop(self) -> Stop | None:
        """The next "stop" line, or None once the replay has run to its end (the socket closed)."""
        line = self._line()
        if line is None:
            return None
        parts = line.split()
        if len(parts) != 4 or parts[0] != "stop":
            raise StopError(f"{self.path}: expected 'stop PC ICOUNT VM_NS', got {line[:80]!r}")
        return Stop(int(parts[1], 16), int(parts[2]), int(parts[3]))

    def first(self) -> Stop | None:
        """The first stop: the window's entry at or after the VM time asked for, or None when
        the replay ended without reaching it."""
        return self._stop()

    def regs(self) -> dict[str, int]:
        """Every register the vCPU's gdbstub describes, by its gdb name, as an integer."""
        self._send("regs")
        head = self._line() or ""
        if not head.startswith("ok "):
            raise StopError(f"{self.path}: regs: {head[:80]!r}")
        out = {}
        for _ in range(int(head[3:])):
            line = self._line()
            if line is None:
                raise StopError(f"{self.path}: the replay ended in the middle of a register read")
            name, _, value = line.partition(" ")
            out[name] = int.from_bytes(bytes.fromhex(value), "little") if value else 0
        return out

    def mem(self, addr: int, n: int) -> bytes | None:
        """n bytes of guest virtual memory at addr, or None where the guest has no mapping."""
        self._send(f"mem {addr:x} {n}")
        head = self._line() or ""
        if head == "fault":
            return None
        if not head.startswith("ok "):
            raise StopError(f"{self.path}: mem: {head[:80]!r}")
        return self._bytes(int(head[3:]))

    def go(self, targets: list[tuple[int, int]]) -> Stop | None:
        """Run on until an instruction of the window at one of the (pc, rsp) targets (rsp 0:
        any); its Stop, or None when the replay ran to its end first."""
        self._send("go " + " ".join(f"{pc:x} {sp:x}" for pc, sp in targets))
        return self._stop()

    def arm(self, entry: int, size: int, after_ns: int) -> Stop | None:
        """Watch [entry, entry+size) too (code the replay has not run yet: a module's) and run
        on to entry's first execution at after_ns or later; its Stop, or None at the end."""
        self._send(f"arm {entry:x} {size} {after_ns}")
        return self._stop()

    def detach(self) -> None:
        """Let the replay run to its end unwatched."""
        if self.sock is None:
            return
        try:
            self._send("detach")
            self._line()
        except StopError:
            pass
        self.close()

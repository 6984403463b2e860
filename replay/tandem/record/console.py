"""The recorded VM's serial console for the user, as `virsh console` gives a domain's:
`tandem console BUNDLE` while `record`, `shadow` or `attach` runs.

QEMU's socket chardev takes one client, and tandem is it (it types the demo guest's
commands and watches the console). So the recording process serves the console again on
a unix socket of its own, ConsoleServer: every byte a client sends goes to the guest's
serial port, where QEMU records it as serial input like any other (the device log and
the replay stream: an exact replay types it at the same instruction, a semantic replay
delivers it at its VM time); every byte the guest writes goes to every client.

The socket is found from the bundle's path alone (console_socket): a short path in a
0700 directory of this user's, since a unix socket path is limited to 108 bytes and a
bundle may be anywhere, and nothing is added to the bundle itself.
"""
from __future__ import annotations

import hashlib
import logging
import os
import socket
import tempfile
import threading
from pathlib import Path

from .. import private
from ..errors import TandemError

log = logging.getLogger(__name__)

ESCAPE = b"\x1d"            # ^] (Ctrl + ]), as virsh console and telnet have it
ESCAPE_NAME = "^] (Ctrl + ])"


def console_socket(bundle_dir: str | os.PathLike[str]) -> Path:
    """Where the recording of bundle_dir serves its console: $XDG_RUNTIME_DIR (or the temp
    directory)/tandem-UID/console-HASH.sock, HASH from the bundle's absolute path."""
    base = Path(os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()) / f"tandem-{os.getuid()}"
    digest = hashlib.sha256(os.fsencode(Path(bundle_dir).resolve())).hexdigest()[:16]
    return base / f"console-{digest}.sock"


class ConsoleServer:
    """Serve a serial console (qemu.vm.Serial) on console_socket(bundle_dir) until close().

    Clients may come and go; each gets what the guest writes from when it connects (and
    the last CONTEXT bytes before, so a prompt already printed is seen)."""

    CONTEXT = 2048

    def __init__(self, serial, bundle_dir: str | os.PathLike[str]):
        self.serial = serial
        self.path = console_socket(bundle_dir)
        private.make_dir(self.path.parent)
        private.require_private_dir(self.path.parent, f"the console of {bundle_dir}")
        self.path.unlink(missing_ok=True)
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.bind(str(self.path))
        self.sock.listen(4)
        self.clients: list[socket.socket] = []
        self.lock = threading.Lock()
        self.closed = False
        serial.add_listener(self._from_guest)
        threading.Thread(target=self._accept, daemon=True, name="console-accept").start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            # A client that cannot take the guest's output within a second is dropped: the
            # serial reader (tandem's own console watching) must never wait on a terminal.
            conn.settimeout(1.0)
            try:
                conn.sendall(self.serial.output()[-self.CONTEXT:])
            except OSError:
                conn.close()
                continue
            with self.lock:
                self.clients.append(conn)
            threading.Thread(target=self._to_guest, args=(conn,), daemon=True, name="console-client").start()

    def _to_guest(self, conn: socket.socket) -> None:
        """What one client types, to the guest's serial port as it comes."""
        while True:
            try:
                data = conn.recv(4096)
            except TimeoutError:        # the send timeout is the receive's too: nothing typed
                continue
            except OSError:
                data = b""
            if not data:
                break
            try:
                self.serial.write(data)
            except OSError as e:        # the VM has gone: nothing left to type into
                log.debug("console: the serial socket is closed (%s)", e)
                break
        self._drop(conn)

    def _from_guest(self, data: bytes) -> None:
        with self.lock:
            clients = list(self.clients)
        for conn in clients:
            try:
                conn.sendall(data)
            except OSError:
                self._drop(conn)

    def _drop(self, conn: socket.socket) -> None:
        with self.lock:
            if conn in self.clients:
                self.clients.remove(conn)
        conn.close()

    def close(self) -> None:
        """Stop serving: clients see the end of the console (the VM has stopped)."""
        self.closed = True
        self.serial.remove_listener(self._from_guest)
        try:
            # shutdown() first: close() alone does not wake the accept() of _accept's
            # thread, which would then wait for ever on a socket nobody can reach.
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.sock.close()
        finally:
            self.path.unlink(missing_ok=True)
            with self.lock:
                clients, self.clients = self.clients, []
            for conn in clients:
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                conn.close()


def connect(bundle_dir: str | os.PathLike[str]) -> socket.socket:
    """A connection to the console of the recording of bundle_dir; a one-line error when
    none is running."""
    path = console_socket(bundle_dir)
    if not Path(bundle_dir).is_dir():
        raise TandemError(f"{bundle_dir}: no such recording bundle")
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(str(path))
    except (FileNotFoundError, ConnectionRefusedError):
        s.close()
        raise TandemError(f"{bundle_dir}: no recording of it is running here (tandem record, shadow or attach "
                          f"serves its console while it runs)") from None
    except OSError as e:
        s.close()
        raise TandemError(f"{bundle_dir}: cannot connect to its console {path}: {e.strerror}") from None
    return s

"""Taps in a network namespace of their own, for QEMU to take by descriptor (-netdev
tap,fd=N): the NIC of a replay whose recording ran on a tap (libvirt/command_line.py).

virtio-net shows the guest the offloads of a backend with a virtio-net header, and only a
tap has one among the backends of tandem's QEMU; a replay's frames come from its log, so
its tap must reach no network. A helper process unshares a network namespace (and a user
namespace when not root: the first process of one has CAP_NET_ADMIN in it), makes the
taps there and hands their descriptors back over a socket pair. An open tap keeps its
namespace alive; when the last descriptor closes, both go. Nothing touches the host's
network, and QEMU itself stays in the host's namespace (its gdb stub and sockets where
tandem reaches them).
"""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Iterator

from ..errors import InfraError

# Runs in a fresh interpreter: unshare(2) of a user namespace needs a single-threaded process.
HELPER = r"""
import ctypes, fcntl, os, socket, struct, sys
CLONE_NEWNET, CLONE_NEWUSER = 0x40000000, 0x10000000
TUNSETIFF, IFF_TAP, IFF_NO_PI, IFF_VNET_HDR = 0x400454CA, 0x0002, 0x1000, 0x4000
libc = ctypes.CDLL(None, use_errno=True)
if libc.unshare(CLONE_NEWNET | (0 if os.geteuid() == 0 else CLONE_NEWUSER)) != 0:
    sys.exit("unshare: " + os.strerror(ctypes.get_errno()))
fds = []
for i in range(int(sys.argv[2])):
    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_CLOEXEC)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", b"tandem%d" % i, IFF_TAP | IFF_NO_PI | IFF_VNET_HDR))
    fds.append(fd)
socket.send_fds(socket.socket(fileno=int(sys.argv[1])), [b"taps"], fds)
"""


@contextlib.contextmanager
def private_taps(n: int) -> Iterator[tuple[int, ...]]:
    """n taps (tandem0, tandem1, ...) in a network namespace of their own, as descriptors
    this process holds until the context ends; an InfraError saying why if the host
    cannot make them (no /dev/net/tun, user namespaces disabled)."""
    if n == 0:
        yield ()
        return
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    fds: list[int] = []
    try:
        with mine, theirs:
            r = subprocess.run([sys.executable, "-c", HELPER, str(theirs.fileno()), str(n)], pass_fds=(theirs.fileno(),),
                               capture_output=True, text=True, timeout=30)
            if r.returncode != 0:
                raise InfraError(f"a tap in a network namespace of its own: {(r.stderr.strip().splitlines() or ['?'])[-1]}")
            mine.settimeout(5)
            _, fds, _, _ = socket.recv_fds(mine, 16, n)
        if len(fds) != n:
            raise InfraError(f"a tap in a network namespace of its own: {len(fds)} of {n} made")
        yield tuple(fds)
    finally:
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)

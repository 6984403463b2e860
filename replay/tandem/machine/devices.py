"""The devices of a machine as the guest sees them, each checked when made, so a device
that exists is one QEMU can be given (machine/options.py builds their options)."""
from __future__ import annotations

from dataclasses import dataclass

from .options import (
    NIC_DEVICES,
    VIRTIO_NET,
    OptionError,
    Value,
    check_id,
    check_mac,
    json_option,
)

DISK_FORMATS = ("raw", "qcow2")
FORWARD_PROTOCOLS = ("tcp", "udp")


@dataclass(frozen=True)
class Disk:
    """One disk as the guest sees it: a base image every run writes through a qcow2 overlay
    of its own (the base is never written), on virtio-blk. Checked when made."""
    base: str                   # the image (path); the manifest names it with its hash
    format: str = "raw"         # of the base image
    id: str = "disk0"           # the drive id (the device log logs this drive)

    def __post_init__(self) -> None:
        check_id(self.id, "drive id")
        if self.format not in DISK_FORMATS:
            raise OptionError(f"disk format {self.format!r}: tandem takes {' or '.join(DISK_FORMATS)}")
        if not isinstance(self.base, str) or not self.base or "\0" in self.base:
            raise OptionError(f"disk image {self.base!r}: not a file path")


@dataclass(frozen=True)
class Nic:
    """One NIC as the guest sees it: QEMU device model and MAC, on netdev `netdev`.
    Checked when made, so a NIC that exists is one QEMU can be given."""
    netdev: str = "net0"
    model: str = VIRTIO_NET
    mac: str | None = None

    def __post_init__(self) -> None:
        check_id(self.netdev, "netdev id")
        if self.model not in NIC_DEVICES:
            raise OptionError(f"NIC model {self.model!r}: tandem's QEMU has "
                              f"{', '.join(sorted(NIC_DEVICES))} (qemu-patches/0001)")
        check_mac(self.mac)

    def device(self, *, deterministic_tx: bool = False) -> str:
        """Its -device. deterministic_tx (analysis runs, virtio-net only): transmit from a
        VM-clock timer and take queue kicks in the vCPU thread, so frames leave at the same
        VM time in every run."""
        props: dict[str, Value] = {"driver": self.model, "netdev": self.netdev, "romfile": ""}
        if deterministic_tx and self.model == VIRTIO_NET:
            props.update(tx="timer", ioeventfd=False)
        if self.mac:
            props["mac"] = self.mac
        return json_option(props)


@dataclass(frozen=True)
class Forward:
    """A host port forwarded to a guest port by QEMU's user networking (slirp's hostfwd):
    `tcp:8080:80` is host 127.0.0.1:8080 to the guest's port 80. Bound to the loopback
    address only: a recorded guest's services are not for the host's network."""
    protocol: str
    host_port: int
    guest_port: int
    host_addr: str = "127.0.0.1"

    def __post_init__(self) -> None:
        if self.protocol not in FORWARD_PROTOCOLS:
            raise OptionError(f"forward protocol {self.protocol!r}: {' or '.join(FORWARD_PROTOCOLS)}")
        for what, port in (("host", self.host_port), ("guest", self.guest_port)):
            if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
                raise OptionError(f"forward {self.protocol}: {what} port {port!r} is not a port (1-65535)")

    @classmethod
    def parse(cls, text: str) -> "Forward":
        """`tcp:HOSTPORT:GUESTPORT` or `udp:HOSTPORT:GUESTPORT` (tandem record --forward)."""
        parts = text.split(":")
        if len(parts) != 3 or not all(p.isdigit() and len(p) <= 5 for p in parts[1:]):
            raise OptionError(f"forward {text!r}: not PROTOCOL:HOSTPORT:GUESTPORT (e.g. tcp:8080:80)")
        return cls(parts[0], int(parts[1]), int(parts[2]))

    def __str__(self) -> str:
        return f"{self.protocol}:{self.host_port}:{self.guest_port}"

    def hostfwd(self) -> str:
        """slirp's hostfwd rule: PROTOCOL:HOSTADDR:HOSTPORT-:GUESTPORT."""
        return f"{self.protocol}:{self.host_addr}:{self.host_port}-:{self.guest_port}"

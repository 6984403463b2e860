"""A private libvirtd for tandem's domains, and connections to libvirt.

The libvirt Python binding is loaded on first use (`binding()`), so that everything
that never touches libvirt runs without it; its errors are tandem's one-line errors.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from .. import private
from ..errors import InfraError, TandemError
from ..lifecycle import Lifecycle
from ..qemu.vm import alive


def binding():
    """The libvirt Python binding, loaded on first use."""
    try:
        import libvirt
    except ImportError:
        raise InfraError("the libvirt Python binding is missing (run ./tandem setup)") from None
    # libvirt prints every error to stderr by default; tandem reports them itself.
    libvirt.registerErrorHandler(lambda *_: None, None)
    return libvirt


def connect(uri: str | None = None):
    """A read-write connection to libvirt at uri (default: libvirt's own default)."""
    libvirt = binding()
    try:
        return libvirt.open(uri)
    except libvirt.libvirtError as e:
        raise InfraError(f"libvirt {uri or '(default URI)'}: {e.get_error_message()}") from None


LIBVIRTD_CONF = """\
unix_sock_dir = "{sock}"
unix_sock_group = "root"
unix_sock_ro_perms = "0700"
unix_sock_rw_perms = "0700"
unix_sock_admin_perms = "0700"
auth_unix_ro = "none"
auth_unix_rw = "none"
log_outputs = "3:file:{log}/libvirtd.log"
"""

# QEMU runs as root with tandem's files where they are: no ownership changes, no
# security labels, no per-domain /dev namespace or cgroups (none of which a private
# daemon may assume it can set up), and no seccomp sandbox tandem's own runs lack.
QEMU_CONF = """\
user = "root"
group = "root"
dynamic_ownership = 0
remember_owner = 0
security_driver = "none"
namespaces = [ ]
cgroup_controllers = [ ]
seccomp_sandbox = 0
"""

# Debian's libvirt-daemon-config-network's /etc/libvirt/qemu/networks/default.xml.
DEFAULT_NETWORK = """\
<network>
  <name>default</name>
  <forward mode='nat'/>
  <bridge name='virbr0' stp='on' delay='0'/>
  <ip address='192.168.122.1' netmask='255.255.255.0'>
    <dhcp>
      <range start='192.168.122.2' end='192.168.122.254'/>
    </dhcp>
  </ip>
</network>
"""

VIRTLOGD_CONF = """\
log_outputs = "3:file:{log}/virtlogd.log"
"""

# Run inside a new mount namespace: libvirtd as root always uses /etc/libvirt,
# /run/libvirt and /var/{lib,log,cache}/libvirt (paths fixed at build time; only an
# unprivileged daemon takes XDG_* directories). So the namespace sees DIR/run as /run,
# and /etc and /var as overlays whose writes land in DIR; the host's files are only
# read. libvirtd also resolves its built-in QEMU user before reading qemu.conf: that
# user is added to the overlay's /etc/passwd, never to the host's.
LAUNCH = r"""
set -e
D=$1
mount --bind "$D/run" /run
mount -t overlay tandem-libvirt -o "lowerdir=/etc,upperdir=$D/etc,workdir=$D/.etc-work" /etc
mount -t overlay tandem-libvirt -o "lowerdir=/var,upperdir=$D/var,workdir=$D/.var-work" /var
for f in passwd group; do
  grep -q '^libvirt-qemu:' /etc/$f || echo "libvirt-qemu:x:64055:$([ $f = passwd ] && echo '64055:libvirt:/var/lib/libvirt:/usr/sbin/nologin')" >> /etc/$f
  grep -q '^libvirt-dnsmasq:' /etc/$f || echo "libvirt-dnsmasq:x:64056:$([ $f = passwd ] && echo '64056:libvirt:/var/lib/libvirt/dnsmasq:/usr/sbin/nologin')" >> /etc/$f
done
[ "$2" = netns ] && ip link set lo up
virtlogd -f "$D/virtlogd.conf" -p /run/virtlogd.pid &
libvirtd -f "$D/libvirtd.conf" -p /run/libvirtd.pid &
wait
"""


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


class Libvirtd(Lifecycle):
    """libvirtd and virtlogd with every file under dir, for tests and for hosts without
    a system libvirtd. Nothing of the host's libvirt is used or changed: config, sockets,
    state, logs and the domains' files are all under dir; close() ends the daemons and the
    domains they started and removes dir.

        with Libvirtd(tmp / "libvirt") as d:
            conn = connect(d.uri)          # or: virsh -c "$URI" list

    netns: the daemons in a network namespace of their own too, with libvirt's `default`
    network started there (tests: a NAT network and its DHCP that touch nothing of the
    host's; run_in_netns reaches the guests on it).
    """

    SHADOWED = ("/etc", "/var", "/run")    # the namespace's own views of these
    OWN = ("etc/libvirt", "var/lib/libvirt", "var/log/libvirt", "var/cache/libvirt")  # only ours in there

    def __init__(self, dir: str | Path, *, netns: bool = False):
        self.dir = Path(dir).absolute()
        self.netns = netns
        self.proc: subprocess.Popen | None = None
        self.mntns: str | None = None

    @property
    def started(self) -> bool:
        return self.proc is not None

    @property
    def socket(self) -> Path:
        return self.dir / "sock" / "libvirt-sock"

    @property
    def uri(self) -> str:
        return f"qemu+unix:///system?socket={self.socket}"

    @property
    def log_dir(self) -> Path:
        return self.dir / "log"

    def qemu_log(self, domain: str) -> Path:
        """Where libvirt's QEMU log of a domain lands (written in the namespace's /var)."""
        return self.dir / "var" / "log" / "libvirt" / "qemu" / f"{domain}.log"

    def start(self, timeout: float = 30.0) -> Libvirtd:
        if os.geteuid() != 0:
            raise TandemError("a private libvirtd needs root (it runs QEMU as root in a mount namespace)")
        for tool in ("libvirtd", "virtlogd", "unshare"):
            if not shutil.which(tool) and not Path("/usr/sbin", tool).exists():
                raise InfraError(f"{tool}: not installed (run ./tandem setup)")
        for top in self.SHADOWED:
            if self.dir == Path(top) or Path(top) in self.dir.parents:
                raise TandemError(f"{self.dir}: a private libvirtd's directory cannot be under {top} "
                                  f"(the daemon sees its own {top})")
        if len(str(self.socket)) > 107:
            raise TandemError(f"{self.socket}: too long for a unix socket path (max 107 bytes)")
        if self.dir.exists() and any(self.dir.iterdir()):
            raise TandemError(f"{self.dir}: not empty (a private libvirtd starts in an empty directory)")
        for sub in ("run", ".etc-work", ".var-work", "sock", "log", *self.OWN):
            private.make_dir(self.dir / sub)
        # Opaque in the overlays: a host with a system libvirt has domains, networks and
        # state in these, which this daemon must neither see nor autostart.
        for sub in self.OWN:
            os.setxattr(self.dir / sub, "trusted.overlay.opaque", b"y")
        (self.dir / "libvirtd.conf").write_text(LIBVIRTD_CONF.format(sock=self.socket.parent, log=self.log_dir))
        (self.dir / "virtlogd.conf").write_text(VIRTLOGD_CONF.format(log=self.log_dir))
        (self.dir / "etc/libvirt/qemu.conf").write_text(QEMU_CONF)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("LIBVIRT_", "VIRSH_"))}
        env["PATH"] = env.get("PATH", "/usr/bin:/bin") + ":/usr/sbin:/sbin"
        with open(self.log_dir / "daemons.out", "wb") as out:
            self.proc = subprocess.Popen(
                ["unshare", "--mount", *(["--net"] if self.netns else []), "--propagation", "private", "--",
                 "sh", "-c", LAUNCH, "sh", str(self.dir), "netns" if self.netns else ""],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        libvirt = binding()
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                msg = self._log_tail()
                self._cleanup()
                raise InfraError(f"private libvirtd exited at start (status {self.proc.returncode}): {msg}")
            if self.socket.exists():
                try:
                    libvirt.open(self.uri).close()
                    break
                except libvirt.libvirtError:
                    pass
            if time.monotonic() > deadline:
                msg = self._log_tail()
                self.close()
                raise InfraError(f"private libvirtd did not answer on {self.socket} within {timeout:.0f}s: {msg}")
            time.sleep(0.1)
        self.mntns = os.readlink(f"/proc/{self.proc.pid}/ns/mnt")
        if self.netns:
            self._default_network()
        return self

    def _default_network(self) -> None:
        """libvirt's `default` network as Debian's libvirt-daemon-config-network defines
        it (NAT, virbr0, 192.168.122.0/24 with DHCP), started: in the daemon's own network
        namespace, so its bridge, dnsmasq and NAT rules touch nothing of the host's."""
        libvirt = binding()
        conn = libvirt.open(self.uri)
        try:
            net = conn.networkDefineXML(DEFAULT_NETWORK)
            net.create()
        except libvirt.libvirtError as e:
            msg = self._log_tail()
            self.close()
            raise InfraError(f"private libvirtd: its default network did not start: "
                             f"{e.get_error_message()} ({msg})") from None
        finally:
            conn.close()

    @property
    def netns_path(self) -> str:
        """The daemons' network namespace (netns=True), as nsenter --net takes it."""
        if not self.netns or self.proc is None:
            raise TandemError("this private libvirtd has no network namespace of its own")
        return f"/proc/{self.proc.pid}/ns/net"

    def run_in_netns(self, argv: list[str], **kw) -> subprocess.CompletedProcess:
        """subprocess.run(argv, **kw) in the daemon's network namespace (netns=True), where
        its domains' networks are: how a client reaches a guest on `default`."""
        return subprocess.run(["nsenter", f"--net={self.netns_path}", "--", *argv], **kw)

    def pids(self) -> dict[str, int]:
        """{'libvirtd': pid, 'virtlogd': pid} of the running daemons."""
        out = {}
        for name in ("libvirtd", "virtlogd"):
            try:
                out[name] = int((self.dir / "run" / f"{name}.pid").read_text().split()[0])
            except (OSError, ValueError, IndexError):
                pass
        return out

    def processes(self) -> list[int]:
        """Every process in the daemons' mount namespace: the daemons, their helpers and
        the QEMU of each running domain (libvirt daemonizes QEMU out of our process group)."""
        if not self.mntns:
            return []
        found = []
        for p in Path("/proc").iterdir():
            if p.name.isdigit():
                try:
                    if os.readlink(p / "ns" / "mnt") == self.mntns:
                        found.append(int(p.name))
                except OSError:
                    pass
        return found

    def others(self) -> list[int]:
        """processes() less the daemons, their launcher and the networks' dnsmasq (netns):
        the domains' QEMU, mostly."""
        ours = set(self.pids().values()) | ({self.proc.pid} if self.proc else set())
        return [p for p in self.processes() if p not in ours and _comm(p) != "dnsmasq"]

    def close(self, timeout: float = 20.0) -> None:
        """Destroy the running domains, end the daemons, remove the directory."""
        if self.proc is None:
            return
        libvirt = binding()
        if self.proc.poll() is None:
            try:
                conn = libvirt.open(self.uri)
                for dom in conn.listAllDomains(libvirt.VIR_CONNECT_LIST_DOMAINS_ACTIVE):
                    try:
                        dom.destroy()
                    except libvirt.libvirtError:
                        pass
                conn.close()
            except libvirt.libvirtError:
                pass
            # libvirtd first: virtlogd keeps QEMU's logs until libvirtd lets go of them.
            for name in ("libvirtd", "virtlogd"):
                pid = self.pids().get(name)
                if pid and pid in self.processes():     # never a stale pid file's reused pid
                    self._end(pid, timeout / 2)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        # Whatever the daemons left running in their namespace (a QEMU libvirt could not
        # destroy) is ours: end it by pid. Then the namespace and its mounts are gone.
        for pid in self.processes():
            self._end(pid, 5.0)
        self._cleanup()
        self.proc = None

    def _end(self, pid: int, timeout: float) -> None:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not alive(pid):
                return
            time.sleep(0.05)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        while alive(pid):
            time.sleep(0.05)

    def _log_tail(self, n: int = 600) -> str:
        text = ""
        for name in ("daemons.out", "libvirtd.log"):
            try:
                text += (self.log_dir / name).read_text(errors="replace")
            except OSError:
                pass
        return " | ".join(text.strip()[-n:].splitlines())

    def _cleanup(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

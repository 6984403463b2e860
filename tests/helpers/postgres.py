"""A private PostgreSQL cluster for the farm's tests: Debian's server (its binaries are off
PATH, in /usr/lib/postgresql/VERSION/bin, found through tandem/setup/programs.py), made
by initdb in a temporary directory and listening only on a unix socket there, so it
touches no cluster of the host's and no TCP port; stopped and removed at the end.

The server refuses to run as root, and the suite runs as root on CI: it runs as
`nobody` (setpriv), in a directory of its own under /tmp, because pytest's temporary
directories are under a root-only directory that nobody cannot enter.
"""
from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

from tandem.setup import programs

USER = "farm"       # the cluster's superuser; trust authentication on its socket alone


class Cluster:
    def __init__(self, base: Path):
        self.base = base
        self.data = base / "data"
        self.log = base / "server.log"

    def url(self, db: str) -> str:
        """The SQLAlchemy URL of a database of this cluster, through its socket."""
        return f"postgresql+psycopg://{USER}@/{db}?host={self.base}"

    def create_database(self) -> str:
        """A new, empty database of this cluster; its URL."""
        import psycopg
        name = "t_" + uuid.uuid4().hex[:12]
        with psycopg.connect(host=str(self.base), user=USER, dbname="postgres", autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)


def _as_nobody(*argv: str) -> subprocess.CompletedProcess:
    r = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", *argv],
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise AssertionError(f"{Path(argv[0]).name} failed ({r.returncode}): {r.stderr.strip() or r.stdout.strip()}")
    return r


@contextlib.contextmanager
def private_cluster() -> Iterator[Cluster]:
    """A running cluster (fsync off: a test's data need not survive a crash of the host)."""
    initdb, pg_ctl = programs.require("initdb"), programs.require("pg_ctl")
    base = Path(tempfile.mkdtemp(prefix="tandem-pg-"))
    shutil.chown(base, "nobody", "nogroup")
    cluster = Cluster(base)
    try:
        _as_nobody(initdb, "-D", str(cluster.data), "-U", USER, "--auth=trust", "-E", "UTF8", "--no-sync")
        _as_nobody(pg_ctl, "-D", str(cluster.data), "-l", str(cluster.log), "-w", "-t", "60",
                   "-o", f"-k {base} -h '' -c fsync=off", "start")
        try:
            yield cluster
        finally:
            _as_nobody(pg_ctl, "-D", str(cluster.data), "-m", "immediate", "stop")
    finally:
        shutil.rmtree(base, ignore_errors=True)


"""The farm's memory: nights, their tasks and what each found, in a database that outlives
the farm process (SQLite by default, one file; any SQLAlchemy URL for a shared one, e.g.
PostgreSQL).

A task is stored by its parameters (the recording's identity, the analysis, the kernel
build, exact or not, which repeat), as the 0-day robot stores results: a rerun of the
same night finds what is done and does the rest, and two farms on one database cannot
both do a task, because a task is taken by one conditional UPDATE that only one of them
can win. Only the farm's own process writes here; Dask workers return results to it.
"""
from __future__ import annotations

import datetime
import os
import socket
import sqlite3
import time
import urllib.parse
import uuid
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from ..errors import InfraError

# A running farm touches its row this often; a task held by a farm silent for STALE_S is
# taken back (the farm was killed: its VMs died with its workers' tasks).
HEARTBEAT_S = 10
STALE_S = 60
# What a task ends as, worst first (KCIDB's order: a failure of the thing tested over a
# failure of the harness over a result missing over a pass).
STATUSES = ("finding", "divergence", "error", "skipped", "pass")
# The kernel column of a task that replays an analysis run's own recording exactly, to
# confirm that a new finding reproduces: not an analysis of the corpus.
CONFIRM = "confirm"

meta = sa.MetaData()
nights = sa.Table(
    "nights", meta,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("name", sa.String(64), nullable=False, unique=True),
    sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("finished_at", sa.DateTime(timezone=True)),
    sa.Column("qemu_build", sa.String(80)),
    sa.Column("tandem_version", sa.String(40)),
)
runs = sa.Table(
    "runs", meta,
    sa.Column("id", sa.String(36), primary_key=True),
    sa.Column("night_id", sa.ForeignKey("nights.id"), nullable=False),
    sa.Column("host", sa.String(255), nullable=False),
    sa.Column("pid", sa.Integer, nullable=False),
    sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False),
)
tasks = sa.Table(
    "tasks", meta,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("night_id", sa.ForeignKey("nights.id"), nullable=False),
    sa.Column("bundle", sa.Text, nullable=False),            # its path, as this night found it
    # its identity: the device log's sha256; a confirming replay's, the analysis run's
    # recording's path (unbounded: PostgreSQL, unlike SQLite, refuses a longer value)
    sa.Column("recording", sa.Text, nullable=False),
    sa.Column("analysis", sa.String(64), nullable=False),    # "exact" for the exact replay
    sa.Column("kernel", sa.String(80), nullable=False),      # the analysis kernel build's key ("-": none)
    sa.Column("repeat", sa.Integer, nullable=False),         # 0, then the confirming replays
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("reason", sa.Text),                            # an error's, or a skip's
    sa.Column("run_id", sa.String(36)),
    sa.Column("worker", sa.Text),
    sa.Column("attempts", sa.Integer, nullable=False, default=0),
    sa.Column("started_at", sa.DateTime(timezone=True)),
    sa.Column("finished_at", sa.DateTime(timezone=True)),
    sa.Column("replay_s", sa.Float),                         # the replay's wall time on its worker
    sa.Column("run_dir", sa.Text),                           # where its logs and recording are
    sa.UniqueConstraint("night_id", "recording", "analysis", "kernel", "repeat", name="one_task"),
)
findings = sa.Table(
    "findings", meta,
    sa.Column("id", sa.Integer, primary_key=True),
    sa.Column("task_id", sa.ForeignKey("tasks.id"), nullable=False, index=True),
    sa.Column("signature", sa.Text, nullable=False, index=True),   # the title, as syzbot merges crashes
    sa.Column("kind", sa.String(16), nullable=False),               # finding | divergence | exact
    sa.Column("title", sa.Text, nullable=False),
    sa.Column("report", sa.Text),
    sa.Column("input", sa.Text),            # the input it followed
    sa.Column("vm_s", sa.Float),            # the analysis VM's time of it
    sa.Column("recording", sa.Text),        # the analysis run's own recording: replays it exactly
    sa.Column("reproduced", sa.Boolean),    # that recording replayed exactly (None: not tried)
)


class StoreError(InfraError):
    """The farm's database cannot be opened or used."""


def url_of(db: str, base: Path = Path(".")) -> str:
    """An SQLAlchemy URL as given, or a file path made a SQLite URL."""
    if "://" in db:
        return db
    return "sqlite:///" + str((base / os.path.expanduser(db)).resolve())


def engine(url: str) -> Engine:
    """The database at url, its tables made if missing. SQLite waits up to 30 s for a lock
    another farm holds and writes through its WAL, so a reader never blocks the writer."""
    try:
        if url.startswith("sqlite:"):
            e = sa.create_engine(url, connect_args={"timeout": 30})
            sa.event.listen(e, "connect", _sqlite_pragmas)
        else:
            e = sa.create_engine(url, pool_pre_ping=True)
        _create_tables(e)
    except (sa.exc.SQLAlchemyError, ImportError, ValueError) as err:
        raise StoreError(f"farm database {_safe(url)}: {_first_line(err)}") from None
    return e


# The PostgreSQL advisory lock a farm holds while it makes the tables ("tandem" in ASCII).
SCHEMA_LOCK = 0x74616E64656D


def _create_tables(e: Engine) -> None:
    """The tables, made once however many farms open a new database at the same moment.
    create_all looks for each table and then makes it; two farms started together on a
    new database both find none and the second fails making one ("table nights already
    exists", or PostgreSQL's duplicate pg_type row). So the looking and the making are
    one transaction under a lock the other farm waits for: SQLite's write lock (BEGIN
    IMMEDIATE), PostgreSQL's advisory lock; the second then finds the tables."""
    with e.connect() as c:
        if e.dialect.name == "sqlite":
            c.exec_driver_sql("BEGIN IMMEDIATE")
        elif e.dialect.name == "postgresql":
            c.execute(sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": SCHEMA_LOCK})
        meta.create_all(c)
        c.commit()


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    # Turning a new file to WAL takes an exclusive lock that SQLite does not always wait
    # for: a farm opening the new file while another does got "database is locked" (one
    # opening in a few hundred, eight at once). Tried again for as long as the timeout.
    deadline = time.monotonic() + 30
    while True:
        try:
            cur.execute("PRAGMA journal_mode=WAL")
            break
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def _safe(url: str) -> str:
    """A URL for a message: its password hidden, its query as given (host=/run/x, not %2F)."""
    try:
        return urllib.parse.unquote(sa.engine.make_url(url).render_as_string(hide_password=True))
    except sa.exc.ArgumentError:
        return repr(url[:60])


def _first_line(err: BaseException) -> str:
    return (str(getattr(err, "orig", None) or err).strip().splitlines() or ["failed"])[0][:200]


def aware(t: datetime.datetime) -> datetime.datetime:
    """A time read back from SQLite, which keeps no zone: tandem writes UTC."""
    return t if t.tzinfo else t.replace(tzinfo=datetime.timezone.utc)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:     # another user's: alive
        return True
    return True


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


@dataclass(frozen=True)
class TaskKey:
    """What a task is: stored by these, found again by these."""
    bundle: str
    recording: str
    analysis: str
    kernel: str = "-"
    repeat: int = 0


@dataclass(frozen=True)
class Finding:
    signature: str
    kind: str
    title: str
    report: str | None = None
    input: str | None = None
    vm_s: float | None = None
    recording: str | None = None


@dataclass(frozen=True)
class Result:
    """What a task's replay gave, as a worker returns it."""
    status: str
    reason: str | None = None
    worker: str | None = None
    replay_s: float | None = None
    run_dir: str | None = None
    findings: tuple[Finding, ...] = ()


class Store:
    """One farm process's handle on the database: its night and its run."""

    def __init__(self, eng: Engine):
        self.engine = eng
        self.run_id = str(uuid.uuid4())
        self.night_id: int | None = None

    @contextmanager
    def _tx(self) -> Iterator[Connection]:
        try:
            with self.engine.begin() as c:
                yield c
        except sa.exc.OperationalError as err:
            raise StoreError(f"farm database {_safe(str(self.engine.url))}: {_first_line(err)}") from None

    def begin_night(self, name: str, qemu_build: str | None = None, version: str | None = None) -> int:
        """The night called name, made if new (a rerun continues it), and this run in it."""
        with self._tx() as c:
            row = c.execute(sa.select(nights.c.id).where(nights.c.name == name)).first()
        if row is None:
            try:
                with self._tx() as c:
                    c.execute(nights.insert().values(name=name, started_at=now(), qemu_build=qemu_build,
                                                     tandem_version=version))
            except sa.exc.IntegrityError:       # another farm made it first: the same night
                pass
            with self._tx() as c:
                row = c.execute(sa.select(nights.c.id).where(nights.c.name == name)).first()
        assert row is not None
        self.night_id = int(row.id)
        with self._tx() as c:
            c.execute(runs.insert().values(id=self.run_id, night_id=self.night_id, host=socket.gethostname(),
                                           pid=os.getpid(), started_at=now(), heartbeat_at=now()))
        return self.night_id

    def heartbeat(self) -> None:
        with self._tx() as c:
            c.execute(runs.update().where(runs.c.id == self.run_id).values(heartbeat_at=now()))

    def add_tasks(self, keys: Iterable[TaskKey], skipped: Mapping[TaskKey, str] | None = None) -> None:
        """Tasks of this night, each once however many farms add it; those in `skipped`
        stored done as skipped with its reason (an analysis that cannot analyse that
        recording), never run."""
        skipped = skipped or {}
        for k in keys:
            why = skipped.get(k)
            try:
                with self._tx() as c:
                    c.execute(tasks.insert().values(night_id=self.night_id, bundle=k.bundle, recording=k.recording,
                                                    analysis=k.analysis, kernel=k.kernel, repeat=k.repeat,
                                                    status="pending" if why is None else "skipped", reason=why,
                                                    attempts=0, finished_at=None if why is None else now()))
            except sa.exc.IntegrityError:
                continue

    def _dead_runs(self, c: Connection) -> list[str]:
        """Runs of this night that hold nothing any more: silent for STALE_S, or on this
        host with their process gone (a farm killed here is rerun here at once)."""
        stale = now() - datetime.timedelta(seconds=STALE_S)
        me = socket.gethostname()
        out = []
        for r in c.execute(sa.select(runs).where(runs.c.night_id == self.night_id).where(runs.c.id != self.run_id)):
            if aware(r.heartbeat_at) < stale or (r.host == me and not _alive(r.pid)):
                out.append(r.id)
        return out

    def _free(self, c: Connection) -> Any:
        """The condition of a task nobody is doing: pending, or held by a dead run."""
        return (tasks.c.status == "pending") | ((tasks.c.status == "running") & tasks.c.run_id.in_(self._dead_runs(c)))

    def open_tasks(self) -> list[tuple[int, TaskKey]]:
        """This night's tasks nobody is doing: pending, or held by a farm that is gone."""
        with self._tx() as c:
            q = sa.select(tasks).where(tasks.c.night_id == self.night_id).where(self._free(c)).order_by(tasks.c.id)
            return [(r.id, TaskKey(r.bundle, r.recording, r.analysis, r.kernel, r.repeat)) for r in c.execute(q)]

    def held_elsewhere(self) -> int:
        """Tasks of this night another live farm is doing (the night ends when they are done)."""
        with self._tx() as c:
            q = (sa.select(sa.func.count()).select_from(tasks).where(tasks.c.night_id == self.night_id)
                 .where(tasks.c.status == "running").where(tasks.c.run_id != self.run_id)
                 .where(tasks.c.run_id.not_in(self._dead_runs(c))))
            return int(c.execute(q).scalar() or 0)

    def claim(self, task_id: int) -> bool:
        """Take the task for this run; False if another farm holds it (one conditional
        UPDATE: of two farms, one changes the row and the other changes nothing)."""
        with self._tx() as c:
            q = tasks.update().where(tasks.c.id == task_id).where(self._free(c)).values(
                status="running", run_id=self.run_id, started_at=now(), attempts=tasks.c.attempts + 1)
            return c.execute(q).rowcount == 1

    def finish(self, task_id: int, result: Result) -> bool:
        """Store a task's result and its findings in one transaction, if this run still
        holds it; False (nothing written) if it was taken back meanwhile."""
        if result.status not in STATUSES:
            raise ValueError(f"status {result.status!r}")
        with self._tx() as c:
            done = c.execute(tasks.update().where(tasks.c.id == task_id).where(tasks.c.run_id == self.run_id)
                             .where(tasks.c.status == "running").values(
                                 status=result.status, reason=result.reason, worker=result.worker,
                                 replay_s=result.replay_s, run_dir=result.run_dir, finished_at=now()))
            if done.rowcount != 1:
                return False
            for f in result.findings:
                c.execute(findings.insert().values(task_id=task_id, signature=f.signature, kind=f.kind,
                                                   title=f.title, report=f.report, input=f.input, vm_s=f.vm_s,
                                                   recording=f.recording))
        return True

    def end_night(self) -> None:
        with self._tx() as c:
            c.execute(nights.update().where(nights.c.id == self.night_id).values(finished_at=now()))
            c.execute(runs.delete().where(runs.c.id == self.run_id))

    def confirm(self, recording: str, reproduced: bool) -> None:
        """Say whether the analysis run's own recording, replayed exactly, reproduced it."""
        with self._tx() as c:
            c.execute(findings.update().where(findings.c.recording == recording).values(reproduced=reproduced))

    def seen_before(self, signature: str, night_id: int) -> bool:
        """Whether the signature was found on a night that started before night_id's."""
        started = sa.select(nights.c.started_at).where(nights.c.id == night_id).scalar_subquery()
        q = (sa.select(sa.func.count()).select_from(findings.join(tasks).join(nights))
             .where(findings.c.signature == signature).where(nights.c.started_at < started))
        with self._tx() as c:
            return bool(c.execute(q).scalar())

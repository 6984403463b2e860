"""The farm's database on a real SQLite file and a real PostgreSQL (a private cluster,
READ COMMITTED as it ships): tasks stored by their parameters, taken by one farm only,
taken back from a farm gone silent, results and findings written together, the tables
made once by farms that open a new database at the same moment."""
from __future__ import annotations

import datetime

import pytest
import sqlalchemy as sa

from helpers import start_client
from tandem.farm import store
from tandem.farm.store import Finding, Result, Store, StoreError, TaskKey

KEYS = [TaskKey(f"/r/{r}.tdm", f"sha-{r}", a, "k1") for r in "abc" for a in ("kasan", "lockdep")]


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return store.url_of("f.sqlite", tmp_path)
    return request.getfixturevalue("postgres_url")


def farm(url: str, night: str = "n1") -> Store:
    s = Store(store.engine(url))
    s.begin_night(night)
    s.add_tasks(KEYS)
    return s


def test_tasks_are_stored_once_however_many_farms_add_them(url):
    a, b = farm(url), farm(url)
    assert a.night_id == b.night_id and len(a.open_tasks()) == len(KEYS)


def test_of_two_farms_one_takes_each_task(url):
    farms = [farm(url), farm(url)]
    won: list[list[int]] = [[], []]

    def take(i: int) -> None:
        for task_id, _ in farms[i].open_tasks():
            if farms[i].claim(task_id):
                won[i].append(task_id)

    threads = [start_client(lambda i=i: take(i), f"farm-{i}") for i in (0, 1)]
    for t in threads:
        t.join()
    with farms[0].engine.connect() as c:
        every = sorted(c.execute(sa.select(store.tasks.c.id)).scalars())
    assert sorted(won[0] + won[1]) == every and not set(won[0]) & set(won[1])


def test_a_result_and_its_findings_are_written_by_the_farm_that_holds_the_task(url):
    a, b = farm(url), farm(url)
    task_id, _ = a.open_tasks()[0]
    assert a.claim(task_id) and not b.claim(task_id)
    found = Finding("KASAN: use-after-free Read in f", "finding", "KASAN: use-after-free Read in f", "report")
    assert not b.finish(task_id, Result("finding", findings=(found,)))     # not b's
    assert a.finish(task_id, Result("finding", replay_s=4.5, findings=(found,)))
    assert not a.finish(task_id, Result("pass"))                            # done once
    with a.engine.connect() as c:
        assert c.execute(sa.select(sa.func.count()).select_from(store.findings)).scalar() == 1
        assert c.execute(sa.select(store.tasks.c.status).where(store.tasks.c.id == task_id)).scalar() == "finding"


def test_a_task_held_by_a_farm_gone_silent_is_taken_back(url):
    dead, alive = farm(url), farm(url)
    task_id, _ = dead.open_tasks()[0]
    assert dead.claim(task_id)
    assert task_id not in [t for t, _ in alive.open_tasks()]
    long_ago = store.now() - datetime.timedelta(seconds=store.STALE_S + 1)
    with dead.engine.begin() as c:
        c.execute(store.runs.update().where(store.runs.c.id == dead.run_id).values(heartbeat_at=long_ago))
    assert task_id in [t for t, _ in alive.open_tasks()] and alive.claim(task_id)
    assert not dead.finish(task_id, Result("pass"))     # its late result is not counted


def test_a_rerun_of_the_night_finds_what_is_done(url):
    first = farm(url)
    for task_id, _ in first.open_tasks()[:4]:
        assert first.claim(task_id) and first.finish(task_id, Result("pass"))
    assert len(farm(url).open_tasks()) == len(KEYS) - 4


def test_a_confirming_replay_is_stored_by_its_recording_s_path_however_long(url):
    """A confirming replay's recording is a path under the night's output (PostgreSQL
    refuses a value longer than its column, where SQLite stores it anyway)."""
    s = farm(url)
    path = "/srv/farm/farm-out/n1/" + "task-12-kasan-r0/" * 20 + "kasan.tdm"
    s.add_tasks([TaskKey(path, path, "exact", store.CONFIRM)])
    assert [k for _, k in s.open_tasks() if k.kernel == store.CONFIRM] == [TaskKey(path, path, "exact", store.CONFIRM)]


def test_farms_opening_a_new_database_at_once_make_its_tables_once(url):
    """Without a lock around looking for the tables and making them, the second of two
    farms started together fails making one that the first just made."""
    errors: list[BaseException] = []
    made: list[Store] = []

    def open_it() -> None:
        try:
            made.append(farm(url))
        except StoreError as e:
            errors.append(e)

    threads = [start_client(open_it, f"farm-{i}") for i in range(4)]
    for t in threads:
        t.join()
    assert not errors and len({s.night_id for s in made}) == 1


def test_a_database_that_cannot_be_opened_is_one_line(tmp_path):
    with pytest.raises(StoreError, match="farm database") as e:
        store.engine(store.url_of(str(tmp_path / "no" / "such" / "dir" / "f.sqlite")))
    assert "\n" not in str(e.value)
    with pytest.raises(StoreError, match=r"farm database postgresql://u:\*\*\*@"):
        store.engine("postgresql://u:secret@127.0.0.1:1/x")
    # a server that is not there, through its socket: the URL as given, the password hidden
    gone = f"postgresql+psycopg://farm:secret@/farm?host={tmp_path}"
    with pytest.raises(StoreError, match=rf"farm database postgresql\+psycopg://farm:\*\*\*@/farm\?host={tmp_path}: ") as e:
        store.engine(gone)
    assert "secret" not in str(e.value) and "\n" not in str(e.value)
    # a driver that is not installed (as psycopg is not, in a venv made before it was required)
    with pytest.raises(StoreError, match=r"farm database postgresql\+pg8000://farm:\*\*\*@/farm: .*pg8000"):
        store.engine("postgresql+pg8000://farm:secret@/farm")

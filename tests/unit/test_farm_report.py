"""The farm's report over nights in a real SQLite file written through the farm's Store:
the nights `--since` keeps, the states the last night gives, and `farm report`'s flags as
a user gives them."""
from __future__ import annotations

import datetime
import json

import junitparser
import pytest
import sqlalchemy as sa

from helpers import assert_one_line_error, run_cli
from tandem.farm import report, store
from tandem.farm.night import Corpus, Guests, Target, plan
from tandem.farm.store import Finding, Result, Store, TaskKey

KEY = TaskKey("/r/a.tdm", "sha-a", "kasan", "k1")
UAF = Finding("KASAN: use-after-free Read in f", "finding", "KASAN: use-after-free Read in f", "report")


def night(url: str, name: str, days_ago: int, found: bool) -> None:
    """A night of one task, started days_ago, that found UAF or passed."""
    s = Store(store.engine(url))
    s.begin_night(name)
    s.add_tasks([KEY])
    (task_id, _), = s.open_tasks()
    assert s.claim(task_id)
    s.finish(task_id, Result("finding" if found else "pass", replay_s=10.0, findings=(UAF,) if found else ()))
    s.end_night()
    with s.engine.begin() as c:
        c.execute(store.nights.update().where(store.nights.c.name == name).values(
            started_at=store.now() - datetime.timedelta(days=days_ago)))
    s.engine.dispose()


@pytest.fixture
def db(tmp_path):
    url = store.url_of("farm.sqlite", tmp_path)
    for name, days, found in (("d10", 10, True), ("d5", 5, True), ("d2", 2, False), ("d1", 1, False)):
        night(url, name, days, found)
    return tmp_path / "farm.sqlite"


def test_since_keeps_the_nights_started_within_it_and_triage_reads_them_all(db):
    eng = store.engine(store.url_of(str(db)))
    week = store.now() - datetime.timedelta(days=7)
    v = report.view(eng, since=week, fixed_after=2)
    assert [n["name"] for n in v.nights] == ["d5", "d2", "d1"]
    # the night before the week still counts for the finding's history
    (sig,) = v.signatures
    assert (sig.state, sig.first_seen, sig.last_seen) == ("fixed", "d10", "d5")
    assert report.view(eng, fixed_after=3).signatures[0].state == "gone"
    assert report.view(eng, night="d5").signatures[0].state == "known"


def test_farm_report_since_as_a_user_gives_it(db, tmp_path):
    r = run_cli("farm", "report", "--db", str(db), "--out", str(tmp_path / "out"), "--since", "3d")
    assert r.returncode == 0, r.stderr
    view = json.loads((tmp_path / "out" / "d1" / "night.json").read_text())
    assert [n["name"] for n in view["nights"]] == ["d2", "d1"]


@pytest.mark.parametrize("since", ["7", "7y", "-1d", "99999d", "d"])
def test_a_since_that_is_not_a_duration_is_one_line(db, tmp_path, since):
    assert_one_line_error(run_cli("farm", "report", "--db", str(db), "--out", str(tmp_path), f"--since={since}"),
                          "--since", repr(since))


def test_a_report_of_a_missing_database_makes_none(tmp_path):
    missing = tmp_path / "none.sqlite"
    assert_one_line_error(run_cli("farm", "report", "--db", str(missing)), str(missing), "no such farm database")
    assert not missing.exists()


def test_nights_are_read_back_in_the_order_they_started(db):
    with sa.create_engine(f"sqlite:///{db}").connect() as c:
        names = [n for (n,) in c.execute(sa.text("select name from nights order by started_at"))]
    assert names == ["d10", "d5", "d2", "d1"]
    assert report.view(store.engine(store.url_of(str(db)))).night == "d1"


def test_an_analysis_that_does_not_apply_is_skipped_with_its_reason_never_run(tmp_path):
    """A kernel the user brings on a recording of the demo guest, an analysis that swaps the
    demo guest's userland on a recording of a user's VM: skipped tasks, shown as JUnit
    skips with the reason, never open to a farm."""
    demo, users = Corpus("/r/demo.tdm", "sha-d"), Corpus("/r/web.tdm", "sha-w", users_guest=True)
    targets = [Target("kasan", "k"), Target("mine", "user:1", "mine=/b/bzImage", guests=Guests.USERS),
               Target("asan", "a", guests=Guests.DEMO)]
    planned = plan([demo, users], targets, exact_build="q1")
    skipped = {(k.bundle, k.analysis): why for k, why in planned if why}
    assert set(skipped) == {("/r/demo.tdm", "mine"), ("/r/web.tdm", "asan")}
    assert "recordings of your own VMs" in skipped["/r/demo.tdm", "mine"]
    s = Store(store.engine(store.url_of("farm.sqlite", tmp_path)))
    s.begin_night("n1")
    s.add_tasks([k for k, _ in planned], {k: why for k, why in planned if why})
    assert {(k.bundle, k.analysis) for _, k in s.open_tasks()} == \
        {(b, a) for b in ("/r/demo.tdm", "/r/web.tdm") for a in ("exact", "kasan", "mine", "asan")} - set(skipped)
    path = report.write(report.view(s.engine), tmp_path / "out")["junit"]
    cases = {(c.classname, c.name): c.result for suite in junitparser.JUnitXml.fromfile(str(path)) for c in suite}
    (skip,) = cases["demo.tdm", "mine"]
    assert isinstance(skip, junitparser.Skipped) and "your own VMs" in skip.message


def test_an_analysis_of_another_guest_os_is_skipped():
    """A FreeBSD kernel on a Linux recording and a Linux kernel on a FreeBSD one are skipped
    tasks, a kernel the user brings of the OS its file says (on the FreeBSD demo guest
    it is skipped as on Linux's)."""
    linux, fb = Corpus("/r/demo.tdm", "sha-d", users_guest=True), Corpus("/r/fb.tdm", "sha-f", os="freebsd")
    users_fb = Corpus("/r/myvm.tdm", "sha-v", users_guest=True, os="freebsd")
    targets = [Target("kasan", "k"), Target("freebsd-kasan", "fk", os="freebsd"),
               Target("mine", "user:1", "mine=/b/bzImage", guests=Guests.USERS),
               Target("mybsd", "user:2", "mybsd=/b/kernel", guests=Guests.USERS, os="freebsd")]
    skipped = {(k.bundle, k.analysis): why for k, why in plan([linux, fb, users_fb], targets, None) if why}
    assert skipped == {("/r/demo.tdm", "freebsd-kasan"): "freebsd-kasan: a freebsd kernel, and the recording is of a "
                                                          "linux guest",
                       ("/r/demo.tdm", "mybsd"): "mybsd: a freebsd kernel, and the recording is of a linux guest",
                       ("/r/fb.tdm", "kasan"): "kasan: a linux kernel, and the recording is of a freebsd guest",
                       ("/r/fb.tdm", "mine"): f"mine: {Guests.USERS.value}",
                       ("/r/fb.tdm", "mybsd"): f"mybsd: {Guests.USERS.value}",
                       ("/r/myvm.tdm", "kasan"): "kasan: a linux kernel, and the recording is of a freebsd guest",
                       ("/r/myvm.tdm", "mine"): "mine: a linux kernel, and the recording is of a freebsd guest"}

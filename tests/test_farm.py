"""The replay farm on real VMs and a real Dask: a night over recordings x analyses into a
real SQLite database, read back as its reports say it; a night killed half-way and run
again finishes only what was missing."""
from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import junitparser
import pytest

from helpers import ROOT, record_demo, run_cli, wait_until

ANALYSES = ("kasan", "lockdep")


@pytest.fixture(scope="module")
def corpus(built, tmp_path_factory) -> list[Path]:
    """Three recordings of the demo guest (different lengths of traffic)."""
    base = tmp_path_factory.mktemp("corpus")
    return [record_demo(base / f"rec{i}.tdm", rounds=r) for i, r in enumerate((4, 6, 8))]


def farm(tmp: Path, corpus: list[Path], *extra: str, timeout: float = 900) -> subprocess.CompletedProcess:
    args = ["farm", "run", *[a for b in corpus for a in ("--bundle", str(b))], "--analysis", ",".join(ANALYSES),
            "--db", str(tmp / "farm.sqlite"), "--out", str(tmp / "out"), "--night", "n1", "--repeats", "0", *extra]
    return run_cli(*args, timeout=timeout)


def rows(db: Path, query: str) -> list[tuple]:
    with sqlite3.connect(db) as c:
        return c.execute(query).fetchall()


class Text(HTMLParser):
    """The text of an HTML page by the id of the table it is in."""

    def __init__(self):
        super().__init__()
        self.tables: dict[str, list[str]] = {}
        self._in: str | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self._in = dict(attrs).get("id")
            self.tables.setdefault(self._in or "", [])

    def handle_endtag(self, tag):
        if tag == "table":
            self._in = None

    def handle_data(self, data):
        if self._in is not None and data.strip():
            self.tables[self._in].append(data.strip())


def test_a_night_over_three_recordings_and_two_analyses(corpus, tmp_path):
    r = farm(tmp_path, corpus, "--vms", "2")
    assert r.returncode == 1, r.stderr          # new findings
    db = tmp_path / "farm.sqlite"
    tasks = rows(db, "select analysis, status, attempts from tasks")
    assert sorted(tasks) == sorted([("exact", "pass", 1)] * 3 + [("kasan", "finding", 1)] * 3
                                   + [("lockdep", "finding", 1)] * 3)
    titles = {t for (t,) in rows(db, "select distinct signature from findings")}
    assert "KASAN: slab-out-of-bounds Write in tb_note_store" in titles
    assert any(t.startswith("possible deadlock") or "lock" in t for t in titles), titles
    page = Text()
    page.feed((tmp_path / "out" / "n1" / "night.html").read_text())
    assert "KASAN: slab-out-of-bounds Write in tb_note_store" in page.tables["findings"]
    assert page.tables["findings"].count("new") == len(titles)
    assert {"rec0.tdm", "rec1.tdm", "rec2.tdm", "finding", "pass"} <= set(page.tables["matrix"])
    xml = junitparser.JUnitXml.fromfile(str(tmp_path / "out" / "n1" / "junit.xml"))
    cases = [(s.name, c.name, [type(x).__name__ for x in c.result]) for s in xml for c in s]
    assert len(cases) == 9 and sum(res == ["Failure"] for *_, res in cases) == 6


def test_a_night_killed_half_way_finishes_what_was_missing(corpus, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(ROOT / "replay"))
    args = [sys.executable, "-m", "tandem", "farm", "run", *[a for b in corpus for a in ("--bundle", str(b))],
            "--analysis", "kasan", "--db", str(tmp_path / "farm.sqlite"), "--out", str(tmp_path / "out"),
            "--night", "n1", "--repeats", "0", "--vms", "1"]
    first = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
    db = tmp_path / "farm.sqlite"
    wait_until(lambda: db.exists() and rows(db, "select count(*) from tasks where status in ('pass', 'finding')")[0][0] >= 2,
               600, "two tasks done")
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    done = dict(rows(db, "select id, finished_at from tasks where status in ('pass', 'finding')"))
    assert 2 <= len(done) < 6
    r = subprocess.run(args, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 1, r.stderr
    after = rows(db, "select id, status, finished_at from tasks")
    assert len(after) == 6 and all(s in ("pass", "finding") for _, s, _ in after)
    assert all(dict((i, f) for i, _, f in after)[i] == f for i, f in done.items())    # not done again

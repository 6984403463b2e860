"""The replay farm on real VMs and a real Dask: a night over recordings x analyses into a
real SQLite database, read back as its reports say it and as headless Chromium shows its
page; a night killed half-way and run again finishes only what was missing; nights that
remember a finding until a build fixes it, and call one that comes and goes flaky; two
farms at once on one night in a real PostgreSQL, each task done once."""
from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import junitparser
import pytest
import sqlalchemy as sa

from helpers import ROOT, run_cli, wait_until
from tandem import artifacts
from tandem.setup import programs

ANALYSES = ("kasan", "lockdep")
# What each recording's traffic reaches of the planted bugs (record/workload.PLANTED_BUGS).
BUGS = ((["kasan-oob"]), (["kasan-uaf", "lockdep-ab", "lockdep-ba"]), ())


def record_with(path: Path, bugs) -> Path:
    from tandem.record.recording import Recording
    from tandem.record.workload import bad_requests, demo_traffic
    with Recording(path) as rec:
        rec.wait_ready()
        demo_traffic(rec.port, rounds=4)
        if bugs:
            bad_requests(rec.port, list(bugs))
        rec.serial.type("poweroff")
        rec.wait(timeout=120)
    return path


@pytest.fixture(scope="module")
def corpus(built, tmp_path_factory) -> list[Path]:
    """Three recordings of the demo guest: one reaches a KASAN bug, one a KASAN and a
    lockdep bug, one none."""
    base = tmp_path_factory.mktemp("corpus")
    return [record_with(base / f"rec{i}.tdm", bugs) for i, bugs in enumerate(BUGS)]


def farm(tmp: Path, corpus: list[Path], *extra: str, timeout: float = 900) -> subprocess.CompletedProcess:
    args = ["farm", "run", *[a for b in corpus for a in ("--bundle", str(b))], "--analysis", ",".join(ANALYSES),
            "--db", str(tmp / "farm.sqlite"), "--out", str(tmp / "out"), "--night", "n1", "--repeats", "0", *extra]
    return run_cli(*args, timeout=timeout)


def farm_file(tmp: Path, corpus: list[Path], **settings) -> Path:
    """A farm file of the recordings into kasan alone, one VM a task: what a night of these
    tests needs, written as users write it."""
    lines = ["[corpus]", f"bundles = {json.dumps([str(b) for b in corpus])}", "[analyses]", 'names = ["kasan"]',
             "[settings]", 'db = "farm.sqlite"', 'out = "out"', "exact = false", "noise = false", "vms = 1"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in settings.items()]
    path = tmp / "farm.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def farm_env(build: Path | None = None) -> dict[str, str]:
    """The environment of a farm run; `build`: the build directory it takes tonight's builds from."""
    return dict(os.environ, PYTHONPATH=str(ROOT / "replay"), **({"TANDEM_BUILD_DIR": str(build)} if build else {}))


def builds_copied(build: Path) -> Path:
    """A build directory of its own holding the descriptions of this checkout's builds (the
    builds stay in the cache): one of them can be swapped for tonight's."""
    build.mkdir()
    for j in artifacts.build_dir().glob("*.json"):
        shutil.copyfile(j, build / j.name)
    return build


def states(db: Path, night: str) -> dict[str, str]:
    """signature -> its state on the night, as `tandem farm report --json` gives it."""
    r = run_cli("farm", "report", "--db", str(db), "--night", night, "--out", str(db.parent / "report"),
                "--fixed-after", "1")
    assert r.returncode == 0, r.stderr
    view = json.loads((db.parent / "report" / night / "night.json").read_text())
    return {s["signature"]: s["state"] for s in view["signatures"]}


@pytest.fixture(scope="module")
def fixed_build(built, tmp_path_factory) -> Path:
    """A build directory as it is after tonight's build with the out-of-bounds bug fixed:
    tandem's module source with the off-by-one allocation fixed (one byte more for the
    NUL; the answer stays OK), built for the kasan kernel by tandem's own module build
    from a copy of the checkout, beside the other builds as they are."""
    base = tmp_path_factory.mktemp("fixed")
    checkout = base / "checkout"
    for part in ("scripts", "guest-kernel"):
        shutil.copytree(ROOT / part, checkout / part)
    src = checkout / "guest-kernel" / "modules" / "tandem_bugs.c"
    text = src.read_text()
    bug = "note = kmalloc(sizeof(*note), GFP_KERNEL);"
    assert text.count(bug) == 1, "tandem_bugs.c no longer allocates a note this way: update the fix"
    src.write_text(text.replace(bug, "note = kmalloc(sizeof(*note) + 1, GFP_KERNEL);"))
    build = builds_copied(base / "build")
    r = subprocess.run(["bash", str(checkout / "scripts" / "build-modules.sh"), "kasan",
                        str(build / "modules-kasan.json")], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    fixed = json.loads((build / "modules-kasan.json").read_text())
    assert fixed["key"] != artifacts.modules("kasan")["key"]        # a new build
    return build


def rows(db: Path, query: str) -> list[tuple]:
    with sqlite3.connect(db) as c:
        return c.execute(query).fetchall()


def finished(db: Path) -> int:
    """Tasks of the night done (not the confirming replays); 0 before the farm made its tables."""
    try:
        return rows(db, "select count(*) from tasks where status in ('pass', 'finding') and kernel != 'confirm'")[0][0]
    except sqlite3.OperationalError:
        return 0


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


@pytest.mark.timeout(900)
def test_a_night_over_three_recordings_and_two_analyses(corpus, tmp_path):
    r = farm(tmp_path, corpus, "--vms", "2")
    assert r.returncode == 1, r.stderr          # new findings
    db = tmp_path / "farm.sqlite"
    tasks = rows(db, "select substr(bundle, -8), analysis, status, attempts from tasks where kernel != 'confirm'")
    assert sorted(tasks) == sorted([(f"rec{i}.tdm", "exact", "pass", 1) for i in range(3)] + [
        ("rec0.tdm", "kasan", "finding", 1), ("rec0.tdm", "lockdep", "pass", 1),
        ("rec1.tdm", "kasan", "finding", 1), ("rec1.tdm", "lockdep", "finding", 1),
        ("rec2.tdm", "kasan", "pass", 1), ("rec2.tdm", "lockdep", "pass", 1)])
    # each finding's analysis recording replayed exactly: it reproduces
    assert sorted(rows(db, "select status from tasks where kernel = 'confirm'")) == [("pass",)] * 3
    assert rows(db, "select count(*) from findings where reproduced is not 1") == [(0,)]
    titles = {t for (t,) in rows(db, "select distinct signature from findings")}
    assert "KASAN: slab-out-of-bounds Write in tb_note_store" in titles
    assert any(t.startswith("possible deadlock in ") for t in titles), titles
    page = Text()
    page.feed((tmp_path / "out" / "n1" / "night.html").read_text())
    assert "KASAN: slab-out-of-bounds Write in tb_note_store" in page.tables["findings"]
    assert page.tables["findings"].count("new") == len(titles)
    assert {"rec0.tdm", "rec1.tdm", "rec2.tdm", "finding", "pass"} <= set(page.tables["matrix"])
    xml = junitparser.JUnitXml.fromfile(str(tmp_path / "out" / "n1" / "junit.xml"))
    cases = [(s.name, c.name, [type(x).__name__ for x in c.result]) for s in xml for c in s]
    assert len(cases) == 9 and sum(res == ["Failure"] for *_, res in cases) == 3
    shown_in_chromium(tmp_path / "out" / "n1" / "night.html", len(titles))


def shown_in_chromium(page: Path, new: int) -> None:
    """The night's page as a reader sees it in Debian's headless Chromium: what is
    rendered visible (element.text), not what the HTML holds."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    options = webdriver.ChromeOptions()
    options.binary_location = programs.require("chromium")
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,2000"):
        options.add_argument(flag)      # --no-sandbox: the suite runs as root, which the sandbox refuses
    # the driver given: selenium-manager never looks for (or downloads) one
    browser = webdriver.Chrome(service=Service(executable_path=programs.require("chromedriver")), options=options)
    try:
        browser.get(page.as_uri())
        summary = browser.find_element(By.CSS_SELECTOR, "p.summary").text
        assert summary.startswith(f"{new} new,"), summary
        rows = browser.find_elements(By.CSS_SELECTOR, "#findings tr")[1:]
        first = [r.find_elements(By.TAG_NAME, "td")[0].text for r in rows[:new]]
        assert first == ["new"] * new, first
        kasan = next(r for r in rows if "KASAN: slab-out-of-bounds Write in tb_note_store" in r.text)
        report = kasan.find_element(By.CSS_SELECTOR, "details pre")
        assert not report.is_displayed() and report.text == ""       # closed: the report not shown
        kasan.find_element(By.CSS_SELECTOR, "details summary").click()
        assert report.is_displayed() and "tb_note_store" in report.text
        matrix = [r.find_elements(By.TAG_NAME, "td")[0].text
                  for r in browser.find_elements(By.CSS_SELECTOR, "#matrix tr")[1:]]
        assert matrix == ["rec0.tdm", "rec1.tdm", "rec2.tdm"], matrix
        plots = browser.find_elements(By.CSS_SELECTOR, "body > svg")
        assert len(plots) == 1 and plots[0].size["width"] > 0 and plots[0].size["height"] > 0
        axes = browser.find_elements(By.CSS_SELECTOR, "body > svg g[id^='axes_']")
        assert len(axes) == 2 and all(a.size["width"] > 0 and a.size["height"] > 0 for a in axes)
        assert browser.execute_script("return performance.getEntriesByType('resource').length") == 0
    finally:
        browser.quit()


@pytest.mark.timeout(1500)
def test_a_night_killed_half_way_finishes_what_was_missing(corpus, tmp_path):
    env = farm_env()
    args = [sys.executable, "-m", "tandem", "farm", "run", *[a for b in corpus for a in ("--bundle", str(b))],
            "--analysis", "kasan", "--db", str(tmp_path / "farm.sqlite"), "--out", str(tmp_path / "out"),
            "--night", "n1", "--repeats", "0", "--vms", "1"]
    first = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True)
    db = tmp_path / "farm.sqlite"
    wait_until(lambda: finished(db) >= 2, 600, "two tasks done")
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    done = dict(rows(db, "select id, finished_at from tasks where status in ('pass', 'finding') "
                         "and kernel != 'confirm'"))
    assert 2 <= len(done) < 6
    r = subprocess.run(args, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 1, r.stderr
    after = rows(db, "select id, status, finished_at from tasks where kernel != 'confirm'")
    assert len(after) == 6 and all(s in ("pass", "finding") for _, s, _ in after)
    assert all(dict((i, f) for i, _, f in after)[i] == f for i, f in done.items())    # not done again


def _proc(pid: int) -> tuple[int, str] | None:
    """(parent pid, command line) of a process, None once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1]), cmd


def replays_under(workers: dict[int, str]) -> dict[int, int]:
    """The farm's replays running now (`tandem replay` started by a task): pid -> its worker's pid."""
    out = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        p = _proc(int(pid))
        if p and p[0] in workers and " replay " in p[1] and "tandem" in p[1]:
            out[int(pid)] = p[0]
    return out


def dask_process(module: str, *args: str, env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", f"distributed.cli.{module}", *args], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def worker_addresses(scheduler: str) -> dict[str, str]:
    """name -> address of the workers the scheduler has."""
    from distributed import Client
    with Client(scheduler, timeout="30s") as c:
        return {w["name"]: addr for addr, w in c.scheduler_info()["workers"].items()}


@pytest.mark.timeout(900)
def test_a_worker_killed_mid_task_and_its_task_done_by_the_other(corpus, tmp_path):
    """A real scheduler and two workers, each a process of its own on loopback; the worker
    running the task is killed: the task is done by the other, stored once, and the killed
    worker's VMs are gone with it."""
    env = farm_env()
    sched_file = tmp_path / "scheduler.json"
    procs = [dask_process("dask_scheduler", "--host", "127.0.0.1", "--port", "0", "--dashboard-address", ":0",
                          "--scheduler-file", str(sched_file), env=env)]
    try:
        wait_until(lambda: sched_file.exists() and sched_file.stat().st_size > 0, 60, "the scheduler's file")
        address = json.loads(sched_file.read_text())["address"]
        for name in ("w1", "w2"):
            procs.append(dask_process("dask_worker", "--scheduler-file", str(sched_file), "--no-nanny",
                                      "--nthreads", "2", "--resources", "vm=2", "--name", name, env=env))
        names = {p.pid: n for p, n in zip(procs[1:], ("w1", "w2"))}
        wait_until(lambda: len(worker_addresses(address)) == 2, 60, "two workers", poll=1.0)
        addresses = worker_addresses(address)
        night = subprocess.Popen([sys.executable, "-m", "tandem", "farm", "run", "--bundle", str(corpus[0]),
                                  "--analysis", "kasan", "--no-exact", "--repeats", "0", "--db",
                                  str(tmp_path / "farm.sqlite"), "--out", str(tmp_path / "out"), "--night", "n1",
                                  "--scheduler", address], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True)
        (replay_pid, worker_pid), = wait_until(lambda: replays_under(names), 300, "a task's replay").items()
        os.kill(worker_pid, signal.SIGKILL)
        wait_until(lambda: _proc(replay_pid) is None, 30, "the killed worker's replay gone with it")
        out, err = night.communicate(timeout=900)
        assert night.returncode == 1, out + err
        db = tmp_path / "farm.sqlite"
        survivor = addresses["w2" if names[worker_pid] == "w1" else "w1"]
        assert rows(db, "select status, attempts, worker from tasks where kernel != 'confirm'") == [
            ("finding", 1, survivor)]
        titles = [t for (t,) in rows(db, "select signature from findings f join tasks t on f.task_id = t.id "
                                         "where t.kernel != 'confirm'")]
        assert titles and len(titles) == len(set(titles)), titles        # stored once
    finally:
        for p in procs:
            p.kill()
            p.wait()


KASAN_OOB = "KASAN: slab-out-of-bounds Write in tb_note_store"


@pytest.mark.timeout(1800)
def test_a_finding_known_the_next_night_and_fixed_after_tonights_build_fixes_it(corpus, fixed_build, tmp_path):
    """Night 1 finds the out-of-bounds write (new); night 2, the same builds, knows it;
    night 3 runs tonight's build with the bug fixed: a new task, the finding is fixed."""
    spec = farm_file(tmp_path, corpus[:1], repeats=0, fixed_after=1)
    db = tmp_path / "farm.sqlite"

    def night(name: str, build: Path | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "tandem", "farm", "run", str(spec), "--night", name],
                              env=farm_env(build), capture_output=True, text=True, timeout=900)

    r = night("n1")
    assert r.returncode == 1, r.stdout + r.stderr                 # new
    assert states(db, "n1") == {KASAN_OOB: "new"}
    r = night("n2")
    assert r.returncode == 0, r.stdout + r.stderr                 # nothing new
    assert states(db, "n2") == {KASAN_OOB: "known"}
    r = night("n3", fixed_build)
    assert r.returncode == 0, r.stdout + r.stderr
    assert states(db, "n3") == {KASAN_OOB: "fixed"}
    kernels = rows(db, "select n.name, t.kernel, t.status from tasks t join nights n on t.night_id = n.id "
                       "where t.kernel != 'confirm' order by n.name")
    assert [(n, s) for n, _, s in kernels] == [("n1", "finding"), ("n2", "finding"), ("n3", "pass")]
    assert kernels[0][1] == kernels[1][1] != kernels[2][1]        # tonight's build: a task of its own


@pytest.mark.timeout(1800)
def test_a_finding_that_comes_and_goes_in_one_night_is_flaky_not_new(corpus, fixed_build, tmp_path):
    """A finding never seen before is replayed twice more; between the first replay and the
    others the build under the night changes to the fixed one (as a race's bug shows in
    some replays and not others): it is flaky, not new, and the night says nothing new."""
    spec = farm_file(tmp_path, corpus[:1], repeats=2)
    build = builds_copied(tmp_path / "build")
    staged = build / "modules-kasan.json.fixed"
    shutil.copyfile(fixed_build / "modules-kasan.json", staged)
    db = tmp_path / "farm.sqlite"
    night = subprocess.Popen([sys.executable, "-m", "tandem", "farm", "run", str(spec), "--night", "n1"],
                             env=farm_env(build), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_until(lambda: finished(db) >= 1, 900, "the first replay done")
    os.replace(staged, build / "modules-kasan.json")
    out, err = night.communicate(timeout=1200)
    assert night.returncode == 0, out + err                         # nothing new
    runs = rows(db, "select repeat, status from tasks where kernel != 'confirm' order by repeat")
    assert [r for r, _ in runs] == [0, 1, 2] and runs[0][1] == "finding" and runs[2][1] == "pass", runs
    assert states(db, "n1") == {KASAN_OOB: "flaky"}


@pytest.mark.timeout(1500)
def test_two_farms_at_once_share_one_night_in_postgresql(corpus, tmp_path, postgres_url):
    """Two `tandem farm run` processes started together on the same night in one
    PostgreSQL database (a private cluster, READ COMMITTED): one night, each task stored
    once and done once by one of them, both doing some, each finding stored once."""
    env = farm_env()
    spec = tmp_path / "farm.toml"
    spec.write_text(f"[corpus]\nbundles = {json.dumps([str(b) for b in corpus])}\n"
                    "[settings]\nnoise = false\n")        # an analysis alone: one VM a task
    farms = [subprocess.Popen([sys.executable, "-m", "tandem", "farm", "run", str(spec), "--analysis", "kasan",
                               "--no-exact", "--repeats", "0", "--vms", "1", "--db", postgres_url,
                               "--out", str(tmp_path / f"out{i}"), "--night", "n1"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in (0, 1)]
    said = [f.communicate(timeout=1400) for f in farms]
    assert [f.returncode for f in farms] == [1, 1], said        # new findings, for both
    engine = sa.create_engine(postgres_url)
    try:
        with engine.connect() as c:
            nights = c.execute(sa.text("select id, name, finished_at from nights")).all()
            tasks = c.execute(sa.text("select id, night_id, bundle, recording, analysis, kernel, repeat, status, "
                                      "attempts, run_id from tasks")).all()
            found = c.execute(sa.text("select task_id, signature from findings")).all()
            runs = c.execute(sa.text("select count(*) from runs")).scalar()
    finally:
        engine.dispose()
    assert len(nights) == 1 and nights[0].name == "n1" and nights[0].finished_at is not None, (nights, said)
    keys = [(t.recording, t.analysis, t.kernel, t.repeat) for t in tasks]
    assert len(keys) == len(set(keys)) and all(t.attempts == 1 for t in tasks), tasks
    # each farm takes only what its one VM can run, so both do some: three analyses take
    # minutes, and the second farm starts within seconds of the first
    assert len({t.run_id for t in tasks}) == 2 and all(t.run_id for t in tasks), tasks
    assert runs == 0                    # both ended their run
    analysed = sorted((Path(t.bundle).name, t.status) for t in tasks if t.kernel != "confirm")
    assert analysed == [("rec0.tdm", "finding"), ("rec1.tdm", "finding"), ("rec2.tdm", "pass")], tasks
    confirms = [t for t in tasks if t.kernel == "confirm"]
    assert len(confirms) == 2 and all(t.status == "pass" for t in confirms), confirms
    assert found and len(found) == len(set(found)), found      # no finding stored twice
    assert {t.night_id for t in tasks} == {nights[0].id}


@pytest.fixture(scope="module")
def users_vm_recording(built, tmp_path_factory) -> Path:
    """The reference VM (Debian 12 on its own disk, GRUB, systemd, nginx) from power-on
    under a few curl fetches, powered off by its ACPI button: a user's VM as the farm
    meets one."""
    from tandem.machine import Forward, Guest
    from tandem.qemu.vm import free_port
    from tandem.record import clients
    from tandem.record.recording import Recording
    ref = artifacts.refvm()
    tmp = tmp_path_factory.mktemp("users-vm")
    disk = tmp / "web.qcow2"
    shutil.copyfile(ref["disk"], disk)
    http = free_port()
    with Recording(tmp / "web.tdm", Guest.of_disks([(str(disk), "qcow2")]), forwards=(Forward("tcp", http, 80),)) as rec:
        wait_until(lambda: rec.running() and clients.http_up(http), 600, "nginx on the reference VM", poll=1.0)
        clients.fetch_files(http, {f["path"]: f["sha256"] for f in ref["site"][:3]})
        rec.powerdown()
        rec.wait(timeout=300)
    return tmp / "web.tdm"


@pytest.mark.timeout(2400)
def test_a_night_over_a_users_vm_and_the_demo_guest_with_a_kernel_of_the_users(corpus, users_vm_recording,
                                                                                 tmp_path):
    """One night over a user's VM and the demo guest, into kasan and into a kernel the user
    brings: the user's VM replayed exactly and into both, clean; the demo guest exactly and
    into kasan, and skipped (with the reason) for the brought kernel, which boots a user's
    VM's disk."""
    k = artifacts.kernel("native")
    mine = tmp_path / "bzImage"
    shutil.copyfile(k["bzImage"], mine)
    r = run_cli("farm", "run", "--bundle", str(users_vm_recording), "--bundle", str(corpus[2]), "--analysis", "kasan",
                "--analysis-kernel", f"mine={mine},{k['vmlinux']}", "--no-noise", "--vms", "2",
                "--db", str(tmp_path / "farm.sqlite"), "--out", str(tmp_path / "out"), "--night", "n1", timeout=2300)
    assert r.returncode == 0, r.stdout + r.stderr
    got = rows(tmp_path / "farm.sqlite", "select bundle, analysis, status, reason from tasks")
    assert sorted((Path(b).name, a, s) for b, a, s, _ in got) == [
        ("rec2.tdm", "exact", "pass"), ("rec2.tdm", "kasan", "pass"), ("rec2.tdm", "mine", "skipped"),
        ("web.tdm", "exact", "pass"), ("web.tdm", "kasan", "pass"), ("web.tdm", "mine", "pass")], got
    (why,) = [w for b, a, _, w in got if a == "mine" and b.endswith("rec2.tdm")]
    assert "recordings of your own VMs" in why
    xml = junitparser.JUnitXml.fromfile(str(tmp_path / "out" / "n1" / "junit.xml"))
    skips = [(c.classname, c.name) for s in xml for c in s if any(isinstance(x, junitparser.Skipped) for x in c.result)]
    assert skips == [("rec2.tdm", "mine")]

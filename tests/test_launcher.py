"""The launcher on a machine it meets fresh: two commands started together,
a command killed half-way, `./tandem doctor`, `./tandem --help`, the preflight.

The concurrency tests run a miniature checkout (the launcher, host-deps.sh, the
package, an empty requirements.txt) against an empty cache of their own, so only the
lock and the venv step run: seconds, no download.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from helpers import ROOT, assert_one_line_error, wait_until
from tandem import artifacts, catalog
from tandem.cli.main import build_parser
from tandem.setup.state import FREEBSD_TARGETS

LINE = re.compile(r"^(ok|warn|FAIL) +[\w-]+: .+")


def mini_checkout(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "tandem", root / "tandem")
    shutil.copy(ROOT / "scripts/host-deps.sh", root / "scripts/host-deps.sh")
    shutil.copytree(ROOT / "replay/tandem", root / "replay/tandem", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "replay/requirements.txt").write_text("# none: the venv step alone\n")
    return root


def env_with(cache: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TANDEM_", "VIRTUAL_ENV"))}
    return dict(env, TANDEM_CACHE=str(cache), **extra)


def launch(root: Path, cache: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([str(root / "tandem"), *args], env=env_with(cache), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def venv_of(cache: Path) -> Path:
    [venv] = cache.glob("venv-*")
    return venv


def test_two_commands_on_an_empty_cache_both_succeed(tmp_path):
    root, cache = mini_checkout(tmp_path), tmp_path / "cache"
    a, b = launch(root, cache, "setup"), launch(root, cache, "setup")
    (_, err_a), (_, err_b) = a.communicate(timeout=300), b.communicate(timeout=300)
    assert a.returncode == 0 and b.returncode == 0, err_a + err_b
    both = err_a + err_b
    assert both.count("creating Python environment") == 1, both
    waiting = [l for l in both.splitlines() if "waiting for" in l]
    assert len(waiting) == 1 and re.search(r"pid \d+ \(\./tandem setup\)", waiting[0]), both
    assert (venv_of(cache) / ".complete").is_file()
    subprocess.run([venv_of(cache) / "bin/python", "-c", "import sys"], check=True)
    assert not (cache / "setup.owner").exists()


def test_a_venv_left_half_made_by_a_killed_command_is_made_again(tmp_path):
    root, cache = mini_checkout(tmp_path), tmp_path / "cache"
    p = launch(root, cache, "setup")
    def venv_under_way() -> bool:                       # python -m venv has made its python
        assert p.poll() is None, p.communicate()
        return bool(list(cache.glob("venv-*/bin/python")))
    wait_until(venv_under_way, 120, "python -m venv to be under way", poll=0.05)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    assert not (venv_of(cache) / ".complete").exists()
    r = subprocess.run([str(root / "tandem"), "setup"], env=env_with(cache), capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert "was stopped before it finished" in r.stderr and "creating Python environment" in r.stderr, r.stderr
    assert (venv_of(cache) / ".complete").is_file()
    subprocess.run([venv_of(cache) / "bin/python", "-c", "import sys"], check=True)


def doctor(cache: Path | None = None, *args: str, **extra) -> subprocess.CompletedProcess:
    env = env_with(cache, **extra) if cache else dict(os.environ)
    return subprocess.run([str(ROOT / "tandem"), "doctor", *args], env=env, capture_output=True, text=True,
                          timeout=180)


def test_doctor_on_this_host_finds_nothing_to_fix(built):
    """After ./tandem test's own setup: every check ok or warn, /dev/kvm checked by a boot."""
    r = doctor()
    lines = r.stdout.splitlines()
    assert r.returncode == 0 and not r.stderr, r.stdout + r.stderr
    assert all(LINE.match(l) for l in lines), r.stdout
    names = {l.split()[1].rstrip(":") for l in lines}
    assert {"packages", "programs", "disk", "venv", "qemu", "kernel-native", "guest", "lock", "kvm"} <= names
    assert all("fix: " in l for l in lines if not l.startswith("ok")), r.stdout
    # ./tandem test built everything just now: every build's key is its sources' key.
    target = {l: l.split()[1].rstrip(":") for l in lines}
    builds = [l for l, t in target.items() if t.startswith(("qemu", "kernel-", "modules-", "guest", "plugin"))
              and t not in FREEBSD_TARGETS]
    # qemu, guest, the two plugins (calls, stop), and a kernel and its modules per flavor of the catalogue
    assert len(builds) == 4 + 2 * len(catalog.FLAVORS) and all(l.startswith("ok") for l in builds), r.stdout
    # and the FreeBSD guests' builds when the suite has a FreeBSD tree (.ci/run)
    freebsd = [l for l, t in target.items() if t in FREEBSD_TARGETS]
    if os.environ.get("TANDEM_FREEBSD_SRC"):
        assert len(freebsd) == len(FREEBSD_TARGETS) and all(l.startswith("ok") for l in freebsd), r.stdout


def test_doctor_names_what_is_broken_and_the_fix(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    key = __import__("hashlib").sha256((ROOT / "replay/requirements.txt").read_bytes()).hexdigest()[:16]
    (cache / f"venv-{key}" / "bin").mkdir(parents=True)           # no .complete: cut short
    (cache / "setup.owner").write_text("pid 4242 (./tandem demo), creating the Python environment\n")
    r = doctor(cache, "--no-kvm-boot", TANDEM_BUILD_DIR=str(tmp_path / "nobuild"))
    assert r.returncode == 1, r.stdout
    assert all(LINE.match(l) for l in r.stdout.splitlines()), r.stdout
    venv = next(l for l in r.stdout.splitlines() if l.split()[1] == "venv:")
    assert venv.startswith("FAIL") and "half-made" in venv and "fix: ./tandem setup" in venv, venv
    lock = next(l for l in r.stdout.splitlines() if l.split()[1] == "lock:")
    assert lock.startswith("warn") and "pid 4242" in lock and "stopped" in lock, lock
    kernel = next(l for l in r.stdout.splitlines() if l.split()[1] == "kernel-kasan:")
    assert "not built" in kernel and "fix: ./tandem build" in kernel, kernel


def on_small_disk(tmp_path: Path, size: str, command: str) -> subprocess.CompletedProcess:
    """command (sh) with its cache and build directory on a tmpfs of `size` of its own (a
    mount namespace of its own: nothing is left mounted)."""
    small = tmp_path / "small"
    small.mkdir()
    return subprocess.run(["unshare", "--mount", "sh", "-c", f"mount -t tmpfs -o size={size} tmpfs {small} && "
                           f"exec {command}"],
                          env=env_with(small / "cache", PYTHONPATH=str(ROOT / "replay"),
                                       TANDEM_BUILD_DIR=str(small / "build")),
                          capture_output=True, text=True, timeout=60)


def test_preflight_stops_a_build_with_one_line_when_the_disk_is_full(tmp_path):
    r = on_small_disk(tmp_path, "16m", "/usr/bin/python3 -m tandem.setup.doctor --preflight")
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tandem: error: disk:") and "fix:" in lines[0], r.stderr


def test_a_build_the_disk_cannot_hold_is_one_line_naming_what_it_would_build(tmp_path):
    """Room enough for recordings (the preflight passes) but not for a kernel and the source
    tree it unpacks: the build stops before meson with one line naming the target."""
    r = on_small_disk(tmp_path, "1536m", f"{sys.executable} -m tandem.setup.build --no-parser kernel-kasan")
    line = assert_one_line_error(r, "tandem: error: disk: 1.5 GiB free under", "building kernel-kasan adds about",
                                 "fix:")
    assert "TANDEM_CACHE" in line


def test_a_build_removes_its_superseded_builds_but_the_last_used_other(tmp_path):
    """A new key of a build (a kernel config changed) leaves the old key's build behind:
    the next build removes all but the most recently used other key's, saying so."""
    cache = tmp_path / "cache"
    env = env_with(cache, PYTHONPATH=str(ROOT / "replay"), TANDEM_BUILD_DIR=str(tmp_path / "build"))
    key = subprocess.run(["bash", str(ROOT / "scripts/build-asan-redis.sh"), os.devnull], env=dict(env, TANDEM_KEY_ONLY="1"),
                         capture_output=True, text=True, check=True).stdout.split()
    here = Path(key[1]).parent
    olds = [here.parent / f"{k:016x}" for k in (1, 2)]
    for i, d in enumerate(olds):
        (d / "redis").mkdir(parents=True)
        os.utime(d, (1_000_000 + i, 1_000_000 + i))
    r = subprocess.run([sys.executable, "-c", "import logging, sys; from tandem.setup import build, state; "
                        "logging.basicConfig(level=logging.INFO, format='%(message)s'); "
                        "build.prune({'asan-redis': state.cached('asan-redis')})"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert not olds[0].exists() and olds[1].exists(), r.stderr
    assert f"removed 1 superseded build from the cache (0.0 GiB): asan-redis/{olds[0].name}" in r.stderr


def test_a_freebsd_source_that_is_no_tree_is_one_line_before_any_build(tmp_path):
    """`./tandem build freebsd --freebsd-src PATH` with PATH naming nothing, or a directory
    that is not a FreeBSD tree: one line naming it, before meson or ninja say anything."""
    (tmp_path / "notatree").mkdir()
    (tmp_path / "notatree" / "README").write_text("not FreeBSD\n")
    for src, words in ((tmp_path / "notatree", "not a FreeBSD source tree"), (tmp_path / "nosuch", "no such file")):
        r = subprocess.run([sys.executable, "-m", "tandem.setup.build", "freebsd", "--freebsd-src", str(src)],
                           env=env_with(tmp_path / "cache", PYTHONPATH=str(ROOT / "replay"),
                                        TANDEM_BUILD_DIR=str(tmp_path / "build")),
                           capture_output=True, text=True, timeout=60)
        assert_one_line_error(r, str(src), words)
        assert not (tmp_path / "build").exists() or not any((tmp_path / "build").glob("*freebsd*"))


def test_help_lists_every_subcommand():
    r = subprocess.run([str(ROOT / "tandem"), "--help"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    cli = build_parser()._subparsers._group_actions[0].choices
    for name in [*cli, "test", "build", "setup", "bench", "doctor", "demo"]:
        assert re.search(rf"^\s*(\./tandem )?{re.escape(name)}\b", r.stdout, re.M), f"{name} missing:\n{r.stdout}"


def cli_with_build(build: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "replay"), TANDEM_BUILD_DIR=str(build))
    return subprocess.run([sys.executable, "-m", "tandem", *args], capture_output=True, text=True, env=env,
                          timeout=600)


def test_each_command_builds_what_it_needs_and_says_so_first(built, demo_bundle, tmp_path):
    """inspect builds nothing, even with no build at all; record of the demo guest builds
    what of QEMU and its guest is missing (here the guest image, gone from this build
    directory), says so with an estimate first, and nothing else (no analysis kernel)."""
    r = cli_with_build(tmp_path / "nobuild", "inspect", str(demo_bundle))
    assert r.returncode == 0 and "building" not in r.stderr, r.stderr
    assert not (tmp_path / "nobuild").exists()
    build = tmp_path / "build"
    subprocess.run([str(Path(sys.executable).parent / "meson"), "setup", str(build), str(ROOT)], check=True,
                   capture_output=True, timeout=300)
    for made in (ROOT / "build").glob("*.json"):
        if made.name != "guest.json":
            shutil.copy(made, build / made.name)
    r = cli_with_build(build, "record", str(tmp_path / "x.tdm"), "--duration", "2s", "--stop", "quit")
    assert r.returncode == 0, r.stderr
    said = [line for line in r.stderr.splitlines() if "building" in line]
    assert said and said[0].startswith("tandem: building guest for recording: about "), r.stderr
    assert not [line for line in said if "kernel-" in line or "refvm" in line], said
    assert json.loads((build / "guest.json").read_text())["key"] == artifacts.guest()["key"]

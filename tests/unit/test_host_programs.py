"""Every program tandem calls is installed by scripts/host-deps.sh, or is in Debian's
required/important set, or is used only behind a check.

The calls are read from the code (program_calls.py); the packages from the one
declared list, tandem/setup/programs.py; what ships each program from dpkg on this
host, where host-deps.sh has run (`./tandem test` runs it first). No VM, seconds.
"""
from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "replay"))
sys.path.insert(0, str(Path(__file__).parent))

import program_calls  # noqa: E402
from tandem.setup import programs  # noqa: E402

DEBIAN_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"   # a fresh machine's view: nothing in /usr/local


@functools.cache
def all_calls() -> list[program_calls.Calls]:
    return [program_calls.scan(p) for p in program_calls.host_code(ROOT)]


@functools.cache
def host_deps_packages(groups: bool = True) -> frozenset[str]:
    """host-deps.sh's packages; groups: with the developer scripts' and the tests' too."""
    out = subprocess.run(["bash", str(ROOT / "scripts/host-deps.sh"), "--list", *(["--dev", "--test", "--freebsd"] if groups else [])],
                         capture_output=True, text=True, check=True).stdout
    return frozenset(line.split("/")[0] for line in out.split())


@functools.cache
def priority(package: str) -> str:
    r = subprocess.run(["dpkg-query", "-W", "-f=${Priority}", package], capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else ""


def problems(calls: list[program_calls.Calls], declared: dict[str, programs.Program]) -> list[str]:
    """What is wrong with these calls against the declared list, one line each."""
    out = []
    for c in calls:
        rel = c.path.relative_to(ROOT) if c.path.is_absolute() and ROOT in c.path.parents else c.path
        for name, lines in sorted(c.used.items()):
            p = declared.get(name)
            if p is None:
                out.append(f"{rel}:{lines[0]}: calls {name}, which is not declared in tandem/setup/programs.py "
                           f"(declare it with its Debian package, and install that in scripts/host-deps.sh)")
            elif p.optional and name not in c.guarded:
                out.append(f"{rel}:{lines[0]}: calls {name} without checking for it first "
                           f"(it is declared optional: guard it with command -v / programs.which)")
    return out


def shipped_by(path: str) -> str | None:
    """The package dpkg says ships this file, trying the /usr-merged aliases and symlink target."""
    real = os.path.realpath(path)
    candidates = []
    for p in (path, real):
        candidates += [p, p.replace("/usr/bin/", "/bin/", 1), p.replace("/usr/sbin/", "/sbin/", 1),
                       p.replace("/bin/", "/usr/bin/", 1) if p.startswith("/bin/") else p,
                       p.replace("/sbin/", "/usr/sbin/", 1) if p.startswith("/sbin/") else p]
    for c in dict.fromkeys(candidates):
        r = subprocess.run(["dpkg", "-S", c], capture_output=True, text=True)
        if r.returncode == 0:
            line = next(l for l in r.stdout.splitlines() if not l.startswith("diversion"))
            return line.split(":")[0].split(",")[0].strip()
    return None


def test_every_program_called_is_declared():
    bad = problems(all_calls(), programs.PROGRAMS)
    assert not bad, "\n".join(bad)


def test_every_declared_program_is_called():
    """A declaration nobody uses is a stale promise (implicit ones are called by make/tar)."""
    used = {n for c in all_calls() for n in c.used}
    stale = [p.name for p in programs.PROGRAMS.values() if not p.implicit and p.name not in used]
    assert not stale, f"declared in tandem/setup/programs.py but never called: {stale}"


@pytest.mark.parametrize("name", sorted(n for n, p in programs.PROGRAMS.items() if p.package != programs.VENV))
def test_program_comes_from_an_installed_package(name):
    p = programs.PROGRAMS[name]
    installed_by_us = p.package in host_deps_packages()
    assert p.optional or installed_by_us or priority(p.package) in ("required", "important"), (
        f"{name}: its package {p.package} is neither installed by scripts/host-deps.sh nor in "
        f"Debian's required/important set (priority {priority(p.package) or 'unknown'})")
    # type -P: the file on PATH, not a shell keyword or builtin of that name (time, echo)
    path = subprocess.run(["bash", "-c", f"type -P {name}"], capture_output=True, text=True,
                          env={"PATH": DEBIAN_PATH}).stdout.strip() or programs.off_path(p)
    if not path:
        grouped = p.package not in host_deps_packages(groups=False)
        if p.optional or grouped and not priority(p.package):
            pytest.skip(f"{name} ({p.package}) not installed here: optional, or only for scripts/fresh-check.sh, "
                        f"the tests or FreeBSD guests (host-deps.sh --dev, --test, --freebsd)")
        pytest.fail(f"{name}: not found on {DEBIAN_PATH}{' or ' + p.where if p.where else ''} although "
                    f"scripts/host-deps.sh ran: "
                    f"its package {p.package} does not ship it")
    assert shipped_by(path) == p.package, f"{name} ({path}) is shipped by {shipped_by(path)}, " \
                                          f"not {p.package} as declared"


def test_venv_programs_come_from_requirements():
    reqs = (ROOT / "replay/requirements.txt").read_text().lower()
    for p in programs.PROGRAMS.values():
        if p.package == programs.VENV and p.name != "python":
            assert f"\n{p.name}==" in reqs, f"{p.name}: declared as the venv's but not in replay/requirements.txt"


# The checker itself: it must fail on what it is there to catch.

def _shell(text: str) -> program_calls.Calls:
    c = program_calls.Calls(Path("x.sh"))
    program_calls.scan_shell(text, c)
    return c


def _python(text: str) -> program_calls.Calls:
    c = program_calls.Calls(Path("x.py"))
    program_calls.scan_python(text, c)
    return c


@pytest.mark.parametrize("text", [
    "frobnicate --all\n",
    "x=$(frobnicate)\n",
    "exec frobnicate\n",
    "$SUDO frobnicate\n",
    "run() { \"$@\" >>log; }\nrun frobnicate -o x\n",
    "timeout 5 frobnicate\n",
    "a | frobnicate | b\n",
    "if frobnicate; then :; fi\n",
])
def test_a_new_program_in_shell_fails_the_check(text):
    assert any("frobnicate" in line for line in problems([_shell(text)], programs.PROGRAMS))


@pytest.mark.parametrize("text", [
    "import subprocess\nsubprocess.run(['frobnicate', '-x'])\n",
    "import subprocess\nFROB = 'frobnicate'\nsubprocess.Popen([FROB])\n",
    "import subprocess\nsubprocess.run(['unshare', '--mount', '--', 'frobnicate'])\n",
    "import subprocess\nsubprocess.run(['sh', '-c', 'frobnicate | grep x'])\n",
    "import os\nos.execvp('frobnicate', ['frobnicate'])\n",
    "from tandem.setup import programs\nprograms.require('frobnicate')\n",
])
def test_a_new_program_in_python_fails_the_check(text):
    assert any("frobnicate" in line for line in problems([_python(text)], programs.PROGRAMS))


def test_what_is_not_a_host_program_is_skipped():
    c = _shell('"$CC" -o x y.c\n"${MAKE[@]}" all\n../src/configure\nf() { :; }\nf\n'
               'unshare -m chroot "$R" /bin/sh -c "frobnicate"\n')
    assert set(c.used) == {"unshare", "chroot"}, c.used


def test_an_optional_program_must_be_guarded():
    assert problems([_shell("addr2line -e x 0x1\n")], programs.PROGRAMS)
    assert not problems([_shell("command -v addr2line >/dev/null && addr2line -e x 0x1\n")], programs.PROGRAMS)
    assert not problems([_python("import shutil\nt = shutil.which('addr2line')\n")], programs.PROGRAMS)

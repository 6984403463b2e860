"""What every fuzz target of tandem shares (the console parser's, and those of the readers
of specs, assertions and bundles): running one under
atheris for a fixed budget, naming what an input raises, minimizing a crash, saving it in
the target's corpus as a regression input, and merging the corpus down to the fewest
inputs that reach every feature reached so far.

A target is a script in this directory (`NAME_target.py`) with a `check(data: bytes)`
that raises only on a finding, a `CORPUS` directory and a `TARGET` (a Target below);
its `__main__` is `fuzzing.main(sys.argv, check, instrument)`, which libFuzzer runs again
as argv[0] for `-fork` and `-merge`. bench/fuzz.py and bench/report.py drive them;
tests/unit/test_fuzz_targets.py and test_report_fuzz_corpus.py replay their corpora.
"""
from __future__ import annotations

import atexit
import hashlib
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
FOUND = re.compile(r"[0-9a-f]{40}")    # libFuzzer names an input by its content's SHA-1
KNOWN_CRASHES = HERE / "known-crashes.txt"
log = logging.getLogger("fuzzing")


@dataclass
class Target:
    """One fuzz target: its script, corpus and check()."""
    name: str                           # the script is NAME_target.py, the corpus NAME-corpus
    check: Callable[[bytes], None]      # raises on a finding, returns otherwise
    instrument: tuple[str, ...]         # modules atheris instruments (coverage)
    what: str                           # one line for docs/benchmarks.md: what one input is
    max_len: int = 8192
    timeout_s: int = 10                 # one input slower than this is a finding
    minimize_runs: int = 3000           # check() calls a crash's minimization may spend
    tokens: tuple[bytes, ...] = field(default=())   # libFuzzer dictionary entries

    @property
    def script(self) -> Path:
        return HERE / f"{self.name}_target.py"

    @property
    def corpus(self) -> Path:
        return HERE / f"{self.name}-corpus"


def main(argv: list[str], check: Callable[[bytes], None], instrument: tuple[str, ...]) -> None:
    """A target script's entry point under libFuzzer (argv: libFuzzer's flags and dirs)."""
    import atheris
    with atheris.instrument_imports(include=list(instrument)):
        for module in instrument:
            __import__(module)
    atheris.Setup(argv, check)
    atheris.Fuzz()


def signature(target: Target, data: bytes) -> str | None:
    """What check() raises on `data`, as exception type and innermost tandem frame; None if nothing."""
    try:
        target.check(data)
    except Exception as e:  # noqa: BLE001  (a finding, described and kept, not swallowed)
        tb = traceback.extract_tb(e.__traceback__)
        ours = [f for f in tb if "tandem" in f.filename] or tb
        where = f"{Path(ours[-1].filename).name}:{ours[-1].lineno}"
        return f"{type(e).__name__} at {where}" + (f": {e}" if isinstance(e, AssertionError) else "")
    return None


def minimize(target: Target, data: bytes, sig: str) -> bytes:
    """The smallest input raising the same as `data` that ddmin finds, first by lines,
    then by bytes, within target.minimize_runs calls."""
    budget = [target.minimize_runs]

    def same(parts: list[bytes]) -> bool:
        if budget[0] <= 0:
            return False
        budget[0] -= 1
        return signature(target, b"".join(parts)) == sig

    def ddmin(parts: list[bytes]) -> list[bytes]:
        n = 2
        while len(parts) >= 2:
            size = -(-len(parts) // n)
            for i in range(0, len(parts), size):
                rest = parts[:i] + parts[i + size:]
                if same(rest):
                    parts, n = rest, max(n - 1, 2)
                    break
            else:
                if n >= len(parts):
                    break
                n = min(len(parts), n * 2)
        return parts

    lines = ddmin(data.splitlines(keepends=True))
    return b"".join(ddmin([bytes([b]) for b in b"".join(lines)]))


def traceback_of(target: Target, data: bytes) -> str:
    try:
        target.check(data)
    except Exception:  # noqa: BLE001  (printed for the report)
        return traceback.format_exc(limit=-6)
    return "(no longer raises)"


def run_fuzzer(target: Target, args: list[str], cwd: Path, timeout: float) -> str:
    """The target under libFuzzer, run in `cwd` (where stray artifacts land); its output.
    Its scratch files go to a directory of the caller's, removed with it (libFuzzer ends
    its processes with _exit: their atexit handlers never run)."""
    scratch = _scratch_dir()
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
               PYTHONPATH=os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(ROOT / "replay")) if p),
               **{SCRATCH_ENV: str(scratch)})
    # libFuzzer runs argv[0] again for -fork and -merge: the script itself, on the venv's PATH.
    r = subprocess.run([str(target.script), *args], cwd=cwd, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, env=env, timeout=timeout, check=False)
    return r.stdout.decode(errors="replace")


def known_names() -> dict[str, str]:
    """known-crashes.txt: corpus file name -> why it is not fixed yet (another change owns it)."""
    return dict(line.split(None, 1) for line in KNOWN_CRASHES.read_text().splitlines()
                if line.strip() and not line.startswith("#"))


def known_crashes(target: Target) -> dict[str, str]:
    """Signature -> corpus file, of the corpus inputs that still raise."""
    known = {}
    for path in sorted(target.corpus.glob("crash-*")):
        sig = signature(target, path.read_bytes())
        if sig:
            known.setdefault(sig, path.name)
    return known


def save_findings(target: Target, art: Path, found: dict[str, str], known: dict[str, str]) -> set[str]:
    """Each crash or slow input of `art` not raising as a known one, minimized, into the
    corpus (`found`: signature -> name); the known signatures met again."""
    again = set()
    for path in sorted(art.iterdir()):
        data = path.read_bytes()
        sig = signature(target, data)
        kind = "crash" if sig else "slow"
        sig = sig or f"over {target.timeout_s} s ({path.name.split('-')[0]})"
        if sig in known:
            again.add(sig)
        if sig in found or sig in known:
            continue
        small = minimize(target, data, sig) if kind == "crash" else data
        name = f"{kind}-{hashlib.sha1(small).hexdigest()}"
        (target.corpus / name).write_bytes(small)
        found[sig] = name
        print(f"fuzz {target.name}: {sig}: saved {target.corpus / name}\n"
              f"{traceback_of(target, small) if kind == 'crash' else ''}", file=sys.stderr)
    return again


def merge_minimal(target: Target, work: Path, tmp: Path) -> tuple[int, int]:
    """Make the corpus's found inputs the fewest that, with the seeds, reach every feature
    the fuzzer has reached (old ones and `work`'s new ones), so it grows with coverage, not
    with the time spent fuzzing. Seeds, crashes and slow inputs stay. (added, dropped)."""
    corpus = target.corpus
    keep = tmp / "minimal"
    keep.mkdir()
    for path in corpus.glob("seed-*"):
        shutil.copy(path, keep)
    (tmp / "merge-art").mkdir(exist_ok=True)
    run_fuzzer(target, ["-merge=1", f"-timeout={target.timeout_s}", f"-max_len={target.max_len}",
                        f"-artifact_prefix={tmp / 'merge-art'}/", str(keep), str(work)], tmp, 900)
    new = {p.name for p in keep.iterdir() if FOUND.fullmatch(p.name)}
    old = {p.name for p in corpus.iterdir() if FOUND.fullmatch(p.name)}
    if not new and old:     # the merge failed: keep what there is
        log.error("%s: the corpus merge kept no input; corpus left as it was", target.name)
        return 0, 0
    for name in old - new:
        (corpus / name).unlink()
    for name in new - old:
        shutil.copy(keep / name, corpus / name)
    return len(new - old), len(old - new)


def dictionary(path: Path, tokens) -> None:
    """libFuzzer's dictionary format: one quoted token a line, \\xNN for what is not printable."""
    def quoted(token: bytes) -> str:
        return "".join(chr(b) if 32 <= b < 127 and b not in b'"\\' else f"\\x{b:02x}" for b in token)
    path.write_text("".join(f'"{quoted(t)}"\n' for t in sorted(set(tokens)) if 0 < len(t) <= 120))


@dataclass
class Result:
    """One fuzzing run of a target: what bench/fuzz.py and bench/report.py write down."""
    seconds: float              # the budget
    elapsed: float              # wall time of the run
    execs: int                  # inputs run (libFuzzer's last #N)
    cov: int                    # edges
    ft: int                     # features
    before: int                 # corpus files before the run, after it
    after: int
    added: int                  # inputs the merge added, dropped
    dropped: int
    found: dict[str, str]       # new finding signature -> saved corpus file
    known: dict[str, str]       # known crash signature -> corpus file
    again: set[str]             # known signatures met again

    @property
    def rate(self) -> float:
        return self.execs / self.elapsed if self.elapsed else 0.0


def fuzz(target: Target, seconds: float, tokens=None) -> Result:
    """Run `target` under atheris (libFuzzer, fork mode: a crash ends a child, not the
    budget) for `seconds`, save what it found (minimized) into its corpus and merge the
    corpus minimal. tokens: the dictionary (default target.tokens)."""
    corpus = target.corpus
    corpus.mkdir(exist_ok=True)
    before = len(list(corpus.iterdir()))
    found: dict[str, str] = {}
    known = known_crashes(target)
    with tempfile.TemporaryDirectory(prefix=f"tandem-fuzz-{target.name}-") as t:
        tmp = Path(t)
        work, art = tmp / "work", tmp / "art"
        art.mkdir()
        # The fuzzer starts from the corpus less its known crashes and slow inputs (they
        # would end every run at once; the unit test keeps them failing until fixed).
        shutil.copytree(corpus, work, ignore=lambda d, names: [n for n in names if n.startswith(("crash-", "slow-"))])
        args = ["-fork=1", "-ignore_crashes=1", "-ignore_timeouts=1", "-ignore_ooms=1",
                f"-max_total_time={int(seconds)}", f"-timeout={target.timeout_s}",
                f"-max_len={target.max_len}", "-rss_limit_mb=2048", f"-artifact_prefix={art}/"]
        tokens = target.tokens if tokens is None else tokens
        if tokens:
            dictionary(tmp / "tokens.dict", tokens)
            args.append(f"-dict={tmp / 'tokens.dict'}")
        started = time.monotonic()
        out = run_fuzzer(target, [*args, str(work)], tmp, seconds + 300)
        elapsed = time.monotonic() - started
        stats = re.findall(r"#(\d+): cov: (\d+) ft: (\d+) corp: (\d+)", out)
        execs, cov, ft, _ = map(int, stats[-1]) if stats else (0, 0, 0, 0)
        if not stats:
            log.error("%s: the fuzzer printed no statistics; its output ends:\n%s", target.name, out[-3000:])
        again = save_findings(target, art, found, known)
        added, dropped = merge_minimal(target, work, tmp)
    return Result(seconds, elapsed, execs, cov, ft, before, len(list(corpus.iterdir())), added, dropped,
                  found, known, again)


SCRATCH_ENV = "TANDEM_FUZZ_SCRATCH"     # set by run_fuzzer for the processes it starts
_scratch: list[Path] = []


def _scratch_dir() -> Path:
    """This process's scratch directory: in /dev/shm when there is one, so an execution
    does not wait on a disk; removed when the process ends normally."""
    if not _scratch:
        shm = Path("/dev/shm")
        folder = Path(tempfile.mkdtemp(prefix="tandem-fuzz-", dir=shm if shm.is_dir() else None))
        atexit.register(shutil.rmtree, folder, True)
        _scratch.append(folder)
    return _scratch[0]


def scratch_file(data: bytes) -> Path:
    """`data` in this process's scratch file (for readers that take a path): in the
    directory run_fuzzer gave (one file per process), else in _scratch_dir()."""
    given = os.environ.get(SCRATCH_ENV)
    path = Path(given) / f"input-{os.getpid()}" if given else _scratch_dir() / "input"
    path.write_bytes(data)
    return path


def mutate(data: bytes, rnd, tokens: tuple[bytes, ...] = ()) -> bytes:
    """One random edit of `data` (a byte flipped, a run deleted or repeated, a token or a
    boundary integer inserted): the unit tests' short in-process fuzzing, deterministic
    for a seeded `rnd`, without atheris."""
    op = rnd.randrange(6)
    at = rnd.randrange(len(data) + 1)
    if op == 0 and data:
        at = min(at, len(data) - 1)
        return data[:at] + bytes([data[at] ^ (1 << rnd.randrange(8))]) + data[at + 1:]
    if op == 1:
        return data[:at] + data[at + rnd.randrange(1, 64):]
    if op == 2:     # lengths and counts spread over powers of two: 500 nested "(" is reachable
        piece = data[at:at + (1 << rnd.randrange(7))]
        return data[:at] + piece * int(2 ** rnd.uniform(1, 11)) + data[at:]
    if op == 3 and tokens:
        return data[:at] + rnd.choice(tokens) + data[at:]
    if op == 4 and len(data) >= 4:
        at = min(at, len(data) - 4)
        value = rnd.choice((0, 1, 0x7F, 0x80, 0xFF, 0xFFFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF))
        return data[:at] + value.to_bytes(4, "little") + data[at + 4:]
    return data[:at] + bytes(rnd.randrange(256) for _ in range(rnd.randrange(1, 8))) + data[at:]

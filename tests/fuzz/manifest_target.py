#!/usr/bin/env python3
"""Fuzz target of the manifest and bundle loader: no manifest.json can make
load_manifest, check_bundle or `tandem inspect` raise anything but BundleError (unchecked,
one-field changes raise ten kinds of raw exception).

One input is a manifest.json's bytes, written into a scratch bundle whose other files are
small valid ones (MEMBERS: a device log and a replay stream from the pcapng and rrstream
seeds, a qemu.log). `@BUNDLE@` in the input becomes that bundle's directory, so a seed's
`inputs` can name a file that is there (its own qemu.log) and a whole check can pass. Then
load_manifest(), check_bundle() with and without partial and a build id, and inspect()
with its printed summary (render(): one printable line each, nothing that drives a
terminal). Run by `./tandem bench fuzz [--only manifest]`
(bench/fuzz.py) for a fixed budget, or by hand:

    python tests/fuzz/manifest_target.py -max_total_time=60 WORKDIR tests/fuzz/manifest-corpus
    python tests/fuzz/manifest_target.py --make-seeds [BUNDLE.tdm...]   (how seed-* were made)
"""
from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

if __name__ == "__main__":     # run by hand or by bench/fuzz.py: tandem from this checkout
    sys.path.append(str(Path(__file__).resolve().parents[2] / "replay"))
    sys.path.insert(0, str(Path(__file__).resolve().parent))

import fuzzing  # noqa: E402

INSTRUMENT = ("tandem.formats.bundle", "tandem.cli.inspect_bundle", "json")
BUNDLE_TOKEN = b"@BUNDLE@"
BUILD_ID = "a" * 64
# The scratch bundle's files besides the manifest: name -> where its bytes come from.
MEMBERS = {
    "devices.pcapng": fuzzing.HERE / "pcapng-corpus" / "seed-format2-closed",
    "replay.tdrs": fuzzing.HERE / "rrstream-corpus" / "seed-zstd-finished",
    "qemu.log": None,
}
QEMU_LOG = b"qemu-system-x86_64: terminating on signal 15\n"
_bundle: list[Path] = []


def member_bytes(name: str) -> bytes:
    source = MEMBERS[name]
    return source.read_bytes() if source else QEMU_LOG


def scratch_bundle() -> Path:
    """This process's bundle directory (0700, its files 0600: inspect warns on a bundle
    others may read), made once, in the directory run_fuzzer gave or fuzzing's own."""
    if not _bundle:
        given = os.environ.get(fuzzing.SCRATCH_ENV)
        top = Path(given) if given else fuzzing._scratch_dir()
        d = top / f"bundle-{os.getpid()}.tdm"
        d.mkdir(mode=0o700, exist_ok=True)
        for name in MEMBERS:
            fd = os.open(d / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with open(fd, "wb") as f:
                f.write(member_bytes(name))
        _bundle.append(d)
    return _bundle[0]


def write_manifest(d: Path, data: bytes) -> None:
    fd = os.open(d / "manifest.json", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with open(fd, "wb") as f:
        f.write(data.replace(BUNDLE_TOKEN, str(d).encode()))


def one_line(e: Exception) -> None:
    assert "\n" not in str(e), f"a BundleError of {str(e).count(chr(10)) + 1} lines"


def check(data: bytes) -> None:
    """Load `data` as a bundle's manifest every way tandem does; raises what is not a
    one-line BundleError (inspect raises nothing: it lists problems)."""
    from tandem.formats import bundle
    from tandem.errors import BundleError
    from tandem.cli.inspect_bundle import inspect, render
    d = scratch_bundle()
    write_manifest(d, data)
    try:
        bundle.load_manifest(d)
    except BundleError as e:
        one_line(e)
    for kwargs in ({"partial": True}, {"qemu_build_id": BUILD_ID}):
        try:
            bundle.check_bundle(d, **kwargs)
        except BundleError as e:
            one_line(e)
    info = inspect(d)
    for problem in info["integrity"]["problems"]:
        assert isinstance(problem, str) and "\n" not in problem, f"inspect problem {problem!r}"
    text = render(info)
    assert all(line.isprintable() for line in text.split("\n")), "inspect prints a control character"


def entry(data: bytes) -> dict:
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def valid_manifest() -> dict:
    """A manifest as record.py writes it, every file of the scratch bundle listed, its
    kernel input the bundle's own qemu.log (at @BUNDLE@): check_bundle passes."""
    log_input = {"path": BUNDLE_TOKEN.decode() + "/qemu.log", **entry(QEMU_LOG)}
    return {
        "schema": 1, "tandem_version": "0.1.0", "created": "2026-11-25T10:13:54+00:00", "state": "complete",
        "qemu": {"binary": "/q/bin/qemu-system-x86_64", "build_id": BUILD_ID, "patch_series": "b" * 64,
                 "version": "10.0.13"},
        "inputs": {"kernel": log_input, "initrd": None, "disk_base": None},
        "machine": {"accel": "tcg", "machine": "pc", "icount_shift": 2, "memory_mb": 256, "smp": 1,
                    "cmdline": "console=ttyS0 panic=-1", "mac": "52:54:00:12:34:56",
                    "stop_after_ns": 0, "disk_format": "raw"},
        "files": {name: entry(member_bytes(name)) for name in MEMBERS},
        "stop": {"reason": "poweroff", "exit_status": 0, "vm_ns": 7_000, "icount": 20_000},
        "channels": {"serial0": {"kind": "serial", "records": 1, "in": {"events": 0, "bytes": 0},
                                 "out": {"events": 1, "bytes": 7}}},
        "devlog_format": 2, "wall_time_s": 1.5,
    }


def seeds(recorded: list[Path]) -> dict[str, bytes]:
    """The valid manifest; an analysis run's (feed, rtc_base, lookahead); a recording in
    progress; and each recorded bundle's manifest given, its files and inputs made the
    scratch bundle's (so its checks get past the hashes)."""
    base = valid_manifest()
    analysis = json.loads(json.dumps(base))
    analysis["machine"].update(mode="analysis", analysis="asan-userland", rtc_base="2026-11-25T10:14:10",
                               lookahead_ns=1_000_000, libvirt={"uuid": "5a4d1e2b-0000-4000-8000-000000000001"})
    recording = json.loads(json.dumps(base))
    recording.update(state="recording", files={}, stop={"reason": None, "vm_ns": None, "icount": None},
                     wall_time_s=None)
    out = {"valid": base, "analysis": analysis, "recording": recording}
    for path in recorded:
        m = json.loads((path / "manifest.json").read_text())
        m.update(files=base["files"], inputs=base["inputs"])
        out[f"recorded-{path.stem}"] = m
    return {name: json.dumps(m, indent=2, sort_keys=True).encode() + b"\n" for name, m in out.items()}


TOKENS = (b'"schema"', b'"state"', b'"complete"', b'"recording"', b'"interrupted"', b'"qemu"', b'"build_id"',
          b'"inputs"', b'"kernel"', b'"initrd"', b'"disk_base"', b'"path"', b'"size"', b'"sha256"',
          b'"machine"', b'"mac"', b'"memory_mb"', b'"stop_after_ns"', b'"lookahead_ns"', b'"rtc_base"',
          b'"mode"', b'"analysis"', b'"libvirt"', b'"files"', b'"stop"', b'"vm_ns"', b'"icount"',
          b'"channels"', b'"wall_time_s"', b'"devices.pcapng"', b'"replay.tdrs"', b'"manifest.json"',
          b'"qemu.log"', b'"../x"', b'"."', b'null', b'true', b'1e400', b'-1', b'9223372036854775808',
          b'[]', b'{}', b'"\\u0000"', b'"\\ud800"', b'"\\n"', b'"\\u001b["', BUNDLE_TOKEN, b'"/proc/self/fd/0"',
          b'"/proc/self/mem"', b'"/dev/zero"', b'"/"')
TARGET = fuzzing.Target("manifest", check, INSTRUMENT,
                        "a bundle's manifest.json: load_manifest, check_bundle and inspect's summary",
                        max_len=8192, tokens=TOKENS)


def make_seeds(recorded: list[Path]) -> int:
    TARGET.corpus.mkdir(exist_ok=True)
    made = seeds(recorded)
    for name, data in made.items():
        (TARGET.corpus / f"seed-{name}").write_bytes(data)
    print(f"{len(made)} seeds in {TARGET.corpus}")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--make-seeds"]:
        sys.exit(make_seeds([Path(p) for p in sys.argv[2:]]))
    fuzzing.main(sys.argv, check, INSTRUMENT)

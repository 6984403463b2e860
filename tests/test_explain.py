"""`tandem explain` on real VMs: the native (tandem's native kernel, no sanitizer)
recorded serving the planted KASAN bugs, the KASAN analysis's findings, and the native
replayed exactly to each finding's function and re-executed there in Unicorn."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from helpers import ROOT, assert_one_line_error, run_cli
from tandem import catalog
from tandem.explain.explain import explain, load_finding
from tandem.machine import Guest
from tandem.record.recording import Recording
from tandem.record.workload import KV, bad_requests
from tandem.semantic.analyze import analyze

KASAN = catalog.ANALYSES["kasan"]
# The planted bugs the native runs too, and the one only a KASAN kernel runs
# (guest-kernel/modules/tandem_bugs.c: dbg-note).
SHARED = ("slab-out-of-bounds Write in tb_note_store", "slab-use-after-free Read in tb_session_account",
          "slab-use-after-free Read in lkdtm_READ_AFTER_FREE")
KASAN_ONLY = "slab-out-of-bounds Write in tb_note_debug_copy"


@pytest.fixture(scope="module")
def findings_bundle(built, tmp_path_factory) -> Path:
    """The native kernel serving the planted KASAN bugs, then the KASAN analysis of it."""
    path = tmp_path_factory.mktemp("explain") / "native.tdm"
    with Recording(path, Guest.default("native")) as rec:
        rec.wait_ready()
        bad_requests(rec.port, ["kasan-oob", "kasan-uaf", "lkdtm-uaf"])
        with KV(rec.port) as kv:
            assert kv.request("BUG dbg-note") == "OK"
        rec.serial.type("poweroff")
        rec.wait(timeout=120)
    analyze(path, [KASAN], noise=False, workdir=path / "analysis")
    return path


def numbered(bundle: Path) -> dict[str, int]:
    """{title: its finding's number in findings.jsonl}"""
    lines = (bundle / "analysis" / "findings.jsonl").read_text().splitlines()
    return {json.loads(line)["title"]: n for n, line in enumerate(lines, 1)}


def kasan_says(text: str) -> tuple[str, int, int, int, str]:
    """(kind, size, offset from the region's start, region size, state), read here from the
    report's own lines, independently of explain/kasan.py."""
    a = re.search(r"(Read|Write) of size (\d+) at addr", text)
    w = re.search(r"located (\d+) bytes (inside of|to the right of)\s+(allocated|freed) (\d+)-byte region", text)
    assert a and w, text[:400]
    n, region = int(w.group(1)), int(w.group(4))
    return (a.group(1).lower(), int(a.group(2)), n if w.group(2) == "inside of" else region + n, region, w.group(3))


def test_the_native_made_each_planted_bugs_access(findings_bundle):
    titles = numbered(findings_bundle)
    for words in SHARED:
        title = f"KASAN: {words}"
        assert title in titles, sorted(titles)
        f = load_finding(findings_bundle / "analysis" / "findings.jsonl", titles[title])
        e = explain(findings_bundle, f, titles[title])
        assert e.replay_ok, e.replay
        assert e.same, e.verdict
        a = e.access
        assert a is not None
        kind, size, offset, region, state = kasan_says(f.text)
        assert (a.kind, a.size, a.offset, a.region, a.state) == (kind, size, offset, region, state), e.verdict
        # the access is the native's own, in the function the report names, at a source line
        assert a.where.startswith(e.function + "+"), a.where
        assert a.line, a
        assert a.icount > 0 and e.windows[0]["entry"]["vm_ns"] >= e.input_ns
        # a freed object's free is the native's, before the access
        if state == "freed":
            assert a.freed_icount is not None and a.freed_icount < a.icount, a
        # Unicorn's registers agreed with the replay's wherever the replay stepped in
        assert all(not w["mismatches"] for w in e.windows), [w["mismatches"] for w in e.windows]


def test_a_finding_only_the_analysis_kernel_can_make_did_not_happen_on_the_native(findings_bundle):
    titles = numbered(findings_bundle)
    title = f"KASAN: {KASAN_ONLY}"
    assert title in titles, sorted(titles)
    f = load_finding(findings_bundle / "analysis" / "findings.jsonl", titles[title])
    e = explain(findings_bundle, f, titles[title])
    assert e.same is False, e.verdict
    assert "did not" in e.verdict and "tb_note_debug_copy" in e.verdict, e.verdict
    assert e.replay_ok, e.replay


def test_the_command_prints_the_trace_and_json(findings_bundle):
    n = numbered(findings_bundle)[f"KASAN: {SHARED[0]}"]
    r = run_cli("explain", str(findings_bundle), "--finding", str(n), "--json")
    assert r.returncode == 1, r.stderr          # found: the native made it
    text = r.stderr          # the explanation for a person (as every command's), the JSON on stdout
    store = 1 + next(i for i, line in enumerate((ROOT / "guest-kernel/modules/tandem_bugs.c").read_text().splitlines())
                     if "note->text[len] = '\\0';" in line)       # the off-by-one store
    assert "the native made the same access" in text and f"(tandem_bugs.c:{store})" in text, text
    assert ">> write 1 at" in text, text
    d = json.loads(r.stdout)
    assert d["same"] is True and d["access"]["offset"] == 56 and d["access"]["region"] == 56


def test_bad_input_is_one_line(findings_bundle, demo_bundle, tmp_path):
    path = findings_bundle / "analysis" / "findings.jsonl"
    r = run_cli("explain", str(findings_bundle), "--finding", "99")
    assert_one_line_error(r, "no finding 99")
    # a finding with no kernel function: the analysis VM's crash
    crash = json.loads(path.read_text().splitlines()[0])
    crash.update(type="VM-CRASH", title="analysis VM crashed: QEMU exited", locations=[], frames=[])
    bad = tmp_path / "findings.jsonl"
    bad.write_text(json.dumps(crash) + "\n")
    r = run_cli("explain", str(findings_bundle), "--finding", "1", "--findings", str(bad))
    assert_one_line_error(r, "names no kernel function")
    # a bundle whose kernel has no vmlinux (Debian's, the demo's default)
    r = run_cli("explain", str(demo_bundle), "--finding", "1", "--findings", str(path))
    assert_one_line_error(r, "no vmlinux")
    # a recording torn part way: the replay's own one line, not the plugin's silence
    torn = tmp_path / "torn.tdm"
    shutil.copytree(findings_bundle, torn, ignore=shutil.ignore_patterns("analysis"))
    stream = torn / "replay.tdrs"
    stream.write_bytes(stream.read_bytes()[: stream.stat().st_size // 2])
    r = run_cli("explain", str(torn), "--finding", "1", "--findings", str(path))
    assert_one_line_error(r, "truncated", "replay.tdrs")
    # findings that are not findings
    junk = tmp_path / "junk.jsonl"
    junk.write_text('{"title": 3}\n')
    r = run_cli("explain", str(findings_bundle), "--finding", "1", "--findings", str(junk))
    assert_one_line_error(r, "is not a finding")


def test_the_semantic_replays_summary_explains_each_kernel_finding(findings_bundle, tmp_path):
    r = run_cli("replay", str(findings_bundle), "--analysis", "kasan", "--no-noise", "--no-record",
                "--explain", "--workdir", str(tmp_path), timeout=900)
    assert r.returncode == 1, r.stderr[-2000:]       # found
    assert "Explained on the native" in r.stderr, r.stderr[-2000:]
    done = {x["title"]: x for x in json.loads((tmp_path / "summary.json").read_text())["explanations"]}
    for words in SHARED:
        x = done[f"KASAN: {words}"]
        assert x["same"] is True and x["replay_ok"], x
    assert done[f"KASAN: {KASAN_ONLY}"]["same"] is False, done

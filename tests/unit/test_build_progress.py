"""The build's progress line (tandem/setup/build.py): what each build step reports."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "replay"))

from tandem.setup import build  # noqa: E402


def test_a_counted_step_says_how_far_and_what_is_left():
    p = build.Progress("kernel-kasan", start=1000.0, done=300, total=1200, unit="files")
    # 300 files in 60 s: 900 more at that rate is 180 s.
    assert p.text(1060.0) == "kernel-kasan 300/1200 files (25%, ~3 min left)"
    assert build.Progress("qemu", 1000.0, 700, 1400, "steps").text(1030.0) == "qemu 700/1400 steps (50%, ~30 s left)"


def test_past_the_count_it_is_linking_and_a_short_step_shows_its_time():
    assert build.Progress("kernel-native", 0.0, 1209, 1209, "files").text(10.0) == "kernel-native 1209/1209 files, linking"
    assert build.Progress("guest", 100.0, 0, 0, "-").text(112.0) == "guest (12 s)"
    assert build.Progress("kernel-native", 0.0, 40, 0, "files").text(10.0) == "kernel-native 40 files"


def test_progress_files_half_written_or_gone_are_skipped(tmp_path, monkeypatch):
    monkeypatch.setenv("TANDEM_CACHE", str(tmp_path))
    d = build.progress_dir()
    d.mkdir()
    (d / "qemu").write_text("1000 10 1400 steps\n")
    (d / "kernel-native").write_text("1000 1")          # caught mid-write
    got = build.read_progress(["qemu", "kernel-native", "guest"])
    assert [(p.target, p.done, p.total) for p in got] == [("qemu", 10, 1400)]


def test_groups_expand_in_order_without_repeats():
    assert build.expand(["record", "kernel-stock", "plugin-calls"]) == \
        ["qemu", "kernel-stock", "modules-stock", "guest", "plugin-calls"]
    assert set(build.expand([])) == set(build.GROUPS["all"])

"""qemu-patches/ as a QEMU developer would take it (scripts/qemu-series.sh): every patch clean
under QEMU 10.0's own scripts/checkpatch.pl (from the Debian source build-qemu.sh builds),
signed off, with a subject of at most 76 characters and a body, and a cover letter."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PATCHES = ROOT / "qemu-patches"
SERIES = (PATCHES / "series").read_text().split()


def test_checkpatch_finds_nothing():
    r = subprocess.run(["bash", str(ROOT / "scripts" / "qemu-series.sh"), "check"], capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr


def test_each_patch_is_signed_off_with_a_subject_and_a_body():
    for n, name in enumerate(SERIES, 1):
        text = (PATCHES / name).read_text()
        head, _, _ = text.partition("\n---\n")
        subject = re.search(r"^Subject: \[PATCH (\d+)/(\d+)\] (.*(?:\n .*)*)", head, re.M)
        assert subject, name
        assert (int(subject.group(1)), int(subject.group(2))) == (n, len(SERIES)), name
        summary = subject.group(3).replace("\n ", " ")
        assert len(summary) <= 76 and re.match(r"^[\w/., -]+: \S", summary), (name, summary)
        body = head[subject.end():].strip()
        assert "Signed-off-by: tandem <tandem@localhost>" in body, name
        assert len(body.replace("Signed-off-by: tandem <tandem@localhost>", "").strip()) > 80, (name, "no body")


def test_the_cover_letter_and_the_stock_baseline():
    cover = (PATCHES / "0000-cover-letter.patch").read_text()
    assert f"[PATCH 00/{len(SERIES)}]" in cover and "*** SUBJECT HERE ***" not in cover
    # the benchmarks' stock QEMU is Debian's with the device set alone: the first patch
    assert (PATCHES / "stock-series").read_text().split() == SERIES[:1]

"""qemu-patches/ as a QEMU developer would take it (scripts/qemu-series.sh), and the upstream
series in qemu-patches/upstream/ (the general fixes on Debian's QEMU 10.0 alone): every patch
clean under QEMU 10.0's own scripts/checkpatch.pl (from the Debian source build-qemu.sh
builds), signed off, with a subject of at most 76 characters and a body, and a cover letter."""
from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PATCHES = ROOT / "qemu-patches"
SERIES = (PATCHES / "series").read_text().split()
SERIESES = {"tandem": [], "upstream": ["--upstream"]}


def patches(which: str) -> tuple[Path, list[str]]:
    d = PATCHES if which == "tandem" else PATCHES / "upstream"
    return d, (d / "series").read_text().split()


@pytest.mark.parametrize("which", SERIESES)
def test_checkpatch_finds_nothing(which):
    r = subprocess.run(["bash", str(ROOT / "scripts" / "qemu-series.sh"), *SERIESES[which], "check"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("which", SERIESES)
def test_each_patch_is_signed_off_with_a_subject_and_a_body(which):
    d, series = patches(which)
    for n, name in enumerate(series, 1):
        text = (d / name).read_text()
        head, _, _ = text.partition("\n---\n")
        subject = re.search(r"^Subject: \[PATCH (\d+)/(\d+)\] (.*(?:\n .*)*)", head, re.M)
        assert subject, name
        assert (int(subject.group(1)), int(subject.group(2))) == (n, len(series)), name
        summary = subject.group(3).replace("\n ", " ")
        assert len(summary) <= 76 and re.match(r"^[\w/., -]+: \S", summary), (name, summary)
        body = head[subject.end():].strip()
        assert "Signed-off-by: tandem <tandem@localhost>" in body, name
        assert len(body.replace("Signed-off-by: tandem <tandem@localhost>", "").strip()) > 80, (name, "no body")


@pytest.mark.parametrize("which", SERIESES)
def test_the_cover_letter(which):
    d, series = patches(which)
    cover = (d / "0000-cover-letter.patch").read_text()
    assert f"[PATCH 00/{len(series)}]" in cover and "*** SUBJECT HERE ***" not in cover


def test_the_stock_baseline():
    # the benchmarks' stock QEMU is Debian's with the device set alone: the first patch
    assert (PATCHES / "stock-series").read_text().split() == SERIES[:1]


def subject(path: Path) -> str:
    m = re.search(r"^Subject: \[PATCH [^]]*\] (.*(?:\n .*)*)", path.read_text(), re.M)
    assert m, path
    return m.group(1).replace("\n ", " ")


def test_the_upstream_series_is_tandems_general_fixes():
    """Each upstream patch is one of tandem's series, by subject: the same fix, ported."""
    d, series = patches("upstream")
    ours = {subject(PATCHES / n) for n in SERIES}
    assert len(series) == 14
    assert {subject(d / n) for n in series} <= ours


def new_files(which: str) -> Iterator[tuple[str, str, list[str]]]:
    """(patch, path, its added lines) for each file a patch of the series creates."""
    d, names = patches(which)
    for name in names:
        text = (d / name).read_text()
        for m in re.finditer(r"^diff --git a/(\S+) b/\S+\nnew file mode", text, re.M):
            end = text.find("\ndiff --git", m.end())
            yield name, m.group(1), [line[1:] for line in text[m.end():None if end < 0 else end].splitlines()
                                     if line.startswith("+") and not line.startswith("+++")]


@pytest.mark.parametrize("which", SERIESES)
def test_every_new_file_has_an_spdx_line(which):
    """QEMU wants an SPDX-License-Identifier line in every new file; QEMU 10.0's checkpatch.pl
    asks for it only when another new file follows in the same patch."""
    missing = [f"{name}: {path}" for name, path, added in new_files(which)
               if not any("SPDX-License-Identifier:" in line for line in added[:80])]
    assert not missing, missing


# Licence texts QEMU's checkpatch.pl refuses in a new file since 10.1, where the SPDX line
# alone says the licence (an error "must not have license boilerplate header text"); 10.0's
# does not look for them, and upstream's script is not reachable here.
BOILERPLATE = ("licensed under the terms of the GNU GPL", "under the terms of the GNU General Public License",
               "under the terms of the GNU Lesser General Public", "Permission is hereby granted, free of charge",
               "GNU GPL, version 2 or later", "See the COPYING file")


@pytest.mark.parametrize("which", SERIESES)
def test_no_new_file_carries_licence_boilerplate(which):
    found = [f"{name}: {path}: {line.strip()}" for name, path, added in new_files(which)
             for line in added if any(b in line for b in BOILERPLATE)]
    assert not found, found

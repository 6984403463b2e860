"""The catalogue of analyses is the one list: the build, the CLI, the demo, the
equivalence defaults and the report dialects all agree with it."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tandem import catalog, report
from tandem.semantic.comparison import equivalence
from tandem.cli.main import build_parser
from tandem.cli.demo import DEMO_ANALYSES
from tandem.errors import TandemError
from tandem.setup import build

ROOT = Path(__file__).resolve().parents[2]
KERNEL_DIR = ROOT / "guest-kernel" / "linux"
PACKAGE = ROOT / "replay" / "tandem"
# Where analyses are named and resolved: the command line, and the catalogue itself.
RESOLVERS = (PACKAGE / "cli", PACKAGE / "catalog.py")


def test_meson_flavor_list_is_the_catalogues():
    assert tuple((KERNEL_DIR / "FLAVORS").read_text().split()) == catalog.FLAVORS


def test_every_flavor_has_a_config_fragment_or_a_debian_package_and_each_a_flavor():
    fragments = {p.stem for p in KERNEL_DIR.glob("*.config")} - {"base"}
    debian = {p.stem for p in KERNEL_DIR.glob("*.debian")}
    assert fragments | debian == set(catalog.FLAVORS) and not fragments & debian
    assert catalog.DEFAULT_KERNEL in debian        # the demo guest's kernel is fetched, not compiled


def test_each_freebsd_flavor_is_a_meson_target_with_its_config():
    """meson.build's kernel-freebsd-* targets, guest-kernel/freebsd/TANDEM-*, the catalogue."""
    meson = (ROOT / "meson.build").read_text()
    m = re.search(r"foreach flavor : \[([^\]]*)\]\n  (?:\w+ \+= )?custom_target\('kernel-freebsd-'", meson)
    assert m, "meson.build: no foreach over the FreeBSD flavors"
    listed = tuple(f.strip().strip("'") for f in m.group(1).split(","))
    assert tuple(f"freebsd-{f}" for f in listed) == catalog.FREEBSD_FLAVORS
    configs = {p.name for p in (ROOT / "guest-kernel" / "freebsd").glob("TANDEM-*")}
    assert configs == {f"TANDEM-{f.removeprefix('freebsd-').upper()}" for f in catalog.FREEBSD_FLAVORS}
    assert build.GROUPS["freebsd"] == ["freebsd-toolchain", *(f"kernel-{f}" for f in catalog.FREEBSD_FLAVORS),
                                       "freebsd-guest", "freebsd-boot", "freebsd-disk"]
    assert not set(build.GROUPS["freebsd"]) & set(build.GROUPS["all"])     # a Linux user builds none
    assert all(catalog.KERNELS[f].os == "freebsd" for f in catalog.FREEBSD_FLAVORS)


def test_build_groups_follow_the_catalogue():
    for flavor in catalog.FLAVORS:
        assert f"kernel-{flavor}" in build.GROUPS["all"] and f"modules-{flavor}" in build.GROUPS["all"]


def test_every_analysis_is_well_formed():
    for a in catalog.ALL:
        assert catalog.KERNELS[a.flavor] == a.kernel and catalog.USERLANDS[a.userland.name] == a.userland
        assert a.os in catalog.GUEST_OSES and a.os in report.OSES
        equivalence.load(a, None)               # its built-in rules load
        assert a.summary and "\n" not in a.summary


def test_cli_offers_what_the_catalogue_has():
    p = build_parser()
    sub = next(a for a in p._actions if a.dest == "cmd").choices
    record = {a.dest: a for a in sub["record"]._actions}
    assert list(record["kernel"].choices) == list(catalog.KERNELS)
    assert list(record["userland"].choices) == list(catalog.USERLANDS)
    for cmd in ("replay", "shadow", "attach"):
        helptext = next(a.help for a in sub[cmd]._actions if a.dest == "analysis")
        assert all(a.name in helptext for a in catalog.ALL), cmd


def test_demo_runs_every_analysis_the_catalogue_puts_in_it():
    names = {a.name for a in DEMO_ANALYSES}
    assert names | {"native"} == {a.name for a in catalog.ALL if a.demo}
    assert {"debug", "asan-userland"} <= names
    # its one sanitizer kernel has KASAN and lockdep (guest-kernel/linux/debug.config)
    debug = (KERNEL_DIR / "debug.config").read_text().split()
    assert {"CONFIG_KASAN=y", "CONFIG_PROVE_LOCKING=y"} <= set(debug)


def test_demo_builds_the_kernels_of_its_analyses_only():
    flavors = {a.flavor for a in DEMO_ANALYSES} - {catalog.DEFAULT_KERNEL}
    assert set(catalog.demo_build_targets()) == {f"{part}-{f}" for f in flavors for part in ("kernel", "modules")}
    # kcsan and ubsan: not in the demo (a kernel more each, built on request)
    assert not {"kernel-kcsan", "kernel-ubsan"} & set(catalog.demo_build_targets())


@pytest.mark.parametrize("name", ["valgrind", "", None, "kasan,ubsan"])
def test_unknown_analysis_is_one_line(name):
    with pytest.raises(TandemError, match="unknown analysis") as e:
        catalog.get(name)
    assert "\n" not in str(e.value) and "kasan" in str(e.value)


def name_lookups(path: Path) -> list[str]:
    """Where the module at path looks an analysis up by name: catalog.get, or the
    catalogue's table (catalog.ANALYSES), used or imported."""
    found = []
    where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "catalog" \
                and node.attr in ("get", "ANALYSES"):
            found.append(f"{where}:{node.lineno}: catalog.{node.attr}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").rpartition(".")[2] == "catalog":
            found += [f"{where}:{node.lineno}: from catalog import {a.name}"
                      for a in node.names if a.name in ("get", "ANALYSES")]
    return found


def test_no_stage_resolves_an_analysis_by_name():
    """The CLI turns names into catalog.Analysis values once; below it every stage takes
    those values (a user's analysis exists in no table a stage could look it up in)."""
    modules = [p for p in PACKAGE.rglob("*.py") if not any(p.is_relative_to(r) for r in RESOLVERS)]
    assert len(modules) > 50
    assert [hit for p in modules for hit in name_lookups(p)] == []


def test_the_name_lookup_check_finds_one(tmp_path):
    planted = tmp_path / "stage.py"
    planted.write_text("from .. import catalog\nfrom ..catalog import get\n\n\n"
                       "def guest(name):\n    return catalog.get(name), catalog.ANALYSES[name]\n")
    assert [hit.split(": ", 1)[1] for hit in name_lookups(planted)] == [
        "from catalog import get", "catalog.get", "catalog.ANALYSES"]

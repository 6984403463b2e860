"""Which builds a command must make first, and how long it says they take (setup/state):
a build directory and cache of the test's own, build JSONs written as the scripts write
them, ninja's log as ninja writes it."""
from __future__ import annotations

import json

import pytest

from tandem import catalog
from tandem.setup import state


@pytest.fixture
def dirs(tmp_path, monkeypatch):
    build, cache = tmp_path / "build", tmp_path / "cache"
    build.mkdir()
    cache.mkdir()
    monkeypatch.setenv("TANDEM_BUILD_DIR", str(build))
    monkeypatch.setenv("TANDEM_CACHE", str(cache))
    return build, cache


def test_a_target_never_built_or_whose_files_are_gone_is_stale(dirs, tmp_path):
    build, _ = dirs
    assert state.why_stale("kernel-kasan") == "not built"
    (build / "plugin-calls.json").write_text(json.dumps({"plugin": str(tmp_path / "gone.so"), "key": "k"}))
    assert "gone from the cache" in state.why_stale("plugin-calls")
    (tmp_path / "here.so").write_bytes(b"")
    (build / "plugin-calls.json").write_text(json.dumps({"plugin": str(tmp_path / "here.so"), "key": "k"}))
    assert state.why_stale("plugin-calls") is None


def test_modules_are_stale_once_their_kernel_was_built_again(dirs, tmp_path):
    build, _ = dirs
    (tmp_path / "m.cpio").write_bytes(b"")
    (build / "modules-native.json").write_text(json.dumps({"kernel_key": "old", "cpio": str(tmp_path / "m.cpio")}))
    (build / "kernel-native.json").write_text(json.dumps({"key": "new"}))
    assert state.why_stale("modules-native") == "stale"
    (build / "kernel-native.json").write_text(json.dumps({"key": "old"}))
    assert state.why_stale("modules-native") is None


def _ninja_log(build, entries):
    with open(build / ".ninja_log", "a") as f:
        if f.tell() == 0:
            f.write("# ninja log v5\n")
        for start, end, out in entries:
            f.write(f"{start}\t{end}\t0\t{out}\tabcdef\n")


def test_build_times_are_taken_from_what_ninja_logged_since_and_scale_the_estimates(dirs):
    build, cache = dirs
    _ninja_log(build, [(0, 500_000, "kernel-native.json")])          # an earlier run: not this build's
    offset = state.ninja_log_size()
    # each ninja run counts from its own start; a cached target's no-op run is not a build time
    _ninja_log(build, [(0, 760_000, "kernel-native.json"), (10, 1_500, "guest.json"), (0, 556_000, "qemu.json")])
    state.record_times(["kernel-native", "guest", "qemu"], offset)
    times = json.loads((cache / state.TIMES).read_text())
    assert times == {"kernel-native": 760, "qemu": 556}
    # this machine builds at twice the reference's times: a kernel never built here is scaled
    assert state.machine_factor() == pytest.approx(2.0, rel=0.01)
    s, here = state.estimate_s(["kernel-kasan", "modules-kasan"])
    assert here and s == pytest.approx(2 * (state.REFERENCE_S["kernel-kasan"] + 4), rel=0.01)
    assert state.estimate_text(["kernel-native"]) == "about 13 min on this machine"


def test_before_anything_was_built_here_the_estimate_names_the_reference_machine(dirs):
    text = state.estimate_text(["kernel-kasan", "modules-kasan"])
    assert text.startswith("about 9 min on a 2-core machine that builds a kernel in 6 min"), text
    assert "not timed here yet" in text
    # two at a time: three kernels take about half their sum; one long one, its own time
    three = ["kernel-kasan", "kernel-ubsan", "kernel-lockdep"]
    assert state.estimate_s(three)[0] == pytest.approx(sum(state.REFERENCE_S[t] for t in three) / 2)
    assert state.estimate_s(["kernel-kasan", "guest"])[0] == state.REFERENCE_S["kernel-kasan"]


@pytest.mark.parametrize("names, wanted", [
    (["kasan"], ["qemu", "guest", "kernel-kasan", "modules-kasan"]),
    (["asan-userland", "native"], ["qemu", "guest", "kernel-stock", "modules-stock", "kernel-native",
                                   "modules-native"]),
    (["kasan", "lockdep"], ["qemu", "guest", "kernel-kasan", "modules-kasan", "kernel-lockdep", "modules-lockdep"]),
])
def test_an_analysis_builds_its_own_kernel_and_nothing_else(names, wanted):
    assert catalog.build_targets([catalog.ANALYSES[n] for n in names]) == wanted


def test_a_kernel_the_user_brought_needs_no_kernel_build(tmp_path):
    mine = catalog.brought_kernel("mine", str(tmp_path / "bzImage"))
    assert catalog.build_targets([mine]) == ["qemu", "guest"]


def test_each_script_says_where_its_build_of_the_current_key_is_cached(dirs):
    """What `tandem build` counts and prunes by: the file whose presence says a key's build
    is cached, as the script itself prints it (TANDEM_KEY_ONLY=1)."""
    _, cache = dirs
    for target in ("kernel-kasan", "guest", "refvm", "asan-redis"):
        c = state.cached(target)
        assert c is not None and c.key == state.current_key(target), target
        assert c.marker.is_relative_to(cache) and c.key in str(c.marker.parent), c
        assert not c.present
    kasan = state.cached("kernel-kasan")
    assert [d.parent.name for d in kasan.shares] == ["linux-src"]     # the source tree every flavor builds from
    need, todo = state.growth(["kernel-kasan", "kernel-ubsan", "modules-kasan"])
    assert todo == ["kernel-kasan", "kernel-ubsan"]
    # the source tree once, not once a flavor
    assert need == state.GROWTH["kernel-kasan"] + state.GROWTH["kernel-ubsan"] + state.SHARED_GROWTH["linux-src/KEY"]
    # cached by another checkout (the clone CI makes): nothing to add
    kasan.marker.parent.mkdir(parents=True)
    kasan.marker.write_text("6.12\n")
    assert state.growth(["kernel-kasan"]) == (0, [])


def test_superseded_builds_are_other_keys_of_the_same_build_beyond_the_last_used(dirs):
    import os
    _, cache = dirs
    kasan = state.cached("kernel-kasan")
    kdir = kasan.marker.parent.parent
    old = [kdir / f"kasan-{k:016x}" for k in (1, 2, 3)]
    for i, d in enumerate(old):
        d.mkdir(parents=True)
        os.utime(d, (1_000_000 + i, 1_000_000 + i))
    # not kasan's: another flavor's key, its object tree (no key), a build cut short
    for name in (f"native-{4:016x}", "obj-kasan", f".tmp-kasan-{5:016x}-42"):
        (kdir / name).mkdir()
    src = cache / "linux-src" / f"{6:016x}"       # the source tree of another kernel release
    src.mkdir(parents=True)
    # the most recently used other key is kept, of the build and of the tree it shares
    assert sorted(state.superseded(kasan)) == old[:2]
    assert state.superseded(kasan, keep=0) == [old[2], old[1], old[0], src]
    assert state.superseded(state.cached("kernel-ubsan")) == []
    state.used(kasan)       # its own directory does not exist yet: nothing to mark, no error
    kasan.marker.parent.mkdir()
    os.utime(kasan.marker.parent, (1, 1))
    state.used(kasan)
    assert kasan.marker.parent.stat().st_mtime > old[2].stat().st_mtime

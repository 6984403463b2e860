"""The assertion packs in guest-kernel/assertions: they parse, name functions the kernel
has out of line, and mean what their comments say (over synthetic event streams)."""
import re
from pathlib import Path

import pytest
from tandem import artifacts
from tandem.assertions.automata import Checker
from tandem.assertions.events import Event
from tandem.assertions.lang import load_symbols, main, parse_file
from tandem.errors import TandemError

ROOT = Path(__file__).resolve().parents[2]
PACKS = ROOT / "guest-kernel" / "assertions"
LINUX, LSM, FREEBSD = PACKS / "linux-6.12.tesla", PACKS / "linux-6.12-lsm.tesla", PACKS / "freebsd-14.tesla"
MODULE_SRC = ROOT / "guest-kernel" / "modules" / "tandem_bugs.c"
FREEBSD_NAMES = Path(__file__).parent / "data" / "freebsd-14-symbols.txt"
MODULE_CONTRACT = {"tb_proc_write", "tb_audit_check", "tb_table_update", "tb_table_lock_acquire",
                   "tb_table_lock_release"}


def native_kernel() -> tuple[Path, Path] | None:
    """(System.map, config) of the native build: this checkout's build, else the cache."""
    try:
        k = artifacts.kernel("native")
        return Path(k["system_map"]), Path(k["config"])
    except TandemError:
        maps = sorted((artifacts.cache_dir() / "kernel").glob("native-*/System.map"),
                      key=lambda p: p.stat().st_mtime)
        return (maps[-1], maps[-1].with_name("config")) if maps else None


@pytest.fixture(scope="module")
def kernel_syms():
    k = native_kernel()
    if k is None or not k[0].exists():
        pytest.skip("no native kernel System.map (./tandem build)")
    return load_symbols(k[0]), k[1]


def module_functions() -> dict[str, str]:
    """Functions tandem_bugs.c defines (definitions start in column 0) -> their line."""
    return {m.group(1): m.group(0)
            for m in re.finditer(r"^[a-z][^;\n]*?\b(tb_\w+)\(", MODULE_SRC.read_text(), re.MULTILINE)}


@pytest.mark.parametrize("pack", [LINUX, LSM, FREEBSD], ids=lambda p: p.name)
def test_pack_parses(pack):
    s = parse_file(pack)
    assert len(s) >= 10 and all(a.line for a in s)


def test_linux_pack_kernel_functions_are_out_of_line(kernel_syms):
    syms, _ = kernel_syms
    kernel = parse_file(LINUX).symbols() - MODULE_CONTRACT
    assert sorted(kernel - set(syms)) == []
    parse_file(LINUX, symbols=[set(syms), MODULE_CONTRACT])       # the CLI's union form


def test_linux_pack_module_functions_match_the_module():
    assert {s for s in parse_file(LINUX).symbols() if s.startswith("tb_")} == MODULE_CONTRACT
    defined = module_functions()
    assert sorted(MODULE_CONTRACT - set(defined)) == []
    # a static function the compiler may inline has no entry to put a breakpoint on;
    # the /proc handler is called through proc_ops, so it stays out of line anyway
    assert [f for f in sorted(MODULE_CONTRACT - {"tb_proc_write"}) if "noinline" not in defined[f]] == []


def test_lsm_pack_operations_exist(kernel_syms):
    syms, _ = kernel_syms
    ops = {s for s in parse_file(LSM).symbols() if not s.startswith("security_")}
    assert sorted(ops - set(syms)) == []


def test_lsm_pack_hooks_exist(kernel_syms):
    syms, config = kernel_syms
    if "CONFIG_SECURITY=y" not in config.read_text():
        pytest.skip("the native kernel has CONFIG_SECURITY off: LSM hooks are inline stubs")
    parse_file(LSM, symbols=syms)


def test_freebsd_pack_against_the_hand_written_symbol_list():
    s = parse_file(FREEBSD, symbols=FREEBSD_NAMES)
    names = {a.name.split("-")[0] + "-" + a.name.split("-")[1] for a in s}
    assert {"mac-socket", "mac-proc", "mac-cred", "mac-vnode", "proc-fork", "proc-reap"} <= names


def test_validation_entry_point(capsys, tmp_path):
    assert main([str(FREEBSD), "--symbols", str(FREEBSD_NAMES)]) == 0
    assert "41 assertions" in capsys.readouterr().out
    only = tmp_path / "few.syms"
    only.write_text("kern_sendit\n")
    assert main([str(FREEBSD), "--symbols", str(only)]) == 2
    assert re.match(r".*freebsd-14\.tesla:\d+:\d+: unknown symbol 'sosend'", capsys.readouterr().err)


# --- the Linux pack's meaning over synthetic streams --------------------------------------------

class Stream:
    def __init__(self):
        self.events = []

    def ev(self, kind, func, *args, ret=None, task=0x1000):
        n = len(self.events)
        self.events.append(Event(kind, func, tuple(args) + (0,) * (6 - len(args)), ret, task, n * 100, n, 0))
        return self


def violations(stream, names):
    chk = Checker(parse_file(LINUX).select(names))
    return [v for e in stream.events for v in chk.feed(e)] + chk.finish()


def tb_write(s, audited, ret=0):
    s.ev("call", "tb_proc_write")
    if audited:
        s.ev("call", "tb_audit_check").ev("return", "tb_audit_check", ret=ret)
    s.ev("call", "tb_table_update").ev("call", "tb_table_lock_acquire").ev("call", "tb_table_lock_release")
    return s.ev("return", "tb_proc_write", ret=4)


def test_planted_path_is_caught():
    names = ["tb-audit-before-table-update", "tb-table-lock-released"]
    assert violations(tb_write(Stream(), audited=True), names) == []
    s = tb_write(tb_write(Stream(), audited=True), audited=False)
    (v,) = violations(s, names)
    assert (v.assertion, v.event.func, v.event.icount) == ("tb-audit-before-table-update", "tb_table_update", 8)
    (v,) = violations(tb_write(Stream(), audited=True, ret=-13), names)     # a failed audit does not count
    assert v.expected == ["returnfrom(tb_audit_check) == 0"]


def test_unreleased_table_lock_is_caught():
    s = Stream().ev("call", "tb_proc_write").ev("call", "tb_table_lock_acquire").ev("return", "tb_proc_write")
    (v,) = violations(s, ["tb-table-lock-released"])
    assert v.reason == "tb_proc_write returned before call(tb_table_lock_release)"


def test_vfs_open_normal_and_o_path():
    path, f = 0xFFFFC90000123E48, 0xFFFF888001234500
    normal = (Stream().ev("call", "do_sys_openat2")
              .ev("return", "inode_permission", 0, 0, 1, ret=0)          # path walk
              .ev("return", "inode_permission", 0, 0, 0x24, ret=0)       # may_open's MAY_OPEN check
              .ev("return", "may_open", 0, path, ret=0)
              .ev("call", "vfs_open", path, f).ev("call", "do_dentry_open", f)
              .ev("return", "do_sys_openat2", ret=3))
    o_path = (Stream().ev("call", "do_sys_openat2")
              .ev("return", "path_lookupat", 0, 0, path, ret=0)
              .ev("call", "vfs_open", path, f).ev("call", "do_dentry_open", f)
              .ev("return", "do_sys_openat2", ret=3))
    assert violations(normal, ["vfs-open-permission-checked"]) == []
    assert violations(o_path, ["vfs-open-permission-checked"]) == []
    unchecked = (Stream().ev("call", "do_sys_openat2").ev("return", "may_open", 0, path + 8, ret=0)
                 .ev("call", "vfs_open", path, f).ev("call", "do_dentry_open", f).ev("return", "do_sys_openat2"))
    (v,) = violations(unchecked, ["vfs-open-permission-checked"])
    assert v.event.func == "vfs_open" and len(v.alternatives) == 1


def test_socket_lock_pairing_with_a_sleep_in_between():
    sk = 0xFFFF888002000000
    s = (Stream().ev("call", "sock_write_iter").ev("call", "lock_sock_nested", sk, 0)
         .ev("call", "release_sock", sk).ev("call", "lock_sock_nested", sk, 0)    # sk_wait_event
         .ev("call", "release_sock", sk).ev("return", "sock_write_iter"))
    assert violations(s, ["sock-write-releases-socket-lock"]) == []
    s = (Stream().ev("call", "sock_write_iter").ev("call", "lock_sock_nested", sk, 0)
         .ev("call", "release_sock", sk + 64).ev("return", "sock_write_iter"))
    (v,) = violations(s, ["sock-write-releases-socket-lock"])
    assert v.bindings == {"sk": sk}

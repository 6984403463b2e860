"""A bundle comes from outside: its manifest is checked field by field when it loads.
Every one-field change below gives one BundleError naming the field, and no
value reaches a QEMU option string or a file read outside the bundle."""
from __future__ import annotations

import copy
import json

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tandem.formats import bundle
from tandem.errors import BundleError
from tandem.cli.inspect_bundle import inspect

from helpers.bundles import make_bundle

# (where in the manifest, the value put there, the field the error must name)
ONE_FIELD = [
    (("files", "devices.pcapng"), "abc", "files.devices.pcapng"),
    (("files",), [1, 2], "files"),
    (("files", "x" * 300), {"size": 1, "sha256": "0" * 64}, "files"),
    (("files", "../../etc/passwd"), {"size": 1, "sha256": "0" * 64}, "files"),
    (("inputs",), "kernel", "inputs"),
    (("inputs", "kernel", "path"), 3, "inputs.kernel.path"),
    (("inputs", "kernel", "size"), -1, "inputs.kernel.size"),
    (("inputs", "kernel", "sha256"), "zz", "inputs.kernel.sha256"),
    (("inputs", "bootloader"), {"path": "/x", "size": 1, "sha256": "0" * 64}, "inputs"),
    (("machine", "mac"), "52:54:00:12:34:56,romfile=/etc/shadow", "machine.mac"),
    (("machine", "stop_after_ns"), "1,stop-after=2", "machine.stop_after_ns"),
    (("machine", "stop_after_ns"), True, "machine.stop_after_ns"),
    (("machine", "lookahead_ns"), 1.5, "machine.lookahead_ns"),
    (("machine", "rtc_base"), "2026-01-01T00:00:00,driftfix=slew", "machine.rtc_base"),
    (("machine", "memory_mb"), 10**30, "machine.memory_mb"),
    (("machine", "disk_format"), "raw,file.driver=host_device", "machine.disk_format"),
    (("machine", "cmdline"), "console=ttyS0\0", "machine.cmdline"),
    (("machine",), "pc", "machine"),
    (("machine", "boot"), "pxe", "machine.boot"),
    (("machine", "disks"), [{"id": "disk0", "format": "raw,file.driver=host_device"}], "machine.disks"),
    (("machine", "disks"), [{"id": "disk0,x=y"}], "machine.disks"),
    (("machine", "disks"), [{"format": "raw"}], "machine.disks"),
    (("machine", "disks"), [{"id": f"d{i}"} for i in range(17)], "machine.disks"),
    (("machine", "nics"), [{"netdev": "net0", "mac": "52:54:00:12:34:56,romfile=/x"}], "machine.nics"),
    (("machine", "nics"), [{"netdev": "net0", "model": "virtio-net-pci", "romfile": "/x"}], "machine.nics"),
    (("inputs", "disk_base.x,y"), {"path": "/x", "size": 1, "sha256": "0" * 64}, "inputs"),
    (("stop",), "shutdown", "stop"),
    (("stop", "vm_ns"), "6000", "stop.vm_ns"),
    (("stop", "power_button"), "yes", "stop.power_button"),
    (("state",), ["complete"], "state"),
    (("qemu", "build_id"), {"a": 1}, "qemu.build_id"),
    (("qemu", "a\nb"), False, "qemu.'a\\nb'"),     # a key that would cut the message
    (("wall_time_s",), "1.5", "wall_time_s"),
]


def _set(m: dict, where: tuple, value) -> dict:
    m = copy.deepcopy(m)
    table = m
    for key in where[:-1]:
        table = table[key]
    table[where[-1]] = value
    return m


@pytest.mark.parametrize("where, value, field", ONE_FIELD, ids=[f for _, _, f in ONE_FIELD])
def test_one_field_changed_is_one_error_naming_it(tmp_path, where, value, field):
    d, m = make_bundle(tmp_path)
    bundle.write_manifest(d, _set(m, where, value))
    with pytest.raises(BundleError) as e:
        bundle.load_manifest(d)
    message = str(e.value)
    assert "\n" not in message and f"manifest.json: {field}" in message, message
    # inspect reports it among the bundle's problems and goes on (a `stop` string crashed it)
    assert message in inspect(d)["integrity"]["problems"]


def test_a_well_formed_manifest_loads(tmp_path):
    d, m = make_bundle(tmp_path)
    m["machine"].update(mac="52:54:00:12:34:56", stop_after_ns=0, rtc_base="2026-11-25T09:30:00",
                        lookahead_ns=1_000_000, mode="analysis", disk_format="qcow2", cmdline="console=ttyS0")
    bundle.write_manifest(d, m)
    assert bundle.load_manifest(d).to_json() == m


def test_a_symlink_in_a_bundle_is_not_followed(tmp_path):
    d, m = make_bundle(tmp_path)
    secret = tmp_path / "secret"
    secret.write_bytes(b"not the bundle's")
    (d / "link").symlink_to(secret)
    m["files"]["link"] = bundle.file_entry(secret).to_json()
    bundle.write_manifest(d, m)
    problems = bundle.verify_files(d, bundle.Manifest.from_json(m))
    assert [p.file for p in problems] == ["link"] and "symbolic link" in problems[0].message
    with pytest.raises(BundleError, match="symbolic link"):
        bundle.check_bundle(d)


def test_a_symlinked_stream_is_refused_even_if_the_manifest_omits_it(tmp_path):
    d, m = make_bundle(tmp_path)
    (d / bundle.STREAM).unlink()
    (d / bundle.STREAM).symlink_to("/etc/passwd")
    del m["files"][bundle.STREAM]
    bundle.write_manifest(d, m)
    with pytest.raises(BundleError, match="symbolic link"):
        bundle.check_bundle(d)


json_value = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
                          lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                          max_leaves=8)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.lists(st.sampled_from(["files", "inputs", "kernel", "machine", "mac", "stop", "state", "qemu",
                                      "size", "sha256", "path", "memory_mb", "devices.pcapng"]), min_size=1, max_size=3),
       value=json_value)
def test_any_value_anywhere_loads_or_is_one_bundle_error(tmp_path, path, value):
    """One bundle for every example (hypothesis reuses tmp_path); each writes its own manifest."""
    d = tmp_path / "run.tdm"
    if not d.exists():
        make_bundle(tmp_path)
        (tmp_path / "manifest.orig").write_text((d / "manifest.json").read_text())
    m = json.loads((tmp_path / "manifest.orig").read_text())
    table = m
    for key in path[:-1]:
        if not isinstance(table.get(key), dict):
            table[key] = {}
        table = table[key]
    table[path[-1]] = value
    (d / "manifest.json").write_text(json.dumps(m))
    try:
        bundle.check_bundle(d, partial=True)
    except BundleError as e:
        assert "\n" not in str(e)
    inspect(d)


def test_inspect_lists_a_symlink_as_a_problem_and_neither_reads_nor_sizes_it(tmp_path):
    d, m = make_bundle(tmp_path)
    secret = tmp_path / "secret"
    secret.write_bytes(b"x" * 12345)
    (d / "link").symlink_to(secret)
    (d / bundle.STREAM).unlink()
    (d / bundle.STREAM).symlink_to(secret)
    info = inspect(d)
    assert "link" not in info["files"] and bundle.STREAM not in info["files"] and info["stream"] is None
    links = {p.split(":")[0] for p in info["integrity"]["problems"] if "symbolic link" in p}
    assert links == {str(d / "link"), str(d / bundle.STREAM)}


@pytest.mark.parametrize("text, why", [
    ('{"schema": 1, "files": ' + "[" * 20000, "nested too deeply"),      # RecursionError (fuzz target manifest)
    ('{"schema": 1, "stop": {"vm_ns": ' + "9" * 5000 + "}}", "4300 digits"),   # ValueError
    ('{"schema": 1, "state": "' + "x" * (bundle.MANIFEST_MAX + 1) + '"}', "over 1048576 bytes"),
])
def test_a_manifest_json_cannot_raise_out_of_the_json_reader(tmp_path, text, why):
    d, m = make_bundle(tmp_path)
    (d / bundle.MANIFEST).write_text(text)
    with pytest.raises(BundleError, match=why) as e:
        bundle.load_manifest(d)
    assert "\n" not in str(e.value)
    assert any(why in p for p in inspect(d)["integrity"]["problems"])


@pytest.mark.parametrize("path", ["/proc/self/mem", "/dev/null", "/", "/nonexistent"])
def test_an_input_path_that_is_no_readable_file_is_one_problem(tmp_path, path):
    """/proc/self/mem is a regular file of size 0 whose read fails (EIO escaped check_bundle)."""
    d, m = make_bundle(tmp_path)
    m["inputs"]["kernel"] = {"path": path, "size": 0, "sha256": "0" * 64}
    bundle.write_manifest(d, m)
    with pytest.raises(BundleError, match="kernel ") as e:
        bundle.check_bundle(d)
    assert "\n" not in str(e.value)
    assert [p.kind for p in bundle.verify_inputs(bundle.Manifest.from_json(m))] == ["input"]


def test_manifest_text_with_control_characters_stays_one_line_and_off_the_terminal(tmp_path):
    from tandem.cli.inspect_bundle import render
    d, m = make_bundle(tmp_path)
    m["qemu"]["build_id"] = "\x1b[2J\nforged"
    m["inputs"]["kernel"]["path"] = "/x\n- integrity: ok\x1b[0m"
    m["created"] = "\x1b]0;title\x07"
    m["stop"]["reason"] = "\x1b[31mred"
    bundle.write_manifest(d, m)
    for call in (lambda: bundle.check_bundle(d, qemu_build_id="a" * 64), lambda: bundle.check_bundle(d)):
        with pytest.raises(BundleError) as e:
            call()
        assert "\n" not in str(e.value) and "\x1b" not in str(e.value)
    (d / "name\x1b[2J").write_bytes(b"x")
    text = render(inspect(d))
    assert "\x1b" not in text and "\x07" not in text and "forged" not in text.split("\n")[0]
    with pytest.raises(BundleError, match="not a plain file name"):
        m["files"]["a\nb"] = m["files"][bundle.STREAM]
        bundle.write_manifest(d, m)
        bundle.load_manifest(d)


# Text JSON's decoder accepts that no file name, path or message can carry: a lone
# surrogate escape (\ud800-\udfff).
surrogate_text = st.builds(lambda a, s, b: a + s + b, st.text(max_size=4),
                           st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), st.text(max_size=4))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), as_key=st.booleans(), text=surrogate_text)
def test_a_string_that_cannot_be_encoded_anywhere_is_one_error_naming_its_field(tmp_path, data, as_key, text):
    """Any string of a well-formed manifest (file names, input paths, the machine's text,
    the stop reason...), key or value, replaced by one with a lone surrogate: the loader
    refuses it in one line naming where it is, and inspect lists that and goes on."""
    d = tmp_path / "run.tdm"
    if not d.exists():
        make_bundle(tmp_path)
        (tmp_path / "manifest.orig").write_text((d / "manifest.json").read_text())
    m = json.loads((tmp_path / "manifest.orig").read_text())
    m["machine"].update(cmdline="console=ttyS0", rtc_base="2026-11-25T09:30:00")
    places = []        # (table, key) of every string key and value
    todo = [m]
    while todo:
        t = todo.pop()
        for k, v in t.items():
            places.append((t, k))
            if isinstance(v, dict):
                todo.append(v)
    table, key = data.draw(st.sampled_from(places))
    if as_key or not isinstance(table[key], str):
        table[text] = table.pop(key)
    else:
        table[key] = text
    (d / "manifest.json").write_text(json.dumps(m))      # ensure_ascii: written as \\udXXX
    with pytest.raises(BundleError) as e:
        bundle.check_bundle(d, partial=True)
    message = str(e.value)
    assert "\n" not in message and "lone surrogate" in message, message
    message.encode("utf-8")
    assert message in inspect(d)["integrity"]["problems"]


def test_an_unencodable_input_path_names_its_field(tmp_path):
    d, m = make_bundle(tmp_path)
    m["inputs"]["kernel"]["path"] = "/tmp/\ud800"
    (d / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(BundleError, match=r"manifest.json: inputs.kernel.path: '/tmp/\\ud800' is not text"):
        bundle.load_manifest(d)

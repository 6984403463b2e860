"""The manifest as a typed object (formats.manifest.Manifest): every manifest that loads
is written back byte for byte (the demo's own recordings, the fuzz corpus's recorded
seeds, and manifests made the way tandem makes them, with fields tandem does not read);
sealing writes what a recording's manifest has always said; a recording of the demo
guest and of a user's VM are told apart as before; and no code outside formats/ reads
a manifest by key."""
from __future__ import annotations

import ast
import copy
import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tandem import catalog
from tandem.errors import BundleError
from tandem.formats import bundle, sealing
from tandem.formats.manifest import Channel, DeclaredPack, FileEntry, InputFile, Manifest, Qemu, Stop, Traffic
from tandem.machine import NIC_DEVICES, Guest, LibvirtSection, MachineSection, NetSection

from helpers.bundles import make_bundle

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "replay" / "tandem"
DATA = Path(__file__).parent / "data" / "manifests"      # written by `tandem demo`: a recording, an analysis run
RECORDED = sorted(DATA.glob("*.json")) + sorted((ROOT / "tests" / "fuzz" / "manifest-corpus").glob("seed-*"))


def dumped(document: dict) -> str:
    """manifest.json's text of a document, as bundle.write_manifest writes it."""
    return json.dumps(document, indent=2, sort_keys=True) + "\n"


def rewritten(tmp_path: Path, text: str) -> str:
    """text as manifest.json of a bundle, loaded and written back by tandem."""
    d = tmp_path / "rw.tdm"
    d.mkdir(exist_ok=True)
    (d / bundle.MANIFEST).write_text(text)
    bundle.write_manifest(d, bundle.load_manifest(d))
    return (d / bundle.MANIFEST).read_text()


@pytest.mark.parametrize("path", RECORDED, ids=[p.name for p in RECORDED])
def test_a_recorded_manifest_is_written_back_byte_for_byte(tmp_path, path):
    """The demo's recording and an analysis run's, as tandem wrote them before the
    manifest was typed, and the fuzz corpus's recorded seeds."""
    text = path.read_text()
    assert rewritten(tmp_path, text) == text
    m = Manifest.from_json(json.loads(text))
    assert Manifest.from_json(m.to_json()) == m


def test_the_demo_recording_reads_as_typed():
    m = Manifest.from_json(json.loads((DATA / "demo-recording.json").read_text()))
    assert m.state == "complete" and m.stop.reason == "poweroff" and m.stop.power_button is False
    assert m.machine.net.guest_port == 7000 and m.machine.disks[0].id == "disk0" and not m.users_guest
    assert m.channels["net0"].inbound.events == 82 and m.files["replay.tdrs"].size == 29708
    assert m.started_at == "2026-11-29T10:28:54" and m.overlays() == [bundle.OVERLAY]
    assert Guest.from_manifest(m) == Guest.from_manifest(m.to_json())


# --- manifests made the way tandem makes them ----------------------------------------------

strings = st.text(st.characters(codec="utf-8", exclude_characters="\0"), max_size=12)
ids = st.from_regex(r"[a-z][a-z0-9]{0,5}", fullmatch=True)
digest = st.text("0123456789abcdef", min_size=64, max_size=64)
ns = st.integers(0, (1 << 63) - 1)
scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | strings
json_value = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(strings, inner, max_size=3),
                          max_leaves=6)


@st.composite
def guests(draw) -> Guest:
    disks = draw(st.lists(st.tuples(st.just("/d"), st.sampled_from(["raw", "qcow2"])), max_size=3))
    kernel = draw(st.sampled_from([None, "/k"])) if disks else "/k"
    return Guest.of_disks(
        [(f"{p}{i}", f) for i, (p, f) in enumerate(disks)], kernel=kernel, initrd=draw(st.sampled_from([None, "/i"]))
        if kernel else None, memory_mb=draw(st.integers(16, 4096)), os=draw(st.sampled_from(catalog.GUEST_OSES)),
        nic_models=tuple(draw(st.lists(st.sampled_from(sorted(NIC_DEVICES)), min_size=1, max_size=3))))


@st.composite
def sections(draw, guest: Guest) -> MachineSection:
    """The guest's machine section with how a recording or an analysis run ran."""
    libvirt = draw(st.none() | st.builds(LibvirtSection, uuid=strings, domain=strings))
    if draw(st.booleans()):
        port = draw(st.none() | st.integers(1, 65535))
        net = NetSection(backend="user", forwards=tuple(draw(st.lists(strings, max_size=3))), hostfwd_port=port,
                         guest_port=7000 if port else None)
        return dataclasses.replace(guest.section(), stop_after_ns=draw(ns), net=net, libvirt=libvirt)
    return dataclasses.replace(guest.section(), mode="analysis", analysis=draw(strings), rtc_base="2026-11-29T10:28:54",
                               lookahead_ns=draw(ns), source=draw(strings), net=NetSection(backend="feed"),
                               libvirt=libvirt)


@st.composite
def manifests(draw) -> Manifest:
    """A manifest as sealing.start makes it, sealed or not."""
    guest = draw(guests())
    entry = st.builds(InputFile, path=strings.filter(bool), size=ns, sha256=digest)
    inputs = {kind: draw(entry) for kind in ("kernel", "initrd") if draw(st.booleans())}
    inputs.update({("disk_base" if d.id == "disk0" else f"disk_base.{d.id}"): draw(entry) for d in guest.disks})
    m = Manifest.new(qemu=draw(st.builds(Qemu, binary=strings, build_id=digest, patch_series=digest, version=strings)),
                     inputs=inputs, machine=draw(sections(guest)),
                     assertions=draw(st.none() | st.builds(DeclaredPack, path=strings, sha256=digest,
                                                           names=st.lists(strings, max_size=3).map(tuple))))
    if draw(st.booleans()):
        return m
    traffic = st.builds(Traffic, events=ns, bytes=ns)
    channel = st.builds(Channel, kind=strings, records=ns, inbound=traffic, outbound=traffic)
    return dataclasses.replace(
        m, state=draw(st.sampled_from(["complete", "interrupted"])), devlog_format=draw(st.sampled_from([1, 2])),
        channels=draw(st.dictionaries(ids, channel, max_size=3)),
        files=draw(st.dictionaries(ids, st.builds(FileEntry, size=ns, sha256=digest), max_size=3)),
        wall_time_s=round(draw(st.floats(0, 1e6)), 3),
        stop=Stop(reason=draw(strings), exit_status=draw(st.integers(-9, 255)), vm_ns=draw(st.none() | ns),
                  icount=draw(st.none() | ns), power_button=draw(st.booleans())))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(m=manifests())
def test_a_manifest_tandem_makes_loads_as_itself_and_writes_back_the_same(tmp_path, m):
    document = m.to_json()
    assert bundle.manifest_problem(document) is None
    text = dumped(document)
    assert Manifest.from_json(json.loads(text)) == m
    assert rewritten(tmp_path, text) == text


def tables(document: dict) -> list[dict]:
    """Every table of a manifest that may hold a key tandem does not read (not qemu, whose
    keys are all text, and not a disk's or a NIC's, whose keys are all checked)."""
    out, todo = [document], [document]
    while todo:
        t = todo.pop()
        for key, value in t.items():
            if isinstance(value, dict) and key not in ("qemu", "inputs", "files", "channels"):
                out.append(value)
                todo.append(value)
            elif key in ("inputs", "files", "channels") and isinstance(value, dict):
                kids = [v for v in value.values() if isinstance(v, dict)]
                out += kids
                todo += kids
    return out


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(m=manifests(), data=st.data())
def test_fields_tandem_does_not_read_survive_a_rewrite(tmp_path, m, data):
    """Keys tandem does not read, anywhere they may be, with any JSON value; and known keys
    absent or null where they may be: the document loads and is written back the same."""
    document = m.to_json()
    for table in data.draw(st.lists(st.sampled_from(tables(document)), max_size=4)):
        table["x-" + data.draw(strings)] = data.draw(json_value)
    for table in data.draw(st.lists(st.sampled_from(tables(document)), max_size=3)):
        known = [k for k in table if not k.startswith("x-") and k not in ("schema", "state")]
        if known:
            key = data.draw(st.sampled_from(known))
            if data.draw(st.booleans()):
                del table[key]
            else:
                table[key] = None
    if bundle.manifest_problem(document) is not None:      # e.g. a required disk id made null
        return
    text = dumped(document)
    assert rewritten(tmp_path, text) == text
    assert Manifest.from_json(json.loads(text)).to_json() == json.loads(text)


# --- sealing -------------------------------------------------------------------------------

def test_seal_writes_what_a_recording_has_always_said(tmp_path):
    """sealing.seal on a bundle made by hand: the channels, stop, state and files as
    record/recording.py wrote them (every key, nulls included), and the rest untouched."""
    d, m = make_bundle(tmp_path)
    m = bundle.load_manifest(d)
    started = dataclasses.replace(m, state="recording", channels={}, files={}, stop=Stop(), wall_time_s=None)
    bundle.write_manifest(d, started)
    sealed = sealing.seal(d, started, status=0, wall_s=1.23456, stop_reason="poweroff")
    written = json.loads((d / bundle.MANIFEST).read_text())
    assert written == sealed.to_json()
    assert written["stop"] == {"reason": "poweroff", "exit_status": 0, "vm_ns": 6_000, "icount": 10,
                               "power_button": False}
    assert written["channels"] == {
        "serial0": {"kind": "serial", "records": 1, "in": {"events": 0, "bytes": 0}, "out": {"events": 1, "bytes": 5}},
        "net0": {"kind": "net", "records": 2, "in": {"events": 1, "bytes": 60}, "out": {"events": 1, "bytes": 42}}}
    assert written["state"] == "complete" and written["wall_time_s"] == 1.235 and written["devlog_format"] == 2
    assert sorted(written["files"]) == [bundle.DEVLOG, bundle.STREAM]
    assert {k: v for k, v in written.items() if k not in ("stop", "channels", "state", "wall_time_s",
                                                          "devlog_format", "files")} == \
        {k: v for k, v in started.to_json().items() if k not in ("stop", "channels", "state", "wall_time_s", "files")}


def test_a_new_manifest_says_what_it_always_said():
    document = Manifest.new().to_json()
    assert document.pop("created") and document.pop("tandem_version")
    assert document == {"schema": 1, "state": "recording", "inputs": {}, "machine": {}, "files": {}, "channels": {},
                        "qemu": {"binary": None, "build_id": None, "patch_series": None, "version": None},
                        "stop": {"reason": None, "vm_ns": None, "icount": None}, "wall_time_s": None}


# --- the demo guest or a user's VM ------------------------------------------------------------

def users_guest_before(document: dict) -> bool:
    """The rule for a recording of a user's VM, said of a manifest's document."""
    machine = document.get("machine") or {}
    return "guest_port" not in (machine.get("net") or {}) and bool(machine.get("disks"))


@pytest.mark.parametrize("machine", [
    {},
    {"disks": [{"id": "disk0"}]},
    {"disks": [], "net": {"guest_port": 7000}},
    {"disks": [{"id": "disk0"}], "net": {"backend": "user", "hostfwd_port": 4000, "guest_port": 7000}},
    {"disks": [{"id": "disk0"}], "net": {"backend": "user", "forwards": ["tcp:8080:80"]}},
    {"disks": [{"id": "disk0"}], "net": {"backend": "feed"}},
    {"disk_format": "raw", "net": {"backend": "user"}},
])
def test_a_users_vm_is_told_from_the_demo_guest_as_before(machine):
    document = {"machine": machine}
    assert Manifest.from_json(document).users_guest == users_guest_before(document)


# --- the fields the typed manifest reads are checked when it loads ----------------------------

TYPED = [   # (where, value, the field the one-line error names)
    (("created",), 5, "created"),
    (("tandem_version",), ["0.1"], "tandem_version"),
    (("devlog_format",), "2", "devlog_format"),
    (("assertions",), "pack.tda", "assertions"),
    (("assertions",), {"path": "/p", "sha256": "zz"}, "assertions.sha256"),
    (("assertions",), {"path": "/p", "names": "a"}, "assertions.names"),
    (("channels",), {"net0": {"kind": "net", "in": 3}}, "channels.net0.in"),
    (("channels",), {"net0": [1]}, "channels.net0"),
    (("channels",), {"a\nb": {"records": "x"}}, "channels.'a\\nb'.records"),
    (("stop", "exit_status"), "0", "stop.exit_status"),
    (("machine", "devices"), "isa-serial", "machine.devices"),
    (("machine", "source"), 3, "machine.source"),
    (("machine", "net"), "user", "machine.net"),
    (("machine", "net"), {"guest_port": "7000"}, "machine.net.guest_port"),
    (("machine", "net"), {"forwards": "tcp:1:2"}, "machine.net.forwards"),
    (("machine", "libvirt"), {"uuid": 5}, "machine.libvirt.uuid"),
    (("machine", "libvirt"), {"own": ["-S"]}, "machine.libvirt.own"),
    (("machine", "libvirt"), {"own": {"argv": "qemu -S"}}, "machine.libvirt.own.argv"),
    (("machine", "libvirt"), {"own": {"argv": []}}, "machine.libvirt.own.argv"),
    (("machine", "libvirt"), {"own": {"argv": ["q"], "images": [3]}}, "machine.libvirt.own.images"),
    (("machine", "libvirt"), {"own": {"argv": ["q"], "serial": {"x": 1}}}, "machine.libvirt.own.serial"),
    (("machine", "disks"), [{"id": None}], "machine.disks"),
]


@pytest.mark.parametrize("where, value, field", TYPED, ids=[f for _, _, f in TYPED])
def test_a_typed_field_of_the_wrong_shape_is_one_error_naming_it(tmp_path, where, value, field):
    d, m = make_bundle(tmp_path)
    m = copy.deepcopy(m)
    table = m
    for key in where[:-1]:
        table = table[key]
    table[where[-1]] = value
    bundle.write_manifest(d, m)
    with pytest.raises(BundleError) as e:
        bundle.load_manifest(d)
    assert "\n" not in str(e.value) and f"manifest.json: {field}:" in str(e.value), str(e.value)


# --- no code outside formats/ reads a manifest by key ------------------------------------------

def _names_a_manifest(node: ast.expr) -> bool:
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return "manifest" in name.lower()


def manifest_indexing(tree: ast.AST) -> list[int]:
    """Lines that index something named as a manifest (manifest["x"], self.manifest.get("x")):
    a manifest is a formats.manifest.Manifest, read by its attributes."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and _names_a_manifest(node.value):
            out.append(node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
                and _names_a_manifest(node.func.value):
            out.append(node.lineno)
    return out


def test_no_code_outside_formats_reads_a_manifest_by_key():
    found = {str(p.relative_to(PACKAGE)): lines for p in sorted(PACKAGE.rglob("*.py"))
             if p.relative_to(PACKAGE).parts[0] != "formats"
             and (lines := manifest_indexing(ast.parse(p.read_text(), str(p))))}
    assert found == {}


def test_the_manifest_check_finds_one():
    assert manifest_indexing(ast.parse('m = manifest["machine"]\n')) == [1]
    assert manifest_indexing(ast.parse('x = 1\nstop = self.native.manifest.get("stop")\n')) == [2]
    assert manifest_indexing(ast.parse('n = manifest.files["a"].size\nt = manifest.machine.cmdline\n')) == []

"""The manifest's fields that tandem reads beyond what a replay needs (when the recording
started, its channels, the declared assertions, the machine's network and libvirt
domain) are checked when it loads: a wrong shape is one line naming the field."""
from __future__ import annotations

import copy

import pytest

from tandem.errors import BundleError
from tandem.formats import bundle

from helpers.bundles import make_bundle

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

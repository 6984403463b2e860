"""What `tandem attach` reads of a native domain's XML (libvirt/shadows.read_native's
helpers): its machine, the first device of a graphical console and the first character
device beside the serial console, on the devices virt-install writes (virt-install 4.1, Debian 12, `--osinfo debian12`, default graphics)."""
from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from tandem.libvirt.shadows import _display, _machine, _side_channel

VIRT_INSTALL = """<domain type='kvm'>
  <name>web</name>
  <os><type arch='x86_64' machine='pc-q35-7.2'>hvm</type></os>
  <devices>
    <disk type='file' device='disk'><driver name='qemu' type='qcow2'/><source file='/var/lib/libvirt/images/web.qcow2'/>
      <target dev='vda' bus='virtio'/></disk>
    <controller type='usb' model='qemu-xhci' ports='15'/>
    <interface type='network'><source network='default'/><model type='virtio'/></interface>
    <console type='pty'/>
    <channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0'/></channel>
    <channel type='spicevmc'><target type='virtio' name='com.redhat.spice.0'/></channel>
    <input type='tablet' bus='usb'/>
    <graphics type='spice' port='-1' tlsPort='-1' autoport='yes'><image compression='off'/></graphics>
    <sound model='ich9'/>
    <video><model type='virtio'/></video>
    <redirdev bus='usb' type='spicevmc'/>
    <rng model='virtio'><backend model='random'>/dev/urandom</backend></rng>
  </devices>
</domain>"""


def without(xml: str, *tags: str) -> ET.Element:
    root = ET.fromstring(xml)
    devices = root.find("devices")
    assert devices is not None
    for el in list(devices):
        if el.tag in tags or (el.tag == "channel" and "channel" in tags and el.get("type") == "spicevmc"):
            devices.remove(el)
    return root


@pytest.mark.parametrize("removed,first", [
    ((), "<channel type='spicevmc'>"),
    (("channel",), "<input type='tablet' bus='usb'>"),
    (("channel", "input"), "<graphics type='spice'>"),
    (("channel", "input", "graphics"), "<sound>"),
    (("channel", "input", "graphics", "sound"), "<video> model 'virtio'"),
    (("channel", "input", "graphics", "sound", "video"), "<redirdev>"),
    (("channel", "input", "graphics", "sound", "video", "redirdev"), None),
])
def test_the_first_device_of_a_graphical_console_is_named(removed, first):
    assert _display(without(VIRT_INSTALL, *removed)) == first


def test_a_console_of_its_own_a_ps2_keyboard_and_no_video_are_no_graphical_console():
    root = ET.fromstring("""<domain><devices><serial type='pty'/><console type='pty'/>
      <input type='keyboard' bus='ps2'/><input type='mouse' bus='ps2'/><video><model type='none'/></video>
      <channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0'/></channel></devices></domain>""")
    assert _display(root) is None
    assert _display(ET.fromstring("<domain/>")) is None


@pytest.mark.parametrize("machine,want", [("pc-q35-7.2", "q35"), ("q35", "q35"), ("pc-i440fx-7.2", "pc"),
                                          ("pc", "pc"), (None, "pc")])
def test_the_machine_is_q35_or_pc(machine, want):
    attr = f" machine='{machine}'" if machine else ""
    assert _machine(ET.fromstring(f"<domain><os><type arch='x86_64'{attr}>hvm</type></os></domain>")) == want


@pytest.mark.parametrize("devices,first", [
    ("<serial type='pty'><target port='0'/></serial><console type='pty'><target type='serial' port='0'/></console>",
     None),
    ("<console type='pty'/>", None),
    ("", None),
    ("<serial type='pty'/><serial type='pty'><target port='1'/></serial>", "a second <serial> (port 1)"),
    ("<serial type='pty'/><console type='pty'><target type='virtio'/></console>", "<console> of target type 'virtio'"),
    ("<parallel type='pty'/>", "<parallel>"),
])
def test_the_first_character_device_beside_the_serial_console_is_named(devices, first):
    assert _side_channel(ET.fromstring(f"<domain><devices>{devices}</devices></domain>")) == first


def test_virt_installs_guest_agent_channel_is_a_character_device_beside_the_console():
    assert _side_channel(without(VIRT_INSTALL, "input")) == "<channel type='unix'> (org.qemu.guest_agent.0)"
